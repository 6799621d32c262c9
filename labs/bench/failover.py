"""Blackout per (mechanism x fault x traffic mode), side by side, in one run.

Mechanisms: no failover (static per-rail routes), the kernel alone
(linkdown-aware routes, no daemon) and linkpassd. Each trial (labs/scenario.py)
sends a kernel-path and a qp-pinned RoCEv2 flow out of the faulted host and a
kernel-path flow back into it (kernel-path-reverse, addressed to its faulted
rail: what only the fabric can move, with linkpassd's announcements) through
the dualrail lab on the bgp fabric (labs/topos/bgpfabric.py) and injects one
fault on the rail they use. Every cell is repeated --trials times
(at least 5); the summary is the median with min and max, and the ratio of each
mechanism's median to no-failover's. Writes JSON and a PNG bar chart.

Run as root from the repo root: .venv/bin/python -m labs.bench.failover
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from labs.bench.bars import median_bars
from labs.scenario import FAULTS, FLOWS, MECHANISMS, REVERSE, ScenarioLab

RESULTS = Path(__file__).parent / "results"
DEFAULT_FAULTS = ("cable-pull", "flap", "silent-blackhole")


def summarise(rows: list[dict]) -> dict:
    cells: dict[str, dict] = {}
    for row in rows:
        for mode, flow in row["flows"].items():
            key = f"{row['mechanism']}|{row['fault']}|{mode}"
            cells.setdefault(key, []).append(flow["blackout_s"] * 1e3)
    out = {}
    for key, values in cells.items():
        mech, fault, mode = key.split("|")
        base = cells.get(f"none|{fault}|{mode}")
        median = statistics.median(values)
        out[key] = {"mechanism": mech, "fault": fault, "mode": mode, "trials": len(values),
                    "median_ms": median, "min_ms": min(values), "max_ms": max(values),
                    "ratio_to_no_failover": (median / statistics.median(base)) if base else None}
    return out


def plot(summary: dict, faults: list[str], mechanisms: list[str], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(FLOWS), figsize=(6 * len(FLOWS), 4.5), sharey=True)
    for ax, mode in zip(axes, FLOWS):
        median_bars(ax, faults, [(mech, [summary.get(f"{mech}|{f}|{mode}") for f in faults])
                                 for mech in mechanisms])
        ax.set_yscale("log")
        ax.set_title(f"{mode} flow" + (" (into the faulted host)" if mode == REVERSE else ""))
        ax.set_ylabel("blackout, ms (median, min-max)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--faults", default=",".join(DEFAULT_FAULTS),
                        help="comma-separated, from " + ",".join(FAULTS))
    parser.add_argument("--mechanisms", default=",".join(MECHANISMS))
    parser.add_argument("--fault-seconds", type=float, default=1.0)
    args = parser.parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    mechanisms = [m for m in args.mechanisms.split(",") if m]
    if not 5 <= args.trials <= 50:
        parser.error("--trials must be between 5 and 50")
    if bad := [f for f in faults if f not in FAULTS] + [m for m in mechanisms if m not in MECHANISMS]:
        parser.error(f"unknown fault or mechanism: {', '.join(bad)}")

    started = time.monotonic()
    rows = []
    for mech in mechanisms:
        with ScenarioLab(mech) as lab:
            for trial in range(args.trials):
                for fault in faults:
                    result = lab.trial(fault, before_s=0.5, fault_s=args.fault_seconds,
                                       after_s=1.0)
                    row = {"trial": trial, **result.as_dict()}
                    rows.append(row)
                    print(f"{mech:<10}{fault:<18}#{trial} " + "  ".join(
                        f"{m} {row['flows'][m]['blackout_s'] * 1e3:7.1f} ms" for m in FLOWS),
                        flush=True)
    summary = summarise(rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "failover.json").write_text(json.dumps(
        {"bench": "failover", "trials_per_cell": args.trials, "fault_s": args.fault_seconds,
         "summary": summary, "rows": rows}, indent=2))
    plot(summary, faults, mechanisms, RESULTS / "failover.png")

    print(f"\nmedian blackout over {args.trials} trials, ms (ratio to no failover), "
          f"faults of {args.fault_seconds:g} s")
    print(f"{'fault':<18}{'flow':<21}" + "".join(f"{m:>22}" for m in mechanisms))
    for fault in faults:
        for mode in FLOWS:
            line = f"{fault:<18}{mode:<21}"
            for mech in mechanisms:
                c = summary[f"{mech}|{fault}|{mode}"]
                ratio = f" ({c['ratio_to_no_failover']:.2f}x)" if c["ratio_to_no_failover"] else ""
                line += f"{c['median_ms']:>14.1f}{ratio:>8}"
            print(line)
    print(f"\nwrote {RESULTS / 'failover.json'} and .png in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
