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
restarted still takes the new aggregator's plans.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import structlog

from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd.aggregator import mesh

if TYPE_CHECKING:
    from linkpassd.aggregator.metrics import AggregatorMetrics
    from linkpassd.aggregator.settings import Settings

log = structlog.get_logger("linkpassd.aggregator.mesh")

THREAD_ABOVE_HOSTS = 512  # plan on a worker thread above this many hosts (keeps the loop free)

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
        self._generation = 0
        self.plans = 0  # completed plans (tests wait on it)

    def joined(self, host_id: str) -> None:
        self._told.pop(host_id, None)  # a new stream: tell it, changed or not
        self.changed()

    def left(self, host_id: str) -> None:
        self._told.pop(host_id, None)
        self.changed()

    def changed(self) -> None:
        self._dirty.set()

    def next_generation(self) -> int:
        self._generation = max(self._generation + 1, int(time.time() * 1000))
        return self._generation

    async def run(self) -> None:
        while True:
            await self._dirty.wait()
            await asyncio.sleep(self.debounce_s)  # collect the joins of a burst into one plan
            self._dirty.clear()
            try:
                await self.replan()
            except Exception as exc:  # a planner bug must not stop ingestion; the next change retries
                log.exception("mesh_plan_failed", error=str(exc))

    async def replan(self) -> None:
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
