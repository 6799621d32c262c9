"""The event loop's recent stalls, kept once for every path the host probes.

An echo probe's miss is not the path's fault when our own loop was stalled for
most of its time in flight (core.probe). Every path needs that answer, but the
stalls are the host's, not the path's: telling each stall to each of N paths
(and having each merge it into its own list) made every stall cost O(N), and
at fleet scale (hundreds of paths, each stall a handful of them) that fan-out
was most of the daemon's CPU (issue 11). So the loop-lag meter keeps one
`StallLog`, and a path asks it, when it judges a probe, how much of the probe's
flight was stalled: O(log n) plus the stalls that overlap the flight.

Pure and mutable on purpose (like core.looplag.LagHistory): it is fed by the
one meter, and nothing here reads a clock.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

STALL_MEMORY_S = 2.0  # how long a recorded stall can matter for a probe in flight


class StallLog:
    """Stalled intervals [start, end] of the loop, merged, oldest first;
    intervals that ended more than `memory_s` before the newest are forgotten."""

    def __init__(self, memory_s: float = STALL_MEMORY_S):
        if not memory_s > 0:
            raise ValueError(f"memory_s must be > 0, got {memory_s!r}")
        self.memory_s = memory_s
        self._starts: list[float] = []
        self._ends: list[float] = []
        self._head = 0  # intervals before this index are forgotten (dropped in chunks)

    def __len__(self) -> int:
        return len(self._starts) - self._head

    def intervals(self) -> tuple[tuple[float, float], ...]:
        return tuple(zip(self._starts[self._head:], self._ends[self._head:]))

    def add(self, start: float, end: float) -> None:
        """The loop was stalled over [start, end]. Stalls arrive roughly in
        time order (they are measured when they end); one that overlaps or
        precedes earlier ones is merged where it belongs."""
        if not end >= start:
            raise ValueError(f"a stall must not end before it starts: [{start!r}, {end!r}]")
        starts, ends = self._starts, self._ends
        # Index of the first kept interval that could touch [start, end].
        i = bisect_right(ends, start, self._head)
        j = i
        while j < len(starts) and starts[j] <= end:
            start, end = min(start, starts[j]), max(end, ends[j])
            j += 1
        starts[i:j] = [start]
        ends[i:j] = [end]
        self._forget(max(end, ends[-1]) - self.memory_s)

    def covered(self, start: float, end: float) -> float:
        """How much of [start, end] the loop spent stalled."""
        if end <= start:
            return 0.0
        starts, ends = self._starts, self._ends
        i = bisect_right(ends, start, self._head)
        total = 0.0
        while i < len(starts) and starts[i] < end:
            total += max(0.0, min(ends[i], end) - max(starts[i], start))
            i += 1
        return total

    def overlapping(self, start: float, end: float) -> list[tuple[float, float]]:
        """The stalls that overlap [start, end], clipped to it, oldest first."""
        starts, ends = self._starts, self._ends
        i = bisect_right(ends, start, self._head)
        out = []
        while i < len(starts) and starts[i] < end:
            out.append((max(starts[i], start), min(ends[i], end)))
            i += 1
        return out

    def _forget(self, before: float) -> None:
        ends = self._ends
        head = self._head
        while head < len(ends) and ends[head] < before:
            head += 1
        self._head = head
        if head > 64 and head * 2 > len(ends):  # compact now and then: O(1) amortised
            del self._starts[:head]
            del ends[:head]
            self._head = 0


def stalled_time(stalls: Iterable[tuple[float, float]], start: float, end: float,
             host: StallLog | None = None) -> float:
    """How much of [start, end] was stalled: by a path's own stalls
    (sorted intervals) and the host's (`host`, the loop's one log), each
    moment counted once."""
    own = [(max(s, start), min(e, end)) for s, e in stalls if e > start and s < end]
    if host is None:
        return sum(e - s for s, e in own)
    if not own:
        return host.covered(start, end)
    total, reach = 0.0, start
    for s, e in sorted(own + host.overlapping(start, end)):
        if e > reach:
            total += e - max(s, reach)
            reach = e
    return total
