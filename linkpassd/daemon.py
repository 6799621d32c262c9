"""linkpassd's process: the asyncio shell around the pure core.

The only module with tasks. Reader tasks (link events, ticks, signals) feed one
queue; one reconcile loop drains it, updates port health, asks the policy for
the desired routing, and applies the planner's operations. The loop is
event-nudged (a link event reconciles at once) and level-triggered (a full
re-read of kernel state every `resync_interval_s`, and after any failed
operation), so a missed event or a foreign change is repaired, not trusted.

Between full re-reads the loop plans against its own view of the kernel: the
last dump, plus its own writes, plus the kernel's known side effect of carrier
loss (nexthops on the port deleted, see core.plan.carrier_lost). That keeps
netlink dumps out of the failover path. A write the kernel refuses means the
view was wrong: the loop re-reads everything and plans again at once.

Fail-static: stopping or crashing changes nothing in the kernel. Starting over
unchanged state writes nothing (healthy ports are trusted at once and the plan
is empty).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import signal
import sys
import time
from dataclasses import dataclass, replace

import structlog
from pyroute2 import AsyncIPRoute

import linkpassd
from linkpassd import config as configmod
from linkpassd import logs
from linkpassd.adapters import sdnotify
from linkpassd.adapters.bfd import BfdAgent, BfdEvent, PeerSpec
from linkpassd.adapters.control_server import ControlServer, ControlSocketError
from linkpassd.adapters.echo import EchoService
from linkpassd.adapters.instancelock import AlreadyRunning, InstanceLock
from linkpassd.adapters.responderproc import ResponderProcess
from linkpassd.adapters.kernel import (KernelAdapter, KernelOpError, KernelReadError,
                                       KernelReadTimeout, KernelSocketError)
from linkpassd.adapters.links import LinkEvent, LinkMonitor, LinkSnapshot
from linkpassd.adapters.looplag import LoopLag
from linkpassd.adapters.sensor import Sensor
from linkpassd.adapters.watchdog import Watchdog
from linkpassd.agent.link import AggregatorLink, MeshPeersChanged
from linkpassd.config.reference import control_socket_problem
from linkpassd.operations import DrainCommand, Operations, cause_of
from linkpassd.persist import ECHO_SIGNAL, StateFiles
from linkpassd.status import StatusReport
from linkpassd.wiring import EchoSpec, bfd_specs, echo_spec, make_sensor, sync_bfd
from linkpassd.core import alloc, apply, bfd, carried, drain, health, plan, policy
from linkpassd.core.events import EventKind, Severity
from linkpassd.core.railverdict import rail_assessment
from linkpassd.core.signals import bfd_assessment
from linkpassd.core.model import (Assessment, Config, CounterSample, KernelState, LinkSample, Op,
                                  OpticsReading, PortState, Problem, Unreadable, Verdict)

log = structlog.get_logger("linkpassd")

DEFAULT_CONFIG = "/etc/linkpass/linkpassd.toml"
BFD_RETRY_S = 1.0  # a BFD session that could not start (port missing) is retried this often
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
class EchoChange:
    """An echo path of this port changed its verdict."""

    port: str




@dataclass(frozen=True)
class Reload:
    """SIGHUP: re-read the config file; keep the running one if it is bad."""


@dataclass(frozen=True)
class Shutdown:
    signal: str


class ShutdownRequested(Exception):
    pass


class Daemon(StateFiles, Operations, StatusReport, AggregatorLink):
    def __init__(self, config: Config, config_path: str | None = None,
                 clock=time.monotonic, wallclock=time.time):
        self.config = config
        self.config_path = config_path
        self.clock = clock
        self.wallclock = wallclock
        self.queue: asyncio.Queue = asyncio.Queue()
        self.reload_queued = False  # a Reload is in the queue (request_reload coalesces SIGHUPs)
        self.echo_port_taken_since: float | None = None  # status: another process on the echo port
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
        self.saved_verdicts: dict | None = None  # what the verdict file says now
        self.saved_mesh: bytes | None = None  # the ProbePeers mesh.json holds now
        self.saved_mesh_message = None  # the message last compared with it
        self.state_problems: dict[str, Problem] = {}  # state files we could not use
        self.foreign: tuple = ()  # (ForeignObject, since) inside our ranges
        self.bfd_pending: dict[str, tuple[PeerSpec, str, float]] = {}  # session -> spec, error, since
        self.next_bfd_retry = 0.0
        self.started_mono = clock()
        self.started_wall = wallclock()
        self.ready = asyncio.Event()
        self.kernel: KernelAdapter | None = None
        self.monitor: LinkMonitor | None = None
        self.bfd: BfdAgent | None = None
        self.looplag = LoopLag()  # one event-loop lag meter for BFD and echo
        self.sensor: Sensor | None = None
        self.echo: EchoService | None = None
        self.echo_spec: EchoSpec | None = None
        self.responder: ResponderProcess | None = None  # our echo responder, its own process
        self.early_probes: dict[str, dict[str, Assessment]] = {}  # before a port's first sample
        # Each port's last logged echo status and direction (core.direction).
        self.echo_logged: dict[str, tuple[str, str]] = {}
        self.watchdog = Watchdog.from_environment(clock)  # WatchdogSec= from systemd, if any
        self.allocation: alloc.Allocation | None = None  # None: a fresh start's numbering
        self.saved_allocation: alloc.Allocation | None = None  # what allocation.json says now
        self._init_operations()
        self._init_agent()

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
        self.looplag.start()
        self.bfd = BfdAgent(self.queue.put_nowait, lag=self.looplag)
        self._sync_bfd(self.clock())
        self._load_mesh()  # the last plan's peers, before the probers are made
        self._sync_echo()
        observed = await self._observe_at_start()
        self._load_allocation(observed)
        self._load_drains()
        self._adopt(observed)
        self._refresh_rdma()
        self._open_health_file()
        self._start_metrics(loop)
        self._open_spool()  # before the first event
        control = ControlServer(self.config.control_socket, self.status,
                                explain_provider=self.explain, events=self.events,
                                health=self.health_doc, drains=self,
                                group=self.config.control_group,
                                admin_group=self.config.admin_group)
        await control.start()
        self._emit(EventKind.STARTED, "started", message=f"linkpassd {linkpassd.__version__} started",
                   version=linkpassd.__version__, config=self.config.source,
                   rails=len(self.config.rails), multipath=len(self.config.multipath),
                   boot_id=self.events.boot_id, drained=sorted(self.drains) or "none")
        self._flush_events()
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self.monitor.run(), name="links")
                tasks.create_task(self._ticker(), name="ticker")
                tasks.create_task(self._poll("counters"), name="counters")
                tasks.create_task(self._poll("optics"), name="optics")
                tasks.create_task(self.bfd.run(), name="bfd")
                tasks.create_task(self._reconcile_loop(), name="reconcile")
                tasks.create_task(self.watchdog.run(), name="watchdog")
                tasks.create_task(self._agent_task(), name="agent")
        except* ShutdownRequested:
            pass
        finally:
            sdnotify.notify("STOPPING=1")
            self._emit(EventKind.STOPPED, "stopped", message="linkpassd stopped; routes left as "
                       "they are (fail-static)")
            self._flush_events()
            self._close_agent()
            self._health_stopped()
            await control.stop(0.5)
            if self.metrics is not None:
                self.metrics.close()
            self.sensor.close()
            # AdminDown tells the switch "shut down on purpose", not a path
            # failure (RFC 5882): our routes stay as they are (fail-static).
            self.bfd.close(admin_down=True)
            if self.echo is not None:
                self._log_echo_counters("stopped")
                self.echo.close()
            if self.responder is not None:
                self.responder.close()
            self.kernel.close()
            self.ipr.close()

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

    def _sync_bfd(self, now: float) -> None:
        """Sessions as the config says. One whose port is missing (a NIC fell
        off the bus, a rename) is reported and retried every BFD_RETRY_S;
        every other rail is protected meanwhile."""
        assert self.bfd is not None
        failed = sync_bfd(self.bfd, self.config)
        for name, (spec, _error, _since) in self.bfd_pending.items():
            if name in self.bfd.runs:
                log.info("bfd_session_started", session=name, port=spec.ifname,
                         rail=self._rail_of(spec.ifname), note="after retry")
        self.bfd_pending = {name: pending for name, pending in self.bfd_pending.items()
                            if name in failed}
        for name, (spec, error) in failed.items():
            if name not in self.bfd_pending:
                log.error("bfd_session_failed", session=name, port=spec.ifname,
                          rail=self._rail_of(spec.ifname), error=error,
                          retry_s=BFD_RETRY_S)
                self.bfd_pending[name] = (spec, error, self.wallclock())
            else:
                self.bfd_pending[name] = (spec, error, self.bfd_pending[name][2])
        self.next_bfd_retry = now + BFD_RETRY_S

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
                    log.error("sensor_failed", port=port, rail=self._rail_of(port), sensor=what,
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

    async def _reconcile_loop(self) -> None:
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

    # ------------------------------------------------------------- decisions

    def ports(self) -> list[str]:
        return [rail.port for rail in self.config.rails]

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
            self._flush_events()
            self._publish_health(now)
            self._answer_commands(events)
            self._agent_after_pass()

    async def _handle(self, events: list, now: float) -> None:
        echo_ports: dict[str, None] = {}  # ports whose echo paths changed, in order
        for event in events:
            if isinstance(event, Shutdown):
                log.info("shutdown", signal=event.signal)
                raise ShutdownRequested
            if isinstance(event, Reload):
                await self._reload(now)
            elif isinstance(event, DrainCommand):
                self._apply_drain_command(event)
            elif isinstance(event, LinkSnapshot):
                if event.reason != "start":
                    self.needs_resync = True
                    self._emit(EventKind.RESYNC, "links_resync", severity=Severity.WARNING,
                               message=f"every link re-read ({event.reason})", reason=event.reason)
                for sample in event.samples.values():
                    self._observe(sample, now)
            elif isinstance(event, LinkEvent):
                self._observe(event.sample, now)
            elif isinstance(event, Tick):
                for sample in list(self.links.values()):
                    self._observe(sample, now)
                if self.bfd_pending and now >= self.next_bfd_retry:
                    self._sync_bfd(now)
                self._expire_drains()
            elif isinstance(event, (CounterReading, OpticsRead)):
                self._observe_sensor(event, now)
            elif isinstance(event, BfdEvent):
                self._observe_bfd(event, now)
            elif isinstance(event, EchoChange):
                echo_ports.setdefault(event.port, None)
            elif isinstance(event, MeshPeersChanged):
                self._take_mesh_peers()
        for port in echo_ports:  # once per port and batch: a rail blackhole changes every path
            self._observe_echo(port, now)
        if not all(p in self.links for p in self.ports()):
            return  # no full picture of the ports yet
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
        self._save_verdicts()
        self._save_mesh()

    def _later(self, event: str, **fields) -> None:
        """Log after the kernel writes, so logging never delays a failover."""
        self.pending_logs.append((event, fields))

    def _flush_logs(self) -> None:
        for event, fields in self.pending_logs:
            log.info(event, **fields)
        self.pending_logs.clear()

    def _observe(self, sample: LinkSample, now: float) -> None:
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

    def _observe_bfd(self, event: BfdEvent, now: float) -> None:
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
        if judged.status == "suspect" and self.bfd is not None:
            # our lateness explains it: ask again once the loop has kept time
            self.bfd.recheck(event.name, event.detection_time_s)
            if event.recheck:
                return  # still no telling; nothing new to say
        what = "still down once our loop kept time" if event.recheck else \
            f"{change.old} -> {change.new}"
        self._emit(EventKind.SIGNAL, "bfd_session", port=port, rail=self._rail_of(port),
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
        if before is None or self.echo is None or port not in self.ports():
            return
        paths = self.echo.assessments(port)
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
            self._emit(EventKind.SIGNAL, "echo_paths", port=port, rail=self._rail_of(port),
                       message=f"echo paths of {port}: {judged.status}{way}", judged=judged.status,
                       detail=judged.detail, direction=judged.direction,
                       paths=" ".join(f"{a.signal}={a.detail!r}" for a in paths))
        self._set_health(before, health.observe_probe(before, ECHO_SIGNAL, judged, now,
                                                      self.config.timers, self.config.health))

    def _replace_sensor(self) -> None:
        """A new backend (or directory, or pace) from a reload. Readings of
        the old one are not comparable (counters would jump), so every port's
        counter and optics history starts again. The old sensor is closed a
        little later: a read may still be awaiting it."""
        retired, self.sensor = self.sensor, make_sensor(self.config)
        asyncio.get_running_loop().call_later(SENSOR_RETIRE_S, retired.close)
        self._reset_signals(restart=health.SENSOR_SIGNALS)
        log.info("sensor_replaced", backend=self.config.sensors.backend)

    def _log_echo_counters(self, why: str) -> None:
        assert self.echo is not None
        for path, prober in self.echo.probers.items():
            state = prober.state
            log.info("echo_counters", why=why, path=str(path), **vars(prober.counters),
                     longest_silence_ms=round(state.longest_silence_s * 1e3, 1),
                     peer_held_max_ms=round(state.held_max_s * 1e3, 1),
                     stall_max_ms=round(state.stall_max_s * 1e3, 1))
        log.info("echo_loop_lag", stalls=self.echo.lag.stalls,
                 max_lag_ms=round(self.echo.lag.max_lag_s * 1e3, 1), **self.echo.batching(),
                 **({"responder_" + k: v for k, v in self.responder.tally().items()}
                    if self.responder is not None else {}))

    def _sync_echo(self) -> None:
        """Run the echo service the config asks for: at start and on reload. A
        change of peers or timers starts it anew (paths begin as never up)."""
        spec = echo_spec(self.config, self.mesh_peers, self.mesh_probers)
        self._sync_responder(spec)
        if spec == self.echo_spec:
            return
        if (self.echo is not None and spec is not None and self.echo_spec is not None
                and replace(spec, paths=(), responder=None)
                == replace(self.echo_spec, paths=(), responder=None)):
            # Only peers or who may be answered changed: paths that stay keep
            # their probers (verdict, loss window), new ones start never up.
            self.echo.set_paths(spec.paths)
            self.echo_spec = spec
            log.info("echo_peers_changed", paths=len(spec.paths))
            return
        if self.echo is not None:
            self._log_echo_counters("reloaded")
            self.echo.close()
            self.echo = None
            self.echo_logged.clear()
            self._reset_signals(restart=(ECHO_SIGNAL,))
        self.echo_spec = spec
        if spec is None:
            return
        self.echo = EchoService(
            spec.paths, spec.probe, echo_port=spec.port, tos=spec.tos,
            lag_period_s=spec.heartbeat_s, lag=self.looplag, respond=False,
            on_change=lambda path, _a: self.queue.put_nowait(EchoChange(path.port)))
        self.echo.start()
        taken = self.echo_port_problems()
        if taken:
            log.error("echo_port_taken", port=spec.port, detail=taken[0].detail,
                      note="shown in status until that process lets go of the port")
        log.info("echo_probing", paths=len(spec.paths), port=spec.port,
                 interval_ms=self.config.probes.interval_ms)
        if not spec.responder.fabric_prefixes:
            log.warning("echo_responder_peers_only", peers=len(spec.responder.peers),
                        note="[probes] fabric_prefixes is empty: only configured probe_peers "
                             "get answers")

    def _sync_responder(self, spec: EchoSpec | None) -> None:
        """Our echo responder, a process of its own (adapters.responderproc):
        started with probing, handed each new policy, replaced only when its
        port changes. Nothing here waits on it: a reload never joins or
        restarts a responder for a change of timers or peers."""
        if spec is None:
            if self.responder is not None:
                log.info("echo_responder_stopped", **self.responder.tally())
                self.responder.close()
                self.responder = None
            return
        if self.responder is not None and self.responder.port == spec.port:
            if self.responder.policy != spec.responder:
                self.responder.set_policy(spec.responder)
            return
        if self.responder is not None:
            log.info("echo_responder_stopped", **self.responder.tally())
            self.responder.close()
        self.responder = ResponderProcess(spec.port, policy=spec.responder)
        self.responder.start()

    def _reset_signals(self, drop=(), restart=()) -> None:
        """Forget signals on every port (core.health.reset_signals): echo on a
        port that no longer probes is dropped, not awaited."""
        spec = echo_spec(self.config, self.mesh_peers, self.mesh_probers)
        echo_ports = {p.port for p in spec.paths} if spec is not None else set()
        for port, h in list(self.health.items()):
            gone = set(drop) | ({ECHO_SIGNAL} if port not in echo_ports else set())
            self.health[port] = health.reset_signals(h, self.config.health, drop=gone,
                                                     restart=set(restart) - gone)

    def _set_health(self, before: health.PortHealth | None, after: health.PortHealth) -> None:
        self.health[after.port] = after
        if before is None or before.verdict != after.verdict:
            bad = after.verdict is not Verdict.UP
            self._emit(EventKind.VERDICT, "port_verdict", port=after.port,
                       rail=self._rail_of(after.port),
                       severity=Severity.WARNING if bad else Severity.INFO,
                       message=f"{after.port} is {after.verdict} ({after.reason})",
                       verdict=str(after.verdict), phase=after.phase, reason=after.reason,
                       previous=str(before.verdict) if before else "none",
                       evidence=" | ".join(health.port_state(after, self.clock(), self.config.timers,
                                                             self.config.health).evidence))

    def port_states(self, now: float) -> dict[str, PortState]:
        """As the policy sees them: a drained port is DEGRADED (core.drain)."""
        return drain.apply({p: health.port_state(h, now, self.config.timers, self.config.health)
                            for p, h in self.health.items()}, self.drains)

    def _rail_of(self, port: str) -> str:
        return next((r.name for r in self.config.rails if r.port == port), "")

    def _log_decision_changes(self, new: policy.Decision) -> None:
        old = {r.name: r for r in self.decision.rails} if self.decision else {}
        for rail in new.rails:
            prev = old.get(rail.name)
            if prev is None or prev.active_rail != rail.active_rail:
                moved = rail.active_rail != rail.name
                h = self.health.get(rail.port)
                self._emit(EventKind.RAIL_PATH, "rail_path", rail=rail.name, port=rail.port,
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
                self._emit(EventKind.GROUP_MEMBERS, "group_members",
                           message=f"group {group.name} ({group.destination}): "
                                   f"{','.join(group.members) or 'no members'}",
                           group=group.name, destination=group.destination,
                           members=",".join(group.members) or "none")

    async def _reconcile(self, decision: policy.Decision, now: float) -> None:
        """Apply the plan one object at a time (core.apply): a write the
        kernel refuses skips only what depends on it and is retried with
        backoff, so one foreign object or refused write never holds up the
        failover of another rail."""
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
        for op in ops:
            if apply.blocked(op, self.kernel_view, self.failures, now) is not None:
                continue
            try:
                await self.kernel.apply(op)
            except KernelOpError as exc:
                if not reread:
                    # Our view of the kernel was stale: re-read and plan again, now.
                    log.warning("kernel_view_stale", refused=str(exc), action="re-read")
                    self.needs_resync = True
                    await self._reconcile(decision, now)
                    return
                self._refused(op, exc, now)
                continue
            self.failures.pop(op, None)
            try:
                self.kernel_view = plan.simulate(self.kernel_view, op)
            except plan.KernelSemanticsError:
                self.needs_resync = True  # the kernel took it, our view did not: re-read next time
            self._later("kernel_write", op=str(op.kind), object=type(op.obj).__name__,
                        detail=str(op.obj))
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

    def _note_foreign(self, foreign) -> None:
        """Foreign objects inside our ranges: reported, never touched."""
        now = self.wallclock()
        before = {str(f): since for f, since in self.foreign}
        self.foreign = tuple((f, before.get(str(f), now)) for f in foreign)
        for f, _since in self.foreign:
            if str(f) not in before:
                self._emit(EventKind.CONFLICT, "foreign_object", severity=Severity.WARNING,
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
        if exc.errno == errno.ETIMEDOUT:
            # The write may have happened: re-read when it is retried, and
            # leave late replies behind with the old socket.
            self._renew_socket()
        if previous is None or previous.error != failure.error:
            log.error("write_refused", op=apply.describe(op), error=str(exc),
                      conflict=foreign, retry_s=round(failure.retry_at - now, 1))
            if foreign:
                self._emit(EventKind.CONFLICT, "write_conflict", severity=Severity.ERROR,
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
            self._emit(EventKind.RECONCILE_FAILED, "reconcile_failed", severity=Severity.ERROR,
                       message=message, error=message, failures=self.reconcile_failures,
                       retry_s=retry_s)
        else:  # the rest of the run: the log only
            log.error("reconcile_failed", error=message, failures=self.reconcile_failures,
                      retry_s=retry_s, exc_info=exc_info)

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
            self._emit(EventKind.RELOAD_REFUSED, "reload_rejected", severity=Severity.ERROR,
                       message=f"reload refused, running config kept: {exc}", error=str(exc),
                       failures=self.reload_failures)
            return
        old, self.config = self.config, new
        for key in ("control_socket", "control_group", "admin_group", "metrics_listen",
                    "event_buffer", "run_dir"):
            if getattr(old, key) != getattr(new, key):
                log.warning("reload_needs_restart", key=key, running=getattr(old, key),
                            note="takes effect when linkpassd restarts")
        if new.sensors != old.sensors:
            self._replace_sensor()
        assert self.monitor is not None and self.bfd is not None
        self.monitor.watch(self.ports())
        # A session whose spec changed starts anew: a bad verdict it gave is
        # held until the new session proves the path (a reload keeps every
        # verdict whose evidence is unchanged).
        self._agent_reloaded(old)
        before, after = bfd_specs(old), bfd_specs(new)
        self.health = {p: h for p, h in self.health.items() if p in self.ports()}
        self._reset_signals(drop=before.keys() - after.keys(),
                            restart={n for n in after if n in before and before[n] != after[n]})
        self._sync_bfd(now)
        self._sync_echo()
        snap = await self.monitor.snapshot(self.ipr, "reload")
        self.links = {p: s for p, s in self.links.items() if p in self.ports()}
        for sample in snap.samples.values():
            self._observe(sample, now)
        self.needs_resync = True
        self._refresh_rdma()
        self._emit(EventKind.RELOAD, "reloaded", message=f"config {new.source} in use",
                   config=new.source, rails=len(new.rails))


DESCRIPTION = """\
linkpassd keeps this host's GPU-cluster traffic on healthy links. It watches
every rail's NIC, optic and cable (carrier, error counters, module readings,
BFD and echo probes), moves a rail's routing table and multipath groups off a
port that fails or degrades (within the detection time the config sets, and
never below it), moves them back after the port has proved itself again, and
reports each decision to linkpass-aggregator. Stopping it leaves the routes as
they are (fail-static)."""

EPILOG = """\
Query it and drain ports with linkpassctl (status, links, explain PORT,
drain PORT --reason TEXT, events). Signals: SIGHUP re-reads the config (a bad
one is refused and the running one kept); SIGTERM stops. One linkpassd per
run directory (run_dir/linkpassd.lock). The config is documented in
docs/config.md.

Exit status: 0 stopped by a signal; 1 --check-config found a problem, or
another linkpassd is running; 2 the config is bad at start; 3 --check-config:
the file is valid but the aggregator would refuse this host (host_id and
certificate differ), which does not stop linkpassd from protecting it."""


FD_RESERVE = 256  # state files, netlink and ethtool sockets, logs, the responder, grpc's own
FDS_PER_RAIL = 16  # a rail's probe sockets (echo, BFD sessions) with room


def fds_needed(config: Config) -> int:
    """Open files the configuration needs: the control socket's and the
    metrics endpoint's connection caps, probe sockets per rail, a reserve."""
    from linkpassd.adapters import metrics_http
    from linkpassd.adapters.control_access import MAX_CONNECTIONS
    return (MAX_CONNECTIONS + (metrics_http.MAX_CONNECTIONS if config.metrics_listen else 0)
            + FDS_PER_RAIL * len(config.rails) + FD_RESERVE)


def check_fd_limit(daemon: Daemon, config: Config) -> None:
    """Raise the soft open-file limit to the hard one; below what the config
    needs, warn and show it in `status` as a problem (the host is still
    protected: linkpassd never refuses to start over it)."""
    from linkpassd.adapters import fdlimit
    limit = fdlimit.raise_nofile(fds_needed(config))
    if limit.enough:
        log.info("fd_limit", limit=limit.soft, hard=limit.hard, needed=limit.needed, raised_from=limit.before)
        return
    log.warning("fd_limit_too_low", limit=limit.soft, hard=limit.hard, needed=limit.needed,
                detail=limit.describe())
    daemon.state_problems["open-file limit"] = Problem("fd_limit", "open-file limit", limit.describe(),
                                                       daemon.wallclock())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="linkpassd", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", metavar="FILE", default=None,
                        help=f"the config file (TOML) [default: {DEFAULT_CONFIG}]")
    parser.add_argument("--check-config", metavar="FILE", nargs="?", const=True, default=None,
                        help="check the config (FILE, or the --config file) and that the "
                             "aggregator would accept this host's certificate, without touching "
                             "the system; print OK or the problem, then exit")
    parser.add_argument("--version", action="version", version=linkpassd.__version__)
    args = parser.parse_args(argv)
    if args.check_config is not None:
        path = args.config or DEFAULT_CONFIG
        if isinstance(args.check_config, str):
            if args.config is not None and args.config != args.check_config:
                parser.error(f"--config {args.config} and --check-config {args.check_config} "
                             "name two files; give the file once")
            path = args.check_config
        return configmod.check_config_main(path)
    config_path = args.config or DEFAULT_CONFIG
    try:
        config = configmod.load_config(config_path)
        socket_problem = control_socket_problem(config.control_socket)
        if socket_problem:  # exit 2: the unit does not restart it in a loop
            raise configmod.ConfigError(config.source, "daemon.control_socket", socket_problem)
    except configmod.ConfigError as exc:
        print(f"linkpassd: {exc}", file=sys.stderr)
        return 2
    # Before anything is touched: a second daemon on this run directory
    # would fight the first over every route, socket and state file.
    lock = InstanceLock(config.run_dir)
    try:
        lock.acquire()
    except AlreadyRunning as exc:
        print(f"linkpassd: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"linkpassd: cannot take the lock {lock.path}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    logs.configure(config.log_format, config.log_level)
    daemon = Daemon(config, config_path)
    check_fd_limit(daemon, config)
    try:
        asyncio.run(daemon.run())
    except KeyboardInterrupt:
        pass
    except ControlSocketError as exc:  # one line, not a traceback
        log.error("control_socket_failed", error=str(exc))
        print(f"linkpassd: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
