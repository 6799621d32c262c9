"""What the daemon tells and takes from operators: events, drains, and the
health document for launchers. Three collaborators of the reconcile loop
(daemon.loop), each handed what it needs when it is made:

`EventRecorder`: every decision is recorded once as a typed `Event`
(core.events). They are collected while a batch is handled and recorded after
the kernel writes (so neither logging nor a slow reader ever delays a
failover); the log line, the metrics, the control API's event stream and the
aggregator's spool are all fed from that one record.

`Drains`: the control API never changes the daemon's state itself. A drain or
undrain is a `DrainCommand` put on the daemon's queue; the reconcile loop
applies it like any other event (`apply`), reconciles, and only then answers
the caller (`answer`), so `linkpassctl drain` returns once traffic has left
the port.

`HealthPublisher`: health.json, rewritten (atomically) after every pass that
changed a port's usability, verdict or reason, and at least every
HEALTH_REFRESH_S so its `valid_until` tells a reader whether the daemon is
still there.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from linkpassd.adapters import rdma
from linkpassd.adapters.feeds import EventFeed, Latest
from linkpassd.adapters.healthfile import HealthFile, own_pid_namespace
from linkpassd.core import drain, healthdoc, policy
from linkpassd.core.events import Event, EventKind, EventLog, Severity, reason_class
from linkpassd.core.model import Drain, DrainOutcome, PortState, RailConfig
from linkpassd.daemon.statefiles import StateFiles
from linkpassd.timefmt import local_iso

log = structlog.get_logger("linkpassd")

HEALTH_FILE = "health.json"  # in the run directory
HEALTH_REFRESH_S = 10.0  # rewrite at least this often ...
HEALTH_VALID_S = 30.0  # ... and call it stale this long after it was written
COMMAND_TIMEOUT_S = 10.0  # a drain waits this long for its pass

_LOG_METHOD = {Severity.INFO: "info", Severity.WARNING: "warning", Severity.ERROR: "error"}


def cause_of(reason: str, drained: bool) -> str:
    """The class of a verdict's reason, for counting reroutes by cause."""
    return "drain" if drained else reason_class(reason)


# ---------------------------------------------------------------- events


class EventRecorder:
    """Events of a batch, recorded once the batch's kernel writes are done.
    `sinks`: called with each flush's recorded events (the metrics, the
    aggregator's spool hand-off); each must be constant time."""

    def __init__(self, capacity: int, clock: Callable[[], float],
                 wallclock: Callable[[], float]) -> None:
        self.feed = EventFeed(EventLog(capacity=capacity))
        self.clock = clock
        self.wallclock = wallclock
        self.pending: list[tuple] = []
        self.sinks: list[Callable[[list[Event]], None]] = []

    @property
    def boot_id(self) -> str:
        return self.feed.boot_id

    def emit(self, kind: EventKind, name: str, *, port: str = "", rail: str = "",
             severity: Severity = Severity.INFO, message: str = "", **fields: object) -> None:
        """Record an event once this batch's kernel writes are done."""
        self.pending.append((kind, name, self.wallclock(), self.clock(), severity, port,
                             rail, message, fields))

    def flush(self) -> None:
        recorded = []
        for kind, name, wall, mono, severity, port, rail, message, fields in self.pending:
            recorded.append(self.feed.append(kind, name, wall=wall, mono=mono, severity=severity,
                                             port=port, rail=rail, message=message, **fields))
        self.pending.clear()
        if not recorded:
            return
        for event in recorded:
            extra = {k: v for k, v in (("port", event.port), ("rail", event.rail)) if v}
            getattr(log, _LOG_METHOD[event.severity])(event.name, seq=event.seq, **extra,
                                                       **dict(event.fields))
        self.feed.publish()
        for sink in self.sinks:
            sink(recorded)


# ---------------------------------------------------------------- drains


@dataclass(eq=False)
class DrainCommand:
    """Drain (`drain` set) or undrain (`drain` None) `port`, from the control API.
    `taken`: the reconcile loop recorded it (answer() then answers `done`)."""

    port: str
    drain: Drain | None
    by: str
    done: asyncio.Future = field(compare=False)
    taken: bool = False
    replaced: Drain | None = None  # the port's drain this one replaced, when it was drained


class DrainView(Protocol):
    """What a drain's answer needs to know of the daemon (daemon.loop.Daemon)."""

    decision: policy.Decision | None

    def ports(self) -> list[str]: ...
    def rail_of(self, port: str) -> str: ...
    def wall_port_states(self, now: float) -> dict[str, PortState]: ...
    def clock(self) -> float: ...


class Drains:
    """The operators' drains: `by_port` is what the policy reads (core.drain)."""

    def __init__(self, files: StateFiles, recorder: EventRecorder,
                 enqueue: Callable[[DrainCommand], None], view: DrainView) -> None:
        self.files = files
        self.recorder = recorder
        self.enqueue = enqueue
        self.view = view
        self.by_port: dict[str, Drain] = {}

    def __contains__(self, port: object) -> bool:
        return port in self.by_port

    def __iter__(self) -> Iterator[str]:
        return iter(self.by_port)

    def load(self) -> None:
        self.by_port = self.files.load_drains()

    # ---- for the control API and the aggregator: queue, wait, answer

    async def drain(self, port: str, reason: str, duration_s: float | None,
                    by: str) -> DrainOutcome:
        """Drain `port`; returns its state after the pass, the drain it
        replaced, and why traffic is still on it."""
        view = self.view
        d = drain.request(port, reason, by, self.recorder.wallclock(), duration_s,
                          tuple(view.ports()))
        cmd = await self._command(port, d, by)
        decision = view.decision
        notes = () if decision is None else drain.still_carried(
            port, view.rail_of(port) or None, decision.rails, decision.groups)
        return DrainOutcome(self._state_after(port), cmd.replaced, notes)

    async def undrain(self, port: str, by: str) -> PortState:
        """A drained port may be undrained even when a reload removed it from
        the config (its drain would otherwise return with it, unclearable)."""
        if port not in self.by_port:
            ports = self.view.ports()
            if port not in ports:
                raise drain.UnknownPort(f"port {port!r} is not a rail's port; rail ports: "
                                        f"{', '.join(ports) or 'none'}")
            raise drain.NotDrained(f"port {port!r} is not drained")
        await self._command(port, None, by)
        return self._state_after(port)

    async def _command(self, port: str, d: Drain | None, by: str) -> DrainCommand:
        """Queue the change and wait for the pass that applies it: the answer
        says whether the routes moved (see answer)."""
        done = asyncio.get_running_loop().create_future()
        cmd = DrainCommand(port, d, by, done)
        self.enqueue(cmd)
        what = "drain" if d is not None else "undrain"
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT_S):
                await asyncio.shield(done)
        except TimeoutError:
            raise drain.DrainPending(
                f"{what} of {port} is queued, but linkpassd's reconcile loop did not get to it "
                f"within {COMMAND_TIMEOUT_S:g} s; it applies when the loop does (see "
                "`linkpassctl events`)") from None
        return cmd

    def _state_after(self, port: str) -> PortState:
        states = self.view.wall_port_states(self.view.clock())
        return states.get(port) or PortState(port=port, verdict=None, carrier=False, phase="",
                                             since=0.0, drain=self.by_port.get(port))

    # ---- in the reconcile loop

    def apply(self, cmd: DrainCommand) -> None:
        """Change the drains; the pass that follows moves the traffic, then
        answer() answers the caller."""
        rail = self.view.rail_of(cmd.port)
        cmd.taken = True
        if cmd.drain is not None:
            cmd.replaced = self.by_port.get(cmd.port)
            self.by_port[cmd.port] = cmd.drain
            message = f"{cmd.port} {cmd.drain.describe(local_iso)}"
            replaced = {}
            if cmd.replaced is not None:
                message += f"; replaces the drain by {cmd.replaced.by} " \
                           f"(until {'undrained' if cmd.replaced.until is None else local_iso(cmd.replaced.until)})"
                replaced = dict(replaced_by=cmd.replaced.by,
                                replaced_until=cmd.replaced.until or "undrain")
            self.recorder.emit(EventKind.DRAIN, "port_drained", port=cmd.port, rail=rail,
                               severity=Severity.WARNING, message=message,
                               by=cmd.by, reason=cmd.drain.reason,
                               until=cmd.drain.until or "undrain", **replaced)
        elif self.by_port.pop(cmd.port, None) is not None:
            self.recorder.emit(EventKind.UNDRAIN, "port_undrained", port=cmd.port, rail=rail,
                               message=f"{cmd.port} undrained by {cmd.by}", by=cmd.by,
                               how="undrain")
        self.files.save_drains(self.by_port)

    def expire(self) -> None:
        kept, gone = drain.active(self.by_port, self.recorder.wallclock())
        if not gone:
            return
        self.by_port = kept
        for d in gone:
            self.recorder.emit(EventKind.UNDRAIN, "port_undrained", port=d.port,
                               rail=self.view.rail_of(d.port),
                               message=f"{d.port}: drain by {d.by} expired", by=d.by,
                               how="expired")
        self.files.save_drains(self.by_port)

    @staticmethod
    def answer(events: Sequence[object], settled: bool, last_error: str) -> None:
        """After a batch: each drain command learns whether its change was
        recorded and whether the routes are now as the policy wants them
        (`settled`)."""
        for cmd in events:
            if not isinstance(cmd, DrainCommand) or cmd.done.done():
                continue
            what = "drain" if cmd.drain is not None else "undrain"
            if not cmd.taken:
                cmd.done.set_exception(drain.DrainNotTaken(
                    f"{what} of {cmd.port} was not recorded: linkpassd is stopping"))
            elif not settled:
                cmd.done.set_exception(drain.DrainPending(
                    f"{what} of {cmd.port} is recorded and kept, but the routes have not moved "
                    f"yet: {last_error or 'the pass did not complete'}; linkpassd retries "
                    "(see `linkpassctl status`)"))
            else:
                cmd.done.set_result(None)


# ---------------------------------------------------------------- health document


class HealthPublisher:
    """health.json and the WatchHealth feed (`doc`)."""

    def __init__(self, files: StateFiles, boot_id: str, wallclock: Callable[[], float]) -> None:
        self.files = files
        self.boot_id = boot_id
        self.wallclock = wallclock
        self.doc: Latest[healthdoc.HealthDoc] = Latest()
        self.file: HealthFile | None = None  # set by open(): tests write no /run file
        self.rows: tuple | None = None  # what the last document said, times aside
        self.next_at = 0.0
        self.rdma: dict[str, tuple[str, int]] = {}
        self.pid_ns = own_pid_namespace()  # lets nccl-env know whether our pid is comparable

    def open(self, run_dir: str) -> None:
        self.file = HealthFile(os.path.join(run_dir, HEALTH_FILE))

    def refresh_rdma(self, ports: Sequence[str]) -> None:
        self.rdma = rdma.rdma_ports(list(ports))

    def publish(self, now: float, rails: Sequence[RailConfig],
                states: dict[str, PortState]) -> None:
        """Write health.json and wake WatchHealth readers when what it says
        changed, or when it is due for its refresh."""
        doc = healthdoc.build(socket.gethostname(), self.boot_id, self.doc.generation + 1,
                              self.wallclock(), HEALTH_VALID_S, os.getpid(), rails, states,
                              self.rdma, pid_ns=self.pid_ns)
        rows = tuple((r.port, r.verdict, r.reason, r.drained, r.rdma_device, r.rdma_port)
                     for r in doc.ports)
        if rows == self.rows and now < self.next_at:
            return
        self.doc.publish(doc)
        self.rows = rows
        self.next_at = now + HEALTH_REFRESH_S
        if self.file is None:
            return
        try:
            self.file.write(doc)
            self.files.clear(self.file.path)
        except OSError as exc:
            self.files.problem(self.file.path, f"cannot write the health file: {exc}")

    def stopped(self) -> None:
        if self.doc.value is None or self.file is None:
            return
        try:
            self.file.mark_stopped(self.doc.value)
        except OSError as exc:
            log.error("health_file_failed", path=self.file.path, error=str(exc))
