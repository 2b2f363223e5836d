"""Shared command-line plumbing: `--config=FILE` with `--config.a.b=V` overrides (the ecosystem's
`ml_collections.config_flags`), and errors reported as one line (exit code 2) instead of a
traceback.

Overrides are typed by the field they replace (config_flags' parsers), and a key the config does
not have is an error.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import sys
import time
import warnings
from typing import Callable

import ml_collections
from absl import flags
from ml_collections import config_flags

from xpress_jax.config_schema import check_config
from xpress_jax.errors import ConfigError, XpressError

# transformers prints its own advisories to the console on import (e.g. "PyTorch was not found",
# which is expected: the JAX code never needs torch); XPRESS users can set TRANSFORMERS_VERBOSITY.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

_REPO_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def config_path(name: str) -> str:
    """A config file of the checkout's configs/ (or of the working directory's)."""
    return os.path.join(_REPO_CONFIGS, name) if os.path.isdir(_REPO_CONFIGS) else os.path.join("configs", name)


DEFAULT_CONFIG = config_path("tiny.py")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CONFIG_HELP = "Config file (configs/NAME.py); override any field with --config.a.b=value."


def load_config(spec: str) -> ml_collections.ConfigDict:
    """Runs `get_config()` of a config file and locks the result (no new keys). `FILE:ARG` calls
    get_config(ARG), as `--config=FILE:ARG` does (configs/paper_eval.py:qwen3_4b)."""
    path, _, arg = spec.partition(":") if not os.path.isfile(spec) else (spec, "", "")
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist")
    spec = importlib.util.spec_from_file_location(f"xpress_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ConfigError(f"config file {path}, line {e.lineno}: {e.msg}") from None
    if not hasattr(module, "get_config"):
        raise ConfigError(f"config file {path!r} defines no get_config()")
    try:
        config = module.get_config(arg) if arg else module.get_config()
    except (ImportError, TypeError) as e:  # an argument the file does not take, or names no config
        raise ConfigError(f"config file {path}: get_config({arg!r}): {e}") from None
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"config file {path}: get_config() returned {type(config).__name__}, not a ConfigDict")
    config.lock()
    return config


def _config_args(argv: list[str], default: str) -> tuple[str, list[str]]:
    """The config file named on the command line (or the default) and the override keys."""
    path, keys = default, []
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        elif arg.startswith("--config."):
            keys.append(arg[len("--config."):].split("=", 1)[0])
    return path, keys


def _check_keys(config: ml_collections.ConfigDict, keys: list[str]) -> None:
    for key in keys:
        node = config
        parts = key.split(".")
        for i, name in enumerate(parts):
            if not isinstance(node, ml_collections.ConfigDict) or name not in node:
                where = ".".join(parts[:i + 1])
                known = f"; known here: {sorted(node.keys())}" if isinstance(node, ml_collections.ConfigDict) else ""
                raise ConfigError(f"unknown config key {where!r} (in --config.{key}){known}")
            node = node[name]
        if isinstance(node, ml_collections.ConfigDict):
            raise ConfigError(f"config key {key!r} is a section; override its fields instead")


def define_config_flag(flag_values: flags.FlagValues, argv: list[str], default: str = DEFAULT_CONFIG) -> None:
    """Defines `--config` (ml_collections.config_flags) on `flag_values` for this command line.

    config_flags loads the file and types the overrides while the flag is being defined, and for a
    missing file, a syntax error or an unknown key it raises a bare OSError / SyntaxError / KeyError
    with a traceback. So the file is first loaded here and the override keys checked against it,
    which turns those cases into one-line ConfigErrors; anything else config_flags refuses at
    definition becomes a ConfigError too. Bad values are refused later, at parse time, as absl
    flag errors (`run` prints them as one line)."""
    path, keys = _config_args(argv, default)
    _check_keys(load_config(path), keys)
    try:
        config_flags.DEFINE_config_file("config", default, CONFIG_HELP, flag_values=flag_values, sys_argv=argv,
                                        lock_config=True)
    except Exception as e:  # noqa: BLE001 - whatever config_flags raises becomes one line
        raise ConfigError(f"--config: {e}") from None


def config_overrides(flag_values: flags.FlagValues) -> frozenset[str]:
    """The dotted config keys this command line set (`--config.a.b=V`), once flags are parsed.
    Where a checkpoint records a value of its own (a head's rank, the drafter's target layers),
    the checkpoint's wins unless one of these asked for another (`models.build.checkpoint_values`)."""
    return frozenset(name.removeprefix("config.") for name in flag_values
                     if name.startswith("config.") and flag_values[name].present)


def config_file(flag_values: flags.FlagValues) -> str:
    """The config file the command line named (or the default), once flags are parsed."""
    return config_flags.get_config_filename(flag_values["config"])


def parse_config(path: str, overrides: list[str] = ()) -> ml_collections.ConfigDict:
    """The config the command line `--config=path --config.a.b=V ...` gives, through the same
    config_flags path as the CLIs (for tests and notebooks)."""
    argv = ["xpress_jax", f"--config={path}", *overrides]
    flag_values = flags.FlagValues()
    define_config_flag(flag_values, argv, path)
    try:
        flag_values(argv)
    except flags.Error as e:
        raise ConfigError(str(e)) from None
    return flag_values.config


def with_overrides(path: str, **overrides) -> ml_collections.ConfigDict:
    """parse_config with overrides as keyword pairs: with_overrides(p, **{"train.lr": 3e-4})."""
    return parse_config(path, [f"--config.{k}={v}" for k, v in overrides.items()])


def _refuse(message: str) -> int:
    sys.stderr.write(f"error: {message}\nRun with --help for usage.\n")
    return 2


def print_line(text: str) -> None:
    """`text` and its newline in one write: the processes of a multi-process run share a console,
    and under PYTHONUNBUFFERED print() writes the newline separately, so two processes ending
    together would mix their lines (a pipe keeps a write of under 4 KiB whole)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def quiet_console() -> None:
    """The console shows warnings and errors (progress bars and results are printed, not logged);
    XPRESS_LOG_LEVEL=INFO brings the library INFO lines (absl, Orbax, ours) back to it."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter(LOG_FORMAT))
    console.setLevel(os.environ.get("XPRESS_LOG_LEVEL", "WARNING").upper())
    root.addHandler(console)
    root.setLevel(logging.INFO)
    logging.getLogger("absl").setLevel(logging.INFO)


# log files opened by this process: (handler, path, it is new, directories made for it, time opened)
_LOG_FILES: list[tuple[logging.Handler, str, bool, list[str], float]] = []


def log_to_file(path: str) -> None:
    """Every INFO line from here on also goes to `path` (in the run directory)."""
    path = os.path.abspath(path)
    made, parent = [], os.path.dirname(path)
    while not os.path.isdir(parent):
        made.append(parent)
        parent = os.path.dirname(parent)
    is_new = not os.path.exists(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.setLevel(logging.INFO)
    logging.getLogger().addHandler(handler)
    _LOG_FILES.append((handler, path, is_new, made, time.time()))


def _discard_logs_of_refused_run() -> None:
    """A run refused for bad input leaves nothing behind: a log file it opened, the empty folders
    made beside it (a checkpoint manager's) and the directories made for it go, unless the run
    wrote any other file there (then the log is the record)."""
    for handler, path, is_new, made, opened in _LOG_FILES:
        logging.getLogger().removeHandler(handler)
        handler.close()
        folder = os.path.dirname(path)
        others = [n for n in os.listdir(folder) if os.path.join(folder, n) != path
                  and os.path.getmtime(os.path.join(folder, n)) >= opened - 1] if os.path.isdir(folder) else []
        empty = [n for n in others if _holds_no_file(os.path.join(folder, n))]
        if is_new and len(empty) == len(others) and os.path.exists(path):
            os.remove(path)
            for n in empty:
                shutil.rmtree(os.path.join(folder, n))
            for d in made:  # deepest first
                if os.path.isdir(d) and not os.listdir(d):
                    os.rmdir(d)


def _holds_no_file(path: str) -> bool:
    return os.path.isdir(path) and not any(files for _, _, files in os.walk(path))


def _close_log_files(refused: bool) -> None:
    if refused:
        _discard_logs_of_refused_run()
    for handler, *_ in _LOG_FILES:
        logging.getLogger().removeHandler(handler)
        handler.close()
    _LOG_FILES.clear()


def usage(main: Callable, flag_values: flags.FlagValues) -> str:
    """The command's docstring (what it does, example lines) and its flags."""
    doc = (sys.modules[main.__module__].__doc__ or "").strip()
    return f"{doc}\n\nFlags:\n{flag_values.get_help()}\n"


def invoke(main: Callable[[ml_collections.ConfigDict], int | None], flag_values: flags.FlagValues,
           argv: list[str], default_config: str | None = None) -> int:
    """One run of a command: parses `argv` (program name first) into the command's own
    `flag_values` plus `--config`, checks the config, calls main(config) and returns the exit code:
    0, what main returned or exited with, or 2 after one line on stderr for bad input (a flag, a
    config field, a path). Tests call it in-process; `run` is the entry point."""
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")  # CPU XLA never donates
    flag_values.unparse_flags()  # a second invocation in one process starts from the defaults
    for name in [n for n in flag_values if n == "config" or n.startswith("config.")]:
        delattr(flag_values, name)  # --config and its overrides are defined anew for this command line
    refused = False
    try:
        define_config_flag(flag_values, argv, default_config or DEFAULT_CONFIG)
        if any(a in ("--help", "-h", "--helpfull", "--helpshort") for a in argv[1:]):
            print(usage(main, flag_values))
            return 0
        try:
            rest = flag_values(argv)
        except flags.Error as e:
            return _refuse(str(e))
        if len(rest) > 1:
            return _refuse(f"unexpected arguments: {rest[1:]}")
        quiet_console()
        config = flag_values.config
        check_config(config)  # before anything is built or written
        return int(main(config) or 0)
    except (XpressError, FileNotFoundError) as e:
        refused = True  # a refused run leaves no log file behind
        return _refuse(str(e))
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else _refuse(str(e.code)))
    finally:
        _close_log_files(refused)


def use_compilation_cache() -> None:
    """A persistent XLA compilation cache, so a second run of a command skips compiling what the
    first compiled: $JAX_COMPILATION_CACHE_DIR when set, else ~/.cache/xpress_jax/xla."""
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        import jax
        jax.config.update("jax_compilation_cache_dir",
                          os.path.join(os.path.expanduser("~"), ".cache", "xpress_jax", "xla"))


def run(main: Callable[[ml_collections.ConfigDict], int | None], flag_values: flags.FlagValues,
        default_config: str | None = None) -> None:
    """The entry point of `python -m xpress_jax.COMMAND`: `invoke` on sys.argv, then exit with its code."""
    flags.FLAGS.mark_as_parsed()  # absl's own flags (logging verbosity) keep their defaults
    use_compilation_cache()
    sys.exit(invoke(main, flag_values, sys.argv, default_config))
