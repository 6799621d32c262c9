"""One host's part of a fleet validation (fleet.proto ValidateHost -> HostValidation).

The only adapter in linkpassd.validate: it reads the kernel, the daemon's
sensor, lldpd and the wire, and sends probes. What it reads goes out as
measured; judging it against the plan is validate.localize's job, on the
aggregator, where every host's answer meets the plan.

The run fills the request's `duration_s`, on this timeline (t0 = start):

    t0               read carrier (rtnetlink), error counters (the sensor),
                     lldpd's neighbours (lldpctl); at most START_READ_S
    then, in parallel until the window ends (t0 + duration - END_READ_S):
      - probes: the low-rate phase, the burst phase, a reply grace
        (adapters.valprober, on its own thread), each target's probes
        spread over `flows` source ports
      - LLDP frames on each port lldpd did not answer for (adapters.lldp)
      - link speed (ethtool netlink) and optics (the sensor, judged by
        core.signals.judge_optics: the daemon's own rule)
    window end       read carrier, counters and optics again: what rose is
                     reported, and so is a module that went bad (or stopped
                     answering) during the window

So counters are compared over (almost) the whole duration, and the answer
comes back a little after `duration_s` (the agent bounds the run by
duration + a margin, daemon.aggregator). Whatever keeps a check from running is a
named entry in `problems`, never an exception; what weakens a check that
still ran (fewer probes sent than planned on a busy host) is a named entry
in `notes`: the pairs count only the probes that went out.

Sources: the daemon's own sensor (ethtool in production, the lab's sim
files with `[sensors] backend = "sim"`), so a validation sees exactly what
the daemon judges its ports on.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from pyroute2 import AsyncIPRoute
from pyroute2.netlink.generic.ethtool import AsyncNlEthtool

from linkpassd._proto.linkpass.v1 import fleet_pb2
from linkpassd.adapters import lldp
from linkpassd.adapters.echoresponder import ECHO_PORT
from linkpassd.adapters.links import sample_from_ifinfmsg
from linkpassd.adapters.sensor import Sensor
from linkpassd.adapters.valprober import FLOWS, MAX_FLOWS, Phases, Target, run_probes
from linkpassd.core.model import CounterSample, HealthPolicy, LinkSample, Unreadable, Verdict
from linkpassd.core.signals import judge_optics

MIN_DURATION_S = 1.0
MAX_DURATION_S = 600.0
MAX_PORTS = 256
MAX_TARGETS = 8192
MAX_RATE_PPS = 10_000.0  # per target; a responder answers a source at 5,000/s by default
MAX_PROBES = 4_000_000  # all targets, both phases: bounds the prober's bookkeeping
START_READ_S = 3.0
END_READ_S = 1.5  # kept free at the end of the window for the second reading
REPLY_GRACE_S = 0.5
SPEED_UNKNOWN = 0xFFFFFFFF
# Error counters compared over the window (fec_corrected only when the
# daemon's policy watches it: healthy fast links correct errors all the time).
RISING_COUNTERS = ("rx_crc_errors", "symbol_errors", "length_errors", "rx_missed",
                   "fec_uncorrectable", "link_down_events")


@dataclass(frozen=True)
class RailPort:
    """A rail of this host, as its config says."""

    rail: str
    port: str
    address: str


@dataclass(frozen=True)
class HostContext:
    """What the check needs from the daemon (daemon.aggregator builds it from the config)."""

    rails: tuple[RailPort, ...]
    sensor: Sensor
    policy: HealthPolicy = field(default_factory=HealthPolicy)
    echo_port: int = ECHO_PORT
    netns: str | None = None  # None: the daemon's own namespace
    lldpd_socket: str = lldp.DEFAULT_LLDPD_SOCKET


# --------------------------------------------------------------------------
# The request
# --------------------------------------------------------------------------


def _finite(value: float, name: str, low: float, high: float) -> str | None:
    if not math.isfinite(value) or not low <= value <= high:
        return f"{name} must be {low:g}..{high:g}, not {value!r}"
    return None


def _bad_port_name(name: str) -> bool:
    return not name or len(name) > 15 or "/" in name or "\0" in name or name.strip() != name


def request_errors(request: fleet_pb2.ValidateHost) -> list[str]:
    """What makes a ValidateHost unusable, each naming the field; [] when fine."""
    errors = [e for e in (
        _finite(request.duration_s, "duration_s", MIN_DURATION_S, MAX_DURATION_S),
        _finite(request.rate_pps, "rate_pps", 0.0, MAX_RATE_PPS),
        _finite(request.burst_pps, "burst_pps", 0.0, MAX_RATE_PPS),
        _finite(request.burst_s, "burst_s", 0.0, max(0.0, request.duration_s)),
    ) if e]
    if len(request.ports) > MAX_PORTS:
        errors.append(f"{len(request.ports)} ports, at most {MAX_PORTS}")
    if len(request.targets) > MAX_TARGETS:
        errors.append(f"{len(request.targets)} targets, at most {MAX_TARGETS}")
    if request.flows > MAX_FLOWS:
        errors.append(f"flows must be 0..{MAX_FLOWS} (0: {FLOWS}), not {request.flows}")
    seen: set[str] = set()
    for i, port in enumerate(request.ports[:MAX_PORTS]):
        if _bad_port_name(port.port):
            errors.append(f"ports[{i}].port {port.port[:40]!r} is not an interface name")
        elif port.port in seen:
            errors.append(f"ports[{i}].port {port.port!r} is listed twice")
        seen.add(port.port)
    for i, target in enumerate(request.targets[:MAX_TARGETS]):
        try:
            if ipaddress.ip_address(target.peer).version != 4:
                raise ValueError
        except ValueError:
            errors.append(f"targets[{i}].peer {target.peer[:60]!r} is not an IPv4 address")
        if not target.rail:
            errors.append(f"targets[{i}] names no rail")
    if not errors:
        probes = len(request.targets) * (request.rate_pps * request.duration_s
                                         + request.burst_pps * request.burst_s)
        if probes > MAX_PROBES:
            errors.append(f"{probes:.0f} probes in all (targets x rates x seconds), "
                          f"at most {MAX_PROBES}")
    return errors


# --------------------------------------------------------------------------
# Readings
# --------------------------------------------------------------------------


async def read_links(ports: Sequence[str], netns: str | None) -> dict[str, LinkSample]:
    """Each port's carrier and flap counts (rtnetlink); missing ports are `missing`."""
    ipr = AsyncIPRoute(**({} if netns is None else {"netns": netns, "flags": 0}))
    try:
        seen = {}
        async for msg in await ipr.get_links():
            sample = sample_from_ifinfmsg(msg)
            if sample.port in ports:
                seen[sample.port] = sample
        return {p: seen.get(p, LinkSample.missing(p)) for p in ports}
    finally:
        ipr.close()


async def read_speeds(ports: Sequence[str], netns: str | None) -> dict[str, int | str]:
    """Mb/s per port from ethtool netlink (LINKMODES_GET); 0 when the link
    does not know (down); a string saying why when it cannot be read."""
    out: dict[str, int | str] = {}
    try:
        sock = AsyncNlEthtool(**({} if netns is None else {"netns": netns, "flags": 0}))
    except OSError as exc:
        return {p: f"ethtool netlink: {exc}" for p in ports}
    try:
        for port in ports:
            try:
                reply = await sock.get_linkmode(ifname=port)
                msgs = list(reply) if isinstance(reply, (list, tuple)) else [m async for m in reply]
                speed = msgs[0].get_attr("ETHTOOL_A_LINKMODES_SPEED") if msgs else None
                out[port] = 0 if speed in (None, SPEED_UNKNOWN) else int(speed)
            except Exception as exc:  # noqa: BLE001 - a sensor answer, never a crash
                out[port] = str(exc.args[-1]) if exc.args else repr(exc)
    finally:
        sock.close()
    return out


def counters_rising(start: CounterSample | None, end: CounterSample | None,
                    link_start: LinkSample | None, link_end: LinkSample | None,
                    policy: HealthPolicy) -> dict[str, int]:
    """Counter name -> how much it rose between the two readings (only those
    that rose and were read both times). A counter that went backwards (a
    driver reset) says nothing."""
    names = RISING_COUNTERS + (("fec_corrected",) if policy.fec_corrected_per_s else ())
    rising: dict[str, int] = {}
    if start is not None and end is not None:
        known = {f.name for f in fields(CounterSample)}
        for name in names:
            if name not in known:
                continue
            a, b = getattr(start, name), getattr(end, name)
            if isinstance(a, int) and isinstance(b, int) and b > a:
                rising[name] = b - a
    if link_start is not None and link_end is not None and link_start.present \
            and link_end.present and link_end.carrier_down_count > link_start.carrier_down_count:
        rising["carrier_down"] = link_end.carrier_down_count - link_start.carrier_down_count
    return rising


def optics_verdict(reading, policy: HealthPolicy) -> tuple[list[str], str]:
    """(optics problems, why not checked) from one sensor reading, by the
    daemon's own rule (core.signals.judge_optics)."""
    if isinstance(reading, Unreadable):
        return [], reading.reason
    judged = judge_optics(reading, (), policy)
    # DOWN too: a receiver below its low alarm (a dead optic) is judged DOWN
    if judged.severity in (Verdict.DEGRADED, Verdict.DOWN):
        return [part for part in judged.detail.split("; ") if part], ""
    return [], ""


def optics_over_window(start, end, policy: HealthPolicy) -> tuple[list[str], str]:
    """(optics problems, why not checked) from the readings at the window's
    start and end (`end` None: not read again). Why both: a module that
    dies while the probes run (a laser failing, a module unseated) would
    pass a check made only at the start. What the end adds is marked so; a
    module that answered at the start and not at the end is a problem of
    the optic, not a check that could not run."""
    first, why = optics_verdict(start, policy)
    if end is None:
        return first, why
    last, why_end = optics_verdict(end, policy)
    if isinstance(start, Unreadable):
        return [f"at the window's end: {p}" for p in last], (why if isinstance(end, Unreadable) else "")
    found = first + [f"at the window's end: {p}" for p in last if p not in first]
    if isinstance(end, Unreadable):
        found.append(f"the module answered at the window's start, not at its end: {why_end}")
    return found, ""


async def _bounded(coro, timeout_s: float, what: str):
    """(result, "") or (None, why) — a slow or failing reading is a problem, not an end."""
    try:
        async with asyncio.timeout(timeout_s):
            return await coro, ""
    except TimeoutError:
        return None, f"{what}: no answer within {timeout_s:g} s"
    except Exception as exc:  # noqa: BLE001 - a sensor or kernel answer, never a crash
        return None, f"{what}: {exc!r}"[:300]


async def _counters(sensor: Sensor, ports: Sequence[str]) -> dict[str, CounterSample]:
    return {p: await sensor.counters(p) for p in ports}


async def _optics(sensor: Sensor, ports: Sequence[str]) -> dict[str, object]:
    return {p: await sensor.optics(p) for p in ports}


# --------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------


def _targets(request: fleet_pb2.ValidateHost, rails: dict[str, RailPort],
             problems: list[str]) -> tuple[list[Target], list[int]]:
    """Probe targets on rails this host has; the requests' indexes they answer."""
    targets, index = [], []
    missing: dict[str, int] = {}
    for i, t in enumerate(request.targets):
        rail = rails.get(t.rail)
        if rail is None:
            missing[t.rail] = missing.get(t.rail, 0) + 1
            continue
        targets.append(Target(t.rail, rail.port, rail.address, t.peer, t.peer_host))
        index.append(i)
    for name, count in sorted(missing.items()):
        problems.append(f"rail {name[:64]!r} is not one of this host's rails "
                        f"({', '.join(sorted(rails)) or 'none'}): its {count} pairs not probed")
    return targets, index


async def validate_host(request: fleet_pb2.ValidateHost, context: HostContext,
                        clock=time.monotonic) -> fleet_pb2.HostValidation:
    """The host's part of run `request.run_id` (request_errors must be empty)."""
    t0 = clock()
    window_end = t0 + request.duration_s - END_READ_S
    problems: list[str] = []
    rails = {r.rail: r for r in context.rails}
    expected = list(request.ports)
    ports = [p.port for p in expected]
    for p in expected:
        configured = next((r for r in context.rails if r.port == p.port), None)
        if p.rail and configured is not None and configured.rail != p.rail:
            problems.append(f"{p.port}: the plan puts it on {p.rail}, this host's config "
                            f"on {configured.rail}")

    (links0, why_links0), (counters0, why_c0), (lldpd, _) = await asyncio.gather(
        _bounded(read_links(ports, context.netns), START_READ_S, "reading links"),
        _bounded(_counters(context.sensor, ports), START_READ_S, "reading counters"),
        _bounded(lldp.query_lldpd(context.lldpd_socket), START_READ_S, "asking lldpd"))
    problems += [w for w in (why_links0, why_c0) if w]
    lldpd = lldpd or lldp.LldpdView({}, "lldpd did not answer")

    window = max(0.0, window_end - clock())
    sniffs = {p: asyncio.create_task(lldp.sniff_lldp(p, window, context.netns),
                                     name=f"lldp-{p}")
              for p in ports if p not in lldpd.neighbours}
    targets, answered = _targets(request, rails, problems)
    grace = min(REPLY_GRACE_S, window)
    burst_s = min(request.burst_s, max(0.0, window - grace))
    phases = Phases(rate_pps=request.rate_pps, low_s=max(0.0, window - grace - burst_s),
                    burst_pps=request.burst_pps, burst_s=burst_s, grace_s=grace)
    try:
        prober, (speeds, why_speed), (optics, why_optics) = await asyncio.gather(
            run_probes(targets, phases, echo_port=context.echo_port, netns=context.netns,
                       flows=request.flows or FLOWS),
            _bounded(read_speeds(ports, context.netns), max(1.0, window), "reading link speeds"),
            _bounded(_optics(context.sensor, ports), max(1.0, window), "reading optics"))
        neighbours = {p: await task for p, task in sniffs.items()}
    finally:
        for task in sniffs.values():
            task.cancel()
        await asyncio.gather(*sniffs.values(), return_exceptions=True)
    problems += [w for w in (why_speed, why_optics) if w] + prober.problems
    await asyncio.sleep(max(0.0, window_end - clock()))  # counters compare over the window
    (links1, why_links1), (counters1, why_c1), (optics1, why_optics1) = await asyncio.gather(
        _bounded(read_links(ports, context.netns), START_READ_S, "reading links again"),
        _bounded(_counters(context.sensor, ports), START_READ_S, "reading counters again"),
        _bounded(_optics(context.sensor, ports), START_READ_S, "reading optics again"))
    problems += [w for w in (why_links1, why_c1, why_optics1) if w]

    result = fleet_pb2.HostValidation(run_id=request.run_id)
    for p in expected:
        result.ports.append(_port_check(p, context, links0, links1, counters0, counters1, speeds,
                                        (optics, optics1), lldpd, neighbours, window, problems))
    by_target = {answered[i]: tally for i, tally in enumerate(prober.tallies)}
    for i, t in enumerate(request.targets):
        tally = by_target.get(i)
        pair = fleet_pb2.PairResult(rail=t.rail, peer=t.peer, peer_host=t.peer_host)
        if tally is not None:
            pair.sent, pair.received = tally.sent, tally.received
            pair.burst_sent, pair.burst_received = tally.burst_sent, tally.burst_received
            pair.rtt_p50_us, pair.rtt_p99_us = tally.rtt_us(0.50), tally.rtt_us(0.99)
            pair.flows, pair.flows_silent = tally.flows, tally.flows_silent
            pair.requests_lost, pair.replies_lost = tally.requests_lost, tally.replies_lost
            pair.receipts = tally.receipts
        result.pairs.append(pair)
    result.problems.extend(problems)
    result.notes.extend(prober.notes)
    return result


def _port_check(p: fleet_pb2.ExpectedPort, context: HostContext, links0, links1, counters0,
                counters1, speeds, optics, lldpd: lldp.LldpdView, neighbours, window: float,
                problems: list[str]) -> fleet_pb2.PortCheck:
    port = p.port
    check = fleet_pb2.PortCheck(port=port, rail=p.rail)
    first = (links0 or {}).get(port)
    last = (links1 or {}).get(port)
    if first is not None and not first.present:
        problems.append(f"{port}: no such interface on this host")
    check.carrier = bool(first is not None and first.carrier
                         and (last is None or last.carrier))
    speed = (speeds or {}).get(port)
    if isinstance(speed, int):
        check.speed_mbps = speed
    elif speed is not None and p.speed_mbps and first is not None and first.present:
        problems.append(f"{port}: link speed not read: {speed}")
    start, end = ((reading or {}).get(port) for reading in optics)
    found, why = optics_over_window(Unreadable("not read") if start is None else start, end,
                                    context.policy)
    check.optics_problems.extend(found)
    if why and (first is None or first.present):
        problems.append(f"{port}: optics not checked: {why}")
    for name, rise in counters_rising((counters0 or {}).get(port), (counters1 or {}).get(port),
                                      first, last, context.policy).items():
        check.counters_rising[name] = rise
    neighbour = lldpd.neighbours.get(port)
    why = ""
    if neighbour is None:
        neighbour, why = neighbours.get(port, (None, "not sniffed"))
    if neighbour is not None:
        check.lldp_system = neighbour.system
        check.lldp_port = neighbour.switch_port
        check.lldp_source = neighbour.source
    elif (p.switch_name or p.switch_port) and (first is None or first.present) \
            and not lldp.heard_nothing(why):
        # The check could not listen: it did not run. One that listened for
        # the window and heard nothing is a result (the PortCheck without a
        # neighbour), not a check that did not run (issue 31).
        problems.append(f"{port}: no LLDP neighbour: lldpd: {lldpd.problem or 'none for this port'}"
                        f"; wire: {why}")
    return check
