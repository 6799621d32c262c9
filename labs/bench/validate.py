"""Fleet validation's time as the lab grows, and its model to 2,048 hosts x
8 rails (issue 13; target: a whole run in <= 5 minutes at that scale).

    flock /tmp/linkpass-lab.lock .venv/bin/python -m labs.bench.validate \\
        [--sizes 2x2,4x2,8x2,8x4] [--trials 3] [--duration 8] [--label NAME] [--no-lab]

Measured, per lab size (hosts x rails; 2 spines, 2 leaves per rail from 4
hosts up, so pairs cross the spines): `--trials` runs of `linkpassctl
validate -o json` on a healthy lab (labs/validation.py, each from a verified
healthy state), and per run the command's wall time, the aggregator's run
(the report's started to finished), the probed pairs, the probes sent
against what the schedule planned, the loss resolution the report states,
and any finding (a healthy lab must give none). Medians are reported.

Modelled (labs/bench/validate_model.py, assumptions printed): the probe
plan and the run's time for each lab size, with the lab's own cabling,
duration and probe budget, and at scale (hosts_per_leaf 32) up to 2,048 x 8.

Checked: the model's plan size and predicted run time against each lab
size's measurement (the error is printed and written), so the extrapolation
rests on a model that predicts what was measured.

Writes labs/bench/results/validate-<label>.json and .png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

from labs.bench import validate_model as vm

RESULTS = Path(__file__).parent / "results"
SCALE_HOSTS = (8, 32, 128, 512, 1024, 2048)
SCALE_RAILS = (2, 8)
CLI_ASSUMED_S = 1.0  # linkpassctl's start-up and plan parsing, when no lab run measured it


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        try:
            hosts, rails = (int(x) for x in item.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--sizes: {item!r} is not HOSTSxRAILS (e.g. 4x2)") from None
        out.append((hosts, rails))
    return out


def leaves_per_rail(hosts: int) -> int:
    return 1 if hosts < 4 else 2


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def trial_row(run, sched) -> dict:
    report = run.report
    pairs = [p for h in report["hosts"] for p in h.get("validation", {}).get("pairs", [])]
    burst_planned = math.floor(sched.burst_pps * sched.burst_s)  # per pair (the low phase's
    # length depends on each host's start readings, so only its minimum is shown)
    return {
        "wall_s": round(run.wall_s, 3),
        "run_s": round(_stamp(report["finished"]) - _stamp(report["started"]), 3),
        "pairs": len(pairs),
        "burst_sent_of_planned": round(sum(p.get("burst_sent", 0) for p in pairs)
                                       / max(1, burst_planned * len(pairs)), 4),
        "low_sent_min": min((p.get("sent", 0) for p in pairs), default=0),
        "loss_resolution": report.get("loss_resolution", 1.0),
        "findings": [f"{f.get('kind')}: {f.get('component')}" for f in report.get("findings", [])],
        "hosts_ok": sum(h.get("status") == "ok" for h in report["hosts"]),
    }


def measure_lab(hosts: int, rails: int, trials: int, duration: float, a: vm.Assumptions) -> dict:
    from labs import validation
    from linkpassd.validate import plan as cabling_files

    started = time.monotonic()
    with validation.validation_lab(hosts, rails, 2, leaves_per_rail=leaves_per_rail(hosts)) as lab:
        built_s = time.monotonic() - started
        plan = cabling_files.load(lab.cabling_path)
        budget = lab.validation_budget_pps
        model = vm.predict(plan, vm.Assumptions(**{**asdict(a), "host_budget_pps": budget}), duration=duration)
        sched = vm.rates.schedule(vm.probe_plan(plan, a)[0], duration, budget_pps=budget)
        runs = []
        for k in range(trials):
            healthy_s = validation.wait_healthy(lab)
            load = os.getloadavg()[0]
            run = validation.validate(lab, duration)
            row = {**trial_row(run, sched), "healthy_after_s": round(healthy_s, 1), "load1_before": load}
            log(f"  {hosts}x{rails} trial {k + 1}: wall {row['wall_s']} s, run {row['run_s']} s, "
                f"{row['pairs']} pairs, findings {row['findings'] or 'none'}")
            runs.append(row)
    med = {key: statistics.median(r[key] for r in runs)
           for key in ("wall_s", "run_s", "burst_sent_of_planned", "loss_resolution")}
    return {"hosts": hosts, "rails": rails, "leaves_per_rail": leaves_per_rail(hosts), "duration_s": duration,
            "budget_pps": budget, "build_s": round(built_s, 1), "trials": runs, "median": med,
            "pairs": runs[0]["pairs"], "findings_on_healthy": sum(len(r["findings"]) for r in runs),
            "model": model}


def check(lab_rows: list[dict]) -> list[dict]:
    out = []
    for row in lab_rows:
        model, med = row["model"], row["median"]
        cli_s = statistics.median(t["wall_s"] - t["run_s"] for t in row["trials"])
        out.append({
            "size": f"{row['hosts']}x{row['rails']}",
            "pairs_measured": row["pairs"], "pairs_model": model["probes"],
            "run_s_measured": med["run_s"], "run_s_model": model["predicted_run_s"],
            "run_error": round((model["predicted_run_s"] - med["run_s"]) / med["run_s"], 3),
            "cli_overhead_s": round(cli_s, 3),
            "resolution_measured": med["loss_resolution"], "resolution_model": model["expected_resolution"],
        })
    return out


def draw(lab_rows: list[dict], scale: list[dict], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(16, 4.8))
    left, mid, right = fig.subplots(1, 3)
    if lab_rows:
        labels = [f"{r['hosts']}x{r['rails']}" for r in lab_rows]
        for k, r in enumerate(lab_rows):
            left.scatter([k] * len(r["trials"]), [t["run_s"] for t in r["trials"]], color="C0", s=12,
                         label="measured run (each trial)" if k == 0 else None)
            left.scatter([k] * len(r["trials"]), [t["wall_s"] for t in r["trials"]], color="C2", s=12,
                         marker="x", label="linkpassctl wall (each trial)" if k == 0 else None)
        left.plot(range(len(lab_rows)), [r["model"]["predicted_run_s"] for r in lab_rows], "r_", markersize=30,
                  mew=2, linestyle="none", label="model: run")
        left.set_xticks(range(len(lab_rows)), labels)
        left.set_ylim(bottom=0)
        left.set_xlabel(f"lab: hosts x rails (--duration {lab_rows[0]['duration_s']:g})")
        left.set_ylabel("seconds")
        left.set_title("validation time in the lab")
        left.legend(fontsize=7, loc="lower right")
    for rails in sorted({r["rails"] for r in scale}):
        sel = [r for r in scale if r["rails"] == rails]
        xs = [r["hosts"] for r in sel]
        mid.plot(xs, [r["probes"] for r in sel], marker="o", label=f"plan, {rails} rails (model)")
        mid.plot(xs, [r["full_mesh_probes"] for r in sel], linestyle="--", label=f"full mesh, {rails} rails")
    for r in lab_rows:
        mid.scatter([r["hosts"]], [r["pairs"]], color="k", marker="s", s=18)
    mid.scatter([], [], color="k", marker="s", s=18, label="lab (measured)")
    mid.set_xscale("log", base=2)
    mid.set_yscale("log")
    mid.set_xlabel("hosts")
    mid.set_ylabel("probed pairs")
    mid.set_title("probe plan size")
    mid.legend(fontsize=7)
    sel = [r for r in scale if r["rails"] == max(x["rails"] for x in scale) and "server" in r]
    names = [str(r["hosts"]) for r in sel]
    parts = [("host window (duration - end reads)", lambda r: r["duration_s"] - vm.END_READ_S),
             ("end reads + answer (assumed)", lambda r: vm.Assumptions().host_end_s),
             ("aggregator: plan, commands, parse, localise",
              lambda r: r["predicted_run_s"] - r["duration_s"] + vm.END_READ_S - vm.Assumptions().host_end_s),
             ("CLI: render", lambda r: r["cli_render_s"])]
    bottom = [0.0] * len(sel)
    for name, value in parts:
        heights = [max(0.0, value(r)) for r in sel]
        right.bar(names, heights, bottom=bottom, label=name)
        bottom = [b + h for b, h in zip(bottom, heights)]
    right.plot(names, [r["predicted_run_lldp_on_wire_s"] + r["cli_render_s"] for r in sel], "k^",
               label="total, LLDP read on the wire")
    right.axhline(vm.TARGET_S, color="red", linestyle=":", label="target 5 min")
    right.set_xlabel(f"hosts ({sel[0]['rails'] if sel else '?'} rails, 32 per leaf)")
    right.set_ylabel("seconds")
    right.set_title("validation time (model)")
    right.legend(fontsize=7)
    fig.savefig(path, dpi=110, bbox_inches="tight")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="2x2,4x2,8x2,8x4", help="lab sizes, HOSTSxRAILS,...")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--duration", type=float, default=8.0, help="each lab run's --duration")
    parser.add_argument("--label", default="run")
    parser.add_argument("--no-lab", action="store_true", help="the model only (no root, no lock needed)")
    args = parser.parse_args(argv)
    a = vm.Assumptions()
    lab_rows = []
    failed = []  # sizes this machine could not hold at the time (named in the output)
    if not args.no_lab:
        from labs.topos.plan import LabError

        for hosts, rails in parse_sizes(args.sizes):
            log(f"lab {hosts} hosts x {rails} rails, {leaves_per_rail(hosts)} leaves per rail")
            try:
                lab_rows.append(measure_lab(hosts, rails, args.trials, args.duration, a))
            except LabError as exc:
                log(f"  {hosts}x{rails}: {exc}")
                failed.append({"size": f"{hosts}x{rails}", "error": str(exc)[:2000],
                               "load1": os.getloadavg()[0]})
    scale = []
    for rails in SCALE_RAILS:
        for hosts in SCALE_HOSTS:
            measure = rails == max(SCALE_RAILS)
            log(f"model {hosts} hosts x {rails} rails{' (measuring the aggregator side)' if measure else ''}")
            scale.append(vm.predict(vm.cabling(hosts, rails, a.hosts_per_leaf), a, measure=measure))
    checks = check(lab_rows)
    target = next(r for r in scale if (r["hosts"], r["rails"]) == (vm.TARGET_HOSTS, vm.TARGET_RAILS))
    cli_s = statistics.median([c["cli_overhead_s"] for c in checks]) if checks else CLI_ASSUMED_S
    cli_from = "from the lab" if checks else "assumed: no lab run"
    total = target["predicted_run_s"] + target["cli_render_s"] + cli_s
    total_wire = target["predicted_run_lldp_on_wire_s"] + target["cli_render_s"] + cli_s
    summary = {
        "target_s": vm.TARGET_S, "at": f"{vm.TARGET_HOSTS} hosts x {vm.TARGET_RAILS} rails",
        "duration_s": target["duration_s"], "total_with_lldpd_s": round(total, 1),
        "total_lldp_on_wire_s": round(total_wire, 1), "met": max(total, total_wire) <= vm.TARGET_S,
        "probes": target["probes"], "targets_per_host_max": target["targets_per_host_max"],
        "burst": f"{target['burst_pps']} /s per target for {target['burst_s']} s",
        "resolves": f">= {target['expected_resolution']:.3%} random loss per host port",
        "cli_overhead_s": cli_s, "cli_overhead_from": cli_from,
        "model_run_error_in_lab": [c["run_error"] for c in checks],
    }
    document = {"assumptions": asdict(a), "notes": vm.__doc__.split("What is computed")[1].strip(),
                "machine": {"cpus": os.cpu_count(), "load1_end": os.getloadavg()[0]},
                "lab": lab_rows, "lab_failed": failed, "check": checks, "scale": scale, "summary": summary}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"validate-{args.label}.json"
    out.write_text(json.dumps(document, indent=2))
    draw(lab_rows, scale, out.with_suffix(".png"))
    print("assumptions:")
    for key, value in asdict(a).items():
        print(f"  {key} = {value}")
    if lab_rows:
        print(f"\nlab (medians of {args.trials} trials, --duration {args.duration:g}):")
        print(f"{'size':>6} {'pairs':>6} {'model':>6} {'wall_s':>7} {'run_s':>6} {'model_s':>7} {'error':>6} "
              f"{'budget':>7} {'burst':>6} {'sent%':>6} {'resol':>7} {'findings':>8}")
        for row, c in zip(lab_rows, checks):
            m = row["median"]
            print(f"{c['size']:>6} {c['pairs_measured']:>6} {c['pairs_model']:>6} {m['wall_s']:>7.2f} "
                  f"{m['run_s']:>6.2f} {c['run_s_model']:>7.2f} {c['run_error']:>+6.0%} {row['budget_pps']:>7.0f} "
                  f"{row['model']['burst_pps']:>6.0f} {m['burst_sent_of_planned']:>6.1%} "
                  f"{m['loss_resolution']:>7.2%} {row['findings_on_healthy']:>8}")
    print(f"\n{'hosts':>6} {'rails':>5} {'probes':>9} {'tgt/host':>8} {'load':>5} {'dur_s':>6} {'burst':>10} "
          f"{'resol':>7} {'localize':>8} {'run_s':>6} {'run(wire)':>9}")
    for r in scale:
        srv = r.get("server", {})
        print(f"{r['hosts']:>6} {r['rails']:>5} {r['probes']:>9,} {r['targets_per_host_max']:>8} "
              f"{r['host_load_max']:>5} {r['duration_s']:>6} {r['burst_pps']:>5.0f}x{r['burst_s']:<4} "
              f"{r['expected_resolution']:>7.2%} {srv.get('localize_s', ''):>8} {r.get('predicted_run_s', ''):>6} "
              f"{r.get('predicted_run_lldp_on_wire_s', ''):>9}")
    print(f"\n{summary['at']}: {summary['probes']:,} probed pairs, {summary['targets_per_host_max']} targets on "
          f"the busiest host, --duration {summary['duration_s']} (burst {summary['burst']}, resolves "
          f"{summary['resolves']}); total {summary['total_with_lldpd_s']} s with lldpd on the hosts, "
          f"{summary['total_lldp_on_wire_s']} s reading LLDP on the wire (CLI start-up {cli_s:.2f} s, {cli_from}); "
          f"target {vm.TARGET_S:.0f} s: {'met' if summary['met'] else 'NOT met'}")
    for item in failed:
        print(f"lab {item['size']} not measured (load average {item['load1']:.1f}): "
              f"{item['error'].splitlines()[0]}")
    if checks:
        print("model vs lab, aggregator run time: " + ", ".join(
            f"{c['size']} {c['run_error']:+.0%}" for c in checks))
    print(f"dead spine link at that scale: {target.get('dead_spine_link')}")
    srv = target["server"]
    print(f"the report message is {srv['report_proto_bytes'] / 1e6:.1f} MB; its JSON "
          f"{srv['report_json_bytes'] / 1e6:.0f} MB in {srv['report_json_s']} s (-o json only, not in the total)")
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0 if summary["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
