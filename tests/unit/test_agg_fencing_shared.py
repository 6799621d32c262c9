"""Fence grants with aggregator replicas on one shared store
(aggregator/fencing.py SharedFenceGrants): a leaf's cap counts the hosts of
every replica, not of each. The store here is a stand-in with the shared
store's contract (one writer per leaf at a time, notifications to every
replica); the real PostgreSQL store, with writers racing, is in
test_agg_pg_store.py and the three-process version in
tests/system/test_agg_replicas.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from linkpassd._proto.linkpass.v1 import control_pb2 as cpb
from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd.aggregator.fencing import FenceGrants, SharedFenceGrants
from linkpassd.aggregator.store import FencePort, Regrant, StoreError


class Shared:
    """The shared store's fence calls and notifications, in memory."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], tuple[FencePort, bool]] = {}  # (host, port) -> port, granted
        self.listeners: list[Callable[[str], None]] = []
        self.writes = 0
        self.fail_writes = 0

    async def put_fence_ports(self, host_id: str, ports: Sequence[FencePort], regrant: Regrant) -> bool:
        await asyncio.sleep(0)  # another replica's call may run between ours
        if self.fail_writes:
            self.fail_writes -= 1
            raise StoreError("the database is restarting")
        self.writes += 1
        old = {k: v for k, v in self.rows.items() if k[0] == host_id}
        new = {(host_id, p.port): p for p in ports}
        changed = any(granted and k not in new for k, (_, granted) in old.items())
        for k in old:
            if k not in new:
                del self.rows[k]
        for k, p in new.items():
            self.rows[k] = (p, self.rows.get(k, (p, False))[1])
        for leaf in {p.leaf for p, _ in old.values()} | {p.leaf for p in new.values()}:
            here = {k: v for k, v in self.rows.items() if v[0].leaf == leaf}
            before = frozenset(k for k, (_, granted) in here.items() if granted)
            now = regrant([p for p, _ in here.values()], before)
            changed |= now != before
            for k, (p, _) in here.items():
                self.rows[k] = (p, k in now)
        return changed

    async def fence_grants(self) -> dict[str, frozenset[str]]:
        out: dict[str, set[str]] = {}
        for (host, port), (_, granted) in self.rows.items():
            if granted:
                out.setdefault(host, set()).add(port)
        return {h: frozenset(p) for h, p in out.items()}

    async def notify(self, channel: str, payload: str = "") -> None:
        for callback in self.listeners:  # every replica, this one included
            callback(payload)


class Session:
    def __init__(self, host_id: str, leaf: str = "L1") -> None:
        self.host_id = host_id
        self.open = True
        self.inventory = pb.Inventory(rails=[pb.RailInventory(rail="rail1", port="eth1", leaf=leaf)])
        self.told: list[list[str]] = []

    def send(self, message: pb.ConnectResponse) -> None:
        self.told.append(list(message.fence.ports))


def report(phase: str | None) -> pb.PortReport:
    ports = [cpb.PortState(port="eth1", verdict=cpb.VERDICT_DOWN, phase=phase)] if phase else []
    return pb.PortReport(ports=ports)


class Replica:
    def __init__(self, store: Shared, cap: int = 1) -> None:
        self.sessions: dict[str, Session] = {}
        self.fences = SharedFenceGrants(cap, store, self.sessions)  # type: ignore[arg-type]
        store.listeners.append(self.fences.changed)

    def join(self, session: Session) -> Session:
        self.sessions[session.host_id] = session
        self.fences.joined(session.host_id)
        return session

    def says(self, session: Session, phase: str | None) -> None:
        self.fences.report(session, report(phase))  # type: ignore[arg-type]
        self.fences.update(self.sessions)  # type: ignore[arg-type]


async def settled() -> None:
    """Until every writer and reader task of the replicas is done."""
    for _ in range(200):
        await asyncio.sleep(0)
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    if tasks:
        await asyncio.wait(tasks, timeout=5)
        for _ in range(50):
            await asyncio.sleep(0)


def granted(*sessions: Session) -> dict[str, list[str]]:
    return {s.host_id: s.told[-1] for s in sessions if s.told and s.told[-1]}


def test_the_cap_counts_the_hosts_of_every_replica():
    async def scenario() -> None:
        store = Shared()
        a, b = Replica(store), Replica(store)
        h1, h3 = a.join(Session("h1")), a.join(Session("h3"))
        h2 = b.join(Session("h2"))
        await settled()
        for replica, host in ((a, h1), (b, h2), (a, h3)):  # the leaf fails: all three ask at once
            replica.says(host, "FENCE_ASKING")
        await settled()
        assert granted(h1, h2, h3) == {"h1": ["eth1"]}
        assert h2.told[-1] == [] and h3.told[-1] == []  # told, with nothing granted
        b.says(h2, "FENCE_ASKING")  # asking again changes nothing, and writes nothing
        writes = store.writes
        await settled()
        assert store.writes == writes and granted(h1, h2, h3) == {"h1": ["eth1"]}
        a.says(h1, "FENCE_FENCED")
        await settled()
        assert granted(h1, h2, h3) == {"h1": ["eth1"]}
        a.says(h1, None)  # h1's fence ended: the slot goes to the next asker, on the other replica
        await settled()
        assert granted(h1, h2, h3) == {"h2": ["eth1"]}
        assert h1.told[-1] == []
    asyncio.run(scenario())


def test_without_the_shared_count_each_replica_grants_its_own_cap():
    """The control: FenceGrants per replica (the count before replicas
    shared it) fences one port per replica on one leaf."""
    a, b = FenceGrants(1), FenceGrants(1)
    h1, h2 = Session("h1"), Session("h2")
    a.report(h1, report("FENCE_ASKING"))  # type: ignore[arg-type]
    a.update({"h1": h1})  # type: ignore[dict-item]
    b.report(h2, report("FENCE_ASKING"))  # type: ignore[arg-type]
    b.update({"h2": h2})  # type: ignore[dict-item]
    assert granted(h1, h2) == {"h1": ["eth1"], "h2": ["eth1"]}


def test_a_store_that_refuses_a_write_loses_no_ask():
    async def scenario() -> None:
        store = Shared()
        store.fail_writes = 1
        a = Replica(store)
        h1 = a.join(Session("h1"))
        a.says(h1, "FENCE_ASKING")
        deadline = asyncio.get_running_loop().time() + 10
        while granted(h1) != {"h1": ["eth1"]}:  # retried after STORE_RETRY_S
            assert asyncio.get_running_loop().time() < deadline, h1.told
            await asyncio.sleep(0.05)
    asyncio.run(scenario())


def test_a_host_that_moves_to_another_replica_has_its_rows_replaced():
    async def scenario() -> None:
        store = Shared()
        a, b = Replica(store), Replica(store)
        h1 = a.join(Session("h1"))
        a.says(h1, "FENCE_FENCED")
        await settled()
        assert granted(h1) == {"h1": ["eth1"]}
        del a.sessions["h1"]  # its stream on a ended; it reconnects to b, its fence over
        moved = b.join(Session("h1"))
        b.says(moved, None)
        await settled()
        assert store.rows == {} and moved.told[-1] == []
    asyncio.run(scenario())


def test_a_new_stream_hears_of_grants_only_after_its_first_report():
    """The server registers a stream before it sends the Welcome, and an
    agent takes a message other than Welcome first as a broken stream: so a
    stream is told nothing until its first report (sent after the Welcome),
    however many grant changes come meanwhile; then it is told at once,
    even that it holds nothing."""
    async def scenario() -> None:
        store = Shared()
        a, b = Replica(store), Replica(store)
        h1 = a.join(Session("h1"))
        a.says(h1, "FENCE_ASKING")
        await settled()
        h2 = b.join(Session("h2"))  # registered; its Welcome not sent yet
        a.says(h1, None)  # a grant change: every replica reads the grants
        await settled()
        assert h1.told[-1] == [] and h2.told == []
        b.says(h2, None)  # its first report: nothing changed in the store
        await settled()
        assert h2.told == [[]]
    asyncio.run(scenario())
