"""Memory-mapped safetensors reading and streaming writing, one tensor at a time.

Reading maps the file and hands out numpy views, so loading an 8B or 32B checkpoint never holds
more than the tensor being placed. Writing goes shard by shard to a temporary name, then renames.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from typing import Callable, Iterable, Iterator

import ml_dtypes
import numpy as np

from xpress_jax import atomic
from xpress_jax.errors import CheckpointError, read_json

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
}
_NAMES = {v: k for k, v in _DTYPES.items()}


class SafetensorsFile:
    """One .safetensors file, memory-mapped; `get(key)` returns a read-only numpy view."""

    def __init__(self, path: str):
        self.path = path
        if not os.path.isfile(path):
            raise CheckpointError(f"missing safetensors file: {path}")
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointError(f"{path}: not a safetensors file (shorter than its header)")
            (header_len,) = struct.unpack("<Q", raw)
            try:
                header = json.loads(f.read(header_len))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise CheckpointError(f"{path}: unreadable safetensors header ({e})") from None
        self.metadata = header.pop("__metadata__", None) or {}
        self.entries = header
        self._data_start = 8 + header_len
        size = os.path.getsize(path)
        for key, e in header.items():
            if self._data_start + e["data_offsets"][1] > size:
                raise CheckpointError(f"{path}: tensor {key!r} runs past the end of the file (truncated?)")
        self._mmap = None

    def keys(self) -> list[str]:
        return list(self.entries)

    def dtype_name(self, key: str) -> str:
        return self.entries[key]["dtype"]

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.entries[key]["shape"])

    def get(self, key: str) -> np.ndarray:
        if key not in self.entries:
            raise CheckpointError(f"{self.path}: no tensor {key!r}")
        e = self.entries[key]
        if e["dtype"] not in _DTYPES:
            raise CheckpointError(f"{self.path}: tensor {key!r} has unsupported dtype {e['dtype']}")
        if self._mmap is None:
            with open(self.path, "rb") as f:
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        begin, end = e["data_offsets"]
        dtype = _DTYPES[e["dtype"]]
        shape = tuple(e["shape"])
        if (end - begin) != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise CheckpointError(f"{self.path}: tensor {key!r} byte size does not match shape {shape}")
        return np.ndarray(shape, dtype=dtype, buffer=self._mmap, offset=self._data_start + begin)


class SafetensorsDir:
    """The weights of an HF directory: `model.safetensors`, or shards listed by the index."""

    def __init__(self, directory: str):
        self.directory = directory
        index_path = os.path.join(directory, INDEX_FILE)
        single = os.path.join(directory, SINGLE_FILE)
        if os.path.isfile(index_path):
            weight_map: dict[str, str] = read_json(index_path).get("weight_map")
            if not isinstance(weight_map, dict):
                raise CheckpointError(f"{index_path}: no weight_map object")
            missing = sorted({s for s in weight_map.values()
                              if not os.path.isfile(os.path.join(directory, s))})
            if missing:
                raise CheckpointError(f"{index_path} lists shard files that are missing: {missing}")
            self._files = {s: SafetensorsFile(os.path.join(directory, s)) for s in sorted(set(weight_map.values()))}
            self._where = {}
            for key, shard in weight_map.items():
                if key not in self._files[shard].entries:
                    raise CheckpointError(f"{index_path} maps {key!r} to {shard}, which does not hold it")
                self._where[key] = self._files[shard]
        elif os.path.isfile(single):
            f = SafetensorsFile(single)
            self._files = {SINGLE_FILE: f}
            self._where = {k: f for k in f.keys()}
        else:
            raise CheckpointError(f"{directory}: neither {SINGLE_FILE} nor {INDEX_FILE} found")

    def keys(self) -> list[str]:
        return list(self._where)

    def file_of(self, key: str) -> str:
        return self._where[key].path

    def shape(self, key: str) -> tuple[int, ...]:
        return self._where[key].shape(key)

    def dtype_name(self, key: str) -> str:
        return self._where[key].dtype_name(key)

    def get(self, key: str) -> np.ndarray:
        if key not in self._where:
            raise CheckpointError(f"{self.directory}: no tensor {key!r}")
        return self._where[key].get(key)


def _header(tensors: list[tuple[str, np.dtype, tuple[int, ...]]], metadata: dict[str, str]) -> bytes:
    header: dict = {"__metadata__": metadata}
    offset = 0
    for key, dtype, shape in tensors:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        header[key] = {"dtype": _NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # 8-byte alignment of the data section, as the reference writer does
    return struct.pack("<Q", len(raw)) + raw


def write_file(path: str, tensors: Iterable[tuple[str, np.ndarray]], metadata: dict[str, str] | None = None) -> None:
    """Writes one safetensors file atomically (temporary name, fsync, rename)."""
    tensors = [(k, np.ascontiguousarray(v)) for k, v in tensors]
    spec = [(k, v.dtype, v.shape) for k, v in tensors]
    with atomic.replacing(path, "wb") as f:
        f.write(_header(spec, metadata or {"format": "pt"}))
        for _, v in tensors:
            f.write(v.tobytes())


def plan_shards(sizes: list[tuple[str, int]], max_shard_bytes: int) -> list[list[str]]:
    """Groups keys, in order, into shards of at most max_shard_bytes (a larger tensor stands alone)."""
    shards: list[list[str]] = [[]]
    used = 0
    for key, nbytes in sizes:
        if shards[-1] and used + nbytes > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(key)
        used += nbytes
    return shards


def write_dir(directory: str, keys_and_sizes: list[tuple[str, int]],
              fetch: Callable[[list[str]], Iterator[tuple[str, np.ndarray]]],
              max_shard_bytes: int = 5 * 2**30) -> list[str]:
    """Writes HF-style weights: one `model.safetensors`, or numbered shards plus the index.

    `fetch(keys)` yields the arrays of one shard, so only one shard is in host memory at a time.
    Returns the file names written.
    """
    os.makedirs(directory, exist_ok=True)
    shards = plan_shards(keys_and_sizes, max_shard_bytes)
    if len(shards) == 1:
        names = [SINGLE_FILE]
    else:
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for name, keys in zip(names, shards):
        write_file(os.path.join(directory, name), fetch(keys))
        weight_map.update({k: name for k in keys})
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(n for _, n in keys_and_sizes)}, "weight_map": weight_map}
        atomic.write_json(os.path.join(directory, INDEX_FILE), index)
    return names
