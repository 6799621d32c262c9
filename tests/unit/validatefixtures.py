"""A synthetic rail-optimised fabric for the validation tests: a cabling
plan, the probe plan, and what every host would report under a fault.

Each fault changes the "physical" fabric; `results()` then derives every
port check and every probed pair from it, the way the hosts would see it:

- a swapped cable: LLDP on each end shows the other's switch port, and the
  host's traffic on both rails fails (the /31 on the far side is wrong);
- a dead optic: module flags, no carrier, every pair of the port fails;
- a blackholing host (or leaf) port: carrier and LLDP fine, every pair of
  the port fails;
- a whole leaf that drops: every pair with an end under it fails;
- leaf uplinks down: every cross-leaf pair with an end under it fails;
- a blackholing spine link (leaf X <-> spine s): ECMP hashes each direction
  of each cross-leaf flow onto one of `spines` spines (a fixed hash of the
  pair and the flow's source port); a round trip fails when either
  direction crosses X's link to s, so only some flows of a leaf pair die.
  `flows` = 0: one flow per pair, counted as older hosts do (not at all);
  `flows` = F: each pair's probes spread over F source ports, each hashed
  on its own, and the pair reports how many got no reply;
- a lossy link: each probe through the port is lost with probability p
  (seeded RNG, so runs are reproducible);
- a lossy spine link (leaf X <-> spine s, one way or both): each probe
  whose flow ECMP hashes onto that link, in a lossy direction, is lost with
  probability p; the pair reports which way through its receipts;
- noise: a few stray lost probes on single pairs, as a busy lab gives.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from linkpassd.validate.plan import CablingPlan, PlannedPort
from linkpassd.validate.probeplan import ProbePlan
from linkpassd.validate.results import HostValidation, PairResult, PortCheck

SPEED = 400_000
DEAD_RX = "rx_power_dbm lane 0: -40.0 below the module's low alarm -11.0"


@dataclass
class Fabric:
    hosts: int = 8
    rails: int = 2
    leaves_per_rail: int = 2
    spines: int = 4
    rate_sent: int = 20  # low-rate phase probes per pair
    burst_sent: int = 500  # burst phase probes per pair
    seed: int = 1
    flows: int = 0  # source ports per pair (0: one, not counted)
    # faults
    swapped: list[tuple[tuple[str, str], tuple[str, str]]] = field(default_factory=list)
    dead_optic: set[tuple[str, str]] = field(default_factory=set)  # (host, rail)
    sim_optic: set[tuple[str, str]] = field(default_factory=set)  # flags only, traffic fine
    blackholed_ports: set[tuple[str, str]] = field(default_factory=set)
    dead_leaves: set[str] = field(default_factory=set)
    dead_uplinks: set[str] = field(default_factory=set)
    dead_spine_links: set[tuple[str, int]] = field(default_factory=set)  # (leaf, spine)
    lossy: dict[tuple[str, str], float] = field(default_factory=dict)
    noise: list[tuple[str, str, str, int]] = field(default_factory=list)  # (rail, sender, receiver, lost)
    wrong_speed: dict[tuple[str, str], int] = field(default_factory=dict)
    # (host, rail) -> (direction, loss): "tx" host to leaf, "rx" leaf to host;
    # the pairs report which way they lost (the responders' receipts).
    one_way: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)
    no_lldp: set[tuple[str, str]] = field(default_factory=set)  # carrier up, no LLDP neighbour seen
    # (leaf, spine) -> (direction, loss): "up" leaf to spine, "down" spine to
    # leaf, "both"; only the flows ECMP hashes onto that link lose, probe by
    # probe, and the pairs report which way (the responders' receipts).
    lossy_spine_links: dict[tuple[str, int], tuple[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.host_names = [f"gpu-{i + 1:02d}" for i in range(self.hosts)]
        per_leaf = -(-self.hosts // self.leaves_per_rail)
        ports = []
        for r in range(self.rails):
            for i, host in enumerate(self.host_names):
                ports.append(PlannedPort(host=host, port=f"eth{r}", switch=self.leaf_name(r, i // per_leaf),
                                         switch_port=f"Ethernet{i % per_leaf + 1}", rail=f"rail{r}", speed_mbps=SPEED))
        self.plan = CablingPlan(tuple(ports), "synthetic")
        self.addresses = {(p.host, p.rail): f"198.18.{int(p.rail[4:])}.{2 * self.host_names.index(p.host) + 1}"
                          for p in ports}
        self.probes = ProbePlan.from_plan(self.plan, self.addresses)

    @staticmethod
    def leaf_name(rail: int, index: int) -> str:
        return f"leaf-r{rail}-{'abcdefgh'[index]}"

    def port(self, host: str, rail: str) -> PlannedPort:
        p = self.plan.port_of(host, rail)
        assert p is not None
        return p

    # ---- faults ----

    def swap(self, a: tuple[str, str], b: tuple[str, str]) -> Fabric:
        """Swap the cables of two host ports, each (host, rail)."""
        self.swapped.append((a, b))
        return self

    def _far_end(self, host: str, rail: str) -> PlannedPort:
        """The planned port whose switch port this host port really reaches."""
        for a, b in self.swapped:
            if (host, rail) == a:
                return self.port(*b)
            if (host, rail) == b:
                return self.port(*a)
        return self.port(host, rail)

    def _port_dead(self, host: str, rail: str) -> bool:
        return ((host, rail) in self.dead_optic or (host, rail) in self.blackholed_ports
                or any((host, rail) in pair for pair in self.swapped))

    def _spine(self, rail: str, src: str, dst: str, flow: int = 0) -> int:
        key = f"{rail}|{src}|{dst}" + (f"|{flow}" if flow else "")
        digest = hashlib.blake2b(key.encode(), digest_size=4).digest()
        return int.from_bytes(digest, "big") % self.spines

    def _ways(self, rail: str, a: str, b: str) -> tuple[float, float] | None:
        """(request loss, reply loss) of pair a -> b from one-way faults; None without any."""
        if not any(key in self.one_way for key in ((a, rail), (b, rail))):
            return None

        def way(host: str, direction: str) -> float:
            d, p = self.one_way.get((host, rail), ("", 0.0))
            return p if d == direction else 0.0
        request = 1 - (1 - way(a, "tx")) * (1 - way(b, "rx"))
        reply = 1 - (1 - way(b, "tx")) * (1 - way(a, "rx"))
        return request, reply

    def flow_fails(self, rail: str, a: str, b: str, flow: int = 0) -> bool:
        if self._port_dead(a, rail) or self._port_dead(b, rail):
            return True
        ways = self._ways(rail, a, b)
        if ways is not None and max(ways) >= 1.0:
            return True
        la, lb = self.port(a, rail).switch, self.port(b, rail).switch
        if la in self.dead_leaves or lb in self.dead_leaves:
            return True
        if la == lb:
            return False
        if la in self.dead_uplinks or lb in self.dead_uplinks:
            return True
        forward, back = self._spine(rail, a, b, flow), self._spine(rail, b, a, flow)
        return any((leaf, spine) in self.dead_spine_links for leaf in (la, lb) for spine in (forward, back))

    def silent_flows(self, rail: str, a: str, b: str) -> int:
        return sum(self.flow_fails(rail, a, b, f) for f in range(1, self.flows + 1))

    def pair_fails(self, rail: str, a: str, b: str) -> bool:
        """Single flow: the pair fails; several: every flow of it does."""
        if not self.flows:
            return self.flow_fails(rail, a, b)
        return self.silent_flows(rail, a, b) == self.flows

    def cross_flows(self, rail: str, leaf_x: str, leaf_y: str) -> tuple[int, int]:
        """(failing, all) probed flows between two leaves: the tests check
        that a spine-link fault really is partial before relying on it."""
        pairs = [p for p in self.probes.probes
                 if p.rail == rail and {p.sender_leaf, p.receiver_leaf} == {leaf_x, leaf_y}]
        if not self.flows:
            return sum(self.pair_fails(rail, p.sender, p.receiver) for p in pairs), len(pairs)
        return sum(self.silent_flows(rail, p.sender, p.receiver) for p in pairs), self.flows * len(pairs)

    # ---- what the hosts report ----

    def results(self) -> dict[str, HostValidation]:
        rng = random.Random(self.seed)
        out = {}
        for host in self.host_names:
            checks = []
            for r in range(self.rails):
                rail = f"rail{r}"
                planned, far = self.port(host, rail), self._far_end(host, rail)
                dead_optic = (host, rail) in self.dead_optic
                problems = (DEAD_RX,) if dead_optic or (host, rail) in self.sim_optic else ()
                checks.append(PortCheck(
                    port=planned.port, rail=rail, carrier=not dead_optic,
                    speed_mbps=0 if dead_optic else self.wrong_speed.get((host, rail), SPEED),
                    lldp_system="" if dead_optic or (host, rail) in self.no_lldp else far.switch,
                    lldp_port="" if dead_optic or (host, rail) in self.no_lldp else far.switch_port,
                    lldp_source="" if dead_optic or (host, rail) in self.no_lldp else "lldpd",
                    optics_problems=problems))
            pairs = []
            for target in self.probes.targets_for(host):
                pairs.append(self._pair(rng, target.rail, host, target.peer_host, target.peer))
            out[host] = HostValidation(run_id="run-1", ports=tuple(checks), pairs=tuple(pairs))
        return out

    def _spine_ways(self, rail: str, a: str, b: str, flow: int) -> tuple[float, float]:
        """(request loss, reply loss) of flow `flow` of pair a -> b from lossy spine links."""
        la, lb = self.port(a, rail).switch, self.port(b, rail).switch
        if la == lb:
            return 0.0, 0.0

        def crossing(src_leaf: str, dst_leaf: str, spine: int) -> float:
            kept = 1.0
            for (leaf, s), (way, p) in self.lossy_spine_links.items():
                if s == spine and ((leaf == src_leaf and way in ("up", "both"))
                                   or (leaf == dst_leaf and way in ("down", "both"))):
                    kept *= 1 - p
            return 1 - kept
        return (crossing(la, lb, self._spine(rail, a, b, flow)),
                crossing(lb, la, self._spine(rail, b, a, flow)))

    def _pair(self, rng: random.Random, rail: str, a: str, b: str, address: str) -> PairResult:
        flows = {"flows": self.flows} if self.flows else {}
        ways = self._ways(rail, a, b)
        if ways is not None:
            return self._one_way_pair(rng, rail, a, b, address, *ways)
        if self.lossy_spine_links and not self.pair_fails(rail, a, b) and \
                any(self._spine_ways(rail, a, b, f) != (0.0, 0.0) for f in range(self.flows + 1)):
            return self._probe_pair(rng, rail, a, b, address,
                                    lambda i: self._spine_ways(rail, a, b, i % self.flows + 1 if self.flows else 0))
        if self.pair_fails(rail, a, b):
            return PairResult(rail, address, b, sent=self.rate_sent, received=0, burst_sent=self.burst_sent,
                              burst_received=0, **flows, **({"flows_silent": self.flows} if self.flows else {}))
        silent = self.silent_flows(rail, a, b) if self.flows else 0
        alive = 1.0 - silent / self.flows if self.flows else 1.0  # probes go round the flows in turn
        p = max(self.lossy.get((a, rail), 0.0), self.lossy.get((b, rail), 0.0))
        low_lost = sum(rng.random() < p for _ in range(self.rate_sent))
        burst_lost = sum(rng.random() < p for _ in range(self.burst_sent))
        for n_rail, n_a, n_b, lost in self.noise:
            if (n_rail, n_a, n_b) == (rail, a, b):
                burst_lost += lost
        low_ok = round((self.rate_sent - low_lost) * alive)
        burst_ok = round((self.burst_sent - min(burst_lost, self.burst_sent)) * alive)
        return PairResult(rail, address, b, sent=self.rate_sent, received=low_ok,
                          rtt_p50_us=25, rtt_p99_us=60, burst_sent=self.burst_sent,
                          burst_received=burst_ok, **flows, **({"flows_silent": silent} if self.flows else {}))

    def _one_way_pair(self, rng: random.Random, rail: str, a: str, b: str, address: str,
                      request_loss: float, reply_loss: float) -> PairResult:
        """A pair through a one-way fault, probe by probe (one flow)."""
        return self._probe_pair(rng, rail, a, b, address, lambda _i: (request_loss, reply_loss))

    def _probe_pair(self, rng: random.Random, rail: str, a: str, b: str, address: str,
                    ways: Callable[[int], tuple[float, float]]) -> PairResult:
        """A pair probe by probe, `ways(i)` giving probe i's (request loss,
        reply loss): what came back, and which way the rest was lost as the
        receipts class it (probes after the last reply are not classed).
        With flows, probe i takes flow i % flows + 1 (they go round in turn)."""
        got = {0: 0, 1: 0}
        answered: set[int] = set()
        requests = replies = pending_req = pending_rep = 0
        i = 0
        for phase, n in ((0, self.rate_sent), (1, self.burst_sent)):
            for _ in range(n):
                request_loss, reply_loss = ways(i)
                i += 1
                if rng.random() < request_loss:
                    pending_req += 1
                elif rng.random() < reply_loss:
                    pending_rep += 1
                else:
                    got[phase] += 1
                    answered.add((i - 1) % self.flows if self.flows else 0)
                    requests, replies = requests + pending_req, replies + pending_rep
                    pending_req = pending_rep = 0
        flows = {"flows": self.flows, "flows_silent": self.flows - len(answered)} if self.flows else {}
        return PairResult(rail, address, b, sent=self.rate_sent, received=got[0], rtt_p50_us=25,
                          rtt_p99_us=60, burst_sent=self.burst_sent, burst_received=got[1],
                          requests_lost=requests, replies_lost=replies, receipts=True, **flows)
