"""Many writers, many followers, writers SIGKILLed mid-commit: every
follower sees every committed event exactly once, all in one order, none
skipped (issue 29: event ids without a cluster-wide lock).

Writers are processes (tests/system/pgwriter.py), each a replica's PgStore
with its group commit, storing batches for its hosts as fast as they are
acked; at seeded random moments one is SIGKILLed (most often in the middle
of a transaction or its COMMIT: they do nothing else) and started again,
resending what its log does not show acked. Followers are PgStores in this
process reading `after_id` pages of random sizes from their own cursors, as
fleet follow streams do. At the end, from the database itself: each host's
seqs are 1..n, once each (exactly once across the kills), every acked seq
is there (durable), and every follower's sequence of events equals the
database's events in id order (nothing skipped, nothing repeated, one order
for all).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from linkpassd.aggregator.pg_store import PgStore
from linkpassd.aggregator.store import EventQuery
from tests.system.pgwriter import last_acked

REPO = Path(__file__).resolve().parents[2]
SEED = 29
WRITERS = 4
HOSTS_PER_WRITER = 6
LOAD_S = 25.0  # writers are killed and restarted during this, then run out their last incarnation
KILLS = 12
FOLLOWERS = 3
CATCH_UP_S = 60.0  # followers reach the final count within this after the writers stop


def spawn(dsn: str, name: str, seconds: float, seed: int, acklog: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return subprocess.Popen([sys.executable, "-m", "tests.system.pgwriter", dsn, name, str(HOSTS_PER_WRITER),
                             str(seconds), str(seed), str(acklog)], cwd=REPO, env=env)


def test_followers_see_every_committed_event_once_in_one_order_across_writer_sigkills(pg_databases, tmp_path):
    dsn = pg_databases()
    rng = random.Random(SEED)
    end = time.monotonic() + LOAD_S
    logs = {f"w{n}": tmp_path / f"w{n}.acks" for n in range(WRITERS)}
    procs = {name: spawn(dsn, name, LOAD_S, rng.randrange(1 << 30), log) for name, log in logs.items()}
    kills = 0

    async def scenario() -> tuple[list[list[tuple]], list[tuple]]:
        nonlocal kills
        readers = [PgStore(dsn) for _ in range(FOLLOWERS)]
        for reader in readers:
            await reader.open()
        seen: list[list[tuple]] = [[] for _ in readers]
        done = asyncio.Event()

        async def follow(reader: PgStore, out: list[tuple], seed: int) -> None:
            frng = random.Random(seed)
            cursor = 0
            while not done.is_set():
                page = await reader.events(EventQuery(after_id=cursor, limit=frng.randint(1, 300)))
                for e in page:
                    assert e.id > cursor, f"id {e.id} after cursor {cursor}"
                    out.append((e.id, e.host_id, e.seq))
                    cursor = e.id
                if not page:
                    await asyncio.sleep(0.005)

        tasks = [asyncio.create_task(follow(r, out, n)) for n, (r, out) in enumerate(zip(readers, seen))]
        try:
            while kills < KILLS and time.monotonic() < end - 3.0:
                await asyncio.sleep(rng.uniform(0.3, 1.5))
                name = rng.choice(sorted(procs))
                procs[name].send_signal(signal.SIGKILL)  # mid-commit: they do nothing else
                await asyncio.to_thread(procs[name].wait)
                kills += 1
                procs[name] = spawn(dsn, name, max(1.0, end - time.monotonic()), rng.randrange(1 << 30),
                                    logs[name])
            for name, proc in procs.items():
                code = await asyncio.to_thread(proc.wait, LOAD_S + 60.0)
                assert code == 0, f"writer {name} exited {code}"
            final = await readers[0]._fetch("reading every event", "SELECT id, host_id, seq FROM events ORDER BY id")
            final = [tuple(r) for r in final]
            deadline = time.monotonic() + CATCH_UP_S
            while any(len(out) < len(final) for out in seen):
                assert time.monotonic() < deadline, \
                    f"followers at {[len(o) for o in seen]} of {len(final)} events after {CATCH_UP_S:g} s"
                await asyncio.sleep(0.05)
                for task in tasks:
                    if task.done():
                        task.result()  # a follower's assertion, raised here
        finally:
            done.set()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for reader in readers:
                await reader.close()
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return seen, final

    try:
        seen, final = asyncio.run(asyncio.wait_for(scenario(), LOAD_S + 180.0))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert kills == KILLS, f"only {kills} of {KILLS} kills happened"
    per_host: dict[str, list[int]] = {}
    for _id, host, seq in final:
        per_host.setdefault(host, []).append(seq)
    assert len(per_host) == WRITERS * HOSTS_PER_WRITER
    for host, seqs in per_host.items():
        assert sorted(seqs) == list(range(1, len(seqs) + 1)), f"{host}: a seq stored twice or missing"
    for log in logs.values():
        for host, seq in last_acked(log).items():
            assert len(per_host[host]) >= seq, f"{host}: acked {seq}, only {len(per_host[host])} stored"
    for n, out in enumerate(seen):
        assert out == final, f"follower {n}: {len(out)} events, not the database's {len(final)} in id order"
