"""When to re-plan the probe mesh, and who is told.

The plan itself is mesh.plan (pure). This is the shell around it: a join, a
leave or an inventory change marks the plan dirty; one task re-plans at most
once per `debounce_s` (a whole fleet reconnecting after an aggregator restart
is one plan, not thousands), over the *connected* hosts that sent an
inventory (a disconnected host's daemon may be down: probing it would report
false path failures), and sends ProbePeers only to hosts whose peers changed,
or that (re)joined since they were last told.

Above worker.OFF_LOOP_ABOVE_HOSTS the plan is made in the aggregator's
worker process (aggregator.worker), never on the event loop or a thread of
this process: mesh.plan is pure Python (33 s of CPU for 16,384 hosts x 8
rails on the 2-core lab machine), and a thread holding the GIL that long
starves the event loop and the store's worker thread, so every host's acks
wait for it.

Generations come from the wall clock in milliseconds (and always increase
within a run), so an agent that kept the generation of an aggregator that was
restarted still takes the new aggregator's plans (or another replica's).

Several replicas on a shared store (replicas.py): one plan for the whole
fleet, made by whichever replica holds the "mesh-planner" lead
(`SharedStore.try_lead`), over every host the store says is connected on any
replica, and written to the store whole. Every replica (the planner
included) is then told (CHANNEL_MESH) and sends its own hosts their entries
that changed (`tell_from_store`). A replica that is not the planner still
tells a host that joins it the standing plan's entry at once, and does
nothing more when a host joins or leaves another replica. The planner's
lead is an advisory lock on its own database connection: when that replica
dies, the next change (its hosts joining others) is planned by another.
While shared, the plan is also redone every STALE_REPLAN_S, so a host whose
replica died without clearing it leaves the plan once it is stale.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import TYPE_CHECKING, Any

import structlog

from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd.aggregator import mesh
from linkpassd.aggregator.store import CHANNEL_MESH
from linkpassd.aggregator.worker import Worker

if TYPE_CHECKING:
    from linkpassd.aggregator.metrics import AggregatorMetrics
    from linkpassd.aggregator.settings import Settings

log = structlog.get_logger("linkpassd.aggregator.mesh")

STALE_REPLAN_S = 30.0  # shared store: re-plan at least this often
LEAD_ROLE = "mesh-planner"

HostPlan = dict[str, tuple[str, ...]]
Probers = dict[str, dict[str, tuple[str, ...]]]


def plan_rows(rows: list[tuple[str, str, str, str]], peers_per_rail: int,
              max_peers_per_rail: int) -> tuple[mesh.Plan, Probers]:
    """The plan and who probes whom, from (host_id, rail, address, leaf)
    tuples: what the worker process runs (plain tuples pickle fast)."""
    members = [mesh.Member(*row) for row in rows]
    new = mesh.plan(members, peers_per_rail=peers_per_rail, max_peers_per_rail=max_peers_per_rail)
    return new, mesh.probers(new, members)


class MeshPlanner:
    def __init__(self, fleet: Any, settings: Settings, metrics: AggregatorMetrics,
                 debounce_s: float = 1.0, worker: Worker | None = None) -> None:
        self._fleet = fleet  # fleet.Fleet: .sessions (host -> HostSession with .inventory, .send)
        self._settings = settings
        self._metrics = metrics
        self.debounce_s = debounce_s
        self._dirty = asyncio.Event()
        # what each connected host was last sent: its peers, and who probes it
        self._told: dict[str, tuple[HostPlan, HostPlan]] = {}
        self._told_shared: dict[str, bytes] = {}  # shared store: the plan entry each host was last sent
        self._generation = 0
        self._worker = worker or Worker("mesh")  # big plans run there
        # host -> (the inventory object, its members): parsing 16,384 hosts'
        # addresses again at every plan took over a second of the loop.
        self._members: dict[str, tuple[pb.Inventory, list[mesh.Member]]] = {}
        self.plans = 0  # completed plans (tests wait on it)
        self._shared_signature = b""  # shared store: what this replica's last plan was made of
        self._changed_here = False  # shared store: a host joined, left or changed on this replica

    def joined(self, host_id: str) -> None:
        self._told.pop(host_id, None)  # a new stream: tell it, changed or not
        self._told_shared.pop(host_id, None)
        self.changed()

    def left(self, host_id: str) -> None:
        self._told.pop(host_id, None)
        self._members.pop(host_id, None)
        self._told_shared.pop(host_id, None)
        self.changed()

    def changed(self) -> None:
        """A host of this replica joined, left or sent a new inventory."""
        self._changed_here = True
        self.changed_elsewhere()

    def changed_elsewhere(self) -> None:
        """Another replica's host did (CHANNEL_HOSTS): only the planner
        replica has work to do; the others just ask whether they lead."""
        self._dirty.set()
        self._metrics.plan_pending.set(1)

    def next_generation(self) -> int:
        self._generation = max(self._generation + 1, int(time.time() * 1000))
        return self._generation

    async def run(self) -> None:
        shared = self._fleet.replicas is not None
        while True:
            if shared:
                try:
                    async with asyncio.timeout(STALE_REPLAN_S):
                        await self._dirty.wait()
                except TimeoutError:
                    pass
            else:
                await self._dirty.wait()
            await asyncio.sleep(self.debounce_s)  # collect the joins of a burst into one plan
            self._dirty.clear()
            try:
                await self.replan()
            except Exception as exc:  # a planner bug must not stop ingestion; the next change retries
                log.exception("mesh_plan_failed", error=str(exc))
            if not self._dirty.is_set():
                self._metrics.plan_pending.set(0)

    async def replan(self) -> None:
        if self._fleet.replicas is not None:
            await self._replan_shared()
            return
        sessions = dict(self._fleet.sessions)
        members = [m for host, s in sorted(sessions.items()) if s.inventory is not None
                   for m in self._members_of(host, s.inventory)]
        hosts = {m.host_id for m in members}
        new, probed_by = await self._plan(members, len(hosts))
        self.plans += 1
        self._metrics.plans.inc()
        sent = 0
        for n, (host, session) in enumerate(sessions.items()):
            if n % 512 == 511:
                await asyncio.sleep(0)  # thousands of hosts: let their acks out in between
            entry: HostPlan = dict(new.get(host, {}))
            answer = probed_by.get(host, {})
            if host not in hosts or not session.open:
                continue
            if self._told.get(host) == (entry, answer):
                continue
            message = mesh.probe_peers(entry, self.next_generation(), answer)
            session.send(pb.ConnectResponse(peers=message))
            self._told[host] = (entry, answer)
            sent += 1
        if sent:
            log.info("mesh_planned", hosts=len(hosts), told=sent, generation=self._generation)

    def _members_of(self, host: str, inventory: pb.Inventory) -> list[mesh.Member]:
        cached = self._members.get(host)
        if cached is None or cached[0] is not inventory:
            cached = (inventory, mesh.members_from_inventory(host, inventory))
            self._members[host] = cached
        return cached[1]

    async def _plan(self, members: list[mesh.Member], hosts: int) -> tuple[mesh.Plan, Probers]:
        """mesh.plan and mesh.probers, off the loop for a big fleet (aggregator.worker)."""
        settings = self._settings
        rows = [(m.host_id, m.rail, m.address, m.leaf) for m in members]
        return await self._worker.run(hosts, plan_rows, rows, settings.peers_per_rail,
                                      settings.max_peers_per_rail)

    def close(self) -> None:
        """Stop the worker process, even mid-plan."""
        self._worker.close()

    # -- several replicas on a shared store -----------------------------------

    async def _replan_shared(self) -> None:
        fleet = self._fleet
        store = fleet.store
        if not await store.try_lead(LEAD_ROLE):
            self._shared_signature = b""  # another replica plans: ours is no longer the standing plan
            # Joins here hear the standing plan at once; a change on another
            # replica costs this one nothing more (reading its hosts' entries
            # at every join anywhere was work growing with the replicas):
            # a new plan comes with CHANNEL_MESH.
            if self._changed_here:
                self._changed_here = False
                await self.tell_from_store()
            return
        now = fleet.clock()
        members = []
        # What the plan is made of: the connected hosts and their inventories.
        # Unchanged since this replica's last plan (the STALE_REPLAN_S round
        # with nobody gone stale): no plan. At 16,384 hosts a plan is half a
        # minute of a core (see the module docstring), and redoing it every
        # STALE_REPLAN_S kept a core busy for nothing.
        signature = hashlib.blake2b(digest_size=16)
        for row in await store.hosts():
            if not row.inventory or not fleet.connected(row, now):
                continue
            signature.update(row.host_id.encode() + b"\0" + row.inventory + b"\1")
            try:
                inventory = pb.Inventory.FromString(row.inventory)
            except Exception:  # noqa: BLE001 - an undecodable stored inventory: the host's next one replaces it
                continue
            members.extend(mesh.members_from_inventory(row.host_id, inventory))
        if signature.digest() == self._shared_signature:
            await self.tell_from_store()
            return
        new, probed_by = await self._plan(members, len({m.host_id for m in members}))
        self._shared_signature = signature.digest()
        entries = {host: mesh.probe_peers(entry, 0, probed_by.get(host, {})).SerializeToString()
                   for host, entry in new.items()}
        generation = self.next_generation()
        await store.put_mesh(generation, entries)
        await store.notify(CHANNEL_MESH, str(generation))
        self.plans += 1
        self._metrics.plans.inc()
        log.info("mesh_planned", hosts=len(entries), generation=generation, replica=fleet.replicas.id)

    async def tell_from_store(self) -> int:
        """Send this replica's hosts their entries of the stored plan that
        changed since they were last told; how many were told."""
        fleet = self._fleet
        local = {host: s for host, s in fleet.sessions.items() if s.open}
        if not local:
            return 0
        entries = await fleet.store.mesh_for(sorted(local))
        told = 0
        for host, blob in entries.items():
            session = local.get(host)
            if session is None or not session.open or self._told_shared.get(host) == blob:
                continue
            message = pb.ProbePeers.FromString(blob)
            message.generation = self.next_generation()
            session.send(pb.ConnectResponse(peers=message))
            self._told_shared[host] = blob
            told += 1
        return told
