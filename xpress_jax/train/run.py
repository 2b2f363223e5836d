"""`train(config)`: what `python -m xpress_jax.train` runs. The drafter's `Setup`, its data,
then the shared loop (`loop.py`); at the last step the drafter and heads are exported in the
DFlash layout. A resumed run must have the config it started with (`resume_changes`)."""

from __future__ import annotations

import json
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from xpress_jax import atomic
from xpress_jax.checkpoints.hf_drafter import check_drafter_dir
from xpress_jax.config_schema import check_config
from xpress_jax.errors import ConfigError
from xpress_jax.models.build import trainable_dtypes
from xpress_jax.train import loop
from xpress_jax.train import state as st
from xpress_jax.train.distributed import maybe_initialize_distributed
from xpress_jax.train import schedule
from xpress_jax.train.setup import Setup, refuse_uneven_mesh, total_steps

log = logging.getLogger("xpress_jax.train")


# fields whose change breaks an exact resume (the mesh may change: restores reshard)
RESUME_SECTIONS = ("seed", "dtype", "param_dtype", "target_param_dtype", "target.", "drafter.", "heads.", "data.",
                   "train.")
RESUME_FREE = ("train.out_dir", "train.log_every", "train.save_every", "train.keep", "train.async_checkpointing",
               "train.distributed", "train.allow_config_change", "train.continue_schedule", "train.init_from",
               "train.max_bad_steps")


def resume_changes(config, out_dir: str) -> list[str]:
    """'field: old -> new' for each field that differs from the run's recorded config.json, when
    `out_dir` holds checkpoints to resume from; [] for a fresh run."""
    ckpt_dir = os.path.join(out_dir, "checkpoints")
    record = os.path.join(out_dir, "config.json")
    if not (os.path.isdir(ckpt_dir) and any(d.isdigit() for d in os.listdir(ckpt_dir)) and os.path.isfile(record)):
        return []
    from xpress_jax.config_schema import leaves
    from xpress_jax.errors import read_json
    import ml_collections
    old = leaves(ml_collections.ConfigDict(read_json(record, ConfigError)))
    new = leaves(ml_collections.ConfigDict(json.loads(config.to_json_best_effort())))
    # a field the record lacks (added to the code since) cannot be compared and is let through
    keys = sorted(k for k in set(old) & set(new)
                  if k.startswith(RESUME_SECTIONS) and k not in RESUME_FREE and old[k] != new[k])
    return [f"{k}: {old[k]!r} -> {new[k]!r}" for k in keys]


def recorded_total_steps(out_dir: str, num_records: int) -> int | None:
    """The length of the schedule a run's config.json gives (None without one)."""
    path = os.path.join(out_dir, "config.json")
    if not os.path.isfile(path):
        return None
    from xpress_jax.errors import read_json
    import ml_collections
    return total_steps(ml_collections.ConfigDict(read_json(path, ConfigError)), num_records)


def train(config, *, stop_after: int | None = None, overridden: frozenset[str] = frozenset()) -> dict:
    """Trains until train.steps (or `stop_after` steps in this call); resumes from the latest
    checkpoint. `overridden`: the config keys the command line set (`Setup`)."""
    from xpress_jax.data.byte_tokenizer import pad_id, tokenizer_for
    from xpress_jax.data.dataset import make_dataset, read_records

    check_config(config)
    out_dir = config.train.out_dir
    changes = resume_changes(config, out_dir)  # before anything is built: a refused resume costs nothing
    others = [c for c in changes if c.split(":")[0] not in schedule.LENGTH_FIELDS]  # a length: schedule.plan
    if others and not config.train.allow_config_change:
        raise ConfigError(f"{out_dir} was started with another config and resuming would not be exact: "
                          f"{'; '.join(others)}. Use another train.out_dir, or set "
                          "train.allow_config_change=true to continue deliberately")
    if config.train.init_from:
        check_drafter_dir(config.train.init_from, "train.init_from")
    maybe_initialize_distributed(config)
    refuse_uneven_mesh(config)
    records = read_records(list(config.data.train_files))
    ckpt = loop.checkpointer(config.train, out_dir)
    segments = schedule.plan(config, out_dir, total_steps(config, len(records)),
                             recorded_total_steps(out_dir, len(records)), ckpt.latest_step())
    setup = Setup(config, abstract=False, num_records=len(records), overridden=overridden,
                  schedule=schedule.build(config.train, segments))
    tokenizer = tokenizer_for(config.data.tokenizer_dir or config.target.hf_dir, setup.drafter_cfg.vocab_size)
    pad = pad_id(tokenizer)
    t = config.train
    if t.batch_size % jax.process_count():
        raise ConfigError(f"train.batch_size {t.batch_size} is not divisible by {jax.process_count()} processes")
    dataset = make_dataset(records, tokenizer, max_len=config.data.max_len,
                           batch_size=t.batch_size // jax.process_count(), seed=config.seed,
                           process_index=jax.process_index(), process_count=jax.process_count())
    data_iter = iter(dataset)
    resumed = loop.resume(ckpt, setup.abstract_state, data_iter)
    if resumed is not None:
        start, state = resumed
    else:
        start, state = 0, setup.init_state(initial_params(setup, config, t.init_from) if t.init_from else None)
    if jax.process_index() == 0:  # config.json records what the run was started with; never overwritten
        os.makedirs(out_dir, exist_ok=True)
        name = "config.json" if resumed is None else (f"config.resumed_at_{start}.json" if changes else None)
        if name:
            atomic.write_text(os.path.join(out_dir, name), config.to_json_best_effort(indent=2))
        if segments != schedule.read(out_dir):
            schedule.save(out_dir, segments)
            if len(segments) > 1 and resumed is not None:
                last = segments[-1]
                loop.console(f"learning rate: the schedule continues from {last['from_lr']:.3g} at step "
                             f"{last['from_step']} to {config.train.lr * config.train.final_lr_fraction:.3g} at step "
                             f"{last['to_step']} ({os.path.join(out_dir, schedule.RECORD)})")

    state, step, last = loop.run_loop(
        lambda state, local: setup.step(state, setup.target_params, setup.global_batch(local)), state, data_iter,
        section=t, total_steps=setup.steps, start=start, ckpt=ckpt, out_dir=out_dir, desc="train",
        count_tokens=lambda local: int(np.sum(local["ids"] != pad)),
        postfix={"loss": "loss", "sim_tau_drafter": "tau"}, stop_after=stop_after)
    if step == setup.steps:
        params = host_params(state["params"])  # a collective: every process takes part
        if jax.process_index() == 0:
            export(setup, params, os.path.join(out_dir, "export"))
    return {"step": step, "steps": setup.steps, "metrics": last, "state": state, "setup": setup}


def initial_params(setup: Setup, config, directory: str) -> dict:
    """The Setup's parameters with the drafter (DFlash layout) and any heads found in
    `directory/heads/` loaded over them; the heads not found stay freshly initialised."""
    from xpress_jax.checkpoints.heads import head_file, load_head
    from xpress_jax.checkpoints.hf_drafter import load_drafter
    drafter = load_drafter(directory, scan=True, **trainable_dtypes(config))
    if drafter.cfg != setup.drafter_cfg:
        diff = {f: (getattr(drafter.cfg, f), getattr(setup.drafter_cfg, f)) for f in vars(setup.drafter_cfg)
                if getattr(drafter.cfg, f) != getattr(setup.drafter_cfg, f)}
        raise ConfigError(f"train.init_from={directory}: its drafter differs from the config's "
                          f"(field: (checkpoint, config)) {diff}")
    loaded = {f"drafter.{k}": v for k, v in st.flat_params(drafter).items()}
    model = st.merge(setup.graphdef, setup.params)
    for name in model.head_names():
        if os.path.isfile(head_file(directory, name)):
            head = load_head(nnx.eval_shape(lambda: getattr(model, name)), directory, name)
            loaded.update({f"{name}.{k}": v for k, v in st.flat_params(head).items()})
            log.info("init_from: %s head from %s", name, directory)
    params = dict(setup.params)
    for k, v in loaded.items():  # from host memory: each process places its own devices' blocks
        params[k] = jax.device_put(np.asarray(v).astype(params[k].dtype), setup.param_sharding[k])
    log.info("init_from: drafter from %s", directory)
    return params


def host_params(params: dict) -> dict:
    """Parameters as host numpy arrays, gathered across processes when sharded over several."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        return multihost_utils.process_allgather(params, tiled=True)
    return jax.device_get(params)


def export(setup: Setup, params: dict, out_dir: str, dtype=jnp.bfloat16) -> None:
    """The trained drafter in the DFlash layout, heads beside it, and the target it was trained
    against (target.json): what `xpress_jax.eval --checkpoint` reads. The end of a run and `python -m xpress_jax.export` both write through here."""
    from xpress_jax.checkpoints.heads import save_head
    from xpress_jax.checkpoints.hf_drafter import save_drafter
    from xpress_jax.checkpoints.target_record import write_record
    model = st.merge(setup.graphdef, params)
    save_drafter(model.drafter, out_dir, dtype=dtype)
    write_record(setup.config, setup.target_cfg, out_dir)  # the target eval and sample take with this drafter
    for name in model.head_names():
        save_head(getattr(model, name), out_dir, name)  # heads stay float32 (small)
    log.info("exported the drafter and heads to %s", out_dir)
