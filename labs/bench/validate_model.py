"""A model of fleet validation's probe plan and time as the fleet grows
(issue 13), extrapolated to 2,048 hosts x 8 rails (Llama-3 scale: 16,384
GPUs); target: the whole run in <= 5 minutes.

    .venv/bin/python -m labs.bench.validate_model [--hosts 8,32,128,512,1024,2048] [--rails 2,8]
        [--hosts-per-leaf 32] [--label model]

What is computed, what is measured and what is assumed (all printed, and
written to the JSON under "assumptions"):

- The probe plan is the real one (linkpassd.validate.probeplan) for each
  size: its probes, intra- and cross-leaf, and each host's degree (probes it
  sends + probes it answers). Leaves hold `hosts_per_leaf` hosts per rail.
- Every host probes in parallel; one host's time is set by its own degree.
  Low-rate phase: `rate_pps` per target for `low_s` (enough samples for a
  p99 RTT per pair); when a host's send+answer load would exceed its probe
  budget, the phase stretches so every pair still gets its samples. Burst
  phase: each port must see enough probes (sent and answered) that random
  loss of `target_resolution` shows as >= min_lost (3) losses with 95 %
  probability (localize.detectable_loss); the per-target burst rate is the
  budget shared by the worst host's degree, capped at `burst_cap_pps` (the
  peers' echo responders allow 5,000/s per source; we stay well under).
- The window also covers LLDP: none extra when lldpd runs on the hosts (its
  table is read at once), a full LLDP transmit interval when the host must
  sniff frames on the wire.
- Aggregator: building and serialising every host's ValidateHost, parsing
  every host's HostValidation, localising and rendering the report are
  *measured* here on synthetic healthy results of the same size (this
  2-core VM, busy with others' tests: an upper bound); gRPC send/receive
  per message is an assumed constant on top.
- A dead leaf-to-spine link: how many probe flows cross a leaf's uplinks,
  and the chance that none hashes onto the dead one (ECMP over `uplinks`).

Writes labs/bench/results/validate_model-<label>.json and .png.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from linkpassd._proto.linkpass.v1 import fleet_pb2
from linkpassd.validate import report as reporting
from linkpassd.validate.localize import Thresholds, detectable_loss, localize
from linkpassd.validate.plan import CablingPlan, PlannedPort
from linkpassd.validate.probeplan import CROSS_PER_HOST, CROSS_PER_LEAF_PAIR, ProbePlan
from linkpassd.validate.results import HostResult, HostValidation, PairResult, PortCheck

RESULTS = Path(__file__).parent / "results"
TARGET_S = 300.0
TARGET_HOSTS, TARGET_RAILS = 2048, 8


@dataclass(frozen=True)
class Assumptions:
    hosts_per_leaf: int = 32  # a 64-port leaf per rail: 32 hosts down, 32 spine links up
    uplinks_per_leaf: int = 32  # ECMP width towards the spines
    rate_pps: float = 10.0  # low-rate phase, per target
    low_s: float = 10.0  # low-rate phase length: 100 samples per pair (a p99)
    burst_cap_pps: float = 1000.0  # per target; responders allow 5,000/s per source
    host_budget_pps: float = 10_000.0  # probes sent + answered per host per second: at the
    # measured 35-60 us of CPU per probe (README, probe_scale) about half of one core
    target_resolution: float = 0.001  # random loss per host port the burst must resolve
    min_lost: int = 3  # losses before a port is lossy (localize.Thresholds)
    phase_gap_s: float = 1.0  # between the phases (counters read, prober switch)
    host_overhead_s: float = 2.0  # port checks outside the window: ethtool, EEPROM, counters
    lldp_wire_s: float = 31.0  # no lldpd on the host: one LLDP transmit interval (30 s) + 1
    grpc_per_message_s: float = 0.0005  # aggregator send or receive per host message, on top of
    # the measured (de)serialisation
    cross_per_leaf_pair: int = CROSS_PER_LEAF_PAIR
    cross_per_host: int = CROSS_PER_HOST


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cabling(hosts: int, rails: int, per_leaf: int) -> CablingPlan:
    return CablingPlan(tuple(
        PlannedPort(f"gpu-{h:05d}", f"eth{r}", f"leaf-r{r}-{h // per_leaf:03d}", f"Ethernet{h % per_leaf + 1}",
                    f"rail{r}", 400_000)
        for r in range(rails) for h in range(hosts)))


def addresses(hosts: int, rails: int) -> dict[tuple[str, str], str]:
    return {(f"gpu-{h:05d}", f"rail{r}"): f"10.{r}.{h // 250}.{h % 250 + 1}" for r in range(rails) for h in range(hosts)}


def plan_shape(probes: ProbePlan, hosts: int, rails: int, a: Assumptions) -> dict:
    degrees = probes.degrees()
    per_host: dict[str, tuple[int, int]] = {}
    for (host, _), (out, inn) in degrees.items():
        o, i = per_host.get(host, (0, 0))
        per_host[host] = (o + out, i + inn)
    host_loads = [o + i for o, i in per_host.values()]
    port_loads = [o + i for o, i in degrees.values()]
    counts = probes.counts()
    leaves = math.ceil(hosts / a.hosts_per_leaf)
    cross_per_leaf = [0] * leaves
    for p in probes.probes:
        if p.rail == "rail0" and p.cross_leaf:
            cross_per_leaf[int(p.sender_leaf[-3:])] += 1
            cross_per_leaf[int(p.receiver_leaf[-3:])] += 1
    return {
        "probes": probes.size,
        "intra": sum(c["intra"] for c in counts.values()),
        "cross": sum(c["cross"] for c in counts.values()),
        "leaves_per_rail": leaves,
        "targets_per_host_max": max(o for o, _ in per_host.values()),
        "targets_per_host_mean": round(sum(o for o, _ in per_host.values()) / len(per_host), 1),
        "host_load_max": max(host_loads),  # probes sent + answered per probe round
        "port_load_min": min(port_loads),
        "flows_through_a_leaf_uplinks_min": min(cross_per_leaf) if leaves > 1 else 0,
    }


def phase_times(shape: dict, a: Assumptions) -> dict:
    load = shape["host_load_max"]
    low_s = a.low_s * max(1.0, load * a.rate_pps / a.host_budget_pps)
    burst_pps = min(a.burst_cap_pps, a.host_budget_pps / load) if load else a.burst_cap_pps
    mean_losses = detectable_loss(10**9, a.min_lost) * 10**9  # 6.3 for 3 losses at 95 %
    needed = math.ceil(mean_losses / a.target_resolution)  # burst probes per port
    port_pps = shape["port_load_min"] * burst_pps
    burst_s = max(1.0, math.ceil(2 * needed / port_pps) / 2) if port_pps else 0.0
    probes_s = low_s + a.phase_gap_s + burst_s
    return {"low_s": round(low_s, 2), "burst_pps_per_target": round(burst_pps, 1), "burst_s": burst_s,
            "burst_probes_needed_per_port": needed, "probe_window_s": round(probes_s, 2),
            "window_with_lldpd_s": round(probes_s, 2), "window_lldp_on_wire_s": round(max(probes_s, a.lldp_wire_s), 2)}


def synthetic_results(plan: CablingPlan, probes: ProbePlan, rate_n: int, burst_n: int) -> dict[str, HostValidation]:
    out = {}
    for host in plan.hosts():
        ports = [p for p in (plan.port_of(host, rail) for rail in plan.rails()) if p is not None]
        checks = tuple(PortCheck(p.port, p.rail, True, p.speed_mbps, p.switch, p.switch_port, "lldpd") for p in ports)
        pairs = tuple(PairResult(t.rail, t.peer, t.peer_host, rate_n, rate_n, 20, 55, burst_n, burst_n)
                      for t in probes.targets_for(host))
        out[host] = HostValidation("model", checks, pairs)
    return out


def measure_aggregator(plan: CablingPlan, probes: ProbePlan, a: Assumptions, phases: dict) -> dict:
    """Time what the aggregator does per run, on this machine."""
    t0 = time.perf_counter()
    commands = []
    for host in plan.hosts():
        command = fleet_pb2.Command(id=host, validate=fleet_pb2.ValidateHost(
            run_id="model", duration_s=phases["probe_window_s"],
            ports=[fleet_pb2.ExpectedPort(port=p.port, rail=p.rail, speed_mbps=p.speed_mbps,
                                          switch_name=p.switch, switch_port=p.switch_port)
                   for p in (plan.port_of(host, r) for r in plan.rails()) if p is not None],
            targets=[t.to_proto() for t in probes.targets_for(host)], rate_pps=a.rate_pps,
            burst_pps=phases["burst_pps_per_target"], burst_s=phases["burst_s"]))
        commands.append(command.SerializeToString())
    build_s = time.perf_counter() - t0
    rate_n = round(a.rate_pps * a.low_s)
    burst_n = round(phases["burst_pps_per_target"] * phases["burst_s"])
    results = synthetic_results(plan, probes, rate_n, burst_n)
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


def model(hosts: int, rails: int, a: Assumptions, measure: bool) -> dict:
    plan = cabling(hosts, rails, a.hosts_per_leaf)
    t0 = time.perf_counter()
    probes = ProbePlan.from_plan(plan, addresses(hosts, rails), cross_per_leaf_pair=a.cross_per_leaf_pair,
                                 cross_per_host=a.cross_per_host)
    plan_s = time.perf_counter() - t0
    shape = plan_shape(probes, hosts, rails, a)
    phases = phase_times(shape, a)
    row = {"hosts": hosts, "rails": rails, **shape, **phases, "probe_plan_s": round(plan_s, 3)}
    full_mesh_load = (hosts - 1) * rails  # every pair once: a host sends to half its peers, answers the rest
    row["full_mesh_probes"] = rails * hosts * (hosts - 1) // 2
    row["full_mesh_low_s"] = round(a.low_s * max(1.0, full_mesh_load * a.rate_pps / a.host_budget_pps), 1)
    p_hit = 1 - (1 - 1 / a.uplinks_per_leaf) ** 2
    flows = shape["flows_through_a_leaf_uplinks_min"]
    row["dead_spine_link"] = {"flows_through_the_leaf_uplinks": flows, "p_flow_hits": round(p_hit, 4),
                              "expected_failing_flows": round(flows * p_hit, 1),
                              "p_missed": float(f"{(1 - p_hit) ** flows:.3g}") if flows else 1.0}
    if measure:
        row["aggregator"] = measure_aggregator(plan, probes, a, phases)
        agg = row["aggregator"]
        server_s = (agg["build_commands_s"] + agg["parse_results_s"] + agg["localize_s"] + agg["render_text_s"]
                    + agg["grpc_assumed_s"] + plan_s)
        row["total_with_lldpd_s"] = round(phases["window_with_lldpd_s"] + a.host_overhead_s + server_s, 1)
        row["total_lldp_on_wire_s"] = round(phases["window_lldp_on_wire_s"] + a.host_overhead_s + server_s, 1)
    return row


def draw(rows: list[dict], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.8))
    left, right = fig.subplots(1, 2)
    for rails in sorted({r["rails"] for r in rows}):
        sel = [r for r in rows if r["rails"] == rails]
        xs = [r["hosts"] for r in sel]
        left.plot(xs, [r["probes"] for r in sel], marker="o", label=f"plan, {rails} rails")
        left.plot(xs, [r["full_mesh_probes"] for r in sel], linestyle="--", label=f"full mesh, {rails} rails")
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xlabel("hosts")
    left.set_ylabel("probed pairs")
    left.set_title("probe plan size")
    left.legend(fontsize=7)
    sel = [r for r in rows if r["rails"] == max(x["rails"] for x in rows) and "aggregator" in r]
    labels = [str(r["hosts"]) for r in sel]
    parts = [("low-rate", lambda r: r["low_s"]), ("burst", lambda r: r["burst_s"]),
             ("gap + host checks", lambda r: r["probe_window_s"] - r["low_s"] - r["burst_s"] + 2.0),
             ("aggregator (measured + gRPC)", lambda r: r["total_with_lldpd_s"] - r["window_with_lldpd_s"] - 2.0)]
    bottom = [0.0] * len(sel)
    for name, value in parts:
        heights = [max(0.0, value(r)) for r in sel]
        right.bar(labels, heights, bottom=bottom, label=name)
        bottom = [b + h for b, h in zip(bottom, heights)]
    right.plot(labels, [r["total_lldp_on_wire_s"] for r in sel], "k^", label="total, LLDP read on the wire")
    right.axhline(TARGET_S, color="red", linestyle=":", label="target 5 min")
    right.set_xlabel(f"hosts ({sel[0]['rails'] if sel else '?'} rails)")
    right.set_ylabel("seconds")
    right.set_title("validation time (model)")
    right.legend(fontsize=7)
    fig.savefig(path, dpi=110, bbox_inches="tight")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", default="8,32,128,512,1024,2048")
    parser.add_argument("--rails", default="2,8")
    parser.add_argument("--hosts-per-leaf", type=int, default=Assumptions.hosts_per_leaf)
    parser.add_argument("--label", default="model")
    args = parser.parse_args(argv)
    a = Assumptions(hosts_per_leaf=args.hosts_per_leaf)
    sizes = sorted({(int(h), int(r)) for h in args.hosts.split(",") for r in args.rails.split(",")}
                   | {(TARGET_HOSTS, TARGET_RAILS)})
    rows = []
    for hosts, rails in sizes:
        measure = rails == max(r for _, r in sizes)
        log(f"{hosts} hosts x {rails} rails{' (measuring the aggregator side)' if measure else ''}")
        rows.append(model(hosts, rails, a, measure))
    target = next(r for r in rows if (r["hosts"], r["rails"]) == (TARGET_HOSTS, TARGET_RAILS))
    worst = max(target["total_with_lldpd_s"], target["total_lldp_on_wire_s"])
    summary = {
        "target_s": TARGET_S, "at": f"{TARGET_HOSTS} hosts x {TARGET_RAILS} rails",
        "total_with_lldpd_s": target["total_with_lldpd_s"], "total_lldp_on_wire_s": target["total_lldp_on_wire_s"],
        "met": worst <= TARGET_S, "probes": target["probes"],
        "targets_per_host_max": target["targets_per_host_max"],
        "burst_resolves": f">= {a.target_resolution:.2%} random loss per host port "
                          f"({target['burst_probes_needed_per_port']} burst probes per port)",
    }
    document = {"assumptions": asdict(a), "notes": __doc__.split("What is computed")[1].strip(),
                "summary": summary, "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"validate_model-{args.label}.json"
    out.write_text(json.dumps(document, indent=2))
    draw(rows, out.with_suffix(".png"))
    print("assumptions:")
    for key, value in asdict(a).items():
        print(f"  {key} = {value}")
    print(f"\n{'hosts':>6} {'rails':>5} {'probes':>9} {'tgt/host':>8} {'load':>5} {'low_s':>6} {'burst':>6} "
          f"{'b_pps':>6} {'localize':>8} {'total':>6} {'total(wire)':>11}")
    for r in rows:
        agg = r.get("aggregator", {})
        print(f"{r['hosts']:>6} {r['rails']:>5} {r['probes']:>9,} {r['targets_per_host_max']:>8} "
              f"{r['host_load_max']:>5} {r['low_s']:>6} {r['burst_s']:>6} {r['burst_pps_per_target']:>6} "
              f"{agg.get('localize_s', ''):>8} {r.get('total_with_lldpd_s', ''):>6} {r.get('total_lldp_on_wire_s', ''):>11}")
    print(f"\n{summary['at']}: {summary['probes']:,} probed pairs, {summary['targets_per_host_max']} targets on the "
          f"busiest host; total {summary['total_with_lldpd_s']} s with lldpd on the hosts, "
          f"{summary['total_lldp_on_wire_s']} s reading LLDP on the wire; target {TARGET_S:.0f} s: "
          f"{'met' if summary['met'] else 'NOT met'}")
    print(f"dead spine link at that scale: {target['dead_spine_link']}")
    print(f"full mesh instead: {target['full_mesh_probes']:,} pairs, low-rate phase alone {target['full_mesh_low_s']} s")
    agg = target["aggregator"]
    print(f"the report message is {agg['report_proto_bytes'] / 1e6:.1f} MB (gRPC's default receive limit is 4 MB); "
          f"its JSON {agg['report_json_bytes'] / 1e6:.0f} MB in {agg['report_json_s']} s (-o json only, not in the total)")
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0 if summary["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
