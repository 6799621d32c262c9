"""The local control API: a grpc.aio server on a Unix socket.

The server owns no state. Each call asks `status_provider` for a fresh
`DaemonStatus` snapshot and maps it to protobuf, so the daemon never has to
push anything here and a slow client cannot hold the daemon's state.

Usage from the daemon (inside its running event loop):

    server = ControlServer(config.control_socket, daemon.status, daemon.explain)
    await server.start()
    ...
    await server.stop(grace=1.0)

ExplainPort asks `explain_provider(port)` the same way; None from it means
the port is not a configured rail's port (NOT_FOUND). Without a provider the
RPC answers UNIMPLEMENTED.

Sensor readings keep "not reported" apart from zero: a model None becomes an
unset `optional` field or sub-message, never 0 (see control.proto).

The standard grpc.health.v1 service is registered too: SERVING for "" and
"linkpass.v1.ControlService" while running, NOT_SERVING once stop() begins.
"""

from __future__ import annotations

import errno
import math
import os
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import structlog
from google.protobuf import struct_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from linkpassd._proto.linkpass.v1 import control_pb2 as pb
from linkpassd._proto.linkpass.v1 import control_pb2_grpc as pb_grpc
from linkpassd.core.explain import Consequence, Explanation
from linkpassd.core.model import (
    Assessment,
    CounterSample,
    DaemonStatus,
    GroupStatus,
    LinkSample,
    ModuleIdentity,
    OpticsReading,
    PortSensors,
    PortState,
    RailStatus,
    Thresholds,
    Verdict,
)

log = structlog.get_logger("linkpassd.control")

SOCKET_MODE = 0o660
SOCKET_DIR_MODE = 0o755
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ControlService"].full_name

# Explicit, so a new model verdict fails loudly here instead of going out as
# VERDICT_UNSPECIFIED.
_VERDICTS: dict[Verdict, int] = {
    Verdict.UP: pb.VERDICT_UP,
    Verdict.DEGRADED: pb.VERDICT_DEGRADED,
    Verdict.DOWN: pb.VERDICT_DOWN,
}


class ControlSocketError(RuntimeError):
    """The control socket path cannot be (safely) bound."""


# --------------------------------------------------------------------------
# model -> proto (pure; tested directly)
# --------------------------------------------------------------------------


def port_state_to_proto(state: PortState) -> pb.PortState:
    return pb.PortState(
        port=state.port,
        verdict=_VERDICTS[state.verdict],
        carrier=state.carrier,
        phase=state.phase,
        since=state.since,
        evidence=list(state.evidence),
    )


def link_sample_to_proto(sample: LinkSample) -> pb.LinkSample:
    return pb.LinkSample(
        port=sample.port,
        present=sample.present,
        ifindex=sample.ifindex,
        admin_up=sample.admin_up,
        carrier=sample.carrier,
        operstate=sample.operstate,
        carrier_up_count=sample.carrier_up_count,
        carrier_down_count=sample.carrier_down_count,
    )


def rail_status_to_proto(rail: RailStatus) -> pb.RailStatus:
    return pb.RailStatus(
        name=rail.name,
        port=rail.port,
        address=rail.address,
        table=rail.table,
        active_rail=rail.active_rail or "",  # None (no path) -> "", see proto
        active_port=rail.active_port or "",
    )


def group_status_to_proto(group: GroupStatus) -> pb.GroupStatus:
    return pb.GroupStatus(
        name=group.name,
        destination=group.destination,
        table=group.table,
        members=list(group.members),
        min_paths=group.min_paths,
    )


def _present(**fields: object) -> dict[str, object]:
    """Only the fields that have a value: None stays unset ('not reported')."""
    return {name: value for name, value in fields.items() if value is not None}


def _lanes(values: tuple[float | None, ...]) -> list[struct_pb2.Value]:
    """Per-lane readings as number-or-null Values; a non-finite reading (which
    JSON cannot carry) counts as not reported."""
    return [
        struct_pb2.Value(number_value=v)
        if v is not None and math.isfinite(v)
        else struct_pb2.Value(null_value=struct_pb2.NULL_VALUE)
        for v in values
    ]


def thresholds_to_proto(t: Thresholds) -> pb.Thresholds:
    return pb.Thresholds(
        **_present(high_alarm=t.high_alarm, high_warn=t.high_warn, low_warn=t.low_warn, low_alarm=t.low_alarm)
    )


def module_identity_to_proto(identity: ModuleIdentity) -> pb.ModuleIdentity:
    return pb.ModuleIdentity(
        spec=identity.spec,
        form_factor=identity.form_factor,
        vendor=identity.vendor,
        part=identity.part,
        serial=identity.serial,
        revision=identity.revision,
        spec_revision=identity.spec_revision,
    )


def optics_to_proto(reading: OpticsReading) -> pb.OpticsReading:
    return pb.OpticsReading(
        identity=module_identity_to_proto(reading.identity),
        **_present(temperature_c=reading.temperature_c, voltage_v=reading.voltage_v),
        tx_bias_ma=_lanes(reading.tx_bias_ma),
        tx_power_dbm=_lanes(reading.tx_power_dbm),
        rx_power_dbm=_lanes(reading.rx_power_dbm),
        # Later pairs win, as in OpticsReading.threshold().
        thresholds={quantity: thresholds_to_proto(t) for quantity, t in reading.thresholds},
        flags=sorted(reading.flags),
    )


def counters_to_proto(sample: CounterSample) -> pb.CounterSample:
    return pb.CounterSample(
        port=sample.port,
        **_present(
            rx_crc_errors=sample.rx_crc_errors,
            symbol_errors=sample.symbol_errors,
            length_errors=sample.length_errors,
            rx_missed=sample.rx_missed,
            fec_corrected=sample.fec_corrected,
            fec_uncorrectable=sample.fec_uncorrectable,
            link_down_events=sample.link_down_events,
            ext_state=sample.ext_state,
            ext_substate=sample.ext_substate,
        ),
    )


def assessment_to_proto(a: Assessment) -> pb.Assessment:
    return pb.Assessment(
        signal=a.signal,
        **_present(severity=None if a.severity is None else _VERDICTS[a.severity]),
        status=a.status,
        detail=a.detail,
        confirmed=a.confirmed,
    )


def port_sensors_to_proto(sensors: PortSensors) -> pb.PortSensors:
    return pb.PortSensors(
        port=sensors.port,
        **_present(
            optics=None if sensors.optics is None else optics_to_proto(sensors.optics),
            counters=None if sensors.counters is None else counters_to_proto(sensors.counters),
        ),
        optics_unreadable=sensors.optics_unreadable,
        assessments=[assessment_to_proto(a) for a in sensors.assessments],
    )


def consequence_to_proto(c: Consequence) -> pb.Consequence:
    return pb.Consequence(
        kind=c.kind,
        name=c.name,
        table=c.table,
        role=c.role,
        carries_port=c.carries_port,
        detail=c.detail,
    )


def explanation_to_proto(e: Explanation, *, served_at: float) -> pb.ExplainPortResponse:
    return pb.ExplainPortResponse(
        port=e.port,
        rail=e.rail,
        state=port_state_to_proto(e.state),
        consequences=[consequence_to_proto(c) for c in e.consequences],
        summary=e.summary,
        served_at=served_at,
    )


def status_to_proto(status: DaemonStatus, *, served_at: float) -> pb.DaemonStatus:
    return pb.DaemonStatus(
        hostname=status.hostname,
        version=status.version,
        config_source=status.config_source,
        started_at=status.started_at,
        ports=[port_state_to_proto(p) for p in status.ports],
        links=[link_sample_to_proto(s) for s in status.links],
        rails=[rail_status_to_proto(r) for r in status.rails],
        groups=[group_status_to_proto(g) for g in status.groups],
        reconciles=status.reconciles,
        netlink_writes=status.netlink_writes,
        last_reconcile_at=status.last_reconcile_at,
        last_error=status.last_error,
        last_error_at=status.last_error_at,
        reconcile_failures=status.reconcile_failures,
        responder=(pb.ResponderCounters(**vars(status.responder))
                        if status.responder is not None else None),
        problems=[pb.Problem(kind=p.kind, what=p.what, detail=p.detail, since=p.since,
                             attempts=p.attempts) for p in status.problems],
        served_at=served_at,
        sensors=[port_sensors_to_proto(s) for s in status.sensors],
    )


def links_to_proto(status: DaemonStatus, *, served_at: float) -> pb.ListLinksResponse:
    """One row per port: rail ports in config order, then any other reported port.

    All sub-messages are always set (a missing sample reads as present=false,
    a missing verdict as VERDICT_UNSPECIFIED, missing sensors as just the
    port) so JSON output has fixed keys.
    """
    order: dict[str, None] = {}
    for name in ([r.port for r in status.rails] + [p.port for p in status.ports] + [s.port for s in status.links]
                 + [s.port for s in status.sensors]):
        order.setdefault(name, None)
    samples = {s.port: s for s in status.links}
    states = {p.port: p for p in status.ports}
    sensors = {s.port: s for s in status.sensors}
    rows = []
    for port in order:
        sample = samples.get(port) or LinkSample.missing(port)
        state = port_state_to_proto(states[port]) if port in states else pb.PortState(port=port)
        rows.append(
            pb.Link(
                port=port,
                rails=[r.name for r in status.rails if r.port == port],
                link=link_sample_to_proto(sample),
                state=state,
                sensors=port_sensors_to_proto(sensors.get(port) or PortSensors(port=port)),
            )
        )
    return pb.ListLinksResponse(links=rows, served_at=served_at)


# --------------------------------------------------------------------------
# the server
# --------------------------------------------------------------------------


ExplainProvider = Callable[[str], Explanation | None]


class _ControlServicer(pb_grpc.ControlServiceServicer):
    def __init__(
        self,
        status_provider: Callable[[], DaemonStatus],
        explain_provider: ExplainProvider | None,
        wall_clock: Callable[[], float],
    ) -> None:
        self._status_provider = status_provider
        self._explain_provider = explain_provider
        self._wall_clock = wall_clock

    async def _snapshot(self, context: grpc.aio.ServicerContext) -> DaemonStatus:
        try:
            return self._status_provider()
        except Exception as exc:  # a provider bug must not look like a dead daemon
            log.exception("control_status_failed", error=str(exc))
            await context.abort(grpc.StatusCode.INTERNAL, f"status unavailable: {exc}")
            raise  # unreachable: abort raises

    async def GetStatus(self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext) -> pb.GetStatusResponse:
        status = await self._snapshot(context)
        return pb.GetStatusResponse(status=status_to_proto(status, served_at=self._wall_clock()))

    async def ListLinks(self, request: pb.ListLinksRequest, context: grpc.aio.ServicerContext) -> pb.ListLinksResponse:
        status = await self._snapshot(context)
        return links_to_proto(status, served_at=self._wall_clock())

    async def ExplainPort(self, request: pb.ExplainPortRequest, context: grpc.aio.ServicerContext) -> pb.ExplainPortResponse:
        port = request.port
        if self._explain_provider is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this linkpassd serves no port explanations")
        if not port:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no port given")
        try:
            explanation = self._explain_provider(port)
        except Exception as exc:  # as in _snapshot: a provider bug is INTERNAL, not "unknown port"
            log.exception("control_explain_failed", port=port, error=str(exc))
            await context.abort(grpc.StatusCode.INTERNAL, f"explanation of {port!r} unavailable: {exc}")
            raise  # unreachable: abort raises
        if explanation is None:
            code, message = self._why_no_explanation(port)
            await context.abort(code, message)
        return explanation_to_proto(explanation, served_at=self._wall_clock())

    def _why_no_explanation(self, port: str) -> tuple[grpc.StatusCode, str]:
        """NOT_FOUND naming the rail ports, unless `port` is one of them (then
        the daemon has not judged it yet)."""
        try:
            rails = self._status_provider().rails
        except Exception as exc:  # the answer is still NOT_FOUND, just without the list
            log.warning("control_status_failed", error=str(exc))
            return grpc.StatusCode.NOT_FOUND, f"unknown port {port!r}"
        configured = list(dict.fromkeys(r.port for r in rails))
        if port in configured:
            return (grpc.StatusCode.FAILED_PRECONDITION,
                    f"port {port!r} has not been judged yet; try again in a moment")
        if not configured:
            return grpc.StatusCode.NOT_FOUND, f"unknown port {port!r}; linkpassd reports no rails yet"
        return grpc.StatusCode.NOT_FOUND, f"unknown port {port!r}; configured rail ports: {', '.join(configured)}"


class ControlServer:
    """gRPC control API on a Unix socket (mode 0660).

    The providers' times must be unix seconds, PortState.since included (the
    proto says so; the daemon converts from its monotonic clock).
    `explain_provider(port)` returns None for a port that is not a configured
    rail's port; without one, ExplainPort answers UNIMPLEMENTED. `wall_clock`
    stamps each answer's `served_at`; tests inject a fixed one.
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        status_provider: Callable[[], DaemonStatus],
        explain_provider: ExplainProvider | None = None,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.socket_path = Path(socket_path).absolute()
        self._servicer = _ControlServicer(status_provider, explain_provider, wall_clock)
        self._server: grpc.aio.Server | None = None
        self._health: health.aio.HealthServicer | None = None
        self._socket_inode: tuple[int, int] | None = None

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("control server already started")
        _prepare_socket_path(self.socket_path)
        server = grpc.aio.server()
        pb_grpc.add_ControlServiceServicer_to_server(self._servicer, server)
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        await self._health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        try:
            # add_insecure_port raises RuntimeError when binding fails.
            server.add_insecure_port(f"unix:{self.socket_path}")
            await server.start()
            # The socket appears with umask permissions (owner-only for write,
            # so nobody else can connect meanwhile); open it to the group now.
            os.chmod(self.socket_path, SOCKET_MODE)
            st = os.stat(self.socket_path)
        except BaseException:
            await server.stop(None)
            raise
        self._socket_inode = (st.st_dev, st.st_ino)
        self._server = server

    async def stop(self, grace: float | None = 1.0) -> None:
        """Answer in-flight calls for up to `grace` seconds, then close and
        remove our socket file (only if it is still the one we bound)."""
        server, self._server = self._server, None
        if server is None:
            return
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        await server.stop(grace)
        try:
            st = os.stat(self.socket_path)
            if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == self._socket_inode:
                os.unlink(self.socket_path)
        except FileNotFoundError:
            pass

    async def wait_for_termination(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()


def _prepare_socket_path(path: Path) -> None:
    """Create the parent dir (0755) and clear a stale socket.

    Refuses to remove anything that is not a socket, or a socket that another
    process still answers on (a second daemon must not steal the first one's
    socket).
    """
    parent = path.parent
    if not parent.exists():
        parent.mkdir(parents=True, exist_ok=True)
        os.chmod(parent, SOCKET_DIR_MODE)  # mkdir's mode is subject to umask
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ControlSocketError(f"{path} exists and is not a socket; not removing it")
    if _socket_is_live(path):
        raise ControlSocketError(f"{path} is in use by another process (is linkpassd already running?)")
    os.unlink(path)


def _socket_is_live(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            return False
        raise ControlSocketError(f"cannot probe {path}: {exc.strerror}") from exc
    finally:
        probe.close()
    return True
