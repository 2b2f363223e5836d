"""The `decode` suite: what one step of each decoder's loop costs against one step of target-only
decoding, at a config's shapes, on random weights (no trained checkpoint needed).

A step's cost does not depend on the weights: every decoder runs static shapes, so a random
drafter that is never accepted pays exactly what a trained one pays per verification step. The
ratio is the tau a drafter must reach to break even on this machine: speedup = tau / break_even_tau.
XPress is timed at fixed iteration counts (early stop off), because how soon its Jacobi loop reaches the fixed
point does depend on trained weights.

Per-step cost = (time to decode N tokens - time to decode 1 token) / (steps of the N-token run):
the 1-token run is the same compiled program (the token budget is traced), so it has the same
prefill and dispatch but never enters the loop, and both cancel. Each
time is the fastest of its repetitions, not the median: load from elsewhere only adds time, and a
difference of two timings wants the least disturbed run of each.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from flax import nnx

from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.errors import InputError
from xpress_jax.timing import compile_seconds, fastest_seconds

# (label, decoder, settings): every decoder, XPress at three fixed iteration counts, D-Loop at one and four branches
VARIANTS = (
    ("target", "target", DecodeSettings()),
    ("dflash", "dflash", DecodeSettings()),
    ("markov", "markov", DecodeSettings()),
    ("gru", "gru", DecodeSettings()),
    ("xpress_it1", "xpress", DecodeSettings(max_iters=1, early_stop=False)),
    ("xpress_it4", "xpress", DecodeSettings(max_iters=4, early_stop=False)),
    ("xpress_it8", "xpress", DecodeSettings(max_iters=8, early_stop=False)),
    ("dloop", "dloop", DecodeSettings()),
    ("dloop_branches4", "dloop", DecodeSettings(branches=4)),
    ("dloop+xpress_it4", "dloop+xpress", DecodeSettings(max_iters=4, early_stop=False)),
)


def chosen_variants(labels) -> tuple:
    """The VARIANTS named in `labels` (all when empty), target-only first: every break-even tau is
    against it."""
    known = [label for label, _, _ in VARIANTS]
    unknown = sorted(set(labels) - set(known))
    if unknown:
        raise InputError(f"unknown decode variants {unknown}; choose from {', '.join(known)}")
    return tuple(v for v in VARIANTS if not labels or v[0] in labels or v[0] == "target")


def step_seconds(models, prompts, decoder: str, settings: DecodeSettings, *, new_tokens: int, reps: int,
                 max_len: int | None = None) -> dict:
    """Seconds per loop step of `decoder` on `prompts` (a batch of equal-length id lists), with a
    cache of `max_len` slots (default: just enough)."""
    from xpress_jax.decoding.speculative import generate
    max_len = max_len or len(prompts[0]) + new_tokens + models.drafter.cfg.block_size * settings.branches
    kw = dict(decoder=decoder, settings=settings, max_len=max_len)
    whole, out = fastest_seconds(lambda: generate(models, prompts, max_new_tokens=new_tokens, **kw), reps)
    outside, _ = fastest_seconds(lambda: generate(models, prompts, max_new_tokens=1, **kw), reps)
    steps = int(out.stats["steps"].max())  # the batch advances together until its slowest sequence ends
    if whole <= outside:
        raise InputError(f"{decoder}: {new_tokens} tokens took no longer than 1 ({whole:.4f} s against "
                         f"{outside:.4f} s): too few to time; raise the number of tokens or the repetitions")
    return {"seconds_per_step": (whole - outside) / steps, "steps": steps,
            "tokens_per_step": float(out.stats["committed"].sum() / out.stats["steps"].sum())}


def loop_compile_seconds(models, decoder: str, settings: DecodeSettings, *, batch: int, prompt_len: int,
                         new_tokens: int) -> dict:
    """`timing.compile_seconds` of `decoder`'s whole decode loop (prefill, then the while loop) on
    `models`, which may be abstract (`nnx.eval_shape`), so an 8B loop compiles on a small host."""
    import jax
    import jax.numpy as jnp

    from xpress_jax.decoding.speculative import TRACED, DecodeOptions, _decode
    from xpress_jax.methods import DECODERS
    width = models.drafter.cfg.block_size * settings.branches if DECODERS[decoder].drafter else 1
    opts = DecodeOptions(decoder=decoder, greedy=True, max_len=prompt_len + new_tokens + width,
                         settings=dataclasses.replace(settings.for_decoder(decoder), max_iters=TRACED))
    graphdef, state = nnx.split(models)
    i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731
    return compile_seconds(_decode, graphdef, state, i32(batch, prompt_len), i32(batch), i32(2), jax.random.key(0),
                           jnp.float32(1.0), jnp.int32(new_tokens), jnp.int32(settings.max_iters), opts)


def with_verify_tokens(variants, verify_tokens) -> tuple:
    """Each drafter variant once per verify length m (settings.verify_tokens; 0: the whole block),
    labelled LABEL_vM for m > 0: a step's cost against how many drafts the target's pass reads."""
    out = []
    for label, decoder, settings in variants:
        for m in (verify_tokens if decoder != "target" else (0,)):
            out.append((label if m == 0 else f"{label}_v{m}", decoder, dataclasses.replace(settings, verify_tokens=m)))
    return tuple(out)


def suite(config, *, contexts=(128, 1024), batches=(1,), new_tokens: int = 128, reps: int = 3,
          variants=VARIANTS, verify_tokens=(0,), progress=lambda partial: None, compile_only: bool = False) -> dict:
    """For each context length (prompt tokens) and batch size: every variant's seconds per step and
    its break-even tau (its step over target-only decoding's step), each drafter variant at each
    verify length of `verify_tokens`. `progress(result so far)` after each variant.
    compile_only: on abstract weights, each variant's loop compiled and not run (`loop_compile_seconds`):
    what a run at these shapes compiles, on any host."""
    from xpress_jax.models.build import build_target, new_drafter, new_head, drafter_config
    from xpress_jax.decoding.speculative import DecodingModels
    from xpress_jax.methods import head_of

    if new_tokens < 2:
        raise InputError(f"new_tokens must be >= 2 (one step past the first token), got {new_tokens}")
    if config.target.hf_dir:
        raise InputError("the decode suite times random weights at a config's shapes; give a config without "
                         "target.hf_dir (costs do not depend on the weights)")
    target = build_target(config, abstract=compile_only)
    build = nnx.eval_shape if compile_only else (lambda make: make())
    drafter = build(lambda: new_drafter(config, drafter_config(config, target.cfg)))
    for m in verify_tokens:
        if not 0 <= m < drafter.cfg.block_size:
            raise InputError(f"verify_tokens {m} is outside 0..{drafter.cfg.block_size - 1} (block {drafter.cfg.block_size})")
    variants = with_verify_tokens(variants, verify_tokens)
    heads = {name: build(lambda name=name: new_head(name, config, drafter.cfg))
             for name in {head_of(d) for _, d, _ in variants} - {None}}
    rng = np.random.default_rng(config.seed)
    vocab = target.cfg.vocab_size
    out = {"new_tokens": new_tokens, "reps": reps,
           "shapes": {"target_layers": target.cfg.num_hidden_layers, "hidden": target.cfg.hidden_size,
                      "vocab": vocab, "drafter_layers": drafter.cfg.num_hidden_layers,
                      "block": drafter.cfg.block_size, "head_rank": int(config.heads.rank)},
           "contexts": {}}
    for context in contexts:
        for batch in batches:
            prompts = [rng.integers(0, vocab, context).tolist() for _ in range(batch)]
            rows = out["contexts"].setdefault(str(context), {}).setdefault(str(batch), {})
            for label, decoder, settings in variants:
                models = DecodingModels(target, drafter, heads.get(head_of(decoder)))
                rows[label] = (loop_compile_seconds(models, decoder, settings, batch=batch, prompt_len=context,
                                               new_tokens=new_tokens) if compile_only else
                               step_seconds(models, prompts, decoder, settings, new_tokens=new_tokens, reps=reps))
                progress(out)
            if compile_only:
                continue
            for r in rows.values():
                r["break_even_tau"] = r["seconds_per_step"] / rows["target"]["seconds_per_step"]
    return out
