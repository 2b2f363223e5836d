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
