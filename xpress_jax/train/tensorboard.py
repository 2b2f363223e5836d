"""TensorBoard scalar logs, written directly.

tensorboardX imports torch whenever torch is installed (seconds per training process), and
TensorFlow's writer needs TensorFlow. A scalar log needs neither: an event file is TFRecord
framing (length, masked CRC-32C of the length, payload, masked CRC-32C of the payload) around
`Event` protocol buffers, and a scalar uses five of their fields, encoded here.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli, reflected
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    """TFRecord's mask, so that a CRC of data that holds CRCs stays well spread."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(payload: bytes) -> bytes:
    length = struct.pack("<Q", len(payload))
    return length + struct.pack("<I", _masked_crc(length)) + payload + struct.pack("<I", _masked_crc(payload))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _float32(value: float) -> bytes:
    try:
        return struct.pack("<f", value)
    except OverflowError:  # beyond float32's range: its infinity, as numpy casts
        return struct.pack("<f", math.copysign(math.inf, value))


def event(wall_time: float, step: int, *, file_version: str | None = None,
          scalar: tuple[str, float] | None = None) -> bytes:
    """An `Event` proto: wall_time (field 1, double), step (2, int64), and file_version (3) or a
    summary (5) holding one `Summary.Value` with its tag (1) and simple_value (2, float)."""
    out = _varint(1 << 3 | 1) + struct.pack("<d", wall_time) + _varint(2 << 3) + _varint(step & (2**64 - 1))
    if file_version is not None:
        out += _length_delimited(3, file_version.encode())
    if scalar is not None:
        tag, value = scalar
        summary_value = _length_delimited(1, tag.encode()) + _varint(2 << 3 | 5) + _float32(value)
        out += _length_delimited(5, _length_delimited(1, summary_value))
    return out


class ScalarWriter:
    """Appends scalars to one event file in `log_dir`, which TensorBoard reads as a run."""

    def __init__(self, log_dir: str):
        os.makedirs(log_dir, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        self.file = open(os.path.join(log_dir, name), "ab")
        self.file.write(tfrecord(event(time.time(), 0, file_version="brain.Event:2")))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.file.write(tfrecord(event(time.time(), step, scalar=(tag, float(value)))))

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.file.close()
