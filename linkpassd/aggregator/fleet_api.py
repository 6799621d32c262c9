"""FleetService: what operators, linkpassctl fleet and the web page read, and
the fleet drain commands relayed down a host's stream.

Reading needs any trusted certificate (the TLS handshake checked it);
FleetDrain and FleetUndrain need an operator identity (identity.py). A command
goes to the host's live stream and the call waits, bounded, for the host's
CommandResult, whose code is the host's control API's answer. With several
replicas on a shared store, a host on another replica's stream gets the
command through the store (replicas.py).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

import grpc
import structlog
from google.protobuf import timestamp_pb2

from linkpassd._proto.linkpass.v1 import control_pb2 as cpb
from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd._proto.linkpass.v1 import fleet_pb2_grpc as pb_grpc
from linkpassd.aggregator import bounds, savings
from linkpassd.aggregator.identity import peer_identity
from linkpassd.aggregator.replicas import status_code
from linkpassd.aggregator.session import HostSession, StreamEnd
from linkpassd.aggregator.store import EventQuery, HostRow, StoredEvent, StoreError, kind_name
from linkpassd.aggregator.validation import Validations

if TYPE_CHECKING:
    from linkpassd.aggregator.fleet import Fleet

log = structlog.get_logger("linkpassd.aggregator.fleet")

DEFAULT_LIMIT = 1000
MAX_LIMIT = 10_000
MAX_SUMMARY_DAYS = 366
# WatchFleetEvents streams open at once: per identity (a certificate's host
# or operator; in insecure mode the peer's address), and in all. 2,000
# watchers on one host certificate pinned the aggregator's CPU: every new
# event is matched and encoded once per watcher.
MAX_WATCHERS_PER_IDENTITY = 16
MAX_WATCHERS = 512


def timestamp(unix: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(round(unix * 1e9))
    return ts


def kind_filter(value: int) -> str:
    """A request's EventKind -> the store's kind string ("" = any)."""
    if value == 0:
        return ""
    return kind_name(value)


def fleet_event(stored: StoredEvent) -> pb.FleetEvent:
    try:
        event = cpb.Event.FromString(stored.body)
    except Exception:  # noqa: BLE001 - stored as received; a body we cannot parse still shows where it came from
        event = cpb.Event(boot_id=stored.boot_id, seq=stored.seq, port=stored.port,
                          message="(undecodable event body)")
    return pb.FleetEvent(host_id=stored.host_id, id=stored.id, event=event,
                         stored_at=timestamp(stored.stored_at))


def _verdict_name(value: int) -> str:
    try:
        return cpb.Verdict.Name(value).removeprefix("VERDICT_")
    except ValueError:
        return f"VERDICT_{value}"


def _host_views(rows: Sequence[HostRow], connected: Sequence[bool], served_at: float) -> pb.ListHostsResponse:
    views = []
    for row, up in zip(rows, connected):
        view = pb.HostView(host_id=row.host_id, boot_id=row.boot_id, version=row.version, connected=up,
                           last_seen=timestamp(row.last_seen), last_seq=row.last_seq,
                           events_lost=min(row.events_lost, 2**64 - 1))
        try:
            if row.inventory:
                view.rails.extend(pb.Inventory.FromString(row.inventory).rails)
            if row.report:
                view.report.CopyFrom(pb.PortReport.FromString(row.report))
        except Exception as exc:  # noqa: BLE001 - one bad stored blob must not hide the fleet
            log.warning("host_row_undecodable", host=row.host_id, error=str(exc))
        views.append(view)
    return pb.ListHostsResponse(hosts=views, served_at=timestamp(served_at))


class FleetServicer(pb_grpc.FleetServiceServicer):
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.stopping = asyncio.Event()
        self.validations = Validations(fleet, budget_pps=fleet.settings.validation_host_budget_pps)
        self.watchers: dict[str, int] = {}  # identity -> WatchFleetEvents streams open

    def _watcher_identity(self, context: grpc.aio.ServicerContext) -> str:
        identity = peer_identity(context, self.fleet.settings.tls.insecure)
        if identity.insecure:
            peer = context.peer()  # "ipv4:127.0.0.1:5555": the address without the port
            return "peer " + peer.rsplit(":", 1)[0]
        if identity.operator is not None:
            return f"operator {identity.operator}"
        if identity.host_id is not None:
            return f"host {identity.host_id}"
        return f"certificate {identity.subject}"

    # -- queries, shared with the web page ---------------------------------

    async def hosts_response(self, host_ids: Sequence[str] = ()) -> pb.ListHostsResponse:
        fleet = self.fleet
        rows = await fleet.store.hosts(list(host_ids))
        now = fleet.clock()
        connected = [fleet.connected(row, now) for row in rows]  # on the loop: it reads the sessions
        # Decoding every host's stored inventory and report is the bulk of a
        # fleet read: in a thread, so a big fleet view never holds the agents'
        # acks on the loop.
        return await asyncio.to_thread(_host_views, rows, connected, fleet.clock())

    async def events_list(self, query: EventQuery) -> list[pb.FleetEvent]:
        return [fleet_event(e) for e in await self.fleet.store.events(query)]

    async def summary(self, days: int) -> pb.GetSummaryResponse:
        fleet = self.fleet
        now = fleet.clock()
        today = savings.day_of(now)
        first = dt.date.fromisoformat(today) - dt.timedelta(days=days - 1)
        since = dt.datetime.combine(first, dt.time(), tzinfo=dt.timezone.utc).timestamp()
        totals = await fleet.store.day_totals(since, now + 1)
        cost = fleet.settings.restart_cost_min
        hosts = await self.hosts_response()
        verdicts: dict[str, int] = {}
        for host in hosts.hosts:
            for port in host.report.ports:
                name = _verdict_name(port.verdict)
                verdicts[name] = verdicts.get(name, 0) + 1
        return pb.GetSummaryResponse(
            days=[pb.DaySummary(day=d, failures_absorbed=n, gpu_hours_saved=h, failures_outgoing_only=o)
                  for d, n, h, o in savings.summarize(totals, cost, days, today)],
            restart_cost_s=cost * 60.0, hosts=len(hosts.hosts),
            hosts_connected=sum(1 for h in hosts.hosts if h.connected), ports_by_verdict=verdicts)

    # -- RPCs ----------------------------------------------------------------

    async def ListHosts(self, request: pb.ListHostsRequest, context: grpc.aio.ServicerContext) -> pb.ListHostsResponse:
        return await self.hosts_response(list(request.host_ids))

    async def ListFleetEvents(self, request: pb.ListFleetEventsRequest,
                              context: grpc.aio.ServicerContext) -> pb.ListFleetEventsResponse:
        limit = request.limit or DEFAULT_LIMIT
        if limit > MAX_LIMIT:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"limit {limit}: at most {MAX_LIMIT}")
        for name in ("since", "until"):
            if request.HasField(name):
                try:
                    bounds.timestamp(f"ListFleetEventsRequest.{name}", getattr(request, name))
                except bounds.Refused as exc:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        query = EventQuery(
            host_id=request.host_id, port=request.port, kind=kind_filter(request.kind),
            since=request.since.ToNanoseconds() / 1e9 if request.HasField("since") else None,
            until=request.until.ToNanoseconds() / 1e9 if request.HasField("until") else None,
            after_id=request.after_id, limit=limit)
        return pb.ListFleetEventsResponse(events=await self.events_list(query))

    async def WatchFleetEvents(self, request: pb.WatchFleetEventsRequest,
                               context: grpc.aio.ServicerContext) -> AsyncIterator[pb.WatchFleetEventsResponse]:
        host, port, kind = request.host_id, request.port, kind_filter(request.kind)
        who = self._watcher_identity(context)
        if self.watchers.get(who, 0) >= MAX_WATCHERS_PER_IDENTITY:
            log.warning("watch_refused", identity=who, open=self.watchers[who], peer=context.peer())
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{who} already has {MAX_WATCHERS_PER_IDENTITY} WatchFleetEvents streams open "
                                "(the most one identity may hold)")
        if sum(self.watchers.values()) >= MAX_WATCHERS:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"the aggregator already serves {MAX_WATCHERS} WatchFleetEvents streams")
        self.watchers[who] = self.watchers.get(who, 0) + 1
        try:
            async for response in self._watch(request, context, host, port, kind):
                yield response
        finally:
            left = self.watchers.get(who, 1) - 1
            if left > 0:
                self.watchers[who] = left
            else:
                self.watchers.pop(who, None)

    async def _watch(self, request: pb.WatchFleetEventsRequest, context: grpc.aio.ServicerContext,
                     host: str, port: str, kind: str) -> AsyncIterator[pb.WatchFleetEventsResponse]:
        def match(e: StoredEvent) -> bool:
            return (not host or e.host_id == host) and (not port or e.port == port) and (not kind or e.kind == kind)

        fanout = self.fleet.fanout
        watcher = await fanout.subscribe(match)
        try:
            last = request.after_id
            while request.after_id and last < watcher.live_after:  # catch up from the store first
                page = await self.fleet.store.events(EventQuery(host_id=host, port=port, kind=kind,
                                                                after_id=last, limit=DEFAULT_LIMIT))
                page = [e for e in page if e.id <= watcher.live_after]
                for stored in page:
                    yield pb.WatchFleetEventsResponse(event=fleet_event(stored))
                    last = stored.id
                if len(page) < DEFAULT_LIMIT:
                    break
            last = max(last, watcher.live_after)
            while True:
                get = asyncio.ensure_future(watcher.queue.get())
                dropped = asyncio.ensure_future(watcher.dropped.wait())
                stop = asyncio.ensure_future(self.stopping.wait())
                try:
                    await asyncio.wait({get, dropped, stop}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for f in (get, dropped, stop):
                        if not f.done():
                            f.cancel()
                if get.done() and not get.cancelled():
                    stored = get.result()
                    if stored.id > last:
                        last = stored.id
                        yield pb.WatchFleetEventsResponse(event=fleet_event(stored))
                    continue
                if watcher.dropped.is_set():
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                        f"this watcher fell more than {watcher.queue.maxsize} events behind; "
                                        f"resume with after_id {last}")
                return
        finally:
            fanout.unsubscribe(watcher)

    async def GetSummary(self, request: pb.GetSummaryRequest,
                         context: grpc.aio.ServicerContext) -> pb.GetSummaryResponse:
        days = request.days or 7
        if days > MAX_SUMMARY_DAYS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"days {days}: at most {MAX_SUMMARY_DAYS}")
        return await self.summary(days)

    # -- commands -------------------------------------------------------------

    async def _operator(self, context: grpc.aio.ServicerContext, action: str) -> str:
        identity = peer_identity(context, self.fleet.settings.tls.insecure)
        if identity.insecure:
            return "insecure-mode operator"
        if identity.operator is None:
            log.warning("fleet_command_refused", action=action, certificate=identity.subject, peer=context.peer())
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"{action} needs an operator certificate (URI SAN linkpass://operator/<name>); "
                                f"yours is {identity.subject}")
        assert identity.operator is not None
        return identity.operator

    async def _relay(self, context: grpc.aio.ServicerContext, action: str, host_id: str, port: str,
                     command: pb.Command, by: str) -> str:
        """Send `command` down host_id's stream and wait for its result: the
        host's message when it took it, else an abort with the host's code."""
        if not host_id or not port:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"{action} needs a host and a port (got host {host_id!r}, port {port!r})")
        fleet = self.fleet
        timeout_s = fleet.command_timeout_s
        command.id = fleet.command_id()
        command.by = by
        session = fleet.sessions.get(host_id)
        try:
            if session is not None and session.open:
                log.info("fleet_command", action=action, host=host_id, port=port, by=by, id=command.id)
                result = await self._relay_local(session, command, timeout_s)
            else:
                known = await fleet.store.hosts([host_id])
                if not known:
                    await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown host {host_id!r}")
                if fleet.replicas is None or not fleet.connected(known[0], fleet.clock()):
                    await context.abort(grpc.StatusCode.UNAVAILABLE, f"host {host_id} is not connected")
                assert fleet.replicas is not None
                log.info("fleet_command", action=action, host=host_id, port=port, by=by, id=command.id,
                         replica=known[0].replica)
                result = await fleet.replicas.relay_remote(host_id, command, timeout_s)
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"host {host_id} did not answer {action} within {timeout_s:g} s "
                                "(it may still apply it)")
        except StreamEnd as end:
            await context.abort(end.code, end.message)
        except StoreError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the aggregator's store failed: {exc}")
        if result.code != 0:
            await context.abort(status_code(result.code), f"host {host_id}: {result.message}")
        return result.message

    @staticmethod
    async def _relay_local(session: HostSession, command: pb.Command, timeout_s: float) -> pb.CommandResult:
        """Down this replica's stream of the host; its answer (TimeoutError, StreamEnd)."""
        future: asyncio.Future[pb.CommandResult] = asyncio.get_running_loop().create_future()
        session.commands[command.id] = future
        session.send(pb.ConnectResponse(command=command))
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(future)
        finally:
            session.commands.pop(command.id, None)

    async def FleetDrain(self, request: pb.FleetDrainRequest,
                         context: grpc.aio.ServicerContext) -> pb.FleetDrainResponse:
        by = await self._operator(context, "FleetDrain")
        d = request.duration_s
        if not math.isfinite(d) or d < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"duration_s must be 0 (until undrained) or more, not {d!r}")
        message = await self._relay(context, "FleetDrain", request.host_id, request.port,
                                    pb.Command(drain=request), by)
        return pb.FleetDrainResponse(message=message)

    async def FleetUndrain(self, request: pb.FleetUndrainRequest,
                           context: grpc.aio.ServicerContext) -> pb.FleetUndrainResponse:
        by = await self._operator(context, "FleetUndrain")
        message = await self._relay(context, "FleetUndrain", request.host_id, request.port,
                                    pb.Command(undrain=request), by)
        return pb.FleetUndrainResponse(message=message)

    # -- validation (validation.py) --------------------------------------------

    async def Validate(self, request: pb.ValidateRequest,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ValidateResponse]:
        by = await self._operator(context, "Validate")
        async for response in self.validations.run(request, by, context):
            yield response

    async def GetValidationReport(self, request: pb.GetValidationReportRequest,
                                  context: grpc.aio.ServicerContext) -> pb.GetValidationReportResponse:
        if self.validations.last is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                "no validation has finished since the aggregator started (linkpassctl validate)")
        return pb.GetValidationReportResponse(report=self.validations.last)
