"""A Linux timerfd (timerfd_create(2), through ctypes on libc) for wake-ups
finer than a millisecond.

Why: asyncio's timers wake through epoll_wait, whose timeout is in whole
milliseconds and which Python rounds up so as never to wake early, so a
timer fires up to a millisecond late (and the echo timer's own millisecond
grid added up to another). A confirmation of a probe loss is a chain of
such wake-ups (the suspicion, the burst's probes, the verdict), and at a
10 ms probe interval that lateness was several milliseconds of every
blackout (issue 11). A timerfd is a file descriptor the loop watches like
any socket and the kernel makes readable at the nanosecond it was set for,
on CLOCK_MONOTONIC, which is asyncio's clock (time.monotonic).

Python 3.13 has os.timerfd_create; this is the small piece for 3.11.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import os

__all__ = ["TimerFd", "available"]

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _create = _libc.timerfd_create
    _create.argtypes = [ctypes.c_int, ctypes.c_int]
    _create.restype = ctypes.c_int
    _settime = _libc.timerfd_settime
    _settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    _settime.restype = ctypes.c_int
    _AVAILABLE = True
except (OSError, AttributeError):  # not Linux, or a libc without timerfd
    _AVAILABLE = False


def available() -> bool:
    return _AVAILABLE


class TimerFd:
    """One-shot absolute timer on CLOCK_MONOTONIC. `fileno()` becomes readable
    at the time given to `set`; `clear()` (after it fired) makes it not
    readable again; `set(None)` disarms it."""

    def __init__(self) -> None:
        if not _AVAILABLE:
            raise OSError(_errno.ENOSYS, "timerfd is not available from libc")
        fd = _create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self._fd = fd
        self._spec = _Itimerspec()
        self._ref = ctypes.byref(self._spec)

    def fileno(self) -> int:
        return self._fd

    def set(self, when: float | None) -> None:
        """Fire at `when` (monotonic seconds; in the past: at once), or never (None)."""
        value = self._spec.it_value
        if when is None:
            value.tv_sec = value.tv_nsec = 0  # disarm
        else:
            ns = max(1, int(when * 1e9))  # 0 would disarm
            value.tv_sec, value.tv_nsec = divmod(ns, 1_000_000_000)
        if _settime(self._fd, _TFD_TIMER_ABSTIME if when is not None else 0, self._ref, None) < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    def clear(self) -> None:
        """Consume the expiry, so the descriptor is not readable until set again."""
        try:
            os.read(self._fd, 8)
        except (BlockingIOError, InterruptedError):
            pass

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
