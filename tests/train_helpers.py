"""Small training configs for tests (seconds per run on this CPU)."""

import os

from xpress_jax.cli import DEFAULT_CONFIG, with_overrides

TINY_OVERRIDES = {
    "target.arch.vocab_size": "300", "target.arch.hidden_size": "32", "target.arch.intermediate_size": "64",
    "target.arch.num_hidden_layers": "3", "target.arch.num_attention_heads": "2", "target.arch.num_key_value_heads": "1",
    "target.arch.head_dim": "16", "drafter.num_layers": "1", "drafter.block_size": "6", "drafter.mask_token_id": "299",
    "heads.rank": "16", "heads.gru_hidden": "16", "heads.proj_dim": "16",
    "train.num_anchors": "8", "train.anchor_chunk": "4", "train.batch_size": "8", "train.log_every": "1",
    "data.max_len": "256", "train.lr": "0.003",
}


def train_config(out_dir, **overrides):
    return with_overrides(DEFAULT_CONFIG, **{**TINY_OVERRIDES, "train.out_dir": str(out_dir), **overrides})


def override_args(out_dir, **overrides):
    return [f"--config.{k}={v}" for k, v in {**TINY_OVERRIDES, "train.out_dir": str(out_dir), **overrides}.items()]


def checkpoint_steps(out_dir):
    path = os.path.join(out_dir, "checkpoints")
    return sorted(int(d) for d in os.listdir(path) if d.isdigit()) if os.path.isdir(path) else []


def wait_for_checkpoint(proc, out_dir, step: int, timeout_s: float) -> None:
    """Returns once `out_dir` holds a checkpoint at `step` or later; fails if `proc` exits first."""
    import time
    deadline = time.time() + timeout_s
    while max(checkpoint_steps(out_dir) or [0]) < step:
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.time() < deadline, f"no checkpoint at step {step} in {out_dir} after {timeout_s} s"
        time.sleep(0.1)


def final_params(out_dir, **overrides):
    """(step, host parameters) of the newest checkpoint in a run directory, read in this process."""
    import jax
    from xpress_jax.train.checkpointer import Checkpointer
    from xpress_jax.train.setup import Setup
    setup = Setup(train_config(out_dir, **overrides), abstract=False)
    ckpt = Checkpointer(os.path.join(out_dir, "checkpoints"), save_every=1, keep=10)
    try:
        step = ckpt.latest_step()
        state, positions = ckpt.restore(step, setup.abstract_state)
    finally:
        ckpt.close()
    return step, jax.device_get(state["params"]), positions
