"""How late the event loop runs: the arithmetic behind the one loop-lag meter.

BFD and the echo probes both refuse to blame a path for a silence that a
stall of ours explains, so both need to know how late the loop ran: the worst
lag over a recent window (BFD: "was this detection time ours?") and each stall
as it happens (echo: the probers in flight note it). One history, fed by every
timer of both and by a heartbeat, sees more stalls than either would alone.

Pure: `now` and each measured lag are passed in (adapters.looplag measures).
Mutable on purpose: it is fed by every timer of every session and path.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

LAG_WINDOW_S = 30.0  # how much lag history "worst lag lately" looks at
STALL_TOLERANCE_S = 0.001  # a lag below this is ordinary timer jitter, not a stall


@dataclass(frozen=True)
class LagSnapshot:
    count: int
    stalls: int
    last_s: float
    max_s: float
    mean_s: float


class LagHistory:
    """Every lag measured: the last, the worst ever, a count, the stalls (lags
    of at least `tolerance_s`) and the worst within the last `window_s`."""

    def __init__(self, window_s: float = LAG_WINDOW_S, tolerance_s: float = STALL_TOLERANCE_S):
        self.window_s = window_s
        self.tolerance_s = tolerance_s
        self.count = 0
        self.stalls = 0
        self.last = 0.0
        self.max = 0.0
        self.total = 0.0
        self._recent: collections.deque[tuple[float, float]] = collections.deque()

    def record(self, now: float, lag: float) -> bool:
        """Note a lag measured at `now`; True when it is a stall worth telling."""
        lag = max(0.0, lag)
        self.count += 1
        self.last = lag
        self.total += lag
        self.max = max(self.max, lag)
        recent = self._recent
        while recent and recent[0][0] < now - self.window_s:
            recent.popleft()
        # Keep only a decreasing run of lags: an older, smaller lag can never
        # be the worst of any later window.
        while recent and recent[-1][1] <= lag:
            recent.pop()
        recent.append((now, lag))
        if lag >= self.tolerance_s:
            self.stalls += 1
            return True
        return False

    def worst_since(self, since: float) -> float:
        return max((lag for t, lag in self._recent if t >= since), default=0.0)

    def snapshot(self) -> LagSnapshot:
        return LagSnapshot(self.count, self.stalls, self.last, self.max,
                           self.total / self.count if self.count else 0.0)
