"""aggregator.sqlite_store: every event stored exactly once and durably, the
accounting of what was lost, queries, retention that keeps the savings, and
schema migrations; including a writer killed with SIGKILL mid-stream."""

from __future__ import annotations

import asyncio
import os
import random
import selectors
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from linkpassd.aggregator import sqlite_store
from linkpassd.aggregator.sqlite_store import SCHEMA_VERSION, SqliteStore
from linkpassd.aggregator.store import EventQuery, EventRow, OutOfOrder, StoreError

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 60.0
DAY0 = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, DEADLINE_S))


def rows(seqs: Iterable[int], *, kind: str = "verdict", port: str = "eth1", rail: str = "rail0",
         wall0: float = DAY0, gpus: int = 0, fact: str = "") -> list[EventRow]:
    return [EventRow(seq=s, wall=wall0 + s, kind=kind, severity="info", port=port, rail=rail,
                     body=f"event {s}".encode(), fact=fact, gpus=gpus) for s in seqs]


def fact_row(seq: int, fact: str, wall: float, *, rail: str = "rail0", gpus: int = 0) -> EventRow:
    """An event as the server hands it over when savings.fact gave it `fact`."""
    kind = "rail_path" if fact == "failover" else "announce"
    return EventRow(seq=seq, wall=wall, kind=kind, severity="warning", port="", rail=rail,
                    body=f"event {seq}".encode(), fact=fact, gpus=gpus)


@asynccontextmanager
async def opened(path: Path | str):
    store = SqliteStore(str(path))
    await store.open()
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
def store_module():
    """The module of the store under test (its tunables, e.g. PRUNE_CHUNK).
    test_agg_pg_store.py overrides this and `open_store` to run the same
    scenarios against PostgreSQL."""
    return sqlite_store


@pytest.fixture
def open_store(tmp_path):
    """`open_store(name="f")`: the store under test, for an `async with`;
    within a test the same name is the same database."""
    return lambda name="f": opened(tmp_path / f"{name}.db")


async def held(store: SqliteStore, host_id: str = "", boot_id: str | None = None) -> list[int]:
    events = await store.events(EventQuery(host_id=host_id, limit=1_000_000))
    return [e.seq for e in events if boot_id is None or e.boot_id == boot_id]


def test_resends_and_overlapping_batches_store_each_event_once(open_store):
    async def scenario():
        async with open_store() as store:
            first = await store.add_events("h1", "b1", rows(range(1, 501)), None, 1.0)
            assert (first.stored, first.duplicates, first.last_seq, first.lost) == (500, 0, 500, 0)
            again = await store.add_events("h1", "b1", rows(range(1, 501)), None, 2.0)
            assert (again.stored, again.duplicates, again.last_seq) == (0, 500, 500)
            overlap = await store.add_events("h1", "b1", rows(range(400, 701)), None, 3.0)
            assert (overlap.stored, overlap.duplicates, overlap.last_seq) == (200, 101, 700)
            assert await held(store) == list(range(1, 701))
            events = await store.events(EventQuery(limit=2))
            assert events[0].body == b"event 1" and events[0].stored_at == 1.0  # as first stored
            assert (store.stats.events_stored, store.stats.events_duplicate) == (700, 601)
            assert len(store.stats.write_seconds) == 3
    run(scenario())


def test_out_of_order_batches_are_refused_naming_the_seqs_and_nothing_is_stored(open_store):
    async def scenario():
        async with open_store() as store:
            with pytest.raises(OutOfOrder, match="seq 2 follows 3"):
                await store.add_events("h1", "b1", rows([1, 3, 2, 4]), None, 1.0)
            with pytest.raises(OutOfOrder, match="seq 5 follows 5"):
                await store.add_events("h1", "b1", rows([5, 5]), None, 1.0)
            with pytest.raises(OutOfOrder, match="seq 0 is out of range"):
                await store.add_events("h1", "b1", rows([0, 1]), None, 1.0)
            with pytest.raises(OutOfOrder, match="gap 3..8 does not end before the batch's first seq 8"):
                await store.add_events("h1", "b1", rows([8, 9]), (3, 8), 1.0)
            with pytest.raises(OutOfOrder, match="gap 9..3"):
                await store.add_events("h1", "b1", rows([10]), (9, 3), 1.0)
            assert await held(store) == [] and await store.hosts() == []
            assert store.stats.events_stored == 0
            ok = await store.add_events("h1", "b1", rows([1, 2, 3]), (0, 0), 1.0)  # (0, 0): no gap
            assert (ok.stored, ok.lost) == (3, 0)
    run(scenario())


def test_declared_gaps_and_holes_count_as_lost_once(open_store):
    async def scenario():
        async with open_store() as store:
            await store.add_events("h1", "b1", rows(range(1, 11)), None, 1.0)
            gap = await store.add_events("h1", "b1", rows(range(21, 31)), (11, 20), 2.0)
            assert (gap.stored, gap.lost, gap.last_seq) == (10, 10, 30)  # the gap is the hole: not 20
            resent = await store.add_events("h1", "b1", rows(range(21, 31)), (11, 20), 3.0)
            assert (resent.stored, resent.duplicates, resent.lost) == (0, 10, 0)  # not counted twice
            hole = await store.add_events("h1", "b1", rows(range(41, 51)), None, 4.0)
            assert (hole.lost, hole.last_seq) == (10, 50)  # 31..40 never arrived
            gap_only = await store.add_events("h1", "b1", [], (51, 60), 5.0)
            assert (gap_only.stored, gap_only.lost, gap_only.last_seq) == (0, 10, 60)
            late = await store.add_events("h1", "b1", rows([35]), None, 6.0)  # a hole filled late
            assert (late.stored, late.lost, late.last_seq) == (1, 0, 60)
            other_boot = await store.add_events("h1", "b2", rows(range(3, 5)), None, 7.0)
            assert other_boot.lost == 2  # 1..2 of the new boot never arrived
            (host,) = await store.hosts()
            assert host.events_lost == 10 + 10 + 10 - 1 + 2  # 35 arrived after all
            assert store.stats.events_lost == 10 + 10 + 10 + 2  # a counter: counted, never taken back
    run(scenario())


def test_a_restart_keeps_hosts_events_and_what_was_acked(open_store):
    async def before():
        async with open_store() as store:
            assert await store.hello("h1", "b1", "0.1.0", 10.0) == {}
            await store.set_inventory("h1", b"inventory", 11.0)
            await store.set_report("h1", b"report", 12.0)
            await store.add_events("h1", "b1", rows(range(1, 101)), None, 13.0)
            await store.add_events("h1", "b0", rows(range(1, 6)), None, 13.5)

    async def after():
        async with open_store() as store:
            assert await store.hello("h1", "b2", "0.2.0", 20.0) == {"b1": 100, "b0": 5}
            (host,) = await store.hosts()
            assert (host.boot_id, host.version, host.first_seen, host.last_seen) == ("b2", "0.2.0", 10.0, 20.0)
            assert (host.inventory, host.report) == (b"inventory", b"report")
            assert await held(store, "h1", "b1") == list(range(1, 101))
            resent = await store.add_events("h1", "b1", rows(range(1, 101)), None, 21.0)
            assert (resent.stored, resent.duplicates) == (0, 100)

    run(before())
    run(after())


CHILD = r"""
import asyncio, sys, time
from linkpassd.aggregator.sqlite_store import SqliteStore
from linkpassd.aggregator.store import EventRow

async def main(path, batch):
    store = SqliteStore(path)
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


def test_a_writer_killed_mid_stream_leaves_every_acked_batch_and_no_partial_one(tmp_path):
    path, batch = tmp_path / "f.db", 100
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(batch)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)
    acked = 0
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            end = time.monotonic() + DEADLINE_S
            while acked < 30 * batch:  # well into the stream
                assert time.monotonic() < end, f"child acked only {acked}: {proc.stderr.read1().decode()!r}"
                if sel.select(timeout=1.0):
                    line = proc.stdout.readline()
                    assert line, f"child ended: {proc.stderr.read().decode()!r}"
                    acked = int(line)
        # Not synchronisation: the child is still writing; a random delay puts
        # the kill anywhere inside a later batch rather than just after an ack.
        time.sleep(random.uniform(0.0, 0.05))
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=DEADLINE_S) == -signal.SIGKILL
        for line in proc.stdout.read().splitlines():  # acks written before the kill
            acked = int(line)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=DEADLINE_S)
        proc.stdout.close()
        proc.stderr.close()

    async def reopened():
        async with opened(path) as store:
            seqs = await held(store, "h1", "b1")
            assert await store.hello("h1", "b1", "", 0.0) == {"b1": seqs[-1]}
            return seqs

    seqs = run(reopened())
    assert seqs[-1] >= acked  # every acked batch (and maybe one committed just before the kill)
    assert seqs == list(range(1, seqs[-1] + 1))  # each once, in order, no hole
    assert seqs[-1] % batch == 0  # a batch is all or nothing
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_an_empty_file_is_migrated_to_the_current_schema(tmp_path):
    path = tmp_path / "f.db"
    path.touch()

    async def scenario():
        async with opened(path) as store:
            assert await store.schema_version() == SCHEMA_VERSION
            await store.add_events("h1", "b1", rows([1]), None, 1.0)

    run(scenario())
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"hosts", "boots", "events", "absorbed"} <= tables


def test_migrations_apply_in_order_each_all_or_nothing(tmp_path, monkeypatch):
    path = tmp_path / "f.db"
    run(_open_close(path))  # version 1
    good = ("CREATE TABLE later (x INTEGER)",)
    bad = ("CREATE TABLE half (x INTEGER)", "THIS IS NOT SQL")
    monkeypatch.setattr(sqlite_store, "MIGRATIONS", sqlite_store.MIGRATIONS + (good, bad))
    monkeypatch.setattr(sqlite_store, "SCHEMA_VERSION", SCHEMA_VERSION + 2)
    with pytest.raises(StoreError, match=f"database {path}: .*syntax error"):
        run(_open_close(path))
    with sqlite3.connect(path) as conn:  # step 2 stayed; step 3 left nothing behind
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION + 1,)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "later" in tables and "half" not in tables


def test_failovers_stored_before_the_facts_were_kept_count_as_outgoing_only(tmp_path, monkeypatch):
    """Schema 1 kept no rail with a failover: no address move can be paired
    with it, so it is counted (as outgoing only), not lost and not absorbed."""
    path = tmp_path / "f.db"
    monkeypatch.setattr(sqlite_store, "MIGRATIONS", sqlite_store.MIGRATIONS[:1])
    monkeypatch.setattr(sqlite_store, "SCHEMA_VERSION", 1)
    run(_open_close(path))
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO absorbed (host_id, boot_id, seq, wall, day, gpus) "
                     "VALUES ('h1', 'b1', 1, ?, '2026-01-01', 8)", (DAY0 + 10,))
    monkeypatch.undo()

    async def scenario():
        async with opened(path) as store:
            assert await store.schema_version() == SCHEMA_VERSION
            await store.add_events("h1", "b1", [fact_row(2, "detoured", DAY0 + 10.01)], None, 1.0)
            (total,) = await store.day_totals(DAY0, DAY0 + 86400)
            assert (total.failures_absorbed, total.gpus, total.failures_outgoing_only) == (0, 0, 1)

    run(scenario())


def test_a_database_newer_than_the_code_is_refused_naming_both_versions(tmp_path):
    path = tmp_path / "f.db"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreError, match=f"schema version 99, newer than this release's {SCHEMA_VERSION}"):
        run(_open_close(path))


def test_a_corrupt_file_is_a_store_error_naming_the_path(tmp_path):
    path = tmp_path / "f.db"
    path.write_bytes(b"this is not an sqlite database at all " * 200)
    with pytest.raises(StoreError) as refused:
        run(_open_close(path))
    assert str(path) in str(refused.value) and "not a database" in str(refused.value)
    assert refused.value.__cause__ is None and refused.value.__suppress_context__


async def _open_close(path):
    async with opened(path):
        pass


def test_only_lock_waits_and_commits_run_on_the_stores_thread_and_it_must_be_open(tmp_path):
    """BEGIN IMMEDIATE (may wait for the lock) and COMMIT (the fsync) run on
    the store's worker thread, never on the event loop's; the statements in
    between and the reads run on the loop (a worker running them waits for
    the GIL at every step while the loop is busy: see the module docstring)."""
    async def scenario():
        store = SqliteStore(str(tmp_path / "f.db"))
        with pytest.raises(StoreError, match="not open"):
            await store.hosts()
        await store.open()
        loop_thread = threading.get_ident()
        seen: list[tuple[str, int]] = []
        try:
            store._conn.set_trace_callback(lambda sql: seen.append((sql.split()[0].upper(), threading.get_ident())))
            await asyncio.gather(*(store.add_events(f"h{i}", "b", rows([1, 2]), None, 1.0) for i in range(5)))
            await store.hosts()
            store._conn.set_trace_callback(None)
            worker = await store._job(lambda conn: threading.get_ident())
            assert worker != loop_thread
            where = {}
            for verb, thread in seen:
                where.setdefault(verb, set()).add(thread)
            assert where["BEGIN"] == {worker} and where["COMMIT"] == {worker}
            assert where["INSERT"] == {loop_thread} and where["SELECT"] == {loop_thread}
        finally:
            await store.close()
        with pytest.raises(StoreError, match="not open"):
            await store.touch("h1", 1.0)
    run(scenario())


def test_events_are_found_by_host_port_kind_time_and_cursor_with_a_limit(open_store):
    async def scenario():
        async with open_store() as store:
            await store.add_events("h1", "b1", rows([1, 2], port="eth1"), None, 1.0)
            await store.add_events("h2", "b9", rows([1, 2], port="eth2", kind="rail_path"), None, 1.0)
            await store.add_events("h1", "b1", rows([3, 4], port="eth2", kind="drain"), None, 1.0)

            async def found(**query):
                return [(e.host_id, e.seq) for e in await store.events(EventQuery(**query))]

            assert await found() == [("h1", 1), ("h1", 2), ("h2", 1), ("h2", 2), ("h1", 3), ("h1", 4)]
            assert await found(host_id="h1") == [("h1", 1), ("h1", 2), ("h1", 3), ("h1", 4)]
            assert await found(port="eth2") == [("h2", 1), ("h2", 2), ("h1", 3), ("h1", 4)]
            assert await found(host_id="h1", port="eth2") == [("h1", 3), ("h1", 4)]
            assert await found(kind="rail_path") == [("h2", 1), ("h2", 2)]
            assert await found(since=DAY0 + 2, until=DAY0 + 4) == [("h1", 2), ("h2", 2), ("h1", 3)]
            assert await found(host_id="nobody") == []
            assert await found(after_id=2**64 - 1) == []  # a proto uint64 cursor past any id
            page = await store.events(EventQuery(limit=4))
            assert [(e.host_id, e.seq) for e in page][-1] == ("h2", 2)
            rest = await store.events(EventQuery(after_id=page[-1].id, limit=4))
            assert [(e.host_id, e.seq) for e in rest] == [("h1", 3), ("h1", 4)]
            assert [e.id for e in page + rest] == sorted(e.id for e in page + rest)
            assert rest[0].boot_id == "b1" and rest[0].kind == "drain" and rest[0].port == "eth2"
            with pytest.raises(StoreError, match="limit must be 1 or more, not 0"):
                await store.events(EventQuery(limit=0))
    run(scenario())


def test_hosts_rows_report_boot_version_times_state_and_lost(open_store):
    async def scenario():
        async with open_store() as store:
            await store.hello("h2", "b1", "0.1.0", 100.0)
            await store.hello("h1", "a1", "0.1.0", 100.0)
            await store.add_events("h1", "a1", rows(range(3, 8)), None, 101.0)  # 1..2 lost
            await store.hello("h1", "a2", "0.2.0", 102.0)  # a restart: new boot
            await store.add_events("h1", "a2", rows([1, 2]), None, 103.0)
            await store.set_inventory("h1", b"inv", 104.0)
            await store.set_report("h1", b"rep", 105.0)
            await store.touch("h2", 106.0)
            await store.touch("h2", 50.0)  # a late heartbeat never moves last_seen back
            h1, h2 = await store.hosts()
            assert (h1.host_id, h1.boot_id, h1.version, h1.first_seen, h1.last_seen) == \
                ("h1", "a2", "0.2.0", 100.0, 105.0)
            assert (h1.inventory, h1.report, h1.last_seq, h1.events_lost) == (b"inv", b"rep", 2, 2)
            assert (h2.host_id, h2.last_seen, h2.inventory, h2.last_seq, h2.events_lost) == \
                ("h2", 106.0, b"", 0, 0)
            assert h1.replica == h2.replica == ""  # no replica has recorded either
            assert [h.host_id for h in await store.hosts(["h2", "nobody"])] == ["h2"]
            assert await store.hello("h1", "a2", "0.2.0", 107.0) == {"a1": 7, "a2": 2}
    run(scenario())


def test_heartbeats_of_many_hosts_are_stored_in_one_call_and_never_move_back(open_store):
    async def scenario():
        async with open_store() as store:
            await store.hello("h1", "a1", "0.1.0", 100.0)
            await store.touch_many({"h1": 110.0, "h2": 111.0, "h3": 90.0})  # h2, h3 unknown until now
            await store.touch_many({"h1": 105.0, "h3": 120.0})  # late for h1: it stays at 110
            await store.touch_many({})
            seen = {h.host_id: (h.first_seen, h.last_seen, h.boot_id) for h in await store.hosts()}
            assert seen == {"h1": (100.0, 110.0, "a1"), "h2": (111.0, 111.0, ""), "h3": (90.0, 120.0, "")}
    run(scenario())


def test_retention_prunes_old_events_in_chunks_and_keeps_the_savings(open_store, store_module, monkeypatch):
    monkeypatch.setattr(store_module, "PRUNE_CHUNK", 7)

    async def scenario():
        async with open_store() as store:
            # 15 failovers of rail0, each with its address moved through rail1 in the next event
            batch = [fact_row(s, "failover" if s % 2 else "detoured", DAY0 + s, gpus=8 if s % 2 else 0)
                     for s in range(1, 31)]
            await store.add_events("h1", "b1", batch, None, 1.0)
            assert await store.prune(DAY0 + 21) == 20  # walls DAY0+1 .. DAY0+20: three chunks of 7
            assert await held(store) == list(range(21, 31))
            (total,) = await store.day_totals(DAY0, DAY0 + 86400)
            assert (total.day, total.failures_absorbed, total.gpus) == ("2026-01-01", 15, 120)
            resent = await store.add_events("h1", "b1", batch, None, 2.0)
            assert (resent.stored, resent.duplicates) == (0, 30)  # pruned ones do not come back
            assert await held(store) == list(range(21, 31))
            (total,) = await store.day_totals(DAY0, DAY0 + 86400)
            assert (total.failures_absorbed, total.failures_outgoing_only) == (15, 0)  # not counted twice
            assert await store.prune(DAY0) == 0
    run(scenario())


def test_day_totals_are_per_utc_day_in_a_half_open_range(open_store):
    async def scenario():
        async with open_store() as store:
            walls = {1: DAY0 - 0.5, 2: DAY0, 3: DAY0 + 86399.9, 4: DAY0 + 86400, 5: DAY0 + 86401}
            # each failover on rail<seq>, its address moved 10 ms later (seq + 10)
            events = [fact_row(s, "failover", w, rail=f"rail{s}", gpus=s) for s, w in walls.items()]
            events.append(EventRow(seq=6, wall=DAY0 + 5, kind="verdict", severity="info", port="eth1",
                                   rail="rail0", body=b""))  # no fact
            events += [fact_row(s + 10, "detoured", w + 0.01, rail=f"rail{s}") for s, w in walls.items()]
            await store.add_events("h1", "b1", events, None, 1.0)
            totals = await store.day_totals(DAY0 - 86400, DAY0 + 2 * 86400)
            assert [(t.day, t.failures_absorbed, t.gpus) for t in totals] == [
                ("2025-12-31", 1, 1), ("2026-01-01", 2, 5), ("2026-01-02", 2, 9)]
            totals = await store.day_totals(DAY0, DAY0 + 86400)  # until excluded
            assert [(t.day, t.failures_absorbed, t.gpus) for t in totals] == [("2026-01-01", 2, 5)]
    run(scenario())


def test_a_failover_counts_as_absorbed_only_with_its_address_moved(open_store):
    """The facts of one failure, in one batch either way round or in two
    batches, from the host's own seqs: absorbed once the address moved;
    without it (or with FRR missing) outgoing only; the failback nothing."""
    async def totals(store) -> list[tuple[str, int, int, int]]:
        return [(t.day, t.failures_absorbed, t.gpus, t.failures_outgoing_only)
                for t in await store.day_totals(DAY0, DAY0 + 86400)]

    async def scenario():
        async with open_store() as store:
            # h1: failover, then its address move, in one batch (the daemon's own order)
            await store.add_events("h1", "b1", [fact_row(1, "failover", DAY0 + 10, gpus=8),
                                                fact_row(2, "detoured", DAY0 + 10.002)], None, 1.0)
            # h2: the address moved before the failover event, same batch
            await store.add_events("h2", "b1", [fact_row(1, "detoured", DAY0 + 20),
                                                fact_row(2, "failover", DAY0 + 20.001, gpus=4)], None, 1.0)
            assert await totals(store) == [("2026-01-01", 2, 12, 0)]
            # h3: a failover whose address never moved (no [announce]), and its failback (no fact)
            await store.add_events("h3", "b1", [fact_row(1, "failover", DAY0 + 30, gpus=2),
                                                EventRow(2, DAY0 + 40, "rail_path", "info", "", "rail0", b"")],
                                   None, 1.0)
            assert await totals(store) == [("2026-01-01", 2, 12, 1)]
            # h4: FRR stopped; the failover and the move come, but FRR cannot announce it
            await store.add_events("h4", "b1", [fact_row(1, "frr_missing", DAY0 + 1, rail="")], None, 1.0)
            await store.add_events("h4", "b1", [fact_row(2, "failover", DAY0 + 50, gpus=8),
                                                fact_row(3, "detoured", DAY0 + 50.01)], None, 1.0)
            assert await totals(store) == [("2026-01-01", 2, 12, 2)]
            # h5: the failover in one batch, its address move in the next
            await store.add_events("h5", "b1", [fact_row(1, "failover", DAY0 + 60, gpus=1)], None, 1.0)
            assert await totals(store) == [("2026-01-01", 2, 12, 3)]
            await store.add_events("h5", "b1", [fact_row(2, "detoured", DAY0 + 60.01)], None, 2.0)
            assert await totals(store) == [("2026-01-01", 3, 13, 2)]
            # a resend changes nothing
            await store.add_events("h5", "b1", [fact_row(1, "failover", DAY0 + 60, gpus=1),
                                                fact_row(2, "detoured", DAY0 + 60.01)], None, 3.0)
            assert await totals(store) == [("2026-01-01", 3, 13, 2)]
    run(scenario())


def test_concurrent_batches_from_eight_hosts_are_all_stored(open_store):
    async def scenario():
        async with open_store() as store:
            async def host(n: int):
                for start in range(1, 301, 100):
                    await store.add_events(f"h{n}", "b1", rows(range(start, start + 100)), None, 1.0)
            await asyncio.gather(*(host(n) for n in range(8)))
            for n in range(8):
                assert await held(store, f"h{n}") == list(range(1, 301))
            assert [h.last_seq for h in await store.hosts()] == [300] * 8
            assert store.stats.events_stored == 8 * 300
    run(scenario())


batches = st.lists(
    st.tuples(st.sampled_from(["b1", "b2"]), st.integers(1, 40), st.integers(0, 12)),
    min_size=1, max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=batches, resend=st.data())
def test_any_interleaving_of_resent_batches_stores_each_event_once(open_store, batches, resend):
    sent = [(boot, list(range(first, first + length + 1))) for boot, first, length in batches]
    # Resend some batches again, anywhere in the order.
    extra = resend.draw(st.lists(st.sampled_from(sent), max_size=6))
    order = resend.draw(st.permutations(sent + extra))

    host_id = f"h{uuid.uuid4().hex}"  # every example its own host, in one database

    async def scenario():
        async with open_store() as store:
            results = [await store.add_events(host_id, boot, rows(seqs), None, 1.0) for boot, seqs in order]
            last = await store.hello(host_id, "b1", "", 2.0)
            by_boot = {boot: await held(store, host_id, boot) for boot in ("b1", "b2")}
            (host,) = await store.hosts([host_id])
            return results, last, by_boot, host

    results, last, by_boot, host = run(scenario())
    expected = {boot: sorted({s for b, seqs in sent if b == boot for s in seqs}) for boot in ("b1", "b2")}
    assert {boot: sorted(seqs) for boot, seqs in by_boot.items()} == expected  # nothing else
    assert all(len(seqs) == len(set(seqs)) for seqs in by_boot.values())  # each once
    assert last == {boot: seqs[-1] for boot, seqs in expected.items() if seqs}
    assert sum(r.stored for r in results) == sum(len(s) for s in expected.values())
    assert sum(r.stored + r.duplicates for r in results) == sum(len(seqs) for _, seqs in order)
    # What is lost is what never arrived below each boot's newest seq.
    assert host.events_lost == sum(seqs[-1] - len(seqs) for seqs in expected.values() if seqs)


def test_concurrent_writes_share_commits_and_one_failing_call_spoils_only_itself(open_store):
    """Group commit: many hosts' batches ride one COMMIT (one fsync), each
    caller is answered only after it, and a call that fails inside the group
    rolls back its own work alone."""
    def row(seq: int) -> EventRow:
        return EventRow(seq=seq, wall=1.8e9, kind="verdict", severity="info", port="eth0",
                        rail="rail0", body=b"x")

    async def main():
        async with open_store("fleet") as store:
            calls = [store.add_events(f"h{i}", "b", [row(1), row(2)], None, 1.8e9) for i in range(60)]
            # fails inside the group, after its host row was written: a body
            # that is not bytes (no caller of ours sends one; it stands for any
            # statement failing half-way through a call)
            poison = EventRow(seq=1, wall=1.8e9, kind="verdict", severity="info", port="eth0",
                              rail="rail0", body=object())
            calls.append(store.add_events("poison", "b", [poison], None, 1.8e9))
            results = await asyncio.gather(*calls, return_exceptions=True)
            assert isinstance(results[-1], TypeError), results[-1]
            assert all(r.stored == 2 for r in results[:-1])
            assert store.group_commits < 30  # 61 calls, far fewer commits
            hosts = {h.host_id: h for h in await store.hosts()}
            assert len([h for h in hosts if h.startswith("h")]) == 60
            assert "poison" not in hosts  # its own savepoint rolled back, nothing else
        async with open_store("fleet") as reopened:
            assert len(await reopened.events(EventQuery(limit=1000))) == 120
    asyncio.run(main())
