"""Fence grants (docs/fencing.md): at most `[fence] leaf_cap` ports behind
one leaf fenced at once across the hosts, so that a leaf failure (every
host's port on it failing together) fences no more than the cap.

What a host says of its ports (its PortReport's phases, set by core.fence's
overlay): FENCE_FENCED or FENCE_TESTING while it holds a port fenced,
FENCE_ASKING while a port would be fenced but for its leaf's grant. Per leaf
(the inventory's `leaf` of each rail), the ports held count against the
cap first; the askers are granted in a stable order (host, port) up to what
is left, those granted before first: a grant is never moved from a port that
still asks to another (the host may have fenced on it already, before its
report says so). A host is told its granted ports (held ones included, so a fence
stays granted while it lasts) whenever they change, and when it connects.

A port whose rail names no leaf is never granted: the aggregator cannot
count it against any cap (set `leaf` on each rail).

A host that disconnects keeps its last report here: a port it held fenced
still counts against its leaf until the host says otherwise, since its
daemon may still hold it (this errs on the side of fewer fences).

Two ways to keep the count, one rule (`grants`):

- `FenceGrants`, the whole aggregator in one process (SQLite): in memory,
  regranted on every report, at once.
- `SharedFenceGrants`, replicas on one shared store (PostgreSQL): a host's
  fence ports are written to the store when they change, and the store
  regrants each leaf they touch under that leaf's lock (SharedStore.
  put_fence_ports), so the cap counts every replica's hosts. Every replica
  is then told (CHANNEL_FENCE), reads the grants back and tells its own
  hosts. A replica that dies leaves its hosts' rows: like a disconnected
  host's report, they count until the host reports again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence

import structlog

from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd.aggregator.session import HostSession
from linkpassd.aggregator.store import CHANNEL_FENCE, FencePort, SharedStore, StoreError
from linkpassd.core.fence import ASKING_PHASE, HOLDING_PHASES

log = structlog.get_logger("linkpass.aggregator")

STORE_RETRY_S = 1.0  # a fence-port write the store refused is tried again after this


def ports_of(host: str, inventory: pb.Inventory | None, report: pb.PortReport | None
             ) -> list[FencePort]:
    if inventory is None or report is None:
        return []
    leaf_of = {r.port: r.leaf for r in inventory.rails if r.port}
    return [FencePort(host, p.port, leaf_of.get(p.port, ""), p.phase) for p in report.ports
            if p.phase in HOLDING_PHASES or p.phase == ASKING_PHASE]


def grants(ports: Iterable[FencePort], cap: int,
           before: frozenset[tuple[str, str]] = frozenset()) -> dict[str, frozenset[str]]:
    """Host -> the ports it may hold fenced (pure). `before`: the (host,
    port) pairs granted last time, which keep their grant while they ask."""
    by_leaf: dict[str, list[FencePort]] = {}
    for p in ports:
        if p.leaf:
            by_leaf.setdefault(p.leaf, []).append(p)
    out: dict[str, set[str]] = {}
    for leaf_ports in by_leaf.values():
        held = [p for p in leaf_ports if p.phase in HOLDING_PHASES]
        asking = sorted((p for p in leaf_ports if p.phase == ASKING_PHASE),
                        key=lambda p: ((p.host, p.port) not in before, p.host, p.port))
        for p in held + asking[:max(0, cap - len(held))]:
            out.setdefault(p.host, set()).add(p.port)
    return {h: frozenset(ps) for h, ps in out.items()}


def _tell(session: HostSession, mine: frozenset[str], cap: int, told: frozenset[str] | None) -> None:
    session.send(pb.ConnectResponse(fence=pb.FenceGrants(ports=sorted(mine), leaf_cap=cap)))
    if mine != (told or frozenset()):
        log.info("fence_granted", host=session.host_id, ports=sorted(mine) or "none")


class FenceGrants:
    """The grants between reports, and what each host was told (one process)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.seen: dict[str, list[FencePort]] = {}  # host -> its fence-relevant ports, last report
        self.told: dict[str, frozenset[str]] = {}
        self.granted: frozenset[tuple[str, str]] = frozenset()  # (host, port), last computed
        # host -> its newest inventory as read off the stream (the session's
        # is set only once stored, after a report read right behind it)
        self.inventories: dict[str, pb.Inventory] = {}

    def inventory(self, host: str, inventory: pb.Inventory) -> None:
        self.inventories[host] = inventory

    def report(self, session: HostSession, report: pb.PortReport) -> None:
        inventory = self.inventories.get(session.host_id) or session.inventory
        self.seen[session.host_id] = ports_of(session.host_id, inventory, report)

    def update(self, sessions: Mapping[str, HostSession]) -> None:
        """Recompute and tell every open session whose grants changed."""
        now = grants((p for ports in self.seen.values() for p in ports), self.cap, self.granted)
        self.granted = frozenset((h, p) for h, ports in now.items() for p in ports)
        for host, session in sessions.items():
            mine = now.get(host, frozenset())
            if not session.open or self.told.get(host) == mine:
                continue
            _tell(session, mine, self.cap, self.told.get(host))
            self.told[host] = mine

    def joined(self, host: str) -> None:
        """A new stream: tell it its grants afresh (the agent forgot them)."""
        self.told.pop(host, None)


class SharedFenceGrants:
    """The grants of replicas sharing a store (module docstring), with the
    same calls as FenceGrants. `sessions`: this replica's open streams (the
    fleet's dict, read when telling)."""

    def __init__(self, cap: int, store: SharedStore, sessions: Mapping[str, HostSession]) -> None:
        self.cap = cap
        self.store = store
        self.sessions = sessions
        self.inventories: dict[str, pb.Inventory] = {}
        self.told: dict[str, frozenset[str]] = {}
        self.written: dict[str, tuple[FencePort, ...]] = {}  # host -> its ports as last written
        # Hosts whose stream here has sent a report: only they are told, as a
        # report comes after our Welcome (a grant must not come before it).
        self.reported: set[str] = set()
        self.dirty: dict[str, tuple[FencePort, ...]] = {}  # host -> its ports, not written yet
        self._writer: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._read_again = False

    def inventory(self, host: str, inventory: pb.Inventory) -> None:
        self.inventories[host] = inventory

    def report(self, session: HostSession, report: pb.PortReport) -> None:
        host = session.host_id
        self.reported.add(host)
        ports = tuple(ports_of(host, self.inventories.get(host) or session.inventory, report))
        if host in self.written and self.written[host] == ports and host not in self.dirty:
            return  # the usual report: nothing fenced or asked that the store lacks
        self.dirty[host] = ports

    def update(self, sessions: Mapping[str, HostSession]) -> None:
        """Write what changed (the grants come back by CHANNEL_FENCE)."""
        if self.dirty and self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write())

    def joined(self, host: str) -> None:
        """A new stream: its first report is written (another replica may
        have held the host), and then it is told its grants."""
        self.told.pop(host, None)
        self.written.pop(host, None)
        self.reported.discard(host)

    def changed(self, _payload: str = "") -> None:
        """CHANNEL_FENCE (or a new stream here): read the grants, tell our hosts."""
        self._read_again = True
        if self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _write(self) -> None:
        try:
            while self.dirty:
                host, ports = next(iter(self.dirty.items()))
                del self.dirty[host]
                try:
                    changed = await self.store.put_fence_ports(host, ports, self._regrant)
                except StoreError as exc:
                    log.warning("fence_ports_write_failed", host=host, error=str(exc), retry_s=STORE_RETRY_S)
                    self.dirty.setdefault(host, ports)  # unless a newer report came meanwhile
                    await asyncio.sleep(STORE_RETRY_S)
                    continue
                self.written[host] = ports
                if changed:
                    try:
                        await self.store.notify(CHANNEL_FENCE)
                    except StoreError as exc:  # our own hosts still hear: read now
                        log.warning("fence_notify_failed", error=str(exc))
                        self.changed()
                elif host not in self.told:  # a new stream: tell it what it holds
                    self.changed()
        finally:
            self._writer = None

    def _regrant(self, ports: Sequence[FencePort], before: frozenset[tuple[str, str]]
                 ) -> frozenset[tuple[str, str]]:
        """One leaf's grants now (the store calls this inside its transaction)."""
        now = grants(ports, self.cap, before)
        return frozenset((h, p) for h, granted in now.items() for p in granted)

    async def _read(self) -> None:
        try:
            while self._read_again:
                self._read_again = False
                try:
                    granted = await self.store.fence_grants()
                except StoreError as exc:
                    log.warning("fence_grants_read_failed", error=str(exc), retry_s=STORE_RETRY_S)
                    self._read_again = True
                    await asyncio.sleep(STORE_RETRY_S)
                    continue
                for host, session in list(self.sessions.items()):
                    mine = granted.get(host, frozenset())
                    if not session.open or host not in self.reported or self.told.get(host) == mine:
                        continue
                    _tell(session, mine, self.cap, self.told.get(host))
                    self.told[host] = mine
        finally:
            self._reader = None
