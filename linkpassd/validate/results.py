"""What hosts report and what localisation finds, as plain values.

Why not use the protobuf messages directly: the localiser is pure and tested
with synthetic fabrics; frozen dataclasses compare by value, print readably
and cannot be half-set. Each mirrors its message in fleet.proto and converts
both ways, so the aggregator (which holds messages) and the tests (which
build values) meet at one boundary.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from linkpassd._proto.linkpass.v1 import fleet_pb2

OK = "ok"


@dataclass(frozen=True)
class PortCheck:
    port: str
    rail: str
    carrier: bool = True
    speed_mbps: int = 0  # 0: unknown
    lldp_system: str = ""
    lldp_port: str = ""
    lldp_source: str = ""  # "lldpd", "wire" or "" (none seen)
    optics_problems: tuple[str, ...] = ()
    counters_rising: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_proto(cls, m: fleet_pb2.PortCheck) -> PortCheck:
        return cls(port=m.port, rail=m.rail, carrier=m.carrier, speed_mbps=m.speed_mbps,
                   lldp_system=m.lldp_system, lldp_port=m.lldp_port, lldp_source=m.lldp_source,
                   optics_problems=tuple(m.optics_problems), counters_rising=dict(m.counters_rising))

    def to_proto(self) -> fleet_pb2.PortCheck:
        return fleet_pb2.PortCheck(port=self.port, rail=self.rail, carrier=self.carrier, speed_mbps=self.speed_mbps,
                                   lldp_system=self.lldp_system, lldp_port=self.lldp_port,
                                   lldp_source=self.lldp_source, optics_problems=list(self.optics_problems),
                                   counters_rising=dict(self.counters_rising))


@dataclass(frozen=True)
class PairResult:
    """One probed pair as its sender reports it: the low-rate phase (sent,
    received, RTT), the high-rate burst phase, and the source ports (flows)
    the probes were spread over and how many of them got no reply at all."""

    rail: str
    peer: str
    peer_host: str
    sent: int = 0
    received: int = 0
    rtt_p50_us: int = 0
    rtt_p99_us: int = 0
    burst_sent: int = 0
    burst_received: int = 0
    flows: int = 0  # 0: not counted (an older host)
    flows_silent: int = 0
    # Which way lost probes were lost (core.direction); False: no receipts, round trip only.
    requests_lost: int = 0
    replies_lost: int = 0
    receipts: bool = False

    @classmethod
    def from_proto(cls, m: fleet_pb2.PairResult) -> PairResult:
        return cls(rail=m.rail, peer=m.peer, peer_host=m.peer_host, sent=m.sent, received=m.received,
                   rtt_p50_us=m.rtt_p50_us, rtt_p99_us=m.rtt_p99_us, burst_sent=m.burst_sent,
                   burst_received=m.burst_received, flows=m.flows, flows_silent=m.flows_silent,
                   requests_lost=m.requests_lost, replies_lost=m.replies_lost, receipts=m.receipts)

    def to_proto(self) -> fleet_pb2.PairResult:
        return fleet_pb2.PairResult(rail=self.rail, peer=self.peer, peer_host=self.peer_host, sent=self.sent,
                                    received=self.received, rtt_p50_us=self.rtt_p50_us, rtt_p99_us=self.rtt_p99_us,
                                    burst_sent=self.burst_sent, burst_received=self.burst_received,
                                    flows=self.flows, flows_silent=self.flows_silent,
                                    requests_lost=self.requests_lost, replies_lost=self.replies_lost,
                                    receipts=self.receipts)


@dataclass(frozen=True)
class HostValidation:
    run_id: str = ""
    ports: tuple[PortCheck, ...] = ()
    pairs: tuple[PairResult, ...] = ()
    problems: tuple[str, ...] = ()  # checks that did not run
    notes: tuple[str, ...] = ()  # checks that ran, weakened (e.g. fewer probes sent than planned)

    @classmethod
    def from_proto(cls, m: fleet_pb2.HostValidation) -> HostValidation:
        return cls(run_id=m.run_id, ports=tuple(PortCheck.from_proto(p) for p in m.ports),
                   pairs=tuple(PairResult.from_proto(p) for p in m.pairs), problems=tuple(m.problems),
                   notes=tuple(m.notes))

    def to_proto(self) -> fleet_pb2.HostValidation:
        return fleet_pb2.HostValidation(run_id=self.run_id, ports=[p.to_proto() for p in self.ports],
                                        pairs=[p.to_proto() for p in self.pairs], problems=list(self.problems),
                                        notes=list(self.notes))


@dataclass(frozen=True)
class HostResult:
    """One host's part of a run: "ok" with its validation, or why none."""

    host: str
    status: str = OK
    validation: HostValidation | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK and self.validation is not None

    @classmethod
    def from_proto(cls, m: fleet_pb2.HostValidationResult) -> HostResult:
        return cls(host=m.host_id, status=m.status,
                   validation=HostValidation.from_proto(m.validation) if m.HasField("validation") else None)

    def to_proto(self) -> fleet_pb2.HostValidationResult:
        out = fleet_pb2.HostValidationResult(host_id=self.host, status=self.status)
        if self.validation is not None:
            out.validation.CopyFrom(self.validation.to_proto())
        return out


@dataclass(frozen=True)
class Finding:
    """What is most likely at fault, why, and how sure (fleet_pb2.Finding)."""

    kind: str
    component: str
    hosts: tuple[str, ...] = ()
    ports: tuple[str, ...] = ()
    rail: str = ""
    evidence: tuple[str, ...] = ()
    confidence: float = 0.0
    fix: str = ""

    @classmethod
    def from_proto(cls, m: fleet_pb2.Finding) -> Finding:
        return cls(kind=m.kind, component=m.component, hosts=tuple(m.hosts), ports=tuple(m.ports), rail=m.rail,
                   evidence=tuple(m.evidence), confidence=m.confidence, fix=m.fix)

    def to_proto(self) -> fleet_pb2.Finding:
        return fleet_pb2.Finding(kind=self.kind, component=self.component, hosts=list(self.hosts),
                                 ports=list(self.ports), rail=self.rail, evidence=list(self.evidence),
                                 confidence=self.confidence, fix=self.fix)


def host_results(items: Iterable[HostResult | fleet_pb2.HostValidationResult]
                 | Mapping[str, HostValidation]) -> list[HostResult]:
    """Accept what callers hold: HostResults, messages, or host -> validation."""
    if isinstance(items, Mapping):
        return [HostResult(host, OK, v) for host, v in items.items()]
    return [i if isinstance(i, HostResult) else HostResult.from_proto(i) for i in items]
