"""Running the project's CLIs as a user does: `python -m MODULE ARGS` in a subprocess from the
checkout root, with stdout, stderr and the exit code captured."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, timeout=300, env_extra=None):
    env = dict(os.environ, XLA_FLAGS="", **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=timeout)


def last_json(stdout):
    return json.loads(stdout.strip().splitlines()[-1])
