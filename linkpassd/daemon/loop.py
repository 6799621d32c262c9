"""linkpassd's reconcile loop: the asyncio shell around the pure core.

Reader tasks (link events, ticks, sensor polls, BFD and echo probes, the
aggregator link) feed one queue; one reconcile loop drains it, updates port
health (core.health), asks the policy for the desired routing (core.policy)
and applies the planner's operations (core.plan, core.apply) through the
kernel adapter. The loop is event-nudged (a link event reconciles at once)
and level-triggered (a full re-read of kernel state every
`resync_interval_s`, and after any failed operation), so a missed event or a
foreign change is repaired, not trusted.

Between full re-reads the loop plans against its own view of the kernel: the
last dump, plus its own writes, plus the kernel's known side effect of carrier
loss (nexthops on the port deleted, see core.plan.carrier_lost). That keeps
netlink dumps out of the failover path. A write the kernel refuses means the
view was wrong: the loop re-reads everything and plans again at once.

`Daemon` owns the loop and the state it decides on; its collaborators are made
here and handed what they need: `StateFiles` (daemon.statefiles), the
`EventRecorder`, `Drains` and `HealthPublisher` (daemon.operations), `Probes`
(daemon.probes), `AggregatorLink` (daemon.aggregator) and `StatusReport`
(daemon.status). They never call back into the loop: what they observe comes
in as events on the queue. docs/architecture.md walks through it.

Fail-static: stopping or crashing changes nothing in the kernel. Starting over
unchanged state writes nothing (healthy ports are trusted at once and the plan
is empty).
"""

from __future__ import annotations

import asyncio
import errno
import signal
import time
from dataclasses import dataclass, replace

import structlog
from pyroute2 import AsyncIPRoute

import linkpassd
from linkpassd import config as configmod
from linkpassd._proto.linkpass.v1 import fleet_pb2
from linkpassd.adapters import sdnotify
from linkpassd.adapters.bfd import BfdEvent
from linkpassd.adapters.control_server import ControlServer
from linkpassd.adapters.kernel import (
    KernelAdapter,
    KernelOpError,
    KernelReadError,
    KernelReadTimeout,
    KernelSocketError,
)
from linkpassd.adapters.links import LinkEvent, LinkMonitor, LinkSnapshot
from linkpassd.adapters.sensor import Sensor
from linkpassd.adapters.watchdog import Watchdog
from linkpassd.agent import reports
from linkpassd.core import alloc, apply, bfd, carried, health, plan, policy
from linkpassd.core import drain as draincore
from linkpassd.core.events import EventKind, Severity
from linkpassd.core.model import (
    Assessment,
    Config,
    CounterSample,
    KernelState,
    LinkSample,
    Op,
    OpticsReading,
    PortState,
    Unreadable,
    Verdict,
)
from linkpassd.core.railverdict import rail_assessment
from linkpassd.core.signals import bfd_assessment
from linkpassd.daemon.aggregator import AggregatorLink, MeshPeersChanged
from linkpassd.daemon.announcing import Announcements
from linkpassd.daemon.fencing import Fencing
from linkpassd.daemon.operations import DrainCommand, Drains, EventRecorder, HealthPublisher, cause_of
from linkpassd.daemon.probes import EchoChange, Probes
from linkpassd.daemon.statefiles import ECHO_SIGNAL, StateFiles
from linkpassd.daemon.status import StatusReport
from linkpassd.daemon.wiring import bfd_specs, echo_spec, make_sensor

log = structlog.get_logger("linkpassd")

SENSOR_RETIRE_S = 30.0  # a replaced sensor is closed this long after the reload


@dataclass(frozen=True)
class Tick:
    """Re-sample cached link state (rise counts, hold-down expiry)."""


@dataclass(frozen=True)
class CounterReading:
    port: str
    sample: CounterSample


@dataclass(frozen=True)
class OpticsRead:
    port: str
    reading: OpticsReading | Unreadable


@dataclass(frozen=True)
class Reload:
    """SIGHUP: re-read the config file; keep the running one if it is bad."""


@dataclass(frozen=True)
class Shutdown:
    signal: str


class ShutdownRequested(Exception):
    pass


class Daemon:
    def __init__(self, config: Config, config_path: str | None = None,
                 clock=time.monotonic, wallclock=time.time):
        self.config = config
        self.config_path = config_path
        self.clock = clock
        self.wallclock = wallclock
        self.queue: asyncio.Queue = asyncio.Queue()
        self.reload_queued = False  # a Reload is in the queue (request_reload coalesces SIGHUPs)
        self.links: dict[str, LinkSample] = {}
        self.health: dict[str, health.PortHealth] = {}
        self.decision: policy.Decision | None = None
        self.applied: KernelState | None = None
        self.kernel_view: KernelState | None = None  # None: re-read before planning
        self.pending_logs: list[tuple[str, dict]] = []
        self.needs_resync = True
        self.next_resync = 0.0
        self.reconciles = 0
        self.reload_failures = 0
        self.last_reconcile_at = 0.0
        self.last_error = ""
        self.last_error_at = 0.0  # wall clock; 0 when there is no error
        self.reconcile_failures = 0
        self.consecutive_failures = 0  # reconciles in a row that failed as a whole
        self.failures: dict[Op, apply.Failure] = {}  # writes the kernel refused, by op
        self.retry_at: float | None = None  # when the first refused write is due again
        self.hold_until = 0.0  # after a failed pass: no new pass before, for the same decision
        self.failed_desired: KernelState | None = None  # the decision that failed
        self.carried: dict[str, carried.Carried] = {}  # verdicts from before this start
        self.foreign: tuple = ()  # (ForeignObject, since) inside our ranges
        self.started_mono = clock()
        self.started_wall = wallclock()
        self.ready = asyncio.Event()
        self.kernel: KernelAdapter | None = None
        self.ipr: AsyncIPRoute | None = None
        self.monitor: LinkMonitor | None = None
        self.sensor: Sensor | None = None
        self.early_probes: dict[str, dict[str, Assessment]] = {}  # before a port's first sample
        # Each port's last logged echo status and direction (core.direction).
        self.echo_logged: dict[str, tuple[str, str]] = {}
        self.watchdog = Watchdog.from_environment(clock)  # WatchdogSec= from systemd, if any
        self.allocation: alloc.Allocation | None = None  # None: a fresh start's numbering
        self.metrics = None  # adapters.metrics.Metrics when [metrics] listen is set
        # The collaborators, each handed what it needs (none calls back into the loop).
        self.files = StateFiles(lambda: self.config, wallclock)
        self.recorder = EventRecorder(config.event_buffer, clock, wallclock)
        self.drains = Drains(self.files, self.recorder, self.queue.put_nowait, self)
        self.healthdoc = HealthPublisher(self.files, self.recorder.boot_id, wallclock)
        self.probes = Probes(self.queue.put_nowait, wallclock)
        self.aggregator = AggregatorLink(lambda: self.config, self, self.drains, self.files,
                                         self.queue.put_nowait, self.recorder.boot_id)
        self.recorder.sinks.append(self.aggregator.offer)  # a bounded hand-off, never a wait
        self.announcements = Announcements(self.recorder.emit, wallclock)
        self.fencing = Fencing(self.recorder.emit, wallclock, config=lambda: self.config,
                               clock=clock, nudge=lambda: self.queue.put_nowait(Tick()))
        self.aggregator.on_fence_grants = self.fencing.granted
        self.report = StatusReport(self, self.probes, self.files, self.recorder, self.aggregator,
                                   self.announcements, self.fencing)

    # ------------------------------------------------------------------ tasks

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, self.request_reload)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.queue.put_nowait, Shutdown(sig.name))
        ipr = AsyncIPRoute()
        # The guard refuses, before anything is sent, a write outside what we own.
        self.kernel = KernelAdapter(ipr, ownership=self.config.ownership)
        self.ipr = ipr
        self.monitor = LinkMonitor(self.ports(), self.queue.put)
        self.sensor = make_sensor(self.config)
        self.probes.start()
        self.probes.sync_bfd(self.config, self.clock())
        self.aggregator.restore_mesh()  # the last plan's peers, before the probers are made
        self.sync_probes()
        observed = await self._observe_at_start()
        self._load_allocation(observed)
        self.drains.load()
        self.adopt(observed)
        self.healthdoc.refresh_rdma(self.ports())
        self.healthdoc.open(self.config.run_dir)
        self._start_metrics(loop)
        self.aggregator.open_spool()  # before the first event
        control = ControlServer(self.config.control_socket, self.report.status,
                                explain_provider=self.report.explain, events=self.recorder.feed,
                                health=self.healthdoc.doc, drains=self.drains,
                                fences=self.fencing,
                                group=self.config.control_group,
                                admin_group=self.config.admin_group)
        await control.start()
        self.recorder.emit(EventKind.STARTED, "started",
                           message=f"linkpassd {linkpassd.__version__} started",
                           version=linkpassd.__version__, config=self.config.source,
                           rails=len(self.config.rails), multipath=len(self.config.multipath),
                           boot_id=self.recorder.boot_id,
                           drained=sorted(self.drains.by_port) or "none")
        self.fencing.load(self.config, self.clock())  # ports the last daemon left fenced: tested
        self.recorder.flush()
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self.monitor.run(), name="links")
                tasks.create_task(self._ticker(), name="ticker")
                tasks.create_task(self._poll("counters"), name="counters")
                tasks.create_task(self._poll("optics"), name="optics")
                tasks.create_task(self.probes.bfd.run(), name="bfd")
                tasks.create_task(self.reconcile_loop(), name="reconcile")
                tasks.create_task(self.watchdog.run(), name="watchdog")
                tasks.create_task(self.aggregator.run(), name="agent")
        except* ShutdownRequested:
            pass
        finally:
            sdnotify.notify("STOPPING=1")
            await self.fencing.stop()  # a fence lives only while linkpassd does
            self.recorder.emit(EventKind.STOPPED, "stopped", message="linkpassd stopped; routes "
                               "left as they are (fail-static)")
            self.recorder.flush()
            self.aggregator.close()
            self.healthdoc.stopped()
            await control.stop(0.5)
            if self.metrics is not None:
                self.metrics.close()
            self.sensor.close()
            self.probes.close()
            self.kernel.close()
            self.fencing.close()
            self.ipr.close()

    def adopt(self, observed: KernelState | None) -> None:
        """What the last daemon knew (verdicts.json, and rail tables the
        kernel still routes through a backup): such ports start as not
        trusted until their own probes prove them (core.carried). After the
        drains are loaded: a drain explains a failover."""
        self.carried = self.files.load_verdicts(observed, self.drains.by_port)

    async def _observe_at_start(self) -> KernelState | None:
        """One read of what we own, for the allocation and adoption; None when
        it fails (the first reconcile reads it again)."""
        try:
            assert self.kernel is not None
            return await self.kernel.observe(self.config.ownership)
        except Exception as exc:  # noqa: BLE001 - see above
            log.error("start_kernel_read_failed", error=repr(exc),
                      note="no adoption of failed-over tables; allocation from the file only")
            return None

    def _start_metrics(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve /metrics when [metrics] listen is set; a failure to bind is a
        reported problem, never the daemon's end."""
        if not self.config.metrics_listen:
            return
        from linkpassd import metrics_snapshot
        from linkpassd.adapters.metrics import Metrics
        metrics = Metrics(lambda: metrics_snapshot.take(self), loop=loop)
        try:
            host, port = metrics.serve(self.config.metrics_listen)
        except OSError as exc:
            log.error("metrics_failed", listen=self.config.metrics_listen, error=str(exc))
            self.files.problem(f"metrics on {self.config.metrics_listen}", str(exc), kind="metrics")
            return
        self.metrics = metrics

        def count(events) -> None:
            for event in events:
                metrics.on_event(event)
        self.recorder.sinks.append(count)
        log.info("metrics_serving", address=f"{host}:{port}")

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self.config.timers.tick_interval_s)
            await self.queue.put(Tick())

    async def _poll(self, what: str) -> None:
        """Read one kind of sensor for every port, one port at a time, forever.
        A sensor answers bad input with None or Unreadable; anything it raises
        anyway is logged and becomes Unreadable, never the daemon's end. The
        sensor is looked up for each read, so a reload can replace it."""
        while True:
            interval = (self.config.sensors.counters_interval_s if what == "counters"
                        else self.config.sensors.optics_interval_s)
            await asyncio.sleep(interval)
            for port in self.ports():
                if what == "optics" and health.eeprom_paused(self.health.get(port), self.clock()):
                    continue
                try:
                    sensor = self.sensor
                    if what == "counters":
                        await self.queue.put(CounterReading(port, await sensor.counters(port)))
                    else:
                        await self.queue.put(OpticsRead(port, await sensor.optics(port)))
                except Exception as exc:  # noqa: BLE001 - outside input must not end the daemon
                    log.error("sensor_failed", port=port, rail=self.rail_of(port), sensor=what,
                              error=repr(exc))
                    if what == "optics":
                        await self.queue.put(OpticsRead(port, Unreadable(f"sensor failed: {exc!r}")))

    def request_reload(self) -> None:
        """SIGHUP: queue one reload. Signals while one is queued and not
        started yet are the same request (100 SIGHUPs in 2 s were 100
        reloads, each ahead of the link events queued behind it)."""
        if not self.reload_queued:
            self.reload_queued = True
            self.queue.put_nowait(Reload())

    async def reconcile_loop(self) -> None:
        """Batches of queued events. A reload waits until every other event
        queued before it was handled, link events that arrive meanwhile
        included, and then runs once: a failover is never behind a reload."""
        while True:
            events = [await self.queue.get()]
            reload = False
            while True:
                while not self.queue.empty():
                    events.append(self.queue.get_nowait())
                rest = [e for e in events if not isinstance(e, Reload)]
                reload = reload or len(rest) != len(events)
                if rest:
                    await self.handle(rest)
                    self.watchdog.progress(self.clock())  # systemd is pinged only while this runs
                if self.queue.empty():
                    break
                events = []
            if reload:
                self.reload_queued = False  # a SIGHUP from here on asks for another reload
                await self.handle([Reload()])
                self.watchdog.progress(self.clock())

    # ------------------------------------------------- what collaborators read

    def ports(self) -> list[str]:
        return [rail.port for rail in self.config.rails]

    def rail_of(self, port: str) -> str:
        return next((r.name for r in self.config.rails if r.port == port), "")

    def port_states(self, now: float) -> dict[str, PortState]:
        """As the policy sees them: a drained port is DEGRADED (core.drain), a
        fenced one (down, or up for a test) DOWN (core.fence)."""
        return self.fencing.overlay(draincore.apply(
            {p: health.port_state(h, now, self.config.timers, self.config.health)
             for p, h in self.health.items()}, self.drains.by_port), now)

    def to_wall(self) -> float:
        """Add to a monotonic time to get a wall-clock one."""
        return self.started_wall - self.started_mono

    def wall_port_states(self, now: float) -> dict[str, PortState]:
        """port_states with wall-clock times (for operators and reports)."""
        to_wall = self.to_wall()
        return {p: replace(s, since=s.since + to_wall,
                           hold_until=s.hold_until + to_wall if s.hold_until else 0.0)
                for p, s in self.port_states(now).items()}

    def netlink_writes(self) -> int:
        return self.kernel.writes if self.kernel else 0

    def current_sensor(self) -> Sensor | None:
        return self.sensor

    def inventory(self) -> fleet_pb2.Inventory:
        return reports.inventory(self.config, self.healthdoc.rdma)

    def port_report(self) -> fleet_pb2.PortReport:
        """The PortReport of this daemon (ports as the policy sees them)."""
        rails = self.decision.rails if self.decision is not None else ()
        rail_paths = {r.name: r.active_rail or "none" for r in rails}
        return reports.port_report(self.wall_port_states(self.clock()),
                                   reports.path_samples(self.probes.echo), rail_paths)

    # ------------------------------------------------------------- decisions

    async def handle(self, events: list) -> None:
        """Observe a batch of events, then decide and reconcile. Nothing that
        goes wrong in here ends the daemon (a shutdown request aside): an
        unexpected error is a failed reconcile, logged, counted and retried
        with backoff, while the kernel keeps its last good state."""
        now = self.clock()
        try:
            await self._handle(events, now)
        except ShutdownRequested:
            raise
        except Exception as exc:  # noqa: BLE001 - see above
            self.consecutive_failures += 1
            self.reconcile_failures += 1
            self._fail(f"unexpected {type(exc).__name__}: {exc}", now, exc_info=exc)
        finally:
            self._flush_logs()
            self.recorder.flush()
            self.healthdoc.publish(now, self.config.rails, self.wall_port_states(now))
            settled = (self.decision is not None and self.applied == self.decision.desired
                       and not self.failures)
            self.drains.answer(events, settled, self.last_error)
            self.aggregator.after_pass()

    async def _handle(self, events: list, now: float) -> None:
        echo_ports: dict[str, None] = {}  # ports whose echo paths changed, in order
        for event in events:
            if isinstance(event, Shutdown):
                log.info("shutdown", signal=event.signal)
                raise ShutdownRequested
            if isinstance(event, Reload):
                await self._reload(now)
            elif isinstance(event, DrainCommand):
                self.drains.apply(event)
            elif isinstance(event, LinkSnapshot):
                if event.reason != "start":
                    self.needs_resync = True
                    self.recorder.emit(EventKind.RESYNC, "links_resync", severity=Severity.WARNING,
                                       message=f"every link re-read ({event.reason})",
                                       reason=event.reason)
                for sample in event.samples.values():
                    self.observe(sample, now)
            elif isinstance(event, LinkEvent):
                self.observe(event.sample, now)
            elif isinstance(event, Tick):
                for sample in list(self.links.values()):
                    self.observe(sample, now)
                if self.probes.bfd_retry_due(now):
                    self.probes.sync_bfd(self.config, now)
                self.drains.expire()
            elif isinstance(event, (CounterReading, OpticsRead)):
                self._observe_sensor(event, now)
            elif isinstance(event, BfdEvent):
                self.observe_bfd(event, now)
            elif isinstance(event, EchoChange):
                echo_ports.setdefault(event.port, None)
            elif isinstance(event, MeshPeersChanged):
                if self.aggregator.take_mesh_peers():
                    self.sync_probes()
                    self._reset_signals()  # a port left without paths drops its echo opinion
        for port in echo_ports:  # once per port and batch: a rail blackhole changes every path
            self._observe_echo(port, now)
        if not all(p in self.links for p in self.ports()):
            return  # no full picture of the ports yet
        self.fencing.decide(self.config, self.health, self.links, self.drains.by_port, now)
        decision = policy.decide(self.config, self.port_states(now), self.allocation)
        self._log_decision_changes(decision)
        self.decision = decision
        if now >= self.next_resync or (self.retry_at is not None and now >= self.retry_at):
            self.needs_resync = True
        if self.needs_resync or decision.desired != self.applied:
            # After a failed pass, wait out the backoff, unless the decision
            # changed: a failover never waits for an earlier failure.
            if now >= self.hold_until or decision.desired != self.failed_desired:
                await self._reconcile(decision, now)
        await self.announcements.step(self.config, decision, now)  # never raises
        await self.fencing.act()  # after the route writes; never raises
        self.files.save_verdicts(self.health, self.config.health)
        self.aggregator.save_mesh()

    def _later(self, event: str, **fields) -> None:
        """Log after the kernel writes, so logging never delays a failover."""
        self.pending_logs.append((event, fields))

    def _flush_logs(self) -> None:
        for event, fields in self.pending_logs:
            log.info(event, **fields)
        self.pending_logs.clear()

    def observe(self, sample: LinkSample, now: float) -> None:
        """A link sample (netlink event, snapshot or tick) into the port's health."""
        if sample.port not in self.ports():
            return
        previous = self.links.get(sample.port)
        self.links[sample.port] = sample
        if previous is not None and previous.healthy and not sample.healthy and self.kernel_view:
            # The kernel has already deleted the nexthops on this port.
            self.kernel_view = plan.carrier_lost(self.kernel_view, sample.port)
        before = self.health.get(sample.port)
        if before is None:
            state = health.initial(sample, now)
            known = self.carried.pop(sample.port, None)
            if known is not None:
                # Proof can only come from signals this port still has.
                probes = carried.probe_signals(self.config, sample.port, ECHO_SIGNAL)
                has = set(probes) | {"counters", "optics", "flaps"}
                awaiting = [s for s in known.awaiting if s in has]
                # A bad verdict saved before its signal was confirmed names
                # none: the port's own probes must prove it all the same.
                state = health.restore(state, known.verdict, known.reason,
                                       awaiting or list(probes), now)
            # What the probes said before the port was known.
            for name, judged in self.early_probes.pop(sample.port, {}).items():
                state = health.observe_probe(state, name, judged, now, self.config.timers,
                                             self.config.health)
            self._set_health(None, state)
            self._observe_echo(sample.port, now)
        else:
            self._set_health(before, health.observe(before, sample, now, self.config.timers,
                                                    self.config.health))

    def _observe_sensor(self, event: CounterReading | OpticsRead, now: float) -> None:
        before = self.health.get(event.port)
        if before is None or event.port not in self.ports():
            return  # no link sample yet, or the port left the config
        if isinstance(event, CounterReading):
            after = health.observe_counters(before, event.sample, now, self.config.timers,
                                            self.config.health)
        else:
            after = health.observe_optics(before, event.reading, now, self.config.timers,
                                          self.config.health)
        self._set_health(before, after)

    def observe_bfd(self, event: BfdEvent, now: float) -> None:
        """A BFD session's change into its port's health."""
        port = event.spec.ifname
        if port not in self.ports():
            return
        change = event.change
        try:
            diag = bfd.Diag(change.diag).name.lower().replace("_", " ")
        except ValueError:
            diag = f"diag {change.diag}"
        judged = bfd_assessment(event.name, change.new.name, ever_up=change.ever_up, diag=diag,
                                peer_state=change.remote_state.name,
                                detection_s=event.detection_time_s, max_lag_s=event.max_lag_s)
        if judged.status == "suspect":
            # our lateness explains it: ask again once the loop has kept time
            self.probes.recheck_bfd(event.name, event.detection_time_s)
            if event.recheck:
                return  # still no telling; nothing new to say
        what = "still down once our loop kept time" if event.recheck else \
            f"{change.old} -> {change.new}"
        self.recorder.emit(EventKind.SIGNAL, "bfd_session", port=port, rail=self.rail_of(port),
                           message=f"BFD {event.name} on {port}: {what} ({diag})",
                           peer=event.spec.peer, state=str(change.new), previous=str(change.old),
                           diag=diag, judged=judged.status, lag_ms=round(event.max_lag_s * 1e3, 1))
        before = self.health.get(port)
        if before is None:
            # The session changed before the port's first link sample: keep
            # its word for then (a session reports changes only, never again).
            self.early_probes.setdefault(port, {})[event.name] = judged
            return
        self._set_health(before, health.observe_probe(before, event.name, judged, now,
                                                      self.config.timers, self.config.health))

    def _observe_echo(self, port: str, now: float) -> None:
        before = self.health.get(port)
        if before is None or port not in self.ports():
            return
        paths = self.probes.echo_assessments(port)
        if not paths:
            return
        judged = rail_assessment(paths, ECHO_SIGNAL)
        # A suspicion settled by its burst is routine on a lossy path (several
        # a second at 5 % loss): logged only when the rail's status or the
        # direction its troubled paths lose packets in (core.direction)
        # changes otherwise. Suspicions are counted per path (`echo_counters`).
        logged = (judged.status, judged.direction)
        if judged.status != "suspect" and logged != self.echo_logged.get(port):
            self.echo_logged[port] = logged
            way = (f" ({judged.direction})"
                   if judged.direction and judged.direction not in ("none", "unknown") else "")
            self.recorder.emit(EventKind.SIGNAL, "echo_paths", port=port, rail=self.rail_of(port),
                               message=f"echo paths of {port}: {judged.status}{way}",
                               judged=judged.status, detail=judged.detail, direction=judged.direction,
                               paths=" ".join(f"{a.signal}={a.detail!r}" for a in paths))
        self._set_health(before, health.observe_probe(before, ECHO_SIGNAL, judged, now,
                                                      self.config.timers, self.config.health))

    def sync_probes(self) -> None:
        """The echo service and responder as the config and the aggregator's
        mesh say: at start, on reload and when the mesh changes. A service
        made anew starts every port's echo signal again."""
        if self.probes.sync_echo(self.config, self.aggregator.mesh_peers,
                                 self.aggregator.mesh_probers):
            self.echo_logged.clear()
            self._reset_signals(restart=(ECHO_SIGNAL,))

    def _replace_sensor(self) -> None:
        """A new backend (or directory, or pace) from a reload. Readings of
        the old one are not comparable (counters would jump), so every port's
        counter and optics history starts again. The old sensor is closed a
        little later: a read may still be awaiting it."""
        retired, self.sensor = self.sensor, make_sensor(self.config)
        asyncio.get_running_loop().call_later(SENSOR_RETIRE_S, retired.close)
        self._reset_signals(restart=health.SENSOR_SIGNALS)
        log.info("sensor_replaced", backend=self.config.sensors.backend)

    def _reset_signals(self, drop=(), restart=()) -> None:
        """Forget signals on every port (core.health.reset_signals): echo on a
        port that no longer probes is dropped, not awaited."""
        spec = echo_spec(self.config, self.aggregator.mesh_peers, self.aggregator.mesh_probers)
        echo_ports = {p.port for p in spec.paths} if spec is not None else set()
        for port, h in list(self.health.items()):
            gone = set(drop) | ({ECHO_SIGNAL} if port not in echo_ports else set())
            self.health[port] = health.reset_signals(h, self.config.health, drop=gone,
                                                     restart=set(restart) - gone)

    def _set_health(self, before: health.PortHealth | None, after: health.PortHealth) -> None:
        self.health[after.port] = after
        if before is None or before.verdict != after.verdict:
            bad = after.verdict is not Verdict.UP
            self.recorder.emit(
                EventKind.VERDICT, "port_verdict", port=after.port, rail=self.rail_of(after.port),
                severity=Severity.WARNING if bad else Severity.INFO,
                message=f"{after.port} is {after.verdict} ({after.reason})",
                verdict=str(after.verdict), phase=after.phase, reason=after.reason,
                previous=str(before.verdict) if before else "none",
                evidence=" | ".join(health.port_state(after, self.clock(), self.config.timers,
                                                      self.config.health).evidence))

    def _log_decision_changes(self, new: policy.Decision) -> None:
        old = {r.name: r for r in self.decision.rails} if self.decision else {}
        for rail in new.rails:
            prev = old.get(rail.name)
            if prev is None or prev.active_rail != rail.active_rail:
                moved = rail.active_rail != rail.name
                h = self.health.get(rail.port)
                self.recorder.emit(EventKind.RAIL_PATH, "rail_path", rail=rail.name, port=rail.port,
                                   severity=Severity.WARNING if moved else Severity.INFO,
                                   message=f"{rail.name} table {rail.table} via "
                                           f"{rail.active_rail or 'no path'}",
                                   table=rail.table, path=rail.active_rail or "none",
                                   previous=prev.active_rail if prev else "unknown",
                                   cause=cause_of(h.reason if h else "", rail.port in self.drains))
        old_groups = {g.name: g for g in self.decision.groups} if self.decision else {}
        for group in new.groups:
            prev = old_groups.get(group.name)
            if prev is None or prev.members != group.members:
                self.recorder.emit(EventKind.GROUP_MEMBERS, "group_members",
                                   message=f"group {group.name} ({group.destination}): "
                                           f"{','.join(group.members) or 'no members'}",
                                   group=group.name, destination=group.destination,
                                   members=",".join(group.members) or "none")

    # ------------------------------------------------------------- kernel writes

    async def _reconcile(self, decision: policy.Decision, now: float) -> None:
        """Apply the plan in waves of writes that do not depend on each other
        (core.apply): a write the kernel refuses skips only what depends on
        it and is retried with backoff, so one foreign object or refused
        write never holds up the failover of another rail."""
        assert self.kernel is not None
        started, writes_before = self.clock(), self.kernel.writes
        reread = self.needs_resync or self.kernel_view is None
        if reread:
            try:
                seen = await self.kernel.observe_with_foreign(self.config.ownership)
                self.kernel_view = seen.state
                self._note_foreign(seen.foreign)
            except Exception as exc:  # noqa: BLE001 - kernel trouble must not kill the daemon
                self.consecutive_failures += 1
                self.reconcile_failures += 1
                broken = isinstance(exc, (KernelSocketError, KernelReadTimeout))
                self._fail(f"reading kernel state failed: {exc}", now,
                           exc_info=exc if broken or not isinstance(exc, KernelReadError) else None)
                if broken:
                    self._renew_socket()  # a failed socket fails every later use
                return
        ops = plan.plan(decision.desired, self.kernel_view)
        self.failures = apply.prune(self.failures, ops)
        wave: list[Op] = []  # sent together, answered together (core.apply.joins_wave)
        wave_view = self.kernel_view
        for op in ops:
            if apply.in_backoff(op, self.failures, now):
                continue  # never ends a wave
            if wave and not apply.joins_wave(op, self.kernel_view, wave, wave_view, now):
                if await self._send_wave(wave, reread, now):
                    await self._reconcile(decision, now)  # the view was stale: read, plan again
                    return
                wave, wave_view = [], self.kernel_view
            if apply.blocked(op, self.kernel_view, self.failures, now) is not None:
                continue
            wave.append(op)
            wave_view = plan.simulate(wave_view, op)
        if wave and await self._send_wave(wave, reread, now):
            await self._reconcile(decision, now)
            return
        self.applied = decision.desired
        self.retry_at = apply.next_retry(self.failures)
        if reread:
            self.needs_resync = False
            self.next_resync = now + self.config.timers.resync_interval_s
        self.reconciles += 1
        self.consecutive_failures = 0
        if self.metrics is not None:
            self.metrics.on_reconcile(self.clock() - started, self.kernel.writes - writes_before)
        self.last_reconcile_at = self.wallclock()
        if not self.failures and self.last_error:
            log.info("error_cleared", error=self.last_error, note="every write succeeded")
            self.last_error, self.last_error_at = "", 0.0
        if not self.ready.is_set():
            self.ready.set()
            sdnotify.notify("READY=1")
            log.info("ready", writes=self.kernel.writes)

    async def _send_wave(self, wave: list[Op], reread: bool, now: float) -> bool:
        """Send `wave`'s writes without waiting between them (they do not
        depend on each other), then take each answer in plan order. True
        when a refusal shows our view of the kernel was stale (it was not
        just read): the caller re-reads and plans again."""
        assert self.kernel is not None
        results = await asyncio.gather(*(self.kernel.apply(op) for op in wave),
                                       return_exceptions=True)
        stale: KernelOpError | None = None
        unexpected: BaseException | None = None
        timed_out = False
        for op, result in zip(wave, results):
            if isinstance(result, KernelOpError):
                if not reread:
                    stale = stale or result
                else:
                    self._refused(op, result, now)
                    timed_out = timed_out or result.errno == errno.ETIMEDOUT
                continue
            if isinstance(result, BaseException):
                unexpected = unexpected or result  # raised once every answer is taken
                continue
            self.failures.pop(op, None)
            try:
                self.kernel_view = plan.simulate(self.kernel_view, op)
            except plan.KernelSemanticsError:
                self.needs_resync = True  # the kernel took it, our view did not: re-read next time
            self._later("kernel_write", op=str(op.kind), object=type(op.obj).__name__,
                        detail=str(op.obj))
        if timed_out:
            # A write may have happened: leave late replies behind with the
            # old socket (once for the wave: its writes shared the socket).
            self._renew_socket()
        if unexpected is not None:
            raise unexpected  # not an answer from the kernel: the pass fails (handle)
        if stale is None:
            return False
        log.warning("kernel_view_stale", refused=str(stale), action="re-read")
        self.needs_resync = True
        return True

    def _note_foreign(self, foreign) -> None:
        """Foreign objects inside our ranges: reported, never touched."""
        now = self.wallclock()
        before = {str(f): since for f, since in self.foreign}
        self.foreign = tuple((f, before.get(str(f), now)) for f in foreign)
        for f, _since in self.foreign:
            if str(f) not in before:
                self.recorder.emit(EventKind.CONFLICT, "foreign_object", severity=Severity.WARNING,
                                   message=f"foreign {f.kind} inside an owned range, left alone: {f}",
                                   object_kind=f.kind, protocol=f.protocol, object=str(f))

    def _refused(self, op: Op, exc: KernelOpError, now: float) -> None:
        """The kernel refused `op` against a fresh view: remember it, retry it
        with backoff; a foreign object in the way is a conflict to name."""
        previous = self.failures.get(op)
        foreign = bool(getattr(exc, "foreign", False))
        failure = apply.refused(previous, op, str(exc), foreign, now)
        self.failures[op] = failure
        self.last_error, self.last_error_at = str(exc), self.wallclock()
        if previous is None or previous.error != failure.error:
            log.error("write_refused", op=apply.describe(op), error=str(exc),
                      conflict=foreign, retry_s=round(failure.retry_at - now, 1))
            if foreign:
                self.recorder.emit(EventKind.CONFLICT, "write_conflict", severity=Severity.ERROR,
                                   message=f"{apply.describe(op)}: a foreign object is in the way",
                                   op=apply.describe(op), error=str(exc))

    def _renew_socket(self) -> None:
        """Continue on a fresh netlink socket; late replies, a stuck send or
        an error pyroute2 keeps on the old one stay behind with it."""
        assert self.kernel is not None
        old = self.kernel.replace_socket(AsyncIPRoute())
        self.ipr = self.kernel.ipr
        old.close()

    def _fail(self, message: str, now: float, exc_info: BaseException | None = None) -> None:
        """A pass failed as a whole: remember the error, re-read everything,
        and hold off the same decision for a backoff (a new one goes at once)."""
        self.last_error, self.last_error_at = message, self.wallclock()
        self.needs_resync = True
        self.kernel_view = None
        self.applied = None
        self.failed_desired = self.decision.desired if self.decision else None
        self.hold_until = now + apply.backoff_s(self.consecutive_failures)
        retry_s = round(self.hold_until - now, 1)
        if self.consecutive_failures <= 1:  # the first of a run is an event (logged as such)
            if exc_info is not None:
                log.error("reconcile_failed_traceback", error=message, exc_info=exc_info)
            self.recorder.emit(EventKind.RECONCILE_FAILED, "reconcile_failed",
                               severity=Severity.ERROR, message=message, error=message,
                               failures=self.reconcile_failures, retry_s=retry_s)
        else:  # the rest of the run: the log only
            log.error("reconcile_failed", error=message, failures=self.reconcile_failures,
                      retry_s=retry_s, exc_info=exc_info)

    # ------------------------------------------------------------- allocation

    def _load_allocation(self, observed: KernelState | None) -> None:
        """Nexthop ids, rule priorities and auto tables by name (core.alloc),
        kept across restarts; new numbers never take an id still in the
        kernel."""
        previous = self.files.load_allocation(observed)
        reserved = alloc.kernel_ids(observed) if observed is not None else frozenset()
        try:
            allocation = alloc.allocate(self.config, previous, reserved)
        except alloc.AllocationError as exc:
            # What was kept no longer fits; numbering afresh beats not running
            # (the config check guarantees a fresh start fits).
            log.error("allocation_renumbered", error=str(exc))
            allocation = alloc.allocate(self.config, None)
        self.config = self._use_allocation(self.config, allocation)

    def _use_allocation(self, config: Config, allocation: alloc.Allocation) -> Config:
        """Adopt `allocation` (allocation.json is written before any kernel
        write that uses it) and return `config` with its auto tables resolved."""
        self.allocation = allocation
        self.files.save_allocation(config.state_dir, allocation)
        return alloc.resolve(config, allocation)

    async def _kernel_ids(self) -> frozenset[int]:
        """Owned ids in the kernel now (a fresh dump; our view if that fails)."""
        assert self.kernel is not None
        try:
            return alloc.kernel_ids(await self.kernel.observe(self.config.ownership))
        except Exception as exc:  # noqa: BLE001 - fall back to what we know
            log.warning("allocation_kernel_read_failed", error=repr(exc), fallback="last view")
            return alloc.kernel_ids(self.kernel_view) if self.kernel_view else frozenset()

    # ------------------------------------------------------------- reload

    async def _reload(self, now: float) -> None:
        if not self.config_path:
            log.warning("reload_ignored", reason="no config file")
            return
        # At once (the `reloaded` event follows the reload's kernel writes):
        # marks where this reload's writes begin in the log.
        log.info("reload_requested", config=self.config_path)
        try:
            new = configmod.load_config(self.config_path)
            if new.ownership != self.config.ownership:
                raise configmod.ConfigError(
                    new.source, "ownership",
                    "the owned ranges or route protocol changed; a reload cannot move what "
                    "linkpassd owns (objects left in the old ranges would stay ahead of the new "
                    "ones): restore [ownership], or stop linkpassd, remove its objects and start it "
                    "with the new ranges")
            try:
                allocation = alloc.allocate(new, self.allocation, await self._kernel_ids())
            except alloc.AllocationError as exc:
                raise configmod.ConfigError(new.source, None, str(exc)) from None
            new = self._use_allocation(new, allocation)  # saved before the writes that use it
        except configmod.ConfigError as exc:
            self.reload_failures += 1
            self.last_error = f"reload rejected, running config kept: {exc}"
            self.last_error_at = self.wallclock()
            self.recorder.emit(EventKind.RELOAD_REFUSED, "reload_rejected", severity=Severity.ERROR,
                               message=f"reload refused, running config kept: {exc}",
                               error=str(exc), failures=self.reload_failures)
            return
        old, self.config = self.config, new
        for key in ("control_socket", "control_group", "admin_group", "metrics_listen",
                    "event_buffer", "run_dir"):
            if getattr(old, key) != getattr(new, key):
                log.warning("reload_needs_restart", key=key, running=getattr(old, key),
                            note="takes effect when linkpassd restarts")
        if new.sensors != old.sensors:
            self._replace_sensor()
        assert self.monitor is not None
        self.monitor.watch(self.ports())
        # A session whose spec changed starts anew: a bad verdict it gave is
        # held until the new session proves the path (a reload keeps every
        # verdict whose evidence is unchanged).
        self.aggregator.reloaded(old)
        before, after = bfd_specs(old), bfd_specs(new)
        self.health = {p: h for p, h in self.health.items() if p in self.ports()}
        self._reset_signals(drop=before.keys() - after.keys(),
                            restart={n for n in after if n in before and before[n] != after[n]})
        self.probes.sync_bfd(self.config, now)
        self.sync_probes()
        snap = await self.monitor.snapshot(self.ipr, "reload")
        self.links = {p: s for p, s in self.links.items() if p in self.ports()}
        for sample in snap.samples.values():
            self.observe(sample, now)
        self.needs_resync = True
        self.healthdoc.refresh_rdma(self.ports())
        self.recorder.emit(EventKind.RELOAD, "reloaded", message=f"config {new.source} in use",
                           config=new.source, rails=len(new.rails))
