"""One linkpassd per run directory: an exclusive flock(2) on
`<run_dir>/linkpassd.lock`, taken before the daemon touches anything (the
kernel, the control socket, the state files, the probes).

A second daemon on the same config would fight the first over every route
and socket; it is refused with one line naming the first one's PID. The
kernel drops the lock when the holder exits however it exits (a crash, a
SIGKILL), so a stale file never blocks a restart; the PID written in the
file is only for the message.
"""

from __future__ import annotations

import errno
import fcntl
import os

LOCK_NAME = "linkpassd.lock"
DIR_MODE = 0o755  # like the health file's directory: launchers read it


class AlreadyRunning(Exception):
    """Another process holds the lock; the message names its PID."""


class InstanceLock:
    def __init__(self, run_dir: str) -> None:
        self.path = os.path.join(run_dir, LOCK_NAME)
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock and write our PID, or raise AlreadyRunning (another
        holder) or OSError (the directory cannot be made or written)."""
        parent = os.path.dirname(self.path)
        if not os.path.isdir(parent):
            os.makedirs(parent, mode=DIR_MODE, exist_ok=True)
            os.chmod(parent, DIR_MODE)  # makedirs' mode is subject to umask
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            who = f"pid {holder}" if holder else "a process that has not written its pid yet"
            raise AlreadyRunning(f"another linkpassd ({who}) is running with this run_dir: it "
                                 f"holds {self.path}; stop it first, or give this one another "
                                 "run_dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd  # held, open, until this process exits

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
