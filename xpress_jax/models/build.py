"""Building every model a config names, in one place with one dtype policy: the target (HF
directory or random), the drafter (checkpoint directory or random), the heads (`methods.HEADS`,
from `DIR/heads/` or fresh) and the trainable bundle. Training, eval, generation, sampling, export
and the tools all build through here."""

from __future__ import annotations

import json
import logging
import os

import jax
import ml_collections
from flax import nnx

from xpress_jax import sharding
from xpress_jax.config import MASK_FROM_TOKENIZER, dtype
from xpress_jax.errors import CheckpointError, ConfigError
from xpress_jax.methods import head_of, HEADS, head_kwargs
from xpress_jax.models.drafter import QWEN3_MASK_TOKEN_ID, DFlashDrafter, DrafterConfig
from xpress_jax.models.qwen3 import Qwen3, Qwen3Config

log = logging.getLogger(__name__)


# ---- shapes ----

def target_config(config: ml_collections.ConfigDict) -> Qwen3Config:
    """The target's shape: from `target.hf_dir`'s config.json when given, else `target.arch`."""
    if config.target.hf_dir:
        return Qwen3Config.from_dir(config.target.hf_dir)
    return Qwen3Config.from_hf({"model_type": "qwen3", **config.target.arch.to_dict()},
                               source="config.target.arch")


def checkpoint_values(config: ml_collections.ConfigDict, section: str, saved: dict, source: str,
                      overridden: frozenset[str]) -> dict:
    """The config section's fields with the values a checkpoint records for itself (`saved`): the
    checkpoint's win, and a value the command line set (`overridden`: dotted keys,
    `cli.config_overrides`) to something else is an error."""
    values = dict(config[section])
    for key, value in saved.items():
        if key not in values:
            continue
        mine = tuple(values[key]) if isinstance(values[key], (tuple, list)) else values[key]
        theirs = tuple(value) if isinstance(value, (tuple, list)) else value
        if mine != theirs and f"{section}.{key}" in overridden:
            raise ConfigError(f"--config.{section}.{key}={values[key]!r} but {source} has {key}={value!r}; drop the "
                              "override to use the checkpoint's, or train a new one")
        values[key] = value
    return values


def drafter_config(config: ml_collections.ConfigDict, target: Qwen3Config | None = None,
                   overridden: frozenset[str] = frozenset()) -> DrafterConfig:
    """The drafter's shape: the `drafter` section (target layers by DFlash's spacing rule unless
    listed), or, when training starts from a checkpoint (`train.init_from`), that checkpoint's own
    (`overridden`: the keys the command line set, `checkpoint_values`)."""
    target = target or target_config(config)
    d = dict(config.drafter)
    init_from = config.get("train", {}).get("init_from", "")
    if init_from and os.path.isfile(os.path.join(init_from, "config.json")):
        with open(os.path.join(init_from, "config.json")) as f:
            saved = DrafterConfig.from_hf(json.load(f), source=os.path.join(init_from, "config.json"))
        d = checkpoint_values(config, "drafter", {"num_layers": saved.num_hidden_layers,
                                                  "target_layer_ids": saved.target_layer_ids,
                                                  "block_size": saved.block_size,
                                                  "mask_token_id": saved.mask_token_id},
                              os.path.join(init_from, "config.json"), overridden)
    mask = d["mask_token_id"] if d["mask_token_id"] != MASK_FROM_TOKENIZER else mask_token(config, target)
    return DrafterConfig.from_target(target, num_layers=d["num_layers"],
                                     target_layer_ids=tuple(d["target_layer_ids"]) or None,
                                     block_size=d["block_size"], mask_token_id=mask)


def mask_token(config, target: Qwen3Config) -> int:
    """The drafter's mask token for this target: its tokenizer's `<|mask|>` when it has one, else
    the first id after the tokenizer's own (151669 for Qwen3, as DFlash uses); without a
    tokenizer (a random target), Qwen3's."""
    directory = config.data.tokenizer_dir or config.target.hf_dir
    if directory:  # a directory without its tokenizer is refused here, before any weight is read
        from xpress_jax.data.byte_tokenizer import tokenizer_for
        tok = tokenizer_for(directory, target.vocab_size)
        mask = tok.convert_tokens_to_ids("<|mask|>")
        mask, source = (mask, f"<|mask|> of {directory}") if mask is not None and mask != tok.unk_token_id \
            else (len(tok), f"the first id after {directory}'s tokenizer")
    else:
        mask, source = QWEN3_MASK_TOKEN_ID, "Qwen3's mask token"
    if not 0 <= mask < target.vocab_size:
        raise ConfigError(f"drafter.mask_token_id: {source} is {mask}, outside the target's vocabulary of "
                          f"{target.vocab_size}; set --config.drafter.mask_token_id")
    return mask


# ---- dtypes ----

def trainable_dtypes(config) -> dict:
    """What trains (drafter, heads): compute in `dtype`, float32 master weights (`param_dtype`)."""
    return dict(dtype=dtype(config.dtype), param_dtype=dtype(config.param_dtype))


def target_dtypes(config) -> dict:
    """The frozen target needs no float32 master copy: it is held in target_param_dtype everywhere
    (training, eval, generation), e.g. 16 GB instead of 33 GB for Qwen3-8B."""
    return dict(dtype=dtype(config.dtype), param_dtype=dtype(config.target_param_dtype))


# ---- models ----

def build_target(config, *, mesh=None, abstract: bool = False, scan: bool = False) -> Qwen3:
    """The target of a config: loaded from `target.hf_dir`, or randomly initialised from `seed`;
    with `mesh`, each weight goes straight to its shards (split by its logical axes), so no device
    ever holds more than its share of the target and one tensor in flight. `abstract`: shapes and
    dtypes only, nothing allocated; `scan`: the layers stacked for training's scan, else unrolled
    for decoding."""
    kw = target_dtypes(config)
    if config.target.hf_dir and not abstract:
        from xpress_jax.checkpoints.hf_qwen3 import load_qwen3
        return load_qwen3(config.target.hf_dir, mesh=mesh, scan=scan, **kw)
    if not config.target.hf_dir:
        log.info("no target.hf_dir: random target (seed %d)", config.seed)
    make = lambda: Qwen3(target_config(config), rngs=nnx.Rngs(config.seed), scan=scan, **kw)  # noqa: E731
    if abstract:
        return nnx.eval_shape(make)
    if mesh is None:
        return make()
    graphdef, shapes = nnx.split(nnx.eval_shape(make))
    placed = jax.tree.map(lambda v: sharding.named_sharding(v.get_metadata().get("axes", ()), v.shape, mesh), shapes,
                          is_leaf=lambda x: isinstance(x, nnx.Variable))
    return nnx.merge(graphdef, jax.jit(lambda: nnx.state(make()), out_shardings=placed)())


def new_drafter(config, dcfg: DrafterConfig, dtypes: dict | None = None, scan: bool = False) -> DFlashDrafter:
    return DFlashDrafter(dcfg, rngs=nnx.Rngs(config.seed + 1), scan=scan, **(dtypes or trainable_dtypes(config)))


def new_head(name: str, config, dcfg: DrafterConfig, sizes: dict | None = None, dtypes: dict | None = None) -> nnx.Module:
    """A freshly initialised head `name` (a key of methods.HEADS) sized by the config's `heads`
    section, or by `sizes` (that section with a checkpoint's values)."""
    if name not in HEADS:
        raise ConfigError(f"unknown head {name!r}; choose from {', '.join(HEADS)}")
    section = ml_collections.ConfigDict(sizes) if sizes is not None else config.heads
    return HEADS[name].module(rngs=nnx.Rngs(config.seed + 2), **head_kwargs(name, section, dcfg),
                              **(dtypes or trainable_dtypes(config)))


def head_sizes(config, checkpoint: str, name: str, overridden: frozenset[str] = frozenset()) -> dict:
    """The `heads` section with the sizes the checkpoint's heads/NAME.config.json records
    (`overridden`: the keys the command line set, `checkpoint_values`)."""
    path = os.path.join(checkpoint, "heads", f"{name}.config.json")
    if not os.path.isfile(path):
        return dict(config.heads)
    with open(path) as f:
        return checkpoint_values(config, "heads", json.load(f), path, overridden)


def build_drafter(config, target: Qwen3, checkpoint: str = "", dtypes: dict | None = None) -> DFlashDrafter:
    """The drafter from a checkpoint directory (DFlash layout), or random from the config; in
    `dtypes` (default: the trainable's, float32 master weights) when given, e.g. bf16 to serve."""
    dtypes = dtypes or trainable_dtypes(config)
    if checkpoint:
        if not os.path.isfile(os.path.join(checkpoint, "config.json")):
            raise CheckpointError(f"{checkpoint}: no config.json (expected a DFlash drafter directory)")
        from xpress_jax.checkpoints.hf_drafter import load_drafter
        drafter = load_drafter(checkpoint, **dtypes)
    else:
        log.info("no checkpoint: random drafter (seed %d)", config.seed + 1)
        drafter = new_drafter(config, drafter_config(config, target.cfg), dtypes)
    drafter.cfg.check_target(target.cfg)
    return drafter


def build_head(decoder: str, config, drafter_cfg: DrafterConfig, checkpoint: str = "", dtypes: dict | None = None,
               overridden: frozenset[str] = frozenset()):
    """The head `decoder` needs (methods.head_of), from `checkpoint/heads/NAME.safetensors`, or
    freshly initialised; None for decoders without one."""
    name = head_of(decoder)
    if name is None:
        return None
    if checkpoint:
        from xpress_jax.checkpoints.heads import load_head
        sizes = head_sizes(config, checkpoint, name, overridden)
        return load_head(nnx.eval_shape(lambda: new_head(name, config, drafter_cfg, sizes, dtypes)), checkpoint, name)
    log.info("no checkpoint: freshly initialised %s head", name)
    return new_head(name, config, drafter_cfg, dtypes=dtypes)


class Trainable(nnx.Module):
    """The drafter and the causal heads being trained (the target is separate and frozen)."""

    def __init__(self, drafter, heads: dict):
        self.drafter = drafter
        for name in HEADS:  # one attribute per registered head: parameter paths read "xpress.W_e", ...
            setattr(self, name, heads.get(name))

    def head_names(self) -> tuple[str, ...]:
        return tuple(n for n in HEADS if getattr(self, n) is not None)


def build_trainable(config, target_cfg: Qwen3Config, *, abstract: bool = False,
                    overridden: frozenset[str] = frozenset()) -> Trainable:
    """The drafter and the `train.heads` being trained, randomly initialised (train.init_from
    loads trained weights over them later, so they take that checkpoint's shapes); `abstract`:
    shapes only. Its drafter's layers are stacked for training's scan."""
    dcfg = drafter_config(config, target_cfg, overridden)
    unknown = [h for h in config.train.heads if h not in HEADS]
    if unknown:
        raise ConfigError(f"unknown heads {unknown} in train.heads; choose from {', '.join(HEADS)}")
    init_from = config.train.init_from  # a head found there keeps the sizes it was trained with
    sizes = {h: head_sizes(config, init_from, h, overridden) if init_from else None for h in config.train.heads}
    make = lambda: Trainable(new_drafter(config, dcfg, scan=True),  # noqa: E731
                             {h: new_head(h, config, dcfg, sizes[h]) for h in config.train.heads})
    return nnx.eval_shape(make) if abstract else make()


def build_models(config, checkpoint: str = "", heads=("dflash",)) -> tuple[Qwen3, DFlashDrafter, dict]:
    """The target, the drafter of `checkpoint` (random without one) and each named head."""
    target = build_target(config)
    drafter = build_drafter(config, target, checkpoint)
    built = {name: build_head(name, config, drafter.cfg, checkpoint) for name in heads}
    return target, drafter, built


def describe_checkpoint(checkpoint: str) -> dict:
    if not checkpoint:
        return {"checkpoint": None}
    with open(os.path.join(checkpoint, "config.json")) as f:
        return {"checkpoint": checkpoint, "drafter_config": json.load(f)}
