"""The model of a fleet validation run: its probe plan and its time, for any
cabling plan, from a 4-host lab to 2,048 hosts x 8 rails (Llama-3 scale:
16,384 GPUs). labs/bench/validate.py runs it beside the lab it checks it
against; this module has no command line of its own.

What is computed, what is measured and what is assumed (the bench prints
all of it and writes it to its JSON under "assumptions" and "notes"):

- The probe plan is the real one (linkpassd.validate.probeplan) for each
  size: its pairs, intra- and cross-leaf, each host's degree (pairs it sends
  on plus pairs it answers). At scale, leaves hold `hosts_per_leaf` hosts per
  rail.
- The rates are the real ones: linkpassd.validate.schedule, the function the
  aggregator calls (per-host probe budget shared over the busiest host's
  degree; a burst sized for 0.1 % random loss on the least probed port).
- The window: at scale, the shortest `--duration` whose low-rate phase still
  lasts `low_s` (100 samples per pair at 10/s, for a p99 RTT) after the
  host's start readings, the burst, the reply grace and the end readings
  (hostcheck's timeline); for a lab run, the duration the lab used. The
  host answers at duration - END_READ_S + `host_end_s` (its end readings
  and the answer's trip up the stream: assumed, and checked by the lab).
- LLDP: nothing extra when lldpd runs on the hosts (its table is read at
  once); a full LLDP transmit interval when a host must read a frame off the
  wire, so the window is at least `lldp_wire_s` then.
- Aggregator: building and serialising every host's ValidateHost, parsing
  every host's HostValidation, localising, and rendering the report the
  operator reads are *measured* here, in this process, on synthetic
  healthy results of the same size (this 2-core VM, shared: an upper
  bound); gRPC send/receive per host message is an assumed constant on top.
- A dead leaf-to-spine link at scale: how many probe flows (pairs x source
  ports) cross a leaf's uplinks, the chance that none hashes onto the dead
  link (ECMP over `uplinks_per_leaf`), and the chance that every one does
  (the run would then read it as dead uplinks, not one spine link).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from linkpassd._proto.linkpass.v1 import fleet_pb2
from linkpassd.adapters.hostcheck import END_READ_S, REPLY_GRACE_S
from linkpassd.adapters.valprober import FLOWS
from linkpassd.validate import report as reporting
from linkpassd.validate import schedule as rates
from linkpassd.validate.localize import Thresholds, localize
from linkpassd.validate.plan import CablingPlan, PlannedPort
from linkpassd.validate.probeplan import CROSS_PER_HOST, CROSS_PER_LEAF_PAIR, ProbePlan
from linkpassd.validate.results import HostResult, HostValidation, PairResult, PortCheck

TARGET_S = 300.0
TARGET_HOSTS, TARGET_RAILS = 2048, 8


@dataclass(frozen=True)
class Assumptions:
    hosts_per_leaf: int = 32  # a 64-port leaf per rail: 32 hosts down, 32 spine links up
    uplinks_per_leaf: int = 32  # ECMP width towards the spines
    low_s: float = 10.0  # low-rate phase at scale: 100 samples per pair (a p99)
    start_read_s: float = 0.3  # carrier, counters, lldpd's table at the window's start
    host_end_s: float = 0.5  # end readings + the answer's trip up the stream (checked by the lab)
    lldp_wire_s: float = 31.0  # no lldpd on the host: one LLDP transmit interval (30 s) + 1
    grpc_per_message_s: float = 0.0005  # aggregator send or receive per host message, on top of
    # the measured (de)serialisation
    host_budget_pps: float = rates.HOST_BUDGET_PPS  # a real host's; a lab's is its share
    flows: int = FLOWS
    cross_per_leaf_pair: int = CROSS_PER_LEAF_PAIR
    cross_per_host: int = CROSS_PER_HOST
    min_lost: int = Thresholds.min_lost


def cabling(hosts: int, rails: int, per_leaf: int) -> CablingPlan:
    return CablingPlan(tuple(
        PlannedPort(f"gpu-{h:05d}", f"eth{r}", f"leaf-r{r}-{h // per_leaf:03d}", f"Ethernet{h % per_leaf + 1}",
                    f"rail{r}", 400_000)
        for r in range(rails) for h in range(hosts)))


def addresses(plan: CablingPlan) -> dict[tuple[str, str], str]:
    hosts = plan.hosts()
    return {(p.host, p.rail): f"10.{int(p.rail[4:]) % 256}.{hosts.index(p.host) // 250}."
            f"{hosts.index(p.host) % 250 + 1}" for p in plan.ports}


def probe_plan(plan: CablingPlan, a: Assumptions) -> tuple[ProbePlan, float]:
    t0 = time.perf_counter()
    probes = ProbePlan.from_plan(plan, addresses(plan), cross_per_leaf_pair=a.cross_per_leaf_pair,
                                 cross_per_host=a.cross_per_host)
    return probes, time.perf_counter() - t0


def plan_shape(probes: ProbePlan) -> dict:
    counts = probes.counts()
    per_host: dict[str, int] = {}
    for (host, _), (out, _inn) in probes.degrees().items():
        per_host[host] = per_host.get(host, 0) + out
    host_load, port_load = rates.loads(probes)
    through: dict[tuple[str, str], int] = {}  # (rail, leaf) -> cross-leaf pairs through its uplinks
    for p in probes.probes:
        if p.cross_leaf:
            for leaf in (p.sender_leaf, p.receiver_leaf):
                through[(p.rail, leaf)] = through.get((p.rail, leaf), 0) + 1
    leaves = {(m.rail, m.leaf) for m in probes.members}
    return {
        "probes": probes.size,
        "intra": sum(c["intra"] for c in counts.values()),
        "cross": sum(c["cross"] for c in counts.values()),
        "leaves": len(leaves),
        "targets_per_host_max": max(per_host.values(), default=0),
        "targets_per_host_mean": round(sum(per_host.values()) / max(1, len(per_host)), 1),
        "host_load_max": host_load,  # pairs sent on + answered, all rails
        "port_load_min": port_load,
        "cross_pairs_through_a_leaf_min": min(through.values()) if len(leaves) > len(counts) else 0,
    }


def duration_for(probes: ProbePlan, a: Assumptions) -> tuple[float, rates.Schedule]:
    """The shortest --duration whose low-rate phase lasts `low_s` (hostcheck:
    low = duration - END_READ_S - start reads - grace - burst)."""
    fixed = a.low_s + END_READ_S + a.start_read_s + REPLY_GRACE_S
    duration = fixed + rates.MIN_BURST_S
    for _ in range(20):
        sched = rates.schedule(probes, duration, budget_pps=a.host_budget_pps)
        want = math.ceil((fixed + sched.burst_s) * 10) / 10
        if want <= duration:
            return duration, sched
        duration = want
    return duration, sched


def dead_spine_link(shape: dict, a: Assumptions) -> dict:
    flows = shape["cross_pairs_through_a_leaf_min"] * a.flows
    p_hit = 1 - (1 - 1 / a.uplinks_per_leaf) ** 2  # either direction of a flow
    return {"flows_through_the_leaf_uplinks": flows, "p_flow_hits": round(p_hit, 4),
            "expected_silent_flows": round(flows * p_hit, 1),
            "p_missed": float(f"{(1 - p_hit) ** flows:.3g}") if flows else 1.0,
            "p_read_as_dead_uplinks": float(f"{p_hit ** flows:.3g}") if flows else 0.0}


def _synthetic(plan: CablingPlan, probes: ProbePlan, rate_n: int, burst_n: int,
               flows: int) -> dict[str, HostValidation]:
    out = {}
    for host in plan.hosts():
        ports = [p for p in (plan.port_of(host, rail) for rail in plan.rails()) if p is not None]
        checks = tuple(PortCheck(p.port, p.rail, True, p.speed_mbps, p.switch, p.switch_port, "lldpd") for p in ports)
        pairs = tuple(PairResult(t.rail, t.peer, t.peer_host, rate_n, rate_n, 20, 55, burst_n, burst_n, flows, 0)
                      for t in probes.targets_for(host))
        out[host] = HostValidation("model", checks, pairs)
    return out


def measure_server(plan: CablingPlan, probes: ProbePlan, sched: rates.Schedule, duration: float,
                   a: Assumptions) -> dict:
    """Time what the aggregator and the operator's CLI do per run, here."""
    t0 = time.perf_counter()
    commands = []
    for host in plan.hosts():
        command = fleet_pb2.Command(id=host, validate=fleet_pb2.ValidateHost(
            run_id="model", duration_s=duration,
            ports=[fleet_pb2.ExpectedPort(port=p.port, rail=p.rail, speed_mbps=p.speed_mbps,
                                          switch_name=p.switch, switch_port=p.switch_port)
                   for p in (plan.port_of(host, r) for r in plan.rails()) if p is not None],
            targets=[t.to_proto() for t in probes.targets_for(host)],
            probed_by=[t.to_proto() for t in probes.probers_of(host)], rate_pps=sched.rate_pps,
            burst_pps=sched.burst_pps, burst_s=sched.burst_s, flows=a.flows))
        commands.append(command.SerializeToString())
    build_s = time.perf_counter() - t0
    low_s = duration - END_READ_S - a.start_read_s - REPLY_GRACE_S - sched.burst_s
    rate_n, burst_n = math.floor(sched.rate_pps * low_s), math.floor(sched.burst_pps * sched.burst_s)
    results = _synthetic(plan, probes, rate_n, burst_n, a.flows)
    wire = [HostResult(h, "ok", v).to_proto().SerializeToString() for h, v in results.items()]
    t0 = time.perf_counter()
    parsed = [fleet_pb2.HostValidationResult.FromString(b) for b in wire]
    parse_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    analysis = localize(plan, parsed, Thresholds(min_lost=a.min_lost))
    localize_s = time.perf_counter() - t0
    report = reporting.build_report("model", parsed, analysis.findings, analysis.loss_resolution)
    t0 = time.perf_counter()
    reporting.render_text(report)
    text_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    json_bytes = len(reporting.to_json(report))
    json_s = time.perf_counter() - t0
    grpc_s = 2 * len(commands) * a.grpc_per_message_s
    return {"build_commands_s": round(build_s, 3), "command_bytes_max": max(map(len, commands)),
            "parse_results_s": round(parse_s, 3), "result_bytes_total": sum(map(len, wire)),
            "localize_s": round(localize_s, 3), "findings_on_healthy": len(analysis.findings),
            "loss_resolution": analysis.loss_resolution, "render_text_s": round(text_s, 3),
            "report_json_s": round(json_s, 3), "report_json_bytes": json_bytes,
            "report_proto_bytes": report.ByteSize(), "grpc_assumed_s": round(grpc_s, 3)}


def predict(plan: CablingPlan, a: Assumptions, *, duration: float | None = None,
            measure: bool = True) -> dict:
    """One size: the plan's shape, its schedule and window, and (`measure`)
    the run's predicted time: the aggregator's run (started to report) and
    the operator's command (plus the CLI's parse and render of the report;
    its start-up is the lab's to measure)."""
    probes, plan_s = probe_plan(plan, a)
    shape = plan_shape(probes)
    if duration is None:
        duration, sched = duration_for(probes, a)
    else:
        sched = rates.schedule(probes, duration, budget_pps=a.host_budget_pps)
    row = {"hosts": len(plan.hosts()), "rails": len(plan.rails()), **shape, "duration_s": duration,
           "rate_pps": sched.rate_pps, "burst_pps": sched.burst_pps, "burst_s": sched.burst_s,
           "busiest_host_pps": round(sched.busiest_host_pps), "expected_resolution": sched.resolution,
           "probe_plan_s": round(plan_s, 3)}
    hosts = row["hosts"]
    row["full_mesh_probes"] = row["rails"] * hosts * (hosts - 1) // 2
    if shape["leaves"] > row["rails"]:
        row["dead_spine_link"] = dead_spine_link(shape, a)
    if measure:
        row["server"] = server = measure_server(plan, probes, sched, duration, a)
        server_s = (plan_s + server["build_commands_s"] + server["parse_results_s"] + server["localize_s"]
                    + server["grpc_assumed_s"])
        host_s = duration - END_READ_S + a.host_end_s
        row["predicted_run_s"] = round(host_s + server_s, 2)
        row["predicted_run_lldp_on_wire_s"] = round(max(host_s, a.lldp_wire_s + a.host_end_s) + server_s, 2)
        row["cli_render_s"] = server["render_text_s"]
    return row
