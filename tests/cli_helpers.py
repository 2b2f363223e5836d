"""Running the project's CLIs as a user does: `python -m MODULE ARGS` in a subprocess from the
checkout root (`run`), or the same command line parsed and run in this process (`invoke`: the
same flags, config checks and one-line errors, without the seconds a fresh interpreter and jax
import cost). Both give stdout, stderr and the exit code."""

import contextlib
import importlib
import io
import json
import os
import subprocess
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, timeout=300, env_extra=None):
    env = dict(os.environ, XLA_FLAGS=os.environ.get("XPRESS_TEST_XLA_FLAGS", ""), **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=timeout)


def start_processes(count, command, *args):
    """`launch/local_multiprocess.sh COUNT COMMAND ARGS...`: COUNT processes of `python -m
    xpress_jax.COMMAND` with two CPU devices each, coordinated over localhost (a new session, so
    os.killpg stops the launcher and every process)."""
    import portpicker
    env = {**os.environ, "XLA_FLAGS": os.environ.get("XPRESS_TEST_XLA_FLAGS", ""),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
           "XPRESS_PORT": str(portpicker.pick_unused_port())}
    return subprocess.Popen(["bash", os.path.join(ROOT, "launch", "local_multiprocess.sh"), str(count), command,
                             *args], cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def invoke(module, *args):
    """`python -m module args...` in this process, through the command's own `cli.run` arguments."""
    from xpress_jax import cli
    try:
        command = importlib.import_module(f"{module}.__main__")
    except ModuleNotFoundError:
        command = importlib.import_module(module)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.invoke(command.main, command.FLAGS, [module, *args], getattr(command, "DEFAULT_CONFIG", None))
    return types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def last_json(stdout):
    return json.loads(stdout.strip().splitlines()[-1])
