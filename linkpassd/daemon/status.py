"""What the daemon reports about itself (the control API's status and explain,
the metrics), built from its state on demand. `StatusReport` only reads what
it is handed (the reconcile loop's state through `LoopState`, and the other
collaborators) and never changes it, so a status request can never change
what the host does.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import replace
from typing import Protocol

import linkpassd
from linkpassd.core import apply, explain, health, policy
from linkpassd.core.model import (
    Config,
    DaemonStatus,
    LinkSample,
    Op,
    OpticsReading,
    PortSensors,
    PortState,
    Problem,
    Unreadable,
)
from linkpassd.daemon.aggregator import AggregatorLink
from linkpassd.daemon.announcing import Announcements
from linkpassd.daemon.fencing import Fencing
from linkpassd.daemon.operations import EventRecorder
from linkpassd.daemon.probes import Probes
from linkpassd.daemon.statefiles import StateFiles


class LoopState(Protocol):
    """What a status report reads of the reconcile loop (daemon.loop.Daemon)."""

    config: Config
    started_wall: float
    links: dict[str, LinkSample]
    health: dict[str, health.PortHealth]
    decision: policy.Decision | None
    reconciles: int
    last_reconcile_at: float
    last_error: str
    last_error_at: float
    reconcile_failures: int
    foreign: tuple

    @property
    def failures(self) -> Mapping[Op, apply.Failure]: ...

    def clock(self) -> float: ...
    def wall_port_states(self, now: float) -> dict[str, PortState]: ...
    def to_wall(self) -> float: ...
    def netlink_writes(self) -> int: ...


class StatusReport:
    def __init__(self, loop: LoopState, probes: Probes, files: StateFiles, recorder: EventRecorder,
                 aggregator: AggregatorLink, announcements: Announcements,
                 fencing: Fencing) -> None:
        self.loop = loop
        self.probes = probes
        self.files = files
        self.recorder = recorder
        self.aggregator = aggregator
        self.announcements = announcements
        self.fencing = fencing

    def explain(self, port: str) -> explain.Explanation | None:
        v = self.loop
        if v.decision is None:
            return None
        e = explain.explain(v.config, v.decision, v.wall_port_states(v.clock()), port)
        return None if e is None else replace(e, paths=self.probes.path_assessments(port))

    def sensors(self) -> tuple[PortSensors, ...]:
        v = self.loop
        out = []
        for port, h in v.health.items():
            sig = h.signals
            reading = sig.optics.reading
            out.append(PortSensors(
                port=port,
                optics=reading if isinstance(reading, OpticsReading) else None,
                optics_unreadable=reading.reason if isinstance(reading, Unreadable) else "",
                counters=sig.counters.samples[-1][1] if sig.counters.samples else None,
                # Each echo path's own judgement after the rail's: its tolerance,
                # longest silence (the margin), the peer's hold and our stalls.
                assessments=sig.assessments(v.config.health) + self.probes.path_assessments(port)))
        return tuple(out)

    def status(self) -> DaemonStatus:
        v = self.loop
        now = v.clock()
        ports = tuple(v.wall_port_states(now).values())
        return DaemonStatus(
            hostname=socket.gethostname(),
            version=linkpassd.__version__,
            config_source=v.config.source,
            started_at=v.started_wall,
            ports=ports,
            links=tuple(v.links.values()),
            rails=v.decision.rails if v.decision else (),
            groups=v.decision.groups if v.decision else (),
            reconciles=v.reconciles,
            netlink_writes=v.netlink_writes(),
            last_reconcile_at=v.last_reconcile_at,
            last_error=v.last_error,
            sensors=self.sensors(),
            problems=self.problems(),
            responder=self.probes.responder_counters(),
            last_error_at=v.last_error_at,
            reconcile_failures=v.reconcile_failures,
            boot_id=self.recorder.boot_id,
            last_event_seq=self.recorder.feed.log.last_seq,
            aggregator=self.aggregator.status(),
        )

    def problems(self) -> tuple[Problem, ...]:
        """What the daemon cannot do right now, each with since when."""
        v = self.loop
        to_wall = v.to_wall()
        out = [Problem("conflict" if f.foreign else "refused", apply.describe(f.op), f.error,
                       f.since + to_wall, f.attempts)
               for f in sorted(v.failures.values(), key=lambda f: f.since)]
        out += self.probes.problems()
        out += list(self.files.problems.values())
        out += [Problem("foreign", f.description, f"protocol {f.protocol}, inside an owned range",
                        since) for f, since in v.foreign]
        out += self.probes.echo_port_problems()
        out += self.announcements.problems()
        out += self.fencing.problems()
        return tuple(out)
