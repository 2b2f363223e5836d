"""The `heads` suite: the draft step at a config's shapes (default Qwen3-8B: vocabulary 151,936,
hidden 4,096, a 5-layer drafter, rank 256, block 16), on random weights, side by side.

Per batch size: the drafter's forward pass and the LM-head readout of the same block (the XPress
paper's Figure 5 breakdown), then each head turning s into a block: Markov and GRU (15 dependent
steps), exact XPress at 1..8 Jacobi iterations, with early stop, in candidate mode (top-k),
and the once-per-checkpoint fold. Each figure is a median over jitted calls after warm-up, with its
FLOPs, bytes and roofline bound (`costs.py`). Timings are real; agreement and early-stop counts on
random weights only illustrate the measurement (the `e2e` suite measures them on trained heads).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from xpress_jax.models.build import drafter_config, new_drafter, new_head, target_config
from xpress_jax.bench import costs
from xpress_jax.decoding.jacobi import token_agreement
from xpress_jax.timing import compile_seconds, median_seconds
from xpress_jax.decoding.refine import refine_block
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.models.drafter import ContextCache

JACOBI_K = (1, 2, 4, 6, 8)
TOP_K = (8, 32)


def _random_like(module: nnx.Module, seed: int, std: float) -> nnx.Module:
    """Every weight redrawn (zero-initialised readouts would make the iterations trivial)."""
    keys = iter(jax.random.split(jax.random.key(seed), 256))
    for _, var in nnx.to_flat_state(nnx.state(module, nnx.Param)):
        var.set_value((std * jax.random.normal(next(keys), var.shape)).astype(var.get_value().dtype))
    return module


def build(config, tcfg, dcfg, seed: int = 0) -> dict:
    """Drafter, heads and a tied embedding / LM-head table at the config's shapes."""
    table = 0.02 * jax.random.normal(jax.random.key(seed), (tcfg.vocab_size, tcfg.hidden_size), jnp.float32)
    heads = {name: _random_like(new_head(name, config, dcfg), seed + i + 1, 0.05)
             for i, name in enumerate(("markov", "gru", "xpress"))}
    return {"drafter": new_drafter(config, dcfg), "table": table, "heads": heads}


def suite(config, *, batches=(1, 8), context: int = 512, reps: int = 5, peaks: dict | None = None,
          progress=lambda partial: None, compile_only: bool = False) -> dict:
    """Per batch size, every call's median seconds and roofline. compile_only: on abstract weights
    and inputs, each call compiled and not run (its seconds to compile): the suite's programs at a
    config's shapes, on any host."""
    tcfg = target_config(config)
    dcfg = drafter_config(config, tcfg)
    # concrete, or shapes only (nnx.eval_shape): the same construction either way
    create = nnx.eval_shape if compile_only else (lambda make: make())
    m = create(lambda: build(config, tcfg, dcfg))
    table = m["table"]
    peaks = peaks or ({} if compile_only else costs.machine_peaks(reps))
    wbytes = jnp.dtype(jax.tree.leaves(nnx.state(m["heads"]["xpress"], nnx.Param))[0].dtype).itemsize
    xpress_graph, xpress_state = nnx.split(m["heads"]["xpress"])
    fold = lambda st: nnx.merge(xpress_graph, st).fold()  # noqa: E731
    folded = jax.eval_shape(fold, xpress_state) if compile_only else fold(xpress_state)
    drafter_graph, drafter_state = nnx.split(m["drafter"])
    drafter_params = int(sum(np.prod(v.shape) for v in jax.tree.leaves(nnx.state(m["drafter"], nnx.Param))))
    block, n = dcfg.block_size, dcfg.block_size - 1
    out = {"shapes": {"vocab": tcfg.vocab_size, "hidden": tcfg.hidden_size, "block": block, "rank": config.heads.rank,
                      "drafter_layers": dcfg.num_hidden_layers, "drafter_params": drafter_params,
                      "context": context, "weight_bytes": wbytes, "compute_dtype": config.dtype},
           "machine": peaks, "batches": {}}
    for batch in batches:
        d = costs.Shapes(batch=batch, n=n, vocab=tcfg.vocab_size, hidden=tcfg.hidden_size, rank=config.heads.rank,
                         gru_hidden=config.heads.gru_hidden, proj_dim=config.heads.proj_dim, weight_bytes=wbytes)
        def inputs(drafter_state, batch=batch):
            keys = jax.random.split(jax.random.key(100 + batch), 4)
            taps = jax.random.normal(keys[3], (batch, context, len(dcfg.target_layer_ids), tcfg.hidden_size))
            ctx = nnx.merge(drafter_graph, drafter_state).extend_context(
                ContextCache.init(dcfg, batch, context + block, jnp.float32), taps)
            return (3.0 * jax.random.normal(keys[0], (batch, n, tcfg.vocab_size)),  # s [batch, n, vocab]
                    jax.random.normal(keys[1], (batch, n, tcfg.hidden_size)),  # h [batch, n, hidden]
                    jax.random.randint(keys[2], (batch,), 0, tcfg.vocab_size),  # the block's anchor token
                    ctx, jax.random.normal(keys[0], (batch, block, tcfg.hidden_size)))  # block embeddings
        s, h, anchor, ctx, block_embeds = (jax.eval_shape if compile_only else (lambda f, x: f(x)))(
            inputs, drafter_state)

        def refine(name, head, **knobs):
            """A jitted solve taking the head's weights and the embedding table as arguments (closed
            over, gigabytes of weights would be baked into the program as constants)."""
            settings = DecodeSettings(**knobs)
            graph, weights = nnx.split(head) if isinstance(head, nnx.Module) else (None, head)
            as_head = (lambda w: nnx.merge(graph, w)) if graph is not None else (lambda w: w)

            def solve(w, tab, s, h, a):
                return refine_block(name, as_head(w), s, h, a, lambda ids: jnp.take(tab, ids, axis=0),
                                    settings=settings)
            return jax.jit(solve), (weights, table, s, h, anchor)

        calls = {  # name -> (jitted function, its arguments, its cost)
            "drafter_forward": (jax.jit(lambda st, x, c: nnx.merge(drafter_graph, st)(x, c)),
                                (drafter_state, block_embeds, ctx),
                                costs.drafter_forward(d, drafter_params, block, context, dcfg.num_hidden_layers,
                                                      dcfg.num_key_value_heads, dcfg.num_attention_heads,
                                                      dcfg.head_dim, 4)),
            "lm_head": (jax.jit(lambda x, tab: jnp.einsum("bnh,vh->bnv", x, tab)), (h, table), costs.lm_head(d)),
            "markov": (*refine("markov", m["heads"]["markov"]), costs.markov_serial(d)),
            "gru": (*refine("gru", m["heads"]["gru"]), costs.gru_serial(d)),
            "xpress_fold": (jax.jit(fold), (xpress_state,),
                            costs.xpress_fold(d)),
        }
        for k in JACOBI_K:
            calls[f"xpress_it{k}"] = (*refine("xpress", folded, max_iters=k, early_stop=False), costs.xpress_exact(d, k))
        early, early_args = refine("xpress", folded, max_iters=4, early_stop=True)
        used = 4.0 if compile_only else float(jnp.mean(early(*early_args).iterations))
        calls["xpress_it4_early_stop"] = (early, early_args, costs.xpress_exact(d, used))
        for top_k in TOP_K:
            calls[f"xpress_it4_top{top_k}"] = (*refine("xpress", folded, max_iters=4, early_stop=False, top_k=top_k),
                                              costs.xpress_candidates(d, 4, top_k))
        if compile_only:
            out["batches"][str(batch)] = {"compile_s": {name: compile_seconds(fn, *args)["compile_s"]
                                                        for name, (fn, args, _) in calls.items()}}
            progress(out)
            continue

        seconds = {name: median_seconds(fn, *args, reps=reps) for name, (fn, args, _) in calls.items()}
        tokens = lambda name: calls[name][0](*calls[name][1]).tokens  # noqa: E731
        agreement = {f"top{k}": float(token_agreement(tokens("xpress_it4"), tokens(f"xpress_it4_top{k}")))
                     for k in TOP_K}
        markov = seconds["markov"]
        # the paper's unit: the slope of a block's time over its Jacobi iterations, and a block
        per_iteration = float(np.polyfit(JACOBI_K, [seconds[f"xpress_it{k}"] for k in JACOBI_K], 1)[0])
        out["batches"][str(batch)] = {
            "per_iteration_s": per_iteration, "per_iteration_vs_markov_block": per_iteration / markov,
            "block_it4_vs_markov_block": seconds["xpress_it4"] / markov,
            "h200_roofline": costs.h200_roofline(d),
            "seconds": seconds,
            "ratio_to_markov": {k: v / markov for k, v in seconds.items()},
            "costs": {k: costs.bound(c, peaks, seconds[k]) for k, (_, _, c) in calls.items()},
            "draft_step": {"drafter_forward": seconds["drafter_forward"], "lm_head": seconds["lm_head"],
                           **{name: seconds[name] for name in ("markov", "gru", "xpress_it4", "xpress_it4_early_stop",
                                                               "xpress_it4_top32")}},
            "early_stop_iterations_random_weights": used,
            "candidate_agreement_random_weights": agreement}
        progress(out)  # each batch's figures as they are measured
    return out
