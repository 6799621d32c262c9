"""Small JSON files in the state directory, written atomically.

What linkpassd decided and why (verdicts, allocated ids) must survive a
restart, and a crash mid-write must never leave half a file: each write goes
to a temporary file in the same directory, is fsynced, and renamed over the
old one. A file that cannot be read or parsed is reported and treated as
absent, never as a reason to stop: the daemon then falls back to what the
kernel shows (see the daemon's adoption).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

MAX_BYTES = 4 << 20  # a state file is kilobytes; anything huge is not ours


class StateFileError(Exception):
    """A state file exists but cannot be used; the message names it and why."""


def read_json(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The file's object, None when it does not exist; StateFileError when it
    exists but is unreadable, too large, not JSON or not a JSON object."""
    p = Path(path)
    try:
        with open(p, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateFileError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise StateFileError(f"{p}: larger than {MAX_BYTES} bytes")
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateFileError(f"{p}: not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise StateFileError(f"{p}: expected a JSON object, got {type(value).__name__}")
    return value


def write_json_atomic(path: str | os.PathLike[str], value: dict[str, Any], mode: int = 0o644) -> None:
    """Replace `path` with `value` as JSON, atomically (temp file, fsync, rename)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(value, handle, indent=1, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(p.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power cut
    finally:
        os.close(dir_fd)

