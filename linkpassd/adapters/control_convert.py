"""Model -> protobuf for the control API (pure; tested directly).

Sensor readings keep "not reported" apart from zero: a model None becomes an
unset `optional` field or sub-message, never 0 (see control.proto).  Times
that are new in the API (drains, events, the health document) are
google.protobuf.Timestamp; older ones stay unix-seconds doubles, as the proto
documents.
"""

from __future__ import annotations

import math

from google.protobuf import struct_pb2, timestamp_pb2

from linkpassd._proto.linkpass.v1 import control_pb2 as pb
from linkpassd.core.events import Event, EventKind, Severity
from linkpassd.core.explain import Consequence, Explanation
from linkpassd.core.fence import View as FenceView
from linkpassd.core.healthdoc import HealthDoc, PortHealthRow
from linkpassd.core.model import (
    Assessment,
    CounterSample,
    DaemonStatus,
    Drain,
    GroupStatus,
    LinkSample,
    ModuleIdentity,
    OneWayDelay,
    OpticsReading,
    PortSensors,
    PortState,
    RailStatus,
    Thresholds,
    Verdict,
)

# Explicit, so a new model verdict fails loudly here instead of going out as
# VERDICT_UNSPECIFIED.
_VERDICTS: dict[Verdict, int] = {
    Verdict.UP: pb.VERDICT_UP,
    Verdict.DEGRADED: pb.VERDICT_DEGRADED,
    Verdict.DOWN: pb.VERDICT_DOWN,
}


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
        drain=None if state.drain is None else drain_to_proto(state.drain),
        hold_until=state.hold_until,
    )


def timestamp(unix: float) -> timestamp_pb2.Timestamp:
    """Unix seconds as a Timestamp (nanosecond resolution)."""
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(round(unix * 1e9))
    return ts


def drain_to_proto(drain: Drain) -> pb.DrainInfo:
    return pb.DrainInfo(
        reason=drain.reason,
        by=drain.by,
        since=timestamp(drain.at),
        until=None if drain.until is None else timestamp(drain.until),
    )


def fence_to_proto(v: FenceView) -> pb.FenceInfo:
    return pb.FenceInfo(port=v.port, rail=v.rail, state=str(v.state), reason=v.reason,
                        since=v.since, until=v.until, backoff_s=v.backoff_s, held=v.held,
                        fences=v.fences, summary=v.summary)


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


def one_way_to_proto(d: OneWayDelay) -> pb.OneWayDelay:
    return pb.OneWayDelay(
        **_present(towards_s=d.towards_s, back_s=d.back_s, bound_s=d.bound_s),
        clocks=d.clocks,
        refused=d.refused,
        samples=d.samples,
    )


def assessment_to_proto(a: Assessment) -> pb.Assessment:
    return pb.Assessment(
        signal=a.signal,
        **_present(severity=None if a.severity is None else _VERDICTS[a.severity],
                   one_way=None if a.one_way is None else one_way_to_proto(a.one_way)),
        status=a.status,
        detail=a.detail,
        confirmed=a.confirmed,
        direction=a.direction,
        witnesses=a.witnesses,
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
        paths=[assessment_to_proto(a) for a in e.paths],
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
        boot_id=status.boot_id,
        last_event_seq=status.last_event_seq,
        aggregator=(pb.AggregatorLink(**vars(status.aggregator))
                    if status.aggregator is not None else None),
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


# Built from the model's enums, so a kind or severity the proto lacks fails at
# import instead of going out as *_UNSPECIFIED.
_EVENT_KINDS: dict[EventKind, int] = {k: pb.EventKind.Value(f"EVENT_KIND_{k.name}") for k in EventKind}
_SEVERITIES: dict[Severity, int] = {s: pb.Severity.Value(f"SEVERITY_{s.name}") for s in Severity}


def event_to_proto(event: Event) -> pb.Event:
    return pb.Event(
        boot_id=event.boot_id,
        seq=event.seq,
        time=timestamp(event.wall),
        monotonic_s=event.mono,
        kind=_EVENT_KINDS[event.kind],
        severity=_SEVERITIES[event.severity],
        name=event.name,
        port=event.port,
        rail=event.rail,
        message=event.message,
        fields=dict(event.fields),  # a repeated key: the later value wins
    )


def port_health_to_proto(row: PortHealthRow) -> pb.PortHealth:
    return pb.PortHealth(
        port=row.port,
        rail=row.rail,
        rdma_device=row.rdma_device,
        rdma_port=row.rdma_port,
        verdict=pb.VERDICT_UNSPECIFIED if row.verdict is None else _VERDICTS[row.verdict],
        # Not judged yet: no time (unset), rather than 1970.
        since=timestamp(row.since) if row.verdict is not None and row.since > 0 else None,
        reason=row.reason,
        drained=row.drained,
        usable=row.usable,
    )


def health_to_proto(doc: HealthDoc) -> pb.WatchHealthResponse:
    return pb.WatchHealthResponse(
        hostname=doc.hostname,
        boot_id=doc.boot_id,
        generation=doc.generation,
        written_at=timestamp(doc.written_at),
        valid_until=timestamp(doc.valid_until),
        ports=[port_health_to_proto(row) for row in doc.ports],
    )
