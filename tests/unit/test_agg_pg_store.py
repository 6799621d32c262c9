"""aggregator.pg_store on a private PostgreSQL (tests/conftest.py, labs/pgcluster.py).

The store's own behaviours are test_agg_store.py's scenarios, imported here
and run against PgStore (this module's `open_store` and `store_module`
fixtures take the place of the SQLite ones): the same calls give the same
results. Then what only PostgreSQL does: migrations by several replicas at
once, a writer killed mid-stream, and the SharedStore methods with two
PgStore instances on one database standing for two replicas: where hosts
are, commands handed out once, leadership, the probe mesh, notifications
(including a lost LISTEN connection), and event ids that follow commit order
so that a reader following after_id never skips an event.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import selectors
import signal
import subprocess
import sys
import time
from contextlib import asynccontextmanager

import asyncpg
import pytest

from linkpassd.aggregator import pg_schema, pg_store
from linkpassd.aggregator.fencing import grants
from linkpassd.aggregator.pg_store import PgStore
from linkpassd.aggregator.store import (
    CHANNEL_EVENTS,
    CHANNEL_HOSTS,
    EventQuery,
    FencePort,
    StoreError,
    is_shared,
)
from test_agg_store import (  # noqa: F401 - collected here, against PgStore
    DAY0,
    DEADLINE_S,
    REPO,
    fact_row,
    held,
    rows,
    run,
    test_a_failover_counts_as_absorbed_only_with_its_address_moved,
    test_a_restart_keeps_hosts_events_and_what_was_acked,
    test_any_interleaving_of_resent_batches_stores_each_event_once,
    test_concurrent_batches_from_eight_hosts_are_all_stored,
    test_concurrent_writes_share_commits_and_one_failing_call_spoils_only_itself,
    test_day_totals_are_per_utc_day_in_a_half_open_range,
    test_declared_gaps_and_holes_count_as_lost_once,
    test_events_are_found_by_host_port_kind_time_and_cursor_with_a_limit,
    test_heartbeats_of_many_hosts_are_stored_in_one_call_and_never_move_back,
    test_hosts_rows_report_boot_version_times_state_and_lost,
    test_out_of_order_batches_are_refused_naming_the_seqs_and_nothing_is_stored,
    test_resends_and_overlapping_batches_store_each_event_once,
    test_retention_prunes_old_events_in_chunks_and_keeps_the_savings,
)

WAIT_S = 30.0  # a bounded wait for a state (a notification, a reconnection)


@asynccontextmanager
async def opened(dsn: str):
    store = PgStore(dsn)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
def store_module():
    return pg_store


@pytest.fixture
def open_store(pg_databases):
    """test_agg_store.py's `open_store`, on PostgreSQL: a name is a database."""
    made: dict[str, str] = {}

    def factory(name: str = "f"):
        if name not in made:
            made[name] = pg_databases()
        return opened(made[name])
    return factory


async def until(predicate, what: str) -> None:
    """Wait for a state, never for a time: poll `predicate` up to WAIT_S."""
    end = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < end, f"still waiting for {what} after {WAIT_S:g} s"
        await asyncio.sleep(0.01)


def db_name(dsn: str) -> str:
    return dsn.split("/")[3].split("?")[0]


def tables(pg_cluster, dsn: str) -> set[str]:
    out = pg_cluster.psql("SELECT tablename FROM pg_tables WHERE schemaname = 'public'", database=db_name(dsn))
    return set(out.split())


# -- schema ----------------------------------------------------------------------


def test_an_empty_database_is_migrated_and_the_store_is_shared(pg_cluster, pg_databases):
    dsn = pg_databases()

    async def scenario():
        async with opened(dsn) as store:
            assert is_shared(store) and await store.schema_version() == pg_schema.SCHEMA_VERSION
            await store.add_events("h1", "b1", rows([1]), None, 1.0)

    run(scenario())
    assert {"linkpass_schema", "hosts", "boots", "events", "absorbed", "commands", "mesh"} <= tables(pg_cluster, dsn)


def test_replicas_starting_together_migrate_once(pg_databases):
    """Without the migration lock, concurrent CREATE TABLEs of one step fail."""
    dsn = pg_databases()

    async def scenario():
        stores = [PgStore(dsn) for _ in range(6)]
        try:
            await asyncio.gather(*(s.open() for s in stores))
            assert [await s.schema_version() for s in stores] == [pg_schema.SCHEMA_VERSION] * 6
        finally:
            await asyncio.gather(*(s.close() for s in stores))

    run(scenario())


def test_migrations_apply_in_order_each_all_or_nothing(pg_cluster, pg_databases, monkeypatch):
    dsn = pg_databases()
    run(_open_close(dsn))  # version 1
    good = ("CREATE TABLE later (x INTEGER)",)
    bad = ("CREATE TABLE half (x INTEGER)", "THIS IS NOT SQL")
    monkeypatch.setattr(pg_schema, "MIGRATIONS", pg_schema.MIGRATIONS + (good, bad))
    monkeypatch.setattr(pg_schema, "SCHEMA_VERSION", pg_schema.SCHEMA_VERSION + 2)
    with pytest.raises(StoreError, match=f"database {re.escape(dsn)}: migrating the schema: syntax error"):
        run(_open_close(dsn))
    version = pg_cluster.psql("SELECT version FROM linkpass_schema", database=db_name(dsn)).strip()
    assert version == str(pg_schema.SCHEMA_VERSION - 1)  # step 2 stayed; step 3 left nothing behind
    found = tables(pg_cluster, dsn)
    assert "later" in found and "half" not in found


def test_a_database_newer_than_the_code_is_refused_naming_both_versions(pg_cluster, pg_databases):
    dsn = pg_databases()
    pg_cluster.psql(f"{pg_schema.VERSION_TABLE}; INSERT INTO linkpass_schema (version) VALUES (99)",
                    database=db_name(dsn))
    with pytest.raises(StoreError, match=f"schema version 99, newer than this release's {pg_schema.SCHEMA_VERSION}"):
        run(_open_close(dsn))


def test_an_unreachable_database_is_a_store_error_without_the_password(tmp_path):
    dsn = f"postgresql://someone:hunter2@/fleet?host={tmp_path}&port=5999"  # no server on that socket
    with pytest.raises(StoreError) as refused:
        run(_open_close(dsn))
    message = str(refused.value)
    assert "cannot connect" in message and "someone:***@" in message and "hunter2" not in message
    assert refused.value.__cause__ is None and refused.value.__suppress_context__


def test_calls_need_the_store_open(pg_databases):
    async def scenario():
        store = PgStore(pg_databases())
        with pytest.raises(StoreError, match="not open"):
            await store.hosts()
        await store.open()
        await store.close()
        with pytest.raises(StoreError, match="not open"):
            await store.add_events("h1", "b1", rows([1]), None, 1.0)
        with pytest.raises(StoreError, match="not open"):
            await store.try_lead("planner")
    run(scenario())


async def _open_close(dsn: str) -> None:
    async with opened(dsn):
        pass


# -- durability -------------------------------------------------------------------

CHILD = r"""
import asyncio, sys, time
from linkpassd import logs
from linkpassd.aggregator.pg_store import PgStore
from linkpassd.aggregator.store import EventRow

async def main(dsn, batch):
    logs.configure("kv", "warning")  # stdout carries only the acks
    store = PgStore(dsn)
    await store.open()
    seq, end = 0, time.monotonic() + 120  # bounded even if nobody kills it
    while time.monotonic() < end:
        events = [EventRow(seq=s, wall=1e9 + s, kind="verdict", severity="info", port="eth1",
                           rail="rail0", body=b"x" * 100) for s in range(seq + 1, seq + batch + 1)]
        result = await store.add_events("h1", "b1", events, None, time.time())
        seq = result.last_seq
        sys.stdout.write(f"{seq}\n")  # only after add_events returned: acked
        sys.stdout.flush()

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def test_a_writer_killed_mid_stream_leaves_every_acked_batch_and_no_partial_one(pg_databases):
    dsn, batch = pg_databases(), 100
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-c", CHILD, dsn, str(batch)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)
    acked = 0
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            end = time.monotonic() + DEADLINE_S
            while acked < 30 * batch:
                assert time.monotonic() < end, f"child acked only {acked}: {proc.stderr.read1().decode()!r}"
                if sel.select(timeout=1.0):
                    line = proc.stdout.readline()
                    assert line, f"child ended: {proc.stderr.read().decode()!r}"
                    acked = int(line)
        time.sleep(random.uniform(0.0, 0.05))  # not synchronisation: the kill lands anywhere in a batch
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=DEADLINE_S) == -signal.SIGKILL
        for line in proc.stdout.read().splitlines():
            acked = int(line)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=DEADLINE_S)
        proc.stdout.close()
        proc.stderr.close()

    async def reopened():
        async with opened(dsn) as store:
            seqs = await held(store, "h1", "b1")
            assert await store.hello("h1", "b1", "", 0.0) == {"b1": seqs[-1]}
            return seqs

    seqs = run(reopened())
    assert seqs[-1] >= acked
    assert seqs == list(range(1, seqs[-1] + 1))
    assert seqs[-1] % batch == 0  # a batch is all or nothing


# -- shared: two replicas on one database -------------------------------------------


@asynccontextmanager
async def two_replicas(dsn: str):
    async with opened(dsn) as a, opened(dsn) as b:
        yield a, b


def test_a_host_belongs_to_the_replica_that_set_it_last(pg_databases):
    async def scenario():
        async with two_replicas(pg_databases()) as (a, b):
            await a.set_replica("h1", "A", 10.0)
            await a.set_replica("h2", "A", 10.0)
            await a.set_replica("h3", "A", 10.0)
            (h1,) = await b.hosts(["h1"])
            assert (h1.replica, h1.first_seen, h1.last_seen) == ("A", 10.0, 10.0)
            await b.set_replica("h1", "B", 20.0)  # h1 reconnected to B
            await a.clear_replica("h1", "A")  # A's old stream ends late: B keeps it
            assert [(h.host_id, h.replica, h.last_seen) for h in await a.hosts()] == [
                ("h1", "B", 20.0), ("h2", "A", 10.0), ("h3", "A", 10.0)]
            await a.clear_replica("h2", "A")
            assert (await b.hosts(["h2"]))[0].replica == ""
            assert await a.forget_replica("A") == 1  # h3 only: h1 is B's, h2 is cleared
            assert await a.forget_replica("A") == 0
            assert await a.forget_replica("") == 0  # "" is no replica: nothing to forget
            assert [(h.host_id, h.replica) for h in await b.hosts()] == [("h1", "B"), ("h2", ""), ("h3", "")]
            await a.hello("h1", "boot", "0.1.0", 30.0)  # a hello keeps the replica
            assert (await a.hosts(["h1"]))[0].replica == "B"
    run(scenario())


def test_commands_are_handed_out_once_to_concurrent_takers_oldest_first(pg_databases):
    async def scenario():
        async with two_replicas(pg_databases()) as (a, b):
            assert await b.take_commands(["h1"], 1.0) == []
            written = []
            for i in range(200):
                host = f"h{i % 4}"
                await a.put_command(f"c{i:03d}", host, f"body {i}".encode(), 100.0 + i)
                written.append((f"c{i:03d}", host))
            await a.put_command("c000", "h0", b"resent", 999.0)  # the same id again: ignored

            async def taker(store: PgStore) -> list:
                got = []
                for _ in range(40):
                    got.extend(await store.take_commands(["h0", "h1", "h2", "h3"], 500.0))
                return got

            taken = await asyncio.gather(*(taker(s) for s in (a, b, a, b)))
            every = [(p.command_id, p.host_id) for part in taken for p in part]
            assert sorted(every) == sorted(written)  # each once, none lost
            first = next(p for part in taken for p in part if p.command_id == "c000")
            assert (first.body, first.created) == (b"body 0", 100.0)
            for part in taken:  # each take is oldest first
                created = [p.created for p in part]
                assert created == sorted(created)
            await a.put_command("c900", "h9", b"x", 600.0)
            await a.put_command("c901", "h8", b"y", 601.0)
            assert [p.command_id for p in await b.take_commands(["h9"], 700.0)] == ["c900"]  # only its hosts
            assert await b.take_commands([], 700.0) == []
    run(scenario())


def test_a_result_written_by_one_replica_is_read_by_the_other(pg_databases):
    async def scenario():
        async with two_replicas(pg_databases()) as (a, b):
            await a.put_command("c1", "h1", b"drain", 1.0)
            assert await a.command_result("c1") is None
            (pending,) = await b.take_commands(["h1"], 2.0)
            assert await a.command_result("c1") is None  # taken, not answered yet
            await b.put_result(pending.command_id, 0, "ok: drained eth1", 3.0)
            assert await a.command_result("c1") == (0, "ok: drained eth1")
            await b.put_result("c-unknown", 14, "host h7 is not connected", 4.0)  # never put: still found
            assert await a.command_result("c-unknown") == (14, "host h7 is not connected")
            assert await a.take_commands(["h1", ""], 5.0) == []  # answered commands are not pending
            await a.prune(3.5)  # retention takes old commands too
            assert await a.command_result("c1") is None
            assert await a.command_result("c-unknown") == (14, "host h7 is not connected")
    run(scenario())


def test_one_replica_leads_at_a_time_and_leadership_ends_with_its_connection(pg_cluster, pg_databases):
    dsn = pg_databases()

    async def scenario():
        async with opened(dsn) as a:
            async with opened(dsn) as b:
                assert await a.try_lead("mesh-planner") is True
                assert await b.try_lead("mesh-planner") is False
                assert await a.try_lead("mesh-planner") is True  # still held
                assert await b.try_lead("other-role") is True  # roles are independent
                assert await b.try_lead("mesh-planner") is False
            # b closed: its roles are free; a keeps its own
            assert await a.try_lead("other-role") is True
            async with opened(dsn) as c:
                assert await c.try_lead("mesh-planner") is False
                # a's leadership connection dies (a network cut, a server restart):
                pid = a._lead_conn.get_server_pid()
                pg_cluster.psql(f"SELECT pg_terminate_backend({pid})", database=db_name(dsn))
                await until(lambda: a._lead_conn is None or a._lead_conn.is_closed(), "a's connection to drop")
                assert await a.try_lead("mesh-planner") is False  # lost: said once
                await until_async(lambda: c.try_lead("mesh-planner"), "c to take the freed role")
                assert await a.try_lead("mesh-planner") is False  # reconnected, c holds it
                assert await a.try_lead("other-role") is False  # lost with the connection too: said once
                assert await a.try_lead("other-role") is True  # then taken again on the new connection
    run(scenario())


async def until_async(predicate, what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not await predicate():
        assert time.monotonic() < end, f"still waiting for {what} after {WAIT_S:g} s"
        await asyncio.sleep(0.01)


def test_the_mesh_plan_is_replaced_whole_and_read_per_host(pg_databases):
    async def scenario():
        async with two_replicas(pg_databases()) as (a, b):
            assert await b.mesh_for(["h1"]) == {}
            await a.put_mesh(1, {"h1": b"peers of h1", "h2": b"peers of h2", "h3": b""})
            assert await b.mesh_for(["h1", "h3", "h9"]) == {"h1": b"peers of h1", "h3": b""}
            await b.put_mesh(2, {"h2": b"new peers of h2"})  # h1 and h3 are no longer in the plan
            assert await a.mesh_for(["h1", "h2", "h3"]) == {"h2": b"new peers of h2"}
            await asyncio.gather(a.put_mesh(3, {"h1": b"a"}), b.put_mesh(4, {"h1": b"b", "h2": b"b"}))
            assert await a.mesh_for(["h1", "h2"]) in ({"h1": b"a"}, {"h1": b"b", "h2": b"b"})  # one, whole
            await a.put_mesh(5, {})
            assert await a.mesh_for(["h1", "h2"]) == {}
            assert await a.mesh_for([]) == {}
    run(scenario())


def test_a_leaf_cap_holds_across_replicas_writing_at_once(pg_databases):
    """Eight hosts on one leaf ask to fence at once, through two replicas'
    stores: the store regrants the leaf one writer at a time, so exactly the
    cap is granted; a grant passes on when its port stops asking, and
    another leaf is counted on its own."""
    def regrant(cap):
        def fn(ports, before):
            return frozenset((h, p) for h, ps in grants(ports, cap, before).items() for p in ps)
        return fn

    def asking(host, leaf="L1", phase="FENCE_ASKING"):
        return [FencePort(host, "eth1", leaf, phase)]

    async def scenario():
        async with two_replicas(pg_databases()) as (a, b):
            assert await a.put_fence_ports("h0", [], regrant(2)) is False  # nothing was, nothing is
            changed = await asyncio.gather(*((a if i % 2 else b).put_fence_ports(f"h{i}", asking(f"h{i}"), regrant(2))
                                             for i in range(8)))
            assert any(changed)
            held = await b.fence_grants()
            assert sum(len(p) for p in held.values()) == 2, held
            assert await a.put_fence_ports(sorted(held)[0], asking(sorted(held)[0]), regrant(2)) is False  # same ask
            await a.put_fence_ports("x1", asking("x1", leaf="L2"), regrant(2))
            gone = sorted(held)[0]
            assert await b.put_fence_ports(gone, [], regrant(2)) is True  # its fence ended
            now = await a.fence_grants()
            assert gone not in now and sum(len(p) for h, p in now.items() if h != "x1") == 2, now
            assert set(held) - {gone} <= set(now)  # the other grant stayed where it was
            assert now["x1"] == frozenset({"eth1"})
    run(scenario())


def test_notifications_reach_every_replica_and_a_lost_listen_connection_comes_back(pg_cluster, pg_databases):
    dsn = pg_databases()

    async def scenario():
        async with two_replicas(dsn) as (a, b):
            heard_a, heard_b, events_b = [], [], []
            await a.listen(CHANNEL_HOSTS, heard_a.append)
            await b.listen(CHANNEL_HOSTS, heard_b.append)
            await b.listen(CHANNEL_EVENTS, events_b.append)
            await a.notify(CHANNEL_HOSTS, "h1")
            await until(lambda: heard_a == ["h1"] and heard_b == ["h1"], "h1 heard by both (sender included)")
            await a.add_events("h1", "b1", rows([1, 2]), None, 1.0)
            await until(lambda: events_b == [""], "b told of a's events")

            # b's LISTEN connection is cut: b reconnects, then tells every
            # callback "" once (what was sent meanwhile may be gone)
            pid = b._listen_conn.get_server_pid()
            pg_cluster.psql(f"SELECT pg_terminate_backend({pid})", database=db_name(dsn))
            await until(lambda: heard_b[-1:] == [""] and events_b == ["", ""], "b to listen again")
            assert heard_b.count("") == 1
            await a.notify(CHANNEL_HOSTS, "h2")
            await until(lambda: heard_b[-1:] == ["h2"] and heard_a[-1:] == ["h2"], "h2 heard after the reconnection")
            assert b._listen_conn.get_server_pid() != pid
    run(scenario())


def test_a_failing_callback_does_not_stop_the_others(pg_databases):
    async def scenario():
        async with opened(pg_databases()) as a:
            heard = []

            def broken(payload: str) -> None:
                raise RuntimeError("a caller's bug")

            await a.listen(CHANNEL_HOSTS, broken)
            await a.listen(CHANNEL_HOSTS, heard.append)
            await a.notify(CHANNEL_HOSTS, "x")
            await a.notify(CHANNEL_HOSTS, "y")
            await until(lambda: heard == ["x", "y"], "both payloads")
    run(scenario())


def test_a_replica_sends_one_events_notification_at_a_time_and_calls_meanwhile_share_the_next(
        pg_databases, monkeypatch):
    """Per-replica work that does not grow with the load or the replicas
    (issue 29): while a replica's CHANNEL_EVENTS notification is in flight
    (made slow here: 2 s), the calls it commits meanwhile send none of their
    own but share one more, so every other replica hears two wake-ups for
    ten calls, not ten. Every event is stored all the same."""
    dsn = pg_databases()
    slow = pg_store.NOTIFY_EVENTS_SQL.replace("SELECT ", "SELECT pg_sleep(2.0), ", 1)
    assert slow != pg_store.NOTIFY_EVENTS_SQL
    monkeypatch.setattr(pg_store, "NOTIFY_EVENTS_SQL", slow)

    async def scenario():
        async with two_replicas(dsn) as (a, b):
            heard: list[str] = []
            await b.listen(CHANNEL_EVENTS, heard.append)
            for seq in range(1, 11):  # ten commits, each well inside the first notification's 2 s
                await a.add_events("h1", "b1", rows([seq]), None, 1.0)
            await a._announcer  # every notification a's calls asked for has been sent
            await a.notify(CHANNEL_EVENTS, "end")  # delivered after them, in commit order
            await until(lambda: heard[-1:] == ["end"], "b to hear the end marker")
            assert heard == ["", "", "end"], heard
            assert [e.seq for e in await b.events(EventQuery(host_id="h1", limit=100))] == list(range(1, 11))
    run(scenario())


def test_event_ids_follow_commit_order_so_a_following_reader_misses_nothing(pg_databases):
    """Two replicas write batches of 16 hosts at once while a reader follows
    `after_id`: it must see every event (an id handed out before a later
    commit would be skipped), and ids order each host's events by seq."""
    hosts, batches, size = 16, 12, 25
    dsn = pg_databases()

    async def scenario():
        async with two_replicas(dsn) as (a, b), opened(dsn) as reader:
            seen: list = []
            done = asyncio.Event()

            async def follow():
                cursor = 0
                while True:
                    finished = done.is_set()
                    page = await reader.events(EventQuery(after_id=cursor, limit=100))
                    seen.extend(page)
                    if page:
                        cursor = page[-1].id
                    elif finished:
                        return
                    else:
                        await asyncio.sleep(0)

            async def host(n: int):
                store = (a, b)[n % 2]
                for k in range(batches):
                    first = k * size + 1
                    result = await store.add_events(f"h{n:02d}", "b1", rows(range(first, first + size)), None, 1.0)
                    assert result.stored == size

            follower = asyncio.create_task(follow())
            try:
                await asyncio.gather(*(host(n) for n in range(hosts)))
            finally:
                done.set()
                await follower
            assert len(seen) == hosts * batches * size == len({e.id for e in seen})
            assert [e.id for e in seen] == sorted(e.id for e in seen)
            for n in range(hosts):
                assert [e.seq for e in seen if e.host_id == f"h{n:02d}"] == list(range(1, batches * size + 1))
            assert a.group_commits + b.group_commits < hosts * batches  # batches shared commits
    run(scenario())


# -- no lock on the event path (issue 29) ------------------------------------------


def test_a_schema_1_database_keeps_its_events_and_new_ids_come_after_them(pg_cluster, pg_databases, monkeypatch):
    """Migration 2 on a database written by schema 1 (identity ids 1..n):
    the old events stay readable under their ids, new events get larger ids,
    so a follower's old cursor carries on."""
    dsn = pg_databases()
    with monkeypatch.context() as m:
        m.setattr(pg_schema, "MIGRATIONS", pg_schema.MIGRATIONS[:1])
        m.setattr(pg_schema, "SCHEMA_VERSION", 1)

        async def schema_1():
            async with opened(dsn):
                pass
        run(schema_1())
    pg_cluster.psql("INSERT INTO events (host_id, boot_id, seq, wall, kind, severity, port, rail, body, stored_at) "
                    "SELECT 'old', 'b', s, s, 'verdict', 'info', 'eth1', 'rail0', '', s "
                    "FROM generate_series(1, 50) s", database=db_name(dsn))

    async def scenario():
        async with opened(dsn) as store:
            assert await store.schema_version() == pg_schema.SCHEMA_VERSION  # through 2 and on
            old = await store.events(EventQuery(limit=1000))
            assert [e.id for e in old] == list(range(1, 51))
            await store.add_events("new", "b", rows(range(1, 11)), None, 1.0)
            after = await store.events(EventQuery(after_id=50, limit=1000))
            assert [(e.host_id, e.seq) for e in after] == [("new", s) for s in range(1, 11)]
            assert after[0].id > 50 and [e.id for e in after] == sorted(e.id for e in after)
    run(scenario())


def test_failovers_stored_before_the_facts_were_kept_count_as_outgoing_only(pg_cluster, pg_databases,
                                                                           monkeypatch):
    """Migration 3 on a database of schema 2: its `absorbed` rows kept no
    rail, so no address move pairs with them: outgoing only, not lost."""
    dsn = pg_databases()
    with monkeypatch.context() as m:
        m.setattr(pg_schema, "MIGRATIONS", pg_schema.MIGRATIONS[:2])
        m.setattr(pg_schema, "SCHEMA_VERSION", 2)

        async def schema_2():
            async with opened(dsn):
                pass
        run(schema_2())
    pg_cluster.psql(f"INSERT INTO absorbed (host_id, boot_id, seq, wall, day, gpus) "
                    f"VALUES ('h1', 'b1', 1, {DAY0 + 10}, '2026-01-01', 8)", database=db_name(dsn))

    async def scenario():
        async with opened(dsn) as store:
            assert await store.schema_version() == pg_schema.SCHEMA_VERSION
            await store.add_events("h1", "b1", [fact_row(2, "detoured", DAY0 + 10.01)], None, 1.0)
            (total,) = await store.day_totals(DAY0, DAY0 + 86400)
            assert (total.failures_absorbed, total.gpus, total.failures_outgoing_only) == (0, 0, 1)
    run(scenario())


def test_a_reader_never_passes_a_transaction_still_running_and_is_woken_when_it_ends(pg_databases):
    """The skip the old lock prevented: transaction T1 takes its xid, T2
    (a replica's group commit) commits events after it. A reader must not
    see T2's events while T1 may still commit (they would come before them),
    then sees T1's and T2's in that order, and is woken once T1 ends though
    T1 notified nobody."""
    dsn = pg_databases()

    async def scenario():
        async with opened(dsn) as store, opened(dsn) as reader:
            seen: list = []
            reads: list[int] = []
            wake = asyncio.Event()
            await reader.listen(CHANNEL_EVENTS, lambda _payload: wake.set())

            async def follow():  # as the fan-out does: read from the cursor on every wake-up
                while True:
                    await wake.wait()
                    wake.clear()
                    page = await reader.events(EventQuery(after_id=seen[-1].id if seen else 0, limit=100))
                    seen.extend(page)
                    reads.append(len(page))

            follower = asyncio.create_task(follow())
            t1 = await asyncpg.connect(dsn)
            try:
                tx = t1.transaction()
                await tx.start()
                await t1.execute("INSERT INTO hosts (host_id, first_seen, last_seen) VALUES ('early', 1, 1)")
                await store.add_events("late", "b", rows(range(1, 4)), None, 1.0)  # T2, committed, notified
                await until(lambda: len(reads) >= 2, "the follower reading while T1 runs")
                assert seen == []  # held below T1
                await t1.execute(
                    f"INSERT INTO events (id, host_id, boot_id, seq, wall, kind, severity, port, rail, body, "
                    f"stored_at) VALUES ({pg_schema.TX_ID_BASE} + 1, 'early', 'b', 1, 1, 'verdict', 'info', "
                    "'eth1', 'rail0', '', 1)")
                await tx.commit()  # no NOTIFY: only the store's own retry wakes the follower
            finally:
                await t1.close()
            try:
                await until(lambda: len(seen) == 4, "the follower to read past the ended transaction")
            finally:
                follower.cancel()
            assert [(e.host_id, e.seq) for e in seen] == [("early", 1), ("late", 1), ("late", 2), ("late", 3)]
            assert [e.id for e in seen] == sorted(e.id for e in seen)
    run(scenario())


def test_one_group_is_one_statement_and_a_seq_sent_twice_in_it_counts_for_the_first_call(pg_databases):
    """Calls queued together share one group: each (host, boot, seq) is
    stored once and counted for the first call that carried it; the rest
    are duplicates; a bad call among them fails alone."""
    async def scenario():
        async with opened(pg_databases()) as store:
            calls = [store.add_events("h", "b", rows(range(1, 6)), None, 1.0),
                     store.add_events("h", "b", rows(range(3, 9)), None, 2.0),
                     store.add_events("g", "b", rows(range(1, 3)), None, 1.0),
                     store.add_events("bad\x00host", "b", rows(range(1, 3)), None, 1.0)]
            first, second, other, bad = await asyncio.gather(*calls, return_exceptions=True)
            assert (first.stored, first.duplicates, first.last_seq) == (5, 0, 5)
            assert (second.stored, second.duplicates, second.last_seq) == (3, 3, 8)
            assert other.stored == 2
            assert isinstance(bad, StoreError) and "bad\x00host" in str(bad)
            (h,) = await store.hosts(["h"])
            assert (h.last_seq, h.events_lost, h.last_seen) == (8, 0, 2.0)
            assert [e.seq for e in await store.events(EventQuery(host_id="h", limit=100))] == list(range(1, 9))
    run(scenario())


def test_the_old_locked_path_stores_the_same_for_the_bench(pg_databases):
    """PgStore(event_lock=True), the bench's baseline, gives the same results."""
    async def scenario():
        dsn = pg_databases()
        store = PgStore(dsn, event_lock=True)
        await store.open()
        try:
            results = await asyncio.gather(*(store.add_events(f"h{n}", "b", rows(range(1, 11)), (0, 0), 1.0)
                                             for n in range(20)))
            assert all(r.stored == 10 for r in results) and store.group_commits < 20
            again = await store.add_events("h0", "b", rows(range(5, 13)), None, 2.0)
            assert (again.stored, again.duplicates) == (2, 6)
            seen = await store.events(EventQuery(limit=1000))
            assert len(seen) == 202 == len({e.id for e in seen})
        finally:
            await store.close()
    run(scenario())
