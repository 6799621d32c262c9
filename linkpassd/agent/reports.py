"""What the agent says about its host (Inventory, PortReport), and what it
accepts of the peers the aggregator hands down (ProbePeers).

Pure functions of the config and of values read from the daemon, except
`path_samples`, which reads the echo service's running state
(called on the loop, in the agent's own time: a report is built when the
agent is about to send one, never inside a reconcile pass).
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from linkpassd._proto.linkpass.v1 import fleet_pb2
from linkpassd.adapters.control_convert import port_state_to_proto, timestamp
from linkpassd.core.model import Config, PortState
from linkpassd.core.probe import RTT_BUCKETS_S

MAX_PEERS_PER_RAIL = 64  # more from the aggregator is a bug there; the rest are ignored
_PATH_STATES = {"NEVER_UP": "init", "UP": "up", "SUSPECT": "up", "DOWN": "down"}


@dataclass(frozen=True)
class PathSample:
    """One echo path as the fleet sees it (fleet.proto PathState)."""

    port: str
    peer: str
    state: str  # "up", "down" or "init"
    loss: float  # 0..1 over the path's window
    rtt_p50_us: int  # 0: unknown
    direction: str = ""  # core.direction.Direction's value ("" not said)
    requests_lost: int = 0  # lost probes the receipts classed, since the prober started
    replies_lost: int = 0


def inventory(config: Config, rdma: Mapping[str, tuple[str, int]]) -> fleet_pb2.Inventory:
    """The host's rails as configured, with the RDMA device behind each port."""
    return fleet_pb2.Inventory(rails=[
        fleet_pb2.RailInventory(
            rail=r.name, port=r.port, address=f"{r.address}/{r.prefixlen}", gateway=r.gateway,
            rdma_device=rdma.get(r.port, ("", 0))[0], rdma_port=rdma.get(r.port, ("", 0))[1],
            gpus=r.gpus, leaf=r.leaf)
        for r in config.rails])


def port_report(states: Mapping[str, PortState], paths: Sequence[PathSample],
                rail_paths: Mapping[str, str], wall: float | None = None) -> fleet_pb2.PortReport:
    """Ports in the order given, paths sorted; `wall` None leaves the time unset
    (for comparing two reports)."""
    report = fleet_pb2.PortReport(
        ports=[port_state_to_proto(s) for s in states.values() if s.verdict is not None],
        paths=[fleet_pb2.PathState(port=p.port, peer=p.peer, state=p.state, loss=p.loss,
                                   rtt_p50_us=p.rtt_p50_us, direction=p.direction,
                                   requests_lost=p.requests_lost, replies_lost=p.replies_lost)
               for p in sorted(paths, key=lambda p: (p.port, p.peer))],
        rail_paths=dict(rail_paths))
    if wall is not None:
        report.time.CopyFrom(timestamp(wall))
    return report


def median_us(counts: Sequence[int], bounds_s: Sequence[float]) -> int:
    """The median of a histogram, as the upper bound of its bucket (the
    probers keep buckets, not samples); 0 when empty."""
    total = sum(counts)
    if total == 0:
        return 0
    seen = 0
    for count, bound in zip(counts, list(bounds_s) + [math.inf]):
        seen += count
        if seen * 2 >= total:
            return round((bound if math.isfinite(bound) else bounds_s[-1]) * 1e6)
    return 0


def path_samples(echo) -> list[PathSample]:
    """The echo service's paths now (adapters.echo.EchoService)."""
    if echo is None:
        return []
    out = []
    for path, prober in echo.probers.items():
        state = prober.state
        out.append(PathSample(port=path.port, peer=path.peer,
                              state=_PATH_STATES.get(str(state.state), "init"),
                              loss=state.loss_ratio or 0.0,
                              rtt_p50_us=median_us(prober.rtt_counts, RTT_BUCKETS_S),
                              direction=str(state.receipts.direction()),
                              requests_lost=state.receipts.requests_lost,
                              replies_lost=state.receipts.replies_lost))
    return out


def validate_peers(config: Config, message: fleet_pb2.ProbePeers
                   ) -> tuple[dict[str, tuple[str, ...]], list[str]]:
    """The usable part of a ProbePeers, per rail name, and one line per part
    ignored (naming the value). A peer must be an IPv4 address inside one of
    the rail's destinations, outside its subnet, and no rail's address here
    (the same rules as `probe_peers` in the config)."""
    rails = {r.name: r for r in config.rails}
    own = {r.address for r in config.rails}
    usable: dict[str, tuple[str, ...]] = {}
    problems: list[str] = []
    for entry in message.rails:
        rail = rails.get(entry.rail)
        if rail is None:
            problems.append(f"unknown rail {entry.rail[:64]!r}")
            continue
        subnet = ipaddress.IPv4Network(f"{rail.address}/{rail.prefixlen}", strict=False)
        destinations = [ipaddress.IPv4Network(d) for d in rail.destinations]
        peers = dict.fromkeys(usable.get(rail.name, ()))
        for text in entry.peers:
            why = _bad_peer(text, own, subnet, destinations)
            if why:
                problems.append(f"rail {rail.name}: peer {text[:64]!r}: {why}")
            elif len(peers) >= MAX_PEERS_PER_RAIL:
                problems.append(f"rail {rail.name}: peer {text[:64]!r}: more than "
                                f"{MAX_PEERS_PER_RAIL} peers")
            else:
                peers[str(ipaddress.IPv4Address(text))] = None
        usable[rail.name] = tuple(peers)
    return usable, problems


def validate_probers(config: Config, message: fleet_pb2.ProbePeers
                     ) -> tuple[dict[str, tuple[str, ...]], list[str]]:
    """Who probes this host, per rail name (RailPeers.probed_by), by the same
    rules as the peers: the responder answers these addresses, so a bad one is
    left out (and named), never admitted."""
    turned = fleet_pb2.ProbePeers(generation=message.generation, rails=[
        fleet_pb2.RailPeers(rail=entry.rail, peers=entry.probed_by) for entry in message.rails])
    usable, problems = validate_peers(config, turned)
    return usable, [f"{p} (probed_by)" for p in problems]


def _bad_peer(text: str, own: set[str], subnet: ipaddress.IPv4Network,
              destinations: list[ipaddress.IPv4Network]) -> str:
    try:
        peer = ipaddress.IPv4Address(text)
    except ValueError:
        return "not an IPv4 address"
    if peer.is_unspecified or peer.is_loopback or peer.is_multicast or peer.is_reserved:
        return "not a host address"
    if str(peer) in own:
        return "an address of this host"
    if peer in subnet:
        return f"inside the rail subnet {subnet} (on-link peers are not probed)"
    if not any(peer in d for d in destinations):
        return "outside the rail's destinations"
    return ""
