"""How many hosts linkpass-aggregator sustains on this machine, per store.

    python -m labs.bench.aggregator [--hosts 1024,4096,16384] [--seconds 30]
        [--modes floor,sqlite,pg1,pg3] [--trials 1] [--label run]

Modes: `floor` (labs/bench/agg_floor: a servicer that only reads and acks,
with the aggregator's gRPC options: what grpc.aio alone costs under the same
load), `sqlite` (one aggregator, its SQLite file), `pg1` and `pg3` (one or
three aggregator replicas on one private PostgreSQL, labs/pgcluster.py, on
this machine; a fresh database per size). For each mode and fleet size: fresh
aggregators (labs/aggproc.AggregatorProc: insecure, loopback TCP, no page,
metrics on), then load processes (labs/bench/agg_load.py, each up to
HOSTS_PER_LOAD_PROCESS agents, each agent on its own TCP connection, spread
over the replicas as a load balancer would, moving to the next replica when a
stream fails). Every load process connects its hosts; once all have and
the fleet's probe-mesh plan has settled (linkpass_aggregator_mesh_plan_pending;
a 16,384-host plan is tens of seconds of a core), the bench starts their
measured phase at one moment (so the incident is one
fleet-wide second): a heartbeat every 5 s per host, background events, and
halfway an incident in which a quarter of the hosts each send 20 events (4
batches of 5) and a changed PortReport, spread over one second.

The fleet's first connections are spread at CONNECTS_PER_S (start_load);
each simulated host has the agent's channel options and reconnect backoff.

Measured per size: hosts connected, p50/p99 event-to-stored latency (batch
handed to the stream -> EventAck, which the aggregator sends only once the
event is durable), during the measured phase: each aggregator's CPU (with its
mesh-planner process) and that CPU per message the load sent (every kind),
PostgreSQL's CPU (all its processes), the load
processes' CPU and their event-loop lag (their own cost, which on a 2-core
machine is taken from the aggregator), and where the time goes inside the
aggregator (its linkpass_aggregator_stage_seconds histograms, metrics.STAGES:
inbox, store queue, begin, statements, commit, outbox, loop lag). Bytes per
stored event: SQLite, the file's size less its size with the events deleted
and vacuumed; PostgreSQL, pg_total_relation_size of events and absorbed, and
the WAL written per event. With --trials N each size runs N times and the
row is the trial with the median p99 (every trial is kept in the JSON).

Sustained means every host got in, every event was acked and p99 <= 1 s.
Target (issues 12 and 14): 16,384 hosts with p99 <= 1 s.

Writes labs/bench/results/aggregator-<label>.json and .png; needs no root.
Run under the lab lock (flock /tmp/linkpass-lab.lock): it is a benchmark.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from labs.aggproc import AggregatorProc
from labs.bench.scale_lab import parse_metrics

RESULTS = Path(__file__).parent / "results"
HOSTS = (1024, 4096, 16384)
MODES = {"floor": -1, "sqlite": 0, "pg1": 1, "pg3": 3}  # mode -> PostgreSQL replicas (0: SQLite, -1: agg_floor)
TARGET_HOSTS = 16384
TARGET_P99_S = 1.0
HOSTS_PER_LOAD_PROCESS = 2048
PLAN_SETTLE_S = 300.0  # bound on waiting for the mesh plan after connecting
CONNECTS_PER_S = 1000  # the fleet's first connections are spread at this rate (see start_load)
GO_DELAY_S = 1.0  # the measured phase starts this long after the last process connected


def log(msg: str) -> None:
    print(f"[aggregator-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def tree_cpu_seconds(pid: int) -> float:
    """utime + stime of a process and its live descendants (all threads)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
            total += (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue  # ended meanwhile
    return total


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def metrics_text(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.read().decode()
    except OSError:
        return ""


def mesh_settled(urls: list[str]) -> bool:
    """Every replica has no plan pending, and some replica made one."""
    pending, plans = 0.0, 0.0
    for url in urls:
        for name, _labels, value in parse_metrics(metrics_text(url)):
            if name == "linkpass_aggregator_mesh_plan_pending":
                pending += value
            elif name == "linkpass_aggregator_mesh_plans_total":
                plans += value
    return pending == 0 and plans >= 1


def scrape(url: str) -> dict[tuple[str, str], float]:
    """The stage histograms' cumulative buckets and sums: (stage, le|"sum"|"count") -> value."""
    out: dict[tuple[str, str], float] = {}
    for name, labels, value in parse_metrics(metrics_text(url)):
        if name.startswith("linkpass_aggregator_stage_seconds"):
            key = labels.get("le") or name.rsplit("_", 1)[1]  # bucket, or sum/count
            out[(labels.get("stage", ""), key)] = out.get((labels.get("stage", ""), key), 0.0) + value
        elif name == "linkpass_aggregator_messages_received_total":
            out[("messages", labels.get("kind", ""))] = value
        elif name.startswith("linkpass_aggregator_store_group_calls"):
            key = labels.get("le") or name.rsplit("_", 1)[1]
            out[("group_calls", key)] = value
    return out


def stage_summary(before: list[dict], after: list[dict]) -> dict[str, dict]:
    """Per stage over the measured phase (all replicas together): count,
    mean, and p50/p99 as the upper bound of the bucket holding them."""
    diff: dict[tuple[str, str], float] = {}
    for b, a in zip(before, after):
        for key, value in a.items():
            diff[key] = diff.get(key, 0.0) + value - b.get(key, 0.0)
    out: dict[str, dict] = {"messages": {k: int(v) for (s, k), v in diff.items() if s == "messages"}}
    for stage in sorted({s for s, _ in diff} - {"messages"}):
        count = diff.get((stage, "count"), 0.0)
        if not count:
            continue
        buckets = sorted((float(k), v) for (s, k), v in diff.items()
                         if s == stage and k not in ("sum", "count", "created"))
        out[stage] = {"count": int(count), "mean": diff.get((stage, "sum"), 0.0) / count,
                      "p50_le": bucket_quantile(buckets, count, 0.5),
                      "p99_le": bucket_quantile(buckets, count, 0.99)}
    return out


def bucket_quantile(buckets: list[tuple[float, float]], count: float, q: float) -> float | None:
    """The upper bound of the first cumulative bucket holding quantile q."""
    for le, cumulative in buckets:
        if cumulative >= q * count:
            return le
    return None


def pct(values: list[float], q: float) -> float | None:
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


class FloorProc:
    """labs/bench/agg_floor in place of the aggregator: what grpc.aio alone
    costs under the same load (mode "floor")."""

    def __init__(self) -> None:
        from labs.aggproc import _free_loopback_port
        self.address = f"127.0.0.1:{_free_loopback_port()}"
        self.metrics_url = ""
        self.proc: subprocess.Popen | None = None
        self.name = "floor"

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "labs.bench.agg_floor", "--listen", self.address],
                                     stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "serving":
            raise RuntimeError(f"agg_floor did not start ({self.proc.poll()})")

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def log_tail(self, _chars: int) -> str:
        return ""


def start_load(targets: list[str], hosts: int, args) -> list[subprocess.Popen]:
    """The load processes. The fleet's first connections are spread over
    hosts / CONNECTS_PER_S seconds (a fleet's daemons do not start in one
    instant; 16,384 at once overflow the listen backlog, which grpc takes
    from net.core.somaxconn, 4,096 here: see docs/aggregator.md)."""
    spread_s = hosts / CONNECTS_PER_S
    procs = []
    for first in range(0, hosts, HOSTS_PER_LOAD_PROCESS):
        count = min(HOSTS_PER_LOAD_PROCESS, hosts - first)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "labs.bench.agg_load", "--targets", ",".join(targets),
             "--hosts", str(count), "--first", str(first), "--seconds", str(args.seconds),
             "--burst", str(args.burst), "--seed", str(args.seed + first), "--sync",
             "--connect-spread-s", f"{spread_s:g}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def read_line(proc: subprocess.Popen, what: str) -> dict:
    line = proc.stdout.readline()  # bounded: each load process ends by itself
    if not line:
        proc.wait(timeout=30)
        raise RuntimeError(f"load process ended ({proc.returncode}) before {what}: "
                           f"{proc.stderr.read().strip()[-2000:]}")
    return json.loads(line)


def merge(rows: list[dict], hosts: int, args) -> dict:
    latencies = sorted(v / 1e3 for r in rows for v in r["latencies_ms"])
    incident = sorted(v / 1e3 for r in rows for v in r["incident_latencies_ms"])
    errors: dict[str, int] = {}
    for r in rows:
        for code, n in r["errors"].items():
            errors[code] = errors.get(code, 0) + n
    total = {key: sum(r[key] for r in rows) for key in (
        "connected", "heartbeats_sent", "events_sent", "messages_sent", "events_acked", "events_unacked",
        "incident_hosts", "incident_reports", "load_cpu_s", "load_connect_cpu_s",
        "load_measured_cpu_s", "reconnects")}
    measured_s = max(r["measured_s"] for r in rows)
    return {"hosts": hosts, "load_processes": len(rows), **total,
            "connect_s": max(r["connect_s"] for r in rows), "seconds": args.seconds,
            "burst": args.burst, "p50_s": pct(latencies, 0.5), "p99_s": pct(latencies, 0.99),
            "max_s": latencies[-1] if latencies else None, "incident_p99_s": pct(incident, 0.99),
            "errors": errors, "error_samples": [e for r in rows for e in r["error_samples"]][:5],
            "load_cpu_pct": round(100 * total["load_measured_cpu_s"] / measured_s, 1),
            "load_loop_lag_p99_s": max(r["load_loop_lag_p99_s"] or 0 for r in rows),
            "load_loop_lag_max_s": max(r["load_loop_lag_max_s"] for r in rows),
            "measured_s": round(measured_s, 2)}


def sqlite_bytes_per_event(path: Path) -> dict:
    """The file's size with its events, and after deleting them and VACUUM."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        events = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        full = conn.execute("PRAGMA page_count").fetchone()[0] * page
        conn.execute("DELETE FROM events")
        conn.execute("DELETE FROM absorbed")
        conn.commit()
        conn.execute("VACUUM")
        empty = conn.execute("PRAGMA page_count").fetchone()[0] * page
    return {"events": events, "db_bytes": full,
            "bytes_per_event": round((full - empty) / events, 1) if events else None}


def pg_bytes(pg, database: str) -> tuple[int, int, int]:
    """(events, bytes of events + absorbed with their indexes and TOAST, WAL position)."""
    out = pg.psql("SELECT (SELECT COUNT(*) FROM events), pg_total_relation_size('events') "
                  "+ pg_total_relation_size('absorbed'), "
                  "pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::BIGINT", database)
    events, size, wal = out.strip().split("|")
    return int(events), int(size), int(wal)


def run_size(hosts: int, args, mode: str, pg, trial: int) -> dict:
    replicas = MODES[mode]
    with tempfile.TemporaryDirectory(prefix="lp-aggbench-") as tmp:
        workdir = Path(tmp)
        database = f"bench_{mode}_{hosts}_{trial}"
        dsn = pg.create_database(database) if replicas > 0 else ""
        aggs = ([FloorProc()] if replicas < 0 else
                [AggregatorProc(workdir, heartbeat_s=5, name=f"agg{i}", web=False, tcp=True,
                                metrics=True, postgresql_dsn=dsn)
                 for i in range(max(1, replicas))])
        procs: list[subprocess.Popen] = []
        try:
            for agg in aggs:
                agg.start()
            procs = start_load([a.address for a in aggs], hosts, args)
            connected = [read_line(p, "connecting") for p in procs]
            # The probe mesh of the whole fleet is planned once every host is
            # in (at 16,384 hosts: half a minute of a core in the planner's
            # process); the measured phase is the steady state after it.
            settle_from = time.monotonic()
            while replicas >= 0 and not mesh_settled([a.metrics_url for a in aggs]):
                if time.monotonic() - settle_from > PLAN_SETTLE_S:
                    log(f"mesh plan not settled after {PLAN_SETTLE_S:g} s: measuring anyway")
                    break
                time.sleep(1.0)
            plan_settle_s = time.monotonic() - settle_from
            before = [scrape(a.metrics_url) if a.metrics_url else {} for a in aggs]
            cpu0 = [tree_cpu_seconds(a.proc.pid) for a in aggs]
            db0 = tree_cpu_seconds(pg.pid) if replicas > 0 else 0.0
            wal0 = pg_bytes(pg, database)[2] if replicas > 0 else 0
            go_at = time.time() + GO_DELAY_S
            for p in procs:
                p.stdin.write(f"go {go_at}\n")
                p.stdin.flush()
            time.sleep(GO_DELAY_S + args.seconds)
            wall = args.seconds
            cpu = [tree_cpu_seconds(a.proc.pid) - c for a, c in zip(aggs, cpu0)]
            db_cpu = tree_cpu_seconds(pg.pid) - db0 if replicas > 0 else 0.0
            after = [scrape(a.metrics_url) if a.metrics_url else {} for a in aggs]
            rows = []
            for p in procs:
                out, err = p.communicate(timeout=args.seconds + 300)
                if p.returncode != 0:
                    raise RuntimeError(f"load process failed ({p.returncode}): {err.strip()[-2000:]}")
                rows.append(json.loads(out.strip().splitlines()[-1]))
            row = merge(rows, hosts, args)
            row.update({
                "mode": mode, "replicas": max(1, replicas), "trial": trial,
                "connect_s": max(c["connect_s"] for c in connected),
                "plan_settle_s": round(plan_settle_s, 1),
                "aggregator_cpu_pct": round(100 * sum(cpu) / wall, 1),
                # CPU per message read (every kind; the load's count of what it sent)
                "aggregator_us_per_message": round(1e6 * sum(cpu) / max(1, row["messages_sent"]), 1),
                "load_us_per_message": round(1e6 * row["load_measured_cpu_s"] / max(1, row["messages_sent"]), 1),
                "aggregator_cpu_pct_each": [round(100 * c / wall, 1) for c in cpu],
                "postgres_cpu_pct": round(100 * db_cpu / wall, 1),
                "aggregator_rss_mb": round(sum(rss_mb(a.proc.pid) for a in aggs), 1),
                "stages": stage_summary(before, after)})
            if replicas > 0:
                events, size, wal = pg_bytes(pg, database)
                row.update({"stored_events": events, "db_bytes": size,
                            "bytes_per_event": round(size / events, 1) if events else None,
                            "wal_bytes_per_event_measured": round((wal - wal0) / max(1, row["events_acked"]), 1)})
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for agg in aggs:
                code = agg.stop()
                if code not in (0, None, -15):
                    log(f"{agg.name} exited {code}; its log ends:\n{agg.log_tail(1500)}")
            if replicas > 0:
                with contextlib.suppress(Exception):
                    pg.drop_database(database)
        if replicas == 0:
            stored = sqlite_bytes_per_event(aggs[0].database)
            row.update({"stored_events": stored["events"], "db_bytes": stored["db_bytes"],
                        "bytes_per_event": stored["bytes_per_event"]})
    row["sustained"] = (row["connected"] == hosts and row["p99_s"] is not None
                        and row["p99_s"] <= TARGET_P99_S and row["events_unacked"] == 0)
    return row


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lat_ax, cpu_ax) = plt.subplots(1, 2, figsize=(13, 5))
    for mode, rows in result["sizes"].items():
        rows = sorted(rows, key=lambda r: r["hosts"])
        xs = [r["hosts"] for r in rows]
        line = lat_ax.plot(xs, [(r["p99_s"] or 0) * 1e3 for r in rows], marker="o", label=f"{mode} p99")
        lat_ax.plot(xs, [(r["p50_s"] or 0) * 1e3 for r in rows], marker=".", ls="--",
                    color=line[0].get_color(), label=f"{mode} p50")
        cpu_ax.plot(xs, [r["aggregator_cpu_pct"] for r in rows], marker="o",
                    color=line[0].get_color(), label=f"aggregator(s), {mode}")
        if MODES[mode] > 0:
            cpu_ax.plot(xs, [r["postgres_cpu_pct"] for r in rows], marker="s", ls="-.",
                        color=line[0].get_color(), label=f"PostgreSQL, {mode}")
        cpu_ax.plot(xs, [r["load_cpu_pct"] for r in rows], marker="x", ls=":",
                    color=line[0].get_color(), label=f"load processes, {mode}")
    lat_ax.axhline(TARGET_P99_S * 1e3, color="grey", ls=":", lw=0.8)
    lat_ax.set_yscale("log")
    lat_ax.set_ylabel("event -> stored (acked), ms")
    cpu_ax.set_ylabel(f"CPU during the measured phase, % of one core ({result['cpus']} cores)")
    for ax in (lat_ax, cpu_ax):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("simulated hosts")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"aggregator load ({result['label']}): heartbeat 5 s, incident: {result['burst']} events "
                 f"and a report from 25 % of hosts within 1 s")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def median_trial(trials: list[dict]) -> dict:
    ranked = sorted(trials, key=lambda r: (r["p99_s"] is None, r["p99_s"] or 0))
    return dict(ranked[(len(ranked) - 1) // 2], trials=[
        {k: r[k] for k in ("trial", "connected", "p50_s", "p99_s", "aggregator_cpu_pct",
                           "aggregator_us_per_message", "sustained")}
        for r in trials])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default=",".join(map(str, HOSTS)))
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--burst", type=int, default=20)
    parser.add_argument("--modes", default="floor,sqlite,pg1,pg3", help=f"comma-separated: {', '.join(MODES)}")
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--label", default="run")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        sizes = [int(x) for x in args.hosts.split(",") if x]
    except ValueError:
        parser.error(f"--hosts: comma-separated integers expected, got {args.hosts!r}")
    if bad := [n for n in sizes if not 1 <= n <= 65536]:
        parser.error(f"--hosts: 1..65536 expected, got {bad}")
    modes = [m for m in args.modes.split(",") if m]
    if bad := [m for m in modes if m not in MODES]:
        parser.error(f"--modes: unknown {bad}; known: {', '.join(MODES)}")
    if not 1 <= args.trials <= 9:
        parser.error(f"--trials: 1..9, got {args.trials}")
    if not 5 <= args.seconds <= 600:
        parser.error(f"--seconds: 5..600, got {args.seconds}")
    if not args.label.replace("-", "").replace("_", "").isalnum():
        parser.error(f"--label: letters, digits, - and _ only, got {args.label!r}")

    result = {"bench": "aggregator", "label": args.label, "seconds": args.seconds,
              "burst": args.burst, "cpus": os.cpu_count(), "load_average_start": os.getloadavg(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "sizes": {}}
    with contextlib.ExitStack() as stack:
        pg = None
        if any(MODES[m] > 0 for m in modes):
            from labs.pgcluster import private_postgres
            pg = stack.enter_context(private_postgres())
        for mode in modes:
            for hosts in sizes:
                trials = []
                for trial in range(args.trials):
                    log(f"{mode}: {hosts} hosts for {args.seconds:g} s (trial {trial + 1}/{args.trials})")
                    row = run_size(hosts, args, mode, pg, trial)
                    trials.append(row)
                    log(f"{mode} {hosts:>6} hosts: connected {row['connected']} in {row['connect_s']} s, "
                        f"p50 {(row['p50_s'] or 0) * 1e3:.0f} ms, p99 {(row['p99_s'] or 0) * 1e3:.0f} ms, "
                        f"aggregator {row['aggregator_cpu_pct']} % CPU "
                        f"({row['aggregator_us_per_message']} us/message), postgres {row['postgres_cpu_pct']} %, "
                        f"load {row['load_cpu_pct']} %, errors {row['errors']}, sustained {row['sustained']}")
                result["sizes"].setdefault(mode, []).append(median_trial(trials))
    result["load_average_end"] = os.getloadavg()
    for mode, rows in result["sizes"].items():
        ok = [r["hosts"] for r in rows if r["sustained"]]
        result.setdefault("summary", {})[mode] = {
            "largest_sustained": max(ok, default=0),
            "bytes_per_event": [r.get("bytes_per_event") for r in rows],
            "target_hosts": TARGET_HOSTS, "target_p99_s": TARGET_P99_S,
            "target_met": TARGET_HOSTS in ok}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"aggregator-{args.label}.json"
    out.write_text(json.dumps(result, indent=2))
    plot(result, out.with_suffix(".png"))
    print(json.dumps(result.get("summary", {}), indent=2))
    print(f"results: {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
