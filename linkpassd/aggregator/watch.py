"""Newly stored events, pushed to WatchFleetEvents callers.

The insert path only *signals* (`EventFanout.notify`, no await); one fan-out
task reads what was stored since its cursor, once for all watchers, and puts
each event into every matching watcher's bounded queue. A watcher whose queue
is full is dropped (its call ends RESOURCE_EXHAUSTED): a slow reader costs
itself its stream, never the agents their ingestion.

The store names events by an id it assigns on insert (`StoredEvent.id`), which
`add_events` does not return, so the cursor is found once by asking the store
(`newest_event_id`, O(log n) indexed lookups) and then follows the reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from linkpassd.aggregator.store import EventQuery, Store, StoredEvent

log = structlog.get_logger("linkpassd.aggregator.watch")

PAGE = 1000
DEFAULT_QUEUE = 1000


async def newest_event_id(store: Store, floor: int = 0) -> int:
    """The largest event id the store holds (or `floor` when it holds none
    after it): gallop then bisect on `events(after_id=x, limit=1)`."""
    async def first_after(x: int) -> int | None:
        got = await store.events(EventQuery(after_id=x, limit=1))
        return got[0].id if got else None

    found = await first_after(floor)
    if found is None:
        return floor
    low, step = found, 1  # an event with id `low` exists
    while True:
        nxt = await first_after(low + step - 1)
        if nxt is None:
            high = low + step - 1  # nothing after high
            break
        low, step = nxt, step * 2
    # Largest id in [low, high]: events after `low` exist iff the answer > low.
    while low < high:
        mid = (low + high + 1) // 2
        nxt = await first_after(mid - 1)
        if nxt is None:
            high = mid - 1
        else:
            low = nxt
    return low


class Watcher:
    def __init__(self, match: Callable[[StoredEvent], bool], live_after: int, maxsize: int) -> None:
        self.match = match
        self.live_after = live_after  # the queue carries events with id > this
        self.queue: asyncio.Queue[StoredEvent] = asyncio.Queue(maxsize)
        self.dropped = asyncio.Event()


class EventFanout:
    def __init__(self, store: Store, *, queue_size: int = DEFAULT_QUEUE,
                 on_drop: Callable[[], None] | None = None) -> None:
        self._store = store
        self._queue_size = queue_size
        self._on_drop = on_drop
        self._watchers: set[Watcher] = set()
        self._cursor: int | None = None  # None: not known yet
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()  # one reader of the store at a time (cursor moves)

    @property
    def watchers(self) -> int:
        return len(self._watchers)

    def notify(self) -> None:
        """Events were stored (called from the insert path; never waits)."""
        if self._watchers:
            self._wake.set()

    async def subscribe(self, match: Callable[[StoredEvent], bool]) -> Watcher:
        async with self._lock:
            if self._cursor is None or not self._watchers:  # stale while nobody watched
                self._cursor = await newest_event_id(self._store, self._cursor or 0)
            watcher = Watcher(match, self._cursor, self._queue_size)
            self._watchers.add(watcher)
            return watcher

    def unsubscribe(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)

    async def run(self) -> None:
        """The fan-out task: until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._deliver()
            except Exception as exc:  # noqa: BLE001 - the store failing must not kill the fan-out
                log.error("watch_read_failed", error=str(exc))
                await asyncio.sleep(1.0)
                self._wake.set()

    async def _deliver(self) -> None:
        async with self._lock:
            if not self._watchers or self._cursor is None:
                return
            while True:
                page = await self._store.events(EventQuery(after_id=self._cursor, limit=PAGE))
                for event in page:
                    self._cursor = max(self._cursor, event.id)
                    for watcher in list(self._watchers):
                        if event.id > watcher.live_after and watcher.match(event):
                            try:
                                watcher.queue.put_nowait(event)
                            except asyncio.QueueFull:
                                self._drop(watcher)
                if len(page) < PAGE:
                    return

    def _drop(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)
        watcher.dropped.set()
        if self._on_drop is not None:
            self._on_drop()
