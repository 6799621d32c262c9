"""The agent's stream to linkpass-aggregator (fleet.proto AgentService.Connect).

One stream at a time, opened again after any failure with exponential
backoff (0.5 s doubling to 30 s, full jitter: each wait is uniform in
[0, cap], so a fleet that lost its aggregator does not come back in step).

Replicas ([aggregator] address as an array: several aggregators on one
shared store). The agent streams to one address at a time, starting with
the one that last worked (after a reload: the old agent's; else the first).
When a stream ends or a connection fails it moves to the next address,
round-robin, so a replica that goes away (an upgrade, a crash) is left at
once for the others and comes last in the next pass. The new stream sends
again every event the spool holds unacknowledged: each stream starts its
reading at the spool's beginning with nothing counted as sent
(_Session.cursor, .sent), and the spool skips only what was acknowledged
(Spool.next_batch); the aggregator stores each (boot, seq) once, so what
the old replica took without acknowledging is harmless to send again.

Backoff. Every failure waits backoff_s(attempts) before the next try, where
`attempts` = failures in a row // the number of addresses: one full pass
over the list that reached none of them counts as one attempt. So the
first pass moves from replica to replica after a wait of at most 0.5 s
each (jittered: the hosts of a dead replica spread over the others instead
of arriving in one instant), and each pass that finds none doubles it.
The failures reset only once a stream is healthy: it has written its
second heartbeat (HEALTHY_HEARTBEATS) with the aggregator's side still
open, i.e. stayed up two Welcome.heartbeat_s. Not at the Welcome: an
aggregator that welcomes and then fails at once (a replica whose store is
down, a crash loop) would otherwise be retried with no backoff at all, by
every host. Not at the first ack: a quiet host may have no event to be
acknowledged for hours, while heartbeats come on every stream.

Logs: `aggregator_connected` names the address in use (and the previous
one, when it moved); `aggregator_disconnected` (a stream that had its
Welcome ended) names the address, why, and where the agent goes next;
`aggregator_unreachable` (a connection that got no Welcome) the same, once
per address and change of what went wrong until a stream is healthy again,
not at every retry.

On a stream: Hello -> Welcome (the aggregator says, per boot, what it already
holds: the spool drops that), then Inventory and PortReport, then the
spool's events in batches of at most 500, at most 8 unacknowledged; a
Heartbeat every Welcome.heartbeat_s with a PortReport when it changed (and
at once, at most every REPORT_MIN_S, when a pass changed a verdict or path).
Down the stream: EventAck (trims the spool), ProbePeers (to the daemon, the
newest only), Command (drain/undrain through the daemon's drain queue; its
answer goes back as CommandResult).

Nothing the aggregator does can stall the daemon: the daemon only hands
events to the spool writer; every queue here is bounded; every message is
checked; a write the aggregator does not take within WRITE_TIMEOUT_S ends
the stream (and a new one starts after the backoff).
"""

from __future__ import annotations

import asyncio
import math
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import grpc
import structlog

import linkpassd
from linkpassd._proto.linkpass.v1 import fleet_pb2, fleet_pb2_grpc
from linkpassd.adapters.control_convert import timestamp
from linkpassd.agent.spool import Batch, Cursor, Gap, Spool
from linkpassd.core.model import AggregatorSettings

log = structlog.get_logger("linkpassd")

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
HEALTHY_HEARTBEATS = 2  # written on one stream: its failures in a row reset (see above)
BATCH_EVENTS = 500
MAX_IN_FLIGHT = 8  # unacknowledged batches
MAX_COMMANDS = 4  # drains waiting for their pass; more are refused (RESOURCE_EXHAUSTED)
OUTBOX = 64  # command results waiting to be sent
WELCOME_TIMEOUT_S = 10.0
WRITE_TIMEOUT_S = 30.0
REPORT_MIN_S = 0.5
DEFAULT_HEARTBEAT_S = 5.0
MAX_RECEIVE_BYTES = 4 << 20
DEFAULT_MAX_MESSAGE = 4 << 20
MAX_BOOT_ID = 128


class StreamError(Exception):
    """The aggregator sent something we cannot work with; the stream ends."""


class AgentHost(Protocol):
    """What the agent needs from its daemon (daemon.aggregator.DaemonHost)."""

    def inventory(self) -> fleet_pb2.Inventory: ...

    def port_report(self) -> fleet_pb2.PortReport: ...  # without a time

    def take_peers(self, message: fleet_pb2.ProbePeers) -> None: ...

    # Optional: the aggregator's fence grants ([fence]); None when the stream ends.
    # def take_fence_grants(self, ports: list[str] | None) -> None: ...

    async def command(self, command: fleet_pb2.Command
                      ) -> tuple[int, str] | tuple[int, str, fleet_pb2.HostValidation]: ...


def backoff_s(attempt: int, rng: random.Random, base: float = BACKOFF_BASE_S,
              cap: float = BACKOFF_CAP_S) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**attempt)]."""
    return rng.uniform(0.0, min(cap, base * (2 ** min(attempt, 32))))


def channel_options() -> list[tuple[str, int]]:
    return [("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0),
            ("grpc.enable_retries", 0)]


def read_tls_files(settings: AggregatorSettings) -> tuple[bytes, bytes, bytes] | None:
    """(ca, key, cert) as they are now (re-read at every attempt: certificates
    are renewed); None when insecure. Blocking: call it off the loop."""
    if settings.insecure:
        return None
    with open(settings.ca, "rb") as ca, open(settings.cert, "rb") as cert, \
            open(settings.key, "rb") as key:
        return ca.read(), key.read(), cert.read()


def make_channel(address: str, files: tuple[bytes, bytes, bytes] | None) -> grpc.aio.Channel:
    """Mutual TLS with the files read, or plaintext (insecure, labs). On the loop."""
    if files is None:
        return grpc.aio.insecure_channel(address, options=channel_options())
    creds = grpc.ssl_channel_credentials(*files)
    return grpc.aio.secure_channel(address, creds, options=channel_options())


@dataclass
class _InFlight:
    boot_id: str
    last_seq: int  # the batch's last event; a gap-only batch: the last sent before it
    gap: Gap | None
    gap_only: bool
    events: int = 0  # how many events it carried


# Failures that mean the aggregator will not take this host as it is (its
# certificate, or the host_id it says in Hello): retrying does not help.
REFUSED_STATUSES = ("PERMISSION_DENIED", "UNAUTHENTICATED")
_HANDSHAKE_WORDS = ("handshake", "certificate", "ssl", "tls")


def is_refusal(status: str, message: str) -> bool:
    """Whether a failed stream was a refusal of this host (not an
    aggregator that is away): a status the aggregator refuses with, or a
    TLS handshake that failed."""
    if status in REFUSED_STATUSES:
        return True
    low = message.lower()
    return status == "UNAVAILABLE" and any(word in low for word in _HANDSHAKE_WORDS)


def _status_of(exc: BaseException) -> tuple[str, str]:
    """(what went wrong, said once per change) of a failed stream."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code().name, exc.details() or ""
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return "TIMEOUT", str(exc) or "the aggregator did not answer in time"
    return type(exc).__name__, str(exc)


class AgentClient:
    def __init__(self, settings: AggregatorSettings, spool: Spool, host: AgentHost, *,
                 boot_id: str, dropped: Callable[[], int] = lambda: 0,
                 rng: random.Random | None = None, wallclock: Callable[[], float] | None = None,
                 backoff_base_s: float = BACKOFF_BASE_S, backoff_cap_s: float = BACKOFF_CAP_S,
                 start_address: str | None = None) -> None:
        """`start_address`: the address to try first when it is still listed
        (the one that last worked for the agent this one replaces)."""
        import time
        self.settings = settings
        self.addresses = settings.addresses
        # The address in use or being tried; moves on at each failure only.
        self.index = (self.addresses.index(start_address)
                      if start_address in self.addresses else 0)
        self.last_worked: str | None = None  # the address of the last stream that got a Welcome
        self.spool = spool
        self.host = host
        self.boot_id = boot_id
        self.host_id = settings.host_id or socket.gethostname()
        self.dropped = dropped  # events dropped before the spool (the hand-off)
        self.rng = rng or random.Random()
        self.wallclock = wallclock or time.time
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        self.connected = False
        self.failures = 0  # failures in a row since the last healthy stream
        self.sessions = 0  # streams that got a Welcome
        self.last_failure: tuple[str, str] | None = None
        self.last_failure_at = 0.0  # wall clock; 0: no failure yet
        self.connected_at = 0.0  # wall clock: the current stream's Welcome
        self.last_ack_at = 0.0  # wall clock of the last ack; 0: none yet
        self.events_sent = 0  # events written on streams (again on a new stream)
        self.events_acked = 0  # events in batches the aggregator acknowledged
        self.delays: list[float] = []  # the backoff waits taken (the last 64), for status/tests
        self._wake = asyncio.Event()
        self._poked = False
        self._unreachable: dict[str, str] = {}  # address -> the status last logged for it

    @property
    def address(self) -> str:
        """The address streamed to now (when `connected`), or tried next."""
        return self.addresses[self.index]

    @property
    def attempts(self) -> int:
        """The backoff's exponent: full passes over the addresses that reached
        none of them, since the last healthy stream."""
        return self.failures // len(self.addresses)

    # ---------------------------------------------------------- the daemon's calls

    def wake(self) -> None:
        """New events are in the spool (SpoolWriter.on_written)."""
        self._wake.set()

    def poke(self) -> None:
        """A pass ended: the report may have changed. O(1)."""
        self._poked = True
        self._wake.set()

    # ---------------------------------------------------------- reconnecting

    async def run(self) -> None:
        """Connect, stream, and connect again after any failure, forever:
        to the next address, after the backoff (see the module's docstring)."""
        if self.settings.insecure:
            log.warning("aggregator_insecure", addresses=list(self.addresses),
                        note="INSECURE: plaintext and no certificates, for labs only; anyone on "
                             "the path can read and forge this host's reports")
        while True:
            address = self.address
            try:
                await self._session()
                failure: BaseException = StreamError("the aggregator ended the stream")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - anything from outside: retry
                failure = exc
            was_connected, self.connected = self.connected, False
            self.last_failure = what = _status_of(failure)
            self.last_failure_at = self.wallclock()
            delay = backoff_s(self.attempts, self.rng, self.backoff_base_s, self.backoff_cap_s)
            self.failures += 1
            self.index = (self.index + 1) % len(self.addresses)
            self._log_failure(address, was_connected, what, delay)
            self.delays = (self.delays + [delay])[-64:]
            await asyncio.sleep(delay)

    def _log_failure(self, address: str, was_connected: bool, what: tuple[str, str],
                     delay: float) -> None:
        """A lost stream always; a failed connection once per address and
        change of status (until a stream is healthy), not at every retry."""
        moving = {"next": self.address} if len(self.addresses) > 1 else {}
        if was_connected:
            log.warning("aggregator_disconnected", address=address, status=what[0],
                        error=what[1][:500], retry_in_s=round(delay, 3), **moving,
                        note="events not acknowledged yet are sent again on the next stream")
        elif self._unreachable.get(address) != what[0]:
            self._unreachable[address] = what[0]
            log.warning("aggregator_unreachable", address=address, status=what[0],
                        error=what[1][:500], **moving,
                        note="events wait in the spool; retrying with backoff")

    def _stream_healthy(self) -> None:
        """The stream has stayed up HEALTHY_HEARTBEATS heartbeats: the backoff
        starts again from its shortest wait after the next failure."""
        if self.failures:
            log.info("aggregator_stream_healthy", address=self.address,
                     after_failures=self.failures)
        self.failures = 0
        self._unreachable.clear()

    async def _session(self) -> None:
        files = await asyncio.to_thread(read_tls_files, self.settings)
        channel = make_channel(self.address, files)
        try:
            call = fleet_pb2_grpc.AgentServiceStub(channel).Connect()
            try:
                await self._stream(call)
            finally:
                call.cancel()
        finally:
            await channel.close(grace=None)

    async def _write(self, call, request: fleet_pb2.ConnectRequest) -> None:
        # asyncio.timeout, never wait_for, around every await here: on 3.11
        # wait_for returns the result and drops a cancel that arrives in the
        # loop step where the awaited thing completes (CPython gh-86296), and
        # the daemon's stop or reload would then wait for this task forever.
        async with asyncio.timeout(WRITE_TIMEOUT_S):
            await call.write(request)

    async def _stream(self, call) -> None:
        await self._write(call, fleet_pb2.ConnectRequest(hello=fleet_pb2.Hello(
            host_id=self.host_id, boot_id=self.boot_id, version=linkpassd.__version__)))
        async with asyncio.timeout(WELCOME_TIMEOUT_S):  # not wait_for: see _write
            first = await call.read()
        if first is grpc.aio.EOF:
            raise StreamError("the aggregator ended the stream before its Welcome")
        if first.WhichOneof("body") != "welcome":
            raise StreamError(f"the aggregator's first message is {first.WhichOneof('body')}, "
                              "not a Welcome")
        welcome = first.welcome
        heartbeat_s = welcome.heartbeat_s
        if not math.isfinite(heartbeat_s) or not 0.1 <= heartbeat_s <= 3600:
            log.warning("aggregator_heartbeat_ignored", heartbeat_s=heartbeat_s,
                        using=DEFAULT_HEARTBEAT_S)
            heartbeat_s = DEFAULT_HEARTBEAT_S
        max_message = welcome.max_message_bytes or DEFAULT_MAX_MESSAGE
        for stored in welcome.stored:
            if self._valid_ack(stored):
                await self.spool.call(self.spool.ack, stored.boot_id, stored.seq)
        address = self.address
        moved = ({"previous": self.last_worked}
                 if self.last_worked is not None and self.last_worked != address else {})
        log.info("aggregator_connected", address=address, host_id=self.host_id,
                 heartbeat_s=heartbeat_s, failures=self.failures, **moved,
                 pending=await self.spool.call(lambda: self.spool.pending))
        # Not `failures` (reset only once the stream is healthy: _Session._heartbeat).
        self.connected, self.last_failure, self.last_worked = True, None, address
        self.connected_at = self.wallclock()
        self._unreachable.pop(address, None)
        self.sessions += 1
        session = _Session(self, call, heartbeat_s, max_message)
        await session.run()

    @staticmethod
    def _valid_ack(ack: fleet_pb2.EventAck) -> bool:
        if not ack.boot_id or len(ack.boot_id) > MAX_BOOT_ID or ack.seq == 0:
            log.warning("aggregator_ack_ignored", boot_id=ack.boot_id[:MAX_BOOT_ID], seq=ack.seq)
            return False
        return True


class _Session:
    """One stream after its Welcome: a sender (this task) and a reader."""

    def __init__(self, client: AgentClient, call, heartbeat_s: float, max_message: int) -> None:
        self.client = client
        self.spool = client.spool
        self.call = call
        self.heartbeat_s = heartbeat_s
        self.max_bytes = max(1024, max_message - 4096)
        self.cursor = Cursor()
        self.sent: dict[str, int] = {}
        self.sent_gaps: set[Gap] = set()
        self.in_flight: list[_InFlight] = []
        self.outbox: asyncio.Queue[fleet_pb2.CommandResult] = asyncio.Queue(OUTBOX)
        self.commands: set[asyncio.Task] = set()
        self.peers_generation = -1
        self.inventory: bytes | None = None
        self.report: bytes | None = None
        self.report_at = -math.inf
        self.heartbeats = 0  # written on this stream
        self.reader: asyncio.Task | None = None

    async def run(self) -> None:
        self.reader = reader = asyncio.create_task(self._read())
        try:
            await self._send_inventory()
            await self._send_report(force=True)
            await self._send_loop(reader)
        finally:
            self._fence(None)  # grants hold only while the stream does
            reader.cancel()
            for task in self.commands:
                task.cancel()
            await asyncio.gather(reader, *self.commands, return_exceptions=True)

    async def _send_loop(self, reader: asyncio.Task) -> None:
        loop = asyncio.get_running_loop()
        next_beat = loop.time() + self.heartbeat_s
        client = self.client
        while True:
            if reader.done():
                reader.result()  # its error ends the stream
                raise StreamError("the aggregator ended the stream")
            client._wake.clear()
            while not self.outbox.empty():
                result = self.outbox.get_nowait()
                await client._write(self.call, fleet_pb2.ConnectRequest(command_result=result))
            await self._send_batches()
            now = loop.time()
            if client._poked and now - self.report_at >= REPORT_MIN_S:
                client._poked = False
                await self._send_report()
            if now >= next_beat:
                await self._heartbeat()
                next_beat = now + self.heartbeat_s
            timeout = next_beat - loop.time()
            if client._poked:
                timeout = min(timeout, self.report_at + REPORT_MIN_S - loop.time())
            await self._wake_or_reader(reader, max(0.0, timeout))

    async def _wake_or_reader(self, reader: asyncio.Task, timeout: float) -> None:
        """Until there is work, the reader ended, or `timeout` passed.
        asyncio.wait's own timeout, not wait_for (see AgentClient._write)."""
        wake = asyncio.ensure_future(self.client._wake.wait())
        try:
            await asyncio.wait({wake, reader}, timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            wake.cancel()

    async def _send_batches(self) -> None:
        while len(self.in_flight) < MAX_IN_FLIGHT:
            batch: Batch | None = await self.spool.call(
                lambda: self.spool.next_batch(self.cursor, self.sent, self.sent_gaps,
                                              max_events=BATCH_EVENTS, max_bytes=self.max_bytes))
            if batch is None:
                return
            message = fleet_pb2.EventBatch(boot_id=batch.boot_id, events=list(batch.events))
            if batch.gap is not None:
                message.gap_first, message.gap_last = batch.gap.first, batch.gap.last
                self.sent_gaps.add(batch.gap)
            before = self.sent.get(batch.boot_id, 0)
            self.cursor = batch.end
            if batch.events:
                self.sent[batch.boot_id] = batch.last_seq
            self.in_flight.append(_InFlight(batch.boot_id, batch.last_seq or before, batch.gap,
                                            not batch.events, len(batch.events)))
            await self.client._write(self.call, fleet_pb2.ConnectRequest(events=message))
            self.client.events_sent += len(batch.events)

    async def _send_inventory(self) -> None:
        inventory = self.client.host.inventory()
        data = inventory.SerializeToString(deterministic=True)
        if data != self.inventory:
            await self.client._write(self.call, fleet_pb2.ConnectRequest(inventory=inventory))
            self.inventory = data

    async def _send_report(self, force: bool = False) -> None:
        report = self.client.host.port_report()
        data = report.SerializeToString(deterministic=True)
        self.report_at = asyncio.get_running_loop().time()
        if data == self.report and not force:
            return
        report.time.CopyFrom(timestamp(self.client.wallclock()))
        await self.client._write(self.call, fleet_pb2.ConnectRequest(ports=report))
        self.report = data

    async def _heartbeat(self) -> None:
        pending = await self.spool.call(lambda: self.spool.pending)
        dropped = self.spool.dropped + self.client.dropped()
        await self.client._write(self.call, fleet_pb2.ConnectRequest(heartbeat=fleet_pb2.Heartbeat(
            time=timestamp(self.client.wallclock()), spool_dropped=dropped,
            spool_pending=pending)))
        self.heartbeats += 1
        if self.heartbeats == HEALTHY_HEARTBEATS and not self.reader.done():
            self.client._stream_healthy()
        await self._send_inventory()
        await self._send_report()

    # ---------------------------------------------------------- down the stream

    async def _read(self) -> None:
        while True:
            response = await self.call.read()
            if response is grpc.aio.EOF:
                return
            body = response.WhichOneof("body")
            if body == "ack":
                await self._acked(response.ack)
            elif body == "peers":
                self._peers(response.peers)
            elif body == "command":
                self._command(response.command)
            elif body == "fence":
                self._fence(list(response.fence.ports))
            elif body == "welcome":
                log.warning("aggregator_message_ignored", message="welcome",
                            note="a second Welcome on one stream")
            else:
                log.warning("aggregator_message_ignored", message=body or "empty")

    async def _acked(self, ack: fleet_pb2.EventAck) -> None:
        if not AgentClient._valid_ack(ack):
            return
        await self.spool.call(self.spool.ack, ack.boot_id, ack.seq)
        done = [f for f in self.in_flight if f.boot_id == ack.boot_id and f.last_seq <= ack.seq]
        self.client.last_ack_at = self.client.wallclock()
        for flight in done:
            self.in_flight.remove(flight)
            self.client.events_acked += flight.events
            if flight.gap_only and flight.gap is not None:
                await self.spool.call(self.spool.settle_gap, flight.gap)
        self.client._wake.set()

    def _peers(self, peers: fleet_pb2.ProbePeers) -> None:
        if peers.generation < self.peers_generation:
            log.info("aggregator_peers_stale", generation=peers.generation,
                     newest=self.peers_generation)
            return
        self.peers_generation = peers.generation
        try:
            self.client.host.take_peers(peers)
        except Exception as exc:  # noqa: BLE001 - the daemon's side must not end the stream
            log.error("aggregator_peers_failed", error=repr(exc))

    def _fence(self, ports: list[str] | None) -> None:
        take = getattr(self.client.host, "take_fence_grants", None)
        if take is None:
            return
        try:
            take(ports)
        except Exception as exc:  # noqa: BLE001 - the daemon's side must not end the stream
            log.error("aggregator_fence_grants_failed", error=repr(exc))

    def _command(self, command: fleet_pb2.Command) -> None:
        if len(self.commands) >= MAX_COMMANDS:
            self._answer(command.id, grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"{MAX_COMMANDS} commands are already waiting for linkpassd's pass")
            return
        task = asyncio.create_task(self._run_command(command))
        self.commands.add(task)
        task.add_done_callback(self.commands.discard)

    async def _run_command(self, command: fleet_pb2.Command) -> None:
        validation = None
        try:
            code, message, *rest = await self.client.host.command(command)
            validation = rest[0] if rest else None  # a validate command's HostValidation
        except Exception as exc:  # noqa: BLE001 - a bug answers INTERNAL, never ends the stream
            log.error("aggregator_command_failed", id=command.id[:128], error=repr(exc))
            code, message = grpc.StatusCode.INTERNAL.value[0], f"command failed: {exc}"
        self._answer(command.id, code, message, validation)

    def _answer(self, command_id: str, code: grpc.StatusCode | int, message: str,
                validation: fleet_pb2.HostValidation | None = None) -> None:
        number = code.value[0] if isinstance(code, grpc.StatusCode) else int(code)
        try:
            self.outbox.put_nowait(fleet_pb2.CommandResult(id=command_id[:256], code=number,
                                                           message=message[:4096],
                                                           validation=validation))
        except asyncio.QueueFull:
            log.error("aggregator_command_result_dropped", id=command_id[:128])
        self.client._wake.set()
