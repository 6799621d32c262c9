"""The aggregator's store on PostgreSQL (asyncpg): what several replicas share.

Same results as the SQLite store for the same calls (sqlite_store.py explains
the accounting: exactly once by UNIQUE(host_id, boot_id, seq), lost seqs and
late fills, the retention floor, the savings facts that outlive events), plus
the `SharedStore` methods (store.py) replicas coordinate through. Why it is
built this way:

- **Durable before answering.** Every connection runs with
  synchronous_commit = on (whatever the database's default), and every call
  returns only after its COMMIT: an acked event survives a crash of the
  database machine as it does with SQLite's synchronous=FULL.
- **Event ids a follower never skips, with no lock on the event path.** An
  event's id is its inserting transaction's xid8 shifted left 16 bits plus
  the event's rank in that transaction's one INSERT (pg_schema.TX_ID_BASE),
  so id order is (transaction id, rank) order. A read returns only ids below
  the horizon of its own snapshot, pg_snapshot_xmin(pg_current_snapshot())
  shifted the same way (pg_schema.HORIZON): every transaction with a smaller
  xid has ended and every one still to come gets a larger one, so the events
  below the horizon are final, and a cursor that moves only over them never
  passes an id that could still commit. docs/aggregator.md gives the
  argument in full, and why ids from a sequence with the xid beside them
  would not do. A read that stops at the horizon while later events have
  committed (an older transaction still running: another replica's group,
  a heartbeat, a prune) wakes the CHANNEL_EVENTS listeners again shortly
  (HELD_RETRY_S, doubling while it lasts), since that older transaction may
  never notify.
- **Group commit, one statement.** Concurrent `add_events` calls of this
  process are queued and stored together by one statement (GROUP_SQL: the
  hosts and boots rows, the events with their ids, the savings rows), then
  one UPDATE of the boots that moved and one durable COMMIT; each caller is
  answered after it. Exactly once is UNIQUE(host_id, boot_id, seq) with ON
  CONFLICT DO NOTHING; a seq sent twice within one group is stored once and
  counted for the first call that carried it. A group that fails (one
  call's bad data, a deadlock with another replica's group) is retried call
  by call, so a call that fails fails alone. Rows shared between replicas
  (hosts, boots) are locked in key order; prune locks a chunk's boots rows
  before deleting, so a resend racing it is counted against the new floor.
  CHANNEL_EVENTS is notified after the commit, in a transaction of its own
  (see `_announce_events` for why not inside), at most one in flight.
  `PgStore(event_lock=True)` keeps schema 1's path (one cluster-wide
  advisory lock, statements per call), for the bench's side-by-side only.
- **Connections.** A pool for statements; one dedicated connection for
  LISTEN (notifications arrive only on a connection that stays open); one for
  leadership (`try_lead`: session advisory locks live as long as their
  connection, and PostgreSQL frees them when it drops). A lost LISTEN
  connection is re-established in the background, after which every callback
  is called once with payload "" (notifications sent meanwhile are gone:
  callers read again). A lost leadership connection is lost leadership:
  `try_lead` says False once and connects again on its next call.
- **Migrations** (pg_schema.py) run under a session advisory lock, so
  replicas starting together migrate once; a newer schema is refused.
- Errors from the database or the connection become StoreError naming the
  database (password hidden) and the operation.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import structlog

from linkpassd.aggregator import pg_schema
from linkpassd.aggregator.pg_schema import (
    EVENTS_LOCK,
    FENCE_SPACE,
    HORIZON,
    LEAD_SPACE,
    LOCK_SPACE,
    MAX_TX_EVENTS,
    MIGRATION_LOCK,
    role_key,
)
from linkpassd.aggregator.savings import FactRow, count_days, day_of
from linkpassd.aggregator.sqlite_store import MAX_SEQ
from linkpassd.aggregator.sqlite_store import _checked as checked_batch
from linkpassd.aggregator.store import (
    CHANNEL_EVENTS,
    AddResult,
    DayTotal,
    EventQuery,
    EventRow,
    FencePort,
    HostRow,
    PendingCommand,
    Regrant,
    StoredEvent,
    StoreError,
    StoreStats,
)
from linkpassd.config.checks import redacted_dsn

log = structlog.get_logger("linkpassd.aggregator.pg_store")

PRUNE_CHUNK = 2000  # events deleted per transaction by prune
POOL_SIZE = 10  # statement connections (plus one LISTEN and one leadership connection)
CONNECT_TIMEOUT_S = 10.0
STATEMENT_TIMEOUT_S = 60.0  # client side: a call that hangs longer fails (StoreError) instead
CLOSE_TIMEOUT_S = 10.0
RECONNECT_MAX_S = 5.0  # LISTEN reconnection backoff ceiling
WRITE_SECONDS_KEPT = 1024
GROUP_MAX_CALLS = 500  # add_events calls per group commit
GROUP_MAX_EVENTS = 20_000  # and events (bounds one transaction's length; <= MAX_TX_EVENTS)
HELD_RETRY_S = 0.01  # a read held at the horizon reads again after this, doubling while held,
HELD_RETRY_MAX_S = 1.0  # up to this
SERVER_SETTINGS = {"synchronous_commit": "on", "application_name": "linkpass-aggregator"}

# What the driver raises for the database or the connection; a caller's own
# bug (a TypeError, say) passes through as itself.
DB_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)

_EVENT_COLUMNS = "id, host_id, boot_id, seq, wall, kind, port, body, stored_at"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc).strip() or type(exc).__name__


def _count(status: str) -> int:
    """Rows affected, from a command tag like "UPDATE 3" or "INSERT 0 3"."""
    tail = status.rpartition(" ")[2]
    return int(tail) if tail.isdigit() else 0


@dataclass
class _AddCall:
    """One add_events call, its columns ready for unnest (built before any I/O)."""

    host_id: str
    boot_id: str
    events: list[EventRow]
    gap: tuple[int, int] | None
    now: float
    columns: tuple[list, ...]  # seq, wall, kind, severity, port, rail, body

    @classmethod
    def of(cls, host_id: str, boot_id: str, events: list[EventRow], gap: tuple[int, int] | None,
           now: float) -> _AddCall:
        columns = ([e.seq for e in events], [float(e.wall) for e in events], [e.kind for e in events],
                   [e.severity for e in events], [e.port for e in events], [e.rail for e in events],
                   [bytes(e.body) for e in events])
        return cls(host_id, boot_id, events, gap, float(now), columns)


class PgStore:
    """`SharedStore` on PostgreSQL. Create, `await open()`, use, `await close()`."""

    shared = True

    def __init__(self, dsn: str, *, pool_size: int = POOL_SIZE, event_lock: bool = False) -> None:
        """`event_lock`: store events the old way (schema 1's cluster-wide
        lock, statements per call); for labs/bench/pg_store.py only."""
        self.dsn = dsn
        self.event_lock = event_lock
        self.label = redacted_dsn(dsn)
        self.pool_size = pool_size
        self.stats = StoreStats()
        self.group_commits = 0  # transactions committed by the add_events group (tests, metrics)
        self._pool: asyncpg.Pool | None = None
        self._closing = False
        self._queue: list[tuple[_AddCall, asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None
        self._announcer: asyncio.Task | None = None
        self._announce_due = False
        self._held_timer: asyncio.TimerHandle | None = None
        self._held_delay = HELD_RETRY_S
        self._listeners: dict[str, list[Callable[[str], None]]] = {}
        self._listen_conn: asyncpg.Connection | None = None
        self._listen_lock = asyncio.Lock()
        self._relisten: asyncio.Task | None = None
        self._lead_conn: asyncpg.Connection | None = None
        self._lead_lock = asyncio.Lock()
        self._leading: set[str] = set()
        self._lost: set[str] = set()  # roles whose loss try_lead has not said yet

    # -- plumbing ---------------------------------------------------------

    def _error(self, what: str, exc: BaseException) -> StoreError:
        return StoreError(f"database {self.label}: {what}: {_describe(exc)}")

    def _open_pool(self) -> asyncpg.Pool:
        if self._pool is None or self._closing:
            raise StoreError(f"store {self.label} is not open")
        return self._pool

    async def _run(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """`await fn(conn, *args)` on a pooled connection; the driver's errors
        become StoreError naming the database and `what`."""
        pool = self._open_pool()
        try:
            async with pool.acquire() as conn:
                return await fn(conn, *args)
        except DB_ERRORS as exc:
            raise self._error(what, exc) from None

    async def _execute(self, what: str, sql: str, *args: Any) -> str:
        return await self._run(what, lambda conn: conn.execute(sql, *args))

    async def _fetch(self, what: str, sql: str, *args: Any) -> list[asyncpg.Record]:
        return await self._run(what, lambda conn: conn.fetch(sql, *args))

    async def _connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT_S, command_timeout=STATEMENT_TIMEOUT_S,
                                     server_settings=SERVER_SETTINGS)

    # -- lifecycle ----------------------------------------------------------

    async def open(self) -> None:
        if self._pool is not None:
            return
        self._closing = False
        try:
            pool = await asyncpg.create_pool(
                self.dsn, min_size=1, max_size=self.pool_size, timeout=CONNECT_TIMEOUT_S,
                command_timeout=STATEMENT_TIMEOUT_S, server_settings=SERVER_SETTINGS)
        except (*DB_ERRORS, ValueError) as exc:
            raise StoreError(f"database {self.label}: cannot connect: {_describe(exc)}") from None
        try:
            async with pool.acquire() as conn:
                await self._migrate(conn)
        except DB_ERRORS as exc:
            await pool.close()
            raise self._error("migrating the schema", exc) from None
        except BaseException:
            await pool.close()
            raise
        self._pool = pool

    async def _migrate(self, conn: asyncpg.Connection) -> None:
        """Bring the schema to SCHEMA_VERSION, one step per transaction, under
        the migration lock (other replicas wait, then find nothing to do)."""
        target = pg_schema.SCHEMA_VERSION
        await conn.execute("SELECT pg_advisory_lock($1, $2)", LOCK_SPACE, MIGRATION_LOCK)
        try:
            await conn.execute(pg_schema.VERSION_TABLE)
            version = await conn.fetchval("SELECT version FROM linkpass_schema") or 0
            if version > target:
                raise StoreError(f"database {self.label} has schema version {version}, newer than this "
                                 f"release's {target}: use a newer linkpass-aggregator (or another database)")
            for number in range(version + 1, target + 1):
                async with conn.transaction():
                    for statement in pg_schema.MIGRATIONS[number - 1]:
                        await conn.execute(statement)
                    await conn.execute("INSERT INTO linkpass_schema (version) VALUES ($1) ON CONFLICT (one) "
                                       "DO UPDATE SET version = excluded.version", number)
                log.info("store_migrated", database=self.label, version=number)
        finally:
            if not conn.is_closed():
                with contextlib.suppress(*DB_ERRORS):
                    await conn.execute("SELECT pg_advisory_unlock($1, $2)", LOCK_SPACE, MIGRATION_LOCK)

    async def schema_version(self) -> int:
        return await self._run("schema version", lambda c: c.fetchval("SELECT version FROM linkpass_schema"))

    async def close(self) -> None:
        """Finish what is queued, then drop every connection (leadership with it)."""
        pool = self._pool
        if pool is None:
            return
        self._closing = True
        try:
            flusher = self._flusher
            if flusher is not None:
                # asyncio.timeout, not wait_for, here and below: on 3.11
                # wait_for can drop a cancel of close() that lands as the
                # awaited thing completes, and close() would carry on.
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(STATEMENT_TIMEOUT_S):
                        await asyncio.shield(flusher)
            if self._held_timer is not None:
                self._held_timer.cancel()
                self._held_timer = None
            announcer = self._announcer
            if announcer is not None:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(CLOSE_TIMEOUT_S):
                        await asyncio.shield(announcer)
            if self._relisten is not None:
                self._relisten.cancel()
                with contextlib.suppress(BaseException):
                    await self._relisten
                self._relisten = None
            for conn in (self._listen_conn, self._lead_conn):
                if conn is not None and not conn.is_closed():
                    try:
                        async with asyncio.timeout(CLOSE_TIMEOUT_S):
                            await conn.close()
                    except (*DB_ERRORS, TimeoutError):
                        conn.terminate()
            self._listen_conn = self._lead_conn = None
            self._leading.clear()
            self._lost.clear()
            self._listeners.clear()
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await pool.close()
            except (*DB_ERRORS, TimeoutError):
                pool.terminate()
        finally:
            self._pool = None

    # -- hosts ----------------------------------------------------------------

    async def hello(self, host_id: str, boot_id: str, version: str, now: float) -> dict[str, int]:
        async def tx(conn: asyncpg.Connection) -> dict[str, int]:
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO hosts (host_id, boot_id, version, first_seen, last_seen) "
                    "VALUES ($1, $2, $3, $4, $4) ON CONFLICT (host_id) DO UPDATE SET "
                    "boot_id = excluded.boot_id, version = excluded.version, "
                    "last_seen = GREATEST(hosts.last_seen, excluded.last_seen)",
                    host_id, boot_id, version, float(now))
                rows = await conn.fetch("SELECT boot_id, last_seq FROM boots WHERE host_id = $1", host_id)
            return {boot: seq for boot, seq in rows}
        return await self._run(f"hello of host {host_id}", tx)

    async def set_inventory(self, host_id: str, inventory: bytes, now: float) -> None:
        await self._set_host_column("inventory", host_id, bytes(inventory), now)

    async def set_report(self, host_id: str, report: bytes, now: float) -> None:
        await self._set_host_column("report", host_id, bytes(report), now)

    async def touch(self, host_id: str, now: float) -> None:
        await self.touch_many({host_id: now})

    async def touch_many(self, seen: dict[str, float]) -> None:
        """One statement for all (a transaction and a commit each was one
        round trip and one WAL flush per heartbeat); in host order, so two
        replicas' statements lock rows in the same order."""
        if not seen:
            return
        items = sorted(seen.items())
        await self._execute(f"heartbeats of {len(items)} hosts",
                            "INSERT INTO hosts (host_id, first_seen, last_seen) "
                            "SELECT h, t, t FROM unnest($1::TEXT[], $2::FLOAT8[]) AS s(h, t) "
                            "ON CONFLICT (host_id) DO UPDATE SET "
                            "last_seen = GREATEST(hosts.last_seen, excluded.last_seen)",
                            [h for h, _ in items], [float(t) for _, t in items])

    async def _set_host_column(self, column: str, host_id: str, value: bytes, now: float) -> None:
        assert column in ("inventory", "report")  # never from outside: part of the SQL text
        await self._execute(f"{column} of host {host_id}",
                            f"INSERT INTO hosts (host_id, first_seen, last_seen, {column}) VALUES ($1, $2, $2, $3) "
                            f"ON CONFLICT (host_id) DO UPDATE SET {column} = excluded.{column}, "
                            "last_seen = GREATEST(hosts.last_seen, excluded.last_seen)",
                            host_id, float(now), value)

    async def hosts(self, host_ids: Sequence[str] = ()) -> list[HostRow]:
        sql = ("SELECT h.host_id, h.boot_id, h.version, h.first_seen, h.last_seen, h.inventory, h.report, "
               "COALESCE(b.last_seq, 0), "
               # SUM of BIGINT is NUMERIC (no overflow); clamped before the cast back.
               "(SELECT LEAST(COALESCE(SUM(l.lost), 0), 9223372036854775807)::BIGINT "
               "FROM boots l WHERE l.host_id = h.host_id), h.replica "
               "FROM hosts h LEFT JOIN boots b ON b.host_id = h.host_id AND b.boot_id = h.boot_id")
        args: tuple[Any, ...] = ()
        if host_ids:
            sql += " WHERE h.host_id = ANY($1::TEXT[])"
            args = (list(host_ids),)
        sql += ' ORDER BY h.host_id COLLATE "C"'
        return [HostRow(host_id=r[0], boot_id=r[1], version=r[2], first_seen=r[3], last_seen=r[4],
                        inventory=bytes(r[5]), report=bytes(r[6]), last_seq=r[7], events_lost=r[8],
                        replica=r[9])
                for r in await self._fetch("reading hosts", sql, *args)]

    # -- events ---------------------------------------------------------------

    async def add_events(self, host_id: str, boot_id: str, events: Sequence[EventRow],
                         gap: tuple[int, int] | None, now: float) -> AddResult:
        events = list(events)
        gap = checked_batch(events, gap)  # before any I/O: a refused batch stores nothing
        if len(events) > MAX_TX_EVENTS:
            raise StoreError(f"a batch of {len(events)} events from host {host_id} is more than one transaction "
                             f"takes ({MAX_TX_EVENTS}): send it in parts")
        call = _AddCall.of(host_id, boot_id, events, gap, now)
        self._open_pool()
        started = time.monotonic()
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._queue.append((call, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        result: AddResult = await future
        stats = self.stats
        stats.events_stored += result.stored
        stats.events_duplicate += result.duplicates
        stats.events_lost += result.lost
        stats.write_seconds.append(time.monotonic() - started)
        if len(stats.write_seconds) > 2 * WRITE_SECONDS_KEPT:
            del stats.write_seconds[:-WRITE_SECONDS_KEPT]
        return result

    def _next_group(self) -> list[tuple[_AddCall, asyncio.Future]]:
        taken, events = 0, 0
        for call, _future in self._queue:
            if taken and (taken >= GROUP_MAX_CALLS or events + len(call.events) > GROUP_MAX_EVENTS):
                break
            taken += 1
            events += len(call.events)
        group, self._queue = self._queue[:taken], self._queue[taken:]
        return group

    async def _flush(self) -> None:
        """Commit what is queued, a group per transaction, until nothing is."""
        while self._queue:
            group = self._next_group()
            try:
                outcomes = await self._commit_group([call for call, _ in group])
            except DB_ERRORS as exc:
                error = self._error(f"storing events ({len(group)} batches)", exc)
                outcomes = [(False, error)] * len(group)
            except Exception as exc:  # noqa: BLE001 - a StoreError, or a bug: handed to the callers
                outcomes = [(False, exc)] * len(group)
            except BaseException as exc:  # cancelled: nobody is left waiting
                for _call, future in group + self._queue:
                    _settle(future, False, StoreError(f"database {self.label}: storing events: {exc!r}"))
                self._queue = []
                raise
            for (_call, future), (ok, value) in zip(group, outcomes):
                _settle(future, ok, value)

    async def _commit_group(self, calls: list[_AddCall]) -> list[tuple[bool, Any]]:
        if self.event_lock:
            return await self._commit_group_locked(calls)
        pool = self._pool
        if pool is None:
            raise StoreError(f"store {self.label} is not open")
        try:
            async with pool.acquire() as conn, conn.transaction():
                results = await _store_group(conn, calls)
        except DB_ERRORS as exc:
            if len(calls) == 1:
                raise
            # One call's bad data (or a deadlock with another replica's group
            # on shared rows) spoils the group's one statement: each call
            # again on its own, so only a bad call fails.
            log.info("store_group_retried_per_call", database=self.label, calls=len(calls), error=_describe(exc))
            outcomes: list[tuple[bool, Any]] = []
            for call in calls:
                try:
                    outcomes.extend(await self._commit_group([call]))
                except DB_ERRORS as one:
                    outcomes.append((False, self._error(f"storing events of host {call.host_id}", one)))
            return outcomes
        self.group_commits += 1
        if any(r.stored for r in results):
            self._announce_events()
        return [(True, r) for r in results]

    # -- events: telling the other replicas --------------------------------------

    def _announce_events(self) -> None:
        """NOTIFY CHANNEL_EVENTS after the commit, in a transaction of its own.
        Not inside the insert transaction: a transaction that notifies holds
        one database-wide lock from its pre-commit to its end (PostgreSQL
        orders the notification queue so), WAL flush included, which would
        put every replica's group commits back in one line. At most one
        notification in flight per store; calls meanwhile share the next."""
        self._announce_due = True
        if self._announcer is None or self._announcer.done():
            self._announcer = asyncio.get_running_loop().create_task(self._announce_loop())

    async def _announce_loop(self) -> None:
        while self._announce_due and (pool := self._pool) is not None:
            self._announce_due = False
            try:
                async with pool.acquire() as conn:
                    await conn.execute(NOTIFY_EVENTS_SQL)
            except DB_ERRORS as exc:  # a missed wake-up: readers catch up on the next one
                log.warning("store_notify_failed", database=self.label, error=_describe(exc))

    def _held_back(self) -> None:
        """A read stopped at the horizon while later events had committed:
        read again once the older transaction is done (it may not notify:
        a heartbeat, a prune), backing off while it lasts."""
        if self._held_timer is not None or self._closing:
            return
        delay = self._held_delay
        self._held_delay = min(delay * 2, HELD_RETRY_MAX_S)
        self._held_timer = asyncio.get_running_loop().call_later(delay, self._held_wake)

    def _held_wake(self) -> None:
        self._held_timer = None
        if not self._closing:
            self._dispatch(None, 0, CHANNEL_EVENTS, "")

    # -- events: the old path, one at a time (the bench's baseline) -------------

    async def _commit_group_locked(self, calls: list[_AddCall]) -> list[tuple[bool, Any]]:
        """Schema 1's event path: the cluster-wide EVENTS_LOCK, statements per
        call, each call in a savepoint, NOTIFY inside the transaction. Kept
        only so labs/bench/pg_store.py can measure it beside the new path."""
        pool = self._pool
        if pool is None:
            raise StoreError(f"store {self.label} is not open")
        outcomes: list[tuple[bool, Any]] = []
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", LOCK_SPACE, EVENTS_LOCK)
            rank = 0
            for call in calls:
                try:
                    async with conn.transaction():  # a savepoint: a failure undoes this call only
                        result, = await _store_group(conn, [call], rank)
                        outcomes.append((True, result))
                except DB_ERRORS as exc:
                    outcomes.append((False, self._error(f"storing events of host {call.host_id}", exc)))
                rank += len(call.events)
            if any(ok for ok, _ in outcomes):
                await conn.execute("SELECT pg_notify($1, '')", CHANNEL_EVENTS)
        self.group_commits += 1
        return outcomes

    # -- events: reading ------------------------------------------------------------

    async def events(self, query: EventQuery) -> list[StoredEvent]:
        """Ids below the horizon only (see the module's docstring): a cursor
        never passes an id that may still commit."""
        if query.limit < 1:
            raise StoreError(f"event query limit must be 1 or more, not {query.limit}")
        where = ["id > $1", f"id < {HORIZON}"]
        args: list[Any] = [min(query.after_id, MAX_SEQ)]  # a uint64 cursor past any id: nothing after
        for column, value in (("host_id", query.host_id), ("port", query.port), ("kind", query.kind)):
            if value:
                args.append(value)
                where.append(f"{column} = ${len(args)}")
        if query.since is not None:
            args.append(float(query.since))
            where.append(f"wall >= ${len(args)}")
        if query.until is not None:
            args.append(float(query.until))
            where.append(f"wall < ${len(args)}")
        args.append(min(query.limit, MAX_SEQ))
        # One statement, one snapshot: the page, and whether committed events
        # wait above the horizon (one row of NULLs when the page is empty).
        sql = (f"SELECT EXISTS (SELECT 1 FROM events WHERE id >= {HORIZON}), e.* FROM (VALUES (1)) one "
               f"LEFT JOIN LATERAL (SELECT {_EVENT_COLUMNS} FROM events WHERE {' AND '.join(where)} "
               f"ORDER BY id LIMIT ${len(args)}) e ON TRUE")
        rows = await self._fetch("reading events", sql, *args)
        page = [StoredEvent(id=r[1], host_id=r[2], boot_id=r[3], seq=r[4], wall=r[5], kind=r[6], port=r[7],
                            body=bytes(r[8]), stored_at=r[9])
                for r in rows if r[1] is not None]
        held = bool(rows and rows[0][0])
        if held and len(page) < query.limit and self._listeners.get(CHANNEL_EVENTS):
            self._held_back()
        elif not held:
            self._held_delay = HELD_RETRY_S
        return page

    async def day_totals(self, since: float, until: float) -> list[DayTotal]:
        """The failovers in range and every other fact of their boots, judged
        by savings.count_days (as SqliteStore.day_totals)."""
        rows = await self._fetch("reading day totals", FACTS_SQL, float(since), float(until))
        return count_days((FactRow(host_id=h, boot_id=b, seq=seq, wall=wall, rail=rail, fact=fact,
                                   gpus=gpus, day=day)
                           for h, b, seq, wall, day, gpus, rail, fact in rows), since, until)

    async def prune(self, before: float) -> int:
        """Chunk by chunk, each its own transaction, so event inserts wait
        for one chunk at most. Commands created before `before` go too."""
        deleted = 0
        while True:
            n = await self._run("pruning events", self._prune_chunk, float(before), PRUNE_CHUNK)
            deleted += n
            if n < PRUNE_CHUNK:
                break
        await self._execute("pruning commands", "DELETE FROM commands WHERE created < $1", float(before))
        return deleted

    @staticmethod
    async def _prune_chunk(conn: asyncpg.Connection, before: float, chunk: int) -> int:
        async with conn.transaction():
            # The chunk's boots rows first, locked in key order as a group
            # commit locks them: a group storing a resend of an event deleted
            # here waits, then reads the raised floor and counts it pruned.
            ids = [r[0] for r in await conn.fetch("SELECT id FROM events WHERE wall < $1 ORDER BY id LIMIT $2",
                                                  before, chunk)]
            if not ids:
                return 0
            await conn.execute(
                "SELECT 1 FROM boots WHERE (host_id, boot_id) IN "
                "(SELECT DISTINCT host_id, boot_id FROM events WHERE id = ANY($1::BIGINT[])) "
                'ORDER BY host_id COLLATE "C", boot_id COLLATE "C" FOR UPDATE', ids)
            rows = await conn.fetch("DELETE FROM events WHERE id = ANY($1::BIGINT[]) AND wall < $2 "
                                    "RETURNING host_id, boot_id, seq", ids, before)
            floors: dict[tuple[str, str], int] = {}
            for host_id, boot_id, seq in rows:
                floors[(host_id, boot_id)] = max(seq, floors.get((host_id, boot_id), 0))
            if floors:
                await conn.execute(
                    "UPDATE boots b SET floor_seq = GREATEST(b.floor_seq, f.seq) "
                    "FROM unnest($1::TEXT[], $2::TEXT[], $3::BIGINT[]) AS f(host_id, boot_id, seq) "
                    "WHERE b.host_id = f.host_id AND b.boot_id = f.boot_id",
                    [h for h, _ in floors], [b for _, b in floors], list(floors.values()))
        return len(rows)

    # -- shared: where hosts are ----------------------------------------------

    async def set_replica(self, host_id: str, replica: str, now: float) -> None:
        await self._execute(f"recording replica {replica} for host {host_id}",
                            "INSERT INTO hosts (host_id, first_seen, last_seen, replica) VALUES ($1, $3, $3, $2) "
                            "ON CONFLICT (host_id) DO UPDATE SET replica = excluded.replica, "
                            "last_seen = GREATEST(hosts.last_seen, excluded.last_seen)",
                            host_id, replica, float(now))

    async def clear_replica(self, host_id: str, replica: str) -> None:
        await self._execute(f"clearing replica {replica} of host {host_id}",
                            "UPDATE hosts SET replica = '' WHERE host_id = $1 AND replica = $2", host_id, replica)

    async def forget_replica(self, replica: str) -> int:
        status = await self._execute(f"forgetting replica {replica}",
                                     "UPDATE hosts SET replica = '' WHERE replica = $1 AND replica <> ''", replica)
        return _count(status)

    # -- shared: commands -----------------------------------------------------

    async def put_command(self, command_id: str, host_id: str, body: bytes, now: float) -> None:
        """A resend of the same command_id is ignored (it is already pending or done)."""
        await self._execute(f"writing command {command_id}",
                            "INSERT INTO commands (command_id, host_id, body, created) VALUES ($1, $2, $3, $4) "
                            "ON CONFLICT (command_id) DO NOTHING", command_id, host_id, bytes(body), float(now))

    async def take_commands(self, host_ids: Sequence[str], now: float) -> list[PendingCommand]:
        """One statement: rows another taker holds are skipped (SKIP LOCKED),
        rows it took are no longer pending; so each is handed out once."""
        if not host_ids:
            return []
        rows = await self._fetch(
            "taking commands",
            "UPDATE commands c SET taken = $2 FROM ("
            "  SELECT command_id FROM commands WHERE host_id = ANY($1::TEXT[]) AND taken IS NULL "
            "  FOR UPDATE SKIP LOCKED) p "
            "WHERE c.command_id = p.command_id AND c.taken IS NULL "
            "RETURNING c.command_id, c.host_id, c.body, c.created, c.ord", list(host_ids), float(now))
        rows = sorted(rows, key=lambda r: (r[3], r[4]))
        return [PendingCommand(command_id=r[0], host_id=r[1], body=bytes(r[2]), created=r[3]) for r in rows]

    async def put_result(self, command_id: str, code: int, message: str, now: float) -> None:
        """Recorded even for a command no longer (or never) here, so its
        asker still finds the answer."""
        await self._execute(f"writing the result of command {command_id}",
                            "INSERT INTO commands (command_id, host_id, body, created, taken, code, message, answered) "
                            "VALUES ($1, '', '', $4, $4, $2, $3, $4) ON CONFLICT (command_id) DO UPDATE SET "
                            "code = excluded.code, message = excluded.message, answered = excluded.answered",
                            command_id, int(code), message, float(now))

    async def command_result(self, command_id: str) -> tuple[int, str] | None:
        rows = await self._fetch(f"reading the result of command {command_id}",
                                 "SELECT code, message FROM commands WHERE command_id = $1 AND code IS NOT NULL",
                                 command_id)
        return (rows[0][0], rows[0][1]) if rows else None

    # -- shared: the probe mesh -------------------------------------------------

    async def put_mesh(self, generation: int, entries: dict[str, bytes]) -> None:
        async def tx(conn: asyncpg.Connection) -> None:
            async with conn.transaction():
                # Writers one at a time (two leaders overlapping for a moment
                # must not interleave two plans); readers see old or new, whole.
                await conn.execute("LOCK TABLE mesh IN SHARE ROW EXCLUSIVE MODE")
                await conn.execute("DELETE FROM mesh")
                if entries:
                    await conn.execute("INSERT INTO mesh (host_id, entry) "
                                       "SELECT * FROM unnest($1::TEXT[], $2::BYTEA[])",
                                       list(entries), [bytes(v) for v in entries.values()])
                await conn.execute("INSERT INTO mesh_plan (generation) VALUES ($1) ON CONFLICT (one) "
                                   "DO UPDATE SET generation = excluded.generation", int(generation))
        await self._run(f"writing mesh plan {generation}", tx)

    async def mesh_for(self, host_ids: Sequence[str]) -> dict[str, bytes]:
        if not host_ids:
            return {}
        rows = await self._fetch("reading the mesh plan",
                                 "SELECT host_id, entry FROM mesh WHERE host_id = ANY($1::TEXT[])", list(host_ids))
        return {host_id: bytes(entry) for host_id, entry in rows}

    # -- shared: fence grants -----------------------------------------------------

    async def put_fence_ports(self, host_id: str, ports: Sequence[FencePort], regrant: Regrant) -> bool:
        """One transaction: the host's old rows and its new ones, then each leaf
        they touch regranted under that leaf's transaction advisory lock
        (taken in leaf order, so two writers never wait on each other in a
        cycle). The lock, not the rows, is what makes two replicas that
        regrant one leaf at once take turns: each reads the leaf only once
        the other committed, so neither grants past the cap."""
        new = {p.port: p for p in ports}

        async def tx(conn: asyncpg.Connection) -> bool:
            async with conn.transaction():
                old = await conn.fetch("SELECT port, leaf, phase, granted FROM fence_ports WHERE host_id = $1",
                                       host_id)
                if not old and not new:
                    return False  # the common case: nothing fenced, nothing was
                if {r["port"]: (r["leaf"], r["phase"]) for r in old} == \
                        {p.port: (p.leaf, p.phase) for p in new.values()}:
                    return False
                leaves = sorted({r["leaf"] for r in old} | {p.leaf for p in new.values()})
                for leaf in leaves:
                    await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", FENCE_SPACE, role_key(leaf))
                await conn.execute("DELETE FROM fence_ports WHERE host_id = $1 AND NOT (port = ANY($2::TEXT[]))",
                                   host_id, list(new))
                if new:
                    await conn.execute(
                        "INSERT INTO fence_ports (host_id, port, leaf, phase) "
                        "SELECT $1, * FROM unnest($2::TEXT[], $3::TEXT[], $4::TEXT[]) "
                        "ON CONFLICT (host_id, port) DO UPDATE SET leaf = excluded.leaf, phase = excluded.phase",
                        host_id, list(new), [p.leaf for p in new.values()], [p.phase for p in new.values()])
                changed = any(r["granted"] and r["port"] not in new for r in old)  # a grant gone with its row
                for leaf in leaves:
                    rows = await conn.fetch("SELECT host_id, port, phase, granted FROM fence_ports "
                                            "WHERE leaf = $1", leaf)
                    before = frozenset((r["host_id"], r["port"]) for r in rows if r["granted"])
                    now = regrant([FencePort(r["host_id"], r["port"], leaf, r["phase"]) for r in rows], before)
                    if now == before:
                        continue
                    changed = True
                    await conn.execute(
                        "UPDATE fence_ports SET granted = (host_id, port) IN "
                        "(SELECT * FROM unnest($2::TEXT[], $3::TEXT[])) WHERE leaf = $1",
                        leaf, [h for h, _ in now], [p for _, p in now])
                return changed
        return await self._run(f"writing the fence ports of {host_id}", tx)

    async def fence_grants(self) -> dict[str, frozenset[str]]:
        rows = await self._fetch("reading the fence grants",
                                 "SELECT host_id, port FROM fence_ports WHERE granted")
        out: dict[str, set[str]] = {}
        for host_id, port in rows:
            out.setdefault(host_id, set()).add(port)
        return {h: frozenset(p) for h, p in out.items()}

    # -- shared: leadership -------------------------------------------------------

    async def try_lead(self, role: str) -> bool:
        self._open_pool()
        async with self._lead_lock:
            conn = self._lead_conn
            if conn is not None and conn.is_closed():
                self._lost_leadership(conn)
            if role in self._lost:
                self._lost.discard(role)
                return False  # said once; the next call connects and asks again
            conn = self._lead_conn
            if conn is None:
                try:
                    conn = await self._connect()
                except DB_ERRORS as exc:
                    log.warning("store_lead_connect_failed", database=self.label, error=_describe(exc))
                    return False
                conn.add_termination_listener(self._lost_leadership)
                self._lead_conn = conn
            try:
                if role in self._leading:
                    await conn.fetchval("SELECT 1")  # alive: the session lock is still ours
                    return True
                got = bool(await conn.fetchval("SELECT pg_try_advisory_lock($1, $2)", LEAD_SPACE, role_key(role)))
            except DB_ERRORS as exc:
                log.warning("store_lead_connection_failed", database=self.label, error=_describe(exc))
                self._lost_leadership(conn)
                self._lost.discard(role)  # said here
                conn.terminate()
                return False
            if got:
                self._leading.add(role)
            return got

    def _lost_leadership(self, conn: asyncpg.Connection) -> None:
        if conn is not self._lead_conn:
            return
        if self._leading and not self._closing:
            log.warning("store_leadership_lost", database=self.label, roles=sorted(self._leading))
            self._lost |= self._leading
        self._leading.clear()
        self._lead_conn = None

    # -- shared: notifications ------------------------------------------------------

    async def notify(self, channel: str, payload: str = "") -> None:
        """Not durable (synchronous_commit off for this one transaction): a
        notification is a wake-up sent after the data it is about committed,
        and a transaction that notifies holds a database-wide lock until it
        ends; with a WAL flush inside, every replica's joins, commands and
        plans queued on it one fsync each."""
        await self._execute(f"notifying {channel}", NOTIFY_SQL, channel, payload)

    async def listen(self, channel: str, callback: Callable[[str], None]) -> None:
        self._open_pool()
        async with self._listen_lock:
            callbacks = self._listeners.setdefault(channel, [])
            callbacks.append(callback)
            if len(callbacks) > 1 or self._relisten is not None:
                return  # LISTENed already, or the reconnection will
            try:
                if self._listen_conn is None:
                    conn = await self._connect()
                    conn.add_termination_listener(self._listen_lost)
                    self._listen_conn = conn
                await self._listen_conn.add_listener(channel, self._dispatch)
            except DB_ERRORS as exc:
                callbacks.remove(callback)
                if not callbacks:
                    del self._listeners[channel]
                raise self._error(f"listening on {channel}", exc) from None

    def _dispatch(self, _conn: Any, _pid: int, channel: str, payload: str) -> None:
        for callback in list(self._listeners.get(channel, ())):
            try:
                callback(payload)
            except Exception:  # one caller's bug must not stop the others' notifications
                log.exception("store_listener_failed", channel=channel)

    def _listen_lost(self, conn: asyncpg.Connection) -> None:
        if self._closing or conn is not self._listen_conn:
            return
        self._listen_conn = None
        log.warning("store_listen_lost", database=self.label, channels=sorted(self._listeners))
        if self._relisten is None:
            self._relisten = asyncio.get_running_loop().create_task(self._reconnect_listen())

    async def _reconnect_listen(self) -> None:
        """Until it works (or the store closes): connect, LISTEN every channel,
        then call every callback once with "" (what was sent meanwhile is lost)."""
        delay = 0.1
        while not self._closing:
            conn = None
            try:
                async with self._listen_lock:
                    conn = await self._connect()
                    conn.add_termination_listener(self._listen_lost)
                    for channel in list(self._listeners):
                        await conn.add_listener(channel, self._dispatch)
                    self._listen_conn = conn
                    self._relisten = None
            except DB_ERRORS as exc:
                if conn is not None:
                    conn.terminate()
                log.warning("store_listen_reconnect_failed", database=self.label, error=_describe(exc),
                            retry_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)
                continue
            log.info("store_listen_reestablished", database=self.label, channels=sorted(self._listeners))
            for channel, callbacks in list(self._listeners.items()):
                for callback in list(callbacks):
                    try:
                        callback("")
                    except Exception:
                        log.exception("store_listener_failed", channel=channel)
            return


# day_totals: every fact of the boots with a failover in [$1, $2)
# (SqliteStore's FACTS_SQL says why).
FACTS_SQL = """SELECT host_id, boot_id, seq, wall, day, gpus, rail, fact FROM absorbed
WHERE (host_id, boot_id) IN (SELECT host_id, boot_id FROM absorbed
                             WHERE fact = 'failover' AND wall >= $1 AND wall < $2)"""

# One statement stores a whole group: the hosts and boots rows (locked, in key
# order, so two replicas' groups lock shared rows in the same order), the
# events above each boot's retention floor with their ids, and the savings
# rows; it returns each boot's state before the group and the event keys it
# stored. The caller then does the per-call accounting and one UPDATE.
GROUP_SQL = f"""
WITH h AS (
  INSERT INTO hosts (host_id, boot_id, first_seen, last_seen)
  SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::FLOAT8[], $4::FLOAT8[]) AS s(host_id, boot_id, f, l)
  ORDER BY host_id COLLATE "C"
  ON CONFLICT (host_id) DO UPDATE SET last_seen = GREATEST(hosts.last_seen, excluded.last_seen)),
b AS (
  INSERT INTO boots (host_id, boot_id)
  SELECT * FROM unnest($5::TEXT[], $6::TEXT[]) AS s(host_id, boot_id)
  ORDER BY host_id COLLATE "C", boot_id COLLATE "C"
  ON CONFLICT (host_id, boot_id) DO UPDATE SET host_id = excluded.host_id
  RETURNING host_id, boot_id, last_seq, lost, floor_seq),
e AS (
  INSERT INTO events (id, host_id, boot_id, seq, wall, kind, severity, port, rail, body, stored_at)
  SELECT {pg_schema.TX_ID_BASE} + $7 + x.n, x.host_id, x.boot_id, x.seq, x.wall, x.kind, x.severity,
         x.port, x.rail, x.body, x.stored_at
  FROM unnest($8::TEXT[], $9::TEXT[], $10::BIGINT[], $11::FLOAT8[], $12::TEXT[], $13::TEXT[], $14::TEXT[],
              $15::TEXT[], $16::BYTEA[], $17::FLOAT8[])
       WITH ORDINALITY AS x(host_id, boot_id, seq, wall, kind, severity, port, rail, body, stored_at, n)
  JOIN b ON b.host_id = x.host_id AND b.boot_id = x.boot_id
  WHERE x.seq > b.floor_seq
  ORDER BY x.n
  ON CONFLICT (host_id, boot_id, seq) DO NOTHING
  RETURNING host_id, boot_id, seq),
a AS (
  INSERT INTO absorbed (host_id, boot_id, seq, wall, day, gpus, rail, fact)
  SELECT a.host_id, a.boot_id, a.seq, a.wall, a.day, a.gpus, a.rail, a.fact
  FROM unnest($18::TEXT[], $19::TEXT[], $20::BIGINT[], $21::FLOAT8[], $22::TEXT[], $23::BIGINT[],
              $24::TEXT[], $25::TEXT[])
       AS a(host_id, boot_id, seq, wall, day, gpus, rail, fact)
  JOIN b ON b.host_id = a.host_id AND b.boot_id = a.boot_id
  WHERE a.seq > b.floor_seq
  ON CONFLICT DO NOTHING)
SELECT TRUE, host_id, boot_id, last_seq, lost, floor_seq FROM b
UNION ALL SELECT FALSE, host_id, boot_id, seq, 0, 0 FROM e"""

BOOTS_SQL = """UPDATE boots b SET last_seq = u.last_seq, lost = u.lost
FROM unnest($1::TEXT[], $2::TEXT[], $3::BIGINT[], $4::BIGINT[]) AS u(host_id, boot_id, last_seq, lost)
WHERE b.host_id = u.host_id AND b.boot_id = u.boot_id"""

# After the commit, in a transaction of its own that need not wait for the
# WAL flush (a notification is a wake-up, not data).
NOTIFY_SQL = "SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, $2)"
NOTIFY_EVENTS_SQL = f"SELECT set_config('synchronous_commit', 'off', true), pg_notify('{CHANNEL_EVENTS}', '')"


async def _store_group(conn: asyncpg.Connection, calls: list[_AddCall], rank: int = 0) -> list[AddResult]:
    """Store `calls` in the open transaction (GROUP_SQL, then one UPDATE of
    the boots that moved); SqliteStore._add_events' accounting, call after
    call, as if each had run alone in the group's order. `rank`: ids of this
    transaction already given (the old path runs one call at a time)."""
    hosts: dict[str, list] = {}
    for call in calls:
        seen = hosts.setdefault(call.host_id, [call.boot_id, call.now, call.now])
        seen[2] = max(seen[2], call.now)
    boots = sorted({(call.host_id, call.boot_id) for call in calls})
    ev: tuple[list, ...] = ([], [], [], [], [], [], [], [], [], [])
    ab: tuple[list, ...] = ([], [], [], [], [], [], [], [])
    for call in calls:
        n = len(call.events)
        ev[0].extend([call.host_id] * n)
        ev[1].extend([call.boot_id] * n)
        for column, values in zip(ev[2:9], call.columns):
            column.extend(values)
        ev[9].extend([call.now] * n)
        for e in call.events:
            if e.fact:
                for column, value in zip(ab, (call.host_id, call.boot_id, e.seq, float(e.wall), day_of(e.wall),
                                              e.gpus, e.rail, e.fact)):
                    column.append(value)
    rows = await conn.fetch(GROUP_SQL, list(hosts), [v[0] for v in hosts.values()], [v[1] for v in hosts.values()],
                            [v[2] for v in hosts.values()], [h for h, _ in boots], [b for _, b in boots], rank,
                            *ev, *ab)
    state: dict[tuple[str, str], list[int]] = {}
    stored_keys: set[tuple[str, str, int]] = set()
    for is_boot, host_id, boot_id, a, lost, floor in rows:
        if is_boot:
            state[(host_id, boot_id)] = [a, lost, floor]
        else:
            stored_keys.add((host_id, boot_id, a))
    before = {key: tuple(value[:2]) for key, value in state.items()}
    results = []
    for call in calls:
        boot = state[(call.host_id, call.boot_id)]
        prev, lost_before, floor = boot
        stored = 0
        for e in call.events:  # a seq stored by the group counts for the first call that carried it
            key = (call.host_id, call.boot_id, e.seq)
            if e.seq > floor and key in stored_keys:
                stored_keys.discard(key)
                stored += 1
        events, gap = call.events, call.gap
        top = max(events[-1].seq if events else 0, gap[1] if gap else 0)
        above = sum(1 for e in events if e.seq > prev)
        newly_lost = (top - prev) - above if top > prev else 0
        filled = stored - above  # new arrivals at or below prev: holes filled late
        boot[1] = min(2**63 - 1, max(0, lost_before + newly_lost - filled))  # BIGINT
        boot[0] = max(prev, top)
        results.append(AddResult(stored=stored, duplicates=len(events) - stored, last_seq=boot[0], lost=newly_lost))
    moved = [(key, value) for key, value in state.items() if tuple(value[:2]) != before[key]]
    if moved:
        await conn.execute(BOOTS_SQL, [k[0] for k, _ in moved], [k[1] for k, _ in moved],
                           [v[0] for _, v in moved], [v[1] for _, v in moved])
    return results


def _settle(future: asyncio.Future, ok: bool, value: Any) -> None:
    if future.done():  # the caller went away (cancelled); the work is committed regardless
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
