"""The PostgreSQL store's schema, its migrations and its advisory-lock keys.

Migrations are applied in order, each in its own transaction (all or
nothing), while holding a session advisory lock (MIGRATION_LOCK): replicas
starting together queue on it, the first migrates, the others then find the
schema current and apply nothing. `linkpass_schema` holds one row, the number
of migrations applied. Append only: never edit a step that has shipped, add
one.

Same tables as the SQLite store (sqlite_store.py says why each exists), plus
what only replicas sharing one database need: `hosts.replica` (whose stream a
host is on), `commands` (fleet commands relayed between replicas), the probe
mesh (`mesh`, `mesh_plan`) and the ports fenced or asking to be, with their
grants (`fence_ports`, so that a leaf's cap counts every replica's hosts).

Event ids (from migration 2) are made by the inserting transaction itself:
its xid8 shifted left by ID_SHIFT bits, plus the row's rank in its one INSERT
(1 .. MAX_TX_EVENTS). So id order is (transaction, rank) order, and a reader
that reads only ids below HORIZON (the oldest transaction still running,
shifted the same way) never reads past an id that may still commit: no lock
is needed on the event path (pg_store.py and docs/aggregator.md give the
argument). Migration 1's ids came from an identity column under a cluster
advisory lock (EVENTS_LOCK, still reserved); migration 2 drops the identity
after checking every existing id is below the new ids.

Text that is sorted or compared is sorted with COLLATE "C" in the queries, so
the order is the bytes' order (as SQLite's) whatever the database's collation.
"""

from __future__ import annotations

import zlib

# Advisory-lock keys: (LOCK_SPACE, n) pairs of 32-bit ints, all in one space of
# ours so they cannot collide with another application's single-bigint keys.
LOCK_SPACE = 0x6C70  # "lp"
MIGRATION_LOCK = 1  # held while migrating (session lock)
EVENTS_LOCK = 2  # schema 1's event lock; taken now only by PgStore(event_lock=True) (the bench's old path)
LEAD_SPACE = 0x6C71  # try_lead(role): (LEAD_SPACE, role_key(role))
FENCE_SPACE = 0x6C72  # a leaf's fence grants: (FENCE_SPACE, role_key(leaf)), transaction locks


def role_key(role: str) -> int:
    """A stable signed 32-bit key for a leadership role (the same on every replica)."""
    value = zlib.crc32(role.encode("utf-8"))
    return value - (1 << 32) if value >= 1 << 31 else value


# Event ids: (xid8 of the inserting transaction << ID_SHIFT) + rank, rank in
# 1..MAX_TX_EVENTS. 47 bits of xid8 left in a BIGINT: 1.4e14 transactions,
# 44 years at 100,000 transactions a second.
ID_SHIFT = 16
MAX_TX_EVENTS = (1 << ID_SHIFT) - 1
# SQL: the id base of the current transaction, and the read horizon of the
# current statement's snapshot (ids below it can no longer appear).
TX_ID_BASE = f"(pg_current_xact_id()::TEXT::BIGINT << {ID_SHIFT})"
HORIZON = f"(pg_snapshot_xmin(pg_current_snapshot())::TEXT::BIGINT << {ID_SHIFT})"

VERSION_TABLE = """CREATE TABLE IF NOT EXISTS linkpass_schema (
    one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    version INTEGER NOT NULL)"""

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # 1: the first schema
        """CREATE TABLE hosts (
             host_id TEXT PRIMARY KEY,
             boot_id TEXT NOT NULL DEFAULT '',
             version TEXT NOT NULL DEFAULT '',
             first_seen DOUBLE PRECISION NOT NULL,
             last_seen DOUBLE PRECISION NOT NULL,
             inventory BYTEA NOT NULL DEFAULT '',
             report BYTEA NOT NULL DEFAULT '',
             replica TEXT NOT NULL DEFAULT '')""",
        "CREATE INDEX hosts_by_replica ON hosts (replica) WHERE replica <> ''",
        """CREATE TABLE boots (
             host_id TEXT NOT NULL,
             boot_id TEXT NOT NULL,
             last_seq BIGINT NOT NULL DEFAULT 0,
             lost BIGINT NOT NULL DEFAULT 0,
             floor_seq BIGINT NOT NULL DEFAULT 0,
             PRIMARY KEY (host_id, boot_id))""",
        """CREATE TABLE events (
             id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             host_id TEXT NOT NULL,
             boot_id TEXT NOT NULL,
             seq BIGINT NOT NULL,
             wall DOUBLE PRECISION NOT NULL,
             kind TEXT NOT NULL,
             severity TEXT NOT NULL,
             port TEXT NOT NULL,
             rail TEXT NOT NULL,
             body BYTEA NOT NULL,
             stored_at DOUBLE PRECISION NOT NULL,
             UNIQUE (host_id, boot_id, seq))""",
        # Every events() query wants id order after an equality filter.
        "CREATE INDEX events_by_host ON events (host_id, id)",
        "CREATE INDEX events_by_host_port ON events (host_id, port, id)",
        "CREATE INDEX events_by_port ON events (port, id)",
        "CREATE INDEX events_by_kind ON events (kind, id)",
        "CREATE INDEX events_by_wall ON events (wall)",  # time filters and retention
        """CREATE TABLE absorbed (
             host_id TEXT NOT NULL,
             boot_id TEXT NOT NULL,
             seq BIGINT NOT NULL,
             wall DOUBLE PRECISION NOT NULL,
             day TEXT NOT NULL,
             gpus BIGINT NOT NULL,
             PRIMARY KEY (host_id, boot_id, seq))""",
        "CREATE INDEX absorbed_by_wall ON absorbed (wall)",
        """CREATE TABLE commands (
             command_id TEXT PRIMARY KEY,
             ord BIGINT GENERATED ALWAYS AS IDENTITY,
             host_id TEXT NOT NULL,
             body BYTEA NOT NULL,
             created DOUBLE PRECISION NOT NULL,
             taken DOUBLE PRECISION,
             code INTEGER,
             message TEXT,
             answered DOUBLE PRECISION)""",
        "CREATE INDEX commands_pending ON commands (host_id, created, ord) WHERE taken IS NULL",
        "CREATE INDEX commands_by_created ON commands (created)",
        """CREATE TABLE mesh (
             host_id TEXT PRIMARY KEY,
             entry BYTEA NOT NULL)""",
        """CREATE TABLE mesh_plan (
             one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
             generation BIGINT NOT NULL)""",
    ),
    (  # 2: event ids from the inserting transaction's xid8; no identity, no event lock
        # Schema-1 ids were handed out one per event, at most 20,000 events a
        # transaction and each such transaction with an xid of its own, so
        # they are below this transaction's id base: checked, not assumed.
        f"""DO $$ BEGIN
             IF (SELECT COALESCE(max(id), 0) FROM events) >= {TX_ID_BASE} THEN
               RAISE EXCEPTION 'events hold ids at or above the first xid-based id %: cannot move to schema 2',
                 {TX_ID_BASE};
             END IF;
           END $$""",
        "ALTER TABLE events ALTER COLUMN id DROP IDENTITY IF EXISTS",
    ),
    (  # 3: absorbed keeps the savings facts (savings.Fact): failovers, address moves, FRR reports.
        # Rows from before are failovers whose rail was not kept: no address
        # move can be paired with them, so they count as outgoing only.
        "ALTER TABLE absorbed ADD COLUMN rail TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE absorbed ADD COLUMN fact TEXT NOT NULL DEFAULT 'failover'",
    ),
    (  # 4: fence grants counted across replicas (docs/fencing.md): one row per port a
        # host holds fenced or asks to fence, with the leaf it counts against.
        """CREATE TABLE fence_ports (
             host_id TEXT NOT NULL,
             port TEXT NOT NULL,
             leaf TEXT NOT NULL,
             phase TEXT NOT NULL,
             granted BOOLEAN NOT NULL DEFAULT FALSE,
             PRIMARY KEY (host_id, port))""",
        "CREATE INDEX fence_ports_by_leaf ON fence_ports (leaf)",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)
