"""The mesh planner of a replica that does not lead, on a shared store:
what a change costs it (issue 29: per-replica work must not grow with the
number of replicas)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from linkpassd.aggregator.metrics import AggregatorMetrics
from linkpassd.aggregator.planner import MeshPlanner


class NotLeading:
    """A shared store on which another replica holds the planner lead."""

    def __init__(self) -> None:
        self.leads_asked = 0
        self.mesh_reads: list[list[str]] = []

    async def try_lead(self, role: str) -> bool:
        self.leads_asked += 1
        return False

    async def mesh_for(self, host_ids):
        self.mesh_reads.append(list(host_ids))
        return {}


def test_a_change_on_another_replica_costs_a_follower_replica_one_lead_question_only():
    store = NotLeading()
    fleet = SimpleNamespace(store=store, replicas=object(), clock=lambda: 0.0,
                            sessions={"h1": SimpleNamespace(open=True), "h2": SimpleNamespace(open=True)})
    planner = MeshPlanner(fleet, settings=None, metrics=AggregatorMetrics(), worker=object())

    async def scenario():
        planner.changed_elsewhere()  # CHANNEL_HOSTS: a host joined another replica
        await planner.replan()
        assert (store.leads_asked, store.mesh_reads) == (1, [])
        planner.joined("h3")  # a host joined this replica: it hears the standing plan at once
        await planner.replan()
        assert store.leads_asked == 2 and store.mesh_reads == [["h1", "h2"]]
        await planner.replan()  # nothing new here since
        assert store.mesh_reads == [["h1", "h2"]]
    asyncio.run(asyncio.wait_for(scenario(), 10.0))
