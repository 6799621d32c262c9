"""Echo probing at fleet scale (issue 11): linkpassd's CPU and loop lag against
FRR bfdd's CPU for the same number of sessions at the same interval; fault
detection with a full mesh running; blackout of a 1 packet/ms flow at 10 ms.

The lab (labs/bench/scale_lab.py) is one host namespace with two rails to a
leaf namespace that holds every peer: `paths` = 2 rails x `paths/2` peers.

  cost      for each path count and interval, in one lab: linkpassd probing
            every path (BFD off; peers answered by an unthrottled echo
            responder in the leaf), then, with linkpassd stopped, FRR bfdd in
            the host with one multihop session per path against bfdd in the
            leaf, same interval, detect x3. Each gets a warm-up, then
            --repeats windows of --window-s; CPU is utime+stime of the process
            (all threads) from /proc/<pid>/stat over each window, as % of one
            core; the median is reported. linkpassd's loop lag is its own
            meter's worst over the last 30 s (/metrics), read after the windows.
            The peers' side (responder, leaf bfdd) is measured too.
  detect    linkpassd at --interval-ms with 2 paths and with the largest path
            count: a silent blackhole on rail 0 (leaf port drops both ways,
            link up) and the time from the injection until the kernel routes
            rail 0's traffic (`ip route get`, labs/routewatch) out of another
            port. Median of --trials.
  blackout  linkpassd at 10 ms: a kernel-path flow (labs/traffic, 1 packet/ms)
            from rail 0's address across the same blackhole; the receiver's
            longest gap. Median of --trials.
  blackout-frr  the same flow and fault on the dualrail Mininet lab, linkpassd
            echo at 10 ms against FRR eBGP + BFD 10 ms x 3
            (labs/bench/dualrail_blackout.py).
  floor     the largest path count at each interval, probed by a bare prober
            with the engine's batching and no judgement (labs/bench/probe_floor.py):
            the kernel's share and CPython's least per probe, under which
            linkpassd cannot go on this machine.

Runs only one thing at a time: the machine has 2 cores, and two CPU
measurements side by side would measure each other.

Run as root from the repo root:
    .venv/bin/python -m labs.bench.probe_scale [--part cost,detect,blackout] [--label baseline]
Writes labs/bench/results/probe_scale-<label>.json and .png (parts run
separately are merged into the same file).
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from labs.bench.scale_lab import FLOW_SINK, ScaleLab, cpu_seconds

RESULTS = Path(__file__).parent / "results"
PARTS = ("cost", "detect", "blackout", "blackout-frr", "floor")
PATHS = (2, 8, 32, 64, 128, 256)
INTERVALS_MS = (50, 10)
TARGET_CPU_256_AT_50MS = 10.0  # % of one core, 8 rails x 32 peers
TARGET_BLACKOUT_MS = 25.0
LINEAR_SLACK = 1.5  # the last segment's cost per added path may be this much the first's
RAIL0_PORT = "lprail0"
RAIL0_SRC = "198.18.0.2"
ROUTE_TIMEOUT_S = 10.0
RECOVER_TIMEOUT_S = 30.0


def log(msg: str) -> None:
    print(msg, flush=True)


def measure_cpu(pids: dict[str, int], window_s: float, repeats: int) -> dict[str, list[float]]:
    """% of one core per process, per window, all processes over the same windows."""
    out: dict[str, list[float]] = {name: [] for name in pids}
    for _ in range(repeats):
        start = {name: cpu_seconds(pid) for name, pid in pids.items()}
        t0 = time.monotonic()
        time.sleep(window_s)
        end = {name: cpu_seconds(pid) for name, pid in pids.items()}
        took = time.monotonic() - t0
        for name in pids:
            out[name].append(100.0 * (end[name] - start[name]) / took)
    return out


def metric_sum(metrics, name: str) -> float:
    return sum(v for n, _, v in metrics if n == name)


def metric(metrics, name: str) -> float | None:
    return next((v for n, _, v in metrics if n == name), None)


def cost_cell(paths: int, interval_ms: int, args) -> list[dict]:
    rows = []
    steady_s = args.window_s * args.repeats
    with ScaleLab(paths // 2) as lab:
        responder = lab.start_responder()
        daemon = lab.start_linkpassd(interval_ms)
        all_up = settle(lambda: lab.wait_probes_up(60.0), "linkpassd")
        time.sleep(args.warmup_s)
        before = lab.metrics()
        cpu = measure_cpu({"linkpassd": daemon.proc.pid, "responder": responder},
                          args.window_s, args.repeats)
        after = lab.metrics()
        sent = metric_sum(after, "linkpass_probes_sent_total") - \
            metric_sum(before, "linkpass_probes_sent_total")
        lost = metric_sum(after, "linkpass_probes_lost_total") - \
            metric_sum(before, "linkpass_probes_lost_total")
        rows.append({"mechanism": "linkpassd", "paths": paths, "interval_ms": interval_ms,
                     "cpu_pct": cpu["linkpassd"], "peer_cpu_pct": cpu["responder"],
                     "probes_per_s": sent / steady_s, "lost_in_windows": lost,
                     "loop_lag_recent_ms": 1e3 * (metric(after, "linkpass_event_loop_lag_seconds")
                                                  or 0.0),
                     "loop_lag_max_ms": 1e3 * (metric(after, "linkpass_event_loop_lag_max_seconds")
                                               or 0.0),
                     "paths_up_after": lab.probe_states().get("UP", 0), "all_up_before": all_up})
        lab.stop_linkpassd()
        lab.stop_responder()
        host_bfdd, leaf_bfdd = lab.start_frr(interval_ms, wait_up=False)
        frr = lab.frr[0]
        all_up = settle(lambda: lab.wait_bfd_up(60.0), "bfdd")
        time.sleep(args.warmup_s)
        tx_before = bfd_packets_out(frr)
        cpu = measure_cpu({"bfdd": host_bfdd, "peer": leaf_bfdd}, args.window_s, args.repeats)
        tx_after = bfd_packets_out(frr)
        up = sum(p.get("status") == "up" for p in frr.try_read(frr.bfd_peers) or [])
        rows.append({"mechanism": "bfdd", "paths": paths, "interval_ms": interval_ms,
                     "cpu_pct": cpu["bfdd"], "peer_cpu_pct": cpu["peer"],
                     "packets_per_s": (tx_after - tx_before) / steady_s
                     if None not in (tx_before, tx_after) else None,
                     "paths_up_after": up,
                     "all_up_before": all_up})
    for row in rows:
        row["expected_per_s"] = paths * 1000.0 / interval_ms
        sent = row.get("probes_per_s", row.get("packets_per_s"))
        # BFD jitters each interval to 75-100 % (RFC 5880 6.8.7): ~1.14x nominal.
        row["keeps_schedule"] = None if sent is None else sent >= 0.95 * row["expected_per_s"]
        row["cpu_median_pct"] = statistics.median(row["cpu_pct"])
        row["cpu_per_path_pct"] = row["cpu_median_pct"] / paths
        row["peer_cpu_median_pct"] = statistics.median(row["peer_cpu_pct"])
        extra = (f"  lag {row['loop_lag_recent_ms']:.1f} ms (max since start "
                 f"{row['loop_lag_max_ms']:.1f})  {row['probes_per_s']:.0f} probes/s, "
                 f"{row['lost_in_windows']:.0f} lost" if row["mechanism"] == "linkpassd" else "")
        if row["keeps_schedule"] is False:
            extra += f"  BEHIND SCHEDULE: {sent:.0f} of {row['expected_per_s']:.0f}/s sent"
        log(f"cost {row['mechanism']:<9} {paths:>3} paths {interval_ms:>3} ms  cpu "
            f"{row['cpu_median_pct']:6.2f} % ({', '.join(f'{c:.1f}' for c in row['cpu_pct'])})"
            f"  peer {row['peer_cpu_median_pct']:.1f} %  up {row['paths_up_after']}/{paths}{extra}")
    return rows


def floor_cell(paths: int, interval_ms: int, args) -> dict:
    import subprocess
    with ScaleLab(paths // 2) as lab:
        responder = lab.start_responder()
        proc = subprocess.Popen(
            ["ip", "netns", "exec", lab.host, sys.executable, "-m", "labs.bench.probe_floor",
             str(paths // 2), str(interval_ms), f"{args.window_s:g}", str(args.repeats)],
            stdout=subprocess.PIPE, text=True)
        time.sleep(2.5)  # the prober's warm-up
        peer = measure_cpu({"responder": responder}, args.window_s, args.repeats)
        out, _ = proc.communicate(timeout=60 + args.window_s * args.repeats)
    windows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    row = {"paths": paths, "interval_ms": interval_ms, "windows": windows,
           "peer_cpu_pct": statistics.median(peer["responder"])}
    for key in ("us_per_probe", "user_us_per_probe", "sys_us_per_probe", "probes_per_s"):
        row[key] = statistics.median(w[key] for w in windows) if windows else None
    row["cpu_pct"] = statistics.median(w["user_pct"] + w["sys_pct"] for w in windows) \
        if windows else None
    log(f"floor {paths:>3} paths {interval_ms:>3} ms  {row['cpu_pct']:.1f} % of a core, "
        f"{row['us_per_probe']:.1f} us per probe ({row['user_us_per_probe']:.1f} user, "
        f"{row['sys_us_per_probe']:.1f} system), {row['probes_per_s']:.0f} probes/s")
    return row


def bfd_packets_out(frr) -> int | None:
    """Control packets the host's bfdd has sent over all sessions (vtysh; None if unread)."""
    out = frr.try_read(lambda: frr.vtysh("show bfd peers counters json"))
    try:
        return sum(int(p.get("control-packet-output", 0)) for p in json.loads(out))
    except (TypeError, ValueError):
        return None


def settle(wait_all_up, who: str) -> bool:
    """Wait until every path is up; a mechanism that cannot get there (a
    saturated core) is still measured, and the row says so."""
    try:
        wait_all_up()
        return True
    except TimeoutError as exc:
        log(f"cost: {who}: {exc}; measuring anyway")
        return False


def summarise_cost(rows: list[dict]) -> dict:
    out: dict = {"cells": {}, "targets": {}}
    for row in rows:
        key = f"{row['interval_ms']}|{row['paths']}|{row['mechanism']}"
        out["cells"][key] = {k: row[k] for k in ("mechanism", "paths", "interval_ms",
                                                 "cpu_median_pct", "cpu_per_path_pct",
                                                 "peer_cpu_median_pct")}
        for k in ("loop_lag_recent_ms", "loop_lag_max_ms", "probes_per_s", "packets_per_s",
                  "expected_per_s", "keeps_schedule", "all_up_before", "paths_up_after"):
            if k in row:
                out["cells"][key][k] = row[k]
        sent = row.get("probes_per_s", row.get("packets_per_s"))
        out["cells"][key]["us_per_packet"] = (  # CPU per probe (bfdd: per control packet sent)
            row["cpu_median_pct"] / 100 * 1e6 / sent if sent else None)
    cells = out["cells"]
    for interval in sorted({r["interval_ms"] for r in rows}):
        counts = sorted({r["paths"] for r in rows if r["interval_ms"] == interval})
        ours = [cells.get(f"{interval}|{n}|linkpassd") for n in counts]
        theirs = [cells.get(f"{interval}|{n}|bfdd") for n in counts]
        if len(counts) >= 3 and all(ours):
            # Cost per added path, the first segment against the last; and only
            # if every cell kept its schedule: an engine that falls behind sends
            # fewer probes than asked, and its CPU flattens because it fails.
            first = (ours[1]["cpu_median_pct"] - ours[0]["cpu_median_pct"]) / (counts[1] - counts[0])
            last = (ours[-1]["cpu_median_pct"] - ours[-2]["cpu_median_pct"]) / \
                (counts[-1] - counts[-2])
            behind = [n for n, c in zip(counts, ours) if c.get("keeps_schedule") is False]
            out["targets"][f"linear_at_{interval}ms"] = {
                "first_segment_pct_per_path": first, "last_segment_pct_per_path": last,
                "behind_schedule_at_paths": behind,
                "us_per_probe": {n: c.get("us_per_packet") for n, c in zip(counts, ours)},
                "met": not behind and last <= LINEAR_SLACK * max(first, 1e-9)}
        if ours and theirs and ours[-1] and theirs[-1]:
            out["targets"][f"per_path_vs_bfdd_at_{interval}ms"] = {
                "paths": counts[-1], "linkpassd_pct_per_path": ours[-1]["cpu_per_path_pct"],
                "bfdd_pct_per_path": theirs[-1]["cpu_per_path_pct"],
                "linkpassd_keeps_schedule": ours[-1].get("keeps_schedule"),
                "met": ours[-1]["cpu_per_path_pct"] <= theirs[-1]["cpu_per_path_pct"]
                and ours[-1].get("keeps_schedule") is not False}
    if (c := cells.get("50|256|linkpassd")) is not None:
        out["targets"]["256_paths_at_50ms_under_10pct"] = {
            "cpu_pct": c["cpu_median_pct"], "met": c["cpu_median_pct"] < TARGET_CPU_256_AT_50MS}
    return out


def wait_route_on_rail0(watch) -> None:
    from labs.bench.scale_lab import wait
    wait(lambda: (watch.current() or watch.initial).oif == RAIL0_PORT, RECOVER_TIMEOUT_S,
         f"route back on {RAIL0_PORT}")


def detect_cell(paths: int, interval_ms: int, trials: int, rng: random.Random) -> list[dict]:
    rows = []
    with ScaleLab(paths // 2) as lab:
        lab.start_responder()
        lab.start_linkpassd(interval_ms)
        lab.wait_probes_up(60.0)
        watch = lab.route_watch(lab.peers(0)[0], RAIL0_SRC)
        try:
            for trial in range(trials):
                wait_route_on_rail0(watch)
                lab.wait_probes_up(RECOVER_TIMEOUT_S)
                time.sleep(1.0 + rng.uniform(0, interval_ms / 1000))  # random phase
                mark = watch.mark()
                injected = lab.blackhole(True)
                try:
                    moved = watch.wait_change(lambda c: c.oif != RAIL0_PORT, ROUTE_TIMEOUT_S,
                                              f"reroute off {RAIL0_PORT}", mark)
                except AssertionError:  # not detected in time: a result, not a crash
                    moved = None
                finally:
                    lab.blackhole(False)
                ms = (moved.at - injected) * 1e3 if moved else None
                lag = metric(lab.metrics(), "linkpass_event_loop_lag_seconds") or 0.0
                rows.append({"paths": paths, "interval_ms": interval_ms, "trial": trial,
                             "detect_to_reroute_ms": ms, "to_port": moved.oif if moved else None,
                             "loop_lag_recent_ms": lag * 1e3})
                said = f"{ms:7.1f} ms -> {moved.oif}" if moved else \
                    f"NOT rerouted within {ROUTE_TIMEOUT_S:g} s"
                log(f"detect {paths:>3} paths {interval_ms:>3} ms #{trial:<3} {said}  "
                    f"(loop lag over 30 s {lag * 1e3:.1f} ms)")
        finally:
            watch.stop()
    return rows


def blackout_cell(paths: int, interval_ms: int, trials: int, rng: random.Random) -> list[dict]:
    from labs.bench.dualrail_blackout import fault_gap
    from labs.traffic.nsrun import run_traffic

    rows = []
    with ScaleLab(paths // 2) as lab:
        lab.start_responder()
        lab.start_linkpassd(interval_ms)
        lab.wait_probes_up(60.0)
        watch = lab.route_watch(FLOW_SINK, RAIL0_SRC)
        tmp = Path(tempfile.mkdtemp(prefix="lp-scale-flow-", dir=lab.dir))
        try:
            for trial in range(trials):
                wait_route_on_rail0(watch)
                lab.wait_probes_up(RECOVER_TIMEOUT_S)
                stamps: dict[str, float] = {}
                at = 0.8 + rng.uniform(0, interval_ms / 1000)
                run = run_traffic(
                    tmp, rx_ns=lab.leaf, tx_ns=lab.host, mode="kernel-path", dst=FLOW_SINK,
                    src=RAIL0_SRC, rate=1000, duration=2.0,
                    faults=[(at, "inject", lambda stamps=stamps: stamps.setdefault("inject", lab.blackhole(True))),
                            (1.6, "clear", lambda stamps=stamps: stamps.setdefault("clear", lab.blackhole(False)))])
                gap = fault_gap(run.rx, stamps["inject"])
                ms = gap["gap_s"] * 1e3
                rows.append({"paths": paths, "interval_ms": interval_ms, "trial": trial,
                             "blackout_ms": ms,
                             "longest_gap_ms": run.rx["blackout"]["gap_s"] * 1e3,
                             "gap_start_after_inject_ms":
                                 (gap["start_t"] - stamps["inject"]) * 1e3
                                 if gap.get("start_t") is not None else None,
                             "lost": run.rx.get("lost"), "sent": run.rx.get("sent")})
                log(f"blackout {paths:>3} paths {interval_ms:>3} ms #{trial:<3} {ms:7.1f} ms "
                    f"(lost {run.rx.get('lost')} of {run.rx.get('sent')}; gap began "
                    f"{rows[-1]['gap_start_after_inject_ms']:.1f} ms after the fault)")
        finally:
            lab.blackhole(False)
            watch.stop()
    return rows


def median_cell(values: list[float | None]) -> dict:
    """Median (min, max) of the trials; a trial with no result (None: not
    rerouted in time) counts as slower than every other."""
    done = sorted(v for v in values if v is not None)
    missed = len(values) - len(done)
    if not done:
        return {"trials": len(values), "missed": missed, "median_ms": None}
    ranked = done + [float("inf")] * missed
    median = statistics.median(ranked)
    return {"trials": len(values), "missed": missed,
            "median_ms": median if median != float("inf") else None,
            "min_ms": done[0], "max_ms": done[-1]}


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labs.bench.bars import median_bars

    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    (cpu_ax, per_ax), (lag_ax, det_ax) = axes
    cells = result.get("cost", {}).get("summary", {}).get("cells", {})
    for interval, style in ((50, "-"), (10, "--")):
        for mech, color in (("linkpassd", "tab:blue"), ("bfdd", "tab:orange")):
            pts = sorted((c["paths"], c) for c in cells.values()
                         if c["interval_ms"] == interval and c["mechanism"] == mech)
            if not pts:
                continue
            xs = [p for p, _ in pts]
            label = f"{mech} {interval} ms"
            cpu_ax.plot(xs, [c["cpu_median_pct"] for _, c in pts], style, marker="o",
                        color=color, label=label)
            per_ax.plot(xs, [c["cpu_per_path_pct"] for _, c in pts], style, marker="o",
                        color=color, label=label)
            if mech == "linkpassd":
                lag_ax.plot(xs, [c.get("loop_lag_recent_ms", 0) for _, c in pts], style,
                            marker="o", color=color, label=label)
    for ax, ylabel in ((cpu_ax, "CPU, % of one core (median)"),
                       (per_ax, "CPU per path, % of one core"),
                       (lag_ax, "linkpassd worst loop lag over 30 s, ms")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("paths (2 rails x peers)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend()
    cpu_ax.axhline(TARGET_CPU_256_AT_50MS, color="grey", lw=0.8, ls=":")
    groups, series_det, series_blk = [], [], []
    for key, cell in sorted(result.get("detect", {}).get("summary", {}).items()):
        groups.append(f"detect\n{key}")
        series_det.append(cell)
        series_blk.append(None)
    for key, cell in sorted(result.get("blackout", {}).get("summary", {}).items()):
        groups.append(f"blackout\n{key}")
        series_det.append(None)
        series_blk.append(cell)
    for key, cell in sorted(result.get("blackout-frr", {}).get("summary", {}).items()):
        groups.append("blackout\n" + key.replace(" ", "\n"))
        series_det.append(None)
        series_blk.append(cell)
    def plottable(cells):  # a cell with no median (every trial missed) gets no bar
        return [c if c and c.get("median_ms") is not None else None for c in cells]

    if groups:
        for j, cell in enumerate(series_det):
            if cell and cell.get("median_ms") is None:
                det_ax.text(j, 1, f"not rerouted\nin {ROUTE_TIMEOUT_S:g} s\n({cell['missed']}/"
                            f"{cell['trials']})", ha="center", va="bottom", fontsize=8)
        series_det, series_blk = plottable(series_det), plottable(series_blk)
        median_bars(det_ax, groups, [("fault to reroute (route)", series_det),
                                     ("blackout of 1 pkt/ms flow", series_blk)])
        det_ax.set_ylabel("ms (median, min-max)")
        det_ax.tick_params(axis="x", labelsize=8)
        det_ax.set_title("silent blackhole on rail 0")
    fig.suptitle(f"probe_scale ({result.get('label')})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def save(result: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # so every lab's finally tears it down


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", default=",".join(PARTS),
                        help="comma-separated: " + ", ".join(PARTS))
    parser.add_argument("--paths", default=",".join(map(str, PATHS)),
                        help="path counts for cost (even, 2..256); detect uses 2 and the largest")
    parser.add_argument("--intervals-ms", default=",".join(map(str, INTERVALS_MS)))
    parser.add_argument("--interval-ms", type=int, default=50, help="detect's probe interval")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--label", default="run")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    parts = [p for p in args.part.split(",") if p]
    if bad := [p for p in parts if p not in PARTS]:
        parser.error(f"--part: unknown {', '.join(bad)} (choose from {', '.join(PARTS)})")
    try:
        paths = [int(x) for x in args.paths.split(",") if x]
        intervals = [int(x) for x in args.intervals_ms.split(",") if x]
    except ValueError:
        parser.error(f"--paths/--intervals-ms: integers expected, got {args.paths!r}, "
                     f"{args.intervals_ms!r}")
    if bad := [n for n in paths if n % 2 or not 2 <= n <= 256]:
        parser.error(f"--paths: even numbers 2..256 expected, got {bad}")
    if bad := [i for i in intervals + [args.interval_ms] if not 10 <= i <= 1000]:
        parser.error(f"intervals must be 10..1000 ms (bfdd's profile floor is 10), got {bad}")
    if not 1 <= args.trials <= 50 or not 1 <= args.repeats <= 10:
        parser.error("--trials must be 1..50 and --repeats 1..10")
    if not 1 <= args.window_s <= 60 or not 0 <= args.warmup_s <= 60:
        parser.error("--window-s must be 1..60 and --warmup-s 0..60")
    if not args.label.replace("-", "").replace("_", "").isalnum():
        parser.error(f"--label: letters, digits, - and _ only, got {args.label!r}")

    out_json = RESULTS / f"probe_scale-{args.label}.json"
    result = json.loads(out_json.read_text()) if out_json.exists() else {}
    result.update({"bench": "probe_scale", "label": args.label})
    rng = random.Random(args.seed)
    signal.signal(signal.SIGTERM, _interrupt)
    for part in parts:
        started = time.monotonic()
        if part == "cost":
            rows = []
            for interval in intervals:
                for n in paths:
                    rows += cost_cell(n, interval, args)
                    result["cost"] = {"window_s": args.window_s, "repeats": args.repeats,
                                      "warmup_s": args.warmup_s,
                                      "bfd_sessions": "multihop, detect x3",
                                      "summary": summarise_cost(rows), "rows": rows}
                    save(result, out_json)  # a cell at a time: an interrupted run keeps them
        elif part == "detect":
            rows = []
            for n in sorted({2, max(paths)}):
                rows += detect_cell(n, args.interval_ms, args.trials, rng)
            result["detect"] = {"interval_ms": args.interval_ms, "rows": rows, "summary": {
                f"{n} paths": median_cell([r["detect_to_reroute_ms"] for r in rows
                                           if r["paths"] == n]) for n in sorted({2, max(paths)})}}
        elif part == "floor":
            rows = [floor_cell(max(paths), interval, args) for interval in intervals]
            result["floor"] = {"window_s": args.window_s, "repeats": args.repeats, "rows": rows,
                               "summary": {f"{r['paths']} paths, {r['interval_ms']} ms":
                                           {k: r[k] for k in ("cpu_pct", "us_per_probe",
                                                              "user_us_per_probe",
                                                              "sys_us_per_probe")}
                                           for r in rows}}
        elif part == "blackout-frr":
            from labs.bench import dualrail_blackout

            rows = []
            for mech in ("linkpassd", "frr-bgp"):
                rows += dualrail_blackout.run(mech, args.trials, rng, log)
            result[part] = {"interval_ms": 10, "rate_pps": 1000, "lab": "dualrail",
                            "detect_mult": dualrail_blackout.DETECT_MULT, "rows": rows,
                            "summary": {f"dualrail {m}": median_cell(
                                [r["blackout_ms"] for r in rows if r["mechanism"] == m])
                                for m in ("linkpassd", "frr-bgp")}}
        else:
            rows = blackout_cell(2, 10, args.trials, rng)
            summary = median_cell([r["blackout_ms"] for r in rows])
            summary["target_met"] = (summary["median_ms"] or float("inf")) <= TARGET_BLACKOUT_MS
            result["blackout"] = {"interval_ms": 10, "rate_pps": 1000, "rows": rows,
                                  "summary": {"2 paths, 10 ms": summary}}
        result[part]["seconds"] = round(time.monotonic() - started, 1)
        log(f"part {part} took {result[part]['seconds']:.0f} s")
        save(result, out_json)
        plot(result, out_json.with_suffix(".png"))
    print(json.dumps({p: result[p].get("summary") for p in parts}, indent=1))
    print(f"wrote {out_json} and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
