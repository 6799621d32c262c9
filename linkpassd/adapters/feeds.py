"""What the daemon publishes for readers that wait: its events and its
health document.

The daemon's loop only appends and notifies (constant time, never blocks, never
waits for a reader).  Each reader keeps its own position (a sequence number or a
generation) and asks for what follows it; a reader that is slow simply finds
that the buffer moved on and is told how many events it missed.  So no reader
can hold back the daemon, and no per-reader queue can grow without bound.
"""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

from linkpassd.core.events import Event, EventKind, EventLog, Severity

T = TypeVar("T")


class _Changed:
    """Wakes every waiter once per publish."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()  # later waiters wait for the next one

    async def wait(self) -> None:
        await self._event.wait()


class EventFeed:
    """The daemon's EventLog, and a way to wait for what comes next."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self._changed: _Changed | None = None  # made inside the loop, on first use

    @property
    def boot_id(self) -> str:
        return self.log.boot_id

    def _signal(self) -> _Changed:
        if self._changed is None:
            self._changed = _Changed()
        return self._changed

    def append(self, kind: EventKind, name: str, *, wall: float, mono: float,
               severity: Severity = Severity.INFO, **kwargs) -> Event:
        """Record one event; readers are woken by publish()."""
        return self.log.append(kind, name, wall=wall, mono=mono, severity=severity, **kwargs)

    def publish(self) -> None:
        """Wake the readers (after a batch of appends)."""
        self._signal().notify()

    async def wait_after(self, seq: int) -> tuple[list[Event], int]:
        """The events after `seq` and how many of them were missed; waits until
        there is at least one."""
        while True:
            changed = self._signal()
            events, missed = self.log.after(seq)
            if events or missed:
                return events, missed
            await changed.wait()


class Latest(Generic[T]):
    """The newest version of a document, numbered 1, 2, 3..."""

    def __init__(self) -> None:
        self.generation = 0
        self.value: T | None = None
        self._changed: _Changed | None = None

    def _signal(self) -> _Changed:
        if self._changed is None:
            self._changed = _Changed()
        return self._changed

    def publish(self, value: T) -> int:
        self.generation += 1
        self.value = value
        self._signal().notify()
        return self.generation

    async def wait_newer(self, generation: int) -> tuple[int, T]:
        """The newest value once its generation is above `generation`."""
        while True:
            changed = self._signal()
            if self.generation > generation and self.value is not None:
                return self.generation, self.value
            await changed.wait()
