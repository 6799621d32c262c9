"""Typed events: the one record of what the daemon decided and did.

Every change in what the host does (a verdict, a rail's path, a group's
members, a drain, a reload, a conflict with a foreign object, a resync, a
failed reconcile) becomes one `Event`.  The log line, the metrics and the
control API's event stream are all fed from it, so the three never disagree.

An event is identified by (boot_id, seq): `boot_id` is new for every start of
the daemon and `seq` counts from 1 within it, with no gaps, so a reader that
saw seq 41 and then seq 43 knows it missed exactly one.  `EventLog` keeps the
last `capacity` events; a reader asking for what follows an event that has
already left the buffer is told how many it missed.

Pure: times are given by the caller (wall clock for people, monotonic for
ordering and intervals).
"""

from __future__ import annotations

import enum
import uuid
from collections import deque
from dataclasses import dataclass

DEFAULT_CAPACITY = 2048


class EventKind(enum.StrEnum):
    STARTED = "started"
    STOPPED = "stopped"
    VERDICT = "verdict"  # a port's verdict changed; its evidence in fields
    RAIL_PATH = "rail_path"  # a rail's table moved to another path
    GROUP_MEMBERS = "group_members"  # a multipath group's members changed
    DRAIN = "drain"  # an operator took a port out of service
    UNDRAIN = "undrain"  # ... and put it back (or the drain expired)
    RELOAD = "reload"  # a new config is in use
    RELOAD_REFUSED = "reload_refused"  # a new config was refused; the old one runs on
    CONFLICT = "conflict"  # a foreign object in our ranges, or in the way of a write
    RESYNC = "resync"  # the link event stream overran; state re-read in full
    RECONCILE_FAILED = "reconcile_failed"  # a pass failed as a whole
    SIGNAL = "signal"  # a BFD session or echo path changed state (evidence, not a verdict)
    ANNOUNCE = "announce"  # where a rail address is announced changed, or FRR's state (core.announce)
    FENCE = "fence"  # a port fenced, tested, unfenced or released (core.fence)


class Severity(enum.StrEnum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class Event:
    boot_id: str
    seq: int
    wall: float  # unix time
    mono: float  # the daemon's monotonic clock
    kind: EventKind
    severity: Severity
    name: str  # the log event name, e.g. "port_verdict"
    port: str = ""
    rail: str = ""
    message: str = ""  # one line a person reads
    fields: tuple[tuple[str, str], ...] = ()  # the details, as text, in the order given

    def field(self, key: str, default: str = "") -> str:
        return next((v for k, v in self.fields if k == key), default)


def new_boot_id() -> str:
    return uuid.uuid4().hex


def _text(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


class EventLog:
    """The last `capacity` events of this boot, in sequence order."""

    def __init__(self, boot_id: str | None = None, capacity: int = DEFAULT_CAPACITY):
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        self.boot_id = boot_id or new_boot_id()
        self.capacity = capacity
        self._events: deque[Event] = deque(maxlen=capacity)
        self.last_seq = 0  # 0: no event yet

    def append(self, kind: EventKind, name: str, *, wall: float, mono: float,
               severity: Severity = Severity.INFO, port: str = "", rail: str = "",
               message: str = "", **fields: object) -> Event:
        self.last_seq += 1
        event = Event(boot_id=self.boot_id, seq=self.last_seq, wall=wall, mono=mono,
                      kind=EventKind(kind), severity=Severity(severity), name=name, port=port,
                      rail=rail, message=message,
                      fields=tuple((k, _text(v)) for k, v in fields.items()))
        self._events.append(event)
        return event

    @property
    def first_seq(self) -> int:
        """The oldest event still held (last_seq + 1 when none is)."""
        return self._events[0].seq if self._events else self.last_seq + 1

    def after(self, seq: int, limit: int | None = None) -> tuple[list[Event], int]:
        """The events after `seq` (0: from the oldest held), at most `limit`,
        and how many between `seq` and the first returned are no longer held."""
        if seq < 0:
            raise ValueError(f"seq must be 0 or more, not {seq}")
        first = self.first_seq
        missed = max(0, first - seq - 1) if seq > 0 else 0
        start = max(seq + 1, first)
        if start > self.last_seq:
            return [], missed
        offset = start - first
        picked = [self._events[i] for i in range(offset, len(self._events))]
        if limit is not None:
            picked = picked[:limit]
        return picked, missed

    def last(self, n: int) -> list[Event]:
        """The newest `n` events held, oldest first."""
        if n <= 0:
            return []
        return list(self._events)[-n:]


CAUSES = ("carrier", "flap", "bfd", "echo", "optics", "counters", "drain", "undrain",
          "recovered", "carried", "other", "unknown")


def reason_class(reason: str) -> str:
    """The signal behind a verdict's reason (core.health words it), as a
    reroute cause: carrier, flap, bfd, echo, optics, counters, drain,
    recovered (back to UP), carried (a verdict kept over a restart) or other."""
    text = reason.strip().lower()
    if text in CAUSES:
        return text
    if text.startswith("drained"):
        return "drain"
    if text.startswith(("no carrier", "no such port", "interface missing",
                        "interface administratively down")):
        return "carrier"
    if text.startswith("awaiting proof"):
        return "carried"
    if text in ("link healthy", "healthy at start"):
        return "recovered"
    for signal in ("bfd", "echo", "optics", "counters", "flap"):
        if text.startswith(signal):
            return signal
    return "other"
