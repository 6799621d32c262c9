"""linkpass-aggregator's gRPC server: the agents' streams and the fleet API.

One `HostSession` per agent stream. Each stream has its own reader (into a
bounded inbox), its own worker (handles the messages in order: a slow store
write for one host holds back only that host's reads) and its own outbox
(acks, probe peers, commands). Whatever one host sends (garbage, floods, an
out-of-order batch) ends *its* stream with a status that says why; other
streams never wait on it.

Acks go out only after `Store.add_events` returned, i.e. after the events are
durable; resent events (seq the store already holds) are ignored by the store
and acked all the same.

Refusals (fleet.proto): INVALID_ARGUMENT for a malformed or out-of-order
message (naming it), PERMISSION_DENIED when the certificate names another host,
RESOURCE_EXHAUSTED over a bound (message size: grpc's max_receive_message_length;
events per batch; queued messages), ABORTED when a newer stream of the same
host replaced this one. A missing or untrusted certificate never gets here: the
TLS handshake fails first (identity.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import structlog

from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd.adapters.grpc_decode import add_servicer
from linkpassd.aggregator import bounds, savings
from linkpassd.aggregator.fleet import Fleet
from linkpassd.aggregator.fleet_api import FleetServicer
from linkpassd.aggregator.identity import Refusal, peer_identity
from linkpassd.aggregator.metrics import AggregatorMetrics
from linkpassd.aggregator.session import HostSession, StreamEnd
from linkpassd.aggregator.settings import Settings
from linkpassd.aggregator.store import (
    ANNOUNCE,
    CHANNEL_HOSTS,
    RAIL_PATH,
    EventRow,
    OutOfOrder,
    Store,
    StoreError,
    kind_name,
    severity_name,
)
from linkpassd.aggregator.watch import DEFAULT_QUEUE

log = structlog.get_logger("linkpassd.aggregator")

HELLO_TIMEOUT_S = 10.0  # a stream that says nothing this long after opening is refused
MAX_EVENTS_PER_BATCH = 1000  # agents send <= 500
INBOX_MAX = 64  # messages read but not handled yet, per stream (agents keep <= 8 batches unacked)
MAX_RAILS = bounds.MAX_RAILS
MAX_PATHS = bounds.MAX_PATHS
MAX_ID_CHARS = 253
# Streams grpc core holds before this server's loop has taken them (a new
# stream waits there until grpc.aio asks core for the next call, one at a
# time, between the loop's other work). Core's defaults (soft 1,000, hard
# 3,000, random early reset in between) reset streams whenever more than
# ~1,000 hosts connect within the same moment: a fleet reconnecting after an
# aggregator restart. The agents saw that as CANCELLED, or INTERNAL "Failed
# execute_batch" when their Hello write hit the reset stream (grpc #36066),
# and the aggregator logged nothing. Bounded instead by time: core still
# drops a stream left waiting past grpc.server_max_unrequested_time_in_server
# (30 s), and an agent gives up on its Welcome after 10 s.
MAX_PENDING_STREAMS = 65536
HANDSHAKE_TIMEOUT_MS = 10_000
MAX_STREAMS_PER_CONNECTION = 1024
LAG_TICK_S = 0.05  # the loop-lag probe's timer
ACCOUNTED = frozenset({RAIL_PATH, ANNOUNCE})  # the kinds whose events can be savings facts (savings.fact)
MERGED_EVENTS_MAX = 4000  # events of waiting batches stored in one call (8 agent batches of 500)


# What the reader queues for a stream's worker (HostSession.pending), by its first item.
EVENTS, PORTS, INVENTORY, END = "events", "ports", "inventory", "end"


def _check_inventory(inventory: pb.Inventory) -> None:
    if len(inventory.rails) > MAX_RAILS:
        raise StreamEnd(grpc.StatusCode.INVALID_ARGUMENT,
                        f"Inventory with {len(inventory.rails)} rails: at most {MAX_RAILS}")
    names = [r.rail for r in inventory.rails]
    if "" in names or len(set(names)) != len(names):
        raise StreamEnd(grpc.StatusCode.INVALID_ARGUMENT,
                        f"Inventory rails must have distinct non-empty names, got {names[:16]}")


def _check_id(what: str, value: str) -> None:
    if not value:
        raise StreamEnd(grpc.StatusCode.INVALID_ARGUMENT, f"Hello.{what} is empty")
    if len(value) > MAX_ID_CHARS or not value.isprintable() or value.strip() != value:
        raise StreamEnd(grpc.StatusCode.INVALID_ARGUMENT, f"Hello.{what} {value[:80]!r} is not a valid name")


class AgentServicer:
    """AgentService.Connect (registered by generic handler: see AggregatorServer)."""

    def __init__(self, fleet: Fleet, *, hello_timeout_s: float = HELLO_TIMEOUT_S) -> None:
        self.fleet = fleet
        self.hello_timeout_s = hello_timeout_s

    async def Connect(self, requests: AsyncIterator[pb.ConnectRequest],
                      context: grpc.aio.ServicerContext) -> None:
        session: HostSession | None = None
        reader: asyncio.Task[None] | None = None
        outcome: StreamEnd | None = None
        try:
            session = await self._accept(requests, context)
            reader = asyncio.create_task(self._read(session, requests, context))
            outcome = await self._write(session, context)
        except StreamEnd as end:
            outcome = end
        except asyncio.CancelledError:  # grpc cancels the handler when the agent cancels its call
            log.info("agent_disconnected", host=None if session is None else session.host_id, peer=context.peer())
            raise
        finally:
            if reader is not None:
                reader.cancel()
            if session is not None:
                if session.worker is not None:
                    session.worker.cancel()
                session.finish(outcome)
                self.fleet.unregister(session)
        if outcome is not None:
            self.fleet.metrics.stream_errors.labels(outcome.code.name).inc()
            log.warning("agent_stream_ended", host=None if session is None else session.host_id,
                        peer=context.peer(), code=outcome.code.name, reason=outcome.message)
            await context.abort(outcome.code, outcome.message)
        elif session is not None:
            log.info("agent_disconnected", host=session.host_id, peer=context.peer())

    async def _accept(self, requests: AsyncIterator[pb.ConnectRequest],
                      context: grpc.aio.ServicerContext) -> HostSession:
        """Hello first (within the deadline), the certificate's check, Welcome."""
        try:
            async with asyncio.timeout(self.hello_timeout_s):
                first = await anext(requests)
        except TimeoutError:
            raise StreamEnd(grpc.StatusCode.INVALID_ARGUMENT,
                            f"no Hello within {self.hello_timeout_s:g} s of opening the stream") from None
        except StopAsyncIteration:
            raise StreamEnd(grpc.StatusCode.INVALID_ARGUMENT, "the stream closed before its Hello") from None
        except Exception as exc:  # noqa: BLE001 - the client went away (cancelled, reset) before its Hello
            raise StreamEnd(grpc.StatusCode.CANCELLED, f"the stream failed before its Hello: {exc}") from None
        which = first.WhichOneof("body")
        if which != "hello":
            raise StreamEnd(grpc.StatusCode.INVALID_ARGUMENT,
                            f"the first message must be a Hello, not {which or 'an empty message'}")
        hello = first.hello
        _check_id("host_id", hello.host_id)
        _check_id("boot_id", hello.boot_id)
        settings = self.fleet.settings
        identity = peer_identity(context, settings.tls.insecure)
        if not identity.insecure and identity.host_id != hello.host_id:
            named = (f"host {identity.host_id!r}" if identity.host_id else
                     "no host (it needs URI SAN linkpass://host/<id> and that id as DNS SAN)")
            log.warning("agent_refused", hello_host=hello.host_id, certificate=identity.subject,
                        peer=context.peer())
            reason = f"Hello says host {hello.host_id!r} but the certificate {identity.subject} names {named}"
            self.fleet.refuse(Refusal(hello.host_id, identity.subject, reason, context.peer(),
                                      self.fleet.clock()))
            raise StreamEnd(grpc.StatusCode.PERMISSION_DENIED, reason)
        session = HostSession(hello.host_id, hello.boot_id, hello.version[:200], context.peer())
        try:
            stored = await self.fleet.store.hello(hello.host_id, hello.boot_id, session.version, self.fleet.clock())
        except StoreError as exc:
            raise StreamEnd(grpc.StatusCode.UNAVAILABLE, f"the aggregator's store failed: {exc}") from None
        session.inventory = await self._stored_inventory(hello.host_id)
        if session.inventory is not None:
            session.gpus = savings.gpus_by_rail(session.inventory.rails)
        self.fleet.register(session)
        if self.fleet.replicas is not None:
            try:
                await self.fleet.replicas.joined(hello.host_id)
            except StoreError as exc:
                raise StreamEnd(grpc.StatusCode.UNAVAILABLE, f"the aggregator's store failed: {exc}") from None
        session.send(pb.ConnectResponse(welcome=pb.Welcome(
            heartbeat_s=settings.heartbeat_s, max_message_bytes=settings.max_message_bytes,
            stored=[pb.EventAck(boot_id=boot, seq=seq) for boot, seq in sorted(stored.items())])))
        log.info("agent_connected", host=hello.host_id, boot=hello.boot_id, version=session.version,
                 peer=context.peer())
        return session

    async def _stored_inventory(self, host_id: str) -> pb.Inventory | None:
        """The host's last inventory (for GPUs behind a port) until it sends a new one."""
        rows = await self.fleet.store.hosts([host_id])
        if rows and rows[0].inventory:
            try:
                return pb.Inventory.FromString(rows[0].inventory)
            except Exception:  # noqa: BLE001 - stored by an older release: the next Inventory replaces it
                return None
        return None

    async def _read(self, session: HostSession, requests: AsyncIterator[pb.ConnectRequest],
                    context: grpc.aio.ServicerContext) -> None:
        """Read the stream and take each message at once (`_take`, which
        never waits): heartbeats and command results are done with here,
        what needs the store joins the stream's pending work. A bad message
        ends the stream once the work before it is done."""
        take = self._take
        try:
            async for request in requests:
                try:
                    take(session, request)
                except StreamEnd as end:
                    self._pend(session, (END, end))
                    return
                except bounds.Refused as exc:
                    self._pend(session, (END, StreamEnd(grpc.StatusCode.INVALID_ARGUMENT, str(exc))))
                    return
                except Exception as exc:  # our bug on this host's input: say so, keep serving the others
                    log.exception("agent_message_failed", host=session.host_id, error=str(exc))
                    self._pend(session, (END, StreamEnd(grpc.StatusCode.INTERNAL,
                                                        f"aggregator error on a {request.WhichOneof('body')}: {exc}")))
                    return
                if not session.open:
                    return
            self._pend(session, (END, None))  # the agent half-closed: finish what was read, then end
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - undecodable bytes or the call gone: told below
            if not context.done():
                # The call is still up, so it did not go away: grpc could not
                # decode what the agent sent (bytes that are not a
                # ConnectRequest). Say so; a status OK would have the agent
                # resend the same bytes for ever.
                log.warning("agent_message_undecodable", host=session.host_id, error=str(exc))
                first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                self._pend(session, (END, StreamEnd(
                    grpc.StatusCode.INVALID_ARGUMENT, f"a message after Hello is not a ConnectRequest: {first_line}")))
                return
            # the call went away (the agent cancelled, a reset): nobody to answer
            log.info("agent_stream_gone", host=session.host_id, error=str(exc).splitlines()[0] if str(exc) else "")
            session.finish(None)
            session.gone = True

    def _take(self, session: HostSession, request: pb.ConnectRequest) -> None:
        """One message, on the reader, without waiting: checked, counted, and
        either done (heartbeat, command result) or queued for the stream's
        worker (events, port report, inventory) in the order read."""
        fleet = self.fleet
        which = request.WhichOneof("body")
        fleet.metrics.messages.inc(which or "none")
        if which == "heartbeat":
            fleet.heartbeat(session.host_id, fleet.clock())
        elif which == "events":
            self._pend(session, (EVENTS, *self._event_rows(session, request.events), time.perf_counter()))
        elif which == "ports":
            bounds.port_report(request.ports)
            self._pend(session, (PORTS, request.ports, fleet.clock(), time.perf_counter()))
            fleet.fences.report(session, request.ports)  # pure and quick: grants follow at once
            fleet.fences.update(fleet.sessions)
        elif which == "inventory":
            inventory = request.inventory
            _check_inventory(inventory)
            bounds.inventory(inventory)
            session.gpus = savings.gpus_by_rail(inventory.rails)  # for the events read after it
            fleet.fences.inventory(session.host_id, inventory)  # for the report read after it
            self._pend(session, (INVENTORY, inventory, fleet.clock(), time.perf_counter()))
        elif which == "command_result":
            result = request.command_result
            future = session.commands.pop(result.id, None)
            if future is None:
                log.info("command_result_unexpected", host=session.host_id, id=result.id)
            elif not future.done():
                future.set_result(result)
        elif which == "hello":
            raise StreamEnd(grpc.StatusCode.INVALID_ARGUMENT, "a second Hello on the same stream")
        else:
            raise StreamEnd(grpc.StatusCode.INVALID_ARGUMENT, "an empty ConnectRequest (no body set)")

    def _pend(self, session: HostSession, item: tuple) -> None:
        """Queue work for the stream's worker, starting it if it is not
        running (a stream with nothing to store has no worker task)."""
        pending = session.pending
        if item[0] is not END and len(pending) >= INBOX_MAX:
            session.finish(StreamEnd(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                     f"more than {INBOX_MAX} messages waiting to be handled: "
                                     "send at most 8 batches before their acks"))
            return
        pending.append(item)
        if session.worker is None:
            session.worker = asyncio.create_task(self._work(session))

    async def _work(self, session: HostSession) -> None:
        """Do the stream's pending work in order, one store call at a time
        (so a host's events are stored in order, and a failed call is the
        last: nothing after it is stored and acked past it), until none is
        left; the task then ends, and the next message that needs the store
        starts another. Event batches waiting together (an agent keeps up to
        8 in flight, and an incident sends several at once) are stored in one
        call and acked once: consecutive batches of one boot, the first of
        them may declare a gap. One call instead of several: with one call at
        a time per stream, each batch otherwise waited for the commit of the
        one before (4 batches, 4 group commits in a row), and every batch had
        its own savepoint, statements and ack to write."""
        pending = session.pending
        stage = self.fleet.metrics.stage
        try:
            while pending:
                item = pending.popleft()
                what = item[0]
                if what is END:
                    session.finish(item[1])
                    return
                now = time.perf_counter()
                stage("inbox", now - item[-1])
                if what is EVENTS:
                    _, boot, rows, gap, _read_at = item
                    while pending:
                        nxt = pending[0]
                        if (nxt[0] is not EVENTS or nxt[1] != boot or nxt[3] is not None
                                or len(rows) + len(nxt[2]) > MERGED_EVENTS_MAX):
                            break
                        pending.popleft()
                        stage("inbox", now - nxt[-1])
                        rows = rows + nxt[2]
                    await self._store_events(session, boot, rows, gap)
                elif what is PORTS:
                    await self.fleet.store.set_report(session.host_id, item[1].SerializeToString(), item[2])
                else:
                    await self._inventory(session, item[1], item[2])
        except StreamEnd as end:
            session.finish(end)
        except OutOfOrder as exc:
            session.finish(StreamEnd(grpc.StatusCode.INVALID_ARGUMENT, str(exc)))
        except StoreError as exc:
            log.error("store_failed", host=session.host_id, error=str(exc))
            session.finish(StreamEnd(grpc.StatusCode.UNAVAILABLE, f"the aggregator's store failed: {exc}"))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # our bug: end this stream, keep serving the others
            log.exception("agent_handler_failed", host=session.host_id, error=str(exc))
            session.finish(StreamEnd(grpc.StatusCode.INTERNAL, f"aggregator error: {exc}"))
        finally:
            session.worker = None

    async def _write(self, session: HostSession, context: grpc.aio.ServicerContext) -> StreamEnd | None:
        """Write the outbox until the session ends: at an error at once, at a
        clean end (None) after what was queued before it (the last acks).
        One plain queue get per response (finish() queues a None to wake
        this): no task or wait set per message, which at thousands of acks
        a second was a good part of the loop's time."""
        stage = self.fleet.metrics.stage
        outbox = session.outbox
        while True:
            item = await outbox.get()
            if session.ended.done():
                outcome = session.ended.result()
                if outcome is not None or session.gone:
                    return outcome
            if item is None:
                return session.ended.result()
            queued_at, message = item
            await context.write(message)
            stage("outbox", time.perf_counter() - queued_at)

    async def _inventory(self, session: HostSession, inventory: pb.Inventory, now: float) -> None:
        await self.fleet.store.set_inventory(session.host_id, inventory.SerializeToString(), now)
        changed = session.inventory != inventory
        session.inventory = inventory
        if changed:
            self.fleet.planner.changed()
            if self.fleet.replicas is not None:
                await self.fleet.store.notify(CHANNEL_HOSTS, session.host_id)  # type: ignore[attr-defined]

    def _event_rows(self, session: HostSession,
                    batch: pb.EventBatch) -> tuple[str, list[EventRow], tuple[int, int] | None]:
        """A batch checked (bounds, boot, order against what this stream sent)
        and turned into store rows: (boot, rows, gap). On the reader, for
        every event: what it needs per event is a dict lookup or a
        protobuf field (the GPUs behind a rail come from `session.gpus`,
        made once per inventory, not from walking the inventory)."""
        boot = batch.boot_id
        events = batch.events
        count = len(events)
        if count > MAX_EVENTS_PER_BATCH:
            raise StreamEnd(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"EventBatch of {count} events: at most {MAX_EVENTS_PER_BATCH} per batch")
        if not boot:
            raise StreamEnd(grpc.StatusCode.INVALID_ARGUMENT, "EventBatch without boot_id")
        gap: tuple[int, int] | None = None
        if batch.gap_first or batch.gap_last:
            if not 0 < batch.gap_first <= batch.gap_last:
                raise StreamEnd(grpc.StatusCode.INVALID_ARGUMENT,
                                f"EventBatch gap [{batch.gap_first}, {batch.gap_last}] is not a range of seqs")
            bounds.batch_gap(batch)
            gap = (batch.gap_first, batch.gap_last)
        if len(boot) > bounds.MAX_NAME_CHARS:
            raise bounds.Refused(f"EventBatch.boot_id is {len(boot)} characters: at most {bounds.MAX_NAME_CHARS}")
        previous = session.last_seq.get(boot, 0)
        rows = []
        gpus = session.gpus
        check_event = bounds.event
        for index, event in enumerate(events):
            seq = event.seq
            check_event(index, event)
            if seq < 1:
                raise StreamEnd(grpc.StatusCode.INVALID_ARGUMENT, f"event seq {seq} of boot {boot}: seqs start at 1")
            event_boot = event.boot_id
            if event_boot and event_boot != boot:
                raise StreamEnd(grpc.StatusCode.INVALID_ARGUMENT,
                                f"event seq {seq} has boot_id {event_boot!r} in a batch of boot {boot!r}")
            if seq <= previous:
                where = "in the same batch" if rows else "sent earlier on this stream"
                raise StreamEnd(grpc.StatusCode.INVALID_ARGUMENT,
                                f"out of order: event seq {seq} of boot {boot} after seq {previous} {where}")
            previous = seq
            kind = kind_name(event.kind)
            rail = event.rail
            stamp = event.time
            fact = savings.fact(kind, rail, event.fields) if kind in ACCOUNTED else None
            rows.append(EventRow(
                seq, stamp.ToNanoseconds() / 1e9, kind, severity_name(event.severity), event.port,
                rail, event.SerializeToString(), fact or "",
                gpus.get(rail, savings.DEFAULT_GPUS) if fact is savings.Fact.FAILOVER else 0))
        session.last_seq[boot] = previous
        return boot, rows, gap

    async def _store_events(self, session: HostSession, boot: str, rows: list[EventRow],
                            gap: tuple[int, int] | None) -> None:
        """Store durably, then ack (EventAck covers every seq up to its own)."""
        fleet = self.fleet
        metrics = fleet.metrics
        started = time.perf_counter()
        result = await fleet.store.add_events(session.host_id, boot, rows, gap, fleet.clock())
        metrics.store_write_seconds.observe(time.perf_counter() - started)
        if result.stored:
            metrics.events_stored.inc(result.stored)
            fleet.fanout.notify()
        if result.duplicates:
            metrics.events_duplicate.inc(result.duplicates)
        if result.lost:
            metrics.events_lost.inc(result.lost)
        session.send(pb.ConnectResponse(ack=pb.EventAck(boot_id=boot, seq=result.last_seq)))


def server_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    """The grpc server's options (labs/bench/agg_floor serves with the same)."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", 256 * 1024 * 1024),
        ("grpc.so_reuseport", 0),  # a second aggregator on the same port must fail, not share it
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.server.max_pending_requests", MAX_PENDING_STREAMS),
        ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_STREAMS),
        # A connection that has not finished its TLS handshake in 10 s is
        # closed (grpc's default is 120 s): idle unauthenticated connections
        # cannot pile up to the open-file limit (issue 30 item 3).
        ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
        # Streams at once on one connection: an agent uses one, linkpassctl a
        # few; labs/bench/agg_load.py multiplexes up to 1,024 hosts on one.
        ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
    ]


class AggregatorServer:
    """The grpc.aio server with AgentService, FleetService, health and reflection.

    `start()` binds `settings.listen` (or `listen` when given, e.g.
    "127.0.0.1:0" in tests) and returns the bound port.
    """

    def __init__(self, settings: Settings, store: Store, *, metrics: AggregatorMetrics | None = None,
                 clock: Callable[[], float] = time.time, hello_timeout_s: float = HELLO_TIMEOUT_S,
                 command_timeout_s: float = 20.0, plan_debounce_s: float = 1.0,
                 watcher_queue: int = DEFAULT_QUEUE) -> None:
        self.settings = settings
        self.metrics = metrics or AggregatorMetrics()
        self.fleet = Fleet(settings, store, self.metrics, clock, watcher_queue=watcher_queue,
                           command_timeout_s=command_timeout_s)
        self.fleet.planner.debounce_s = plan_debounce_s
        self.agent = AgentServicer(self.fleet, hello_timeout_s=hello_timeout_s)
        self.fleet_api = FleetServicer(self.fleet)
        if hasattr(store, "observe"):  # the store's stage timings (metrics.STAGES) into our metrics
            store.observe = self.metrics.stage  # type: ignore[attr-defined]
            store.observe_group = self.metrics.group_calls.observe  # type: ignore[attr-defined]
        self._server: grpc.aio.Server | None = None
        self._health: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self.port = 0

    def credentials(self) -> grpc.ServerCredentials | None:
        tls = self.settings.tls
        if tls.insecure:
            return None
        with open(tls.key, "rb") as k, open(tls.cert, "rb") as c, open(tls.ca, "rb") as a:
            key, cert, ca = k.read(), c.read(), a.read()
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)

    async def start(self, listen: str | None = None) -> int:
        from grpc_health.v1 import health as grpc_health
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        from grpc_reflection.v1alpha import reflection

        from linkpassd._proto.linkpass.v1 import fleet_pb2_grpc as pb_grpc

        if self._server is not None:
            raise RuntimeError("aggregator server already started")
        server = grpc.aio.server(options=server_options(self.settings.max_message_bytes))
        add_servicer(pb_grpc.add_AgentServiceServicer_to_server, self.agent, server)
        add_servicer(pb_grpc.add_FleetServiceServicer_to_server, self.fleet_api, server)
        self._health = grpc_health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        agent_name = pb.DESCRIPTOR.services_by_name["AgentService"].full_name
        fleet_name = pb.DESCRIPTOR.services_by_name["FleetService"].full_name
        reflection.enable_server_reflection(
            (agent_name, fleet_name, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME), server)
        address = listen or self.settings.listen
        credentials = self.credentials()
        try:
            if credentials is None:
                self.port = server.add_insecure_port(address)
            else:
                self.port = server.add_secure_port(address, credentials)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {address}: {exc}") from exc
        await server.start()
        if self.fleet.replicas is not None:
            await self.fleet.replicas.start()
        for name in ("", agent_name, fleet_name):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._server = server
        self._tasks = [asyncio.create_task(self.fleet.fanout.run()),
                       asyncio.create_task(self.fleet.planner.run()),
                       asyncio.create_task(self._loop_lag())]
        return self.port

    async def _loop_lag(self) -> None:
        """The loop_lag stage: how late a LAG_TICK_S timer runs (a loop busy
        with other work delays every stream's reads, writes and acks alike)."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + LAG_TICK_S
            await asyncio.sleep(LAG_TICK_S)
            self.metrics.stage("loop_lag", max(0.0, loop.time() - due))

    async def stop(self, grace: float | None = 5.0) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        for session in list(self.fleet.sessions.values()):
            session.finish(StreamEnd(grpc.StatusCode.UNAVAILABLE, "the aggregator is stopping"))
        self.fleet_api.stopping.set()
        await server.stop(grace)
        await self.fleet.stop_heartbeats()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self.fleet.worker.close()
        if self.fleet.replicas is not None:
            await self.fleet.replicas.stop()

