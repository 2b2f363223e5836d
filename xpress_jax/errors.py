"""Errors about the user's input. CLIs print these as one line instead of a traceback."""


class XpressError(ValueError):
    """Base class: bad input that the user can fix (a path, a config key, a prompt)."""


class ConfigError(XpressError):
    """A config (ml_collections or HF config.json) this code cannot honour."""


class CheckpointError(XpressError):
    """A checkpoint that cannot be read or does not match the model; names file and key."""


class DataError(XpressError):
    """Data that cannot be turned into tokens or batches."""


class InputError(XpressError):
    """A request the decoder cannot serve (empty prompt, prompt longer than the cache, ...)."""


def read_json(path: str, error: type[XpressError] = CheckpointError) -> dict:
    """A JSON object from `path`, or `error` naming the file and what is wrong with it."""
    import json
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path}: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise error(f"{path}: expected a JSON object, found {type(value).__name__}")
    return value
