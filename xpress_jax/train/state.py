"""What trains and how: the trainable bundle (drafter + heads), flat parameter dicts, the
optimizer (AdamW, warmup + cosine, clipping, frozen parts), and shardings by logical axes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from xpress_jax import sharding
from xpress_jax.checkpoints.keymap import dotted, path_tuple
from xpress_jax.errors import ConfigError

TRAINABLE_CHOICES = ("drafter", "heads", "all")


def flat_params(module: nnx.Module) -> dict[str, jax.Array]:
    """{'drafter.layers.0.self_attn.q_proj': array, ...}: plain dicts checkpoint and shard simply."""
    return {dotted(p): v.get_value() for p, v in nnx.to_flat_state(nnx.state(module, nnx.Param))}


def flat_axes(module: nnx.Module) -> dict[str, tuple]:
    return {dotted(p): tuple(v.get_metadata().get("axes", ())) for p, v in nnx.to_flat_state(nnx.state(module, nnx.Param))}


def merge(graphdef, params: dict[str, jax.Array]) -> nnx.Module:
    return nnx.merge(graphdef, nnx.from_flat_state({path_tuple(k): nnx.Param(v) for k, v in params.items()}))


def split_params(module: nnx.Module):
    graphdef, _ = nnx.split(module, nnx.Param)
    return graphdef, flat_params(module)


def trainable_labels(params: dict, trainable: str) -> dict[str, str]:
    if trainable not in TRAINABLE_CHOICES:
        raise ConfigError(f"train.trainable must be one of {TRAINABLE_CHOICES}, got {trainable!r}")
    def label(key):
        is_drafter = key.startswith("drafter.")
        train = trainable == "all" or (trainable == "drafter") == is_drafter
        return "train" if train else "freeze"
    return {k: label(k) for k in params}


def make_schedule(section, total_steps: int):
    warmup = max(1, int(section.warmup_fraction * total_steps))
    return optax.warmup_cosine_decay_schedule(0.0, section.lr, warmup, max(total_steps, warmup + 1),
                                              end_value=section.lr * section.final_lr_fraction)


def make_optimizer(section, schedule, labels: dict[str, str] | None = None):
    """The optimizer of every training run: AdamW on `schedule` (the section's warmup + cosine,
    `make_schedule`; weight decay as configured; DFlash uses 0) after global-norm clipping. With `labels`
    ({parameter: "train" | "freeze"}, `trainable_labels`) the frozen parameters get no update."""
    adamw = optax.chain(optax.clip_by_global_norm(section.grad_clip),
                        optax.adamw(schedule, b1=section.b1, b2=section.b2,
                                    weight_decay=section.weight_decay))
    if labels is None:
        return adamw
    return optax.multi_transform({"train": adamw, "freeze": optax.set_to_zero()}, labels)


def param_shardings(axes: dict[str, tuple], shapes: dict[str, tuple], mesh, rules=None) -> dict:
    return {k: sharding.named_sharding(axes[k], shapes[k], mesh, rules) for k in axes}


def opt_state_shardings(tx, abstract_opt, param_sharding: dict, mesh):
    """Optimizer moments follow their parameters; scalars (counts) are replicated. A leaf is
    matched to its parameter by the last dict key on its path, which also works inside
    multi_transform's masked partitions (where frozen parameters leave no leaf)."""
    del tx
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def leaf_sharding(path, leaf):
        keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        name = keys[-1] if keys else None
        if name in param_sharding and getattr(leaf, "ndim", 0) > 0:
            return param_sharding[name]
        return replicated
    return jax.tree_util.tree_map_with_path(leaf_sharding, abstract_opt)


def apply_update(state: dict, grads: dict, loss, tx) -> tuple[dict, jax.Array]:
    """One optimizer step of any training run, (new state, finite). A step whose loss, gradient or
    update is not finite leaves parameters and optimizer state as they were and counts a bad step."""
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    finite = jnp.isfinite(loss) & jnp.isfinite(optax.tree.norm(grads)) & jnp.isfinite(optax.tree.norm(updates))
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
    return {**state, "step": state["step"] + 1,
            "params": keep(optax.apply_updates(state["params"], updates), state["params"]),
            "opt_state": keep(opt_state, state["opt_state"]),
            "bad_steps": jnp.where(finite, 0, state["bad_steps"] + 1)}, finite


def init_state(params: dict, tx, seed: int) -> dict:
    return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params),
            "key": jax.random.key_data(jax.random.key(seed)), "bad_steps": jnp.zeros((), jnp.int32)}
