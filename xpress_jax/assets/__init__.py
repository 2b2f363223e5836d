"""What ships inside the package: the data sets (`assets/data`, with their licences) and the tiny
reproduction's trained checkpoints (`assets/tiny`: the Qwen3 target, its DFlash drafter, and an
XPress refiner trained on that drafter).
Every file is listed with its SHA-256 in `assets/SHA256SUMS`.

`$XPRESS_DATA` points the data sets elsewhere (a folder with the same layout); nothing else here
reads outside the package.
"""

from __future__ import annotations

import hashlib
import os

ASSETS = os.path.dirname(os.path.abspath(__file__))
CHECKSUMS = os.path.join(ASSETS, "SHA256SUMS")
TINY_TARGET = os.path.join(ASSETS, "tiny", "target")  # HF directory: config, weights, BPE tokenizer
TINY_DFLASH = os.path.join(ASSETS, "tiny", "dflash")  # DFlash drafter export for TINY_TARGET
# the XPress refiner trained 100 steps on the frozen TINY_DFLASH drafter (heads/ of an export)
TINY_XPRESS_HEADS = os.path.join(ASSETS, "tiny", "xpress")


def data_root() -> str:
    """$XPRESS_DATA, else the data sets that ship in the package."""
    return os.environ.get("XPRESS_DATA", os.path.join(ASSETS, "data"))


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def shipped_files() -> list[str]:
    """Every shipped file, relative to ASSETS, in a stable order (code and the checksum list excluded)."""
    out = []
    for folder, dirs, names in os.walk(ASSETS):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(folder, name), ASSETS)
            if not rel.endswith(".py") and rel != "SHA256SUMS":
                out.append(rel)
    return out


def checksum_list() -> str:
    """The SHA256SUMS text (`sha256sum` format) of the files on disk."""
    return "".join(f"{sha256(os.path.join(ASSETS, rel))}  {rel}\n" for rel in shipped_files())


def write_checksums() -> None:
    """Rewrites SHA256SUMS after a shipped file changes (`python -c "from xpress_jax import assets;
    assets.write_checksums()"`); tests/test_assets.py fails until it matches."""
    from xpress_jax import atomic
    atomic.write_text(CHECKSUMS, checksum_list())
