"""One readable training flow: mesh -> data -> models -> sharded state -> jitted step ->
checkpoints and logs. `train(config)` is what `python -m xpress_jax.train` runs; `dry_run(config)`
compiles the step on abstract arrays and reports per-device memory."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
from tqdm import tqdm

from xpress_jax import files, sharding
from xpress_jax.assemble import build_target, build_trainable, trainable_dtypes
from xpress_jax.config_schema import check_config
from xpress_jax.errors import ConfigError, XpressError
from xpress_jax.training import state as st
from xpress_jax.training.state_checkpoints import Checkpointer
from xpress_jax.training.distributed import maybe_initialize_distributed
from xpress_jax.training.step import LossSettings, make_train_step

log = logging.getLogger("xpress_jax.train")


class TrainingStopped(XpressError):
    """Training stopped on purpose (repeated non-finite steps); the last good checkpoint is intact."""


def loss_settings(config) -> LossSettings:
    t = config.train
    s = LossSettings.from_config(t.loss, t.num_anchors, t.anchor_chunk, t.remat)
    if s.dloop > 0 and tuple(t.heads):
        raise ConfigError("D-Loop trains the drafter alone: set train.heads=() with train.loss.dloop > 0")
    return s


def place(params: dict, axes: dict, mesh) -> tuple[dict, dict]:
    shardings = st.param_shardings(axes, {k: v.shape for k, v in params.items()}, mesh)
    if isinstance(next(iter(params.values())), jax.ShapeDtypeStruct):
        placed = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shardings[k]) for k, v in params.items()}
    else:
        placed = {k: jax.device_put(v, shardings[k]) for k, v in params.items()}
    return placed, shardings


def total_steps(config, num_records: int | None) -> int:
    t = config.train
    if t.steps > 0:
        return t.steps
    if not num_records:
        raise ConfigError("train.steps is 0 and the data size is unknown: set train.steps")
    return max(1, math.ceil(t.epochs * num_records / t.batch_size))


class Setup:
    """Everything the loop needs, built once (shared by train and dry_run)."""

    def __init__(self, config, *, abstract: bool, num_records: int | None = None):
        self.config = config
        self.mesh = sharding.make_mesh(tuple(config.mesh.shape))
        target = build_target(config, mesh=self.mesh, abstract=abstract)
        trainable = build_trainable(config, target.cfg, abstract=abstract)
        trainable.drafter.cfg.check_target(target.cfg)
        self.drafter_cfg = trainable.drafter.cfg
        self.graphdef, params = st.split_params(trainable)
        self.target_graphdef, target_params = st.split_params(target)
        self.params, self.param_sharding = place(params, st.flat_axes(trainable), self.mesh)
        self.target_params, self.target_sharding = place(target_params, st.flat_axes(target), self.mesh)
        # the schedule's length does not change the compiled step, so a dry run needs no data size
        self.steps = 1 if abstract and not config.train.steps else total_steps(config, num_records)
        self.schedule = st.make_schedule(config.train, self.steps)
        self.tx = st.make_optimizer(config.train, self.steps, self.params)
        replicated = NamedSharding(self.mesh, P())
        abstract_state = jax.eval_shape(lambda p: st.init_state(p, self.tx, config.seed), self.params)
        self.state_sharding = {
            "step": replicated, "params": self.param_sharding, "key": replicated, "bad_steps": replicated,
            "opt_state": st.opt_state_shardings(self.tx, abstract_state["opt_state"], self.param_sharding, self.mesh)}
        self.abstract_state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                           abstract_state, self.state_sharding)
        self.batch_sharding = NamedSharding(self.mesh, sharding.logical_to_spec(
            ("batch", None), (config.train.batch_size, 1), self.mesh))
        frozen = frozenset(k for k, label in st.trainable_labels(self.params, config.train.trainable).items()
                           if label == "freeze")
        step = make_train_step(self.graphdef, self.target_graphdef, self.tx, self.schedule, loss_settings(config),
                               frozen)
        self.step = jax.jit(step, in_shardings=(self.state_sharding, self.target_sharding, self.batch_sharding),
                            out_shardings=(self.state_sharding, None), donate_argnums=(0,))

    def init_state(self):
        return jax.jit(lambda p: st.init_state(p, self.tx, self.config.seed), out_shardings=self.state_sharding)(
            self.params)

    def abstract_batch(self):
        shape = (self.config.train.batch_size, self.config.data.max_len)
        return {"ids": jax.ShapeDtypeStruct(shape, jnp.int32, sharding=self.batch_sharding),
                "loss_mask": jax.ShapeDtypeStruct(shape, jnp.bool_, sharding=self.batch_sharding)}

    def global_batch(self, local: dict) -> dict:
        t = self.config.train
        shape = (t.batch_size, self.config.data.max_len)
        return {k: jax.make_array_from_process_local_data(self.batch_sharding, np.asarray(v), shape)
                for k, v in local.items()}


def dry_run(config) -> dict:
    """Compiles the train step on abstract arrays (no weights, no data) and reports memory per device."""
    setup = Setup(config, abstract=True)
    compiled = setup.step.lower(setup.abstract_state, setup.target_params, setup.abstract_batch()).compile()
    mem = compiled.memory_analysis()
    gib = lambda b: round(b / 2**30, 3)  # noqa: E731
    report = {"devices": int(np.prod(config.mesh.shape)) if -1 not in tuple(config.mesh.shape) else jax.device_count(),
              "mesh": dict(setup.mesh.shape), "batch_size": config.train.batch_size, "max_len": config.data.max_len,
              "trainable_params": int(sum(math.prod(v.shape) for v in setup.params.values())),
              "target_params": int(sum(math.prod(v.shape) for v in setup.target_params.values()))}
    if mem is not None:
        report.update(argument_gib=gib(mem.argument_size_in_bytes), output_gib=gib(mem.output_size_in_bytes),
                      alias_gib=gib(mem.alias_size_in_bytes), temp_gib=gib(mem.temp_size_in_bytes),
                      peak_gib=gib(mem.argument_size_in_bytes + mem.output_size_in_bytes
                                   - mem.alias_size_in_bytes + mem.temp_size_in_bytes))
    return report


class _Logger:
    """JSONL + TensorBoard (process 0 only)."""

    def __init__(self, out_dir: str):
        self.enabled = jax.process_index() == 0
        if not self.enabled:
            return
        os.makedirs(out_dir, exist_ok=True)
        self.jsonl = open(os.path.join(out_dir, "log.jsonl"), "a")
        from tensorboardX import SummaryWriter
        self.tb = SummaryWriter(os.path.join(out_dir, "tb"))

    def write(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        self.jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        self.jsonl.flush()
        for k, v in metrics.items():
            if isinstance(v, list):
                for i, x in enumerate(v):
                    self.tb.add_scalar(f"{k}/{i + 1}", x, step)
            elif isinstance(v, (int, float)):
                self.tb.add_scalar(k, v, step)
        self.tb.flush()

    def close(self):
        if self.enabled:
            self.jsonl.close()
            self.tb.close()


# fields whose change breaks an exact resume (the mesh may change: restores reshard)
RESUME_SECTIONS = ("seed", "dtype", "param_dtype", "target_param_dtype", "target.", "drafter.", "heads.", "data.",
                   "train.")
RESUME_FREE = ("train.out_dir", "train.log_every", "train.save_every", "train.keep", "train.async_checkpointing",
               "train.distributed", "train.allow_config_change", "train.init_from", "train.max_bad_steps")


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


def _to_python(metrics: dict) -> dict:
    out = {}
    for k, v in jax.device_get(metrics).items():
        v = np.asarray(v)
        out[k] = v.round(5).tolist() if v.ndim else (bool(v) if v.dtype == bool else round(float(v), 6))
    return out


def train(config, *, stop_after: int | None = None) -> dict:
    """Trains until train.steps (or `stop_after` steps in this call); resumes from the latest checkpoint."""
    from xpress_jax.data.byte_tokenizer import pad_id, tokenizer_for
    from xpress_jax.data.dataset import make_dataset, read_records

    check_config(config)
    out_dir = config.train.out_dir
    changes = resume_changes(config, out_dir)  # before anything is built: a refused resume costs nothing
    if changes and not config.train.allow_config_change:
        raise ConfigError(f"{out_dir} was started with another config and resuming would not be exact: "
                          f"{'; '.join(changes)}. Use another train.out_dir, or set "
                          "train.allow_config_change=true to continue deliberately")
    maybe_initialize_distributed(config)
    records = read_records(list(config.data.train_files))
    setup = Setup(config, abstract=False, num_records=len(records))
    tokenizer = tokenizer_for(config.data.tokenizer_dir or config.target.hf_dir, setup.drafter_cfg.vocab_size)
    pad = pad_id(tokenizer)
    t = config.train
    if t.batch_size % jax.process_count():
        raise ConfigError(f"train.batch_size {t.batch_size} is not divisible by {jax.process_count()} processes")
    dataset = make_dataset(records, tokenizer, max_len=config.data.max_len,
                           batch_size=t.batch_size // jax.process_count(), seed=config.seed,
                           process_index=jax.process_index(), process_count=jax.process_count())
    data_iter = iter(dataset)
    ckpt = Checkpointer(os.path.join(out_dir, "checkpoints"), save_every=t.save_every, keep=t.keep,
                        async_save=t.async_checkpointing)
    say = (lambda line: print(line, file=sys.stderr)) if jax.process_index() == 0 else None  # noqa: E731
    restored = ckpt.restore_latest(setup.abstract_state, report=say)
    if restored is not None:
        start, state, data_state = restored
        data_iter.set_state(data_state)
        if say:  # shown on the console: the user should know a run continued
            say(f"resumed at step {start} from {ckpt.directory}")
    else:
        if t.init_from:
            setup.params = initial_params(setup, config, t.init_from)
        state = setup.init_state()
        start = 0
    if jax.process_index() == 0:  # config.json records what the run was started with; never overwritten
        os.makedirs(out_dir, exist_ok=True)
        name = "config.json" if restored is None else (f"config.resumed_at_{start}.json" if changes else None)
        if name:
            files.write_text(os.path.join(out_dir, name), config.to_json_best_effort(indent=2))

    stop = {"signal": None}
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.update(signal=signum))
    logger = _Logger(out_dir)
    end = setup.steps if stop_after is None else min(setup.steps, start + stop_after)
    bar = tqdm(total=setup.steps, initial=start, desc="train", dynamic_ncols=True, disable=jax.process_index() != 0)
    last = {}
    tokens, t0 = 0, time.perf_counter()
    step = start
    bad = 0  # non-finite steps in a row
    pending = None  # the last dispatched step's `finite` flag, read one step later

    def check(finite, at: int) -> int:
        count = 0 if bool(finite) else bad + 1
        if count:
            log.warning("step %d: non-finite loss or gradient, update skipped (%d in a row)", at, count)
            if count >= t.max_bad_steps:
                good = ckpt.latest_step()
                kept = (f"The last good checkpoint (step {good}) is intact in {ckpt.directory}" if good is not None
                        else "No checkpoint had been written yet")
                raise TrainingStopped(f"{count} non-finite steps in a row at step {at}; stopped. {kept}")
        return count

    try:
        while step < end:
            local = next(data_iter)
            tokens += int(np.sum(local["ids"] != pad))
            state, metrics = setup.step(state, setup.target_params, setup.global_batch(local))
            step += 1
            if pending is not None:  # the previous step has finished (or nearly) while this one runs
                bad = check(pending, step - 1)
            pending = metrics["finite"]
            if step % t.log_every == 0 or step == end:
                last = _to_python(metrics)
                elapsed = time.perf_counter() - t0
                last.update(tokens_per_s=round(tokens / elapsed, 1))
                tokens, t0 = 0, time.perf_counter()
                logger.write(step, last)
                bar.set_postfix(loss=f"{last['loss']:.3f}", tau=f"{last.get('sim_tau_drafter', 0):.2f}")
            bar.update(1)
            saving = stop["signal"] is not None or step == setup.steps or ckpt.manager.should_save(step)
            if saving and bool(pending):  # only here does the loop wait for the current step
                ckpt.save(step, state, data_iter.get_state(), force=stop["signal"] is not None)
            if stop["signal"] is not None:
                log.warning("SIGTERM at step %d: saving and exiting", step)
                break
        if pending is not None:
            bad = check(pending, step)
        if step == setup.steps and ckpt.latest_step() != step and bad == 0:
            ckpt.save(step, state, data_iter.get_state(), force=True)
    finally:
        bar.close()
        ckpt.close()
        logger.close()
        signal.signal(signal.SIGTERM, previous)
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
    drafter = load_drafter(directory, **trainable_dtypes(config))
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
    for k, v in loaded.items():
        params[k] = jax.device_put(v.astype(params[k].dtype), setup.param_sharding[k])
    log.info("init_from: drafter from %s", directory)
    return params


def host_params(params: dict) -> dict:
    """Parameters as host numpy arrays, gathered across processes when sharded over several."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        return multihost_utils.process_allgather(params, tiled=True)
    return jax.device_get(params)


def export(setup: Setup, params: dict, out_dir: str, dtype=jnp.bfloat16) -> None:
    """The trained drafter in the DFlash layout, heads beside it: what `xpress_jax.eval --checkpoint`
    reads. The end of a run and `python -m xpress_jax.export` both write through here."""
    from xpress_jax.checkpoints.heads import save_head
    from xpress_jax.checkpoints.hf_drafter import save_drafter
    model = st.merge(setup.graphdef, params)
    save_drafter(model.drafter, out_dir, dtype=dtype)
    for name in model.head_names():
        save_head(getattr(model, name), out_dir, name)  # heads stay float32 (small)
    log.info("exported the drafter and heads to %s", out_dir)
