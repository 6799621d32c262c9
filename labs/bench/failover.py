"""Blackout per (setup x fault x flow), both directions, side by side, in one run.

Setups (host routing on the same bgp fabric, labs/topos/bgpfabric.py):

  frr-bgp          FRR alone on the hosts: eBGP + BFD to each rail's leaf,
                   rail addresses announced by FRR (labs/topos/frrbgp.py);
  linkpassd        linkpassd with BFD and echo probes, its [announce] driving
                   the host's FRR (docs/bgp.md), fencing off;
  linkpassd-fence  the same with [fence] on (FENCE below, docs/fencing.md);
  linkpassd-stand-in
                   linkpassd, each host rail also probing a stand-in peer
                   behind its leaf (labs/scenario.py STAND_IN_PEER): the
                   receiving host keeps its healthy rail, as a host with more
                   than one peer per rail does, so traffic into the faulted
                   host waits for the fabric alone;
  none, kernel     static per-rail routes / linkdown-aware routes, no daemon
                   (the floor; not run by default).

Each trial (labs/scenario.py) sends four flows through the dualrail lab and
injects one fault on the rail they use: kernel-path and qp-pinned out of the
faulted host, and kernel-path-reverse and qp-pinned-reverse into it,
addressed to its faulted rail (what only the fabric can move). Every cell is
repeated --trials times; the summary is the median with min and max, and the
ratio of each setup's median to the baseline's (--baseline, frr-bgp by
default). With fencing on, each row also counts the fences either host made.
Writes JSON and a PNG (one panel per flow, log scale).

Run as root from the repo root: .venv/bin/python -m labs.bench.failover
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from labs.bench.bars import median_bars
from labs.scenario import FAULTS, FLOWS, REVERSES, LabNotHealthy, ScenarioLab

RESULTS = Path(__file__).parent / "results"
DEFAULT_FAULTS = ("cable-pull", "silent-blackhole", "one-way-loss-out", "one-way-loss-in", "flap")
# [fence] for linkpassd-fence: the strictest fence_after_s the config allows,
# and a backoff and test short enough that a fenced port is back between
# trials. backoff_max_s = backoff_initial_s: a port fenced again within
# backoff_max_s of its last fence keeps the doubled backoff (docs/fencing.md),
# and at the default (600 s) trial after trial doubled it past the 45 s a
# trial waits for a healthy lab (the run of 2026-12-05 05:05 stopped on a
# backoff of 80 s). The test leaves the port's BFD session the 2 s it may need to come
# back up (the config refuses less). No aggregator in this lab, so the leaf
# grant is not required (one faulted host: the leaf cap could not bind
# anyway). lph1's faulted rail has BFD with its leaf, which singles the port
# out (core.fence.singled_out).
FENCE = {"fence_after_s": 0.5, "backoff_initial_s": 5.0, "backoff_max_s": 5.0,
         "test_window_s": 1.0, "test_timeout_s": 4.0, "require_leaf_grant": False}


@dataclass(frozen=True)
class Setup:
    """One column of the bench: how the lab protects its hosts."""

    mechanism: str  # labs/scenario.py ScenarioLab's mechanism
    fence: dict | None = None  # linkpassd's [fence] options; None: fencing off
    stand_in: bool = False  # a second echo peer per rail (labs/scenario.py STAND_IN_PEER)


SETUPS: dict[str, Setup] = {
    "frr-bgp": Setup("frr-bgp"),
    "linkpassd": Setup("linkpassd"),
    "linkpassd-fence": Setup("linkpassd", fence=FENCE),
    "linkpassd-stand-in": Setup("linkpassd", stand_in=True),
    "none": Setup("none"),
    "kernel": Setup("kernel"),
}
DEFAULT_SETUPS = ("frr-bgp", "linkpassd", "linkpassd-stand-in", "linkpassd-fence")


def summarise(rows: list[dict], baseline: str) -> dict:
    cells: dict[str, list[float]] = {}
    fences: dict[str, int] = {}
    for row in rows:
        for mode, flow in row["flows"].items():
            key = f"{row['setup']}|{row['fault']}|{mode}"
            cells.setdefault(key, []).append(flow["blackout_s"] * 1e3)
            fences[key] = fences.get(key, 0) + sum(row.get("fences", {}).values())
    out = {}
    for key, values in cells.items():
        setup, fault, mode = key.split("|")
        base = cells.get(f"{baseline}|{fault}|{mode}")
        median = statistics.median(values)
        out[key] = {"setup": setup, "fault": fault, "mode": mode, "trials": len(values),
                    "median_ms": median, "min_ms": min(values), "max_ms": max(values),
                    "fences": fences[key],
                    f"ratio_to_{baseline}": (median / statistics.median(base)) if base else None}
    return out


def plot(summary: dict, faults: list[str], setups: list[str], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(16, 9), sharey=True)
    for ax, mode in zip(axes.flat, FLOWS):
        median_bars(ax, faults, [(setup, [summary.get(f"{setup}|{f}|{mode}") for f in faults])
                                 for setup in setups])
        ax.set_yscale("log")
        ax.set_title(f"{mode}: " + ("into the faulted host" if mode in REVERSES
                                    else "out of the faulted host"))
        ax.set_ylabel("blackout, ms (median, min-max)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--faults", default=",".join(DEFAULT_FAULTS),
                        help="comma-separated, from " + ",".join(FAULTS))
    parser.add_argument("--setups", default=",".join(DEFAULT_SETUPS),
                        help="comma-separated, from " + ",".join(SETUPS))
    parser.add_argument("--baseline", default="frr-bgp",
                        help="the setup every ratio is to (default frr-bgp)")
    parser.add_argument("--fault-seconds", type=float, default=3.0)
    parser.add_argument("--name", default="failover",
                        help="results/<name>.json and .png (default failover)")
    args = parser.parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    setups = [s for s in args.setups.split(",") if s]
    if not 1 <= args.trials <= 50:
        parser.error("--trials must be between 1 and 50")
    if not 1.0 <= args.fault_seconds <= 10.0:
        parser.error("--fault-seconds must be between 1 and 10")
    if bad := [f for f in faults if f not in FAULTS] + [s for s in setups if s not in SETUPS]:
        parser.error(f"unknown fault or setup: {', '.join(bad)}")
    if args.baseline not in setups:
        parser.error(f"--baseline {args.baseline} is not among --setups ({', '.join(setups)})")
    if not args.name.replace("-", "").replace("_", "").isalnum():
        parser.error(f"--name must be letters, digits, - and _, got {args.name!r}")

    started = time.monotonic()
    rows: list[dict] = []
    failures: list[dict] = []  # setups whose lab did not come back: named, never dropped
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{args.name}.json"

    def save(summary: dict | None) -> None:
        """Every row so far (after each trial: a lab that fails half-way
        loses nothing measured), and the summary at the end."""
        out.write_text(json.dumps(
            {"bench": "failover", "trials_per_cell": args.trials, "fault_s": args.fault_seconds,
             "setups": {s: dataclasses.asdict(SETUPS[s]) for s in setups},
             "baseline": args.baseline, "complete": summary is not None,
             "failures": failures, "summary": summary or {}, "rows": rows}, indent=2))

    for setup in setups:
        chosen = SETUPS[setup]
        with ScenarioLab(chosen.mechanism, fence=chosen.fence, stand_in=chosen.stand_in) as lab:
            try:
                for trial in range(args.trials):
                    for fault in faults:
                        result = lab.trial(fault, before_s=0.5, fault_s=args.fault_seconds,
                                           after_s=1.0)
                        row = {"setup": setup, "trial": trial, **result.as_dict()}
                        rows.append(row)
                        fenced = f"  fences {row['fences']}" if row["fences"] else ""
                        print(f"{setup:<16}{fault:<18}#{trial} " + "  ".join(
                            f"{m} {row['flows'][m]['blackout_s'] * 1e3:7.1f} ms" for m in FLOWS)
                            + fenced, flush=True)
                        save(None)
            except LabNotHealthy as exc:
                # The setup's lab did not come back: a finding, kept in the
                # results with what it said; the other setups still run.
                failures.append({"setup": setup, "after_trial": trial, "fault": fault,
                                 "error": str(exc)})
                print(f"{setup}: STOPPED after trial {trial} ({fault}): {exc}", flush=True)
                save(None)
    summary = summarise(rows, args.baseline)
    save(summary)
    plot(summary, faults, setups, RESULTS / f"{args.name}.png")

    print(f"\nmedian blackout over {args.trials} trials, ms (ratio to {args.baseline}), "
          f"faults of {args.fault_seconds:g} s")
    print(f"{'fault':<18}{'flow':<21}" + "".join(f"{s:>24}" for s in setups))
    for fault in faults:
        for mode in FLOWS:
            line = f"{fault:<18}{mode:<21}"
            for setup in setups:
                c = summary.get(f"{setup}|{fault}|{mode}")
                if c is None:
                    line += f"{'-':>24}"
                    continue
                ratio = c[f"ratio_to_{args.baseline}"]
                line += f"{c['median_ms']:>14.1f}" + (f" ({ratio:.2f}x)" if ratio else "").rjust(10)
            print(line)
    for f in failures:
        print(f"\n{f['setup']} stopped after trial {f['after_trial']} ({f['fault']}): "
              + f["error"].splitlines()[0])
    print(f"\nwrote {out} and .png in {time.monotonic() - started:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
