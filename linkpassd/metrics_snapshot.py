"""The daemon's state as metrics read it: one `MetricsSnapshot` per scrape.

`take(daemon)` runs on the daemon's event loop (adapters.metrics asks the loop
for it), so it reads the daemon's structures between two loop steps and never
races them. It only reads, like the status report it starts from, and turns
everything into plain values: the HTTP thread that renders them touches
nothing of the daemon's.

Its cost is one `status()` (what `linkpassctl status` costs) plus a walk over
BFD sessions and echo paths, once per scrape: nothing per packet. The probe
RTT histogram is counted by each echo prober as replies arrive (one bisect and
one integer increment per reply, adapters.echo, into core.probe.RTT_BUCKETS_S) and
only copied here.
"""

from __future__ import annotations

from linkpassd.adapters.metrics import (
    BfdMetrics,
    GroupMetrics,
    LoopLagMetrics,
    MetricsSnapshot,
    OpticValue,
    PortCounters,
    PortMetrics,
    ProbeMetrics,
    RailMetrics,
)
from linkpassd.core.model import DaemonStatus, OpticsReading
from linkpassd.core.probe import RTT_BUCKETS_S

__all__ = ["MetricsSnapshot", "take", "from_status"]

_THRESHOLD_LEVELS = ("high_alarm", "high_warn", "low_warn", "low_alarm")
_OPTIC_QUANTITIES = ("temperature_c", "voltage_v", "tx_bias_ma", "tx_power_dbm", "rx_power_dbm")


def take(daemon) -> MetricsSnapshot:
    """A snapshot of a running `linkpassd.daemon.loop.Daemon` (on its loop)."""
    status = daemon.report.status()
    config = daemon.config
    rail_of = {r.port: r.name for r in config.rails}
    candidates = {r.name: (r.name,) + tuple(r.backups) for r in config.rails}
    bfd = ()
    probers = daemon.probes
    if probers.bfd is not None:
        bfd = tuple(BfdMetrics(session=s["name"], port=s["port"], rail=rail_of.get(s["port"], ""),
                               peer=s["peer"], state=s["state"], ups=s.get("up_count", 0),
                               downs=s.get("down_count", 0),
                               detection_time_s=(s["detection_time_ms"] / 1e3
                                                 if s.get("detection_time_ms") is not None else None))
                    for s in probers.bfd.status())
    probes = ()
    if probers.echo is not None:
        now = daemon.clock()
        probes = tuple(_probe(path, prober, rail_of, now)
                       for path, prober in probers.echo.probers.items())
    lag = probers.looplag
    loop_lag = LoopLagMetrics(recent_max_s=lag.worst_since(daemon.clock() - lag.history.window_s),
                              max_s=lag.max, stalls=lag.stalls, measurements=lag.count)
    return from_status(status, rail_of, candidates, bfd=bfd, probes=probes, loop_lag=loop_lag,
                       now=daemon.wallclock())


def _probe(path, prober, rail_of: dict[str, str], now: float) -> ProbeMetrics:
    state = prober.state
    c = state.counters
    counts = tuple(getattr(prober, "rtt_counts", ()))
    one_way = state.oneway.report(prober.own_clock(), now)
    return ProbeMetrics(path=str(path), port=path.port, rail=rail_of.get(path.port, ""),
                        peer=path.peer, state=state.phase, loss_ratio=state.loss_ratio,
                        last_rtt_s=state.rtt_s, sent=c.sent, received=c.received, lost=c.lost,
                        late=c.late, rtt_buckets=RTT_BUCKETS_S, rtt_counts=counts,
                        rtt_sum_s=float(getattr(prober, "rtt_sum_s", 0.0)),
                        tolerance_s=state.config.tolerance_s,
                        longest_silence_s=state.longest_silence_s,
                        peer_held_max_s=state.held_max_s, silences=c.silences,
                        one_way_towards_s=one_way.towards_s, one_way_back_s=one_way.back_s,
                        one_way_bound_s=one_way.bound_s)


def from_status(status: DaemonStatus, rail_of: dict[str, str],
                candidates: dict[str, tuple[str, ...]] | None = None, *,
                bfd: tuple[BfdMetrics, ...] = (), probes: tuple[ProbeMetrics, ...] = (),
                loop_lag: LoopLagMetrics | None = None, now: float | None = None) -> MetricsSnapshot:
    """The snapshot a status report gives, plus what status does not carry
    (BFD sessions, probe paths, loop lag). `now` (wall clock): for the age
    of the last ack. Pure."""
    candidates = candidates or {}
    links = {link.port: link for link in status.links}
    ports = []
    for p in status.ports:
        link = links.get(p.port)
        ports.append(PortMetrics(
            port=p.port, rail=rail_of.get(p.port, ""), verdict=str(p.verdict), phase=p.phase,
            carrier=p.carrier, since=p.since, drained=p.drain is not None,
            drain_until=p.drain.until if p.drain is not None else None,
            carrier_ups=link.carrier_up_count if link is not None and link.present else None,
            carrier_downs=link.carrier_down_count if link is not None and link.present else None))
    rails = tuple(RailMetrics(rail=r.name, port=r.port, active=r.active_rail or "",
                              candidates=candidates.get(r.name, (r.name,)))
                  for r in status.rails)
    groups = tuple(GroupMetrics(group=g.name, members=len(g.members), min_paths=g.min_paths)
                   for g in status.groups)
    optics: list[OpticValue] = []
    unreadable: list[tuple[str, str, bool]] = []
    flags: list[tuple[str, str, str]] = []
    counters: list[PortCounters] = []
    for s in status.sensors:
        rail = rail_of.get(s.port, "")
        if s.optics is not None:
            optics += _optic_values(s.port, rail, s.optics)
            flags += [(s.port, rail, flag) for flag in sorted(s.optics.flags)]
            unreadable.append((s.port, rail, False))
        elif s.optics_unreadable:
            unreadable.append((s.port, rail, True))
        if s.counters is not None:
            counters.append(PortCounters(s.port, rail, s.counters))
    problems: dict[str, int] = {}
    for problem in status.problems:
        problems[problem.kind] = problems.get(problem.kind, 0) + 1
    return MetricsSnapshot(
        version=status.version, boot_id=status.boot_id, started_at=status.started_at,
        ports=tuple(ports), rails=rails, groups=groups, bfd=bfd, probes=probes,
        optics=tuple(optics), optics_unreadable=tuple(unreadable), optic_flags=tuple(flags),
        counters=tuple(counters), loop_lag=loop_lag, reconciles=status.reconciles,
        last_reconcile_at=status.last_reconcile_at, problems=tuple(sorted(problems.items())),
        responder=status.responder, last_event_seq=status.last_event_seq,
        agent=status.aggregator,
        last_ack_age_s=(max(0.0, now - status.aggregator.last_ack_at)
                        if now is not None and status.aggregator is not None
                        and status.aggregator.last_ack_at else None))


def _optic_values(port: str, rail: str, reading: OpticsReading) -> list[OpticValue]:
    out = []
    for quantity in _OPTIC_QUANTITIES:
        value = getattr(reading, quantity)
        if isinstance(value, tuple):
            out += [OpticValue(port, rail, quantity, v, lane=i)
                    for i, v in enumerate(value) if v is not None]
        elif value is not None:
            out.append(OpticValue(port, rail, quantity, value))
        limits = reading.threshold(quantity)
        out += [OpticValue(port, rail, quantity, getattr(limits, level), level=level)
                for level in _THRESHOLD_LEVELS if getattr(limits, level) is not None]
    return out
