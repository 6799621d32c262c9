"""One writer process of test_agg_pg_followers.py: a replica's PgStore.

    python -m tests.system.pgwriter DSN NAME HOSTS SECONDS SEED ACKLOG

HOSTS concurrent callers (hosts NAME-h<i>, one boot each) store batches of
1..8 events with `add_events`, each batch after the last was acked, for
SECONDS. After every ack the host's last acked seq is appended to ACKLOG
(flushed); a new incarnation of the same NAME resumes every host from the
seq after the last one logged, as an agent resends from its spool what was
not acked, so a batch committed by a killed incarnation whose ack never
reached the log is sent again (exactly once must hold). Killed with SIGKILL
by the test at random moments, mid-commit as often as not.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path

from linkpassd.aggregator.pg_store import PgStore
from linkpassd.aggregator.store import EventRow


def last_acked(path: Path) -> dict[str, int]:
    acked: dict[str, int] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:  # a line cut short by SIGKILL is left out: its batch is resent
                acked[parts[0]] = max(acked.get(parts[0], 0), int(parts[1]))
    return acked


async def main(dsn: str, name: str, hosts: int, seconds: float, seed: int, acklog: Path) -> None:
    rng = random.Random(seed)
    acked = last_acked(acklog)
    store = PgStore(dsn)
    await store.open()
    stop = time.monotonic() + seconds
    with acklog.open("a") as log:
        async def host(host_id: str) -> None:
            seq = acked.get(host_id, 0)
            while time.monotonic() < stop:
                n = rng.randint(1, 8)
                rows = [EventRow(seq=s, wall=1.8e9 + s, kind="verdict", severity="info", port="eth0",
                                 rail="rail0", body=f"{host_id}/{s}".encode()) for s in range(seq + 1, seq + n + 1)]
                await store.add_events(host_id, "boot", rows, None, time.time())
                seq += n
                log.write(f"{host_id} {seq}\n")
                log.flush()

        try:
            await asyncio.gather(*(host(f"{name}-h{i:02d}") for i in range(hosts)))
        finally:
            await store.close()


if __name__ == "__main__":
    dsn, name, hosts, seconds, seed, acklog = sys.argv[1:7]
    asyncio.run(main(dsn, name, int(hosts), float(seconds), int(seed), Path(acklog)))
