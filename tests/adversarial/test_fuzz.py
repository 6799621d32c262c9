"""A property-based fuzzer for every gRPC message the aggregator and the
daemon's control API accept (hypothesis strategies built from the protobuf
descriptors: protostrategies.py).

Properties, for any input:
- the server answers with a status that says why: never UNKNOWN or INTERNAL
  (our bug; grpc's own "Exception deserializing request" aside), and never
  hangs (every call has a deadline);
- an agent stream that ends OK had every EventBatch it sent acked (an
  unacked batch would be resent for ever: issue 30 item 8);
- afterwards the fleet view still works for everyone: ListHosts and
  GetSummary answer, the page and `linkpassctl fleet` render, and no stream
  is left behind on the server.

`make test` runs a bounded number of examples (about a minute in all);
LINKPASS_FUZZ_SECONDS=600 runs each service's fuzzer for that long, and
prints what it did (examples, status codes seen, memory).
"""

from __future__ import annotations

import asyncio
import collections
import os
import resource
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from linkpassd._proto.linkpass.v1 import control_pb2 as cpb
from linkpassd._proto.linkpass.v1 import control_pb2_grpc as cpb_grpc
from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd.aggregator import web
from linkpassd.aggregator.server import AggregatorServer
from linkpassd.aggregator.sqlite_store import SqliteStore
from linkpassd.ctl import fleet as ctl_fleet
from tests.adversarial.protostrategies import messages
from tests.unit.agg_tls import insecure_settings

FUZZ_SECONDS = float(os.environ.get("LINKPASS_FUZZ_SECONDS", "0") or 0)
CALL_TIMEOUT_S = 15.0
BAD_CODES = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}


def _settings(examples: int):
    return settings(max_examples=examples, deadline=None, database=None, derandomize=False,
                    suppress_health_check=list(HealthCheck))


def _fuzz(body: Callable[[], None], what: str) -> None:
    """Run a @given-wrapped `body` once (make test), or again and again until
    LINKPASS_FUZZ_SECONDS have passed."""
    if not FUZZ_SECONDS:
        body()
        return
    end = time.monotonic() + FUZZ_SECONDS
    rounds = 0
    rss = [_current_rss_mb()]
    while time.monotonic() < end:
        body()
        rounds += 1
        rss.append(_current_rss_mb())
    print(f"\nfuzz {what}: {rounds} rounds of up to 300 examples in {FUZZ_SECONDS:.0f} s; RSS (client and "
          f"server, one process) {rss[0]:.0f} MB at start, {rss[len(rss) // 2]:.0f} MB midway, {rss[-1]:.0f} MB "
          f"at the end; peak {_rss_mb():.0f} MB")


def _rss_mb() -> float:  # peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _code_ok(code: grpc.StatusCode, details: str, where: str) -> None:
    if code in BAD_CODES and "deserializ" not in (details or ""):
        raise AssertionError(f"{where}: {code.name} {details!r}")


# --------------------------------------------------------------------------
# the aggregator, on its own loop in a thread
# --------------------------------------------------------------------------


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def aggregator() -> Iterator[tuple[AggregatorServer, grpc.Channel, LoopThread]]:
    work = Path(tempfile.mkdtemp(prefix="lp-fuzz-"))
    lt = LoopThread()
    settings_ = insecure_settings(work / "fleet.db", max_message_bytes=256 * 1024)

    async def start() -> AggregatorServer:
        store = SqliteStore(settings_.database)
        await store.open()
        server = AggregatorServer(settings_, store, hello_timeout_s=2.0, command_timeout_s=2.0)
        await server.start("127.0.0.1:0")
        return server

    server = lt.call(start())
    ch = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield server, ch, lt
    finally:
        ch.close()

        async def stop() -> None:
            await server.stop(0)
            await server.fleet.store.close()

        lt.call(stop())
        lt.close()
        shutil.rmtree(work, ignore_errors=True)


def _raw(ch: grpc.Channel, method: str, stream_in: bool, stream_out: bool):
    make = {(False, False): ch.unary_unary, (False, True): ch.unary_stream,
            (True, False): ch.stream_unary, (True, True): ch.stream_stream}[(stream_in, stream_out)]
    return make(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)


def _fleet_view_works(server: AggregatorServer, ch: grpc.Channel, lt: LoopThread) -> None:
    hosts = pb.ListHostsResponse.FromString(
        _raw(ch, "/linkpass.v1.FleetService/ListHosts", False, False)(b"", timeout=CALL_TIMEOUT_S))
    summary = pb.GetSummaryResponse.FromString(
        _raw(ch, "/linkpass.v1.FleetService/GetSummary", False, False)(b"", timeout=CALL_TIMEOUT_S))
    web.render_page(hosts, [], summary, insecure=True, now=time.time())
    ctl_fleet.render_grid(hosts)
    ctl_fleet.render_summary(summary)


def _no_session_left(server: AggregatorServer) -> None:
    deadline = time.monotonic() + 5
    while server.fleet.sessions or server.fleet_api.watchers:
        assert time.monotonic() < deadline, (f"streams left on the server: sessions {list(server.fleet.sessions)}, "
                                             f"watchers {server.fleet_api.watchers}")
        time.sleep(0.01)


BOOTS = st.sampled_from(["boot-a", "boot-b", "boot-c"])


@st.composite
def plausible_batches(draw):
    """Event batches close to what an agent sends (so the fuzzer gets past
    the first check): increasing seqs, valid times, hostile text anywhere."""
    from google.protobuf.timestamp_pb2 import Timestamp

    boot = draw(BOOTS)
    seqs = sorted(draw(st.sets(st.one_of(st.integers(1, 60), st.sampled_from([2**48, 2**48 + 1, 2**63 - 1])),
                               max_size=4)))
    text = st.one_of(st.sampled_from(["eth0", "rail0", ""]), st.text(max_size=20),
                     st.sampled_from(["\x1b]0;t\x07", "\u202e", "x" * 300]))
    events = [cpb.Event(boot_id=draw(st.sampled_from([boot, boot, "", "other"])), seq=seq,
                        time=Timestamp(seconds=draw(st.one_of(st.integers(0, 2**33),
                                                              st.sampled_from([-(2**62), 2**62])))),
                        kind=draw(st.integers(0, 12)), severity=draw(st.integers(0, 4)), name=draw(text),
                        port=draw(text), rail=draw(text), message=draw(text),
                        fields=draw(st.dictionaries(text, text, max_size=3)))
              for seq in seqs]
    gap = draw(st.sampled_from([(0, 0), (0, 0), (1, 1), (1, 2**48), (2, 2**63 - 1)]))
    return pb.ConnectRequest(events=pb.EventBatch(boot_id=boot, events=events, gap_first=gap[0], gap_last=gap[1]))


@st.composite
def plausible_reports(draw):
    rails = draw(st.integers(0, 300))
    return pb.ConnectRequest(ports=pb.PortReport(
        ports=[cpb.PortState(port=f"eth{i}", verdict=draw(st.integers(0, 5)), evidence=[draw(st.text(max_size=10))])
               for i in range(draw(st.integers(0, 4)))],
        rail_paths={f"rail{i}": draw(st.sampled_from(["none", "rail0", "\x1b[2J"])) for i in range(rails)}))


AGENT_BODY = st.one_of(
    plausible_batches(), plausible_batches(), plausible_batches(), plausible_reports(),
    st.just(pb.ConnectRequest(heartbeat=pb.Heartbeat())),
    messages(pb.ConnectRequest),
    st.builds(lambda boot, events, gf, gl: pb.ConnectRequest(events=pb.EventBatch(
        boot_id=boot, events=events, gap_first=gf, gap_last=gl)),
        BOOTS, st.lists(messages(cpb.Event), max_size=4),
        st.sampled_from([0, 1, 2, 2**48, 2**63 - 1, 2**64 - 1]),
        st.sampled_from([0, 1, 3, 2**48, 2**63 - 1, 2**64 - 1])),
    st.binary(min_size=1, max_size=40),  # bytes that may not be a ConnectRequest at all
)


@st.composite
def agent_streams(draw):
    first = draw(st.one_of(
        st.builds(lambda b: pb.ConnectRequest(hello=pb.Hello(host_id="fuzz-host", boot_id=b, version="fuzz")), BOOTS),
        messages(pb.ConnectRequest)) if draw(st.integers(0, 9)) == 0 else
        st.builds(lambda b: pb.ConnectRequest(hello=pb.Hello(host_id="fuzz-host", boot_id=b, version="fuzz")), BOOTS))
    return [first, *draw(st.lists(AGENT_BODY, min_size=1, max_size=5))]


def test_fuzz_the_agent_stream(aggregator) -> None:
    server, ch, lt = aggregator
    connect = _raw(ch, "/linkpass.v1.AgentService/Connect", True, True)
    seen: collections.Counter[str] = collections.Counter()

    @_settings(300)
    @given(agent_streams())
    def body(requests: list) -> None:
        wire = [r if isinstance(r, bytes) else r.SerializeToString() for r in requests]
        call = connect(iter(wire), timeout=CALL_TIMEOUT_S)
        acks: dict[str, int] = {}
        code, details = grpc.StatusCode.OK, ""
        try:
            for raw in call:
                got = pb.ConnectResponse.FromString(raw)
                if got.WhichOneof("body") == "ack":
                    acks[got.ack.boot_id] = max(acks.get(got.ack.boot_id, 0), got.ack.seq)
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
        seen[code.name] += 1
        assert code != grpc.StatusCode.DEADLINE_EXCEEDED, f"the stream hung: {requests!r}"
        _code_ok(code, details, "Connect")
        if code == grpc.StatusCode.OK:
            for r in requests[1:]:
                if isinstance(r, pb.ConnectRequest) and r.WhichOneof("body") == "events":
                    b = r.events
                    top = max([e.seq for e in b.events] + [b.gap_last])
                    assert acks.get(b.boot_id, -1) >= top, (
                        f"stream ended OK without acking boot {b.boot_id!r} up to {top} (acks {acks})")
        _no_session_left(server)
        _fleet_view_works(server, ch, lt)

    _fuzz(body, "aggregator AgentService.Connect")
    print(f"\nConnect outcomes: {dict(seen)}")


FLEET_UNARY = {
    "ListHosts": pb.ListHostsRequest, "ListFleetEvents": pb.ListFleetEventsRequest,
    "GetSummary": pb.GetSummaryRequest, "FleetDrain": pb.FleetDrainRequest,
    "FleetUndrain": pb.FleetUndrainRequest, "GetValidationReport": pb.GetValidationReportRequest,
}
FLEET_STREAMS = {"WatchFleetEvents": pb.WatchFleetEventsRequest, "Validate": pb.ValidateRequest}


def _request(methods: dict) -> st.SearchStrategy:
    return st.one_of(*[st.tuples(st.just(name), st.one_of(messages(cls), st.binary(max_size=30)))
                       for name, cls in methods.items()])


def _call(ch: grpc.Channel, service: str, name: str, request, unary: bool) -> tuple:
    """One fuzzed call, raw bytes or a message: its status code and details
    (a stream is read for at most three messages, then cancelled)."""
    wire = request if isinstance(request, bytes) else request.SerializeToString()
    method = f"/linkpass.v1.{service}/{name}"
    try:
        if unary:
            _raw(ch, method, False, False)(wire, timeout=CALL_TIMEOUT_S)
        else:
            stream = _raw(ch, method, False, True)(wire, timeout=1.0)
            try:
                for _ in zip(range(3), stream):
                    pass
            finally:
                stream.cancel()
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def test_fuzz_the_fleet_api(aggregator) -> None:
    server, ch, lt = aggregator
    seen: collections.Counter[str] = collections.Counter()

    @_settings(300)
    @given(_request({**FLEET_UNARY, **FLEET_STREAMS}))
    def body(call: tuple) -> None:
        name, request = call
        code, details = _call(ch, "FleetService", name, request, name in FLEET_UNARY)
        seen[f"{name}:{code.name}"] += 1
        if name in FLEET_UNARY:
            assert code != grpc.StatusCode.DEADLINE_EXCEEDED, f"{name} hung on {request!r}"
        _code_ok(code, details, name)
        _no_session_left(server)
        _fleet_view_works(server, ch, lt)

    _fuzz(body, "aggregator FleetService")
    print(f"\nFleetService outcomes: {dict(sorted(seen.items()))}")


# --------------------------------------------------------------------------
# the daemon's control API (the real ControlServer, over its Unix socket)
# --------------------------------------------------------------------------


class _Drains:
    """Drains as the daemon answers them (drain.DrainError for a bad port)."""

    def __init__(self) -> None:
        self.drained: set[str] = set()

    async def drain(self, port: str, reason: str, until: float | None, by: str):
        from linkpassd.core import drain as drains
        from linkpassd.core.model import DrainOutcome, PortState, Verdict
        if port not in ("eth0", "eth1"):
            raise drains.UnknownPort(f"unknown port {port!r}")
        self.drained.add(port)
        return DrainOutcome(PortState(port=port, verdict=Verdict.UP, carrier=True, phase="UP",
                                      since=0.0, evidence=()))

    async def undrain(self, port: str, by: str):
        from linkpassd.core import drain as drains
        from linkpassd.core.model import PortState, Verdict
        if port not in self.drained:
            raise drains.NotDrained(f"port {port!r} is not drained")
        self.drained.discard(port)
        return PortState(port=port, verdict=Verdict.UP, carrier=True, phase="UP", since=0.0, evidence=())


CONTROL_UNARY = {
    "GetStatus": cpb.GetStatusRequest, "ListLinks": cpb.ListLinksRequest, "ExplainPort": cpb.ExplainPortRequest,
    "ListEvents": cpb.ListEventsRequest, "Drain": cpb.DrainRequest, "Undrain": cpb.UndrainRequest,
}
CONTROL_STREAMS = {"WatchEvents": cpb.WatchEventsRequest, "WatchHealth": cpb.WatchHealthRequest}


@pytest.fixture(scope="module")
def control() -> Iterator[Path]:
    from linkpassd.adapters.control_server import ControlServer
    from linkpassd.adapters.feeds import EventFeed, Latest
    from linkpassd.core.events import EventKind, EventLog, Severity
    from tests.unit.test_control_api import realistic_status

    base = Path(tempfile.mkdtemp(prefix="lp-fz-", dir="/tmp"))
    sock = base / "run" / "linkpassd.sock"
    lt = LoopThread()
    feed = EventFeed(EventLog(boot_id="b00t", capacity=16))
    for i in range(5):
        feed.log.append(EventKind.VERDICT, "port_verdict", wall=time.time(), mono=float(i),
                        severity=Severity.INFO, port="eth0", message=f"event {i}")
    server = ControlServer(sock, realistic_status, None, events=feed, drains=_Drains(), health=Latest(),
                           group="nogroup", wall_clock=time.time)
    lt.call(server.start())
    try:
        yield sock
    finally:
        lt.call(server.stop(0))
        lt.close()
        shutil.rmtree(base, ignore_errors=True)


def test_fuzz_the_control_api(control: Path) -> None:
    seen: collections.Counter[str] = collections.Counter()
    with grpc.insecure_channel(f"unix:{control}") as ch:

        @_settings(300)
        @given(_request({**CONTROL_UNARY, **CONTROL_STREAMS}))
        def body(call: tuple) -> None:
            name, request = call
            code, details = _call(ch, "ControlService", name, request, name in CONTROL_UNARY)
            seen[f"{name}:{code.name}"] += 1
            if name in CONTROL_UNARY:
                assert code != grpc.StatusCode.DEADLINE_EXCEEDED, f"{name} hung on {request!r}"
            _code_ok(code, details, name)
            status = cpb_grpc.ControlServiceStub(ch).GetStatus(cpb.GetStatusRequest(), timeout=CALL_TIMEOUT_S)
            assert status.status.ports  # the daemon still answers

        _fuzz(body, "linkpassd ControlService")
    print(f"\nControlService outcomes: {dict(sorted(seen.items()))}")
