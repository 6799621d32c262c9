"""Hiccups that must not fail a path over, and a blackhole that must (issue 25).

On the dualrail lab (two hosts, two rails, a spine), each mechanism in its
own lab, in one run:

  linkpassd-10, linkpassd-50  linkpassd echo probes at 10 / 50 ms with the
                              default detection settings, plus whatever
                              ``--echo-opt KEY=VALUE`` gives (written into
                              the daemon's echo section: ``[echo]`` when the
                              daemon's schema has one, else ``[probes]``)
  bfd-10, bfd-50              FRR eBGP per rail + BFD 10 / 50 ms x 3

Faults, all on lph1's rail 0 at its leaf (lpl0), installed before the
trials (labs.faults ``arm()``) so that each injection is one netlink request:

  outage-N      silent outage of N ms: every frame dropped both ways
  pause-N       the leaf sends nothing to lph1 for N ms and loses nothing
                (tbf, labs/faults/pause.py)
  busy-peer     for LOAD_S: the peer daemon (lph2's linkpassd; for FRR the
                leaf's bfdd, the far end of lph1's session) pinned to the
                last CPU with a busy loop pinned there too; linkpassd's peer
                also gets a SIGHUP reload every RELOAD_EVERY_S
  busy-all      for LOAD_S: a busy loop on every CPU
  blackhole     a silent blackhole of BLACKHOLE_MS: must move; its blackout
                (the receiver's gap across the injection) is the result

Each trial: the lab ready (route on rail 0 in both hosts; probes up or BGP
and BFD up), a 1 packet/ms kernel-path flow running (lph1 -> lph2 on rail 0;
for a pause lph2 -> lph1, through the paused direction, to show nothing is
lost), the fault injected at a random phase within one probe interval, then
whether lph1's or lph2's kernel moved its rail-0 traffic to lph2/lph1 off
rail 0 (labs/routewatch.py) between the injection and MOVE_WINDOW_S after
the fault ended. A trial that moved waits for the move back before the next.

    flock -w 900 /tmp/linkpass-lab.lock .venv/bin/python -m labs.bench.hiccup \\
        --trials 3 --label before [--mechanisms ...] [--faults ...] [--echo-opt tolerance_ms=30]
        [--fence-opt fence_after_s=0.5 ...]

``--fence-opt KEY=VALUE`` turns linkpassd's ``[fence]`` on (docs/fencing.md;
``require_leaf_grant = false``, since the lab has no aggregator) with those
options; each row then counts the fences either host made during its trial
(``fences``, from ``linkpassctl fences``), and the table shows them.

Writes labs/bench/results/hiccup-<label>.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import sys
import threading
import time
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

from labs.topos.plan import LabError, with_section_options

RESULTS = Path(__file__).parent / "results"
MECHANISMS = {  # name: (kind, interval ms)
    "linkpassd-10": ("linkpassd", 10), "linkpassd-50": ("linkpassd", 50),
    "bfd-10": ("frr-bgp", 10), "bfd-50": ("frr-bgp", 50),
}
DETECT_MULT = 3
OUTAGES_MS = (5, 10, 20, 40, 80)
PAUSES_MS = (10, 25, 50, 100)
LOADS = ("busy-peer", "busy-all")
BLACKHOLE_MS = 1000
LOAD_S = 2.0
RELOAD_EVERY_S = 0.1
FAULTS = ([f"outage-{n}" for n in OUTAGES_MS] + [f"pause-{n}" for n in PAUSES_MS]
          + list(LOADS) + ["blackhole"])
LEAD_S = 0.5  # flow running before the fault
MOVE_WINDOW_S = 1.0  # a move this long after the fault ended still counts
SETTLE_S = 0.5  # after the lab is ready again, before the next trial
RECOVER_TIMEOUT_S = 40.0
MAX_TRIALS = 50
HOSTS = ("lph1", "lph2")


# ---- pure: faults, schedule, options, aggregation -------------------------------------


@dataclass(frozen=True)
class FaultSpec:
    name: str
    kind: str  # outage | pause | load | blackhole
    size_ms: float  # how long the fault lasts

    @property
    def must_move(self) -> bool:
        return self.kind == "blackhole"


def fault_spec(name: str) -> FaultSpec:
    """A fault by its name (``outage-20``, ``pause-50``, ``busy-peer``,
    ``busy-all``, ``blackhole``); ValueError names the bad one."""
    m = re.fullmatch(r"(outage|pause)-(\d+)", name)
    if m:
        size = int(m.group(2))
        if not 1 <= size <= 500:
            raise ValueError(f"fault {name!r}: size must be 1..500 ms")
        return FaultSpec(name, m.group(1), float(size))
    if name in LOADS:
        return FaultSpec(name, "load", LOAD_S * 1e3)
    if name == "blackhole":
        return FaultSpec(name, "blackhole", float(BLACKHOLE_MS))
    raise ValueError(f"unknown fault {name!r} (known: outage-N, pause-N with N in 1..500 ms, "
                     f"{', '.join(LOADS)}, blackhole; the default set is {','.join(FAULTS)})")


@dataclass(frozen=True)
class Trial:
    fault: FaultSpec
    index: int
    phase_s: float  # after LEAD_S: the fault's random phase against the probe schedule


def schedule(faults: list[FaultSpec], trials: int, interval_ms: float,
             rng: random.Random) -> list[Trial]:
    """``trials`` rounds, each with every fault once in a shuffled order (so
    drift in the lab spreads over all faults), each at a phase drawn
    uniformly within one probe interval."""
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    out = []
    for index in range(trials):
        order = list(faults)
        rng.shuffle(order)
        out += [Trial(f, index, rng.uniform(0, interval_ms / 1e3)) for f in order]
    return out


def parse_echo_opts(items: list[str]) -> dict[str, object]:
    """``KEY=VALUE`` pairs; VALUE as a TOML value (30, 2.5, true, "x"), a bare
    word as a string. ValueError names the bad item."""
    out: dict[str, object] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) or not raw:
            raise ValueError(f"--echo-opt {item!r}: expected KEY=VALUE")
        try:
            out[key] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = raw
    return out


def echo_section() -> str:
    """Where the daemon's echo detection options live: ``echo`` once its
    schema has that section, ``probes`` (today's daemon) otherwise."""
    from linkpassd.config.schema import SCHEMA

    names = {s.name for s in SCHEMA}
    return "echo" if "echo" in names else "probes"


def _stats(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"median_ms": statistics.median(values), "min_ms": min(values),
            "max_ms": max(values), "n": len(values)}


def summarise(rows: list[dict]) -> dict[str, dict]:
    """Per ``mechanism|fault``: trials, how many moved (either host) and the
    share, the time to the first move, the blackout of the flow across the
    injection, and what the flow lost. Rows that failed (``error``) count as
    trials of neither outcome and are listed apart."""
    cells: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        cells.setdefault((row["mechanism"], row["fault"]), []).append(row)
    out = {}
    for (mech, fault), group in cells.items():
        ok = [r for r in group if not r.get("error")]
        moved = [r for r in ok if r["moved"]]
        spec = fault_spec(fault)
        out[f"{mech}|{fault}"] = {
            "mechanism": mech, "fault": fault, "kind": spec.kind, "size_ms": spec.size_ms,
            "trials": len(ok), "errors": len(group) - len(ok), "moved": len(moved),
            "moved_fraction": len(moved) / len(ok) if ok else None,
            "moved_trials": [r["trial"] for r in moved],
            "moved_by_host": {h: sum(1 for r in ok if r["moves"].get(h)) for h in HOSTS},
            "move_after_ms": _stats([r["move_after_ms"] for r in moved
                                     if r.get("move_after_ms") is not None]),
            "blackout_ms": _stats([r["blackout_ms"] for r in ok
                                   if r.get("blackout_ms") is not None]),
            "lost": [r.get("lost") for r in ok],
            **({"fenced": sum(sum(r["fences"].values()) for r in ok)}
               if any("fences" in r for r in ok) else {}),
        }
    return out


def table(summary: dict, mechanisms: list[str], faults: list[str]) -> str:
    """moved/trials per fault and mechanism, and the blackhole's blackout."""
    lines = [f"{'fault':<12}" + "".join(f"{m:>16}" for m in mechanisms)]
    for fault in faults:
        line = f"{fault:<12}"
        for mech in mechanisms:
            c = summary.get(f"{mech}|{fault}")
            if c is None:
                cell = "-"
            elif c["kind"] == "blackhole" and c["blackout_ms"]:
                cell = (f"{c['moved']}/{c['trials']} "
                        f"{c['blackout_ms']['median_ms']:.0f}ms")
            else:
                cell = f"{c['moved']}/{c['trials']}" + (f" e{c['errors']}" if c["errors"] else "")
            if c is not None and "fenced" in c:
                cell += f" f{c['fenced']}"
            line += f"{cell:>16}"
        lines.append(line)
    return "\n".join(lines)


def plot(summary: dict, mechanisms: list[str], faults: list[str], path: Path,
         title: str) -> None:
    """A 2 x 2 grid: share of trials moved against outage size and pause
    size (each point labelled moved/trials), under load, and the blackhole's
    blackout (median, min-max). One colour per mechanism throughout."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {m: f"C{i}" for i, m in enumerate(mechanisms)}
    specs = [fault_spec(f) for f in faults]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    for ax, kind, label in ((axes[0][0], "outage", "silent outage (both ways), ms"),
                            (axes[0][1], "pause", "pause towards the host (no loss), ms")):
        sizes = sorted({s.size_ms for s in specs if s.kind == kind})
        for i, mech in enumerate(mechanisms):
            cells = [summary.get(f"{mech}|{kind}-{int(sz)}") for sz in sizes]
            pts = [(x, c) for x, c in zip(sizes, cells) if c and c["moved_fraction"] is not None]
            if not pts:
                continue
            # a small offset per mechanism so equal shares stay visible
            ys = [c["moved_fraction"] + (i - (len(mechanisms) - 1) / 2) * 0.015 for _, c in pts]
            ax.plot([x for x, _ in pts], ys, marker="o", color=colours[mech], label=mech)
            for (x, c), y in zip(pts, ys):
                ax.annotate(f"{c['moved']}/{c['trials']}", (x, y), textcoords="offset points",
                            xytext=(4, 3), fontsize=7, color=colours[mech])
        ax.set_xscale("log")
        if sizes:
            ax.set_xticks(sizes, [f"{sz:g}" for sz in sizes])
            ax.minorticks_off()
        ax.set_xlabel(label)
        ax.set_ylabel("share of trials moved off the path")
        ax.set_ylim(-0.08, 1.1)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="center left")
    loads = [s.name for s in specs if s.kind == "load"]
    ax = axes[1][0]
    width = 0.8 / max(1, len(mechanisms))
    for i, mech in enumerate(mechanisms):
        xs = [j + (i - (len(mechanisms) - 1) / 2) * width for j in range(len(loads))]
        cells = [summary.get(f"{mech}|{name}") for name in loads]
        ys = [(c or {}).get("moved_fraction") or 0 for c in cells]
        ax.bar(xs, ys, width, color=colours[mech], label=mech)
        for x, y, c in zip(xs, ys, cells):
            if c:
                ax.text(x, y + 0.02, f"{c['moved']}/{c['trials']}", ha="center", fontsize=7)
    ax.set_xticks(range(len(loads)), loads)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel(f"share of trials moved ({LOAD_S:g} s of load)")
    ax.legend(fontsize=8)
    ax = axes[1][1]
    cells = [(m, (summary.get(f"{m}|blackhole") or {}).get("blackout_ms")) for m in mechanisms]
    cells = [(m, c) for m, c in cells if c]
    if cells:
        xs = range(len(cells))
        meds = [c["median_ms"] for _, c in cells]
        ax.bar(xs, meds, color=[colours[m] for m, _ in cells],
               yerr=[[c["median_ms"] - c["min_ms"] for _, c in cells],
                     [c["max_ms"] - c["median_ms"] for _, c in cells]], capsize=4)
        for x, (_, c) in zip(xs, cells):
            ax.text(x, c["max_ms"] + 3, f"{c['median_ms']:.0f} ms", ha="center", fontsize=8)
        ax.set_xticks(list(xs), [m for m, _ in cells])
    ax.set_ylabel("blackout, ms (median, min-max)")
    ax.set_title(f"silent blackhole of {BLACKHOLE_MS} ms: longest gap at the receiver",
                 fontsize=10)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- the lab -------------------------------------------------------------------------------


def _real_pid(pid: int, needle: str) -> int:
    """The PID running ``needle``: ``pid`` itself (mnexec execs) or its child."""
    def cmd(p: int) -> str:
        try:
            return Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return ""
    if needle in cmd(pid):
        return pid
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and needle in cmd(int(entry.name)):
            return int(entry.name)
    raise LookupError(f"no {needle!r} at pid {pid} or its children")


class Cell:
    """One mechanism's lab, faults armed, route watches running."""

    def __init__(self, mechanism: str, echo_opts: dict, section: str, log=print,
                 fence_opts: dict | None = None):
        from labs.faults import LeafPause, SilentBlackhole
        from labs.routewatch import RouteWatch
        from labs.scenario import LAB_TIMERS
        from labs.topos.dualrail import dualrail

        self.mechanism = mechanism
        self.kind, self.interval_ms = MECHANISMS[mechanism]
        self.fence_opts = fence_opts if self.kind == "linkpassd" else None
        self.log = log
        if self.kind == "linkpassd":
            probes = {"interval_ms": self.interval_ms}
            if section == "probes":
                probes.update(echo_opts)
            self.lab = dualrail("linkpassd", linkpassd_timers=LAB_TIMERS, probes=probes)
        else:
            self.lab = dualrail("frr-bgp", bfd={"interval_ms": self.interval_ms,
                                                "detect_mult": DETECT_MULT})
        self.lab.start()
        try:
            self.daemons = {}
            if self.kind == "linkpassd":
                from labs.topos.railopt import start_linkpassd
                if section != "probes" and echo_opts:
                    for host in HOSTS:
                        path = self.lab.config_path(host)
                        path.write_text(with_section_options(path.read_text(), section,
                                                             echo_opts))
                if self.fence_opts:
                    for host in HOSTS:
                        path = self.lab.config_path(host)
                        path.write_text(with_section_options(path.read_text(), "fence",
                                                             self.fence_opts))
                for host in HOSTS:
                    self.daemons[host] = start_linkpassd(self.lab, host)
            h1, h2 = self.lab.host("lph1"), self.lab.host("lph2")
            self.ports = {"lph1": h1.rail(0).port, "lph2": h2.rail(0).port}
            self.watches = {
                "lph1": RouteWatch.start(self.lab, "lph1", h2.rail(0).address,
                                         src=h1.rail(0).address, duration_s=3600),
                "lph2": RouteWatch.start(self.lab, "lph2", h1.rail(0).address,
                                         src=h2.rail(0).address, duration_s=3600)}
            self.outage = SilentBlackhole(self.lab, "lph1", 0).arm()
            self.pause = LeafPause(self.lab, "lph1", 0).arm()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for watch in getattr(self, "watches", {}).values():
            try:
                watch.stop()
            except Exception as exc:  # noqa: BLE001 - the lab's teardown still runs
                self.log(f"{self.mechanism}: stopping {watch}: {exc}")
        self.lab.close()

    def wait_ready(self, timeout: float = RECOVER_TIMEOUT_S) -> float:
        """Both hosts route rail 0 on rail 0, and every echo path is up
        (linkpassd) or every BGP session and BFD session is (FRR)."""
        from labs.bench.probing import probes_up, wait

        started = time.monotonic()
        def left() -> float:
            return max(0.1, started + timeout - time.monotonic())

        for host, watch in self.watches.items():
            wait(lambda watch=watch, host=host: (watch.current() or watch.initial).oif == self.ports[host], left(),
                 f"{self.mechanism}: {host}'s route back on {self.ports[host]}")
        if self.kind == "linkpassd":
            wait(lambda: probes_up(self.lab), left(), f"{self.mechanism}: echo probes up")
        else:
            try:
                self.lab.wait_frr_bgp(left())
            except LabError as exc:
                raise TimeoutError(str(exc)) from exc
        return time.monotonic() - started

    def fences(self) -> dict[str, int]:
        """Fences each host's linkpassd made since it started (ListFences)."""
        import subprocess

        out = {}
        for host in HOSTS:
            proc = subprocess.run([sys.executable, "-m", "linkpassd.ctl.main", "--socket",
                                   self.lab.control_socket(host), "--timeout", "10", "fences",
                                   "-o", "json"], capture_output=True, text=True, timeout=30)
            if proc.returncode != 0:
                raise RuntimeError(f"linkpassctl fences on {host}: {proc.stderr.strip()}")
            out[host] = sum(int(f.get("fences", 0)) for f in json.loads(proc.stdout)["fences"])
        return out

    def peer_pid(self) -> int:
        """The far end of lph1's rail-0 detection: lph2's linkpassd, or the
        leaf's bfdd (FRR)."""
        if self.kind == "linkpassd":
            return _real_pid(self.daemons["lph2"].pid, "linkpassd.daemon")
        leaf = self.lab.rail("lph1", 0).leaf
        return _real_pid(self.lab.frr(leaf).procs["bfdd"].pid, "bfdd")

    # ---- one trial ----------------------------------------------------------------

    def trial(self, t: Trial, workdir: Path) -> dict:
        from labs.labflow import LabFlow, gap_overlapping

        spec = t.fault
        ready_s = self.wait_ready()
        time.sleep(SETTLE_S)
        src, dst = ("lph2", "lph1") if spec.kind == "pause" else ("lph1", "lph2")
        duration = LEAD_S + t.phase_s + spec.size_ms / 1e3 + MOVE_WINDOW_S
        flow = LabFlow(self.lab, src, self.lab.rail(src, 0).address, dst,
                       self.lab.rail(dst, 0).address, duration=duration, workdir=workdir)
        marks = {h: w.mark() for h, w in self.watches.items()}
        fences_before = self.fences() if self.fence_opts else None
        load = self._prepare_load(spec)
        try:
            t0 = flow.start()
            time.sleep(max(0.0, t0 + LEAD_S + t.phase_s - time.monotonic()))
            stamps, load_info = self._inject(spec, load)
        finally:
            self._release_load(load)
        report = flow.report()
        if report.get("blackout") is None:  # fewer than two packets arrived: nothing measured
            raise RuntimeError(f"the {src}->{dst} flow delivered {report.get('received')} of "
                               f"{report.get('sent')} packets: no gap to measure")
        end = stamps["cleared_at"] + MOVE_WINDOW_S
        moves = {}
        for host, watch in self.watches.items():
            first = next((c for c in watch.changes(marks[host])
                          if c.oif != self.ports[host] and c.at >= stamps["injected_at"]
                          and c.at <= end), None)
            moves[host] = None if first is None else {
                "after_ms": (first.at - stamps["injected_at"]) * 1e3, "to": first.oif,
                "cause": list(first.cause)}
        moved_after = [m["after_ms"] for m in moves.values() if m]
        fenced = None
        if fences_before is not None:
            assert self.fence_opts is not None
            time.sleep(max(0.0, end + float(self.fence_opts.get("fence_after_s", 5.0))
                           - time.monotonic()))  # a fence that is coming has come
            fenced = {h: n - fences_before[h] for h, n in self.fences().items()}
        gap = None
        if spec.kind != "load":
            gap = gap_overlapping(report, stamps["injected_at"], stamps["cleared_at"])
        row = {
            "mechanism": self.mechanism, "interval_ms": self.interval_ms,
            "fault": spec.name, "kind": spec.kind, "size_ms": spec.size_ms,
            "trial": t.index, "phase_ms": t.phase_s * 1e3, "ready_wait_s": ready_s,
            **stamps, "fault_ms": (stamps["cleared_at"] - stamps["injected_at"]) * 1e3,
            "moved": any(moves.values()), "moves": moves,
            **({"fences": fenced} if fenced is not None else {}),
            "move_after_ms": min(moved_after) if moved_after else None,
            "flow": f"{src}->{dst}", "sent": report.get("sent"), "lost": report.get("lost"),
            "longest_gap_ms": report["blackout"]["gap_s"] * 1e3,
            "gap_across_fault_ms": gap["gap_s"] * 1e3 if gap else None,
            # the data plane's view of when the fault took effect: the last
            # packet before the silence and the first after it, against the
            # injection and the clearing (a move ends a blackhole's silence early)
            "rx_silence_start_ms": (gap["start_t"] - stamps["injected_at"]) * 1e3 if gap else None,
            "rx_silence_end_after_clear_ms":
                (gap["end_t"] - stamps["cleared_at"]) * 1e3 if gap else None,
            "blackout_ms": (gap["gap_s"] * 1e3 if gap else None)
            if spec.kind == "blackhole" else None,
            **({"load": load_info} if load_info else {}),
        }
        return row

    def _prepare_load(self, spec: FaultSpec) -> dict | None:
        """Everything a load trial needs, started before the trial: hogs
        blocked on their stdin, the peer pinned to the hog's CPU."""
        from labs.cpuhog import CpuHogs, pin_threads

        if spec.kind != "load":
            return None
        ncpu = os.cpu_count() or 1
        if spec.name == "busy-all":
            return {"hogs": CpuHogs(list(range(ncpu)), LOAD_S), "cpus": list(range(ncpu))}
        cpu = ncpu - 1
        pid = self.peer_pid()
        load = {"hogs": CpuHogs([cpu], LOAD_S), "cpus": [cpu], "peer_pid": pid}
        try:
            load["pinned"] = pin_threads(pid, {cpu})
        except BaseException:
            load["hogs"].stop()
            raise
        return load

    def _inject(self, spec: FaultSpec, load: dict | None) -> tuple[dict, dict | None]:
        if spec.kind in ("outage", "blackhole", "pause"):
            fault = self.pause if spec.kind == "pause" else self.outage
            try:
                fault.inject()
                time.sleep(max(0.0, fault.injected_at + spec.size_ms / 1e3 - time.monotonic()))
            finally:
                fault.clear()
            return fault.stamps(), None
        assert load is not None
        stop = threading.Event()
        reloads = [0]
        reloader = None
        if spec.name == "busy-peer" and self.kind == "linkpassd":
            pid = load["peer_pid"]

            def reload_loop() -> None:
                while not stop.wait(RELOAD_EVERY_S):
                    os.kill(pid, signal.SIGHUP)
                    reloads[0] += 1
            reloader = threading.Thread(target=reload_loop, daemon=True, name="hiccup-reload")
        started = load["hogs"].go()
        if reloader:
            reloader.start()
        try:
            time.sleep(max(0.0, started + LOAD_S - time.monotonic()))
        finally:
            stop.set()
            if reloader:
                reloader.join(5)
            ended = load["hogs"].stop()
        info = {"cpus": load["cpus"], "busy_s": LOAD_S}
        if "peer_pid" in load:
            info["peer_pid"] = load["peer_pid"]
            info["peer_pinned_to"] = load["cpus"]
        if reloader:
            info["reloads"] = reloads[0]
            info["reload_every_s"] = RELOAD_EVERY_S
        return {"injected_at": started, "inject_acked_at": None, "cleared_at": ended,
                "clear_acked_at": None}, info

    def _release_load(self, load: dict | None) -> None:
        from labs.cpuhog import restore_threads

        if load is None:
            return
        load["hogs"].stop()
        if "pinned" in load:
            restore_threads(load["pinned"])


def run_mechanism(mechanism: str, faults: list[FaultSpec], trials: int, echo_opts: dict,
                  section: str, rng: random.Random, workroot: Path, log=print,
                  fence_opts: dict | None = None) -> list[dict]:
    """Every trial of one mechanism in its own lab. A trial that fails is a
    row with ``error``; a lab that does not come back (or cannot be built)
    ends this mechanism's run, and the next mechanism still runs."""
    rows: list[dict] = []
    plan = schedule(faults, trials, MECHANISMS[mechanism][1], rng)
    try:
        cell = Cell(mechanism, echo_opts, section, log, fence_opts=fence_opts)
    except (TimeoutError, RuntimeError, OSError, LabError) as exc:
        log(f"{mechanism}: lab failed: {exc}")
        return [{"mechanism": mechanism, "fault": t.fault.name, "kind": t.fault.kind,
                 "trial": t.index, "error": f"lab: {type(exc).__name__}: {exc}"[:2000]}
                for t in plan]
    try:
        for n, t in enumerate(plan):
            try:
                row = cell.trial(t, workroot / f"{mechanism}-{n}")
            except (TimeoutError, RuntimeError, OSError, LabError) as exc:
                row = {"mechanism": mechanism, "fault": t.fault.name, "kind": t.fault.kind,
                       "trial": t.index, "error": f"{type(exc).__name__}: {exc}"[:2000]}
                log(f"{mechanism:<13} {t.fault.name:<11} #{t.index:<2} ERROR {row['error'][:200]}")
                rows.append(row)
                if isinstance(exc, TimeoutError):  # the lab did not come back
                    rows += [{"mechanism": mechanism, "fault": rest.fault.name,
                              "kind": rest.fault.kind, "trial": rest.index,
                              "error": "not run: the lab did not come back"}
                             for rest in plan[n + 1:]]
                    break
                continue
            rows.append(row)
            moved = ", ".join(f"{h} after {m['after_ms']:.0f} ms" for h, m in row["moves"].items()
                              if m) or "no"
            extra = f" blackout {row['blackout_ms']:.0f} ms" if row.get("blackout_ms") else ""
            fenced = (f" fences {sum(row['fences'].values())}" if "fences" in row else "")
            log(f"{mechanism:<13} {t.fault.name:<11} #{t.index:<2} moved: {moved:<28}"
                f" lost {row['lost']}{extra}{fenced}")
    finally:
        cell.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="labs.bench.hiccup", description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10, help="trials per fault and mechanism")
    parser.add_argument("--mechanisms", default=",".join(MECHANISMS),
                        help=f"comma-separated, of {', '.join(MECHANISMS)}")
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help="comma-separated: outage-N, pause-N (ms), busy-peer, busy-all, "
                             "blackhole")
    parser.add_argument("--echo-opt", action="append", default=[], metavar="KEY=VALUE",
                        help="an echo detection option for linkpassd (repeatable)")
    parser.add_argument("--fence-opt", action="append", default=[], metavar="KEY=VALUE",
                        help="turn linkpassd's [fence] on with this option (repeatable); "
                             "rows count the fences")
    parser.add_argument("--label", default="run", help="results/hiccup-LABEL.{json,png}")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--merge", metavar="LABEL,...",
                        help="no lab: join the results of earlier runs (same trials and "
                             "options, each run with its mechanisms side by side) into "
                             "hiccup-LABEL")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", args.label):
        parser.error(f"--label must be letters, digits, '.', '_' or '-', got {args.label!r}")
    if args.merge:
        try:
            return merge([p for p in args.merge.split(",") if p], args.label)
        except ValueError as exc:
            parser.error(str(exc))
    mechanisms = [m for m in args.mechanisms.split(",") if m]
    if bad := [m for m in mechanisms if m not in MECHANISMS]:
        parser.error(f"unknown mechanism {', '.join(bad)} (known: {', '.join(MECHANISMS)})")
    try:
        faults = [fault_spec(f) for f in args.faults.split(",") if f]
        echo_opts = parse_echo_opts(args.echo_opt)
        fence_opts = parse_echo_opts(args.fence_opt)
    except ValueError as exc:
        parser.error(str(exc))
    if not faults or not mechanisms:
        parser.error("nothing to run: give at least one fault and one mechanism")
    if not 1 <= args.trials <= MAX_TRIALS:
        parser.error(f"--trials must be 1..{MAX_TRIALS}, got {args.trials}")
    section = echo_section()
    if echo_opts:
        check_echo_opts(echo_opts, section, parser)
    if fence_opts:
        fence_opts = {"enabled": True, "require_leaf_grant": False, **fence_opts}
        check_echo_opts(fence_opts, "fence", parser, "--fence-opt")

    rng = random.Random(args.seed)
    started = time.monotonic()
    load_before = os.getloadavg()
    import tempfile
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="lp-hiccup-") as work:
        for mech in mechanisms:
            rows += run_mechanism(mech, faults, args.trials, echo_opts, section, rng, Path(work),
                                  fence_opts=fence_opts or None)
    summary = summarise(rows)
    names = [f.name for f in faults]
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"hiccup-{args.label}"
    from labs.scenario import LAB_TIMERS
    out.with_suffix(".json").write_text(json.dumps({
        "bench": "hiccup", "label": args.label, "trials_per_cell": args.trials,
        "seed": args.seed, "mechanisms": {m: {"kind": MECHANISMS[m][0],
                                              "interval_ms": MECHANISMS[m][1]}
                                          for m in mechanisms},
        "echo_section": section, "echo_opts": echo_opts, "fence_opts": fence_opts,
        "linkpassd_timers": LAB_TIMERS,
        "bfd_detect_mult": DETECT_MULT, "faults": [asdict(f) for f in faults],
        "fault_port": "lph1 rail 0, at its leaf lpl0",
        "constants": {"lead_s": LEAD_S, "move_window_s": MOVE_WINDOW_S, "load_s": LOAD_S,
                      "reload_every_s": RELOAD_EVERY_S, "blackhole_ms": BLACKHOLE_MS,
                      "flow_pps": 1000},
        "elapsed_s": time.monotonic() - started,
        # the machine's load average (1, 5, 15 min) as the run started and ended:
        # other work on a shared machine is part of the conditions
        "loadavg": {"start": load_before, "end": os.getloadavg()},
        "summary": summary, "rows": rows},
        indent=2, default=str))
    report(out, summary, mechanisms, names, args.trials, echo_opts)
    print(f"\nwrote {out}.json and .png in {time.monotonic() - started:.0f} s")
    return 0


def report(out: Path, summary: dict, mechanisms: list[str], faults: list[str], trials: int,
           echo_opts: dict) -> None:
    opts = " ".join(f"{k}={v}" for k, v in echo_opts.items()) or "defaults"
    plot(summary, mechanisms, faults, out.with_suffix(".png"),
         f"{out.name}: moved off the path, {trials} trials each (linkpassd echo: {opts})")
    print("\nmoved/trials (either host moved its rail-0 traffic); blackhole: median blackout\n"
          + table(summary, mechanisms, faults))


def merge(labels: list[str], label: str) -> int:
    """One result from runs that each compared the same mechanisms side by
    side on some of the faults (a long grid run in parts, so that the lab is
    not held for an hour): their rows joined, summarised and drawn again.
    The parts must agree on trials, mechanisms and options; a fault in two
    parts is refused (which trials would count?)."""
    parts = []
    for name in labels:
        path = RESULTS / f"hiccup-{name}.json"
        try:
            parts.append(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from exc
    if not parts:
        raise ValueError("--merge names no run")
    first = parts[0]
    for key in ("trials_per_cell", "mechanisms", "echo_opts", "echo_section"):
        for name, part in zip(labels, parts):
            if part.get(key) != first.get(key):
                raise ValueError(f"hiccup-{name}: {key} {part.get(key)!r} differs from "
                                 f"hiccup-{labels[0]}'s {first.get(key)!r}")
    faults: list[dict] = []
    for name, part in zip(labels, parts):
        for fault in part["faults"]:
            if any(f["name"] == fault["name"] for f in faults):
                raise ValueError(f"hiccup-{name}: fault {fault['name']} is in two parts")
            faults.append(fault)
    rows = [row for part in parts for row in part["rows"]]
    summary = summarise(rows)
    mechanisms = list(first["mechanisms"])
    order = {name: i for i, name in enumerate(FAULTS)}
    names = sorted((f["name"] for f in faults), key=lambda n: order.get(n, len(order)))
    out = RESULTS / f"hiccup-{label}"
    out.with_suffix(".json").write_text(json.dumps({
        **{k: v for k, v in first.items() if k not in ("rows", "summary", "faults", "label",
                                                      "elapsed_s", "loadavg", "seed")},
        "label": label, "faults": sorted(faults, key=lambda f: order.get(f["name"], len(order))),
        "parts": [{"label": name, "faults": [f["name"] for f in part["faults"]],
                   "seed": part.get("seed"), "elapsed_s": part.get("elapsed_s"),
                   "loadavg": part.get("loadavg")} for name, part in zip(labels, parts)],
        "elapsed_s": sum(p.get("elapsed_s") or 0 for p in parts),
        "summary": summary, "rows": rows}, indent=2, default=str))
    report(out, summary, mechanisms, names, first["trials_per_cell"], first["echo_opts"])
    print(f"\nwrote {out}.json and .png from {len(parts)} runs")
    return 0


def check_echo_opts(echo_opts: dict, section: str, parser: argparse.ArgumentParser,
                    flag: str = "--echo-opt") -> None:
    """The daemon's own parser judges the options before any lab is built."""
    from labs.topos.plan import FabricPlan, linkpassd_toml
    from linkpassd.config import parse_config

    host = FabricPlan(2, 2, 1).hosts[0]
    probes = {"interval_ms": 50, **(echo_opts if section == "probes" else {})}
    text = linkpassd_toml(host, control_socket="/tmp/lplab-check/ctl.sock",
                          run_dir="/tmp/lplab-check/run", probes=probes)
    if section != "probes":
        text = with_section_options(text, section, echo_opts)
    try:
        parse_config(text, source=flag)
    except Exception as exc:  # noqa: BLE001 - the config error names the bad option
        parser.error(f"{flag} rejected by linkpassd's config ([{section}]): {exc}")


if __name__ == "__main__":
    sys.exit(main())
