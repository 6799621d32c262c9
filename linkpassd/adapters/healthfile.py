"""health.json on disk: written atomically for launchers that read it any time.

A launcher may read `/run/linkpass/health.json` at the very moment the daemon
rewrites it, so a write must never be visible half done: each goes to a
temporary file in the same directory, is fsynced and renamed over the old one
(statefile.write_json_atomic), and a reader has either the old inode or the new
one.  The file is 0644 and its directory 0755 when we create it, because
launchers run as ordinary users and need no socket access to read it.

When the daemon stops cleanly it rewrites the file already expired
(`mark_stopped`), so readers refuse it at once rather than trusting it until
the old `valid_until`; after a crash, `valid_until` passing does the same.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from linkpassd.adapters.statefile import StateFileError, read_json, write_json_atomic
from linkpassd.core import healthdoc
from linkpassd.core.healthdoc import HealthDoc

__all__ = ["HealthFile", "HealthFileError", "own_pid_namespace"]

FILE_MODE = 0o644
DIR_MODE = 0o755
PID_NAMESPACE_LINK = "/proc/self/ns/pid"


def own_pid_namespace(link: str = PID_NAMESPACE_LINK) -> int:
    """This process's PID namespace: the inode of /proc/self/ns/pid (what
    `readlink` shows as pid:[N]); 0 when it cannot be read (no /proc).  The
    daemon writes it into health.json as pid_ns and nccl-env compares its
    own, since a pid means the same process only inside one namespace."""
    try:
        return os.stat(link).st_ino
    except OSError:
        return 0


class HealthFileError(Exception):
    """health.json is missing or cannot be used; the message names the file and why."""


class HealthFile:
    """The health document at `path` (the daemon: `<run_dir>/health.json`)."""

    def __init__(self, path: str) -> None:
        self.path = str(path)  # a str: callers name it in problems and logs

    def write(self, doc: HealthDoc) -> None:
        """Replace the file with `doc`, atomically.  OSError (disk full, read-only
        run dir...) is the caller's to report: a failed write leaves the previous
        document in place, which goes stale by itself."""
        self._ensure_directory()
        write_json_atomic(self.path, healthdoc.to_json(doc), mode=FILE_MODE)

    def mark_stopped(self, doc: HealthDoc, now: float | None = None) -> HealthDoc:
        """Rewrite `doc` as expired now (valid_until == written_at == now) and
        return what was written.  For a clean stop: readers see it stale at once."""
        final = healthdoc.stopped(doc, time.time() if now is None else now)
        self.write(final)
        return final

    def read(self) -> HealthDoc:
        """The document in the file; HealthFileError naming the file and what is
        wrong (missing, unreadable, not JSON, a bad field)."""
        try:
            obj = read_json(self.path)
        except StateFileError as exc:
            raise HealthFileError(str(exc)) from None
        if obj is None:
            raise HealthFileError(f"{self.path}: no such file (is linkpassd running on this host?)")
        try:
            return healthdoc.from_json(obj)
        except healthdoc.HealthDocError as exc:
            raise HealthFileError(f"{self.path}: {exc}") from None

    def _ensure_directory(self) -> None:
        """Create the directory 0755 when it is missing (readable by launchers
        whatever the daemon's umask); an existing one is left as it is (under
        systemd, RuntimeDirectoryMode= owns it)."""
        parent = Path(self.path).parent
        if parent.is_dir():
            return
        parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        os.chmod(parent, DIR_MODE)
