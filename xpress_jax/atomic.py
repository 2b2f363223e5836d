"""Atomic file writes: an interrupted run never leaves half a file that later reads as whole.

Every result, config and marker file the project writes goes through here: the content goes to a
temporary name beside the target, is flushed to disk, and then replaces the target in one rename.
"""

import contextlib
import json
import os
from typing import IO, Any, Iterator


@contextlib.contextmanager
def replacing(path: str, mode: str = "w") -> Iterator[IO]:
    """Opens a temporary file that replaces `path` when the block ends without an exception."""
    tmp = f"{path}.tmp"
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        # after a failed write the old file (if any) is left exactly as it was
        if os.path.exists(tmp):
            os.remove(tmp)


def write_text(path: str, text: str) -> None:
    with replacing(path) as f:
        f.write(text)


def write_json(path: str, obj: Any) -> None:
    with replacing(path) as f:
        json.dump(obj, f, indent=2)
