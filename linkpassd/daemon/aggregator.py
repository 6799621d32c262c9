"""The daemon's side of the aggregator stream: `AggregatorLink`, a
collaborator of the reconcile loop (daemon.loop), handed what it needs.

What it does for the loop is constant time and never waits:
- `offer(events)`: each recorded event goes to the spool writer's bounded
  hand-off (agent.spool.SpoolWriter); the EventRecorder calls it;
- `after_pass()`: tells the agent a pass ended (it builds a report later, in
  its own time, if it is due);
- probe peers from the aggregator land in `mesh_slot` (the newest only) and
  one `MeshPeersChanged` on the daemon's queue, at most one pending; the loop
  then calls `take_mesh_peers()` and, when they changed, makes its probes
  follow them (daemon.probes: the union with the config's probe_peers;
  probers of peers that stay keep running);
- a drain or undrain command goes through the same drain queue as the
  control API (daemon.operations.Drains), and its answer goes back;
- a validate command (fleet validation) runs the host's checks and probes
  (adapters.hostcheck) in a task of its own, one at a time, bounded by its
  duration + VALIDATION_MARGIN_S; the reconcile loop never waits for it (the
  probes run on their own thread).

The agent runs in one supervised task (`run`): whatever it raises is logged
and it starts again; a reload that changes [aggregator] restarts it (the
spool, with everything unacknowledged, is kept), with the aggregator replica
that last worked first when it is still listed.
"""
from __future__ import annotations

import asyncio
import math
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc
import structlog

from linkpassd._proto.linkpass.v1 import fleet_pb2
from linkpassd.adapters import hostcheck
from linkpassd.adapters.feeds import Latest
from linkpassd.adapters.sensor import Sensor
from linkpassd.agent import reports
from linkpassd.agent.client import AgentClient, is_refusal
from linkpassd.agent.spool import Spool, SpoolWriter
from linkpassd.core.drain import DrainError, DrainNotTaken, DrainPending, NotDrained, UnknownPort
from linkpassd.core.events import Event
from linkpassd.core.model import AgentLinkStatus, Config, DrainOutcome, PortState
from linkpassd.daemon.statefiles import StateFiles

log = structlog.get_logger("linkpassd")

SPOOL_DIR = "spool"  # in the state directory
AGENT_RESTART_S = 5.0  # after the agent task itself failed (a bug): start it again this late
MAX_REASON = 1024
# A validation answers by duration_s + this (start and end readings, a slow
# sensor); the aggregator waits longer (aggregator.validation.ANSWER_MARGIN_S).
VALIDATION_MARGIN_S = 10.0


@dataclass(frozen=True)
class MeshPeersChanged:
    """The aggregator handed down new probe peers (in `AggregatorLink.mesh_slot`)."""


class DaemonSide(Protocol):
    """What the link reads of the daemon: its reports and its sensor."""

    def inventory(self) -> fleet_pb2.Inventory: ...
    def port_report(self) -> fleet_pb2.PortReport: ...
    def current_sensor(self) -> Sensor | None: ...


class DrainControl(Protocol):
    """The drain path (daemon.operations.Drains)."""

    async def drain(self, port: str, reason: str, duration_s: float | None,
                    by: str) -> DrainOutcome: ...
    async def undrain(self, port: str, by: str) -> PortState: ...


class DaemonHost:
    """What the agent sees of the daemon (agent.client.AgentHost)."""

    def __init__(self, link: AggregatorLink) -> None:
        self.link = link

    def inventory(self) -> fleet_pb2.Inventory:
        return self.link.daemon.inventory()

    def port_report(self) -> fleet_pb2.PortReport:
        return self.link.daemon.port_report()

    def take_peers(self, message: fleet_pb2.ProbePeers) -> None:
        self.link.offer_mesh_peers(message)

    def take_fence_grants(self, ports: list[str] | None) -> None:
        self.link.fence_grants(ports)

    async def command(self, command: fleet_pb2.Command
                      ) -> tuple[int, str] | tuple[int, str, fleet_pb2.HostValidation]:
        return await self.link.command(command)


def _code(status: grpc.StatusCode) -> int:
    return status.value[0]


class AggregatorLink:
    """`config()`: the running config, read at each use (a reload replaces
    it); `post`: puts a MeshPeersChanged on the daemon's queue."""

    def __init__(self, config: Callable[[], Config], daemon: DaemonSide, drains: DrainControl,
                 files: StateFiles, post: Callable[[MeshPeersChanged], None],
                 boot_id: str) -> None:
        self._config = config
        self.daemon = daemon
        self.drains = drains
        self.files = files
        self.post = post
        self.boot_id = boot_id
        self.host = DaemonHost(self)
        # Where the aggregator's fence grants go (the loop sets Fencing.granted).
        self.on_fence_grants: Callable[[list[str] | None], None] = lambda ports: None
        self.agent: AgentClient | None = None
        self.spool: Spool | None = None
        self.spool_writer: SpoolWriter | None = None
        self.mesh_peers: dict[str, tuple[str, ...]] = {}  # applied: rail -> peers
        self.mesh_probers: dict[str, tuple[str, ...]] = {}  # applied: rail -> who probes us
        # handed down, not applied yet: (peers, probers)
        self.mesh_slot: Latest[tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]] = Latest()
        self.mesh_message: fleet_pb2.ProbePeers | None = None
        self.mesh_problems: tuple[str, ...] = ()
        self._mesh_nudged = False
        self._agent_changed: asyncio.Event | None = None
        self.validation_task: asyncio.Task | None = None  # the running validation, if any
        self.validation_run = ""

    @property
    def config(self) -> Config:
        return self._config()

    # ------------------------------------------------------------ spool

    def open_spool(self) -> None:
        """The hand-off exists from the start, so the `started` event is kept;
        the spool itself is read on its own thread (agent.spool)."""
        settings = self.config.aggregator
        if settings is None or self.spool is not None:
            return
        self.spool = Spool(os.path.join(self.config.state_dir, SPOOL_DIR),
                           settings.spool_max_events)
        self.spool_writer = SpoolWriter(self.spool)

    def offer(self, events: Sequence[Event]) -> None:
        if self.spool_writer is not None and self.config.aggregator is not None and events:
            self.spool_writer.offer(events)

    def after_pass(self) -> None:
        if self.agent is not None:
            self.agent.poke()

    def status(self) -> AgentLinkStatus | None:
        """Whether this host reports to the fleet, and if not, why (status,
        metrics). None when no [aggregator] is configured. Reads plain
        attributes only: never waits for the spool's thread."""
        settings = self.config.aggregator
        if settings is None:
            return None
        agent = self.agent
        pending, size = self.spool.counts if self.spool is not None else (0, 0)
        dropped = (self.spool.dropped if self.spool is not None else 0) + \
            (self.spool_writer.dropped if self.spool_writer is not None else 0)
        if agent is None:  # starting, or restarting after a reload
            return AgentLinkStatus(host_id=settings.host_id or socket.gethostname(),
                                   address=settings.addresses[0], spool_events=pending,
                                   spool_bytes=size, events_dropped=dropped)
        status, error = agent.last_failure or ("", "")
        return AgentLinkStatus(
            host_id=agent.host_id, address=agent.address, connected=agent.connected,
            refused=not agent.connected and bool(status) and is_refusal(status, error),
            last_status=status, last_error=error, connected_at=agent.connected_at,
            last_failure_at=agent.last_failure_at, last_ack_at=agent.last_ack_at,
            spool_events=pending, spool_bytes=size, events_sent=agent.events_sent,
            events_acked=agent.events_acked, events_dropped=dropped)

    def close(self) -> None:
        """At shutdown: what waits in the hand-off (the `stopped` event) is written."""
        if self.spool_writer is not None:
            self.spool_writer.flush()
        if self.spool is not None:
            self.spool.close()

    # ------------------------------------------------------------ the task

    async def run(self) -> None:
        """The agent, as [aggregator] says, for as long as the daemon runs."""
        self._agent_changed = asyncio.Event()
        writer: asyncio.Task | None = None
        last_worked: str | None = None  # a restarted agent starts with the replica that worked
        try:
            while True:
                settings = self.config.aggregator
                if settings is None:
                    await self._agent_changed.wait()
                    self._agent_changed.clear()
                    continue
                self.open_spool()
                if writer is None or writer.done():
                    writer = asyncio.create_task(self._run_spool_writer(), name="spool-writer")
                self.agent = AgentClient(settings, self.spool, self.host,
                                         boot_id=self.boot_id,
                                         dropped=lambda: self.spool_writer.dropped,
                                         start_address=last_worked)
                self.spool_writer.on_written = self.agent.wake
                run = asyncio.create_task(self.agent.run(), name="agent")
                changed = asyncio.create_task(self._agent_changed.wait())
                try:
                    await asyncio.wait({run, changed}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    run.cancel()
                    changed.cancel()
                    await asyncio.gather(run, changed, return_exceptions=True)
                if self.agent is not None:
                    last_worked = self.agent.last_worked or last_worked
                self.agent = None
                self._agent_changed.clear()
                if run.done() and not run.cancelled() and run.exception() is not None:
                    log.error("agent_failed", error=repr(run.exception()),
                              retry_s=AGENT_RESTART_S, exc_info=run.exception())
                    await asyncio.sleep(AGENT_RESTART_S)
        finally:
            self.agent = None
            if writer is not None:
                writer.cancel()
                await asyncio.gather(writer, return_exceptions=True)

    async def _run_spool_writer(self) -> None:
        while True:
            try:
                await self.spool_writer.run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a disk must not end the daemon
                log.error("spool_failed", error=repr(exc), retry_s=AGENT_RESTART_S)
                await asyncio.sleep(AGENT_RESTART_S)

    def reloaded(self, old: Config) -> None:
        """In a reload, before the probes follow the config: a changed
        [aggregator] restarts the agent (the spool is kept); the mesh's
        peers are checked again against the new rails."""
        new = self.config.aggregator
        if old.aggregator != new:
            log.info("aggregator_config_changed",
                     addresses=list(new.addresses) if new is not None else "none (standalone)")
            if self.spool is not None and new is not None \
                    and new.spool_max_events != self.spool.max_events:
                self.spool.submit(self.spool.set_max_events, new.spool_max_events)
            if self._agent_changed is not None:
                self._agent_changed.set()
        if self.mesh_message is not None:  # before the probes use them with the new rails
            self.mesh_peers, _problems = reports.validate_peers(self.config, self.mesh_message)
            self.mesh_probers, _problems = reports.validate_probers(self.config, self.mesh_message)
            self.mesh_slot.publish((self.mesh_peers, self.mesh_probers))

    # ------------------------------------------------------------ probe mesh

    def restore_mesh(self) -> None:
        """At start, before the probes are made: the probe peers of the last
        plan applied (mesh.json), checked against this config like a plan
        just received. Standalone daemons ([aggregator] absent) have no mesh
        and ignore the file."""
        if self.config.aggregator is None:
            return
        saved = self.files.load_mesh()
        if saved is None:
            return
        message, written_at = saved
        self.mesh_message = message
        self.mesh_peers, problems = reports.validate_peers(self.config, message)
        self.mesh_probers, prober_problems = reports.validate_probers(self.config, message)
        self.mesh_slot.publish((self.mesh_peers, self.mesh_probers))
        log.info("mesh_peers_restored", generation=message.generation, written_at=written_at,
                 peers=sum(len(p) for p in self.mesh_peers.values()),
                 probed_by=sum(len(p) for p in self.mesh_probers.values()),
                 ignored=len(problems) + len(prober_problems))

    def save_mesh(self) -> None:
        """After the pass: mesh.json follows the applied plan."""
        if self.config.aggregator is not None:
            self.files.save_mesh(self.mesh_message)

    def fence_grants(self, ports: list[str] | None) -> None:
        """The aggregator's fence grants ([fence]); None: the stream ended."""
        self.on_fence_grants(ports)

    def offer_mesh_peers(self, message: fleet_pb2.ProbePeers) -> None:
        """From the agent: keep the newest; the next pass applies it."""
        self.mesh_message = message
        usable, problems = reports.validate_peers(self.config, message)
        probers, prober_problems = reports.validate_probers(self.config, message)
        problems += prober_problems
        if tuple(problems) != self.mesh_problems:
            self.mesh_problems = tuple(problems)
            for problem in problems[:20]:
                log.warning("aggregator_peer_ignored", problem=problem)
            if len(problems) > 20:
                log.warning("aggregator_peers_ignored", more=len(problems) - 20)
        if usable and not self.config.probes.enabled:
            log.warning("aggregator_peers_unused", note="[probes] enabled is false")
        self.mesh_slot.publish((usable, probers))
        if not self._mesh_nudged:
            self._mesh_nudged = True
            self.post(MeshPeersChanged())

    def take_mesh_peers(self) -> bool:
        """In the reconcile loop: the newest peers are the ones to probe from
        now on. True when they changed (the loop makes its probes follow)."""
        self._mesh_nudged = False
        peers, probers = self.mesh_slot.value or ({}, {})
        if (peers, probers) == (self.mesh_peers, self.mesh_probers):
            return False
        self.mesh_peers, self.mesh_probers = peers, probers
        log.info("mesh_peers_applied", generation=getattr(self.mesh_message, "generation", 0),
                 peers=sum(len(p) for p in peers.values()),
                 probed_by=sum(len(p) for p in probers.values()))
        return True

    # ------------------------------------------------------------ commands

    async def command(self, command: fleet_pb2.Command
                             ) -> tuple[int, str] | tuple[int, str, fleet_pb2.HostValidation]:
        """A fleet drain/undrain, through the control API's drain path; the
        answer as a gRPC status code and message (control_server's mapping).
        A validation answers with its HostValidation as a third element."""
        by = f"{command.by[:128] or 'an operator'} via the aggregator"
        action = command.WhichOneof("action")
        if action == "validate":
            return await self._validate(command.validate, by)
        try:
            if action == "drain":
                d = command.drain
                if not d.port:
                    return _code(grpc.StatusCode.INVALID_ARGUMENT), "no port given"
                if not math.isfinite(d.duration_s) or d.duration_s < 0:
                    return (_code(grpc.StatusCode.INVALID_ARGUMENT),
                            f"duration_s must be 0 (until undrained) or more, not {d.duration_s!r}")
                outcome = await self.drains.drain(d.port, d.reason[:MAX_REASON], d.duration_s or None, by)
                said = [f"{d.port} drained"]
                if outcome.replaced is not None:
                    said.append(f"replaces the drain by {outcome.replaced.by}")
                return _code(grpc.StatusCode.OK), "; ".join(said + list(outcome.notes))
            if action == "undrain":
                if not command.undrain.port:
                    return _code(grpc.StatusCode.INVALID_ARGUMENT), "no port given"
                await self.drains.undrain(command.undrain.port, by)
                return _code(grpc.StatusCode.OK), f"{command.undrain.port} undrained"
            return _code(grpc.StatusCode.INVALID_ARGUMENT), "a command with no action"
        except (UnknownPort, NotDrained) as exc:
            return _code(grpc.StatusCode.NOT_FOUND), str(exc)
        except DrainPending as exc:
            return _code(grpc.StatusCode.ABORTED), str(exc)
        except DrainNotTaken as exc:
            return _code(grpc.StatusCode.UNAVAILABLE), str(exc)
        except DrainError as exc:
            return _code(grpc.StatusCode.INVALID_ARGUMENT), str(exc)

    # ------------------------------------------------------------ validation

    def _validation_context(self, sensor: Sensor) -> hostcheck.HostContext:
        """The rails, sensor and policy as they are now (a reload later does
        not change a running validation)."""
        config = self.config
        return hostcheck.HostContext(
            rails=tuple(hostcheck.RailPort(r.name, r.port, r.address) for r in config.rails),
            sensor=sensor, policy=config.health, echo_port=config.probes.port)

    async def _validate(self, request: fleet_pb2.ValidateHost, by: str
                              ) -> tuple[int, str] | tuple[int, str, fleet_pb2.HostValidation]:
        """One validation at a time per host: a second gets ABORTED while the
        first runs. The run is a task of its own, cancelled if it outlives
        duration + VALIDATION_MARGIN_S or nobody waits for its answer."""
        errors = hostcheck.request_errors(request)
        if errors:
            return _code(grpc.StatusCode.INVALID_ARGUMENT), "; ".join(errors)[:MAX_REASON]
        if self.validation_task is not None and not self.validation_task.done():
            return (_code(grpc.StatusCode.ABORTED),
                    f"a validation is running (run {self.validation_run[:64] or '?'})")
        sensor = self.daemon.current_sensor()
        if sensor is None:
            return _code(grpc.StatusCode.UNAVAILABLE), "linkpassd is still starting"
        run = request.run_id[:128]
        task = asyncio.create_task(hostcheck.validate_host(request, self._validation_context(sensor)),
                                   name=f"validate-{run}")
        self.validation_task, self.validation_run = task, run
        log.info("validation_started", run_id=run, by=by, duration_s=request.duration_s,
                 ports=len(request.ports), targets=len(request.targets))
        limit = request.duration_s + VALIDATION_MARGIN_S
        try:
            # asyncio.timeout, not wait_for (agent.client: a cancel may be dropped
            # by wait_for on 3.11); awaiting the task passes a cancel on to it.
            async with asyncio.timeout(limit):
                result = await task
        except TimeoutError:
            log.error("validation_timed_out", run_id=run, after_s=limit)
            return (_code(grpc.StatusCode.DEADLINE_EXCEEDED),
                    f"the validation did not finish within {limit:g} s")
        finally:
            if not task.done():  # our caller was cancelled: nobody waits for the answer
                task.cancel()
        log.info("validation_finished", run_id=run, problems=len(result.problems),
                 pairs=len(result.pairs))
        return _code(grpc.StatusCode.OK), f"validated {len(result.ports)} ports, " \
            f"{len(result.pairs)} pairs", result
