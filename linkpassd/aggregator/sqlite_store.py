"""The aggregator's embedded store: one SQLite file in WAL mode.

Why these choices:

- **Statements on the loop, waits on one worker thread.** The worker thread
  (a single-thread executor) runs only what may wait on the disk or on
  another process: BEGIN IMMEDIATE (the write lock; busy_timeout), COMMIT
  (the fsync, and the WAL checkpoints), open, migrations, retention chunks
  and close. Every other statement, the writes inside a group's transaction
  and the reads, runs on the event loop's thread. Inside our own write
  transaction on a WAL file a statement never waits for a lock, and readers
  never wait for the writer: what is left is CPU, tens of microseconds. Why
  not all on the worker (as before): Python's sqlite3 releases the GIL
  around every statement step and takes it back after, so a worker running a
  group's hundreds of statements asks for the GIL hundreds of times, and each
  time the event loop thread is busy (a burst of incoming batches) it waits
  for the loop to give it up, up to sys.getswitchinterval() (5 ms), so a
  group's statements took many times their CPU time. The stage timings
  (`observe`: store_queue, store_begin, store_statements, store_commit;
  the aggregator exports them as linkpass_aggregator_stage_seconds, and
  labs/bench/aggregator reports them per run) show where a write's time
  goes. The connection has one user at a time: the loop uses it only while
  no worker step holds it.
- **WAL + synchronous=FULL.** The server acks an event once `add_events`
  returned, and the agent then deletes it from its spool: an ack is a promise
  that survives *anything*, a power cut included. In WAL mode
  synchronous=NORMAL fsyncs only at checkpoints, so a committed transaction
  survives a crash of the process (SIGKILL: the WAL is in the page cache)
  but not of the machine: the last commits can roll back after a power cut,
  and those events would be gone from both sides. synchronous=FULL fsyncs the
  WAL at every commit, which is exactly "acked only after it is durable".
  The price is one fsync per commit, so writes are committed in groups:
  every write call (hello, inventory, report, heartbeat, events) queues its
  work; once the worker holds the write lock, the loop runs all that is
  queued (up to GROUP_MAX) in that one transaction, one savepoint per call (a
  call that fails rolls back only its own work), the worker COMMITs, and then
  every caller is answered. Under load one fsync covers
  hundreds of hosts' batches; alone, a call commits at once. No caller is
  answered before the COMMIT that holds its work.
- **Exactly once.** Events are UNIQUE(host_id, boot_id, seq) and go in with
  INSERT OR IGNORE, so a resend stores nothing twice. `boots` keeps, per boot,
  the newest seq accounted for, what was counted lost, and the newest seq
  retention deleted (`floor_seq`): a resend of an event already pruned is a
  duplicate, not a new arrival.
- **Savings outlive events.** Each event that is a savings fact (a
  failover, a move of a rail's address, an FRR report: savings.Fact) is
  also written to `absorbed` (same key), which retention does not touch:
  the page's per-day totals stay right after the events themselves are
  gone. Whether a failover was absorbed (both directions) is judged when
  the totals are read (savings.count_days), so the facts of one failure
  may arrive in any order and batch.
- **Retention in chunks.** `prune` deletes at most PRUNE_CHUNK events per
  transaction, one worker job each, so writers queued meanwhile run between
  chunks and the write lock is never held for long.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from linkpassd.aggregator import bounds
from linkpassd.aggregator.savings import FactRow, count_days, day_of
from linkpassd.aggregator.store import (
    AddResult,
    DayTotal,
    EventQuery,
    EventRow,
    HostRow,
    OutOfOrder,
    StoredEvent,
    StoreError,
    StoreStats,
)

T = TypeVar("T")

PRUNE_CHUNK = 2000  # events deleted per transaction by prune
BUSY_TIMEOUT_MS = 5000  # another process holding the file (a backup, sqlite3 CLI)
MAX_SEQ = bounds.MAX_SEQ  # far below SQLite's INTEGER (2**63 - 1); proto seqs are uint64
INT64_MAX = 2**63 - 1  # sums and counts are clamped here: a lost count can never overflow a read
WRITE_SECONDS_KEPT = 1024  # StoreStats.write_seconds keeps the newest this many
GROUP_MAX = 500  # write calls per group commit: bounds the loop's time in one group's statements

# Schema migrations, applied in order, each in one transaction; PRAGMA
# user_version is how many have been applied. Append only: never edit a step
# that has shipped, add one.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # 1: the first schema
        """CREATE TABLE hosts (
             host_id TEXT PRIMARY KEY,
             boot_id TEXT NOT NULL DEFAULT '',
             version TEXT NOT NULL DEFAULT '',
             first_seen REAL NOT NULL,
             last_seen REAL NOT NULL,
             inventory BLOB NOT NULL DEFAULT x'',
             report BLOB NOT NULL DEFAULT x'')""",
        """CREATE TABLE boots (
             host_id TEXT NOT NULL,
             boot_id TEXT NOT NULL,
             last_seq INTEGER NOT NULL DEFAULT 0,
             lost INTEGER NOT NULL DEFAULT 0,
             floor_seq INTEGER NOT NULL DEFAULT 0,
             PRIMARY KEY (host_id, boot_id)) WITHOUT ROWID""",
        """CREATE TABLE events (
             id INTEGER PRIMARY KEY AUTOINCREMENT,
             host_id TEXT NOT NULL,
             boot_id TEXT NOT NULL,
             seq INTEGER NOT NULL,
             wall REAL NOT NULL,
             kind TEXT NOT NULL,
             severity TEXT NOT NULL,
             port TEXT NOT NULL,
             rail TEXT NOT NULL,
             body BLOB NOT NULL,
             stored_at REAL NOT NULL,
             UNIQUE (host_id, boot_id, seq))""",
        # An index on (x) holds (x, id): equality on x comes out in id order,
        # which is what every events() query wants (ORDER BY id, id > after).
        "CREATE INDEX events_by_host ON events (host_id)",
        "CREATE INDEX events_by_host_port ON events (host_id, port)",
        "CREATE INDEX events_by_port ON events (port)",
        "CREATE INDEX events_by_kind ON events (kind)",
        "CREATE INDEX events_by_wall ON events (wall)",  # time filters and retention
        """CREATE TABLE absorbed (
             host_id TEXT NOT NULL,
             boot_id TEXT NOT NULL,
             seq INTEGER NOT NULL,
             wall REAL NOT NULL,
             day TEXT NOT NULL,
             gpus INTEGER NOT NULL,
             PRIMARY KEY (host_id, boot_id, seq)) WITHOUT ROWID""",
        "CREATE INDEX absorbed_by_wall ON absorbed (wall)",
    ),
    (  # 2: absorbed keeps the savings facts (savings.Fact): failovers, address moves, FRR reports.
        # Rows from schema 1 are failovers whose rail was not kept: no address
        # move can be paired with them, so they count as outgoing only.
        "ALTER TABLE absorbed ADD COLUMN rail TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE absorbed ADD COLUMN fact TEXT NOT NULL DEFAULT 'failover'",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)

_EVENT_COLUMNS = "id, host_id, boot_id, seq, wall, kind, port, body, stored_at"

# day_totals: every fact of the boots with a failover in [?, ?): an FRR
# report long before the range still says FRR's state, and a failover just
# outside it may have taken an address move (savings.judge_boot).
FACTS_SQL = (
    "SELECT host_id, boot_id, seq, wall, day, gpus, rail, fact FROM absorbed "
    "WHERE (host_id, boot_id) IN (SELECT host_id, boot_id FROM absorbed "
    "                             WHERE fact = 'failover' AND wall >= ? AND wall < ?)")


class SqliteStore:
    """`Store` on one SQLite file. Create, `await open()`, use, `await close()`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.stats = StoreStats()
        self._conn: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._accepting = False  # open, and not closing: calls are taken
        # All of the following belong to the event loop's thread (no locks):
        # write calls for the next group commit; reads and worker jobs
        # waiting for the connection (in order); whether a step on the
        # worker holds the connection; close() waiting for all that to end.
        self._group: list[tuple[Callable[..., Any], tuple, asyncio.Future, float]] = []
        self._waiting: deque[tuple[bool, Callable[..., Any], tuple, asyncio.Future]] = deque()
        self._busy = False
        self._pump_scheduled = False
        self._idle_waiters: list[asyncio.Future] = []
        self.group_commits = 0  # transactions committed by group commit (tests, metrics)
        # Stage timings (metrics.STAGES: store_queue, store_begin,
        # store_statements, store_commit) and group sizes; the server sets
        # these to its metrics. Called on the loop.
        self.observe: Callable[[str, float], None] = _ignore
        self.observe_group: Callable[[int], None] = _ignore_size
        self._step_started = 0.0

    # -- plumbing ---------------------------------------------------------
    #
    # Who runs what (see "Statements on the loop" in the module docstring):
    # the event loop runs the statements, the worker thread only what may
    # wait on the disk or another process: BEGIN IMMEDIATE (the write lock,
    # busy_timeout), COMMIT (the fsync, checkpoints), open, migrations,
    # retention chunks, close. One user of the connection at a time: the
    # loop touches it only while no worker step holds it (`_busy`).

    def _check_open(self) -> None:
        if not self._accepting or self._executor is None:
            raise StoreError(f"store {self.path} is not open")

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """A read: `fn(conn, *args)` on the loop, once the connection is
        free; sqlite's errors become StoreError naming the file."""
        return await self._queue(False, fn, args)

    async def _job(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(conn, *args)` on the worker thread, in its own turn (a write
        with its own transaction and fsync: retention)."""
        return await self._queue(True, fn, args)

    async def _queue(self, on_worker: bool, fn: Callable[..., T], args: tuple) -> T:
        self._check_open()
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._waiting.append((on_worker, fn, args, future))
        self._kick()
        return await future

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        conn = self._conn
        if conn is None:
            raise StoreError(f"store {self.path} is not open")
        try:
            return fn(conn, *args)
        except (sqlite3.Error, OverflowError) as e:  # OverflowError: an int beyond SQLite's 64 bits
            if conn.in_transaction:
                try:
                    conn.rollback()
                except sqlite3.Error:
                    pass
            raise StoreError(f"database {self.path}: {e}") from None

    async def _grouped(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(conn, *args)` in the next group commit; returns once that
        commit is durable (see the module docstring)."""
        self._check_open()
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._group.append((fn, args, future, time.perf_counter()))
        self._kick()
        return await future

    def _kick(self) -> None:
        """Pump soon (not at once: calls made in the same loop turn join the group)."""
        if not self._busy and not self._pump_scheduled:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        """On the loop: hand the free connection to what waits, in order:
        reads and jobs first (a read runs here and now), then the group."""
        self._pump_scheduled = False
        while not self._busy:
            if self._waiting:
                on_worker, fn, args, future = self._waiting.popleft()
                if future.cancelled():  # the caller went away before its turn: nothing done
                    continue
                if on_worker:
                    self._busy = True
                    self._on_worker(functools.partial(self._call, fn, *args),
                                    functools.partial(self._job_done, future))
                else:
                    try:
                        _settle(future, True, self._call(fn, *args))
                    except Exception as e:  # noqa: BLE001 - handed to that caller
                        _settle(future, False, e)
            elif self._group:
                self._busy = True
                self._step_started = time.perf_counter()
                self._on_worker(self._begin_sync, self._begun)
            else:
                for waiter in self._idle_waiters:
                    if not waiter.done():
                        waiter.set_result(None)
                self._idle_waiters.clear()
                return

    def _on_worker(self, fn: Callable[[], Any], then: Callable[[asyncio.Future], None]) -> None:
        """fn() on the worker thread; then(its future) back on the loop."""
        assert self._executor is not None  # close() waits for the pump to be idle first
        asyncio.get_running_loop().run_in_executor(self._executor, fn).add_done_callback(then)

    def _job_done(self, caller: asyncio.Future, step: asyncio.Future) -> None:
        self._busy = False
        error = _step_error(step)
        _settle(caller, error is None, step.result() if error is None else error)
        self._kick()

    def _begin_sync(self) -> None:
        """On the worker: take the write lock (may wait busy_timeout for
        another process holding the file)."""
        conn = self._conn
        if conn is None:
            raise StoreError(f"store {self.path} is not open")
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            raise StoreError(f"database {self.path}: {e}") from None

    def _begun(self, step: asyncio.Future) -> None:
        """On the loop, in the open transaction: every queued call (up to
        GROUP_MAX), each in its own savepoint (`_write`), then the COMMIT on
        the worker."""
        group, self._group = self._group[:GROUP_MAX], self._group[GROUP_MAX:]
        started = time.perf_counter()
        self.observe("store_begin", started - self._step_started)
        error = _step_error(step)
        if error is not None:
            self._busy = False
            for _fn, _args, future, _queued in group:
                _settle(future, False, error)
            self._kick()
            return
        conn = self._conn
        outcomes: list[tuple[bool, Any]] = []
        observe = self.observe
        for fn, args, _future, queued in group:
            observe("store_queue", started - queued)
            try:
                outcomes.append((True, fn(conn, *args)))
            except (sqlite3.Error, OverflowError) as e:
                outcomes.append((False, StoreError(f"database {self.path}: {e}")))
            except Exception as e:  # noqa: BLE001 - handed to that caller, not lost
                outcomes.append((False, e))
        self._step_started = time.perf_counter()
        observe("store_statements", self._step_started - started)
        self.observe_group(len(group))
        self._on_worker(self._commit_sync, functools.partial(self._committed, group, outcomes))

    def _commit_sync(self) -> None:
        """On the worker: COMMIT (the fsync); a failed one rolls back."""
        conn = self._conn
        if conn is None:
            raise StoreError(f"store {self.path} is not open")
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as e:
            if conn.in_transaction:
                try:
                    conn.rollback()
                except sqlite3.Error:
                    pass
            raise StoreError(f"database {self.path}: {e}") from None

    def _committed(self, group: list[tuple[Callable[..., Any], tuple, asyncio.Future, float]],
                   outcomes: list[tuple[bool, Any]], step: asyncio.Future) -> None:
        """On the loop: answer every caller of the group, only now."""
        self._busy = False
        self.observe("store_commit", time.perf_counter() - self._step_started)
        error = _step_error(step)
        if error is None:
            self.group_commits += 1
        for (_fn, _args, future, _queued), (ok, value) in zip(group, outcomes):
            _settle(future, ok and error is None, value if error is None else error)
        self._kick()

    @staticmethod
    def _write(conn: sqlite3.Connection, fn: Callable[[], T]) -> T:
        """One write transaction: BEGIN IMMEDIATE (takes the write lock up
        front, so it never fails half-way on a lock upgrade), COMMIT before
        returning; anything raised rolls it back. Inside a group commit
        (already in a transaction) it is a savepoint instead: a failing call
        undoes only its own work, and the group's COMMIT makes it durable."""
        if conn.in_transaction:
            conn.execute("SAVEPOINT call")
            try:
                result = fn()
            except BaseException:
                conn.execute("ROLLBACK TO call")
                conn.execute("RELEASE call")
                raise
            conn.execute("RELEASE call")
            return result
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn()
        except BaseException:
            conn.rollback()
            raise
        conn.execute("COMMIT")
        return result

    # -- lifecycle ----------------------------------------------------------

    async def open(self) -> None:
        if self._executor is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agg-sqlite")
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._open_sync)
        except BaseException:
            self._executor.shutdown(wait=True)
            self._executor = None
            raise
        self._accepting = True

    def _open_sync(self) -> None:
        try:
            # isolation_level=None: no implicit transactions; we BEGIN/COMMIT ourselves.
            # check_same_thread=False: the loop and the worker take turns (never both at once).
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000,
                                   check_same_thread=False)
        except sqlite3.Error as e:
            raise StoreError(f"database {self.path}: cannot open: {e}") from None
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal" and self.path != ":memory:":
                raise StoreError(f"database {self.path}: cannot use WAL mode (journal_mode is {mode})")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            self._migrate(conn)
        except sqlite3.Error as e:
            conn.close()
            raise StoreError(f"database {self.path}: {e}") from None
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(f"database {self.path} has schema version {version}, newer than this "
                             f"release's {SCHEMA_VERSION}: use a newer linkpass-aggregator "
                             f"(or another database file)")
        for number in range(version + 1, SCHEMA_VERSION + 1):
            def step(number: int = number) -> None:
                for statement in MIGRATIONS[number - 1]:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version={number}")
            self._write(conn, step)

    async def close(self) -> None:
        """New calls are refused at once; those already made finish first."""
        if self._executor is None:
            return
        self._accepting = False
        loop = asyncio.get_running_loop()
        if self._busy or self._group or self._waiting or self._pump_scheduled:
            idle = loop.create_future()
            self._idle_waiters.append(idle)
            self._kick()
            await idle
        executor, self._executor = self._executor, None
        try:
            await loop.run_in_executor(executor, self._close_sync)
        finally:
            executor.shutdown(wait=True)

    def _close_sync(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    async def schema_version(self) -> int:
        return await self._run(lambda c: c.execute("PRAGMA user_version").fetchone()[0])

    # -- hosts ----------------------------------------------------------------

    async def hello(self, host_id: str, boot_id: str, version: str, now: float) -> dict[str, int]:
        return await self._grouped(self._hello, host_id, boot_id, version, now)

    def _hello(self, conn: sqlite3.Connection, host_id: str, boot_id: str, version: str,
               now: float) -> dict[str, int]:
        def tx() -> dict[str, int]:
            conn.execute(
                "INSERT INTO hosts (host_id, boot_id, version, first_seen, last_seen) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (host_id) DO UPDATE SET "
                "boot_id = excluded.boot_id, version = excluded.version, "
                "last_seen = MAX(last_seen, excluded.last_seen)",
                (host_id, boot_id, version, now, now))
            rows = conn.execute("SELECT boot_id, last_seq FROM boots WHERE host_id = ?", (host_id,))
            return {boot: seq for boot, seq in rows}
        return self._write(conn, tx)

    async def set_inventory(self, host_id: str, inventory: bytes, now: float) -> None:
        await self._grouped(self._set_host_column, "inventory", host_id, inventory, now)

    async def set_report(self, host_id: str, report: bytes, now: float) -> None:
        await self._grouped(self._set_host_column, "report", host_id, report, now)

    async def touch(self, host_id: str, now: float) -> None:
        await self.touch_many({host_id: now})

    async def touch_many(self, seen: dict[str, float]) -> None:
        if seen:
            await self._grouped(self._touch_many, sorted(seen.items()))

    def _touch_many(self, conn: sqlite3.Connection, seen: list[tuple[str, float]]) -> None:
        def tx() -> None:
            conn.executemany("INSERT INTO hosts (host_id, first_seen, last_seen) VALUES (?, ?, ?) "
                             "ON CONFLICT (host_id) DO UPDATE SET "
                             "last_seen = MAX(last_seen, excluded.last_seen)",
                             [(host, now, now) for host, now in seen])
        self._write(conn, tx)

    def _set_host_column(self, conn: sqlite3.Connection, column: str, host_id: str, value: bytes,
                         now: float) -> None:
        assert column in ("inventory", "report")  # never from outside: part of the SQL text
        def tx() -> None:
            self._ensure_host(conn, host_id, now)
            conn.execute(f"UPDATE hosts SET {column} = ?, last_seen = MAX(last_seen, ?) "
                         "WHERE host_id = ?", (bytes(value), now, host_id))
        self._write(conn, tx)

    @staticmethod
    def _ensure_host(conn: sqlite3.Connection, host_id: str, now: float, boot_id: str = "") -> None:
        """A host row for a host seen before its hello (the server says hello
        first; the store does not depend on it)."""
        conn.execute("INSERT OR IGNORE INTO hosts (host_id, boot_id, first_seen, last_seen) "
                     "VALUES (?, ?, ?, ?)", (host_id, boot_id, now, now))

    async def hosts(self, host_ids: Sequence[str] = ()) -> list[HostRow]:
        return await self._run(self._hosts, list(host_ids))

    @staticmethod
    def _hosts(conn: sqlite3.Connection, host_ids: list[str]) -> list[HostRow]:
        sql = ("SELECT h.host_id, h.boot_id, h.version, h.first_seen, h.last_seen, h.inventory, "
               "h.report, COALESCE(b.last_seq, 0), "
               # TOTAL, not SUM: a float that cannot overflow (SUM raised "integer
               # overflow" on two boots of 2**63 lost, and every read of the fleet failed).
               "(SELECT CAST(MIN(TOTAL(lost), 9223372036854775807.0) AS INTEGER) FROM boots l "
               "WHERE l.host_id = h.host_id) "
               "FROM hosts h LEFT JOIN boots b ON b.host_id = h.host_id AND b.boot_id = h.boot_id")
        params: tuple[Any, ...] = ()
        if host_ids:
            # json_each: any number of ids in one parameter (no variable-count limit).
            sql += " WHERE h.host_id IN (SELECT value FROM json_each(?))"
            params = (json.dumps(host_ids),)
        sql += " ORDER BY h.host_id"
        return [HostRow(host_id=r[0], boot_id=r[1], version=r[2], first_seen=r[3], last_seen=r[4],
                        inventory=bytes(r[5]), report=bytes(r[6]), last_seq=r[7], events_lost=r[8])
                for r in conn.execute(sql, params)]

    # -- events ---------------------------------------------------------------

    async def add_events(self, host_id: str, boot_id: str, events: Sequence[EventRow],
                         gap: tuple[int, int] | None, now: float) -> AddResult:
        events = list(events)
        gap = _checked(events, gap)  # before any I/O: a refused batch stores nothing
        started = time.monotonic()
        result = await self._grouped(self._add_events, host_id, boot_id, events, gap, now)
        stats = self.stats
        stats.events_stored += result.stored
        stats.events_duplicate += result.duplicates
        stats.events_lost += result.lost
        stats.write_seconds.append(time.monotonic() - started)
        if len(stats.write_seconds) > 2 * WRITE_SECONDS_KEPT:
            del stats.write_seconds[:-WRITE_SECONDS_KEPT]
        return result

    def _add_events(self, conn: sqlite3.Connection, host_id: str, boot_id: str,
                    events: list[EventRow], gap: tuple[int, int] | None, now: float) -> AddResult:
        """Accounting, with prev = the boot's newest seq accounted for before
        this batch (every seq above it is not held):
        - events at or below floor_seq were pruned by retention: duplicates;
        - the rest go in with INSERT OR IGNORE; those ignored are duplicates;
        - top = the newest seq this batch covers (its last event, or the end
          of its declared gap); every seq in (prev, top] the batch does not
          carry is lost (dropped by the agent, or a hole);
        - a new event at or below prev fills a hole counted lost before: the
          boot's lost count (HostRow.events_lost) goes down by one for each;
          AddResult.lost and StoreStats.events_lost count only newly lost.
        last_seq becomes max(prev, top): what the agent may drop."""
        def tx() -> AddResult:
            # One statement each for the host's row and the boot's (an upsert
            # that returns the row): a group commit runs these for hundreds
            # of calls on the loop, and each statement is tens of microseconds.
            conn.execute("INSERT INTO hosts (host_id, boot_id, first_seen, last_seen) VALUES (?, ?, ?, ?) "
                         "ON CONFLICT (host_id) DO UPDATE SET last_seen = MAX(last_seen, excluded.last_seen)",
                         (host_id, boot_id, now, now))
            prev, lost_before, floor = conn.execute(
                "INSERT INTO boots (host_id, boot_id) VALUES (?, ?) "
                "ON CONFLICT (host_id, boot_id) DO UPDATE SET host_id = excluded.host_id "
                "RETURNING last_seq, lost, floor_seq", (host_id, boot_id)).fetchall()[0]  # all: the statement ends here
            fresh = [e for e in events if e.seq > floor]
            before = conn.total_changes
            conn.executemany(
                "INSERT OR IGNORE INTO events (host_id, boot_id, seq, wall, kind, severity, port, rail, "
                "body, stored_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(host_id, boot_id, e.seq, e.wall, e.kind, e.severity, e.port, e.rail, bytes(e.body), now)
                 for e in fresh])
            stored = conn.total_changes - before
            facts = [(host_id, boot_id, e.seq, e.wall, day_of(e.wall), e.gpus, e.rail, e.fact)
                     for e in fresh if e.fact]
            if facts:
                conn.executemany("INSERT OR IGNORE INTO absorbed (host_id, boot_id, seq, wall, day, gpus, rail, fact) "
                                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", facts)
            top = max(events[-1].seq if events else 0, gap[1] if gap else 0)
            above = sum(1 for e in events if e.seq > prev)
            newly_lost = (top - prev) - above if top > prev else 0
            filled = stored - above  # new arrivals at or below prev: holes filled late
            lost = min(INT64_MAX, max(0, lost_before + newly_lost - filled))
            last_seq = max(prev, top)
            conn.execute("UPDATE boots SET last_seq = ?, lost = ? WHERE host_id = ? AND boot_id = ?",
                         (last_seq, lost, host_id, boot_id))
            # `lost` reports only what this batch newly counted (never negative:
            # it feeds a Prometheus counter); a late fill lowers the boot's total.
            return AddResult(stored=stored, duplicates=len(events) - stored, last_seq=last_seq,
                             lost=newly_lost)
        return self._write(conn, tx)

    async def events(self, query: EventQuery) -> list[StoredEvent]:
        if query.limit < 1:
            raise StoreError(f"event query limit must be 1 or more, not {query.limit}")
        return await self._run(self._events, query)

    @staticmethod
    def _events(conn: sqlite3.Connection, query: EventQuery) -> list[StoredEvent]:
        where = ["id > ?"]
        params: list[Any] = [min(query.after_id, MAX_SEQ)]  # a uint64 cursor past any id: nothing after
        for column, value in (("host_id", query.host_id), ("port", query.port), ("kind", query.kind)):
            if value:
                where.append(f"{column} = ?")
                params.append(value)
        if query.since is not None:
            where.append("wall >= ?")
            params.append(query.since)
        if query.until is not None:
            where.append("wall < ?")
            params.append(query.until)
        params.append(query.limit)
        sql = (f"SELECT {_EVENT_COLUMNS} FROM events WHERE {' AND '.join(where)} "
               "ORDER BY id LIMIT ?")
        return [StoredEvent(id=r[0], host_id=r[1], boot_id=r[2], seq=r[3], wall=r[4], kind=r[5],
                            port=r[6], body=bytes(r[7]), stored_at=r[8])
                for r in conn.execute(sql, params)]

    async def day_totals(self, since: float, until: float) -> list[DayTotal]:
        return await self._run(self._day_totals, since, until)

    @staticmethod
    def _day_totals(conn: sqlite3.Connection, since: float, until: float) -> list[DayTotal]:
        """The failovers in range and every other fact of their boots, judged by savings.count_days."""
        rows = conn.execute(FACTS_SQL, (since, until))
        return count_days((FactRow(host_id=h, boot_id=b, seq=seq, wall=wall, rail=rail, fact=fact,
                                   gpus=gpus, day=day)
                           for h, b, seq, wall, day, gpus, rail, fact in rows), since, until)

    async def prune(self, before: float) -> int:
        """Chunk by chunk, each its own worker job and transaction, so what
        callers queued meanwhile runs between chunks."""
        deleted = 0
        while True:
            n = await self._job(self._prune_chunk, before, PRUNE_CHUNK)
            deleted += n
            if n < PRUNE_CHUNK:
                return deleted

    def _prune_chunk(self, conn: sqlite3.Connection, before: float, chunk: int) -> int:
        def tx() -> int:
            rows = conn.execute("DELETE FROM events WHERE id IN "
                                "(SELECT id FROM events WHERE wall < ? LIMIT ?) "
                                "RETURNING host_id, boot_id, seq", (before, chunk)).fetchall()
            floors: dict[tuple[str, str], int] = {}
            for host_id, boot_id, seq in rows:
                floors[(host_id, boot_id)] = max(seq, floors.get((host_id, boot_id), 0))
            conn.executemany("UPDATE boots SET floor_seq = MAX(floor_seq, ?) "
                             "WHERE host_id = ? AND boot_id = ?",
                             [(seq, h, b) for (h, b), seq in floors.items()])
            return len(rows)
        return self._write(conn, tx)


def _ignore(_stage: str, _seconds: float) -> None:
    pass


def _ignore_size(_calls: int) -> None:
    pass


def _step_error(step: asyncio.Future) -> BaseException | None:
    """What a worker step raised (None: it returned)."""
    if step.cancelled():  # the loop is shutting down under us
        return StoreError("the store's worker step was cancelled")
    return step.exception()


def _settle(future: asyncio.Future, ok: bool, value: Any) -> None:
    if future.cancelled():  # the caller went away; the work is committed regardless
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


def _checked(events: list[EventRow], gap: tuple[int, int] | None) -> tuple[int, int] | None:
    """The batch's gap (None for none or (0, 0)), once the batch is in order:
    seqs 1.. strictly increasing, the gap a range below the first event."""
    previous = 0
    for event in events:
        if not 1 <= event.seq <= MAX_SEQ:
            raise OutOfOrder(f"event seq {event.seq} is out of range (1..{MAX_SEQ})")
        if event.seq <= previous:
            raise OutOfOrder(f"event seqs must strictly increase within a batch: seq {event.seq} "
                             f"follows {previous}")
        previous = event.seq
    if gap is None or gap == (0, 0):
        return None
    first, last = gap
    if not 1 <= first <= last <= MAX_SEQ:
        raise OutOfOrder(f"gap {first}..{last} is not a range of seqs (1 <= first <= last)")
    if events and last >= events[0].seq:
        raise OutOfOrder(f"gap {first}..{last} does not end before the batch's first seq {events[0].seq}")
    return gap
