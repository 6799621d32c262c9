"""Real linkpassd agents without their daemons, for the aggregator's system tests.

Each agent is linkpassd's own (its on-disk spool and its gRPC client, as the
daemon runs them); only the daemon is left out: events are offered to the
spool's hand-off the way the daemon's event flush offers them, and the host
side of commands and probe peers is recorded here.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from linkpassd._proto.linkpass.v1 import control_pb2, fleet_pb2
from linkpassd.agent.client import AgentClient
from linkpassd.agent.spool import Spool, SpoolWriter
from linkpassd.core.events import Event, EventKind, Severity
from linkpassd.core.model import AggregatorSettings

CHUNK = 25  # events per offer, as one reconcile pass would hand over


class Host:
    """What an agent asks of its daemon: an inventory, a report, and a record
    of the commands, probe peers and fence grants it was given. `phase`:
    eth0's fence phase in the report ("" none; set it, then poke the client)."""

    def __init__(self, name: str, *, address: str = "", leaf: str = "") -> None:
        self.name = name
        self.address = address
        self.leaf = leaf
        self.commands: list[fleet_pb2.Command] = []
        self.peers: list[fleet_pb2.ProbePeers] = []
        self.phase = ""
        self.fence: list[list[str] | None] = []

    def inventory(self) -> fleet_pb2.Inventory:
        return fleet_pb2.Inventory(rails=[fleet_pb2.RailInventory(
            rail="rail0", port="eth0", address=self.address, leaf=self.leaf)])

    def port_report(self) -> fleet_pb2.PortReport:
        ports = [control_pb2.PortState(port="eth0", verdict=control_pb2.VERDICT_DOWN,
                                       phase=self.phase)] if self.phase else []
        return fleet_pb2.PortReport(ports=ports, rail_paths={"rail0": "rail0"})

    def take_fence_grants(self, ports: list[str] | None) -> None:
        self.fence.append(ports)

    def take_peers(self, message: fleet_pb2.ProbePeers) -> None:
        self.peers.append(message)

    async def command(self, command: fleet_pb2.Command) -> tuple[int, str]:
        self.commands.append(command)
        return 0, f"{self.name} took {command.id}"


def event(boot: str, seq: int) -> Event:
    return Event(boot_id=boot, seq=seq, wall=time.time(), mono=time.monotonic(), kind=EventKind.SIGNAL,
                 severity=Severity.INFO, name="echo_path", port="eth0", rail="rail0",
                 message=f"event {seq}", fields=(("n", str(seq)),))


class Agent:
    def __init__(self, workdir: Path, name: str, addresses: Sequence[str], seed: int,
                 host: Host | None = None) -> None:
        self.name = name
        self.boot = f"boot-{name}"
        self.host = host or Host(name)
        self.spool = Spool(str(workdir / name / "spool"), 100_000)
        self.writer = SpoolWriter(self.spool)
        self.client = AgentClient(AggregatorSettings(addresses=tuple(addresses), insecure=True, host_id=name),
                                  self.spool, self.host, boot_id=self.boot, rng=random.Random(seed),
                                  backoff_base_s=0.05, backoff_cap_s=1.0)
        self.writer.on_written = self.client.wake
        self.offered = 0

    def offer(self, count: int) -> None:
        first = self.offered + 1
        self.writer.offer([event(self.boot, s) for s in range(first, first + count)])
        self.offered += count

    @property
    def acked(self) -> int:
        return self.spool.acked.get(self.boot, 0)


class AgentFleet:
    """Agents running in this event loop; `async with` starts and stops them
    (bounded: an agent that swallows its cancellation fails the test)."""

    def __init__(self, agents: Sequence[Agent]) -> None:
        self.agents = list(agents)
        self._tasks: list[asyncio.Task] = []

    async def __aenter__(self) -> "AgentFleet":
        for agent in self.agents:
            self._tasks += [asyncio.create_task(agent.writer.run()), asyncio.create_task(agent.client.run())]
        return self

    async def __aexit__(self, *exc) -> None:
        for task in self._tasks:
            task.cancel()
        done, stuck = await asyncio.wait(self._tasks, timeout=30)
        for task in done:
            if not task.cancelled():
                task.exception()  # retrieved: an error on the way out is not the point
        assert not stuck, f"tasks ignored their cancellation: {[t.get_coro() for t in stuck]}"

    async def burst(self, per_agent: int, *, between: Callable[[], Awaitable[None]] | None = None) -> None:
        """Offer `per_agent` events to each agent, CHUNK at a time, calling
        `between` after each round (where a test kills something mid-stream)."""
        while any(a.offered < per_agent for a in self.agents):
            for agent in self.agents:
                agent.offer(min(CHUNK, per_agent - agent.offered))
            await asyncio.sleep(0.002)
            if between is not None:
                await between()

    async def wait_acked(self, per_agent: int, deadline_s: float) -> None:
        deadline = time.monotonic() + deadline_s
        while any(a.acked < per_agent for a in self.agents):
            assert time.monotonic() < deadline, {a.name: a.acked for a in self.agents}
            await asyncio.sleep(0.1)
