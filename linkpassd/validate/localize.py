"""From what every host found to what is at fault: findings with evidence
and a confidence.

Why a localiser: a validation of 2,000 hosts yields ~300 k probed pairs and
16 k port checks; an operator needs "this cable, this leaf, this spine
link", not a table. The rules, in the order they run (each later step sees
only what earlier steps left unexplained, so one fault gives one finding):

1. Port checks against the plan. LLDP neighbour != plan: a *miswire*; when
   two ports each see the other's planned switch port it is a swap and one
   finding names both ports and where each must go. Optics problems
   (*optic*), no carrier (*link_down*), wrong speed (*speed*), error
   counters rising (*counters*): one finding per port, the most specific
   kind first and the rest as evidence. A port with such a finding explains
   the pairs through it (a swapped cable also breaks its probes). No LLDP
   neighbour at all (*lldp*) is reported but explains nothing; when a
   blackhole or leaf finding covers its port it is part of that finding.
2. Failing pairs (loss >= `fail_loss` in every phase the pair ran, low
   rate and burst: a blackhole, not loss; `_fails` says why both):
   - *leaf*: every pair that touches any host under a leaf fails (intra-
     and cross-leaf) while the rest of the rail works: the leaf drops all.
   - *blackhole*: every pair of one host port fails while its peers' other
     pairs work: the host port, its cable or the leaf port (a leaf port
     that drops looks exactly like this; the finding names both ends).
     Which way: from the responders' receipts when enough came back to
     class the losses (core.direction); else from LLDP: no LLDP from the
     leaf means the leaf-to-host direction is dead (host to leaf cannot be
     seen: no reply comes back), LLDP as planned means host to leaf is dead
     or the leaf's forwarding drops the port's traffic. The port's LLDP
     finding, if any, is part of it (one fault, one finding).
   - Cross-leaf pairs that fail while intra-leaf pairs work point above the
     leaves. A flow is one UDP source port of a pair (the hosts spread each
     pair's probes over several, valprober); a fabric hashing ECMP on the
     5-tuple sends a pair's flows over different spines, so a dead spine
     link kills some of a pair's flows and spares the rest (*silent* flows:
     no reply at all). A cross-leaf pair fails here when its loss is at
     `fail_loss` or when some but not all of its flows are silent. If one
     leaf is in every failing leaf pair and all of its leaf pairs fail
     (>= 2 of them): that leaf's uplinks (*leaf*, when every flow of its
     cross-leaf pairs is silent, or without flow counts every pair fails)
     or one of its spine links (*spine_path*, when only some are: each
     flow hashed onto the dead link dies). Otherwise each failing leaf pair
     is a *spine_path*; with two leaves on a rail the two leaves' spine
     links cannot be told apart, and the confidence says so. Which spine
     is not known from the hosts: the switches' own counters tell.
3. Random loss among working pairs (*lossy_link*). First above the leaves:
   a leaf whose cross-leaf pairs lose (at least `min_lost` probes, spread
   over >= 2 hosts under it, >= 2 hosts beyond it and, with three or more
   leaves, >= 2 other leaves) at `concentration` times the rate of the pairs
   under it and of the rest of the rail: one of its spine links loses (only
   the flows ECMP hashes onto it). Lossy host ports look different: the
   loss sits on one host at each end, and the pairs under the leaf lose
   too. With two leaves on a rail either leaf's spine links fit, and the
   finding names the leaf pair. Which way from the receipts: a request
   lost from a pair a host under the leaf sent went up (leaf to spine: the
   leaf's transmitter first), one from a pair it answered came down (spine
   to leaf: the spine's transmitter first), a reply the other way round.
   Loss on the spine links of a leaf that a spine_path finding already
   names is evidence in that finding. Then per host port, the lost
   probes of its pairs in the high-rate burst phase (the low-rate phase
   when there was no burst). Greedy: the port with the highest loss rate,
   if it lost at least `min_lost` probes, on at least two of its pairs, at
   `concentration` times the rate of the rest of the rail, is a lossy
   link; its pairs are then explained and the next port is tried (so the
   peers of a lossy port are not blamed for its loss).
   What the burst resolves: a port whose pairs carried n burst probes sees
   >= `min_lost` losses with 95 % probability once its loss rate reaches
   lambda/n (Poisson; lambda = 6.3 for 3 losses; with min_lost = 1 this is
   the rule of three, 3/n). The report's loss_resolution is the worst
   port's (`loss_resolution`). Loss is per round trip, and says so: a link
   that drops p one way costs the echo p. Which way is from the
   responders' receipts (the pairs' requests_lost / replies_lost): a
   request lost from a pair the port's host sent is host to leaf, from a
   pair it answered leaf to host, a reply the other way round; the finding
   gives each direction's rate and names the transmitter to check first.
4. What is left failing is *unexplained* (one finding per rail), so no
   failure passes silently; hosts that could not run a check, or sent no
   check for a planned port, are *incomplete*. A host's notes (a check
   that ran with fewer probes than planned) are not findings: every pair
   counts only the probes it sent, so the loss resolution already says
   what the run could see, and the report lists the notes.

Hosts without an "ok" result are left out (their pairs are not judged):
the caller reports them (the aggregator's "no_result").
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from linkpassd._proto.linkpass.v1 import fleet_pb2
from linkpassd.core.direction import Direction, judge
from linkpassd.validate.plan import CablingPlan, PlannedPort
from linkpassd.validate.results import Finding, HostResult, HostValidation, PairResult, PortCheck, host_results

__all__ = ["Analysis", "Finding", "HostResult", "HostValidation", "PairResult", "PortCheck", "Thresholds",
           "detectable_loss", "localize", "localize_proto", "loss_resolution", "probes_for"]

# Kinds in the order a port's issues are named (the first present is the kind).
PORT_KINDS = ("optic", "link_down", "speed", "counters")
KIND_ORDER = ("miswire", "optic", "link_down", "speed", "counters", "leaf", "blackhole", "spine_path",
              "lossy_link", "unexplained", "lldp", "incomplete")
PORT_CONFIDENCE = {"optic": 0.95, "link_down": 0.95, "speed": 0.9, "counters": 0.8}
LLDP_CONFIDENCE = 0.6  # no neighbour seen: the far end is unproven, not known wrong
# How well a spine-level finding pins its component (the evidence strength multiplies it).
ONE_LEAF_SPINE_FACTOR = 0.9  # one leaf common to >= 2 failing leaf pairs: its uplinks
LEAF_PAIR_SPINE_FACTOR = 0.75  # one leaf pair: a spine link of either leaf
MAX_CONFIDENCE = 0.99


@dataclass(frozen=True)
class Thresholds:
    fail_loss: float = 0.5  # loss at or above this in every phase: the pair fails (blackhole class)
    flow_probes: int = 8  # probes per flow before a silent flow counts (20 % random loss
    # silences a flow of 8 with odds 0.2^8 = 3e-6)
    min_lost: int = 3  # lost probes before a port can be lossy: one or two strays are noise
    power: float = 0.95  # the resolution is the loss seen with this probability
    concentration: float = 4.0  # a lossy port's rate vs the rest of its rail


@dataclass(frozen=True)
class Analysis:
    findings: tuple[Finding, ...]
    loss_resolution: float  # fraction; see the module doc
    unvalidated: tuple[str, ...] = ()  # plan hosts without an ok result


def localize(plan: CablingPlan | Sequence[PlannedPort],
             results: Iterable[HostResult | fleet_pb2.HostValidationResult] | Mapping[str, HostValidation],
             thresholds: Thresholds = Thresholds()) -> Analysis:
    """The findings of one run (see the module doc), most specific first."""
    plan = plan if isinstance(plan, CablingPlan) else CablingPlan(tuple(plan))
    ok = {r.host: r.validation for r in host_results(results) if r.ok}
    unvalidated = tuple(sorted({p.host for p in plan.ports} - set(ok)))
    ports = _PortStage(plan, ok)
    pairs, incomplete = _pair_table(plan, ok, ports.explained, thresholds)
    findings = ports.findings(pairs)
    by_rail: dict[str, list[_Pair]] = defaultdict(list)
    for pair in pairs:
        if not pair.explained:
            by_rail[pair.rail].append(pair)
    no_lldp = {(p.host, p.rail) for p in ports.no_lldp}
    for rail in sorted(by_rail):
        findings.extend(_RailStage(plan, rail, by_rail[rail], thresholds, no_lldp).run())
    findings = _merge_lldp(findings)
    for host in sorted(ok):
        notes = [*ok[host].problems, *ports.incomplete.get(host, ()), *incomplete.get(host, ())]
        if notes:
            findings.append(Finding("incomplete", f"{host}: checks that did not run", hosts=(host,),
                                    evidence=tuple(notes[:20]), confidence=1.0))
    findings.sort(key=lambda f: (KIND_ORDER.index(f.kind) if f.kind in KIND_ORDER else len(KIND_ORDER),
                                 f.rail, f.component))
    return Analysis(tuple(findings), loss_resolution(plan, ok, thresholds, pairs=pairs), unvalidated)


def localize_proto(plan: CablingPlan | Sequence[PlannedPort],
                   results: Iterable[fleet_pb2.HostValidationResult]) -> list[fleet_pb2.Finding]:
    """The aggregator's boundary: messages in, messages out."""
    return [f.to_proto() for f in localize(plan, results).findings]


def detectable_loss(probes: int, min_lost: int = 3, power: float = 0.95) -> float:
    """The smallest random-loss rate at which `probes` probes lose at least
    `min_lost` with probability `power` (Poisson approximation of the
    binomial; min_lost = 1 gives the rule of three, ~3/n)."""
    if probes <= 0:
        return 1.0
    return min(1.0, _poisson_rate_for(min_lost, power) / probes)


def probes_for(loss: float, min_lost: int = 3, power: float = 0.95) -> int:
    """How many probes a port needs for detectable_loss to reach `loss`
    (its inverse; validate.schedule sizes the burst with it)."""
    if not 0 < loss <= 1:
        raise ValueError(f"loss must be in (0, 1], not {loss!r}")
    return math.ceil(_poisson_rate_for(min_lost, power) / loss)


def loss_resolution(plan: CablingPlan | Sequence[PlannedPort],
                    results: Iterable[HostResult | fleet_pb2.HostValidationResult] | Mapping[str, HostValidation],
                    thresholds: Thresholds = Thresholds(), *, pairs: Sequence[_Pair] | None = None) -> float:
    """The loss rate the run could resolve on every host port: the worst
    port's detectable_loss over the probes of all its pairs (burst phase,
    or low-rate phase where there was no burst). 1.0 with no probes."""
    if pairs is None:
        plan = plan if isinstance(plan, CablingPlan) else CablingPlan(tuple(plan))
        ok = {r.host: r.validation for r in host_results(results) if r.ok}
        pairs, _ = _pair_table(plan, ok, set(), thresholds)
    probes: dict[tuple[str, str], int] = defaultdict(int)
    for pair in pairs:
        for host in (pair.a, pair.b):
            probes[(host, pair.rail)] += pair.loss_n
    if not probes:
        return 1.0
    return max(detectable_loss(n, thresholds.min_lost, thresholds.power) for n in probes.values())


# --------------------------------------------------------------------------
# names and numbers


def _norm_switch(name: str) -> str:
    """LLDP system names are often FQDNs; the plan usually says the short name."""
    return name.strip().lower().split(".")[0]


def _norm_port(name: str) -> str:
    return name.strip().lower()


def _link(p: PlannedPort) -> str:
    return f"{p.host} {p.port} <-> {p.switch} {p.switch_port}"


def _link_ports(p: PlannedPort) -> tuple[str, str]:
    return (f"{p.host}:{p.port}", f"{p.switch}:{p.switch_port}")


def _strength(observations: int) -> float:
    """How much n agreeing observations weigh: 1 - 2^-n (one: a coin toss)."""
    return min(MAX_CONFIDENCE, 1.0 - 0.5 ** max(observations, 0))


def _percent(fraction: float) -> str:
    value = 100.0 * fraction
    return f"{value:.0f} %" if value >= 10 or value == 0 else f"{value:.2g} %"


def _pct(lost: int, n: int) -> str:
    return f"{lost:,} of {n:,} lost ({_percent(lost / n)})" if n else "none sent"


def _poisson_cdf(k: int, mean: float) -> float:
    """P(X <= k) for X ~ Poisson(mean)."""
    if k < 0:
        return 0.0
    term = total = math.exp(-mean)
    for i in range(1, k + 1):
        term *= mean / i
        total += term
    return min(1.0, total)


def _poisson_rate_for(min_count: int, power: float) -> float:
    """The mean at which P(X >= min_count) = power (bisection)."""
    lo, hi = 0.0, 10.0 + 4.0 * min_count
    for _ in range(80):
        mid = (lo + hi) / 2
        if 1.0 - _poisson_cdf(min_count - 1, mid) < power:
            lo = mid
        else:
            hi = mid
    return hi


# --------------------------------------------------------------------------
# 1. port checks


class _PortStage:
    """Port checks against the plan: miswires (paired into swaps) and each
    port's other issues; which ports explain their pairs' failures."""

    def __init__(self, plan: CablingPlan, ok: Mapping[str, HostValidation]) -> None:
        self.plan = plan
        self.index = {(_norm_switch(p.switch), _norm_port(p.switch_port)): p for p in plan.ports}
        self.issues: dict[PlannedPort, list[tuple[str, str]]] = defaultdict(list)
        self.wrong: dict[PlannedPort, PortCheck] = {}
        self.no_lldp: list[PlannedPort] = []
        self.incomplete: dict[str, list[str]] = defaultdict(list)
        planned: dict[str, list[PlannedPort]] = defaultdict(list)
        for p in plan.ports:
            planned[p.host].append(p)
        for host in sorted(ok):
            checks = {c.port: c for c in ok[host].ports}
            for p in sorted(planned.get(host, ()), key=lambda p: p.rail):
                check = checks.get(p.port)
                if check is None:
                    self.incomplete[host].append(f"no check of {p.port} ({p.rail}) came back")
                    continue
                self._judge(p, check)
        self.explained = {(p.host, p.rail) for p in (*self.issues, *self.wrong)}

    def _judge(self, p: PlannedPort, c: PortCheck) -> None:
        name = f"{p.host} {p.port}"
        if not c.carrier:
            self.issues[p].append(("link_down", f"{name}: no carrier"))
        elif p.speed_mbps and c.speed_mbps and c.speed_mbps != p.speed_mbps:
            self.issues[p].append(("speed", f"{name}: {c.speed_mbps:,} Mb/s, the plan says {p.speed_mbps:,}"))
        if c.optics_problems:
            self.issues[p].append(("optic", f"{name} optics: {'; '.join(c.optics_problems)}"))
        if c.counters_rising:
            rising = ", ".join(f"{k} +{v:,}" for k, v in sorted(c.counters_rising.items()))
            self.issues[p].append(("counters", f"{name}: error counters rose during the window: {rising}"))
        if c.lldp_source:
            if (_norm_switch(c.lldp_system), _norm_port(c.lldp_port)) != \
                    (_norm_switch(p.switch), _norm_port(p.switch_port)):
                self.wrong[p] = c
        elif c.carrier:
            self.no_lldp.append(p)

    def findings(self, pairs: Sequence[_Pair]) -> list[Finding]:
        loss = _loss_by_port(pairs)
        out = self._miswires(loss)
        for p, issues in sorted(self.issues.items(), key=lambda item: (item[0].host, item[0].rail)):
            if p in self.wrong:
                continue  # told with its miswire
            kind = next(k for k in PORT_KINDS if any(kind == k for kind, _ in issues))
            evidence = [text for _, text in sorted(issues, key=lambda i: PORT_KINDS.index(i[0]))]
            evidence.extend(loss.get((p.host, p.rail), ()))
            out.append(Finding(kind, _link(p), hosts=(p.host,), ports=_link_ports(p), rail=p.rail,
                               evidence=tuple(evidence), confidence=PORT_CONFIDENCE[kind]))
        for p in self.no_lldp:
            if p in self.issues:
                continue
            out.append(Finding("lldp", _link(p), hosts=(p.host,), ports=_link_ports(p), rail=p.rail,
                               evidence=(f"{p.host} {p.port}: carrier up but no LLDP neighbour seen "
                                         "(lldpd or the wire): where its cable ends is not proven",),
                               confidence=LLDP_CONFIDENCE))
        return out

    def _miswires(self, loss: Mapping[tuple[str, str], list[str]]) -> list[Finding]:
        out = []
        done: set[PlannedPort] = set()
        ordered = sorted(self.wrong, key=lambda p: (p.host, p.rail))
        for p in ordered:
            if p in done:
                continue
            seen = self.wrong[p]
            q = self.index.get((_norm_switch(seen.lldp_system), _norm_port(seen.lldp_port)))
            swap = (q is not None and q in self.wrong and q not in done and
                    (_norm_switch(self.wrong[q].lldp_system), _norm_port(self.wrong[q].lldp_port))
                    == (_norm_switch(p.switch), _norm_port(p.switch_port)))
            ends = [p, q] if swap and q is not None else [p]
            done.update(ends)
            evidence = []
            for end in ends:
                check = self.wrong[end]
                evidence.append(f"{end.host} {end.port} sees {check.lldp_system} {check.lldp_port} "
                                f"(LLDP, {check.lldp_source}); the plan: {end.switch} {end.switch_port}")
                evidence.extend(text for _, text in self.issues.get(end, ()))
                evidence.extend(loss.get((end.host, end.rail), ()))
            fix = " and ".join(f"{end.host} {end.port} -> {end.switch} {end.switch_port}" for end in ends)
            if swap and q is not None:
                component = f"{p.host} {p.port} and {q.host} {q.port}: cables swapped"
                confidence = MAX_CONFIDENCE  # both ends agree
            else:
                owner = f", planned for {q.host} {q.port}" if q is not None else ", not in the plan"
                component = f"{p.host} {p.port} is cabled to {seen.lldp_system} {seen.lldp_port}{owner}"
                confidence = 0.9 if q is not None else 0.8
            rails = {end.rail for end in ends}
            out.append(Finding("miswire", component, hosts=tuple(sorted({e.host for e in ends})),
                               ports=tuple(x for e in ends for x in _link_ports(e)),
                               rail=rails.pop() if len(rails) == 1 else "", evidence=tuple(evidence),
                               confidence=confidence, fix=f"move {fix}"))
        return out


# --------------------------------------------------------------------------
# the pair table


@dataclass
class _Pair:
    rail: str
    a: str  # the sender
    b: str
    leaf_a: str
    leaf_b: str
    result: PairResult
    failed: bool
    explained: bool  # an end has a port finding
    flow_probes: int = 8  # Thresholds.flow_probes

    @property
    def cross_leaf(self) -> bool:
        return self.leaf_a != self.leaf_b

    @property
    def flows(self) -> int:
        """Flows (source ports) counted well enough to judge; 0 if not."""
        r = self.result
        if r.flows < 2 or (r.sent + r.burst_sent) < self.flow_probes * r.flows:
            return 0
        return r.flows

    @property
    def silent(self) -> int:
        return min(self.result.flows_silent, self.flows)

    @property
    def partial(self) -> bool:
        """Some flows dead, others answered: what a dead ECMP member does."""
        return 0 < self.silent < self.flows

    @property
    def broken(self) -> bool:
        """Fails, or loses whole flows: a forwarding fault on its path."""
        return self.failed or self.partial

    @property
    def loss_n(self) -> int:
        """Probes that count for random loss: the burst when there was one."""
        r = self.result
        return r.burst_sent if r.burst_sent > 0 else r.sent

    @property
    def loss_lost(self) -> int:
        r = self.result
        if r.burst_sent > 0:
            return max(0, r.burst_sent - r.burst_received)
        return max(0, r.sent - r.received)

    def touches(self, host: str) -> bool:
        return host in (self.a, self.b)

    def other(self, host: str) -> str:
        return self.b if host == self.a else self.a


def _pair_table(plan: CablingPlan, ok: Mapping[str, HostValidation], explained: set[tuple[str, str]],
                thresholds: Thresholds) -> tuple[list[_Pair], dict[str, list[str]]]:
    pairs: list[_Pair] = []
    incomplete: dict[str, list[str]] = defaultdict(list)
    for host in sorted(ok):
        for r in ok[host].pairs:
            own, peer = plan.port_of(host, r.rail), plan.port_of(r.peer_host, r.rail)
            if own is None or peer is None or r.peer_host == host:
                incomplete[host].append(f"a probe result for {r.peer_host or r.peer!r} on {r.rail!r} "
                                        "that the plan does not have: ignored")
                continue
            if r.peer_host not in ok:
                continue  # no result from the peer: the caller reports it
            if r.sent == 0 and r.burst_sent == 0:
                incomplete[host].append(f"no probe sent to {r.peer_host} on {r.rail}")
                continue
            failed = _fails(r, thresholds.fail_loss)
            pairs.append(_Pair(r.rail, host, r.peer_host, own.switch, peer.switch, r, failed,
                               (host, r.rail) in explained or (r.peer_host, r.rail) in explained,
                               thresholds.flow_probes))
    return pairs, incomplete


def _fails(r: PairResult, fail_loss: float) -> bool:
    """A pair fails (blackhole class) when every phase it ran lost at
    least `fail_loss`. Not the low-rate phase alone: its few dozen probes
    lose half by chance on a path that drops 30 % (2 % of pairs at 27
    probes), and the burst's hundreds then show what the path does; not
    the burst alone: a host that cannot keep up loses burst probes."""
    phases = [(n, got) for n, got in ((r.sent, r.received), (r.burst_sent, r.burst_received)) if n > 0]
    return bool(phases) and all(n - min(got, n) >= fail_loss * n for n, got in phases)


def _loss_by_port(pairs: Sequence[_Pair]) -> dict[tuple[str, str], list[str]]:
    """Evidence for port findings: what their pairs lost."""
    per: dict[tuple[str, str], list[_Pair]] = defaultdict(list)
    for pair in pairs:
        per[(pair.a, pair.rail)].append(pair)
        per[(pair.b, pair.rail)].append(pair)
    out = {}
    for key, items in per.items():
        failed = sum(p.failed for p in items)
        lost, n = sum(p.loss_lost for p in items), sum(p.loss_n for p in items)
        if failed or lost:
            out[key] = [f"{key[0]} on {key[1]}: {failed} of {len(items)} probed pairs fail; probes {_pct(lost, n)}"]
    return out


# --------------------------------------------------------------------------
# 2-4. one rail's pairs


@dataclass
class _RailStage:
    plan: CablingPlan
    rail: str
    pairs: list[_Pair]
    th: Thresholds
    no_lldp: set[tuple[str, str]] = field(default_factory=set)  # (host, rail): carrier, no LLDP
    done: set[int] = field(default_factory=set)  # ids of pairs a finding explains

    def run(self) -> list[Finding]:
        self.by_host: dict[str, list[_Pair]] = defaultdict(list)
        for p in self.pairs:
            self.by_host[p.a].append(p)
            self.by_host[p.b].append(p)
        leaves: dict[str, list[str]] = defaultdict(list)
        hosts = sorted(self.by_host)
        for host in hosts:
            port = self.plan.port_of(host, self.rail)
            assert port is not None  # _pair_table kept only planned ends
            leaves[port.switch].append(host)
        out = self._leaves(leaves)
        out += self._ports(hosts, leaves)
        above = self._above_leaves(leaves)
        lossy_uplinks = self._lossy_uplinks(leaves, above)
        out += above + lossy_uplinks
        out += self._lossy(hosts)
        out += self._unexplained()
        return out

    def _open(self) -> list[_Pair]:
        return [p for p in self.pairs if id(p) not in self.done]

    def _open_of(self, host: str) -> list[_Pair]:
        return [p for p in self.by_host.get(host, ()) if id(p) not in self.done]

    def _leaves(self, leaves: Mapping[str, list[str]]) -> list[Finding]:
        """A leaf under which every pair of every host fails."""
        out = []
        for leaf, members in sorted(leaves.items()):
            if len(members) < 2:
                continue  # one host: its port and its leaf look alike (see _ports)
            under = set(members)
            touching = list({id(p): p for h in members for p in self._open_of(h)}.values())
            if not touching or not all(p.failed for p in touching):
                continue
            rest = [p for p in self._open() if p.a not in under and p.b not in under]
            working = sum(not p.failed for p in rest) / len(rest) if rest else 0.0
            if rest and working < 0.5:
                continue  # most of the rail fails: not this leaf alone
            intra = sum(not p.cross_leaf for p in touching)
            evidence = [f"all {len(touching)} probed pairs of its {len(members)} hosts fail "
                        f"({intra} under {leaf}, {len(touching) - intra} to other leaves)"]
            if rest:
                evidence.append(f"the rest of {self.rail} works: {_share(rest)}")
                confidence = _strength(len(touching)) * working
            else:
                evidence.append(f"{leaf} is the only leaf probed on {self.rail}: it or every cable under it")
                confidence = 0.5
            self.done.update(id(p) for p in touching)
            out.append(Finding("leaf", f"{leaf} ({self.rail}): drops all traffic of its hosts",
                               hosts=tuple(members), ports=(leaf,), rail=self.rail, evidence=tuple(evidence),
                               confidence=round(confidence, 3)))
        return out

    def _ports(self, hosts: Sequence[str], leaves: Mapping[str, list[str]]) -> list[Finding]:
        """A host port whose every pair fails while its peers work."""
        out = []
        for host in hosts:
            touching = self._open_of(host)
            if not touching or not all(p.failed for p in touching):
                continue
            peers = sorted({p.other(host) for p in touching})
            fine = [g for g in peers if any(not p.failed and not p.touches(host) for p in self._open_of(g))]
            working = len(fine) / len(peers)
            if working < 0.5:
                continue  # its peers fail too: something bigger (left to the next steps)
            port = self.plan.port_of(host, self.rail)
            assert port is not None
            intra = sum(not p.cross_leaf for p in touching)
            evidence = [f"all {len(touching)} probed pairs of {host} on {self.rail} fail "
                        f"({intra} under {port.switch}, {len(touching) - intra} to other leaves)",
                        f"{len(fine)} of its {len(peers)} peers work with other hosts"]
            what, why, fix = self._blackhole_direction(host, port, touching)
            evidence += why
            if len(leaves.get(port.switch, ())) == 1:
                evidence.append(f"{host} is the only host probed under {port.switch}: the leaf itself is possible")
            self.done.update(id(p) for p in touching)
            out.append(Finding("blackhole", f"{_link(port)}: {what}", hosts=(host,),
                               ports=_link_ports(port), rail=self.rail, evidence=tuple(evidence),
                               confidence=round(_strength(len(touching)) * working, 3), fix=fix))
        return out

    def _blackhole_direction(self, host: str, port: PlannedPort,
                             touching: Sequence[_Pair]) -> tuple[str, list[str], str]:
        """(what it drops, evidence, fix) for a host port whose every pair
        fails: which way, from the receipts of what did come back, else
        from LLDP (frames from the leaf arriving or not)."""
        ways = _port_ways(host, touching)
        tx, rx = ways.tx, ways.rx
        if tx + rx >= self.th.min_lost:
            direction = judge(tx, rx)
            if direction in (Direction.REQUESTS, Direction.REPLIES):
                way = _WAY[direction]
                return (f"drops traffic {way}", [ways.evidence(host, port)],
                        _fix(direction, host, port))
        if (host, self.rail) in self.no_lldp:
            return ("drops all traffic, leaf to host at least",
                    [f"carrier up but no LLDP from {port.switch} either: frames from the leaf do not "
                     "arrive, so the leaf-to-host direction is dead; whether host to leaf works too "
                     "cannot be seen from the hosts (no reply can come back)"],
                    _fix(Direction.REPLIES, host, port)
                    + "; if the host-to-leaf direction is dead too: the cable, or both optics")
        return ("drops all traffic",
                ["carrier up, LLDP from the leaf as planned: frames from the leaf arrive, so either "
                 "the host-to-leaf direction is dead or the leaf's forwarding drops this port's "
                 "traffic while its control plane still sends LLDP"],
                f"{_fix(Direction.REQUESTS, host, port)}; else {port.switch} {port.switch_port}'s "
                "forwarding")

    def _above_leaves(self, leaves: Mapping[str, list[str]]) -> list[Finding]:
        """Cross-leaf pairs failing (or losing whole flows) while intra-leaf
        pairs work: the leaf uplinks or a spine path."""
        by_leaf_pair: dict[tuple[str, str], list[_Pair]] = defaultdict(list)
        for p in self._open():
            if p.cross_leaf:
                by_leaf_pair[tuple(sorted((p.leaf_a, p.leaf_b)))].append(p)  # type: ignore[arg-type]
        failing = {lp: items for lp, items in by_leaf_pair.items() if any(p.broken for p in items)}
        if not failing:
            return []
        out = []
        common = set.intersection(*(set(lp) for lp in failing))
        for leaf in sorted(common):
            own = {lp for lp in by_leaf_pair if leaf in lp}
            if len(failing) < 2 or own != set(failing):
                continue
            items = [p for lp in sorted(own) for p in by_leaf_pair[lp]]
            dead = sum(p.broken for p in items)
            intra = [p for p in self._open() if not p.cross_leaf and leaf in (p.leaf_a, p.leaf_b)]
            evidence = [f"{dead} of {len(items)} probed pairs from {leaf} to {len(own)} other leaves fail",
                        *_flow_evidence(items),
                        f"pairs between the other leaves work; under {leaf}: "
                        + (_share(intra) if intra else "none probed")]
            confidence = _strength(dead) * ONE_LEAF_SPINE_FACTOR * _working_share(intra)
            kind, what = (("leaf", f"{leaf} ({self.rail}) uplinks: drops all traffic to other leaves")
                          if _all_dead(items) else
                          ("spine_path", f"{leaf} ({self.rail}): one of its spine links"))
            self.done.update(id(p) for p in items if p.broken)
            out.append(Finding(kind, what, hosts=tuple(leaves.get(leaf, ())), ports=(leaf,), rail=self.rail,
                               evidence=tuple(evidence), confidence=round(confidence, 3)))
            return out  # one leaf explains every failing leaf pair
        for (x, y), items in sorted(failing.items()):
            dead = sum(p.broken for p in items)
            intra = [p for p in self._open() if not p.cross_leaf and p.leaf_a in (x, y)]
            evidence = [f"{dead} of {len(items)} probed pairs between {x} and {y} fail",
                        *_flow_evidence(items),
                        f"under {x} and {y}: " + (_share(intra) if intra else "none probed"),
                        f"the fault is on a spine link of {x} or of {y} (or a spine between them): "
                        "probes between two leaves cannot tell which side"]
            confidence = _strength(dead) * LEAF_PAIR_SPINE_FACTOR * _working_share(intra)
            self.done.update(id(p) for p in items if p.broken)
            out.append(Finding("spine_path", f"{x} <-> {y} ({self.rail}) through the spines",
                               hosts=tuple(sorted({*leaves.get(x, ()), *leaves.get(y, ())})), ports=(x, y),
                               rail=self.rail, evidence=tuple(evidence), confidence=round(confidence, 3)))
        return out

    def _lossy_uplinks(self, leaves: Mapping[str, list[str]], above: list[Finding]) -> list[Finding]:
        """Random loss on the spine links of one leaf (greedy, module doc):
        its cross-leaf pairs lose, spread over several hosts at each end,
        while the pairs under it and the rest of the rail do not. Loss on
        the spine links of a leaf that a spine_path finding in `above`
        already names is part of that finding (its evidence; one fault, one
        finding): flows too thin to count fail some pairs and thin others."""
        out: list[Finding] = []
        while True:
            working = [p for p in self._open() if not p.failed]
            suspects = []
            for leaf in sorted(leaves):
                suspect = self._lossy_uplink_suspect(leaf, leaves, working)
                if suspect is not None:
                    suspects.append(suspect)
            if not suspects:
                return out
            rate, leaf, cross, rest = max(suspects, key=lambda s: (s[0], s[1]))
            self.done.update(id(p) for p in cross)
            named = next((i for i, f in enumerate(above) if leaf in f.ports), None)
            if named is not None:
                lost, n = sum(p.loss_lost for p in cross), sum(p.loss_n for p in cross)
                line = (f"{len(cross)} more pairs from {leaf} to other leaves lost probes ({_pct(lost, n)}): "
                        "their flows that crossed the fault")
                above[named] = replace(above[named], evidence=above[named].evidence + (line,))
                continue
            out.append(self._lossy_uplink_finding(leaf, leaves, cross, rest))

    def _lossy_uplink_suspect(self, leaf: str, leaves: Mapping[str, list[str]],
                              working: Sequence[_Pair]) -> tuple[float, str, list[_Pair], list[_Pair]] | None:
        under = set(leaves.get(leaf, ()))
        cross = [p for p in working if p.cross_leaf and leaf in (p.leaf_a, p.leaf_b)]
        lost, n = sum(p.loss_lost for p in cross), sum(p.loss_n for p in cross)
        if not n or lost < self.th.min_lost:
            return None
        lossy = [p for p in cross if p.loss_lost > 0]
        near = {h for p in lossy for h in (p.a, p.b) if h in under}
        far = {h for p in lossy for h in (p.a, p.b) if h not in under}
        far_leaves = {_far_leaf(p, leaf) for p in cross}
        lossy_leaves = {_far_leaf(p, leaf) for p in lossy}
        # One host port losing (here or beyond) puts all the loss on that one host.
        if len(near) < 2 or len(far) < 2 or len(lossy_leaves) < min(2, len(far_leaves)):
            return None
        rest = [p for p in working if not (p.cross_leaf and leaf in (p.leaf_a, p.leaf_b))]
        rest_lost, rest_n = sum(p.loss_lost for p in rest), sum(p.loss_n for p in rest)
        intra = [p for p in rest if not p.cross_leaf and p.leaf_a == leaf]
        intra_lost, intra_n = sum(p.loss_lost for p in intra), sum(p.loss_n for p in intra)
        rate = lost / n
        # Lossy host ports under the leaf would lose on the pairs under it too.
        if rest_n and rate < self.th.concentration * rest_lost / rest_n:
            return None
        if intra_n and rate < self.th.concentration * intra_lost / intra_n:
            return None
        return rate, leaf, cross, rest

    def _lossy_uplink_finding(self, leaf: str, leaves: Mapping[str, list[str]], cross: list[_Pair],
                              rest: list[_Pair]) -> Finding:
        lost, n = sum(p.loss_lost for p in cross), sum(p.loss_n for p in cross)
        rest_lost, rest_n = sum(p.loss_lost for p in rest), sum(p.loss_n for p in rest)
        intra = [p for p in rest if not p.cross_leaf and p.leaf_a == leaf]
        far_leaves = sorted({_far_leaf(p, leaf) for p in cross})
        if len(far_leaves) == 1 and far_leaves[0] < leaf:
            # Two leaves only (either one's spine links): named in order, the direction from the first.
            leaf, far_leaves = far_leaves[0], [leaf]
            intra = [p for p in rest if not p.cross_leaf and p.leaf_a in (leaf, far_leaves[0])]
        lossy_pairs = sum(p.loss_lost > 0 for p in cross)
        phase = "burst phase" if all(p.result.burst_sent > 0 for p in cross) else "low-rate phase"
        between = (f"between {leaf} and {far_leaves[0]}" if len(far_leaves) == 1 else
                   f"from {leaf} to {len(far_leaves)} other leaves")
        evidence = [f"{phase}: {_pct(lost, n)} over {len(cross)} pairs {between}, {lossy_pairs} of them "
                    "with loss, hosts at both ends",
                    f"pairs under {' and '.join([leaf, *far_leaves][:1 + (len(far_leaves) == 1)])}: "
                    + (_pct(sum(p.loss_lost for p in intra), sum(p.loss_n for p in intra)) if intra else "none probed")
                    + f"; the rest of {self.rail}: {_pct(rest_lost, rest_n)}: not a host port"]
        background = rest_lost / rest_n if rest_n else 0.0
        significance = _poisson_cdf(lost - 1, n * max(background, 1e-6))
        confidence = (lost / (lost + rest_lost)) * significance * _strength(lossy_pairs)
        ports: tuple[str, ...]
        if len(far_leaves) == 1:
            # Two leaves only: the loss is on a spine link of either.
            (other,) = far_leaves
            where = f"{leaf} <-> {other} ({self.rail}) through the spines"
            ports, hosts = (leaf, other), tuple(sorted({*leaves.get(leaf, ()), *leaves.get(other, ())}))
            confidence *= LEAF_PAIR_SPINE_FACTOR
        else:
            other = ""
            where = f"{leaf} ({self.rail}): one of its spine links"
            ports, hosts = (leaf,), tuple(leaves.get(leaf, ()))
            confidence *= ONE_LEAF_SPINE_FACTOR
        what = f"random loss ~{_percent(lost / n)} per round trip"
        up, down, receipts = _leaf_ways(leaf, cross)
        fix = ""
        if receipts:
            probes = sum(p.result.sent + p.result.burst_sent for p in cross)
            ahead = f"{other}" if other else "the spines"
            evidence.append(f"per direction (the responders' receipts): {leaf} to {ahead}: {_pct(up, probes)}; "
                            f"{ahead} to {leaf}: {_pct(down, probes)}")
            direction = judge(up, down)
            if direction in _UPLINK_WAY:
                what += f", {_UPLINK_WAY[direction] if not other else _pair_way(direction, leaf, other)}"
                fix = _uplink_fix(direction, leaf, other)
        else:
            evidence.append("which way is not known: the peers' responders keep no receipts (round trip only)")
        evidence.append("only the flows ECMP hashes onto the lossy link lose; which spine (and, with two "
                        "leaves, which leaf's link) the hosts cannot see: the switch ports' error counters tell")
        return Finding("lossy_link", f"{where}: {what}", hosts=hosts, ports=ports, rail=self.rail,
                       evidence=tuple(evidence), confidence=round(min(MAX_CONFIDENCE, confidence), 3), fix=fix)

    def _lossy(self, hosts: Sequence[str]) -> list[Finding]:
        """Random loss concentrated on one host port (greedy, module doc)."""
        out = []
        remaining = {id(p): p for p in self._open() if not p.failed}
        blamed: set[str] = set()
        while True:
            suspects = []
            for host in hosts:
                if host in blamed:
                    continue
                own = [p for p in self.by_host.get(host, ()) if id(p) in remaining]
                lost, n = sum(p.loss_lost for p in own), sum(p.loss_n for p in own)
                lossy_pairs = sum(p.loss_lost > 0 for p in own)
                # All its loss on one pair: that peer or that path, not this port.
                if n and lost >= self.th.min_lost and lossy_pairs >= min(2, len(own)):
                    suspects.append((-lost / n, -lost, host, own, lost, n, lossy_pairs))
            if not suspects:
                return out
            suspect_names = {s[2] for s in suspects}
            # The background: pairs that touch no suspect (robust to several
            # lossy ports); when every pair touches one, the median suspect
            # (a rail that loses everywhere has no port to blame).
            clean = [p for p in remaining.values() if p.a not in suspect_names and p.b not in suspect_names]
            rest_lost, rest_n = sum(p.loss_lost for p in clean), sum(p.loss_n for p in clean)
            background = (rest_lost / rest_n if rest_n else
                          statistics.median(lost / n for _, _, _, _, lost, n, _ in suspects))
            chosen = None
            for _, _, host, own, lost, n, lossy_pairs in sorted(suspects, key=lambda s: s[:3]):
                if lost / n < self.th.concentration * background:
                    continue  # not concentrated: the whole rail loses
                chosen = (host, own, lost, n, lossy_pairs, rest_lost, rest_n)
                break
            if chosen is None:
                pairs = list(remaining.values())
                lost, n = sum(p.loss_lost for p in pairs), sum(p.loss_n for p in pairs)
                out.append(Finding(
                    "unexplained", f"{self.rail}: random loss spread over {len(suspect_names)} host ports, "
                    "no single port to blame", hosts=tuple(sorted(suspect_names)), rail=self.rail,
                    evidence=(f"pairs left on {self.rail}: {_pct(lost, n)}",
                              "a loss this even across ports points at something they share (spines, a leaf, "
                              "the probing hosts' own load)"), confidence=0.3))
                return out
            host, own, lost, n, lossy_pairs, rest_lost, rest_n = chosen
            blamed.add(host)
            out.append(self._lossy_finding(host, own, lost, n, lossy_pairs, rest_lost, rest_n))
            self.done.update(id(p) for p in own)
            for p in own:
                remaining.pop(id(p), None)

    def _lossy_finding(self, host: str, own: list[_Pair], lost: int, n: int, lossy_pairs: int,
                       rest_lost: int, rest_n: int) -> Finding:
        port = self.plan.port_of(host, self.rail)
        assert port is not None
        burst = all(p.result.burst_sent > 0 for p in own)
        phase = "burst phase" if burst else "low-rate phase"
        low_lost = sum(max(0, p.result.sent - p.result.received) for p in own)
        low_n = sum(p.result.sent for p in own)
        background = rest_lost / rest_n if rest_n else 0.0
        # How unlikely this many losses are at the rest of the rail's rate.
        significance = _poisson_cdf(lost - 1, n * max(background, 1e-6))
        concentration = lost / (lost + rest_lost)
        evidence = [f"{phase}: {_pct(lost, n)} over {len(own)} pairs, {lossy_pairs} of them with loss",
                    f"the rest of {self.rail}: {_pct(rest_lost, rest_n)}",
                    f"{phase} on this port resolves loss >= "
                    f"{_percent(detectable_loss(n, self.th.min_lost, self.th.power))}"]
        if burst:
            evidence.append(f"low-rate phase: {_pct(low_lost, low_n)}; it resolves only >= "
                            f"{_percent(detectable_loss(low_n, self.th.min_lost, self.th.power))}")
        confidence = concentration * significance * _strength(lossy_pairs)
        ways = _port_ways(host, own)
        what = f"random loss ~{_percent(lost / n)} per round trip"
        fix = ""
        if ways.receipts:
            evidence.append(ways.evidence(host, port))
            direction = judge(ways.tx, ways.rx)
            if direction in _WAY:
                what += f", {_WAY[direction]}"
                fix = _fix(direction, host, port)
        else:
            evidence.append("which way is not known: the peers' responders keep no receipts "
                            "(round trip only)")
        return Finding("lossy_link", f"{_link(port)}: {what}", hosts=(host,),
                       ports=_link_ports(port), rail=self.rail, evidence=tuple(evidence),
                       confidence=round(min(MAX_CONFIDENCE, confidence), 3), fix=fix)

    def _unexplained(self) -> list[Finding]:
        left = [p for p in self._open() if p.failed]
        if not left:
            return []
        shown = [f"{p.a} -> {p.b}: {_pct(p.result.sent - min(p.result.received, p.result.sent), p.result.sent)}"
                 for p in left[:8]]
        return [Finding("unexplained", f"{self.rail}: {len(left)} failing pairs no single component explains",
                        hosts=tuple(sorted({h for p in left for h in (p.a, p.b)})), rail=self.rail,
                        evidence=tuple(shown), confidence=0.3)]


# A host port's directions, as core.direction names a probe's (the host sends the requests).
_WAY = {Direction.REQUESTS: "host to leaf", Direction.REPLIES: "leaf to host",
        Direction.BOTH: "both ways"}


def _fix(direction: Direction, host: str, port: PlannedPort) -> str:
    """Where to look first for loss in `direction` on a host port's link."""
    if direction is Direction.REQUESTS:
        return (f"check the transmitter on the host side first: {host} {port.port} (its optic or "
                f"NIC), then the cable and {port.switch} {port.switch_port}'s receiver")
    if direction is Direction.REPLIES:
        return (f"check the transmitter on the leaf side first: {port.switch} {port.switch_port} "
                f"(its optic), then the cable and {host} {port.port}'s receiver")
    return (f"check the cable first (both directions lose), then the optics at both ends "
            f"({host} {port.port}, {port.switch} {port.switch_port})")


# A leaf's spine links' directions: a request lost from a pair a host under
# the leaf sent went up (leaf to spine), one it answered came down.
_UPLINK_WAY = {Direction.REQUESTS: "leaf to spine", Direction.REPLIES: "spine to leaf",
               Direction.BOTH: "both ways"}


def _far_leaf(p: _Pair, leaf: str) -> str:
    return p.leaf_b if p.leaf_a == leaf else p.leaf_a


def _pair_way(direction: Direction, leaf: str, other: str) -> str:
    return {Direction.REQUESTS: f"{leaf} to {other}", Direction.REPLIES: f"{other} to {leaf}"}.get(
        direction, "both ways")


def _leaf_ways(leaf: str, pairs: Sequence[_Pair]) -> tuple[int, int, bool]:
    """(lost going up from `leaf` to the spines, lost coming down to it,
    any receipts) over its cross-leaf pairs: a request lost from a pair sent
    under the leaf went up, a reply lost came down; the other way round for
    a pair it answered."""
    return _ways(pairs, lambda p: p.leaf_a == leaf)


def _ways(pairs: Sequence[_Pair], sent: Callable[[_Pair], bool]) -> tuple[int, int, bool]:
    """(lost on the way out, lost on the way in, any receipts) from the
    pairs' receipts, seen from the side that `sent` says probed the pair: a
    request lost from a pair it sent went out, a reply lost came in; the
    other way round for a pair it answered."""
    out = back = 0
    receipts = False
    for p in pairs:
        r = p.result
        if not r.receipts:
            continue
        receipts = True
        if sent(p):
            out, back = out + r.requests_lost, back + r.replies_lost
        else:
            out, back = out + r.replies_lost, back + r.requests_lost
    return out, back, receipts


def _uplink_fix(direction: Direction, leaf: str, other: str) -> str:
    """Where to look first for loss in `direction` on `leaf`'s spine links
    (`other`: the one other leaf, when the rail has two: either leaf's)."""
    if other:
        sender, receiver = (leaf, other) if direction is Direction.REQUESTS else (other, leaf)
        if direction is Direction.BOTH:
            return (f"check the cables between {leaf}, {other} and the spines first (both directions lose), "
                    "then the optics at both ends")
        return (f"check the transmitters on {sender}'s spine-facing ports and the spines' ports facing "
                f"{receiver} first (their optics; the ports' error counters tell which), then the cables")
    if direction is Direction.REQUESTS:
        return (f"check the transmitters on {leaf}'s spine-facing ports first (their optics; the ports' "
                f"error counters tell which spine), then the cables and the spines' receivers")
    if direction is Direction.REPLIES:
        return (f"check the spines' transmitters towards {leaf} first (the spine ports facing {leaf}: "
                f"their optics), then the cables and {leaf}'s uplink receivers")
    return (f"check the cables between {leaf} and the spines first (both directions lose), then the "
            "optics at both ends")


@dataclass(frozen=True)
class _Ways:
    """A host port's lost probes by direction (from its pairs' receipts)."""

    tx: int  # host to leaf
    rx: int  # leaf to host
    unclassed: int
    probes: int  # probes through the port (each crosses it once each way)
    receipts: bool

    def evidence(self, host: str, port: PlannedPort) -> str:
        n = self.probes
        return (f"per direction (the responders' receipts): {host} {port.port} to {port.switch}: "
                f"{_pct(self.tx, n)}; {port.switch} to {host}: {_pct(self.rx, n)}"
                + (f"; {self.unclassed:,} lost probes not classed (nothing came back after them)"
                   if self.unclassed else ""))


def _port_ways(host: str, pairs: Sequence[_Pair]) -> _Ways:
    """Which way `host`'s pairs lost probes (both phases): a request lost
    from a pair `host` sent is host to leaf, from a pair it answered is
    leaf to host; a reply lost the other way round."""
    probes = sum(p.result.sent + p.result.burst_sent for p in pairs)
    lost = sum(max(0, p.result.sent - p.result.received)
               + max(0, p.result.burst_sent - p.result.burst_received) for p in pairs)
    tx, rx, receipts = _ways(pairs, lambda p: p.a == host)
    return _Ways(tx, rx, max(0, lost - tx - rx), probes, receipts)


def _merge_lldp(findings: list[Finding]) -> list[Finding]:
    """One fault, one finding: a port with no LLDP neighbour whose traffic
    a blackhole or leaf finding already explains is part of that finding
    (a dead optic or fibre kills LLDP too), not a finding of its own."""
    covering = [f for f in findings if f.kind in ("blackhole", "leaf")]
    out = []
    absorbed: dict[int, list[str]] = defaultdict(list)
    for f in findings:
        if f.kind == "lldp":
            owner = next((c for c in covering if c.rail == f.rail and set(f.hosts) <= set(c.hosts)),
                         None)
            if owner is not None:
                absorbed[id(owner)].extend(f.evidence)
                continue
        out.append(f)
    return [replace(f, evidence=f.evidence + tuple(e for e in absorbed[id(f)]
                                                   if f.kind == "leaf"))
            if absorbed.get(id(f)) else f for f in out]


def _all_dead(items: Sequence[_Pair]) -> bool:
    """Everything across these pairs died: every flow silent where flows
    were counted, else every pair failed."""
    if all(p.flows for p in items):
        return all(p.silent == p.flows for p in items)
    return all(p.failed for p in items)


def _flow_evidence(items: Sequence[_Pair]) -> list[str]:
    counted = [p for p in items if p.flows]
    if not counted:
        return ["flows not counted (a single source port per pair): a dead spine link and dead "
                "uplinks look alike when every probed flow happens to hash onto the dead link"]
    flows, silent = sum(p.flows for p in counted), sum(p.silent for p in counted)
    partial = sum(p.partial for p in counted)
    line = (f"{silent} of {flows} flows (UDP source ports) of {len(counted)} pairs got no reply at all; "
            f"{partial} pairs lost some flows and kept the others")
    if 0 < silent < flows:
        line += ": ECMP hashes each flow onto one spine, and the flows hashed onto a dead link die"
    return [line]


def _share(pairs: Sequence[_Pair]) -> str:
    return f"{sum(not p.failed for p in pairs)} of {len(pairs)} pairs work"


def _working_share(pairs: Sequence[_Pair]) -> float:
    """Intra-leaf pairs that work (1.0 when none were probed: no counter-evidence)."""
    return sum(not p.failed for p in pairs) / len(pairs) if pairs else 1.0
