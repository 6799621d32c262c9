"""linkpass-aggregator's gRPC server end to end: a real grpc.aio server on
127.0.0.1 port 0, real mTLS certificates from scripts/linkpass-certs, the
SQLite store, and agents played by the test through the generated stubs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from agg_tls import channel, insecure_settings, make_pki, serving, tls_settings
from linkpassd._proto.linkpass.v1 import control_pb2 as cpb
from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd._proto.linkpass.v1 import fleet_pb2_grpc as pb_grpc
from linkpassd.adapters.control_convert import timestamp
from linkpassd.aggregator.fleet import MAX_REFUSALS
from linkpassd.aggregator.identity import Refusal
from linkpassd.aggregator.store import EventQuery

DEADLINE_S = 20.0  # generous: a busy 2-core machine


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("agg-pki"))


def run(scenario: Awaitable[None], timeout: float = 90.0) -> None:
    asyncio.run(asyncio.wait_for(scenario, timeout))


async def eventually(check: Callable[[], bool], what: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def event(boot: str, seq: int, *, kind: int = cpb.EVENT_KIND_VERDICT, rail: str = "rail0",
          fields: dict[str, str] | None = None, message: str = "") -> cpb.Event:
    return cpb.Event(boot_id=boot, seq=seq, time=timestamp(time.time()), kind=kind,
                     severity=cpb.SEVERITY_INFO, name="port_verdict", port="eth1", rail=rail,
                     message=message or f"event {seq}", fields=fields or {})


def batch(boot: str, seqs, **kw) -> pb.ConnectRequest:
    return pb.ConnectRequest(events=pb.EventBatch(boot_id=boot, events=[event(boot, s, **kw) for s in seqs]))


def hello(host: str, boot: str = "boot-a") -> pb.ConnectRequest:
    return pb.ConnectRequest(hello=pb.Hello(host_id=host, boot_id=boot, version="test"))


def inventory(address: str, leaf: str = "", gpus: int = 1) -> pb.ConnectRequest:
    return pb.ConnectRequest(inventory=pb.Inventory(rails=[
        pb.RailInventory(rail="rail0", port="eth1", address=address, gpus=gpus, leaf=leaf)]))


class Agent:
    """One agent stream as the test drives it."""

    def __init__(self, ch: grpc.aio.Channel) -> None:
        self.call = pb_grpc.AgentServiceStub(ch).Connect()

    async def send(self, request: pb.ConnectRequest) -> None:
        await self.call.write(request)

    async def read(self) -> pb.ConnectResponse:
        got = await asyncio.wait_for(self.call.read(), DEADLINE_S)
        assert got is not grpc.aio.EOF, "stream ended"
        return got

    async def read_kind(self, kind: str) -> pb.ConnectResponse:
        """The next response of this kind (skipping probe peers and the like)."""
        while True:
            got = await self.read()
            if got.WhichOneof("body") == kind:
                return got

    async def connect(self, host: str, boot: str = "boot-a") -> pb.Welcome:
        await self.send(hello(host, boot))
        return (await self.read_kind("welcome")).welcome

    async def refusal(self) -> grpc.aio.AioRpcError:
        """Read until the stream ends; the error it ended with."""
        try:
            while True:
                got = await asyncio.wait_for(self.call.read(), DEADLINE_S)
                if got is grpc.aio.EOF:
                    break
        except grpc.aio.AioRpcError as exc:
            return exc
        raise AssertionError(f"stream ended without an error ({await self.call.code()})")


# --------------------------------------------------------------------------
# ingestion
# --------------------------------------------------------------------------


def test_events_are_acked_after_storing_and_a_resend_is_stored_once(pki: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(tls_settings(pki, tmp_path / "fleet.db")) as server:
            async with channel(server.port, pki, "h1") as ch:
                agent = Agent(ch)
                welcome = await agent.connect("h1")
                assert welcome.heartbeat_s == 5.0 and welcome.max_message_bytes == 4 * 1024 * 1024
                assert list(welcome.stored) == []
                await agent.send(inventory("198.18.0.1/24"))
                await agent.send(batch("boot-a", range(1, 6)))
                ack = (await agent.read_kind("ack")).ack
                assert (ack.boot_id, ack.seq) == ("boot-a", 5)
                agent.call.cancel()
            async with channel(server.port, pki, "h1") as ch:  # reconnect: resend 3..7
                agent = Agent(ch)
                welcome = await agent.connect("h1")
                assert [(a.boot_id, a.seq) for a in welcome.stored] == [("boot-a", 5)]
                await agent.send(batch("boot-a", range(3, 8)))
                assert (await agent.read_kind("ack")).ack.seq == 7
                agent.call.cancel()
            stored = await server.fleet.store.events(EventQuery(host_id="h1"))
            assert [e.seq for e in stored] == [1, 2, 3, 4, 5, 6, 7]
            assert server.metrics.events_duplicate._value.get() == 3
            assert server.metrics.events_stored._value.get() == 7

    run(scenario())


def test_batches_waiting_together_are_stored_in_one_call_and_acked_once(pki: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(tls_settings(pki, tmp_path / "fleet.db")) as server:
            store = server.fleet.store
            calls: list[list[int]] = []
            release = asyncio.Event()
            add_events = store.add_events

            async def held_add_events(host, boot, rows, gap, now):
                calls.append([r.seq for r in rows])
                if len(calls) == 1:
                    await release.wait()  # the next batches pile up in the stream's inbox meanwhile
                return await add_events(host, boot, rows, gap, now)
            store.add_events = held_add_events

            def waiting() -> int:  # messages read and not handled yet on h1's stream
                session = server.fleet.sessions.get("h1")
                return -1 if session is None else len(session.pending)
            async with channel(server.port, pki, "h1") as ch:
                agent = Agent(ch)
                await agent.connect("h1")
                await agent.send(batch("boot-a", range(1, 6)))
                await eventually(lambda: len(calls) == 1, "the first batch at the store")
                for first in (6, 11, 16):
                    await agent.send(batch("boot-a", range(first, first + 5)))
                await eventually(lambda: waiting() == 3, "three batches waiting")
                release.set()
                acks = [(await agent.read_kind("ack")).ack.seq for _ in range(2)]
                assert acks == [5, 20]
                assert calls == [[1, 2, 3, 4, 5], list(range(6, 21))]
                # a bad batch waiting behind good ones: those are still stored
                release.clear()
                calls.clear()
                await agent.send(batch("boot-a", [21]))
                await eventually(lambda: len(calls) == 1, "batch 21 at the store")
                await agent.send(batch("boot-a", [22, 23]))
                await agent.send(batch("boot-a", [23]))  # out of order
                await eventually(lambda: waiting() == 2, "two batches waiting")
                release.set()
                assert "out of order: event seq 23" in (await agent.refusal()).details()
            stored = await store.events(EventQuery(host_id="h1"))
            assert [e.seq for e in stored] == list(range(1, 24))

    run(scenario())


def test_a_second_stream_for_the_same_host_replaces_the_first(pki: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(tls_settings(pki, tmp_path / "fleet.db")) as server:
            async with channel(server.port, pki, "h1") as ch1, channel(server.port, pki, "h1") as ch2:
                first = Agent(ch1)
                await first.connect("h1")
                second = Agent(ch2)
                await second.connect("h1")
                err = await first.refusal()
                assert err.code() == grpc.StatusCode.ABORTED
                assert "replaced by a newer connection" in err.details()
                await second.send(batch("boot-a", [1]))  # the new stream works
                assert (await second.read_kind("ack")).ack.seq == 1
                assert server.fleet.sessions["h1"].peer  # still registered: the old end did not remove it
                second.call.cancel()

    run(scenario())


# --------------------------------------------------------------------------
# who may connect
# --------------------------------------------------------------------------


def test_no_client_certificate_is_refused_at_the_handshake(pki: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(tls_settings(pki, tmp_path / "fleet.db")) as server:
            async with channel(server.port, pki, None) as ch:
                agent = Agent(ch)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await agent.send(hello("h1"))
                    await agent.read()
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await pb_grpc.FleetServiceStub(ch).ListHosts(pb.ListHostsRequest(), timeout=DEADLINE_S)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert server.fleet.sessions == {}
            assert await server.fleet.store.hosts() == []

    run(scenario())


def test_a_certificate_from_another_ca_is_refused(pki: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        evil = pki.parent / "evil"
        async with serving(tls_settings(pki, tmp_path / "fleet.db")) as server:
            # Trusts our server, presents h1 signed by a CA we do not trust.
            async with channel(server.port, evil, "h1", ca=pki / "ca.pem") as ch:
                agent = Agent(ch)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await agent.send(hello("h1"))
                    await agent.read()
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert server.fleet.sessions == {}
            assert await server.fleet.store.hosts() == []

    run(scenario())


def test_a_certificate_naming_another_host_is_refused(pki: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(tls_settings(pki, tmp_path / "fleet.db")) as server:
            async with channel(server.port, pki, "h2") as ch:
                agent = Agent(ch)
                await agent.send(hello("h1"))
                err = await agent.refusal()
                assert err.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "'h1'" in err.details() and "'h2'" in err.details()
            async with channel(server.port, pki, "alice") as ch:  # an operator is no host either
                agent = Agent(ch)
                await agent.send(hello("alice"))
                err = await agent.refusal()
                assert err.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "names no host" in err.details()
            assert await server.fleet.store.hosts() == []
            assert server.metrics.stream_errors.labels("PERMISSION_DENIED")._value.get() == 2
            # remembered for the page's "Needs a look", until the host is taken
            refused = server.fleet.refused
            assert set(refused) == {"h1", "alice"} and "names host 'h2'" in refused["h1"].reason
            async with channel(server.port, pki, "h1") as ch:
                await Agent(ch).connect("h1")
            assert set(refused) == {"alice"}
            for i in range(MAX_REFUSALS + 5):  # a flood of bad Hellos cannot grow it
                server.fleet.refuse(Refusal(f"x{i}", "[]", "why", "peer", float(i)))
            assert len(refused) == MAX_REFUSALS and "alice" not in refused and "x0" not in refused

    run(scenario())


def test_fleet_commands_need_an_operator_identity(pki: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(tls_settings(pki, tmp_path / "fleet.db")) as server:
            async with channel(server.port, pki, "h1") as host_ch:
                agent = Agent(host_ch)
                await agent.connect("h1")
                fleet = pb_grpc.FleetServiceStub(host_ch)
                hosts = await fleet.ListHosts(pb.ListHostsRequest(), timeout=DEADLINE_S)  # reading: fine
                assert [h.host_id for h in hosts.hosts] == ["h1"] and hosts.hosts[0].connected
                for call, request in ((fleet.FleetDrain, pb.FleetDrainRequest(host_id="h1", port="eth1")),
                                      (fleet.FleetUndrain, pb.FleetUndrainRequest(host_id="h1", port="eth1"))):
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await call(request, timeout=DEADLINE_S)
                    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
                    assert "operator certificate" in err.value.details()
                    assert "linkpass://host/h1" in err.value.details()
                agent.call.cancel()

    run(scenario())


def test_a_drain_goes_down_the_hosts_stream_and_its_answer_comes_back(pki: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(tls_settings(pki, tmp_path / "fleet.db")) as server:
            async with channel(server.port, pki, "h1") as host_ch, channel(server.port, pki, "alice") as op_ch:
                agent = Agent(host_ch)
                await agent.connect("h1")
                fleet = pb_grpc.FleetServiceStub(op_ch)
                drain = asyncio.ensure_future(fleet.FleetDrain(
                    pb.FleetDrainRequest(host_id="h1", port="eth1", reason="optic swap"), timeout=DEADLINE_S))
                command = (await agent.read_kind("command")).command
                assert command.WhichOneof("action") == "drain"
                assert (command.drain.port, command.drain.reason, command.by) == ("eth1", "optic swap", "alice")
                await agent.send(pb.ConnectRequest(command_result=pb.CommandResult(
                    id=command.id, code=0, message="eth1 drained")))
                assert (await drain).message == "eth1 drained"

                undrain = asyncio.ensure_future(fleet.FleetUndrain(
                    pb.FleetUndrainRequest(host_id="h1", port="eth9"), timeout=DEADLINE_S))
                command = (await agent.read_kind("command")).command
                await agent.send(pb.ConnectRequest(command_result=pb.CommandResult(
                    id=command.id, code=grpc.StatusCode.NOT_FOUND.value[0], message="unknown port 'eth9'")))
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await undrain
                assert err.value.code() == grpc.StatusCode.NOT_FOUND
                assert err.value.details() == "host h1: unknown port 'eth9'"
                agent.call.cancel()
                await eventually(lambda: "h1" not in server.fleet.sessions, "h1 to disconnect")

                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await fleet.FleetDrain(pb.FleetDrainRequest(host_id="h1", port="eth1"), timeout=DEADLINE_S)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
                assert err.value.details() == "host h1 is not connected"
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await fleet.FleetDrain(pb.FleetDrainRequest(host_id="nohost", port="eth1"), timeout=DEADLINE_S)
                assert err.value.code() == grpc.StatusCode.NOT_FOUND
                assert "nohost" in err.value.details()

    run(scenario())


def test_insecure_mode_trusts_hello_and_allows_commands(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(insecure_settings(tmp_path / "fleet.db")) as server:
            async with channel(server.port, None) as ch:
                agent = Agent(ch)
                await agent.connect("lab-host")
                drain = asyncio.ensure_future(pb_grpc.FleetServiceStub(ch).FleetDrain(
                    pb.FleetDrainRequest(host_id="lab-host", port="eth1"), timeout=DEADLINE_S))
                command = (await agent.read_kind("command")).command
                await agent.send(pb.ConnectRequest(command_result=pb.CommandResult(id=command.id, message="ok")))
                assert (await drain).message == "ok"
                agent.call.cancel()

    run(scenario())


# --------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------


def test_the_first_message_must_be_a_hello(pki: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(tls_settings(pki, tmp_path / "fleet.db")) as server:
            async with channel(server.port, pki, "h1") as ch:
                agent = Agent(ch)
                await agent.send(batch("boot-a", [1]))
                err = await agent.refusal()
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert err.details() == "the first message must be a Hello, not events"
            assert await server.fleet.store.events(EventQuery()) == []

    run(scenario())


def test_a_stream_without_hello_is_refused_after_the_deadline(pki: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(tls_settings(pki, tmp_path / "fleet.db"), hello_timeout_s=0.3) as server:
            async with channel(server.port, pki, "h1") as ch:
                agent = Agent(ch)
                err = await agent.refusal()
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "no Hello within 0.3 s" in err.details()

    run(scenario())


def test_out_of_order_events_are_refused_naming_the_seqs(pki: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(tls_settings(pki, tmp_path / "fleet.db")) as server:
            async with channel(server.port, pki, "h1") as ch:
                agent = Agent(ch)
                await agent.connect("h1")
                await agent.send(batch("boot-a", range(1, 6)))
                assert (await agent.read_kind("ack")).ack.seq == 5
                await agent.send(batch("boot-a", [3, 4]))
                err = await agent.refusal()
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "event seq 3 of boot boot-a after seq 5 sent earlier on this stream" in err.details()
            async with channel(server.port, pki, "h1") as ch:
                agent = Agent(ch)
                await agent.connect("h1")
                await agent.send(batch("boot-b", [1, 3, 2]))
                err = await agent.refusal()
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "event seq 2 of boot boot-b after seq 3 in the same batch" in err.details()
            stored = await server.fleet.store.events(EventQuery(host_id="h1"))
            assert [(e.boot_id, e.seq) for e in stored] == [("boot-a", s) for s in range(1, 6)]

    run(scenario())


def test_oversized_messages_and_batches_are_refused(pki: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        settings = tls_settings(pki, tmp_path / "fleet.db", max_message_bytes=64 * 1024)
        async with serving(settings) as server:
            async with channel(server.port, pki, "h1") as ch:
                agent = Agent(ch)
                welcome = await agent.connect("h1")
                assert welcome.max_message_bytes == 64 * 1024
                await agent.send(batch("boot-a", [1], message="x" * 100_000))
                err = await agent.refusal()
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "larger than max" in err.details()
            async with channel(server.port, pki, "h1") as ch:
                agent = Agent(ch)
                await agent.connect("h1")
                many = pb.ConnectRequest(events=pb.EventBatch(boot_id="boot-a", events=[
                    cpb.Event(boot_id="boot-a", seq=s) for s in range(1, 1202)]))
                assert many.ByteSize() < 64 * 1024
                await agent.send(many)
                err = await agent.refusal()
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert err.details() == "EventBatch of 1201 events: at most 1000 per batch"
            assert await server.fleet.store.events(EventQuery()) == []

    run(scenario())


def test_one_host_sending_garbage_does_not_disturb_another(pki: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(tls_settings(pki, tmp_path / "fleet.db")) as server:
            async with channel(server.port, pki, "h1") as ch1, channel(server.port, pki, "h2") as ch2:
                good = Agent(ch1)
                await good.connect("h1")
                bad = Agent(ch2)
                await bad.connect("h2")
                seq = 0
                for round_ in range(3):
                    for _ in range(5):
                        await good.send(batch("boot-a", range(seq + 1, seq + 11)))
                        seq += 10
                    if round_ == 1:  # garbage from h2 while h1's batches are in flight
                        await bad.send(pb.ConnectRequest())
                        err = await bad.refusal()
                        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
                        assert "empty ConnectRequest" in err.details()
                    acked = 0
                    while acked < seq:
                        acked = (await good.read_kind("ack")).ack.seq
                    assert acked == seq
                assert "h1" in server.fleet.sessions and "h2" not in server.fleet.sessions
                stored = await server.fleet.store.events(EventQuery(host_id="h1", limit=1000))
                assert [e.seq for e in stored] == list(range(1, 151))
                good.call.cancel()

    run(scenario())


# --------------------------------------------------------------------------
# fleet reads, mesh, health
# --------------------------------------------------------------------------


def test_watchers_get_new_events_and_a_slow_one_is_dropped_without_slowing_ingestion(
        pki: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(tls_settings(pki, tmp_path / "fleet.db"), watcher_queue=4) as server:
            # No BDP probing: the watcher's HTTP/2 window stays at its 64 KiB start.
            small_window = [("grpc.http2.bdp_probe", 0)]
            async with (channel(server.port, pki, "h1") as ch,
                        channel(server.port, pki, "alice", options=small_window) as op):
                agent = Agent(ch)
                await agent.connect("h1")
                await agent.send(batch("boot-a", [1, 2]))  # before the watch: not pushed
                assert (await agent.read_kind("ack")).ack.seq == 2
                fleet = pb_grpc.FleetServiceStub(op)
                watch = fleet.WatchFleetEvents(pb.WatchFleetEventsRequest(host_id="h1"))
                await eventually(lambda: server.fleet.fanout.watchers == 1, "the watcher to subscribe")
                await agent.send(batch("boot-a", [3]))
                assert (await agent.read_kind("ack")).ack.seq == 3
                got = await asyncio.wait_for(watch.read(), DEADLINE_S)
                assert (got.event.host_id, got.event.event.seq) == ("h1", 3) and got.event.id > 0
                # Now stop reading: big events fill the HTTP/2 window, then its queue of 4.
                seq, big = 3, "y" * 20_000
                for _ in range(40):
                    await agent.send(batch("boot-a", range(seq + 1, seq + 3), message=big))
                    seq += 2
                    assert (await agent.read_kind("ack")).ack.seq == seq  # ingestion goes on
                await eventually(lambda: server.metrics.watchers_dropped._value.get() == 1, "the drop")
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    while True:
                        await asyncio.wait_for(watch.read(), DEADLINE_S)
                assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "resume with after_id" in err.value.details()
                # A new watcher from a cursor gets the history after it, then live events.
                listed = await fleet.ListFleetEvents(pb.ListFleetEventsRequest(host_id="h1"), timeout=DEADLINE_S)
                assert [e.event.seq for e in listed.events] == list(range(1, seq + 1))
                cursor = listed.events[-3].id
                watch = fleet.WatchFleetEvents(pb.WatchFleetEventsRequest(after_id=cursor))
                seen = [(await asyncio.wait_for(watch.read(), DEADLINE_S)).event.event.seq for _ in range(2)]
                assert seen == [seq - 1, seq]
                await agent.send(batch("boot-a", [seq + 1]))
                assert (await asyncio.wait_for(watch.read(), DEADLINE_S)).event.event.seq == seq + 1
                watch.cancel()
                agent.call.cancel()

    run(scenario())


def test_probe_peers_follow_joins_and_leaves(pki: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(tls_settings(pki, tmp_path / "fleet.db"), plan_debounce_s=0.05) as server:
            async with (channel(server.port, pki, "h1") as c1, channel(server.port, pki, "h2") as c2,
                        channel(server.port, pki, "h3") as c3):
                agents = {}
                for n, (host, ch) in enumerate((("h1", c1), ("h2", c2), ("h3", c3)), start=1):
                    agents[host] = Agent(ch)
                    await agents[host].connect(host)
                    await agents[host].send(inventory(f"198.18.0.{n}/24", leaf=f"leaf{n}"))

                async def peers_of(host: str, want: set[str]) -> int:
                    while True:
                        got = (await agents[host].read_kind("peers")).peers
                        rails = {r.rail: set(r.peers) for r in got.rails}
                        if rails.get("rail0") == want:
                            return got.generation

                g1 = await peers_of("h1", {"198.18.0.2", "198.18.0.3"})
                await peers_of("h2", {"198.18.0.1", "198.18.0.3"})
                agents["h3"].call.cancel()  # h3 leaves: h1 and h2 stop probing it
                g2 = await peers_of("h1", {"198.18.0.2"})
                assert g2 > g1
                await peers_of("h2", {"198.18.0.1"})
                for host in ("h1", "h2"):
                    agents[host].call.cancel()

    run(scenario())


def test_summary_counts_absorbed_failures_with_the_gpus_behind_them(pki: Path, tmp_path: Path) -> None:
    """Absorbed: the failover and the move of the rail's address through
    the healthy rail. A failover alone is outgoing only (the old rule
    counted it absorbed); a drain and the failback are neither."""
    async def scenario() -> None:
        async with serving(tls_settings(pki, tmp_path / "fleet.db", restart_cost_min=30.0)) as server:
            async with channel(server.port, pki, "h1") as ch:
                agent = Agent(ch)
                await agent.connect("h1")
                await agent.send(inventory("198.18.0.1/24", gpus=4))
                failover = {"path": "rail1", "previous": "rail0", "cause": "verdict"}
                failback = {"path": "rail0", "previous": "rail1", "cause": "recovered"}
                drain = {"path": "rail1", "previous": "rail0", "cause": "drain"}
                moved = {"address": "198.18.0.1", "change": "detoured", "via": "rail1", "role": "detour",
                         "previous": "rail0"}
                fleet = pb_grpc.FleetServiceStub(ch)

                async def today() -> tuple[int, float, int]:
                    summary = await fleet.GetSummary(pb.GetSummaryRequest(days=2), timeout=DEADLINE_S)
                    assert len(summary.days) == 2
                    assert (summary.hosts, summary.hosts_connected, summary.restart_cost_s) == (1, 1, 1800.0)
                    day = summary.days[-1]
                    return day.failures_absorbed, day.gpu_hours_saved, day.failures_outgoing_only

                await agent.send(pb.ConnectRequest(events=pb.EventBatch(boot_id="boot-a", events=[
                    event("boot-a", 1, kind=cpb.EVENT_KIND_RAIL_PATH, fields=failover),
                    event("boot-a", 2, kind=cpb.EVENT_KIND_RAIL_PATH, fields=drain)])))
                assert (await agent.read_kind("ack")).ack.seq == 2
                assert await today() == (0, 0.0, 1)  # the host's traffic moved, traffic to rail0 did not
                await agent.send(pb.ConnectRequest(events=pb.EventBatch(boot_id="boot-a", events=[
                    event("boot-a", 3, kind=cpb.EVENT_KIND_ANNOUNCE, fields=moved),
                    event("boot-a", 4, kind=cpb.EVENT_KIND_RAIL_PATH, fields=failback)])))
                assert (await agent.read_kind("ack")).ack.seq == 4
                assert await today() == (1, 2.0, 0)
                agent.call.cancel()

    run(scenario())


def test_health_and_reflection_name_both_services(pki: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(tls_settings(pki, tmp_path / "fleet.db")) as server:
            async with channel(server.port, pki, "alice") as ch:
                health = health_pb2_grpc.HealthStub(ch)
                for service in ("", "linkpass.v1.AgentService", "linkpass.v1.FleetService"):
                    got = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=DEADLINE_S)
                    assert got.status == health_pb2.HealthCheckResponse.SERVING
                stream = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(timeout=DEADLINE_S)
                await stream.write(reflection_pb2.ServerReflectionRequest(list_services=""))
                answer = await stream.read()
                names = {s.name for s in answer.list_services_response.service}
                assert {"linkpass.v1.AgentService", "linkpass.v1.FleetService", "grpc.health.v1.Health"} <= names
                stream.cancel()

    run(scenario())
