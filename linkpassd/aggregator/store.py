"""The aggregator's store, behind one small interface.

The server never talks SQL: it calls a `Store`. The embedded default is
SQLite in WAL mode (`sqlite_store.SqliteStore`); a PostgreSQL store can take
its place by implementing the same methods.

Exactly once: an event is named by (host_id, boot_id, seq). `add_events`
inserts those it does not hold yet and ignores the others, so an agent that
resends after a reconnect (or after the aggregator was killed before it could
ack) never creates a duplicate. It returns only once what it stored is
durable (committed), and the server acks only after it returned.

Every method is a coroutine: the SQLite store runs its statements on one
worker thread of its own, so the gRPC event loop never waits on the disk.
Times are unix seconds (wall clock).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from linkpassd._proto.linkpass.v1 import control_pb2 as cpb


class StoreError(Exception):
    """The store refused or failed an operation; the message says which and why."""


class OutOfOrder(StoreError):
    """A batch whose seqs are not strictly increasing."""


# Enum numbers -> the names stored (EventRow.kind, .severity), made once (a lookup per event instead of
# the enum wrapper's Name and two string operations).
_KIND_NAMES = {number: name.removeprefix("EVENT_KIND_").lower() for name, number in cpb.EventKind.items()}
_SEVERITY_NAMES = {number: name.removeprefix("SEVERITY_").lower() for name, number in cpb.Severity.items()}
RAIL_PATH = _KIND_NAMES[cpb.EVENT_KIND_RAIL_PATH]
ANNOUNCE = _KIND_NAMES[cpb.EVENT_KIND_ANNOUNCE]

def kind_name(value: int) -> str:
    """EventKind number -> the core name ("rail_path"); unknown numbers (a newer agent) stay
    visible as "kind_<n>" instead of failing the batch."""
    name = _KIND_NAMES.get(value)
    return name if name is not None else f"kind_{value}"


def severity_name(value: int) -> str:
    name = _SEVERITY_NAMES.get(value)
    return name if name is not None else f"severity_{value}"


@dataclass(frozen=True)
class EventRow:
    """One event of a host, as the server hands it to the store."""

    seq: int
    wall: float  # the host's time of the event
    kind: str  # core.events.EventKind value, e.g. "rail_path"
    severity: str
    port: str
    rail: str
    body: bytes  # the serialized linkpass.v1.Event, returned as given
    fact: str = ""  # what the savings accounting keeps of it (aggregator.savings.Fact; "": nothing)
    gpus: int = 0  # a failover: the GPUs behind its rail


@dataclass(frozen=True)
class StoredEvent:
    id: int  # the store's order of arrival (a cursor)
    host_id: str
    boot_id: str
    seq: int
    wall: float
    kind: str
    port: str
    body: bytes
    stored_at: float


@dataclass(frozen=True)
class HostRow:
    host_id: str
    boot_id: str
    version: str
    first_seen: float
    last_seen: float
    inventory: bytes  # serialized linkpass.v1.Inventory (b"" before the first)
    report: bytes  # serialized linkpass.v1.PortReport (b"" before the first)
    last_seq: int  # newest stored seq of boot_id
    events_lost: int  # events the host reported dropped, or seqs never received, all boots
    replica: str = ""  # shared stores: the replica whose stream the host is on ("" = none)


@dataclass(frozen=True)
class EventQuery:
    host_id: str = ""
    port: str = ""
    kind: str = ""
    since: float | None = None
    until: float | None = None
    after_id: int = 0
    limit: int = 1000


@dataclass(frozen=True)
class DayTotal:
    day: str  # "YYYY-MM-DD", UTC, by the failover's wall time
    failures_absorbed: int  # both directions recovered (aggregator.savings)
    gpus: int  # sum of GPUs behind the absorbed failures' ports (x restart cost = GPU time saved)
    failures_outgoing_only: int = 0  # failed over, but traffic to the rail's address did not move


@dataclass(frozen=True)
class AddResult:
    stored: int  # newly stored by this call
    duplicates: int  # already held (a resend)
    last_seq: int  # newest seq of this boot now held durably
    lost: int = 0  # seqs skipped over by this batch (never received, or dropped as a gap)


class Store(Protocol):
    async def open(self) -> None:
        """Create or migrate the schema to this release's version; refuse
        (StoreError) a database whose schema is newer than this release."""

    async def close(self) -> None: ...

    async def hello(self, host_id: str, boot_id: str, version: str, now: float) -> dict[str, int]:
        """Record a host's (re)connection; return, per boot of this host the
        store holds, the newest stored seq (what the agent may drop)."""

    async def set_inventory(self, host_id: str, inventory: bytes, now: float) -> None: ...

    async def set_report(self, host_id: str, report: bytes, now: float) -> None: ...

    async def touch(self, host_id: str, now: float) -> None:
        """A heartbeat: the host is alive at `now`."""

    async def touch_many(self, seen: dict[str, float]) -> None:
        """Heartbeats of many hosts (host_id -> when) in one write: the
        server collects a fleet's heartbeats and stores them together."""

    async def add_events(self, host_id: str, boot_id: str, events: Sequence[EventRow],
                         gap: tuple[int, int] | None, now: float) -> AddResult:
        """Store the events not held yet, durably, before returning. `events`
        must be strictly increasing in seq (OutOfOrder otherwise, nothing
        stored). `gap` is a range the agent dropped; it and any seq skipped
        between the newest held and the first new one count as lost."""

    async def hosts(self, host_ids: Sequence[str] = ()) -> list[HostRow]: ...

    async def events(self, query: EventQuery) -> list[StoredEvent]:
        """Oldest first, by id."""

    async def day_totals(self, since: float, until: float) -> list[DayTotal]:
        """Failovers per UTC day with wall time in [since, until), absorbed
        (both directions) or outgoing only: savings.count_days over the
        stored facts."""

    async def prune(self, before: float) -> int:
        """Delete events with wall time before `before` (retention); the
        number deleted. The savings facts (day_totals) stay."""


@dataclass(frozen=True)
class FencePort:
    """A port a host holds fenced or asks to fence (its PortReport's phase),
    and the leaf it counts against (its inventory's rail `leaf`; "" none)."""

    host: str
    port: str
    leaf: str
    phase: str


# Given every port counted against one leaf and the (host, port) pairs granted
# there before, the pairs granted now (aggregator.fencing.grants, for one leaf).
Regrant = Callable[[Sequence[FencePort], frozenset[tuple[str, str]]], frozenset[tuple[str, str]]]


@dataclass(frozen=True)
class PendingCommand:
    """A fleet command written by one replica for a host on another's stream."""

    command_id: str
    host_id: str
    body: bytes  # serialized linkpass.v1.Command
    created: float


class SharedStore(Store, Protocol):
    """A store several aggregator replicas use at once (PostgreSQL).

    `shared` is True. The single-process SQLite store has none of these
    methods and `shared` False: the server then keeps sessions, commands and
    the mesh in memory as before. With a shared store:

    - **Who is connected where.** A replica records each host it holds
      (`set_replica`) and clears it when the stream ends (only if it is still
      its own: a newer stream on another replica wins). A replica that dies
      cannot clear anything, so readers also treat a host whose `last_seen`
      is older than the staleness the server applies as not connected.
    - **Commands.** A drain asked of replica A for a host on replica B is a
      row (`put_command`); B takes the rows of its hosts (`take_commands`),
      relays them, and writes the result (`put_result`) that A reads
      (`command_result`).
    - **The probe mesh.** One replica at a time plans (`try_lead`: a
      session-level advisory lock, freed by PostgreSQL when its holder's
      connection drops) and writes the whole plan (`put_mesh`); every replica
      sends its own hosts their entries (`mesh_for`).
    - **Fence grants.** Each replica writes the ports its hosts hold fenced
      or ask to fence (`put_fence_ports`, only when a host's set changes);
      the store regrants every leaf the change touches in the same
      transaction, one writer per leaf at a time, so a leaf's cap counts
      every replica's hosts. Every replica reads the grants back
      (`fence_grants`) and tells its own hosts.
    - **Notifications.** `listen(channel, callback)` calls back (on the
      event loop, never blocking) with the payload of every `notify` on that
      channel from any replica, this one included. `add_events` notifies
      CHANNEL_EVENTS once its events committed. Channel names are CHANNEL_*.
    - **A follow stream never skips**: `events` returns no id while an
      event with a smaller id may still commit on any replica, so a reader
      following `after_id` sees every event once, in one order for all.
    """

    shared: bool

    async def set_replica(self, host_id: str, replica: str, now: float) -> None:
        """`replica` holds host_id's stream from now on."""

    async def clear_replica(self, host_id: str, replica: str) -> None:
        """host_id's stream on `replica` ended (no-op if another replica holds it now)."""

    async def forget_replica(self, replica: str) -> int:
        """Clear every host `replica` held (at its start and clean stop); how many."""

    async def put_command(self, command_id: str, host_id: str, body: bytes, now: float) -> None: ...

    async def take_commands(self, host_ids: Sequence[str], now: float) -> list[PendingCommand]:
        """The pending commands for these hosts, oldest first, each handed
        out once (marked taken in the same transaction)."""

    async def put_result(self, command_id: str, code: int, message: str, now: float) -> None: ...

    async def command_result(self, command_id: str) -> tuple[int, str] | None:
        """(grpc status code number, message) once the host answered; None before."""

    async def try_lead(self, role: str) -> bool:
        """True while this process holds `role` (e.g. "mesh-planner"); asks
        again for it when not held. Never blocks on the holder."""

    async def put_mesh(self, generation: int, entries: dict[str, bytes]) -> None:
        """Replace the whole plan: host_id -> serialized linkpass.v1.ProbePeers."""

    async def mesh_for(self, host_ids: Sequence[str]) -> dict[str, bytes]:
        """The current plan's entries of these hosts (absent: no entry)."""

    async def put_fence_ports(self, host_id: str, ports: Sequence[FencePort], regrant: Regrant) -> bool:
        """Replace host_id's fence ports with `ports` and, for every leaf it
        had or has ports on, set the grants `regrant` gives, while no other
        writer changes that leaf. Whether any grant changed."""

    async def fence_grants(self) -> dict[str, frozenset[str]]:
        """host_id -> the ports it may hold fenced (hosts with none absent)."""

    async def listen(self, channel: str, callback: Callable[[str], None]) -> None: ...

    async def notify(self, channel: str, payload: str = "") -> None: ...


CHANNEL_EVENTS = "linkpass_events"  # payload: "" (events were committed)
CHANNEL_HOSTS = "linkpass_hosts"  # payload: host_id (joined, left, or new inventory): re-plan
CHANNEL_COMMANDS = "linkpass_commands"  # payload: host_id with a pending command
CHANNEL_RESULTS = "linkpass_results"  # payload: command_id answered
CHANNEL_MESH = "linkpass_mesh"  # payload: generation of the plan just written
CHANNEL_FENCE = "linkpass_fence"  # payload: "" (fence grants changed: every replica reads them)


def is_shared(store: Store) -> bool:
    return bool(getattr(store, "shared", False))


@dataclass
class StoreStats:
    """Counters a store keeps for the aggregator's metrics."""

    events_stored: int = 0
    events_duplicate: int = 0
    events_lost: int = 0
    write_seconds: list[float] = field(default_factory=list)
