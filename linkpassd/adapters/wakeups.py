"""One event-loop timer for every echo path of the service.

Each path's next deadline (a send, a probe's timeout, a burst probe) lives in
one core.schedule.DeadlineQueue, and the loop holds a single timer: at the
earliest deadline, rounded up to a grid (`grain_s`) so that the paths due
within the same grain run in one wake-up. The lag of that wake-up is
measured and recorded once (not once per path), into the daemon's loop-lag
meter. Why: with a handle per path, a send or a reply cancelled and re-created
that path's handle, and every path woke the loop on its own (issue 11).

The timer is a timerfd the loop watches (adapters.timerfd) where Linux has
one, else an asyncio timer: asyncio's timers wake through epoll_wait's whole
milliseconds, rounded up, so each of them fired up to a millisecond late,
and a loss's confirmation is a chain of four or five of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Protocol

from linkpassd.adapters import timerfd
from linkpassd.adapters.looplag import LoopLag
from linkpassd.core.schedule import DeadlineQueue, batched_wake

_RETRY_AFTER_FAILURE_S = 1.0  # a key whose run raised is run again this much later
# Keys run per wake-up at most; the rest run after the loop has polled its
# sockets again. A probe costs tens of microseconds in Python, so a backlog of
# hundreds (after a stall, or a mesh larger than the host can probe) holds
# carrier and BFD events for one slice (a millisecond or two), not all of it.
MAX_RUNS_PER_WAKEUP = 32
# Deadlines within this much share a wake-up. Sends go on the send slots'
# millisecond grid anyway (core.schedule.send_slot); this only rounds
# deadlines (timeouts, burst probes), whose lateness is the blackout's.
PRECISE_GRAIN_S = 0.00025
COARSE_GRAIN_S = 0.001  # with asyncio's timers, which cannot do better


class Due(Protocol):
    def due(self, now: float, lag: float) -> None:
        """Run: a deadline of this key passed (`lag`: how late the loop woke)."""


class SharedTimer:
    """Runs `key.due(now, lag)` for every key whose deadline passed, from one
    loop timer. `set` from inside a run is fine (the timer is re-armed once,
    after the run). Counts its wake-ups and runs, for measurement."""

    def __init__(self, lag: LoopLag | None = None, grain_s: float | None = None,
                 max_runs: int = MAX_RUNS_PER_WAKEUP,
                 batch: AbstractContextManager | None = None, precise: bool = True):
        self.lag = lag
        self.precise = precise and timerfd.available()
        if grain_s is None:
            grain_s = PRECISE_GRAIN_S if self.precise else COARSE_GRAIN_S
        # Entered around each wake-up's runs (the echo service's outbox: the
        # probes queued by every run leave together when it exits).
        self.batch = batch if batch is not None else nullcontext()
        self.grain_s = grain_s
        self.max_runs = max_runs
        self.queue: DeadlineQueue[Due] = DeadlineQueue()
        self.wakeups = 0  # loop wake-ups of this timer
        self.runs = 0  # keys run (one wake-up runs every key due by then)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | timerfd.TimerFd | None = None  # while armed
        self._fd: timerfd.TimerFd | None = None
        self._armed_at: float | None = None
        self._holds = 0  # while > 0 (a wake-up's runs, or `held()`), set() does not re-arm

    def set(self, key: Due, when: float) -> None:
        """Run `key` at `when` (loop time), replacing its previous deadline."""
        self.queue.set(key, when)
        if not self._holds:
            self._arm()

    def discard(self, key: Due) -> None:
        self.queue.discard(key)
        if not len(self.queue) and not self._holds:
            self._cancel()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Re-arm once, at the end, however many keys are set meanwhile (the
        echo service reads a batch of replies this way: each moves its path)."""
        self._holds += 1
        try:
            yield
        finally:
            self._holds -= 1
            if not self._holds:
                self._arm()

    def close(self) -> None:
        self._cancel()
        self.queue = DeadlineQueue()
        if self._fd is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._fd.fileno())
            self._fd.close()
            self._fd = None

    def _cancel(self) -> None:
        if self._handle is not None:
            if isinstance(self._handle, timerfd.TimerFd):
                self._handle.set(None)
            else:
                self._handle.cancel()
        self._handle = self._armed_at = None

    def _arm(self) -> None:
        earliest = self.queue.earliest()
        if earliest is None:
            self._cancel()
            return
        wake = batched_wake(earliest, self.grain_s)
        if self._handle is not None and self._armed_at == wake:
            return
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._armed_at = wake
        if self.precise:
            if self._fd is None:
                self._fd = timerfd.TimerFd()
                self._loop.add_reader(self._fd.fileno(), self._expired)
            self._fd.set(wake)  # re-arming replaces the previous time
            self._handle = self._fd
            return
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._loop.call_at(wake, self._fire)

    def _expired(self) -> None:
        self._fd.clear()
        if self._handle is not None:  # not disarmed meanwhile
            self._fire()

    def _fire(self) -> None:
        scheduled, self._handle, self._armed_at = self._armed_at, None, None
        now = self._loop.time()
        lag = max(0.0, now - scheduled)
        self.wakeups += 1
        if self.lag is not None:
            self.lag.record(now, lag)
        self._holds += 1
        try:
            with self.batch:
                for key, _when in self.queue.pop_due(now, self.max_runs):
                    self.runs += 1
                    try:
                        key.due(now, lag)
                    except Exception as exc:  # noqa: BLE001 - one path's bug must not stop the rest
                        self._loop.call_exception_handler(
                            {"message": f"echo timer: {key!r} failed", "exception": exc})
                        self.queue.set(key, now + _RETRY_AFTER_FAILURE_S)
        finally:
            self._holds -= 1
            self._arm()

