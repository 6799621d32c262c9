"""The PostgreSQL store alone: durable events per second from 1..8 writers.

    python -m labs.bench.pg_store [--writers 1,2,4,8] [--seconds 8]
        [--stores old,new] [--hosts 64] [--batch 5] [--label run]

No gRPC, no aggregator: each writer is a process holding one PgStore, as a
replica does, with HOSTS concurrent callers (one per simulated host) each
storing a batch of BATCH events with `add_events` and, once it is acked
(durable), the next; so the store's group commit gathers them as it does
behind the aggregator's streams. `old` is the store with schema 1's event
path (PgStore(event_lock=True): one cluster-wide advisory lock taken by every
event transaction, statements per call, NOTIFY inside the transaction);
`new` is the default path (no lock, one statement per group, ids from the
transaction's xid8). The old path's per-call statements are the new shape
(two round trips per call, where schema 1 had three), so its figures are if
anything better than schema 1's were. Both run in the same invocation on one private
PostgreSQL (labs/pgcluster.py; fsync and synchronous_commit on), a fresh
database per cell, writers started at one moment and stopped after SECONDS.

Measured per (store, writers): events acked durable per second over the
window, calls and group commits, the callers' ack latency (p50, p99),
PostgreSQL's CPU (all its processes, exited backends included) and the
writers' CPU, each also per stored event (this machine has 2 cores: the
writers' share is taken from PostgreSQL's), and the waits
PostgreSQL reports, sampled every SAMPLE_S: each active backend of the
database by (wait_event_type, wait_event) from pg_stat_activity ("CPU" when
it waits on nothing), and the lock requests not granted in pg_locks by
lock type (advisory = the old event lock).

Writes labs/bench/results/pg_store-<label>.json and .png; stops by itself
(every writer has a deadline; the whole run is bounded). Run it under the lab
lock: flock -w 900 /tmp/linkpass-lab.lock python -m labs.bench.pg_store
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
SAMPLE_S = 0.05
START_DELAY_S = 2.0  # writers start this long after they were spawned (time to connect)
WRITER_GRACE_S = 30.0  # a writer not done this long after its window is killed (and the cell fails)
STORES = ("old", "new")


def log(msg: str) -> None:
    print(f"[pg_store-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- a writer process ---------------------------------------------------------------


async def writer(dsn: str, store_kind: str, name: str, hosts: int, batch: int, start_at: float,
                 seconds: float) -> dict:
    from linkpassd.aggregator.pg_store import PgStore
    from linkpassd.aggregator.store import EventRow

    store = PgStore(dsn, event_lock=store_kind == "old")
    await store.open()
    latencies: list[float] = []
    stored = calls = 0
    try:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        cpu0 = time.process_time()
        began = time.monotonic()
        stop = began + seconds

        async def host(i: int) -> None:
            nonlocal stored, calls
            seq = 0
            host_id = f"{name}-h{i:04d}"
            while time.monotonic() < stop:
                rows = [EventRow(seq=s, wall=time.time(), kind="verdict", severity="info", port=f"eth{s % 8}",
                                 rail=f"rail{s % 8}", body=b"x" * 64) for s in range(seq + 1, seq + batch + 1)]
                t0 = time.monotonic()
                result = await store.add_events(host_id, "boot", rows, None, time.time())
                if time.monotonic() <= stop:  # acked inside the window
                    latencies.append(time.monotonic() - t0)
                    stored += result.stored
                    calls += 1
                seq += batch

        await asyncio.gather(*(host(i) for i in range(hosts)))
        cpu = time.process_time() - cpu0
    finally:
        await store.close()
    latencies.sort()
    return {"writer": name, "stored": stored, "calls": calls, "group_commits": store.group_commits,
            "seconds": seconds, "cpu_s": round(cpu, 3),
            "p50_ms": round(latencies[len(latencies) // 2] * 1e3, 2) if latencies else None,
            "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1e3, 2) if latencies else None}


# -- the bench --------------------------------------------------------------------


async def sample_waits(dsn: str, database: str, until: float) -> dict:
    """pg_stat_activity wait events and ungranted pg_locks, every SAMPLE_S."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    waits: collections.Counter[str] = collections.Counter()
    locks: collections.Counter[str] = collections.Counter()
    samples = 0
    try:
        while time.time() < until:
            rows = await conn.fetch(
                "SELECT COALESCE(wait_event_type, 'CPU'), COALESCE(wait_event, 'CPU'), count(*) "
                "FROM pg_stat_activity WHERE datname = $1 AND state = 'active' AND pid <> pg_backend_pid() "
                "GROUP BY 1, 2", database)
            for kind, event, n in rows:
                waits[f"{kind}:{event}"] += n
            for locktype, n in await conn.fetch(
                    "SELECT locktype, count(*) FROM pg_locks WHERE NOT granted GROUP BY 1"):
                locks[locktype] += n
            samples += 1
            await asyncio.sleep(SAMPLE_S)
    finally:
        await conn.close()
    return {"samples": samples, "wait_events": dict(waits.most_common()), "ungranted_locks": dict(locks)}


def postgres_cpu_seconds(pid: int) -> float:
    """CPU of the postmaster, its live backends, and every backend that has
    exited (the postmaster reaps them: its cutime and cstime), so a backend
    ending during the window is neither lost nor subtracted."""
    from labs.bench.aggregator import tree_cpu_seconds

    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return tree_cpu_seconds(pid) + (int(rest[13]) + int(rest[14])) / os.sysconf("SC_CLK_TCK")


def run_cell(pg, store_kind: str, writers: int, args) -> dict:
    database = f"bench_{store_kind}_{writers}_{int(time.time() * 1000) % 10**8}"
    dsn = pg.create_database(database)
    try:
        start_at = time.time() + START_DELAY_S
        procs = [subprocess.Popen(
            [sys.executable, "-m", "labs.bench.pg_store", "--writer", dsn, "--stores", store_kind,
             "--name", f"w{n}", "--hosts", str(args.hosts), "--batch", str(args.batch),
             "--start-at", repr(start_at), "--seconds", str(args.seconds)],
            stdout=subprocess.PIPE, text=True) for n in range(writers)]
        try:
            # let the first writer migrate the fresh database before sampling
            time.sleep(max(0.0, start_at - time.time()))
            pg_cpu0 = postgres_cpu_seconds(pg.pid)
            waits = asyncio.run(sample_waits(dsn, database, start_at + args.seconds))
            pg_cpu = postgres_cpu_seconds(pg.pid) - pg_cpu0
            outs = []
            for proc in procs:
                out, _ = proc.communicate(timeout=args.seconds + WRITER_GRACE_S)
                if proc.returncode != 0:
                    raise RuntimeError(f"writer exited {proc.returncode}")
                outs.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    finally:
        with contextlib.suppress(Exception):
            pg.drop_database(database)
    stored = sum(o["stored"] for o in outs)
    return {"store": store_kind, "writers": writers, "hosts_per_writer": args.hosts, "batch": args.batch,
            "seconds": args.seconds, "events_per_s": round(stored / args.seconds, 1),
            "calls_per_s": round(sum(o["calls"] for o in outs) / args.seconds, 1),
            "group_commits_per_s": round(sum(o["group_commits"] for o in outs) / args.seconds, 1),
            "p50_ms": statistics.median([o["p50_ms"] for o in outs if o["p50_ms"] is not None] or [0]),
            "p99_ms": max([o["p99_ms"] for o in outs if o["p99_ms"] is not None] or [0]),
            "postgres_cpu_pct": round(100 * pg_cpu / args.seconds, 1),
            "postgres_cpu_us_per_event": round(1e6 * pg_cpu / stored, 1) if stored else None,
            "writers_cpu_us_per_event": round(1e6 * sum(o["cpu_s"] for o in outs) / stored, 1) if stored else None,
            "writers_cpu_pct": round(100 * sum(o["cpu_s"] for o in outs) / args.seconds, 1),
            "waits": waits, "per_writer": outs}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = result["cells"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    for kind in result["stores"]:
        rows = [c for c in cells if c["store"] == kind]
        ax1.plot([c["writers"] for c in rows], [c["events_per_s"] for c in rows], marker="o",
                 label=f"{kind} store")
    writers = sorted({c["writers"] for c in cells})
    ax1.set_xlabel("concurrent writers (replica stores)")
    ax1.set_ylabel("durable events / s")
    ax1.set_xscale("log", base=2)
    ax1.set_xticks(writers, [str(w) for w in writers])
    ax1.set_ylim(bottom=0)
    ax1.set_title(f"PgStore.add_events ({result['cpus']} cores shared with the writers)")
    ax1.grid(alpha=0.3)
    cpu = ax1.twinx()  # PostgreSQL's CPU: where the new store's curve should flatten
    for kind in result["stores"]:
        rows = [c for c in cells if c["store"] == kind]
        cpu.plot([c["writers"] for c in rows], [c["postgres_cpu_pct"] / 100 for c in rows], linestyle="--",
                 marker=".", alpha=0.6, label=f"{kind}: PostgreSQL CPU (cores)")
    cpu.set_ylabel("PostgreSQL CPU, cores (dashed)")
    cpu.set_ylim(0, result["cpus"])
    lines = ax1.get_legend_handles_labels()
    more = cpu.get_legend_handles_labels()
    ax1.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="center right")
    # share of sampled active backends per wait event, top ones
    top: collections.Counter[str] = collections.Counter()
    for c in cells:
        for k, n in c["waits"]["wait_events"].items():
            top[k] += n
    names = [k for k, _ in top.most_common(6)]
    labels = [f"{c['store']} {c['writers']}w" for c in cells]
    bottom = [0.0] * len(cells)
    for name in names:
        share = []
        for c in cells:
            total = sum(c["waits"]["wait_events"].values()) or 1
            share.append(100 * c["waits"]["wait_events"].get(name, 0) / total)
        ax2.bar(labels, share, bottom=bottom, label=name)
        bottom = [b + s for b, s in zip(bottom, share)]
    ax2.set_ylabel("% of sampled active backends")
    ax2.set_title("what PostgreSQL's backends wait on (pg_stat_activity)")
    ax2.tick_params(axis="x", rotation=45)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--writers", default="1,2,4,8")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--hosts", type=int, default=64, help="concurrent callers per writer")
    parser.add_argument("--batch", type=int, default=5, help="events per add_events call")
    parser.add_argument("--label", default="run")
    parser.add_argument("--writer", help=argparse.SUPPRESS)  # a writer process: its DSN
    parser.add_argument("--name", default="w0", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 1 <= args.seconds <= 120:
        parser.error(f"--seconds: 1..120, got {args.seconds}")
    if not 1 <= args.hosts <= 1024 or not 1 <= args.batch <= 1000:
        parser.error(f"--hosts 1..1024 and --batch 1..1000, got {args.hosts} and {args.batch}")
    if args.writer:
        print(json.dumps(asyncio.run(writer(args.writer, args.stores, args.name, args.hosts, args.batch,
                                            args.start_at, args.seconds))))
        return 0
    try:
        writers = [int(w) for w in args.writers.split(",")]
    except ValueError:
        parser.error(f"--writers: numbers separated by commas, got {args.writers!r}")
    if not all(1 <= w <= 32 for w in writers):
        parser.error(f"--writers: each 1..32, got {args.writers!r}")
    stores = [s for s in args.stores.split(",") if s]
    if not stores or any(s not in STORES for s in stores):
        parser.error(f"--stores: some of {','.join(STORES)}, got {args.stores!r}")
    if not args.label.replace("-", "").replace("_", "").isalnum():
        parser.error(f"--label: letters, digits, - and _ only, got {args.label!r}")

    from labs.pgcluster import private_postgres

    result = {"bench": "pg_store", "label": args.label, "cpus": os.cpu_count(), "stores": stores,
              "seconds": args.seconds, "hosts_per_writer": args.hosts, "batch": args.batch,
              "load_average_start": os.getloadavg(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "cells": []}
    with private_postgres() as pg:
        result["postgres"] = pg.psql("SHOW server_version").strip()
        for n in writers:  # old and new side by side at each writer count
            for kind in stores:
                cell = run_cell(pg, kind, n, args)
                result["cells"].append(cell)
                adv = cell["waits"]["ungranted_locks"].get("advisory", 0)
                log(f"{kind} store, {n} writers: {cell['events_per_s']:.0f} events/s, "
                    f"{cell['group_commits_per_s']:.0f} commits/s, p99 {cell['p99_ms']} ms, "
                    f"postgres {cell['postgres_cpu_pct']} % CPU ({cell['postgres_cpu_us_per_event']} us/event), "
                    f"writers {cell['writers_cpu_pct']} %, "
                    f"advisory-lock waits sampled {adv}; top waits "
                    f"{list(cell['waits']['wait_events'].items())[:3]}")
    result["load_average_end"] = os.getloadavg()
    result["cells"].sort(key=lambda c: (stores.index(c["store"]), c["writers"]))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"pg_store-{args.label}.json"
    out.write_text(json.dumps(result, indent=2))
    plot(result, out.with_suffix(".png"))
    print(f"results: {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
