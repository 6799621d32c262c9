"""The agent's spool: every event the aggregator has not acknowledged, on disk.

Why on disk: the aggregator may be away for minutes (an upgrade, a network
partition) and the daemon may restart meanwhile; the fleet must still get
every event, exactly once, when it is back. Why bounded: a host must never
fill its disk for a fleet view. Past `max_events` the oldest segment goes,
and what it held is counted and reported to the aggregator as a gap
(EventBatch.gap_first/gap_last), so the fleet knows exactly what it lacks.

Layout, in `<state_dir>/spool/`:

    <number:016d>.seg  append-only segments of records, a new one every
                       `segment_records` records and at every start
    gaps.json          dropped ranges not yet reported and acknowledged

    record = length u32 | crc32 u32 (of the payload) | payload
    payload = a serialized linkpass.v1.Event (control.proto)

An acknowledgement (boot, seq) trims whole segments once all they hold is
acknowledged. On open every segment is read once to index it: a torn tail
(a record cut by a crash) ends that segment's readable part, a record whose
CRC or content is wrong is skipped; both are counted, never raised. Old
segments are never appended to again, so a torn tail stays harmless.

`Spool` is synchronous and thread-safe (one lock): the agent runs its calls
on one worker thread (`Spool.call`), in order, so the event loop never waits
on the disk. `SpoolWriter` is the daemon's side: `offer()` is a bounded
in-memory hand-off that never blocks; when the disk is so slow that the
hand-off is full, further events are dropped and recorded as a gap.
"""

from __future__ import annotations

import asyncio
import collections
import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import structlog
from google.protobuf.message import DecodeError

from linkpassd._proto.linkpass.v1 import control_pb2 as pb
from linkpassd.adapters.control_convert import event_to_proto
from linkpassd.adapters.statefile import StateFileError, read_json, write_json_atomic
from linkpassd.core.events import Event

log = structlog.get_logger("linkpassd")

HEADER = struct.Struct(">II")  # payload length, crc32 of the payload
MAX_RECORD = 1 << 20  # an event is a few hundred bytes; a larger length is garbage
GAPS_FILE = "gaps.json"
SUFFIX = ".seg"
HANDOFF_CAPACITY = 10_000  # events waiting for the writer; more are dropped (a gap)
MAX_GAPS = 1000  # gaps remembered; beyond, the newest of a boot absorbs the next


@dataclass(frozen=True, order=True)
class Gap:
    """Events seq first..last of boot `boot_id` that were dropped."""

    boot_id: str
    first: int
    last: int

    @property
    def count(self) -> int:
        return self.last - self.first + 1


@dataclass
class _Run:
    """Consecutive records of one boot inside a segment."""

    boot_id: str
    first: int
    last: int
    count: int


@dataclass
class _Segment:
    number: int
    path: str
    size: int = 0  # bytes of whole records: readers never look past it
    records: int = 0
    runs: list[_Run] = field(default_factory=list)

    def note(self, boot_id: str, seq: int) -> None:
        self.records += 1
        run = self.runs[-1] if self.runs else None
        if run is not None and run.boot_id == boot_id and seq > run.last:
            run.last, run.count = seq, run.count + 1
        else:
            self.runs.append(_Run(boot_id, seq, seq, 1))


@dataclass(frozen=True)
class Cursor:
    """A reader's place: the next record is at `offset` of segment `segment`."""

    segment: int = 0
    offset: int = 0


@dataclass(frozen=True)
class Batch:
    """One EventBatch's worth: events of one boot in increasing seq, with the
    gap that precedes them (if any), and where the reader goes on from."""

    boot_id: str
    events: tuple[pb.Event, ...]
    gap: Gap | None
    end: Cursor

    @property
    def last_seq(self) -> int:
        return self.events[-1].seq if self.events else 0


def encode_record(payload: bytes) -> bytes:
    return HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def _unacked(run: _Run, acked: int) -> int:
    if run.last <= acked:
        return 0
    if run.first > acked:
        return run.count
    return min(run.count, run.last - acked)


class Spool:
    def __init__(self, directory: str, max_events: int, *, segment_records: int | None = None,
                 fsync: bool = True) -> None:
        self.directory = directory
        self.max_events = max_events
        self.segment_records = segment_records or max(10, min(1000, max_events // 10))
        self.fsync = fsync
        self.segments: collections.OrderedDict[int, _Segment] = collections.OrderedDict()
        self.acked: dict[str, int] = {}  # boot -> everything up to here is stored
        self.gaps: list[Gap] = []  # dropped, not yet acknowledged as reported
        self.dropped = 0  # events dropped since this spool opened (bound or hand-off)
        self.torn = 0  # torn tail records found at open
        self.corrupt = 0  # records with a bad CRC or content, skipped
        self._active: _Segment | None = None
        self._file = None
        self._next_number = 1
        self._lock = threading.RLock()
        self._io: ThreadPoolExecutor | None = None
        # (events pending, bytes on disk) as of the last change: read by
        # status and metrics on the loop's thread without taking the lock
        # (a tuple is replaced whole).
        self.counts: tuple[int, int] = (0, 0)

    # ------------------------------------------------------------- threads

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` on the spool's one worker thread (calls run in order)."""
        if self._io is None:
            self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="linkpass-spool")
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    def submit(self, fn: Callable[..., Any], *args: Any):
        """Like call(), for code outside the loop: a concurrent Future."""
        if self._io is None:
            self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="linkpass-spool")
        return self._io.submit(fn, *args)

    # ------------------------------------------------------------- opening

    def open(self) -> None:
        """Index what is on disk (a previous run's segments are read once)."""
        with self._lock:
            os.makedirs(self.directory, exist_ok=True)
            numbers = []
            for name in os.listdir(self.directory):
                stem = name.removesuffix(SUFFIX)
                if name.endswith(SUFFIX) and stem.isdigit():
                    numbers.append(int(stem))
            for number in sorted(numbers):
                self.segments[number] = self._scan(number)
            self._next_number = (max(numbers) + 1) if numbers else 1
            self._load_gaps()
            if self.torn or self.corrupt:
                log.warning("spool_damaged", directory=self.directory, torn=self.torn,
                            corrupt=self.corrupt, note="the damaged records are skipped")
            self._enforce_bound()
            self._count()

    def _path(self, number: int) -> str:
        return os.path.join(self.directory, f"{number:016d}{SUFFIX}")

    def _scan(self, number: int) -> _Segment:
        segment = _Segment(number, self._path(number))
        try:
            with open(segment.path, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            log.error("spool_segment_unreadable", path=segment.path, error=str(exc))
            return segment
        for _offset, end, event in self._records(data, 0, count=True):
            segment.size = end
            if event is not None:
                segment.note(event.boot_id, event.seq)
        return segment

    def _records(self, data: bytes, offset: int, *, count: bool = False):
        """(offset, end, event or None when damaged) for each whole record;
        stops at a torn tail or a length no record can have."""
        while offset < len(data):
            if offset + HEADER.size > len(data):
                self.torn += count
                return
            length, crc = HEADER.unpack_from(data, offset)
            end = offset + HEADER.size + length
            if length > MAX_RECORD or end > len(data):
                self.torn += count
                return
            payload = data[offset + HEADER.size:end]
            event = None
            if zlib.crc32(payload) == crc:
                try:
                    event = pb.Event.FromString(payload)
                except DecodeError:
                    event = None
                if event is not None and (not event.boot_id or event.seq <= 0):
                    event = None
            if event is None:
                self.corrupt += count
            yield offset, end, event
            offset = end

    def _load_gaps(self) -> None:
        path = os.path.join(self.directory, GAPS_FILE)
        try:
            doc = read_json(path) or {}
            gaps = [Gap(str(b), int(f), int(t)) for b, f, t in doc.get("gaps", [])]
        except (StateFileError, TypeError, ValueError) as exc:
            log.error("spool_gaps_unreadable", path=path, error=str(exc))
            return
        self.gaps = sorted(g for g in gaps if g.boot_id and 0 < g.first <= g.last)

    def _save_gaps(self) -> None:
        path = os.path.join(self.directory, GAPS_FILE)
        try:
            write_json_atomic(path, {"gaps": [[g.boot_id, g.first, g.last] for g in self.gaps]})
        except OSError as exc:
            log.error("spool_gaps_unwritable", path=path, error=str(exc))

    # ------------------------------------------------------------- writing

    def append(self, events: Iterable[Event | pb.Event], gaps: Iterable[Gap] = ()) -> None:
        """Add events (in order) and gaps the hand-off recorded; past the
        bound, drop the oldest segments."""
        with self._lock:
            if gaps:
                self._add_gaps(gaps)
            chunk: list[bytes] = []
            for event in events:
                message = event if isinstance(event, pb.Event) else event_to_proto(event)
                segment = self._writable()
                chunk.append(encode_record(message.SerializeToString()))
                segment.note(message.boot_id, message.seq)
                if segment.records >= self.segment_records:
                    self._write(chunk)
                    chunk = []
                    self._close_active()
            self._write(chunk)
            self._enforce_bound()
            self._count()

    def _writable(self) -> _Segment:
        if self._active is None:
            number = self._next_number
            self._next_number += 1
            self._active = self.segments[number] = _Segment(number, self._path(number))
            self._file = open(self._active.path, "ab")
        return self._active

    def _write(self, chunk: list[bytes]) -> None:
        if not chunk or self._active is None:
            return
        data = b"".join(chunk)
        self._file.write(data)
        self._file.flush()
        if self.fsync:
            os.fdatasync(self._file.fileno())
        self._active.size += len(data)  # only now may readers see them

    def _close_active(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file, self._active = None, None

    def close(self) -> None:
        with self._lock:
            self._close_active()
        if self._io is not None:
            self._io.shutdown(wait=True)
            self._io = None

    @property
    def total(self) -> int:
        return sum(s.records for s in self.segments.values())

    def set_max_events(self, max_events: int) -> None:
        with self._lock:
            self.max_events = max_events
            self._enforce_bound()

    def _enforce_bound(self) -> None:
        total = self.total
        while total > self.max_events and self.segments:
            number, oldest = next(iter(self.segments.items()))
            if oldest is self._active:
                self._close_active()
            total -= oldest.records
            lost = [Gap(r.boot_id, max(r.first, self.acked.get(r.boot_id, 0) + 1), r.last)
                    for r in oldest.runs if _unacked(r, self.acked.get(r.boot_id, 0))]
            self._remove(number)
            if lost:
                self._add_gaps(lost)
                log.warning("spool_full_dropped", events=sum(g.count for g in lost),
                            max_events=self.max_events,
                            ranges=" ".join(f"{g.boot_id}:{g.first}-{g.last}" for g in lost))

    def _remove(self, number: int) -> None:
        segment = self.segments.pop(number)
        try:
            os.unlink(segment.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.error("spool_trim_failed", path=segment.path, error=str(exc))

    def add_gaps(self, gaps: Iterable[Gap]) -> None:
        """Events that never reached the spool (the hand-off was full, a write failed)."""
        with self._lock:
            self._add_gaps(gaps)

    def _add_gaps(self, gaps: Iterable[Gap]) -> None:
        merged = list(self.gaps)
        for gap in gaps:
            self.dropped += gap.count
            for i, known in enumerate(merged):
                if known.boot_id == gap.boot_id and known.first <= gap.last + 1 \
                        and gap.first <= known.last + 1:
                    merged[i] = Gap(gap.boot_id, min(known.first, gap.first),
                                    max(known.last, gap.last))
                    break
            else:
                if len(merged) >= MAX_GAPS:
                    same = [i for i, g in enumerate(merged) if g.boot_id == gap.boot_id]
                    if same:  # coarser, never lost: the newest gap of the boot grows
                        i = same[-1]
                        merged[i] = Gap(gap.boot_id, min(merged[i].first, gap.first),
                                        max(merged[i].last, gap.last))
                        continue
                merged.append(gap)
        self.gaps = sorted(merged)
        self._save_gaps()

    # ------------------------------------------------------------- acks

    def ack(self, boot_id: str, seq: int) -> None:
        """Everything of `boot_id` up to `seq` is stored: trim what is done."""
        with self._lock:
            if seq <= self.acked.get(boot_id, 0):
                return
            self.acked[boot_id] = seq
            before = len(self.gaps)
            self.gaps = [g for g in self.gaps if not (g.boot_id == boot_id and g.last <= seq)]
            if len(self.gaps) != before:
                self._save_gaps()
            for number, segment in list(self.segments.items()):
                if all(r.last <= self.acked.get(r.boot_id, 0) for r in segment.runs):
                    if segment is self._active:
                        self._close_active()
                    self._remove(number)
            self._count()

    def settle_gap(self, gap: Gap) -> None:
        """The aggregator took a batch that carried only this gap."""
        with self._lock:
            if gap in self.gaps:
                self.gaps.remove(gap)
                self._save_gaps()

    def _count(self) -> None:
        self.counts = (self.pending, sum(seg.size for seg in self.segments.values()))

    @property
    def pending(self) -> int:
        """Events waiting for an acknowledgement."""
        with self._lock:
            return sum(_unacked(r, self.acked.get(r.boot_id, 0))
                       for s in self.segments.values() for r in s.runs)

    # ------------------------------------------------------------- reading

    def next_batch(self, cursor: Cursor, sent: dict[str, int], sent_gaps: set[Gap], *,
                   max_events: int = 500, max_bytes: int = 4 << 20) -> Batch | None:
        """The next batch to send after `cursor`: unacknowledged events above
        what this stream already sent (`sent`, per boot), of one boot, cut
        before a gap that must precede the rest; or, at the end, a batch with
        only a gap no event follows. None: nothing to send."""
        with self._lock:
            boot, events, gap, size = "", [], None, 0
            end = cursor
            for number, segment in list(self.segments.items()):
                if number < cursor.segment:
                    continue
                start = cursor.offset if number == cursor.segment else 0
                if start >= segment.size:
                    end = Cursor(number, segment.size)
                    continue
                try:
                    with open(segment.path, "rb") as handle:
                        handle.seek(start)
                        data = handle.read(segment.size - start)
                except OSError as exc:
                    log.error("spool_read_failed", path=segment.path, error=str(exc))
                    end = Cursor(number, segment.size)
                    continue
                for offset, rec_end, event in self._records(data, 0):
                    here = Cursor(number, start + offset)
                    if event is None or event.seq <= max(self.acked.get(event.boot_id, 0),
                                                         sent.get(event.boot_id, 0)):
                        end = Cursor(number, start + rec_end)
                        continue
                    if events and (event.boot_id != boot or len(events) >= max_events
                                   or size + rec_end - offset > max_bytes
                                   or self._gap_before(event, events[-1].seq, sent_gaps)):
                        return Batch(boot, tuple(events), gap, here)
                    if not events:
                        boot = event.boot_id
                        gap = self._gap_before(event, sent.get(boot, 0), sent_gaps)
                    events.append(event)
                    size += rec_end - offset
                    end = Cursor(number, start + rec_end)
            if events:
                return Batch(boot, tuple(events), gap, end)
            unsent = [g for g in self.gaps if g not in sent_gaps
                      and g.last > self.acked.get(g.boot_id, 0)]
            if unsent:
                return Batch(unsent[0].boot_id, (), unsent[0], end)
            return None

    def _gap_before(self, event: pb.Event, after: int, sent_gaps: set[Gap]) -> Gap | None:
        """An unsent gap of the event's boot between seq `after` and the event."""
        for gap in self.gaps:
            if (gap.boot_id == event.boot_id and gap not in sent_gaps
                    and after < gap.last < event.seq):
                return gap
        return None


class SpoolWriter:
    """The daemon's side of the spool: `offer()` takes a pass's events at
    once (a deque append each); `run()` writes them on the spool's thread.
    If the disk stalls until `capacity` events wait, newer ones are dropped
    and recorded as a gap: the reconcile loop never waits for a disk."""

    def __init__(self, spool: Spool, capacity: int = HANDOFF_CAPACITY) -> None:
        self.spool = spool
        self.capacity = capacity
        self.waiting: collections.deque[Event] = collections.deque()
        self.gaps: list[Gap] = []
        self.dropped = 0
        self.opened = False
        self.on_written: Callable[[], None] | None = None  # the client's wake-up
        self._wake: asyncio.Event | None = None

    def offer(self, events: Sequence[Event]) -> None:
        """Never blocks, never raises for a full hand-off."""
        for event in events:
            if len(self.waiting) < self.capacity:
                self.waiting.append(event)
                continue
            self.dropped += 1
            last = self.gaps[-1] if self.gaps else None
            if last is not None and last.boot_id == event.boot_id and last.last == event.seq - 1:
                self.gaps[-1] = Gap(last.boot_id, last.first, event.seq)
            else:
                self.gaps.append(Gap(event.boot_id, event.seq, event.seq))
        if events and self._wake is not None:
            self._wake.set()

    def _take(self) -> tuple[list[Event], list[Gap]]:
        events, self.waiting = list(self.waiting), collections.deque()
        gaps, self.gaps = self.gaps, []
        return events, gaps

    async def run(self) -> None:
        """Open the spool, then write what is offered, until cancelled."""
        self._wake = asyncio.Event()
        if not self.opened:
            await self.spool.call(self.spool.open)
            self.opened = True
        while True:
            if not self.waiting and not self.gaps:
                self._wake.clear()
                await self._wake.wait()
            events, gaps = self._take()
            try:
                await self.spool.call(self.spool.append, events, gaps)
                if self.on_written is not None:
                    self.on_written()
            except OSError as exc:
                # A full or failing disk: these events are lost to the fleet
                # (never to the host), and the fleet is told so.
                log.error("spool_write_failed", error=str(exc), events=len(events))
                self.spool.submit(self.spool.add_gaps, _as_gaps(events) + gaps)

    def flush(self, timeout_s: float = 5.0) -> None:
        """At shutdown, from the loop thread: write what waits (the stopped
        event) after anything the writer already started."""
        events, gaps = self._take()
        if not self.opened:
            self.spool.submit(self.spool.open)
            self.opened = True
        future = self.spool.submit(self.spool.append, events, gaps)
        try:
            future.result(timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - stopping must not fail on a disk
            log.error("spool_flush_failed", error=repr(exc), events=len(events))


def _as_gaps(events: Sequence[Event]) -> list[Gap]:
    gaps: list[Gap] = []
    for e in events:
        if gaps and gaps[-1].boot_id == e.boot_id and gaps[-1].last == e.seq - 1:
            gaps[-1] = Gap(e.boot_id, gaps[-1].first, e.seq)
        else:
            gaps.append(Gap(e.boot_id, e.seq, e.seq))
    return gaps
