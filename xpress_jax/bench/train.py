"""The `train` suite: throughput of the jitted train step on a small config with and without
rematerialisation at anchor-chunk sizes (by default all anchors and a quarter of them; measured
side by side on the same batch); a head's step on a frozen drafter (train.trainable=heads)
against the same step with a backward pass through the drafter; and a large config's strong
and weak scaling on 1 to 8 simulated devices, per-device memory and FLOPs of the compiled step
(`bench/scaling.py`: abstract arrays, no weights are allocated)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from xpress_jax.errors import InputError
from xpress_jax.train.dry_run import compiled_flops
from xpress_jax.timing import timed_calls


def _batch(config, seed: int = 0) -> dict:
    """Random token ids [batch, max_len] with the loss on the last three quarters of each row."""
    rng = np.random.default_rng(seed)
    b, length = config.train.batch_size, config.data.max_len
    ids = rng.integers(0, config.target.arch.vocab_size, (b, length), dtype=np.int32)
    loss_mask = np.broadcast_to(np.arange(length) >= length // 4, (b, length)).copy()
    return {"ids": ids, "loss_mask": loss_mask}


def _timed(step, setup, config, steps: int) -> dict:
    """Median seconds of `step` on one batch (the state carried from call to call), and the
    tokens/s that follow."""
    carried = {"state": setup.init_state()}
    batch = setup.global_batch(_batch(config))

    def one_step():
        carried["state"], metrics = step(carried["state"], setup.target_params, batch)
        return metrics

    times, metrics = timed_calls(one_step, steps)
    seconds = float(np.median(times))
    tokens = config.train.batch_size * config.data.max_len
    return {"seconds_per_step": seconds, "tokens_per_s": tokens / seconds, "tokens_per_step": tokens,
            "loss": float(jnp.asarray(metrics["loss"]))}


def step_throughput(config, *, steps: int) -> dict:
    """The trainer's step for `config`, compiled once: median seconds, tokens/s, and XLA's flops."""
    from xpress_jax.train.setup import Setup
    setup = Setup(config, abstract=False, num_records=None)
    compiled = setup.step.lower(setup.abstract_state, setup.target_params,
                                setup.global_batch(_batch(config))).compile()
    return {**_timed(compiled, setup, config, steps), "flops": compiled_flops(compiled)}


def full_backward_step(setup, config):
    """The trainer's loss and update for `config`, but with gradients taken through every
    parameter, frozen or not: the cost that leaving frozen parts out of the gradient saves."""
    from xpress_jax.train.step import make_train_step
    from xpress_jax.train.setup import loss_settings
    from xpress_jax.sharding import with_activations_on
    step = make_train_step(setup.graphdef, setup.target_graphdef, setup.tx, setup.schedule, loss_settings(config))
    return jax.jit(with_activations_on(setup.mesh, step), donate_argnums=(0,))


def frozen_drafter_step(config, *, steps: int) -> dict:
    """A trainable=heads config: the trainer's step (no gradient through the frozen drafter)
    against `full_backward_step`, each compiled once, timed in turn on the same batch, with the
    compiled flops of each."""
    from xpress_jax.train.setup import Setup
    setup = Setup(config, abstract=False, num_records=None)
    args = (setup.abstract_state, setup.target_params, setup.global_batch(_batch(config)))
    out = {}
    for name, step in (("frozen", setup.step), ("full_backward", full_backward_step(setup, config))):
        compiled = step.lower(*args).compile()
        out[name] = {**_timed(compiled, setup, config, steps), "flops": compiled_flops(compiled)}
    out["time_ratio"] = out["frozen"]["seconds_per_step"] / out["full_backward"]["seconds_per_step"]
    counted = out["frozen"]["flops"] and out["full_backward"]["flops"]
    out["flops_ratio"] = out["frozen"]["flops"] / out["full_backward"]["flops"] if counted else None
    return out


def scaling_on_simulated_devices(config_path: str, devices) -> dict:
    """`bench/scaling.py`'s strong and weak scaling rows for a config, in a process of its own
    with 8 simulated CPU devices (the caller's XLA flags apply, less any device count)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-m", "xpress_jax.bench.scaling", config_path,
                        f"--devices={','.join(str(n) for n in devices)}"],
                       capture_output=True, text=True, env=env, timeout=3600)
    if r.returncode != 0:
        raise InputError(f"the scaling table of {config_path} failed: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def suite(small_config_path: str, large_config_path: str, *, steps: int = 5, chunks=None,
          heads=("markov", "xpress"), scaling_devices=(1, 2, 4, 8), progress=lambda partial: None) -> dict:
    from xpress_jax.cli import with_overrides, load_config
    base = load_config(small_config_path)
    anchors = base.train.num_anchors
    chunks = tuple(chunks or (anchors, max(1, anchors // 4)))
    out = {"config": small_config_path, "batch_size": base.train.batch_size, "max_len": base.data.max_len,
           "num_anchors": anchors, "variants": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for remat in (True, False):
            for chunk in chunks:
                config = with_overrides(small_config_path, **{"train.remat": remat, "train.anchor_chunk": chunk,
                                                              "train.steps": steps + 1, "train.out_dir": tmp})
                out["variants"][f"remat={remat},anchor_chunk={chunk}"] = step_throughput(config, steps=steps)
                progress(out)
    fastest = max(v["tokens_per_s"] for v in out["variants"].values())
    for v in out["variants"].values():
        v["relative_to_fastest"] = v["tokens_per_s"] / fastest
    with tempfile.TemporaryDirectory() as tmp:
        out["frozen_drafter"] = {}
        for head in heads:
            config = with_overrides(small_config_path, **{"train.trainable": "heads", "train.heads": f"('{head}',)",
                                                          "train.steps": steps + 1, "train.out_dir": tmp})
            out["frozen_drafter"][head] = frozen_drafter_step(config, steps=steps)
            progress(out)
    out["scaling"] = scaling_on_simulated_devices(large_config_path, scaling_devices)
    return out
