"""Gray-failure detection to reroute: linkpassd's echo probes against FRR's
BFD-tracked eBGP paths, at the same steady probe rate, in one run.

Both mechanisms run on the same dualrail topology (two hosts, two rails, a
spine), one lab per (mechanism, interval):

  linkpassd  every host runs linkpassd; each rail echo-probes the other
             host's same rail, end to end (`[probes] interval_ms`); BFD off,
             so the probes alone decide;
  frr-bgp    every host runs FRR with one eBGP session per rail to its leaf,
             each tracked by BFD at `interval_ms` x 3 (FRR 8.4 has no BFD on
             static routes; labs/topos/frrbgp.py). A BFD Down drops the
             session, and zebra moves the route to the backup rail.

A trial injects a silent blackhole or one-way loss (host to leaf) on lph1's
rail 0 and measures, inside lph1, the time from the injection to the moment
the kernel routes lph1's rail-0 traffic to lph2 (`ip route get <lph2 rail 0>
from <lph1 rail 0>`, labs/routewatch.py) through another port: detection plus
reroute, whatever each mechanism writes. Each cell is repeated --trials times;
the summary is the median (min, max) and linkpassd's median over FRR's. The
target is a ratio of at most 0.5. Writes JSON and a PNG.

Run as root from the repo root: .venv/bin/python -m labs.bench.probing
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

from labs.bench.bars import median_bars
from labs.daemonproc import ctl_status
from labs.faults import OneWayLoss, SilentBlackhole
from labs.routewatch import RouteWatch
from labs.scenario import LAB_TIMERS
from labs.topos.dualrail import dualrail
from labs.topos.lab import Lab
from labs.topos.railopt import start_linkpassd

RESULTS = Path(__file__).parent / "results"
MECHANISMS = ("linkpassd", "frr-bgp")
INTERVALS_MS = (300, 50)
DETECT_MULT = 3
FAULTS = {
    "silent-blackhole": lambda lab: SilentBlackhole(lab, "lph1", 0),
    "one-way-loss": lambda lab: OneWayLoss(lab, "lph1", 0, direction="host_to_leaf"),
}
TARGET_RATIO = 0.5
HOSTS = ("lph1", "lph2")
REROUTE_TIMEOUT_S = 5.0
RECOVER_TIMEOUT_S = 30.0


def make_lab(mechanism: str, interval_ms: int) -> Lab:
    """An unstarted lab for one cell (entering it builds it)."""
    if mechanism == "linkpassd":
        return dualrail("linkpassd", linkpassd_timers=LAB_TIMERS,
                        probes={"interval_ms": interval_ms})
    return dualrail("frr-bgp", bfd={"interval_ms": interval_ms, "detect_mult": DETECT_MULT})


def probes_up(lab: Lab) -> bool:
    """Every rail's echo verdict is 'ok' on both hosts (linkpassd labs)."""
    for host in HOSTS:
        status = ctl_status(lab.control_socket(host))
        if status is None:
            return False
        for ps in status.get("sensors", []):
            echo = next((a for a in ps["assessments"] if a["signal"] == "echo"), None)
            if echo is None or echo["status"] != "ok":
                return False
    return True


def wait(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


def run_cell(mechanism: str, interval_ms: int, faults: list[str], trials: int,
             rng: random.Random) -> list[dict]:
    rows = []
    with make_lab(mechanism, interval_ms) as lab:
        if mechanism == "linkpassd":
            for host in HOSTS:
                start_linkpassd(lab, host)
        h1, h2 = lab.host("lph1"), lab.host("lph2")
        rail0 = h1.rail(0)
        watch = RouteWatch.start(lab, "lph1", h2.rail(0).address, src=rail0.address,
                                 duration_s=3600)
        try:
            for trial in range(trials):
                for fault_name in faults:
                    # Ready: the route is on rail 0 and (linkpassd) every probe is up.
                    wait(lambda: (watch.current() or watch.initial).oif == rail0.port,
                         RECOVER_TIMEOUT_S, f"{mechanism}: route back on {rail0.port}")
                    if mechanism == "linkpassd":
                        wait(lambda: probes_up(lab), RECOVER_TIMEOUT_S, "echo probes up")
                    # A random phase against the probe schedule, as a real fault has.
                    time.sleep(1.0 + rng.uniform(0, interval_ms / 1000))
                    mark = watch.mark()
                    fault = FAULTS[fault_name](lab)
                    injected = fault.inject()
                    try:
                        moved = watch.wait_change(lambda c: c.oif != rail0.port,
                                                  REROUTE_TIMEOUT_S,
                                                  f"{mechanism}: reroute off {rail0.port}", mark)
                    finally:
                        fault.clear()
                    ms = (moved.at - injected) * 1e3
                    rows.append({"mechanism": mechanism, "interval_ms": interval_ms,
                                 "fault": fault_name, "trial": trial,
                                 "detect_to_reroute_ms": ms, "to_port": moved.oif,
                                 "cause": list(moved.cause)})
                    print(f"{mechanism:<10}{interval_ms:>4} ms  {fault_name:<18}#{trial:<3}"
                          f"{ms:8.1f} ms -> {moved.oif}", flush=True)
        finally:
            watch.stop()
    return rows


def summarise(rows: list[dict]) -> dict:
    cells: dict[tuple, list[float]] = {}
    for row in rows:
        key = (row["fault"], row["interval_ms"], row["mechanism"])
        cells.setdefault(key, []).append(row["detect_to_reroute_ms"])
    out = {}
    for (fault, interval, mech), values in cells.items():
        out[f"{fault}|{interval}|{mech}"] = {
            "fault": fault, "interval_ms": interval, "mechanism": mech, "trials": len(values),
            "median_ms": statistics.median(values), "min_ms": min(values), "max_ms": max(values)}
    for (fault, interval, mech), _ in cells.items():
        if mech != "linkpassd" or (fault, interval, "frr-bgp") not in cells:
            continue
        ours = out[f"{fault}|{interval}|linkpassd"]
        theirs = out[f"{fault}|{interval}|frr-bgp"]
        ours["ratio_to_frr"] = ours["median_ms"] / theirs["median_ms"]
        ours["target_met"] = ours["ratio_to_frr"] <= TARGET_RATIO
    return out


def plot(summary: dict, faults: list[str], intervals: list[int], mechanisms: list[str],
         path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(intervals), figsize=(6 * len(intervals), 4.5))
    axes = [axes] if len(intervals) == 1 else list(axes)
    for ax, interval in zip(axes, intervals):
        median_bars(ax, faults, [
            ("linkpassd echo" if mech == "linkpassd" else f"FRR eBGP + BFD x{DETECT_MULT}",
             [summary.get(f"{f}|{interval}|{mech}") for f in faults]) for mech in mechanisms])
        ax.set_title(f"probe interval {interval} ms")
        ax.set_ylabel("fault to reroute, ms (median, min-max)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--intervals-ms", default=",".join(map(str, INTERVALS_MS)))
    parser.add_argument("--mechanisms", default=",".join(MECHANISMS))
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    mechanisms = [m for m in args.mechanisms.split(",") if m]
    try:
        intervals = [int(x) for x in args.intervals_ms.split(",") if x]
    except ValueError:
        parser.error(f"--intervals-ms: integers expected, got {args.intervals_ms!r}")
    if not 5 <= args.trials <= 50:
        parser.error("--trials must be between 5 and 50")
    if bad := [f for f in faults if f not in FAULTS] + [m for m in mechanisms if m not in MECHANISMS]:
        parser.error(f"unknown fault or mechanism: {', '.join(bad)}")
    if bad := [i for i in intervals if not 50 <= i <= 1000]:
        parser.error(f"intervals must be 50..1000 ms (BGP's BFD floor is 50), got {bad}")

    rng = random.Random(args.seed)
    started = time.monotonic()
    rows = []
    for interval in intervals:
        for mech in mechanisms:
            rows += run_cell(mech, interval, faults, args.trials, rng)
    summary = summarise(rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "probing.json").write_text(json.dumps(
        {"bench": "probing", "trials_per_cell": args.trials, "detect_mult": DETECT_MULT,
         "target_ratio": TARGET_RATIO, "summary": summary, "rows": rows}, indent=2))
    plot(summary, faults, intervals, mechanisms, RESULTS / "probing.png")

    print(f"\nfault injected -> lph1's rail-0 traffic rerouted, median (min-max) over "
          f"{args.trials} trials, ms")
    print(f"{'fault':<18}{'interval':>9}" + "".join(f"{m:>24}" for m in mechanisms)
          + f"{'ratio':>8}")
    for fault in faults:
        for interval in intervals:
            line = f"{fault:<18}{interval:>6} ms"
            for mech in mechanisms:
                c = summary.get(f"{fault}|{interval}|{mech}")
                line += (f"{c['median_ms']:>10.1f} ({c['min_ms']:.0f}-{c['max_ms']:.0f})"
                         .rjust(24) if c else f"{'-':>24}")
            ours = summary.get(f"{fault}|{interval}|linkpassd", {})
            if "ratio_to_frr" in ours:
                line += f"{ours['ratio_to_frr']:>7.2f}" + (" ok" if ours["target_met"] else " MISSED")
            print(line)
    print(f"\nwrote {RESULTS / 'probing.json'} and .png in {time.monotonic() - started:.0f} s")
    missed = [k for k, c in summary.items() if c.get("target_met") is False]
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
