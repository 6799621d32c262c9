"""Where a silent blackhole's blackout goes, part by part (issue 25).

The hiccup bench (labs/bench/hiccup.py) gives the blackout of a silent
blackhole as one number. This one splits each of its linkpassd trials
into the parts the detection contract names (docs/probing.md), from a
capture of lph1's rail-0 probes (tcpdump on the host's port, in its
namespace, kernel time stamps) beside the route watch:

  met       injection -> the first probe sent into the fault (the chain's
            first probe): up to one probe interval, half of it on average
  chain     that probe -> the chain's probe a tolerance later (the grid's
            last point, the first probe sent at least ``tolerance_ms`` after
            the first): the tolerance, plus how late that probe left
  reaction  that probe -> lph1's route moved off rail 0: the reply wait
            (``suspect_ms``), the verdict, and the daemon's route writes
            until the kernel's route changed, as labs/routewatch.py saw it
  after     the move -> the flow's first packet through the new path:
            the receiver's side of the blackout

The route watch stamps a change when it reads the kernel's notification, an
upper bound on when the route changed: its own wake-up is in "reaction", and
"after" is that much short (a little below zero when the watch woke late).
Each split also gives the longest gap between two probes of the chain: a
grid point sent late (our loop busy) lengthens the chain by that much.

Same lab and fault as the hiccup bench (the dualrail lab, lph1's rail 0
blackholed at its leaf, a 1 packet/ms flow lph1 -> lph2), one lab per
mechanism, mechanisms side by side in one run:

    flock -w 900 /tmp/linkpass-lab.lock .venv/bin/python -m labs.bench.blackhole_split \\
        --trials 20 --label NAME [--mechanisms linkpassd-10,linkpassd-50]

Writes labs/bench/results/blackhole_split-NAME.{json,png}.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import signal
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from labs.bench import hiccup
from labs.topos.plan import LabError

RESULTS = Path(__file__).parent / "results"
MECHANISMS = [m for m, (kind, _) in hiccup.MECHANISMS.items() if kind == "linkpassd"]
PARTS = ("met", "chain", "reaction", "after")
CAPTURE_START_S = 1.0  # tcpdump is listening before the trial's flow starts
CAPTURE_STOP_S = 5.0
ON_GRID_S = 1e-4  # a grid point is sent at or after its time; this much float slack


@dataclass(frozen=True)
class Split:
    met_ms: float
    chain_ms: float
    reaction_ms: float
    after_ms: float
    probes: int  # probes sent from the first through the one a tolerance later
    longest_gap_ms: float  # between two of those probes: a late loop shows here


def split(sends: list[float], injected_at: float, moved_at: float, restored_at: float,
          tolerance_s: float) -> Split:
    """The parts of one blackout from the probe send times (monotonic, any
    order), the injection, lph1's route move and the flow's first packet
    after the silence. ValueError when the capture does not show a chain
    that spans the tolerance before the move (then it says nothing)."""
    after = sorted(s for s in sends if s >= injected_at)
    if not after:
        raise ValueError("no probe was sent after the injection")
    first = after[0]
    last = next((s for s in after if s >= first + tolerance_s - ON_GRID_S), None)
    if last is None or last > moved_at:
        raise ValueError(f"no probe a tolerance ({tolerance_s * 1e3:g} ms) after the first "
                         f"({(first - injected_at) * 1e3:.1f} ms after the injection) before "
                         f"the move ({(moved_at - injected_at) * 1e3:.1f} ms)")
    chain = [s for s in after if s <= last]
    return Split(met_ms=(first - injected_at) * 1e3, chain_ms=(last - first) * 1e3,
                 reaction_ms=(moved_at - last) * 1e3, after_ms=(restored_at - moved_at) * 1e3,
                 probes=len(chain),
                 longest_gap_ms=max((b - a for a, b in zip(chain, chain[1:])), default=0.0) * 1e3)


def summarise(rows: list[dict]) -> dict[str, dict]:
    """Per mechanism: each part's median, min and max over the trials that
    split, the blackout's, and how many trials did not split."""
    out: dict[str, dict] = {}
    for mech in dict.fromkeys(r["mechanism"] for r in rows):
        ok = [r for r in rows if r["mechanism"] == mech and "split" in r]
        cell: dict = {"trials": sum(1 for r in rows if r["mechanism"] == mech),
                      "split": len(ok)}
        for name, values in [*((p, [r["split"][f"{p}_ms"] for r in ok]) for p in PARTS),
                             ("blackout", [r["blackout_ms"] for r in ok])]:
            cell[name] = ({"median_ms": statistics.median(values), "min_ms": min(values),
                           "max_ms": max(values)} if values else None)
        out[mech] = cell
    return out


class ProbeCapture:
    """tcpdump on a host's port, in its namespace: the probes it sends."""

    def __init__(self, lab, host: str, port: str, src: str, echo_port: int, pcap: Path):
        self.lab, self.src, self.pcap = lab, src, pcap
        self.proc = lab.popen(host, ["tcpdump", "-i", port, "-n", "-U", "-w", str(pcap),
                                     "--time-stamp-precision=micro",
                                     f"udp and src host {src} and dst port {echo_port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(CAPTURE_START_S)

    def stop(self) -> list[float]:
        """The send times, on the monotonic clock (tcpdump stamps wall-clock
        time: shifted by the offset between the two clocks, read now)."""
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(CAPTURE_STOP_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(CAPTURE_STOP_S)
        offset = time.time() - time.monotonic()
        out = subprocess.run(["tcpdump", "-r", str(self.pcap), "-n", "-tt"], capture_output=True,
                             text=True, timeout=30, check=True).stdout
        return [float(line.split()[0]) - offset for line in out.splitlines()
                if f" {self.src}." in line]


def probe_settings(cell: hiccup.Cell):
    """The echo settings lph1's daemon runs with, read as the daemon reads
    its config (so the tolerance and port are the daemon's, defaults included)."""
    from linkpassd.config import parse_config

    path = cell.lab.config_path("lph1")
    return parse_config(path.read_text(), str(path)).probes


def run_mechanism(mechanism: str, trials: int, rng: random.Random, work: Path,
                  log=print) -> list[dict]:
    cell = hiccup.Cell(mechanism, {}, hiccup.echo_section(), log)
    rows = []
    try:
        settings = probe_settings(cell)
        host = cell.lab.host("lph1")
        spec = hiccup.fault_spec("blackhole")
        for i in range(trials):
            t = hiccup.Trial(spec, i, rng.uniform(0, cell.interval_ms / 1e3))
            try:
                out = one_trial(cell, t, host, settings, work / f"{mechanism}-{i}")
            except (TimeoutError, RuntimeError, OSError, LabError,
                    subprocess.SubprocessError) as exc:
                out = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
                if isinstance(exc, TimeoutError):  # the lab did not come back
                    rows.append({"mechanism": mechanism, "trial": i, **out})
                    log(f"{mechanism:<13} #{i:<2} {out['error'][:200]}; stopping")
                    break
            rows.append({"mechanism": mechanism, "trial": i,
                         "tolerance_ms": settings.tolerance_ms, **out})
            parts = " ".join(f"{p} {out['split'][p + '_ms']:5.1f}" for p in PARTS) \
                if "split" in out else out["error"][:200]
            log(f"{mechanism:<13} #{i:<2} blackout {out.get('blackout_ms') or 0:5.1f} ms: {parts}")
    finally:
        cell.close()
    return rows


def one_trial(cell: hiccup.Cell, t: hiccup.Trial, host, settings, work: Path) -> dict:
    """The hiccup bench's trial with lph1's probes captured: its blackout and
    its split, or an ``error`` saying why it has none."""
    capture = ProbeCapture(cell.lab, "lph1", host.rail(0).port, host.rail(0).address,
                           settings.port, work.with_suffix(".pcap"))
    try:
        row = cell.trial(t, work)
    finally:
        sends = capture.stop()
    move = row["moves"].get("lph1")
    out: dict = {"blackout_ms": row["blackout_ms"], "probes_captured": len(sends)}
    # the probes from the injection to the move (or 1 s on), for a reader to check
    end = row["injected_at"] + (move["after_ms"] / 1e3 if move else 1.0)
    out["sends_ms"] = [round((s - row["injected_at"]) * 1e3, 2) for s in sorted(sends)
                       if row["injected_at"] <= s <= end]
    if move is None:
        return {**out, "error": "lph1 did not move"}
    if row["blackout_ms"] is None or row["rx_silence_start_ms"] is None:
        return {**out, "error": "the flow showed no silence across the fault"}
    moved_at = row["injected_at"] + move["after_ms"] / 1e3
    restored_at = row["injected_at"] + (row["rx_silence_start_ms"] + row["blackout_ms"]) / 1e3
    try:
        out["split"] = split(sends, row["injected_at"], moved_at, restored_at,
                             settings.tolerance_ms / 1e3).__dict__
    except ValueError as exc:
        return {**out, "error": str(exc)}
    return out


def plot(summary: dict, path: Path, title: str) -> None:
    """One stacked bar per mechanism: each part's median."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mechs = [m for m, c in summary.items() if c["split"]]
    fig, ax = plt.subplots(figsize=(8, 5))
    for j, mech in enumerate(mechs):
        bottom = 0.0
        for k, part in enumerate(PARTS):
            height = summary[mech][part]["median_ms"]
            ax.bar(j, height, bottom=bottom, color=f"C{k}", label=part if j == 0 else None)
            ax.text(j, bottom + height / 2, f"{height:.1f}", ha="center", va="center", fontsize=8)
            bottom += height
        b = summary[mech]["blackout"]
        ax.text(j, bottom + 1, f"blackout {b['median_ms']:.1f} ms (median)", ha="center",
                fontsize=8)
    ax.set_xticks(range(len(mechs)), mechs)
    ax.set_ylabel("ms, median of the trials (the parts' medians need not add up)")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="labs.bench.blackhole_split",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--mechanisms", default="linkpassd-10,linkpassd-50",
                        help=f"comma-separated, of {', '.join(MECHANISMS)}")
    parser.add_argument("--label", default="run")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", args.label):
        parser.error(f"--label must be letters, digits, '.', '_' or '-', got {args.label!r}")
    mechanisms = [m for m in args.mechanisms.split(",") if m]
    if not mechanisms or any(m not in MECHANISMS for m in mechanisms):
        parser.error(f"--mechanisms: give some of {', '.join(MECHANISMS)}")
    if not 1 <= args.trials <= hiccup.MAX_TRIALS:
        parser.error(f"--trials must be 1..{hiccup.MAX_TRIALS}, got {args.trials}")
    rng = random.Random(args.seed)
    started = time.monotonic()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="lp-bhsplit-") as work:
        for mech in mechanisms:
            rows += run_mechanism(mech, args.trials, rng, Path(work))
    summary = summarise(rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"blackhole_split-{args.label}"
    out.with_suffix(".json").write_text(json.dumps({
        "bench": "blackhole_split", "label": args.label, "trials": args.trials,
        "seed": args.seed,
        "elapsed_s": time.monotonic() - started, "summary": summary, "rows": rows},
        indent=2))
    plot(summary, out.with_suffix(".png"), f"{out.name}: a silent blackhole's blackout, by part")
    for mech, c in summary.items():
        parts = "  ".join(f"{p} {c[p]['median_ms']:.1f}" for p in PARTS if c[p])
        print(f"{mech:<13} {c['split']}/{c['trials']} split  {parts}  blackout "
              f"{c['blackout']['median_ms']:.1f} ms" if c["blackout"] else f"{mech}: none split")
    print(f"wrote {out}.json and .png in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
