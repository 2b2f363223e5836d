"""The target a drafter was trained against, recorded beside it: `target.json` in every export
(its directory, name, shape and a fingerprint). eval and sample take that target when none is
given, and refuse a given one whose fingerprint differs (`target.accept_other` turns the refusal
into a warning), so a trained drafter is never measured against a random target by accident.

The fingerprint of a target directory is a SHA-256 over its config.json, its tokenizer files, each
safetensors file's name, size and header (every tensor's name, dtype, shape and offsets) and
SAMPLED_CHUNKS chunks of its data spread evenly over the file: it tells two checkpoints of one
shape apart in milliseconds, where hashing 16 GB of Qwen3-8B would take a minute. A random target
(no directory) is fingerprinted by what makes it: its shape, the seed and the weights' dtype.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import struct
import sys

from xpress_jax import atomic
from xpress_jax.errors import CheckpointError, ConfigError

RECORD = "target.json"
SAMPLED_CHUNKS = 16
CHUNK_BYTES = 4096
FINGERPRINTED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def fingerprint_dir(hf_dir: str) -> str:
    digest = hashlib.sha256()
    for name in FINGERPRINTED_FILES:
        path = os.path.join(hf_dir, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                digest.update(name.encode() + b"\0" + f.read())
    for path in sorted(glob.glob(os.path.join(hf_dir, "*.safetensors"))):
        size = os.path.getsize(path)
        digest.update(f"{os.path.basename(path)}\0{size}\0".encode())
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: not a safetensors file ({size} bytes)")
            (header_bytes,) = struct.unpack("<Q", head)
            digest.update(f.read(header_bytes))
            start = 8 + header_bytes
            span = max(size - start - CHUNK_BYTES, 0)
            for k in range(SAMPLED_CHUNKS):
                f.seek(start + span * k // (SAMPLED_CHUNKS - 1))
                digest.update(f.read(CHUNK_BYTES))
    return "sha256:" + digest.hexdigest()


def fingerprint_random(config) -> str:
    what = {"arch": config.target.arch.to_dict(), "seed": config.seed, "param_dtype": config.target_param_dtype}
    return "sha256:" + hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def describe(config, cfg) -> dict:
    """The record of the config's target (`cfg`: its Qwen3Config)."""
    from xpress_jax.report.published import target_name
    shape = {k: getattr(cfg, k) for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                          "num_key_value_heads", "head_dim", "intermediate_size")}
    hf_dir = config.target.hf_dir
    if not hf_dir:
        return {"hf_dir": None, "name": f"random (seed {config.seed})", "seed": config.seed,
                "param_dtype": config.target_param_dtype, "shape": shape, "fingerprint": fingerprint_random(config)}
    return {"hf_dir": os.path.abspath(hf_dir), "name": target_name(cfg) or os.path.basename(os.path.abspath(hf_dir)),
            "shape": shape, "fingerprint": fingerprint_dir(hf_dir)}


def write_record(config, cfg, out_dir: str) -> None:
    record = describe(config, cfg)
    if record["hf_dir"]:  # found again from the drafter when the two move together (a copied run, the package)
        record["hf_dir_from_checkpoint"] = os.path.relpath(record["hf_dir"], os.path.abspath(out_dir))
    atomic.write_json(os.path.join(out_dir, RECORD), record)


def read_record(checkpoint: str) -> dict | None:
    path = os.path.join(checkpoint, RECORD)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a target record ({e})") from None
    if not isinstance(record, dict) or "fingerprint" not in record:
        raise CheckpointError(f"{path}: not a target record (no fingerprint)")
    return record


def _recorded_dir(checkpoint: str, record: dict) -> str | None:
    """The recorded target's directory: at its path, beside the drafter, or (the package's own
    drafter, copied anywhere) in the package's assets."""
    from xpress_jax.assets import ASSETS
    asset = record.get("package_asset") and os.path.join(ASSETS, record["package_asset"])
    for candidate in (record.get("hf_dir"), record.get("hf_dir_from_checkpoint"), asset):
        if candidate:
            path = candidate if os.path.isabs(candidate) else os.path.join(checkpoint, candidate)
            if os.path.isfile(os.path.join(path, "config.json")):
                return os.path.normpath(path)
    return None


def resolve_target(config, checkpoints) -> None:
    """Fills config.target.hf_dir from the checkpoints' records when it is empty, and checks a given
    target against them: one line on stderr says which target is used; ConfigError where none can be."""
    records = {c: read_record(c) for c in dict.fromkeys(c for c in checkpoints if c)}
    if not records:
        return  # the tiny random default, or a target alone
    given = config.target.hf_dir
    if not given:
        unrecorded = [c for c, r in records.items() if r is None]
        if unrecorded:
            raise ConfigError(f"{unrecorded[0]} records no target (no {RECORD}: a drafter trained elsewhere); give the "
                              "target it was trained against with --config.target.hf_dir=DIR")
        fingerprints = {r["fingerprint"]: c for c, r in records.items()}
        if len(fingerprints) > 1:
            a, b = list(fingerprints.values())[:2]
            raise ConfigError(f"{a} and {b} were trained against different targets ({records[a]['name']}, "
                              f"{records[b]['name']}); evaluate them in separate runs")
        checkpoint, record = next(iter(records.items()))
        if record["hf_dir"] is None:
            if fingerprint_random(config) != record["fingerprint"]:
                raise ConfigError(f"{checkpoint} was trained against a random target (seed {record['seed']}, "
                                  f"{record['param_dtype']}, {record['shape']}) that this config does not make; give "
                                  f"--config.seed={record['seed']} with its config, or --config.target.hf_dir=DIR")
            print(f"target: the random target {checkpoint} was trained against (seed {record['seed']})",
                  file=sys.stderr)
            return
        found = _recorded_dir(checkpoint, record)
        if found is None:
            raise ConfigError(f"{checkpoint} was trained against {record['name']} at {record['hf_dir']}, which is not "
                              "there; give it with --config.target.hf_dir=DIR")
        config.target.hf_dir = found
        print(f"target: {found} (recorded in {os.path.join(checkpoint, RECORD)})", file=sys.stderr)
        return
    fingerprint = fingerprint_dir(given)
    for checkpoint, record in records.items():
        if record is None or record["fingerprint"] == fingerprint:
            continue
        message = (f"--config.target.hf_dir={given} is not the target {checkpoint} was trained against "
                   f"({record['name']}" + (f" at {record['hf_dir']}" if record["hf_dir"] else "") +
                   f"; {os.path.join(checkpoint, RECORD)} has another fingerprint)")
        if not config.target.accept_other:
            raise ConfigError(message + "; --config.target.accept_other=true uses it anyway")
        print(f"warning: {message}; used anyway (target.accept_other)", file=sys.stderr)
