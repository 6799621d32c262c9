"""Three linkpass-aggregator replicas on one PostgreSQL (issue 14).

- The replica holding most agents is SIGKILLed during a 10,000-event burst:
  every agent moves to a surviving replica and every event is stored exactly
  once, in order per host.
- A drain asked of one replica reaches a host on another's stream; a follow
  stream on one replica sees events stored through another; one probe mesh
  is planned for hosts spread over the replicas.
- A leaf's fence cap counts the hosts of every replica: three hosts on one
  leaf, on two replicas, ask at once and one is granted.

Real pieces throughout: the `linkpass-aggregator` program (three processes),
a private PostgreSQL started for this module in a temporary directory, and
linkpassd's own agents (tests/system/agentfleet.py).
"""

from __future__ import annotations

import asyncio
import collections
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from labs.aggproc import AggregatorProc
from labs.pgcluster import find_bindir, private_postgres
from linkpassd._proto.linkpass.v1 import fleet_pb2, fleet_pb2_grpc
from tests.system.agentfleet import Agent, AgentFleet, Host

REPLICAS = 3
AGENTS = 8
EVENTS_PER_AGENT = 1_250  # 10,000 in all
KILL_AFTER_STORED = 3_000
DEADLINE_S = 180.0  # generous for a busy 2-core machine


def _have_postgres() -> bool:
    try:
        find_bindir()
    except Exception:  # noqa: BLE001 - any reason: no PostgreSQL here
        return False
    return True


pytestmark = pytest.mark.skipif(not _have_postgres(), reason="PostgreSQL binaries not installed "
                                "(make bootstrap installs Debian's postgresql)")


@pytest.fixture(scope="module")
def postgres():
    with private_postgres() as pg:
        yield pg


def sql_rows(pg, dsn_db: str, sql: str) -> list[list[str]]:
    out = pg.psql(sql, database=dsn_db)
    return [line.split("|") for line in out.splitlines() if line]


def replicas_started(tmp_path: Path, dsn: str, count: int) -> list[AggregatorProc]:
    procs = []
    try:
        for i in range(count):
            procs.append(AggregatorProc(tmp_path, name=f"agg{i}", web=False, postgresql_dsn=dsn,
                                        heartbeat_s=1.0).start())
    except BaseException:
        for proc in procs:
            proc.stop()
        raise
    return procs


def where_hosts_are(pg, db: str, procs: list[AggregatorProc]) -> dict[str, int]:
    """host_id -> index of the replica process holding it (by the pid in its replica id)."""
    by_pid = {str(p.proc.pid): i for i, p in enumerate(procs) if p.proc is not None}
    out = {}
    for host, replica in sql_rows(pg, db, "SELECT host_id, replica FROM hosts WHERE replica <> ''"):
        parts = replica.split("/")
        if len(parts) >= 2 and parts[1] in by_pid:
            out[host] = by_pid[parts[1]]
    return out


def test_sigkill_of_the_busiest_replica_loses_and_duplicates_nothing(postgres, tmp_path):
    db = "replicas_kill"
    dsn = postgres.create_database(db)
    procs = replicas_started(tmp_path, dsn, REPLICAS)
    addresses = [p.address for p in procs]
    # Each agent lists every replica, starting from a different one, so the
    # agents spread over the three (3, 3, 2).
    agents = [Agent(tmp_path, f"lp-host-{i}", addresses[i % REPLICAS:] + addresses[:i % REPLICAS], seed=i)
              for i in range(AGENTS)]
    killed: list[int] = []

    async def kill_busiest_once() -> None:
        if killed:
            return
        stored = int(sql_rows(postgres, db, "SELECT count(*) FROM events")[0][0])
        if stored < KILL_AFTER_STORED:
            return
        where = await asyncio.to_thread(where_hosts_are, postgres, db, procs)
        busiest, held = collections.Counter(where.values()).most_common(1)[0]
        assert held >= 2, f"agents not spread as expected: {where}"
        procs[busiest].kill()  # mid-stream: batches in flight, some stored and not acked
        killed.append(busiest)

    async def scenario() -> None:
        async with AgentFleet(agents) as fleet:
            await fleet.burst(EVENTS_PER_AGENT, between=kill_busiest_once)
            assert killed, "no replica was killed: the burst ended before the threshold"
            await fleet.wait_acked(EVENTS_PER_AGENT, DEADLINE_S)
            # every agent is on a surviving replica
            deadline = time.monotonic() + DEADLINE_S
            while True:
                where = await asyncio.to_thread(where_hosts_are, postgres, db, procs)
                if len(where) == AGENTS and killed[0] not in where.values():
                    break
                assert time.monotonic() < deadline, f"not every agent reconnected: {where}"
                await asyncio.sleep(0.2)

    try:
        asyncio.run(scenario())
    finally:
        for proc in procs:
            proc.stop()
    for agent in agents:
        seqs = [int(r[0]) for r in sql_rows(
            postgres, db, f"SELECT seq FROM events WHERE host_id = '{agent.name}' "
                          f"AND boot_id = '{agent.boot}' ORDER BY id")]
        assert seqs == list(range(1, EVENTS_PER_AGENT + 1)), \
            f"{agent.name}: {len(seqs)} stored, out of order, duplicated or with a gap"
    assert int(sql_rows(postgres, db, "SELECT count(*) FROM events")[0][0]) == AGENTS * EVENTS_PER_AGENT


def test_drain_follow_and_mesh_cross_replicas(postgres, tmp_path):
    db = "replicas_cross"
    dsn = postgres.create_database(db)
    procs = replicas_started(tmp_path, dsn, 2)
    # host a on replica 0 only, host b on replica 1 only; same rail, different leaves
    a = Agent(tmp_path, "lp-host-a", [procs[0].address], seed=1,
              host=Host("lp-host-a", address="198.18.0.1/24", leaf="leaf-a"))
    b = Agent(tmp_path, "lp-host-b", [procs[1].address], seed=2,
              host=Host("lp-host-b", address="198.18.0.2/24", leaf="leaf-b"))

    async def scenario() -> None:
        async with AgentFleet([a, b]):
            deadline = time.monotonic() + DEADLINE_S
            while len(await asyncio.to_thread(where_hosts_are, postgres, db, procs)) < 2:
                assert time.monotonic() < deadline, "hosts never connected"
                await asyncio.sleep(0.1)
            # one plan for both: each probes the other across the two leaves
            while not (a.host.peers and b.host.peers and
                       list(a.host.peers[-1].rails[0].peers) == ["198.18.0.2"] and
                       list(b.host.peers[-1].rails[0].peers) == ["198.18.0.1"]):
                assert time.monotonic() < deadline, (a.host.peers[-1:], b.host.peers[-1:])
                await asyncio.sleep(0.1)
            # a follow stream on replica 0 sees b's events, stored through replica 1
            b.offer(1)
            while b.acked < 1:
                assert time.monotonic() < deadline, "b's first event never acked"
                await asyncio.sleep(0.05)
            async with grpc.aio.insecure_channel(procs[0].address) as channel:
                stub = fleet_pb2_grpc.FleetServiceStub(channel)
                listed = await stub.ListFleetEvents(fleet_pb2.ListFleetEventsRequest(limit=1000), timeout=30)
                cursor = max(e.id for e in listed.events)
                follow = stub.WatchFleetEvents(fleet_pb2.WatchFleetEventsRequest(after_id=cursor))
                b.offer(3)
                async with asyncio.timeout(60):
                    got = [await follow.read() for _ in range(3)]
                follow.cancel()
            assert [(r.event.host_id, r.event.event.seq) for r in got] == \
                [("lp-host-b", 2), ("lp-host-b", 3), ("lp-host-b", 4)], got
            # a drain asked of replica 0 for host b (on replica 1)
            done = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "linkpassd.ctl.main", "fleet", "--aggregator",
                                 procs[0].address, "--insecure", "drain", "lp-host-b", "eth0",
                                 "--reason", "cross-replica test"],
                capture_output=True, text=True, timeout=90)
            assert done.returncode == 0, done.stdout + done.stderr
            assert [c.WhichOneof("action") for c in b.host.commands] == ["drain"], b.host.commands
            assert b.host.commands[0].drain.port == "eth0"
            assert a.host.commands == []

    try:
        asyncio.run(scenario())
    finally:
        for proc in procs:
            proc.stop()


def test_a_leaf_fence_cap_counts_the_hosts_of_every_replica(postgres, tmp_path):
    """[fence] leaf_cap = 1 (the default): hosts 0 and 2 on replica 0, host 1
    on replica 1, all with eth0 on leaf-a. All three ask to fence at once
    (the leaf failed): one grant in the fleet, not one per replica. When the
    granted host's fence ends, the slot passes to one of the others."""
    db = "replicas_fence"
    dsn = postgres.create_database(db)
    procs = replicas_started(tmp_path, dsn, 2)
    agents = [Agent(tmp_path, f"lp-host-{i}", [procs[i % 2].address], seed=i,
                    host=Host(f"lp-host-{i}", address=f"198.18.0.{i + 1}/24", leaf="leaf-a"))
              for i in range(3)]

    def granted() -> list[str]:
        return sorted(a.name for a in agents if a.host.fence and a.host.fence[-1] == ["eth0"])

    def stored() -> tuple[int, int]:
        row = sql_rows(postgres, db, "SELECT count(*), count(*) FILTER (WHERE granted) FROM fence_ports")[0]
        return int(row[0]), int(row[1])

    async def until(what: str, predicate) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not await predicate():
            assert time.monotonic() < deadline, f"still waiting for {what}: granted {granted()}, " \
                f"stored {await asyncio.to_thread(stored)}"
            await asyncio.sleep(0.1)

    async def scenario() -> None:
        async with AgentFleet(agents):
            async def connected() -> bool:
                return len(await asyncio.to_thread(where_hosts_are, postgres, db, procs)) == 3
            await until("every host connected", connected)
            for agent in agents:
                agent.host.phase = "FENCE_ASKING"
                agent.client.poke()

            async def one_of_three() -> bool:
                return await asyncio.to_thread(stored) == (3, 1) and len(granted()) == 1
            await until("three asks stored and one granted", one_of_three)
            first = granted()[0]
            others = [a for a in agents if a.name != first]
            assert all(a.host.fence and a.host.fence[-1] == [] for a in others), [a.host.fence for a in others]
            holder = next(a for a in agents if a.name == first)
            holder.host.phase = ""  # its fence ended (the port tested good)
            holder.client.poke()

            async def passed_on() -> bool:
                return await asyncio.to_thread(stored) == (2, 1) and len(granted()) == 1 \
                    and granted()[0] != first
            await until("the slot passed on", passed_on)
            assert holder.host.fence[-1] == []

    try:
        asyncio.run(scenario())
    finally:
        for proc in procs:
            proc.stop()
