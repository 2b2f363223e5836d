"""The drafter's training state, built once from a config: the mesh, the frozen target and the
trainable bundle placed by their logical axes, the optimizer, the state's shardings and the jitted
step. `train` runs it; `train/dry_run.py` compiles it on abstract arrays."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from xpress_jax import sharding
from xpress_jax.errors import ConfigError
from xpress_jax.models.build import build_target, build_trainable, target_config
from xpress_jax.train import state as st
from xpress_jax.train.step import LossSettings, make_train_step


def loss_settings(config) -> LossSettings:
    t = config.train
    s = LossSettings.from_config(t)
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


def refuse_uneven_mesh(config) -> None:
    """The config's mesh, refused in one line when it cannot split the batch, the heads, the
    vocabulary or the widths (`sharding.refuse_uneven_splits`). Training and dry runs check it;
    reading a run's checkpoints (export) on other devices need not."""
    sharding.refuse_uneven_splits(sharding.make_mesh(tuple(config.mesh.shape)), split_sizes(config))


def split_sizes(config) -> dict[str, tuple[str, int]]:
    """The config fields the mesh splits, with their logical axes (`sharding.refuse_uneven_splits`)."""
    arch = target_config(config)
    return {"train.batch_size": ("batch", config.train.batch_size),
            "target.arch.num_attention_heads": ("heads", arch.num_attention_heads),
            "target.arch.vocab_size": ("vocab", arch.vocab_size),
            "target.arch.intermediate_size": ("mlp", arch.intermediate_size),
            "target.arch.hidden_size": ("embed", arch.hidden_size)}


def total_steps(config, num_records: int | None) -> int:
    t = config.train
    if t.steps > 0:
        return t.steps
    if not num_records:
        raise ConfigError("train.steps is 0 and the data size is unknown: set train.steps")
    return max(1, math.ceil(t.epochs * num_records / t.batch_size))


class Setup:
    """Everything the loop needs, built once (shared by train and dry_run)."""

    def __init__(self, config, *, abstract: bool, num_records: int | None = None,
                 overridden: frozenset[str] = frozenset(), schedule=None):
        """`overridden`: the config keys the command line set (`cli.config_overrides`); a value a
        starting checkpoint (train.init_from) records wins over the config's unless set there.
        `schedule`: the run's learning rate by step (`train/schedule.py`; default warmup + cosine
        over the run's steps)."""
        self.config = config
        self.mesh = sharding.make_mesh(tuple(config.mesh.shape))
        target = build_target(config, mesh=self.mesh, abstract=abstract, scan=True)
        trainable = build_trainable(config, target.cfg, abstract=abstract, overridden=overridden)
        trainable.drafter.cfg.check_target(target.cfg)
        self.drafter_cfg, self.target_cfg = trainable.drafter.cfg, target.cfg
        self.graphdef, params = st.split_params(trainable)
        self.target_graphdef, target_params = st.split_params(target)
        self.params, self.param_sharding = place(params, st.flat_axes(trainable), self.mesh)
        self.target_params, self.target_sharding = place(target_params, st.flat_axes(target), self.mesh)
        # the schedule's length does not change the compiled step, so a dry run needs no data size
        self.steps = 1 if abstract and not config.train.steps else total_steps(config, num_records)
        self.schedule = schedule or st.make_schedule(config.train, self.steps)
        labels = st.trainable_labels(self.params, config.train.trainable)
        self.tx = st.make_optimizer(config.train, self.schedule, labels)
        replicated = NamedSharding(self.mesh, P())
        abstract_state = jax.eval_shape(lambda p: st.init_state(p, self.tx, config.seed), self.params)
        self.state_sharding = {
            "step": replicated, "params": self.param_sharding, "key": replicated, "bad_steps": replicated,
            "opt_state": st.opt_state_shardings(self.tx, abstract_state["opt_state"], self.param_sharding, self.mesh)}
        self.abstract_state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                           abstract_state, self.state_sharding)
        self.batch_sharding = NamedSharding(self.mesh, sharding.logical_to_spec(
            ("batch", None), (config.train.batch_size, 1), self.mesh))
        frozen = frozenset(k for k, label in labels.items() if label == "freeze")
        step = make_train_step(self.graphdef, self.target_graphdef, self.tx, self.schedule, loss_settings(config),
                               frozen)
        step = sharding.with_activations_on(self.mesh, step)
        self.step = jax.jit(step, in_shardings=(self.state_sharding, self.target_sharding, self.batch_sharding),
                            out_shardings=(self.state_sharding, None), donate_argnums=(0,))

    def init_state(self, params: dict | None = None):
        """Step 0's state from `params` (placed as `self.params`; e.g. a checkpoint's weights loaded
        over them), or from the fresh initialisation."""
        return jax.jit(lambda p: st.init_state(p, self.tx, self.config.seed), out_shardings=self.state_sharding)(
            self.params if params is None else params)

    def abstract_batch(self):
        shape = (self.config.train.batch_size, self.config.data.max_len)
        return {"ids": jax.ShapeDtypeStruct(shape, jnp.int32, sharding=self.batch_sharding),
                "loss_mask": jax.ShapeDtypeStruct(shape, jnp.bool_, sharding=self.batch_sharding)}

    def global_batch(self, local: dict) -> dict:
        t = self.config.train
        shape = (t.batch_size, self.config.data.max_len)
        return {k: jax.make_array_from_process_local_data(self.batch_sharding, np.asarray(v), shape)
                for k, v in local.items()}
