"""What `benchmarks/gpu.sh` needs and what this machine lacks, before anything is installed: one
line on stderr (jax's version, its backend and devices, the missing packages), and the missing
packages' requirement names on stdout, space-separated, for the script to install.

Imports nothing outside the standard library but jax (when present), so it runs on a bare image.
The packages are the project's dependencies (pyproject.toml) and what gpu.sh's stages import
besides: pytest, scipy and torch for the parity tests, portpicker for the test helpers.
    python benchmarks/gpu_preflight.py            # from the repository root
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES_ALSO_IMPORT = ("pytest", "scipy", "torch", "portpicker")
IMPORT_NAME = {"orbax-checkpoint": "orbax.checkpoint", "absl-py": "absl", "ml-collections": "ml_collections"}


def requirements() -> list[str]:
    """The requirement names gpu.sh needs: the project's dependencies, then the stages' own, and
    $GPU_SH_REQUIRE (space-separated; the test suite adds a package only a wheel folder has)."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    names = [re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0] for d in deps]
    extra = os.environ.get("GPU_SH_REQUIRE", "").split()
    return names + [n for n in (*STAGES_ALSO_IMPORT, *extra) if n not in names]


def installed(requirement: str) -> bool:
    module = IMPORT_NAME.get(requirement.replace("_", "-"), requirement.replace("-", "_"))
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing (orbax for orbax.checkpoint)
        return False


def jax_line() -> str:
    if not installed("jax"):
        return "jax: not installed"
    try:
        import jax
        devices = jax.devices()
        return f"jax {jax.__version__} ({jax.default_backend()}: {len(devices)} x {devices[0].device_kind})"
    except Exception as e:  # a jaxlib that cannot start its backend still gets its one line
        return f"jax: installed, no backend ({str(e).splitlines()[0][:120]})"


def main() -> None:
    missing = [r for r in requirements() if not installed(r)]
    print(f"gpu.sh: {jax_line()}; python {sys.version.split()[0]}; missing: {', '.join(missing) or 'nothing'}",
          file=sys.stderr, flush=True)
    print(" ".join(missing))


if __name__ == "__main__":
    main()
