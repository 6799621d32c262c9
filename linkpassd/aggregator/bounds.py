"""Bounds on what a host sends the aggregator, checked where a message enters
(server.AgentServicer._take, before anything is queued or stored).

A host certificate is trusted to name its host, not to send sane numbers:
every count, sequence number, time and string that later feeds a sum, a
column of the page or a line of an operator's terminal is bounded here, and a
message over a bound is refused with INVALID_ARGUMENT naming the field (the
stream ends; nothing of the message is stored). The bounds sit far above what
a real agent sends (docs/security.md gives the arithmetic).
"""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from linkpassd._proto.linkpass.v1 import control_pb2 as cpb
from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb

# Sequence numbers of one boot: a million events a second for eight years
# stays below 2**48. Every seq and gap end is at most this, so one boot's lost
# count is too, and sums over boots stay far from 2**63 (the stores clamp
# them all the same: sqlite_store, pg_store).
MAX_SEQ = 2**48
MAX_RAILS = 256  # rails of one host (Inventory.rails, PortReport.rail_paths)
MAX_PORTS = 1024  # PortReport.ports
MAX_PATHS = 4096  # PortReport.paths: rails x peers per rail (the mesh gives <= 8 each by default)
MAX_NAME_CHARS = 253  # ports, rails, peers, paths, phases, kinds: a DNS name's length
# One message, evidence line or field value (the whole message is bounded by max_message_bytes).
MAX_TEXT_CHARS = 64 * 1024
MAX_GPUS = 4096  # Inventory.rails[].gpus: GPUs behind one port (sums of GPU-hours)
MAX_EVIDENCE = 64  # evidence lines per port
MAX_FIELDS = 256  # Event.fields entries

# google.protobuf.Timestamp's documented range: 0001-01-01 to 9999-12-31.
MIN_SECONDS = -62135596800
MAX_SECONDS = 253402300799


class Refused(ValueError):
    """A message over a bound; str() names the field and the bound."""


def _name(what: str, value: str) -> None:
    if len(value) > MAX_NAME_CHARS:
        raise Refused(f"{what} is {len(value)} characters: at most {MAX_NAME_CHARS}")


def _text(what: str, value: str) -> None:
    if len(value) > MAX_TEXT_CHARS:
        raise Refused(f"{what} is {len(value)} characters: at most {MAX_TEXT_CHARS}")


def _count(what: str, n: int, bound: int) -> None:
    if n > bound:
        raise Refused(f"{what} has {n} entries: at most {bound}")


def timestamp(what: str, ts: timestamp_pb2.Timestamp) -> None:
    """A Timestamp in its documented range (ToNanoseconds raises past it)."""
    if not MIN_SECONDS <= ts.seconds <= MAX_SECONDS or not 0 <= ts.nanos < 1_000_000_000:
        raise Refused(f"{what} ({ts.seconds} s, {ts.nanos} ns) is outside the Timestamp range "
                      "(years 1 to 9999)")


def seq(what: str, value: int) -> None:
    if value > MAX_SEQ:
        raise Refused(f"{what} {value} is over {MAX_SEQ} (2**48)")


def event(index: int, e: cpb.Event) -> None:
    """Events[index] of an EventBatch. On every event the aggregator takes,
    so the common case is a few comparisons; the field is named on refusal."""
    ts = e.time
    if (e.seq <= MAX_SEQ and MIN_SECONDS <= ts.seconds <= MAX_SECONDS and 0 <= ts.nanos < 1_000_000_000
            and len(e.port) <= MAX_NAME_CHARS and len(e.rail) <= MAX_NAME_CHARS
            and len(e.name) <= MAX_NAME_CHARS and len(e.boot_id) <= MAX_NAME_CHARS
            and len(e.message) <= MAX_TEXT_CHARS and len(e.fields) <= MAX_FIELDS):
        if not e.fields:
            return
        if all(len(k) <= MAX_NAME_CHARS and len(v) <= MAX_TEXT_CHARS for k, v in e.fields.items()):
            return
    where = f"EventBatch.events[{index}] (seq {e.seq})"
    seq(f"{where} seq", e.seq)
    timestamp(f"{where} time", ts)
    for name in ("port", "rail", "name", "boot_id"):
        _name(f"{where} {name}", getattr(e, name))
    _text(f"{where} message", e.message)
    _count(f"{where} fields", len(e.fields), MAX_FIELDS)
    for key, value in e.fields.items():
        _name(f"{where} fields key", key)
        _text(f"{where} fields[{key[:64]!r}]", value)


def batch_gap(b: pb.EventBatch) -> None:
    seq("EventBatch.gap_first", b.gap_first)
    seq("EventBatch.gap_last", b.gap_last)


def port_report(r: pb.PortReport) -> None:
    _count("PortReport.ports", len(r.ports), MAX_PORTS)
    _count("PortReport.paths", len(r.paths), MAX_PATHS)
    _count("PortReport.rail_paths", len(r.rail_paths), MAX_RAILS)
    if r.HasField("time"):
        timestamp("PortReport.time", r.time)
    for i, p in enumerate(r.ports):
        where = f"PortReport.ports[{i}]"
        _name(f"{where}.port", p.port)
        _name(f"{where}.phase", p.phase)
        _count(f"{where}.evidence", len(p.evidence), MAX_EVIDENCE)
        for line in p.evidence:
            _text(f"{where}.evidence", line)
        if p.HasField("drain"):
            _text(f"{where}.drain.reason", p.drain.reason)
            _name(f"{where}.drain.by", p.drain.by)
            for stamp in ("since", "until"):
                if p.drain.HasField(stamp):
                    timestamp(f"{where}.drain.{stamp}", getattr(p.drain, stamp))
    for i, path in enumerate(r.paths):
        where = f"PortReport.paths[{i}]"
        _name(f"{where}.port", path.port)
        _name(f"{where}.peer", path.peer)
        _name(f"{where}.state", path.state)
        _name(f"{where}.direction", path.direction)
    for rail, path in r.rail_paths.items():
        _name("PortReport.rail_paths key", rail)
        _name(f"PortReport.rail_paths[{rail[:64]!r}]", path)


def inventory(inv: pb.Inventory) -> None:
    _count("Inventory.rails", len(inv.rails), MAX_RAILS)
    for i, r in enumerate(inv.rails):
        where = f"Inventory.rails[{i}]"
        for name in ("rail", "port", "address", "gateway", "rdma_device", "leaf"):
            _name(f"{where}.{name}", getattr(r, name))
        if r.gpus > MAX_GPUS:
            raise Refused(f"{where}.gpus {r.gpus} is over {MAX_GPUS}")
