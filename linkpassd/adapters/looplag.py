"""The daemon's one event-loop lag meter, shared by BFD and the echo probes.

Every timer of either reports how late it fired (`record`); a heartbeat
(`heartbeat(period)`) covers the gaps between their timers. Each stall goes
to any listener and into the counts operators read (metrics, status); BFD
asks for the worst lag over a detection time (`worst_since`). The echo
probes need no stall as evidence (core.probe): they record the worst for
operators. One meter, so a stall that one of them saw is known to the other.
The arithmetic is in core.looplag.

A heartbeat costs CPU at every beat (measured in a 2-vCPU VM: 0.6 % of a core
at 25 ms, 3.8 % at 4 ms), hence the slow default, and none unless asked for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from linkpassd.core.looplag import LAG_WINDOW_S, STALL_TOLERANCE_S, LagHistory

Listener = Callable[[float, float], None]  # (now, lag): the loop stalled over [now - lag, now]


class LoopLag:
    """How stalled the event loop was. `period_s`: heartbeat period, None for none."""

    def __init__(self, period_s: float | None = None, tolerance_s: float = STALL_TOLERANCE_S,
                 window_s: float = LAG_WINDOW_S):
        self.period_s = period_s
        self.history = LagHistory(window_s, tolerance_s)
        self.listeners: list[Listener] = []
        self.beats = 0
        self._due: float | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- lifecycle -----------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._loop is not None

    def start(self) -> None:
        """Begin on the running loop (again after close() is fine)."""
        self._loop = asyncio.get_running_loop()
        self._rearm()

    def close(self) -> None:
        self._cancel()
        self._loop = None

    def heartbeat(self, period_s: float | None) -> None:
        """Change the heartbeat period (None: no heartbeat), at once if running."""
        self.period_s = period_s
        if self._loop is not None:
            self._rearm()

    # ---- what the probes read and report -----------------------------------------

    @property
    def tolerance_s(self) -> float:
        return self.history.tolerance_s

    @property
    def stalls(self) -> int:
        return self.history.stalls

    @property
    def max(self) -> float:
        return self.history.max

    max_lag_s = max

    @property
    def count(self) -> int:
        return self.history.count

    def current(self, now: float) -> float:
        """How long the loop has been stalled right now (the next beat is overdue by this)."""
        return 0.0 if self._due is None else max(0.0, now - self._due)

    def record(self, now: float, lag: float) -> None:
        """A handler ran `lag` late: remember it, and tell every listener of a stall."""
        if self.history.record(now, lag):
            for listener in list(self.listeners):
                listener(now, lag)

    def worst_since(self, since: float) -> float:
        return self.history.worst_since(since)

    def snapshot(self) -> dict[str, float]:
        s = self.history.snapshot()
        return {"count": s.count, "last_s": s.last_s, "max_s": s.max_s, "mean_s": s.mean_s}

    # ---- the heartbeat ---------------------------------------------------------

    def _cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._due = None

    def _rearm(self) -> None:
        self._cancel()
        if self.period_s is not None and self._loop is not None:
            self._arm(self._loop.time())

    def _arm(self, now: float) -> None:
        self._due = now + self.period_s
        self._handle = self._loop.call_at(self._due, self._beat)

    def _beat(self) -> None:
        now = self._loop.time()
        self.beats += 1
        self.record(now, self.current(now))
        self._arm(now)
