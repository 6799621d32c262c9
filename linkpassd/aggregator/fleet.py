"""What the aggregator's servicers share: the `Fleet` of live host sessions
and the components around them (store, metrics, event fan-out, mesh planner,
the worker process and, on a shared store, the replicas' coordination).

The server (server.py) makes one and hands it to the agents' servicer, the
fleet API (fleet_api.py) and fleet validation (validation.py); none of them
imports the server.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import uuid
from collections.abc import Callable

import grpc
import structlog

from linkpassd.aggregator.fencing import FenceGrants, SharedFenceGrants
from linkpassd.aggregator.identity import Refusal
from linkpassd.aggregator.metrics import AggregatorMetrics
from linkpassd.aggregator.planner import MeshPlanner
from linkpassd.aggregator.replicas import Replicas
from linkpassd.aggregator.session import HostSession, StreamEnd
from linkpassd.aggregator.settings import Settings
from linkpassd.aggregator.store import HostRow, Store, StoreError, is_shared
from linkpassd.aggregator.watch import DEFAULT_QUEUE, EventFanout
from linkpassd.aggregator.worker import Worker

log = structlog.get_logger("linkpassd.aggregator")

HEARTBEAT_FLUSH_S = 1.0  # heartbeats are written together at most this often (Fleet.heartbeat)
MAX_REFUSALS = 1000  # refused hosts remembered for the page (Fleet.refuse)


class Fleet:
    """What the servicers share: live sessions and the components around them."""

    def __init__(self, settings: Settings, store: Store, metrics: AggregatorMetrics,
                 clock: Callable[[], float], *, watcher_queue: int = DEFAULT_QUEUE,
                 command_timeout_s: float = 20.0) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.command_timeout_s = command_timeout_s
        self.sessions: dict[str, HostSession] = {}
        # Hosts refused since this process started, newest last, by the
        # host_id their Hello said; forgotten when that host is taken.
        self.refused: dict[str, Refusal] = {}
        self.fanout = EventFanout(store, queue_size=watcher_queue, on_drop=metrics.watchers_dropped.inc)
        # One worker process for the big pure-Python jobs (mesh plans,
        # validation plans and localisation), off the event loop.
        self.worker = Worker("aggregator")
        self.planner = MeshPlanner(self, settings, metrics, worker=self.worker)
        # A leaf's fence cap counts every host: in memory here, or in the
        # store when replicas share one (aggregator.fencing).
        self.fences: FenceGrants | SharedFenceGrants = (
            SharedFenceGrants(settings.fence_leaf_cap, store, self.sessions)  # type: ignore[arg-type]
            if is_shared(store) else FenceGrants(settings.fence_leaf_cap))
        self._command_ids = itertools.count(1)
        self._instance = uuid.uuid4().hex[:8]
        self._beats: dict[str, float] = {}  # heartbeats not written yet: host -> newest
        self._beat_writer: asyncio.Task[None] | None = None
        # Several replicas on one shared store: where hosts are, commands and
        # the mesh go through the store (replicas.py). None: this process is
        # the whole aggregator.
        self.replicas: Replicas | None = (
            Replicas(self, store, f"{socket.gethostname()}/{os.getpid()}/{self._instance}")  # type: ignore[arg-type]
            if is_shared(store) else None)

    def connected(self, row: HostRow, now: float) -> bool:
        """Is the host on a stream (this replica's, or while shared, another live one's)?"""
        if self.replicas is not None:
            return self.replicas.connected(row, now)
        session = self.sessions.get(row.host_id)
        return session is not None and session.open

    def heartbeat(self, host_id: str, now: float) -> None:
        """A host's heartbeat, written with every other host's pending one in
        a single store call (Store.touch_many) by one writer task.

        Why not awaited on the host's stream: a heartbeat is no promise (no
        ack; last_seen only says "heard lately", replicas call a host gone
        after several heartbeats), and awaiting its commit held every message
        the host sent after it (an incident's events) for one more group
        commit. Why together: 16,384 hosts heartbeat ~3,300 times a second;
        one write each was that many savepoints (SQLite) or transactions
        and WAL flushes (PostgreSQL). Why at most every HEARTBEAT_FLUSH_S
        (or half a heartbeat period, if shorter) and not as fast as the
        store commits: a writer that wrote whatever had come in since its
        last commit made one group commit (an fsync, two worker hand-offs)
        for every one or two heartbeats, about 160 a second at 2,048
        hosts, two thirds of the aggregator's CPU in a steady fleet. A
        store failure here is logged; the host's next event batch fails
        its stream as before."""
        if now > self._beats.get(host_id, float("-inf")):
            self._beats[host_id] = now
        if self._beat_writer is None or self._beat_writer.done():
            self._beat_writer = asyncio.create_task(self._write_beats())

    async def _write_beats(self) -> None:
        pause = min(HEARTBEAT_FLUSH_S, self.settings.heartbeat_s / 2)
        while self._beats:
            await asyncio.sleep(pause)
            beats, self._beats = self._beats, {}
            try:
                await self.store.touch_many(beats)
            except StoreError as exc:
                log.warning("heartbeats_not_stored", hosts=len(beats), error=str(exc))

    async def stop_heartbeats(self) -> None:
        if self._beat_writer is not None:
            self._beat_writer.cancel()
            await asyncio.gather(self._beat_writer, return_exceptions=True)

    def command_id(self) -> str:
        return f"{self._instance}-{next(self._command_ids)}"

    def refuse(self, refusal: Refusal) -> None:
        """Remember a refused host for the page (at most MAX_REFUSALS, the
        oldest forgotten first: a flood of bad Hellos cannot grow it)."""
        self.refused.pop(refusal.host_id, None)
        self.refused[refusal.host_id] = refusal
        while len(self.refused) > MAX_REFUSALS:
            del self.refused[next(iter(self.refused))]

    def register(self, session: HostSession) -> None:
        self.refused.pop(session.host_id, None)
        old = self.sessions.get(session.host_id)
        self.sessions[session.host_id] = session
        if old is not None:
            log.info("agent_replaced", host=session.host_id, old_peer=old.peer, peer=session.peer)
            old.finish(StreamEnd(grpc.StatusCode.ABORTED, "replaced by a newer connection"))
        self.metrics.hosts_connected.set(len(self.sessions))
        self.planner.joined(session.host_id)
        self.fences.joined(session.host_id)

    def unregister(self, session: HostSession) -> None:
        if self.sessions.get(session.host_id) is session:
            del self.sessions[session.host_id]
            self.metrics.hosts_connected.set(len(self.sessions))
            self.planner.left(session.host_id)
            if self.replicas is not None:
                self.replicas.left(session.host_id)
