"""What the daemon tells and takes from operators: events, drains, and the
health document for launchers.  A mixin of `Daemon`.

Events: every decision is recorded once as a typed `Event` (core.events).
They are collected while a batch is handled and recorded after the kernel
writes (so neither logging nor a slow reader ever delays a failover); the
log line, the metrics and the control API's event stream are all fed from
that one record.

Drains: the control API never changes the daemon's state itself.  A drain or
undrain is a command put on the daemon's queue; the reconcile loop applies it
like any other event, reconciles, and only then answers the caller, so
`linkpassctl drain` returns once traffic has left the port.

Health document: rewritten (atomically) after every pass that changed a
port's usability, verdict or reason, and at least every HEALTH_REFRESH_S so
its `valid_until` tells a reader whether the daemon is still there.
"""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import dataclass, field

import structlog

from linkpassd.adapters import rdma
from linkpassd.adapters.feeds import EventFeed, Latest
from linkpassd.adapters.healthfile import HealthFile, own_pid_namespace
from linkpassd.adapters.statefile import StateFileError, read_json, write_json_atomic
from linkpassd.core import drain, healthdoc
from linkpassd.core.events import Event, EventKind, EventLog, Severity, reason_class
from linkpassd.core.model import Drain, DrainOutcome, PortState, Problem
from linkpassd.timefmt import local_iso

log = structlog.get_logger("linkpassd")

DRAIN_FILE = "drains.json"  # in the state directory
HEALTH_FILE = "health.json"  # in the run directory
HEALTH_REFRESH_S = 10.0  # rewrite at least this often ...
HEALTH_VALID_S = 30.0  # ... and call it stale this long after it was written
COMMAND_TIMEOUT_S = 10.0  # a drain waits this long for its pass

_LOG_METHOD = {Severity.INFO: "info", Severity.WARNING: "warning", Severity.ERROR: "error"}


@dataclass(eq=False)
class DrainCommand:
    """Drain (`drain` set) or undrain (`drain` None) `port`, from the control API.
    `taken`: the reconcile loop recorded it (handle() then answers `done`)."""

    port: str
    drain: Drain | None
    by: str
    done: asyncio.Future = field(compare=False)
    taken: bool = False
    replaced: Drain | None = None  # the port's drain this one replaced, when it was drained


def cause_of(reason: str, drained: bool) -> str:
    """The class of a verdict's reason, for counting reroutes by cause."""
    return "drain" if drained else reason_class(reason)


class Operations:
    def _init_operations(self) -> None:
        self.events = EventFeed(EventLog(capacity=self.config.event_buffer))
        self.pending_events: list[tuple] = []
        self.drains: dict[str, Drain] = {}
        self.saved_drains: dict[str, Drain] | None = None
        self.health_doc: Latest[healthdoc.HealthDoc] = Latest()
        self.health_file: HealthFile | None = None  # set by run(): tests write no /run file
        self.health_rows: tuple | None = None  # what the last document said, times aside
        self.next_health_at = 0.0
        self.rdma: dict[str, tuple[str, int]] = {}
        self.pid_ns = own_pid_namespace()  # lets nccl-env know whether our pid is comparable
        self.metrics = None  # adapters.metrics.Metrics when [metrics] listen is set

    # ------------------------------------------------------------ events

    def _emit(self, kind: EventKind, name: str, *, port: str = "", rail: str = "",
              severity: Severity = Severity.INFO, message: str = "", **fields: object) -> None:
        """Record an event once this batch's kernel writes are done."""
        self.pending_events.append((kind, name, self.wallclock(), self.clock(), severity, port,
                                    rail, message, fields))

    def _flush_events(self) -> None:
        recorded = []
        for kind, name, wall, mono, severity, port, rail, message, fields in self.pending_events:
            recorded.append(self.events.append(kind, name, wall=wall, mono=mono, severity=severity,
                                               port=port, rail=rail, message=message, **fields))
        self.pending_events.clear()
        for event in recorded:
            self._log_event(event)
            if self.metrics is not None:
                self.metrics.on_event(event)
        if recorded:
            self.events.publish()
            self._agent_offer(recorded)  # agent.link: a bounded hand-off, never a wait

    @staticmethod
    def _log_event(event: Event) -> None:
        extra = {k: v for k, v in (("port", event.port), ("rail", event.rail)) if v}
        getattr(log, _LOG_METHOD[event.severity])(event.name, seq=event.seq, **extra,
                                                   **dict(event.fields))

    def _start_metrics(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve /metrics when [metrics] listen is set; a failure to bind is a
        reported problem, never the daemon's end."""
        if not self.config.metrics_listen:
            return
        from linkpassd import metrics_snapshot
        from linkpassd.adapters.metrics import Metrics
        self.metrics = Metrics(lambda: metrics_snapshot.take(self), loop=loop)
        try:
            host, port = self.metrics.serve(self.config.metrics_listen)
        except OSError as exc:
            self.metrics = None
            where = f"metrics on {self.config.metrics_listen}"
            log.error("metrics_failed", listen=self.config.metrics_listen, error=str(exc))
            self.state_problems[where] = Problem("metrics", where, str(exc), self.wallclock())
            return
        log.info("metrics_serving", address=f"{host}:{port}")

    # ------------------------------------------------------------ drains

    def _load_drains(self) -> None:
        path = os.path.join(self.config.state_dir, DRAIN_FILE)
        try:
            doc = read_json(path)
            if doc is not None:
                self.drains = drain.decode(doc)
                self.saved_drains = dict(self.drains)
        except (StateFileError, drain.DrainError) as exc:
            self._state_problem(path, f"drain file unusable, no port is drained: {exc}")
        for d in self.drains.values():
            log.warning("drain_carried", port=d.port, by=d.by, reason=d.reason,
                        until=d.until or "undrain")

    def _save_drains(self) -> None:
        if self.drains == self.saved_drains:
            return
        path = os.path.join(self.config.state_dir, DRAIN_FILE)
        try:
            write_json_atomic(path, drain.encode(self.drains))
        except OSError as exc:
            self._state_problem(path, f"cannot write the drain file (drains hold until a "
                                      f"restart): {exc}")
            return
        self.saved_drains = dict(self.drains)
        self.state_problems.pop(path, None)

    async def drain(self, port: str, reason: str, duration_s: float | None,
                    by: str) -> DrainOutcome:
        """For the control API: drain `port`; returns its state after the
        pass, the drain it replaced, and why traffic is still on it."""
        d = drain.request(port, reason, by, self.wallclock(), duration_s, tuple(self.ports()))
        cmd = await self._command(port, d, by)
        decision = self.decision
        notes = () if decision is None else drain.still_carried(
            port, self._rail_of(port) or None, decision.rails, decision.groups)
        return DrainOutcome(self._state_after(port), cmd.replaced, notes)

    async def undrain(self, port: str, by: str) -> PortState:
        """A drained port may be undrained even when a reload removed it from
        the config (its drain would otherwise return with it, unclearable)."""
        if port not in self.drains:
            if port not in self.ports():
                raise drain.UnknownPort(f"port {port!r} is not a rail's port; rail ports: "
                                        f"{', '.join(self.ports()) or 'none'}")
            raise drain.NotDrained(f"port {port!r} is not drained")
        await self._command(port, None, by)
        return self._state_after(port)

    async def _command(self, port: str, d: Drain | None, by: str) -> DrainCommand:
        """Queue the change and wait for the pass that applies it: the answer
        says whether the routes moved (see _answer_commands)."""
        done = asyncio.get_running_loop().create_future()
        cmd = DrainCommand(port, d, by, done)
        await self.queue.put(cmd)
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
        states = self._unix_port_states(self.clock())
        return states.get(port) or PortState(port=port, verdict=None, carrier=False, phase="",
                                             since=0.0, drain=self.drains.get(port))

    def _answer_commands(self, events: list) -> None:
        """After a batch: each drain command learns whether its change was
        recorded and whether the routes are now as the policy wants them."""
        settled = (self.decision is not None and self.applied == self.decision.desired
                   and not self.failures)
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
                    f"yet: {self.last_error or 'the pass did not complete'}; linkpassd retries "
                    "(see `linkpassctl status`)"))
            else:
                cmd.done.set_result(None)

    def _apply_drain_command(self, cmd: DrainCommand) -> None:
        """In the reconcile loop: change the drains; the pass that follows
        moves the traffic, then handle() answers the caller."""
        rail = self._rail_of(cmd.port)
        cmd.taken = True
        if cmd.drain is not None:
            cmd.replaced = self.drains.get(cmd.port)
            self.drains[cmd.port] = cmd.drain
            message = f"{cmd.port} {cmd.drain.describe(local_iso)}"
            replaced = {}
            if cmd.replaced is not None:
                message += f"; replaces the drain by {cmd.replaced.by} " \
                           f"(until {'undrained' if cmd.replaced.until is None else local_iso(cmd.replaced.until)})"
                replaced = dict(replaced_by=cmd.replaced.by,
                                replaced_until=cmd.replaced.until or "undrain")
            self._emit(EventKind.DRAIN, "port_drained", port=cmd.port, rail=rail,
                       severity=Severity.WARNING, message=message,
                       by=cmd.by, reason=cmd.drain.reason, until=cmd.drain.until or "undrain",
                       **replaced)
        elif self.drains.pop(cmd.port, None) is not None:
            self._emit(EventKind.UNDRAIN, "port_undrained", port=cmd.port, rail=rail,
                       message=f"{cmd.port} undrained by {cmd.by}", by=cmd.by, how="undrain")
        self._save_drains()

    def _expire_drains(self) -> None:
        kept, gone = drain.active(self.drains, self.wallclock())
        if not gone:
            return
        self.drains = kept
        for d in gone:
            self._emit(EventKind.UNDRAIN, "port_undrained", port=d.port, rail=self._rail_of(d.port),
                       message=f"{d.port}: drain by {d.by} expired", by=d.by, how="expired")
        self._save_drains()

    # ------------------------------------------------------------ health document

    def _refresh_rdma(self) -> None:
        self.rdma = rdma.rdma_ports(self.ports())

    def _publish_health(self, now: float) -> None:
        """Write health.json and wake WatchHealth readers when what it says
        changed, or when it is due for its refresh."""
        states = self._unix_port_states(now)
        doc = healthdoc.build(socket.gethostname(), self.events.boot_id,
                              self.health_doc.generation + 1, self.wallclock(), HEALTH_VALID_S,
                              os.getpid(), self.config.rails, states, self.rdma,
                              pid_ns=self.pid_ns)
        rows = tuple((r.port, r.verdict, r.reason, r.drained, r.rdma_device, r.rdma_port)
                     for r in doc.ports)
        if rows == self.health_rows and now < self.next_health_at:
            return
        self.health_doc.publish(doc)
        self.health_rows = rows
        self.next_health_at = now + HEALTH_REFRESH_S
        if self.health_file is None:
            return
        try:
            self.health_file.write(doc)
            self.state_problems.pop(self.health_file.path, None)
        except OSError as exc:
            self._state_problem(self.health_file.path, f"cannot write the health file: {exc}")

    def _open_health_file(self) -> None:
        self.health_file = HealthFile(os.path.join(self.config.run_dir, HEALTH_FILE))

    def _health_stopped(self) -> None:
        if self.health_doc.value is None or self.health_file is None:
            return
        try:
            self.health_file.mark_stopped(self.health_doc.value)
        except OSError as exc:
            log.error("health_file_failed", path=self.health_file.path, error=str(exc))
