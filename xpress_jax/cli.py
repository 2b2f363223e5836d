"""Shared command-line plumbing: `--config=FILE` with `--config.a.b=V` overrides, and errors
reported as one line (exit code 2) instead of a traceback.

Overrides are typed by the field they replace, and a key the config does not have is an error.
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import os
import sys
import time
import warnings
from typing import Callable

import ml_collections
from absl import app, flags

from xpress_jax.config_schema import check_config
from xpress_jax.errors import ConfigError, XpressError

_REPO_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def config_path(name: str) -> str:
    """A config file of the checkout's configs/ (or of the working directory's)."""
    return os.path.join(_REPO_CONFIGS, name) if os.path.isdir(_REPO_CONFIGS) else os.path.join("configs", name)


DEFAULT_CONFIG = config_path("tiny.py")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

flags.DEFINE_string("config", DEFAULT_CONFIG,
                    "Config file (configs/NAME.py); override any field with --config.a.b=value.")


def load_config(path: str) -> ml_collections.ConfigDict:
    """Runs `get_config()` of a config file and locks the result (no new keys)."""
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
    config = module.get_config()
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"config file {path}: get_config() returned {type(config).__name__}, not a ConfigDict")
    config.lock()
    return config


def _parse_value(text: str, old):
    if isinstance(old, bool):
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise ValueError(f"expected true or false, got {text!r}")
    if isinstance(old, str):
        return text
    if isinstance(old, (int, float)):
        return type(old)(float(text)) if isinstance(old, int) and "e" in text.lower() else type(old)(text)
    return ast.literal_eval(text)  # tuples, lists, None


def apply_override(config: ml_collections.ConfigDict, key: str, text: str) -> None:
    *parents, leaf = key.split(".")
    node = config
    for i, name in enumerate(parents):
        if not isinstance(node, ml_collections.ConfigDict) or name not in node:
            raise ConfigError(f"unknown config key {'.'.join(parents[:i + 1])!r} (in --config.{key})")
        node = node[name]
    if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
        known = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
        raise ConfigError(f"unknown config key {key!r}; known here: {known}")
    old = node[leaf]
    if isinstance(old, ml_collections.ConfigDict):
        raise ConfigError(f"config key {key!r} is a section; override its fields instead")
    try:
        value = _parse_value(text, old)
    except (ValueError, SyntaxError) as e:
        raise ConfigError(f"--config.{key}={text}: {e}") from None
    with node.ignore_type():
        node[leaf] = value


def _split_overrides(argv: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    rest, overrides = [], []
    args = iter(argv)
    for a in args:
        if a.startswith("--config."):
            key, eq, value = a[len("--config."):].partition("=")
            if not eq:
                value = next(args, "")
            overrides.append((key, value))
        else:
            rest.append(a)
    return rest, overrides


def _fail(message: str, code: int = 2):
    sys.stderr.write(f"error: {message}\nRun with --help for usage.\n")
    sys.exit(code)


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
    """A run refused for bad input leaves nothing behind: a log file it opened (and the directories
    made for it) goes, unless the run wrote anything else beside it (then the log is the record)."""
    for handler, path, is_new, made, opened in _LOG_FILES:
        logging.getLogger().removeHandler(handler)
        handler.close()
        folder = os.path.dirname(path)
        others = [n for n in os.listdir(folder) if os.path.join(folder, n) != path
                  and os.path.getmtime(os.path.join(folder, n)) >= opened - 1] if os.path.isdir(folder) else []
        if is_new and not others and os.path.exists(path):
            os.remove(path)
            for d in made:  # deepest first
                if os.path.isdir(d) and not os.listdir(d):
                    os.rmdir(d)


def run(main: Callable[[ml_collections.ConfigDict], None], default_config: str | None = None) -> None:
    """Parses flags and the config, then calls main(config); user errors print one line."""
    if default_config:
        flags.FLAGS.set_default("config", default_config)
    # CPU XLA cannot donate buffers; the warning says nothing useful there.
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    overrides: list[tuple[str, str]] = []

    def parse(argv):
        nonlocal overrides
        argv, overrides = _split_overrides(argv)
        try:
            rest = flags.FLAGS(argv)
        except flags.Error as e:
            _fail(str(e))
        if len(rest) > 1:
            _fail(f"unexpected arguments: {rest[1:]}")
        return rest

    def guarded(argv):
        quiet_console()  # after app.run installed absl's handler
        try:
            config = load_config(flags.FLAGS.config)
            for key, value in overrides:
                apply_override(config, key, value)
            check_config(config)  # before anything is built or written
            return main(config)
        except (XpressError, FileNotFoundError) as e:
            _discard_logs_of_refused_run()
            _fail(str(e))

    app.run(guarded, flags_parser=parse)
