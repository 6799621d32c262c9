"""One schedule for many timers: when each path's prober must run next.

An asyncio timer handle per path costs a heap entry, a cancel and a new handle
every time a path's next deadline moves (each send and each reply moves it),
and a wake-up of its own even when a dozen paths are due within the same
millisecond. The echo service instead keeps every path's next deadline here
and asks the loop for one timer: at the earliest deadline, rounded up to a
`grain_s` grid, so that paths due within the same grain share one wake-up
(issue 11). Rounding up costs at most one grain of lateness per deadline, well
under a probe's timeout (8 ms by default) and within the loop's own timer
jitter (epoll waits in whole milliseconds).

Pure: times are passed in; nothing here reads a clock or touches a loop.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

DEFAULT_GRAIN_S = 0.001
SEND_SLOTS_PER_INTERVAL = 10  # a service's paths send in this many batches per interval...
MAX_SEND_SLOT_S = 0.005  # ...at most this far apart...
MIN_BATCHED_PATHS = 16  # ...when it has this many paths or more (fewer: each on its own time)


def batched_wake(when: float, grain_s: float = DEFAULT_GRAIN_S) -> float:
    """`when` rounded up to the `grain_s` grid (unchanged for a grain of 0), so
    that deadlines within one grain share a wake-up."""
    if grain_s <= 0:
        return when
    # Never before `when` (a wake-up with nothing due would be re-armed for
    # the same instant); float noise at a grid point does not cost a grain.
    return max(when, math.ceil(when / grain_s - 1e-9) * grain_s)


def send_slot(interval_s: float, paths: int) -> float:
    """The width of the send slots for `paths` probed every `interval_s` (0:
    none, each probe at its own time). Probes due within one slot leave
    together at its start, one system call per rail (adapters.echorail),
    so N paths cost about SEND_SLOTS_PER_INTERVAL wake-ups and batches per
    interval rather than N. A whole number of milliseconds, so slot starts
    fall on the timer's grid; sending up to a slot early changes no path's
    cadence and delays no detection (a probe only goes sooner)."""
    if paths < MIN_BATCHED_PATHS:
        return 0.0
    slot = min(MAX_SEND_SLOT_S, interval_s / SEND_SLOTS_PER_INTERVAL)
    return max(DEFAULT_GRAIN_S, math.floor(slot / DEFAULT_GRAIN_S + 1e-9) * DEFAULT_GRAIN_S)


def slot_start(when: float, slot_s: float) -> float:
    """The start of the `slot_s`-wide slot (of the grid from 0) that `when`
    falls in (`when` itself for a slot of 0): sends due anywhere in one slot
    go together at its start, each path keeping its own cadence (core.probe:
    poll). A point on the grid, give or take float noise, is its own slot's start."""
    if slot_s <= 0:
        return when
    return math.floor(when / slot_s + 1e-9) * slot_s


class DeadlineQueue(Generic[K]):
    """Each key's next deadline; the earliest first. Moving a key's deadline is
    O(log n): the old heap entry is left behind and skipped when it surfaces
    (the heap is rebuilt when stale entries outnumber live ones)."""

    def __init__(self) -> None:
        self._when: dict[K, float] = {}
        self._heap: list[tuple[float, int, K]] = []
        self._order = itertools.count()  # ties: first set, first due

    def __len__(self) -> int:
        return len(self._when)

    def __contains__(self, key: object) -> bool:
        return key in self._when

    def get(self, key: K) -> float | None:
        return self._when.get(key)

    def set(self, key: K, when: float) -> None:
        """`key` is due at `when` (replacing any earlier deadline of it)."""
        if self._when.get(key) == when:
            return
        self._when[key] = when
        heapq.heappush(self._heap, (when, next(self._order), key))
        if len(self._heap) > 2 * len(self._when) + 64:
            self._rebuild()

    def discard(self, key: K) -> None:
        self._when.pop(key, None)

    def earliest(self) -> float | None:
        """The earliest deadline of any key (None: no key)."""
        heap = self._heap
        while heap and self._when.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)  # stale: moved or discarded since
        return heap[0][0] if heap else None

    def pop_due(self, now: float, limit: int | None = None) -> list[tuple[K, float]]:
        """Every key due by `now` (at most `limit` of them) with its deadline,
        earliest first; they are removed (a key that wants to run again sets
        a new deadline). Keys left over stay due."""
        heap, when_of = self._heap, self._when
        due: list[tuple[K, float]] = []
        while heap and heap[0][0] <= now and (limit is None or len(due) < limit):
            when, _, key = heapq.heappop(heap)
            if when_of.get(key) == when:
                del when_of[key]
                due.append((key, when))
        return due

    def _rebuild(self) -> None:
        self._heap = [(w, next(self._order), k) for k, w in self._when.items()]
        heapq.heapify(self._heap)

