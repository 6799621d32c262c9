"""What the daemon reports about itself (the control API's status, links and
explain), built from its state on demand. A mixin of `Daemon`: it only reads
the daemon's attributes, never changes them, so a status request can never
change what the host does.
"""

from __future__ import annotations

import socket
from dataclasses import replace

import linkpassd
from linkpassd.adapters import udpholders
from linkpassd.core import apply, explain
from linkpassd.core.model import DaemonStatus, OpticsReading, PortSensors, PortState, Problem, Unreadable


class StatusReport:
    def _unix_port_states(self, now: float) -> dict[str, PortState]:
        to_wall = self.started_wall - self.started_mono
        return {p: replace(s, since=s.since + to_wall,
                           hold_until=s.hold_until + to_wall if s.hold_until else 0.0)
                for p, s in self.port_states(now).items()}

    def explain(self, port: str) -> explain.Explanation | None:
        if self.decision is None:
            return None
        return explain.explain(self.config, self.decision, self._unix_port_states(self.clock()), port)

    def sensors(self) -> tuple[PortSensors, ...]:
        out = []
        for port, h in self.health.items():
            sig = h.signals
            reading = sig.optics.reading
            out.append(PortSensors(
                port=port,
                optics=reading if isinstance(reading, OpticsReading) else None,
                optics_unreadable=reading.reason if isinstance(reading, Unreadable) else "",
                counters=sig.counters.samples[-1][1] if sig.counters.samples else None,
                # Each echo path's own judgement after the rail's: its tolerance,
                # longest silence (the margin), the peer's hold and our stalls.
                assessments=sig.assessments(self.config.health)
                + tuple(prober.assessment() for path, prober in
                        (self.echo.probers.items() if self.echo is not None else ())
                        if path.port == port)))
        return tuple(out)

    def status(self) -> DaemonStatus:
        now = self.clock()
        ports = tuple(self._unix_port_states(now).values())
        return DaemonStatus(
            hostname=socket.gethostname(),
            version=linkpassd.__version__,
            config_source=self.config.source,
            started_at=self.started_wall,
            ports=ports,
            links=tuple(self.links.values()),
            rails=self.decision.rails if self.decision else (),
            groups=self.decision.groups if self.decision else (),
            reconciles=self.reconciles,
            netlink_writes=self.kernel.writes if self.kernel else 0,
            last_reconcile_at=self.last_reconcile_at,
            last_error=self.last_error,
            sensors=self.sensors(),
            problems=self.problems(),
            responder=self.responder.counters() if self.responder is not None else None,
            last_error_at=self.last_error_at,
            reconcile_failures=self.reconcile_failures,
            boot_id=self.events.boot_id,
            last_event_seq=self.events.log.last_seq,
            aggregator=self.agent_status(),
        )

    def problems(self) -> tuple[Problem, ...]:
        """What the daemon cannot do right now, each with since when."""
        to_wall = self.started_wall - self.started_mono
        out = [Problem("conflict" if f.foreign else "refused", apply.describe(f.op), f.error,
                       f.since + to_wall, f.attempts)
               for f in sorted(self.failures.values(), key=lambda f: f.since)]
        out += [Problem("bfd", f"BFD session {name} on {spec.ifname}", error, since)
                for name, (spec, error, since) in sorted(self.bfd_pending.items())]
        r = self.responder
        if r is not None and r.error:
            out.append(Problem("responder", f"echo responder on UDP {r.port}", r.error,
                               r.error_since or 0.0))
        out += list(self.state_problems.values())
        out += [Problem("foreign", f.description, f"protocol {f.protocol}, inside an owned range",
                        since) for f, since in self.foreign]
        out += self.echo_port_problems()
        return tuple(out)

    def echo_port_problems(self) -> list[Problem]:
        """Another process bound to the echo responder's UDP port: it receives
        the peers' probes meant for this daemon (issue 30 item 9)."""
        if self.echo_spec is None:
            self.echo_port_taken_since = None
            return []
        port = self.echo_spec.port
        others = udpholders.foreign(port)
        if not others:
            self.echo_port_taken_since = None
            return []
        if self.echo_port_taken_since is None:
            self.echo_port_taken_since = self.wallclock()
        error = self.responder.error if self.responder is not None else ""
        detail = ("another process holds it and receives the peers' probes: "
                  + ", ".join(h.describe() for h in others[:4]) + (f"; {error}" if error else ""))
        return [Problem("echo_port", f"echo responder UDP port {port}", detail, self.echo_port_taken_since)]
