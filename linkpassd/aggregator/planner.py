"""When to re-plan the probe mesh, and who is told.

The plan itself is mesh.plan (pure). This is the shell around it: a join, a
leave or an inventory change marks the plan dirty; one task re-plans at most
once per `debounce_s` (a whole fleet reconnecting after an aggregator restart
is one plan, not thousands), over the *connected* hosts that sent an
inventory (a disconnected host's daemon may be down: probing it would report
false path failures), and sends ProbePeers only to hosts whose peers changed,
or that (re)joined since they were last told.

Generations come from the wall clock in milliseconds (and always increase
within a run), so an agent that kept the generation of an aggregator that was
restarted still takes the new aggregator's plans (or another replica's).

Several replicas on a shared store (replicas.py): one plan for the whole
fleet, made by whichever replica holds the "mesh-planner" lead
(`SharedStore.try_lead`), over every host the store says is connected on any
replica, and written to the store whole. Every replica (the planner
included) is then told (CHANNEL_MESH) and sends its own hosts their entries
that changed (`tell_from_store`). A replica that is not the planner still
tells a host that joins it the standing plan's entry at once. The planner's
lead is an advisory lock on its own database connection: when that replica
dies, the next change (its hosts joining others) is planned by another.
While shared, the plan is also redone every STALE_REPLAN_S, so a host whose
replica died without clearing it leaves the plan once it is stale.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import structlog

from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd.aggregator import mesh
from linkpassd.aggregator.store import CHANNEL_MESH

if TYPE_CHECKING:
    from linkpassd.aggregator.metrics import AggregatorMetrics
    from linkpassd.aggregator.settings import Settings

log = structlog.get_logger("linkpassd.aggregator.mesh")

THREAD_ABOVE_HOSTS = 512  # plan on a worker thread above this many hosts (keeps the loop free)
STALE_REPLAN_S = 30.0  # shared store: re-plan at least this often
LEAD_ROLE = "mesh-planner"

HostPlan = dict[str, tuple[str, ...]]


class MeshPlanner:
    def __init__(self, fleet: Any, settings: Settings, metrics: AggregatorMetrics,
                 debounce_s: float = 1.0) -> None:
        self._fleet = fleet  # server.Fleet: .sessions (host -> HostSession with .inventory, .send)
        self._settings = settings
        self._metrics = metrics
        self.debounce_s = debounce_s
        self._dirty = asyncio.Event()
        # what each connected host was last sent: its peers, and who probes it
        self._told: dict[str, tuple[HostPlan, HostPlan]] = {}
        self._told_shared: dict[str, bytes] = {}  # shared store: the plan entry each host was last sent
        self._generation = 0
        self.plans = 0  # completed plans (tests wait on it)

    def joined(self, host_id: str) -> None:
        self._told.pop(host_id, None)  # a new stream: tell it, changed or not
        self._told_shared.pop(host_id, None)
        self.changed()

    def left(self, host_id: str) -> None:
        self._told.pop(host_id, None)
        self._told_shared.pop(host_id, None)
        self.changed()

    def changed(self) -> None:
        self._dirty.set()

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

    async def replan(self) -> None:
        if self._fleet.replicas is not None:
            await self._replan_shared()
            return
        sessions = dict(self._fleet.sessions)
        members = [m for host, s in sorted(sessions.items()) if s.inventory is not None
                   for m in mesh.members_from_inventory(host, s.inventory)]
        hosts = {m.host_id for m in members}
        settings = self._settings
        args = dict(peers_per_rail=settings.peers_per_rail, max_peers_per_rail=settings.max_peers_per_rail)
        if len(hosts) > THREAD_ABOVE_HOSTS:
            new = await asyncio.to_thread(mesh.plan, members, **args)
        else:
            new = mesh.plan(members, **args)
        probed_by = mesh.probers(new, members)
        self.plans += 1
        self._metrics.plans.inc()
        sent = 0
        for host, session in sessions.items():
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

    # -- several replicas on a shared store -----------------------------------

    async def _replan_shared(self) -> None:
        fleet = self._fleet
        store = fleet.store
        if not await store.try_lead(LEAD_ROLE):
            await self.tell_from_store()  # joins here hear the standing plan at once
            return
        now = fleet.clock()
        members = []
        for row in await store.hosts():
            if not row.inventory or not fleet.connected(row, now):
                continue
            try:
                inventory = pb.Inventory.FromString(row.inventory)
            except Exception:  # an undecodable stored inventory: the host's next one replaces it
                continue
            members.extend(mesh.members_from_inventory(row.host_id, inventory))
        settings = self._settings
        args = dict(peers_per_rail=settings.peers_per_rail, max_peers_per_rail=settings.max_peers_per_rail)
        if len({m.host_id for m in members}) > THREAD_ABOVE_HOSTS:
            new = await asyncio.to_thread(mesh.plan, members, **args)
        else:
            new = mesh.plan(members, **args)
        probed_by = mesh.probers(new, members)
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
