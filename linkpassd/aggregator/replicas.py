"""Several aggregator replicas on one shared store (PostgreSQL).

Any replica accepts any host. What one replica knows only in memory (which
hosts are on its streams, the commands it relays, the probe mesh it told)
must reach the others, and it goes through the store, never replica to
replica: the replicas need not know each other's addresses, and a replica
that dies takes nothing with it that the others need.

- **Where a host is.** A replica that accepts a stream records itself as the
  host's replica (`SharedStore.set_replica`) and clears it when the stream
  ends. A replica killed with SIGKILL clears nothing, so a host counts as
  connected only while its `last_seen` is fresh (heartbeats move it) or it
  is on this replica's own streams.
- **Commands.** A drain asked of replica A for a host on replica B is written
  as a pending command; B is woken (CHANNEL_COMMANDS), takes it, relays it
  down the host's stream, and writes the host's answer; A is woken
  (CHANNEL_RESULTS) and answers the operator. Both sides also poll once a
  second, so a lost notification costs a second, not the command.
- **Follow streams** of every replica see every replica's events: the store
  notifies CHANNEL_EVENTS when events commit, and each replica's fan-out
  reads on from its cursor (the store never returns an id while a smaller
  one may still commit, pg_store.py).
- **The probe mesh** is planned by one replica at a time (planner.py, with
  `SharedStore.try_lead`) and each replica tells its own hosts
  (CHANNEL_MESH).
- **Fence grants** are counted in the store, per leaf, across every
  replica's hosts (fencing.py SharedFenceGrants); each replica tells its own
  hosts their grants when told (CHANNEL_FENCE).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import grpc
import structlog

from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd.aggregator.fencing import FenceGrants, SharedFenceGrants
from linkpassd.aggregator.session import StreamEnd
from linkpassd.aggregator.store import (
    CHANNEL_COMMANDS,
    CHANNEL_EVENTS,
    CHANNEL_FENCE,
    CHANNEL_HOSTS,
    CHANNEL_MESH,
    CHANNEL_RESULTS,
    HostRow,
    PendingCommand,
    SharedStore,
    StoreError,
)

if TYPE_CHECKING:
    from linkpassd.aggregator.planner import MeshPlanner
    from linkpassd.aggregator.session import HostSession
    from linkpassd.aggregator.settings import Settings
    from linkpassd.aggregator.watch import EventFanout

log = structlog.get_logger("linkpassd.aggregator.replicas")

RESULT_POLL_S = 1.0  # a lost notification costs at most this
STALE_HEARTBEATS = 3  # a host whose replica stopped clearing it is offline after this many missed heartbeats


def status_code(number: int) -> grpc.StatusCode:
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return code
    return grpc.StatusCode.UNKNOWN


class LocalFleet(Protocol):
    """What the coordination uses of this replica's fleet (fleet.Fleet, which
    makes the Replicas and holds it as `fleet.replicas`)."""

    settings: Settings
    clock: Callable[[], float]
    command_timeout_s: float
    sessions: Mapping[str, HostSession]
    fanout: EventFanout
    planner: MeshPlanner
    fences: FenceGrants | SharedFenceGrants


class Replicas:
    """This replica's side of the coordination; `fleet.replicas` when the store is shared."""

    def __init__(self, fleet: LocalFleet, store: SharedStore, replica_id: str) -> None:
        self.fleet = fleet
        self.store = store
        self.id = replica_id
        self._answered: dict[str, asyncio.Event] = {}  # commands this replica waits on
        self._tasks: set[asyncio.Task[Any]] = set()
        self.relayed = 0  # commands of other replicas relayed to this replica's hosts (tests)

    @property
    def stale_s(self) -> float:
        return STALE_HEARTBEATS * self.fleet.settings.heartbeat_s

    async def start(self) -> None:
        store = self.store
        await store.listen(CHANNEL_EVENTS, lambda _payload: self.fleet.fanout.notify())
        await store.listen(CHANNEL_HOSTS, lambda _payload: self.fleet.planner.changed_elsewhere())
        await store.listen(CHANNEL_COMMANDS, self._on_command)
        await store.listen(CHANNEL_RESULTS, self._on_result)
        await store.listen(CHANNEL_MESH, lambda _payload: self._spawn(self.fleet.planner.tell_from_store()))
        if isinstance(self.fleet.fences, SharedFenceGrants):  # always, on a shared store (fleet.py)
            await store.listen(CHANNEL_FENCE, self.fleet.fences.changed)
        self._spawn(self._poll_commands())

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await self.store.forget_replica(self.id)
        except StoreError as exc:
            log.warning("replica_forget_failed", replica=self.id, error=str(exc))

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("replica_task_failed", error=str(task.exception()))

    # -- where hosts are -------------------------------------------------------

    async def joined(self, host_id: str) -> None:
        await self.store.set_replica(host_id, self.id, self.fleet.clock())
        await self.store.notify(CHANNEL_HOSTS, host_id)
        self._spawn(self._deliver_pending([host_id]))  # commands written while it moved

    def left(self, host_id: str) -> None:
        """The stream ended (called from its handler's `finally`: never waits)."""
        self._spawn(self._left(host_id))

    async def _left(self, host_id: str) -> None:
        try:
            await self.store.clear_replica(host_id, self.id)
            await self.store.notify(CHANNEL_HOSTS, host_id)
        except StoreError as exc:  # its last_seen goes stale all the same
            log.warning("replica_clear_failed", host=host_id, error=str(exc))

    def connected(self, row: HostRow, now: float) -> bool:
        session = self.fleet.sessions.get(row.host_id)
        if session is not None and session.open:
            return True
        return bool(row.replica) and now - row.last_seen <= self.stale_s

    # -- commands for hosts on other replicas -----------------------------------

    async def relay_remote(self, host_id: str, command: pb.Command, timeout_s: float) -> pb.CommandResult:
        """Have the replica that holds host_id relay `command`; its host's
        answer. TimeoutError when no answer came within timeout_s."""
        answered = self._answered[command.id] = asyncio.Event()
        try:
            await self.store.put_command(command.id, host_id, command.SerializeToString(), self.fleet.clock())
            await self.store.notify(CHANNEL_COMMANDS, host_id)
            async with asyncio.timeout(timeout_s):
                while True:
                    result = await self.store.command_result(command.id)
                    if result is not None:
                        return pb.CommandResult(id=command.id, code=result[0], message=result[1])
                    try:
                        async with asyncio.timeout(RESULT_POLL_S):
                            await answered.wait()
                    except TimeoutError:
                        pass
                    answered.clear()
        finally:
            self._answered.pop(command.id, None)

    def _on_result(self, payload: str) -> None:
        if not payload:  # notifications may have been missed: everyone looks again
            for event in self._answered.values():
                event.set()
        elif (event := self._answered.get(payload)) is not None:
            event.set()

    def _on_command(self, payload: str) -> None:
        if not payload:
            hosts = list(self.fleet.sessions)
        elif payload in self.fleet.sessions:
            hosts = [payload]
        else:
            return
        if hosts:
            self._spawn(self._deliver_pending(hosts))

    async def _poll_commands(self) -> None:
        while True:
            await asyncio.sleep(RESULT_POLL_S)
            if self.fleet.sessions:
                try:
                    await self._deliver_pending(list(self.fleet.sessions))
                except StoreError as exc:
                    log.warning("command_poll_failed", error=str(exc))

    async def _deliver_pending(self, hosts: Sequence[str]) -> None:
        for pending in await self.store.take_commands(hosts, self.fleet.clock()):
            self._spawn(self._relay_one(pending))

    async def _relay_one(self, pending: PendingCommand) -> None:

        code, message = grpc.StatusCode.UNAVAILABLE.value[0], f"host {pending.host_id} is not connected"
        session = self.fleet.sessions.get(pending.host_id)
        timeout_s = self.fleet.command_timeout_s - (self.fleet.clock() - pending.created)
        if session is not None and session.open and timeout_s > 0:
            command = pb.Command.FromString(pending.body)
            future: asyncio.Future[pb.CommandResult] = asyncio.get_running_loop().create_future()
            session.commands[command.id] = future
            log.info("fleet_command_relayed", host=pending.host_id, id=command.id, by=command.by)
            self.relayed += 1
            session.send(pb.ConnectResponse(command=command))
            try:
                async with asyncio.timeout(timeout_s):
                    result = await asyncio.shield(future)
                code, message = result.code, result.message
            except TimeoutError:
                code = grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
                message = f"host {pending.host_id} did not answer in time (it may still apply it)"
            except StreamEnd as end:
                code, message = end.code.value[0], end.message
            finally:
                session.commands.pop(command.id, None)
        await self.store.put_result(pending.command_id, code, message, self.fleet.clock())
        await self.store.notify(CHANNEL_RESULTS, pending.command_id)

