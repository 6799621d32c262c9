"""10,000 events from several agents, the aggregator SIGKILLed mid-stream and
restarted: every event is stored exactly once, in order per host.

Real pieces on both sides: the agents are linkpassd's own agent (its on-disk
spool and its gRPC client, as the daemon runs them: tests/system/agentfleet.py),
the aggregator is the `linkpass-aggregator` program on a SQLite file, reached
over a Unix socket.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from labs.aggproc import AggregatorProc
from tests.system.agentfleet import Agent, AgentFleet

AGENTS = 4
EVENTS_PER_AGENT = 2_500
KILL_AFTER_STORED = 3_000  # SIGKILL once the aggregator holds about this many
DEADLINE_S = 180.0  # everything stored; generous for a busy 2-core machine


class Aggregator(AggregatorProc):
    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir, web=False)

    def stored(self) -> int:
        """Events in the database, read beside the running aggregator (WAL)."""
        try:
            with sqlite3.connect(f"file:{self.database}?mode=ro", uri=True, timeout=5) as db:
                return db.execute("SELECT count(*) FROM events").fetchone()[0]
        except sqlite3.Error:
            return 0


async def run_fleet(agg: Aggregator, agents: list[Agent]) -> None:
    killed = False

    async def kill_and_restart_once() -> None:
        nonlocal killed
        if not killed and await asyncio.to_thread(agg.stored) >= KILL_AFTER_STORED:
            agg.kill()  # mid-stream: batches in flight, some stored and not acked
            killed = True
            await asyncio.sleep(0.5)  # the agents find it gone and keep spooling
            await asyncio.to_thread(agg.start)

    async with AgentFleet(agents) as fleet:
        await fleet.burst(EVENTS_PER_AGENT, between=kill_and_restart_once)
        assert killed, "the aggregator was never killed: the stream ended before the threshold"
        await fleet.wait_acked(EVENTS_PER_AGENT, DEADLINE_S)


def test_every_event_is_stored_exactly_once_in_order_across_a_sigkill(tmp_path):
    agg = Aggregator(tmp_path)
    agg.start()
    agents = [Agent(tmp_path, f"lp-host-{i}", [agg.address], seed=i) for i in range(AGENTS)]
    try:
        asyncio.run(run_fleet(agg, agents))
    finally:
        agg.stop()
    with sqlite3.connect(agg.database) as db:
        for agent in agents:
            seqs = [row[0] for row in db.execute(
                "SELECT seq FROM events WHERE host_id = ? AND boot_id = ? ORDER BY id",
                (agent.name, agent.boot))]
            assert seqs == list(range(1, EVENTS_PER_AGENT + 1)), \
                f"{agent.name}: {len(seqs)} stored, out of order, duplicated or with a gap"
        total = db.execute("SELECT count(*) FROM events").fetchone()[0]
    assert total == AGENTS * EVENTS_PER_AGENT
