"""Evaluation: methods (label -> decoder + checkpoint), decoding every prompt of each dataset with
target-only decoding and every method, each method's row (`metrics.py`), and the report
(`report.py`). `python -m xpress_jax.eval` and the reproduction both call `evaluate`."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from xpress_jax.data.questions import dataset_label, load_dataset_entry
from xpress_jax.report.published import target_name as published_target_name
from xpress_jax.decoding.profile import component_times
from xpress_jax.decoding.devices import place_on_tensor_mesh, tensor_mesh
from xpress_jax.decoding.padding import PROMPT_BUCKET, round_up, shared_length
from xpress_jax.decoding.speculative import SpecModels, generate
from xpress_jax.errors import InputError
from xpress_jax.eval.candidates import candidate_mode_agreement
from xpress_jax.eval.metrics import compare_to_reference, summarise
from xpress_jax.eval.report import write_outputs
from xpress_jax.eval.settings import EvalSettings
from xpress_jax.methods import DECODERS, head_of, spec_decoders
from xpress_jax.config import dtype
from xpress_jax.models.build import build_drafter, build_head, build_target, describe_checkpoint, target_config

log = logging.getLogger("xpress_jax.eval")


@dataclasses.dataclass(frozen=True)
class Method:
    """One evaluated row: a label (decoder[.variant]), the decoder it runs, and its checkpoint."""
    label: str
    decoder: str
    checkpoint: str
    branches: int = 1  # D-Loop's branches (dloop decoders)


def with_branches(methods: list[Method], branches) -> list[Method]:
    """Each D-Loop method once per branch count in `branches`; a count k > 1 adds .b<k> to the label."""
    branches = [int(k) for k in branches]
    if not branches or min(branches) < 1:
        raise InputError(f"dloop_branches must be positive integers, got {branches}")
    out = []
    for m in methods:
        if not DECODERS[m.decoder].loop:
            out.append(m)
            continue
        out += [dataclasses.replace(m, label=m.label if k == 1 else f"{m.label}.b{k}", branches=k) for k in branches]
    labels = [m.label for m in out]
    if len(set(labels)) != len(labels):
        raise InputError(f"method labels repeat once D-Loop branches are added: {labels}")
    return out


def checkpoint_decoders(checkpoint: str) -> tuple[str, ...]:
    """The one-pass decoders a drafter directory holds: DFlash, and each head found in heads/."""
    from xpress_jax.checkpoints.heads import head_file
    return tuple(d for d in spec_decoders() if not DECODERS[d].loop
                 and (head_of(d) is None or os.path.isfile(head_file(checkpoint, head_of(d)))))


def parse_methods(checkpoints: list[str] | None, decoders, checkpoint: str, branches=(1,)) -> list[Method]:
    """--checkpoints=LABEL=DIR,... or, without it, every --decoders from --checkpoint; D-Loop
    methods once per branch count in `branches`."""
    if not checkpoints:
        bad = [d for d in decoders if d not in spec_decoders()]
        if bad:
            raise InputError(f"unknown decoders {bad}; choose from {', '.join(spec_decoders())}")
        return with_branches([Method(d, d, checkpoint) for d in decoders], branches)
    methods = []
    for item in checkpoints:
        label, eq, path = item.partition("=")
        decoder = label.split(".", 1)[0]
        if not eq or not path:
            raise InputError(f"--checkpoints item {item!r}: expected LABEL=DIR")
        if decoder not in spec_decoders():
            raise InputError(f"--checkpoints label {label!r}: {decoder!r} is not a decoder; choose from "
                             f"{', '.join(spec_decoders())} (optionally with .variant)")
        if not os.path.isdir(path):
            raise InputError(f"--checkpoints {label}: directory {path!r} does not exist")
        methods.append(Method(label, decoder, path))
    labels = [m.label for m in methods]
    if len(set(labels)) != len(labels):
        raise InputError(f"--checkpoints repeats a label: {labels}")
    return with_branches(methods, branches)


def _tokenizer(config):
    from xpress_jax.data.byte_tokenizer import ByteTokenizer, tokenizer_for
    tok = tokenizer_for(config.data.tokenizer_dir or config.target.hf_dir, target_config(config).vocab_size)
    if isinstance(tok, ByteTokenizer):
        log.warning("no target directory: byte-level prompts (a smoke run with random weights)")
    return tok


def encode_prompts(config, questions: list[str], max_prompt_tokens: int) -> tuple[list[list[int]], int, list[int]]:
    """Chat-formatted prompt ids; prompts over max_prompt_tokens are skipped (counted), never cut:
    a cut prompt loses the end of the question and the assistant header."""
    from xpress_jax.data.chat import prompt_ids
    tok = _tokenizer(config)
    stops = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    encoded = [prompt_ids(tok, [{"role": "user", "content": q}]) for q in questions]
    kept = [p for p in encoded if len(p) <= max_prompt_tokens]
    return kept, len(encoded) - len(kept), stops


def run_decoder(models, prompts, decoder: str, s: EvalSettings, stop_ids, pad: int, desc: str,
                branches: int = 1, reject_drafts: bool = False):
    """Decodes every prompt (in batches); returns tokens, per-prompt stats and seconds (compile excluded)."""
    kw = dict(decoder=decoder, max_new_tokens=s.max_new_tokens, temperature=s.temperature, seed=s.seed,
              settings=s.decode(branches).for_decoder(decoder), pad_multiple=pad, stop_ids=stop_ids,
              reject_drafts=reject_drafts)
    generate(models, prompts[:s.batch_size], warm_up=True, **kw)  # compile outside the timing
    tokens, rows, seconds = [], [], 0.0
    for i in tqdm(range(0, len(prompts), s.batch_size), desc=desc, leave=False, file=sys.stderr):
        t0 = time.perf_counter()
        out = generate(models, prompts[i:i + s.batch_size], **kw)
        seconds += time.perf_counter() - t0
        tokens += out.tokens
        rows.append(out.stats)
    stats = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}  # [n_prompts, ...]
    return tokens, stats, seconds


def build_methods(config, methods: list[Method], drafter_dtype: str, tensor_parallel: int = 1,
                  overridden: frozenset[str] = frozenset()):
    """The target once, each distinct drafter checkpoint once, and each method's head, the drafter
    and heads held and computed in `drafter_dtype`. tensor_parallel > 1: the target split over
    that many local devices, the drafters and heads replicated on them (decoding/devices.py).
    `overridden`: the config keys the command line set (a head's recorded sizes win otherwise)."""
    mesh = tensor_mesh(tensor_parallel, target_config(config))  # a bad count is refused before any weight is read
    target = build_target(config, mesh=mesh)  # shard by shard: the split targets are those no device holds whole
    dtypes = {"dtype": dtype(drafter_dtype), "param_dtype": dtype(drafter_dtype)}
    drafters = {ckpt: build_drafter(config, target, ckpt, dtypes)
                for ckpt in dict.fromkeys(m.checkpoint for m in methods)}
    models = {}
    for m in methods:
        drafter = drafters[m.checkpoint]
        models[m.label] = SpecModels(target, drafter, build_head(m.decoder, config, drafter.cfg, m.checkpoint, dtypes,
                                                                    overridden))
        if mesh is not None:
            place_on_tensor_mesh(models[m.label], mesh)
    return target, models


@nnx.jit
def _last_position_logits(target, ids, length):  # [1, padded] int32, [] int32 -> [vocab] float32
    return target(ids).logits[0, length - 1].astype(jnp.float32)


def _next_logits(target, sequence: list[int]) -> jax.Array:
    """The target's logits after `sequence` [vocab], from one compiled forward pass per prompt
    bucket length (the pass is causal: padding after the sequence leaves its last position alone)."""
    ids = np.zeros((1, round_up(len(sequence), PROMPT_BUCKET)), np.int32)
    ids[0, :len(sequence)] = sequence
    return _last_position_logits(target, jnp.asarray(ids), jnp.int32(len(sequence)))


def lossless_check(target, prompts, tokens, base_tokens) -> dict:
    """A method's greedy outputs against a target-only reference's: how many prompts differ, their
    share, and for each the first differing position with the target's logit margin there (top-1
    minus top-2, from a plain forward pass over the prompt and the agreed tokens). In float32 no
    prompt differs; in bf16 the verify pass (a block of tokens) and one-token target-only decoding
    round differently, and a small margin says a near-tie flipped, not a bug. Against the
    verify-pass reference (eval.lossless_reference) the arithmetic is the same and any difference is."""
    divergences = []
    for i, (mine, theirs) in enumerate(zip(tokens, base_tokens)):
        if mine == theirs:
            continue
        position = next((j for j, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
        top2 = jax.lax.top_k(_next_logits(target, list(prompts[i]) + list(theirs[:position])), 2)[0]
        divergences.append({"prompt": i, "position": position, "target_margin": float(top2[0] - top2[1])})
    return {"mismatches": len(divergences), "mismatch_rate": len(divergences) / max(len(tokens), 1),
            "lossless": not divergences, "first_divergences": divergences}


def lossless_reference(setting: str, target_dtype) -> str:
    """The reference `--check_lossless` compares with. "auto": one-token target-only decoding only
    where it rounds as the verify pass does, float32 on a CPU; on GPUs float32 matmuls run in TF32
    by default and bf16 rounds by shape anywhere, so a one-token pass and a 16-row verification
    can split a near-tie with nothing wrong, and the method's own verify pass (every draft
    refused) is the reference there."""
    if setting != "auto":
        return setting
    exact = jax.default_backend() == "cpu" and jnp.dtype(target_dtype) == jnp.float32
    return "target_only" if exact else "verify_pass"


def tau_of(stats) -> float:
    return float(stats["committed"].sum() / stats["steps"].sum())


def measure(m: Method, spec: SpecModels, prompts, baseline: dict, base_tokens, s: EvalSettings, stop_ids, pad: int,
            ds: str, check_lossless: bool) -> tuple[dict, dict | None]:
    """One method's row on one dataset (with its time split, losslessness and candidate mode where
    asked), and its tau at each count of the iteration sweep (decoders that iterate a Jacobi head
    without D-Loop's branches; None otherwise)."""
    loop = DECODERS[m.decoder].loop
    tokens, stats, seconds = run_decoder(spec, prompts, m.decoder, s, stop_ids, pad, f"{ds}/{m.label}", m.branches)
    r = summarise(tokens, stats, seconds, baseline["tokens_per_s"], s.decode().drafted(spec.drafter.cfg.block_size),
                  loop=loop)
    r.update(decoder=m.decoder, checkpoint=m.checkpoint or None, lossless=None)
    if loop:
        r["branches"] = m.branches
    if s.time_split:
        r["time_split"] = component_times(spec, prompts[0], decoder=m.decoder, max_new_tokens=s.max_new_tokens,
                                          pad_multiple=pad, settings=s.decode(m.branches).for_decoder(m.decoder))
    if check_lossless and s.temperature == 0:
        if s.lossless_reference == "verify_pass":  # this method's loop, every draft refused (auto is resolved)
            reference, _, _ = run_decoder(spec, prompts, m.decoder, s, stop_ids, pad, f"{ds}/{m.label} reference",
                                          m.branches, reject_drafts=True)
            one_token = lossless_check(spec.target, prompts, tokens, base_tokens)
            r["against_target_only"] = {k: one_token[k] for k in ("mismatches", "mismatch_rate", "first_divergences")}
        else:
            reference = base_tokens
        r.update(lossless_check(spec.target, prompts, tokens, reference))
    log.info("%s / %s: tau %.3f, %.1f tokens/s, speedup %s", ds, m.label, r["tau"], r["tokens_per_s"], r["speedup"])
    if loop or "max_iters" not in DECODERS[m.decoder].knobs:
        return r, None
    if s.candidate_k > 0 and s.temperature == 0 and s.top_k == 0:  # candidate mode against the exact refiner
        r["candidate"] = candidate_mode_agreement(spec, list(zip(prompts, base_tokens)), s.decode(),
                                                  top_k=s.candidate_k)
        in_candidate_mode = dataclasses.replace(s, top_k=s.candidate_k)
        _, stats_k, _ = run_decoder(spec, prompts, m.decoder, in_candidate_mode, stop_ids, pad,
                                    f"{ds}/{m.label} top-{s.candidate_k}")
        r["candidate"].update(tau=tau_of(stats_k), tau_exact=r["tau"])
    sweep = {}
    for iterations in s.iteration_sweep:
        at = dataclasses.replace(s, max_iters=int(iterations))
        _, stats_i, _ = run_decoder(spec, prompts, m.decoder, at, stop_ids, pad, f"{ds}/{m.label} {iterations} it.")
        sweep[str(iterations)] = tau_of(stats_i)
    return r, sweep or None


def example(config, questions: list[str], max_prompt_tokens: int, answer: list[int], rows: dict) -> dict:
    """The first kept prompt of a dataset as text: its question, the target's answer, and each
    method's target passes over it (what a reader looks at first)."""
    from xpress_jax.data.chat import prompt_ids
    tok = _tokenizer(config)
    question = next(q for q in questions if len(prompt_ids(tok, [{"role": "user", "content": q}])) <= max_prompt_tokens)
    return {"question": question, "answer": tok.decode(answer, skip_special_tokens=True),
            "target_passes": {label: int(r["per_prompt"]["steps"][0]) for label, r in rows.items() if "per_prompt" in r}}


def evaluate(config, methods: list[Method], s: EvalSettings, *, check_lossless: bool = False,
             overridden: frozenset[str] = frozenset()) -> tuple[dict, int]:
    """Runs target-only decoding once per dataset and every method against it; writes results.json,
    results.md and the plots to s.out_dir. Returns (report, number of outputs that differ from
    target-only decoding at temperature 0 when check_lossless). `overridden`: the config keys the
    command line set (`build_methods`)."""
    # the questions and the tokenizer first: bad data is refused before any weight is read
    labels = [dataset_label(entry) for entry in s.datasets]  # NAME=PATH is reported as NAME
    if len(set(labels)) != len(labels):
        raise InputError(f"eval.datasets {list(s.datasets)}: two entries are both called "
                         f"{next(x for x in labels if labels.count(x) > 1)!r}")
    questions = {ds: load_dataset_entry(entry, s.num_prompts) for ds, entry in zip(labels, s.datasets)}
    encoded = {ds: encode_prompts(config, questions[ds], s.max_prompt_tokens) for ds in labels}
    for ds, (prompts, skipped, _) in encoded.items():
        if not prompts:
            raise InputError(f"{ds}: every prompt is longer than eval.max_prompt_tokens={s.max_prompt_tokens}")
    target, models = build_methods(config, methods, s.drafter_dtype, s.tensor_parallel, overridden)
    s = dataclasses.replace(s, lossless_reference=lossless_reference(s.lossless_reference, target.dtype))
    os.makedirs(s.out_dir, exist_ok=True)
    # one padded prompt length for every dataset, the longest prompt's bucket: one program per decoder setting
    pad = shared_length([len(p) for prompts, _, _ in encoded.values() for p in prompts], s.prefill_chunk)
    results, sweep, skipped_long, examples = {}, {}, {}, {}
    for ds in labels:
        prompts, skipped_long[ds], stop_ids = encoded[ds]
        base_tokens, base_stats, base_s = run_decoder(SpecModels(target), prompts, "target", s, stop_ids, pad,
                                                      f"{ds}/target")
        baseline = summarise(base_tokens, base_stats, base_s, None)
        results[ds] = {"target": {**baseline, "speedup": 1.0, "accept_per_position": []}}
        for m in methods:
            results[ds][m.label], by_iterations = measure(m, models[m.label], prompts, baseline, base_tokens, s,
                                                          stop_ids, pad, ds, check_lossless)
            if by_iterations:
                sweep.setdefault(ds, {})[m.label] = by_iterations
        compare_to_reference(results[ds])
        examples[ds] = example(config, questions[ds], s.max_prompt_tokens, base_tokens[0], results[ds])
    one_checkpoint = len({m.checkpoint for m in methods}) == 1
    report = {"date": time.strftime("%Y-%m-%d"), "device": jax.devices()[0].device_kind, "settings": s.as_dict(),
              # what the speedups were measured with
              # the published model this target's shape is, whose papers' figures results.md sets beside
              "published_target": published_target_name(target.cfg),
              "dtypes": {"target": config.target_param_dtype, "target_compute": config.dtype,
                         "drafter_and_heads": s.drafter_dtype},
              "methods": {m.label: {"decoder": m.decoder, "checkpoint": m.checkpoint or None,
                                    **({"branches": m.branches} if DECODERS[m.decoder].loop else {})}
                          for m in methods},
              **describe_checkpoint(methods[0].checkpoint if one_checkpoint else ""),
              "skipped_long_prompts": skipped_long, "padded_prompt_length": pad, "results": results,
              "iteration_sweep": sweep, "examples": examples}
    write_outputs(report, s.out_dir)
    failures = sum(r.get("mismatches", 0) for rows in results.values() for r in rows.values())
    return report, failures
