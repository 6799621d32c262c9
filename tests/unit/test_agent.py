"""The agent against a real grpc.aio AgentService written here (a test double
of linkpass-aggregator; insecure, on 127.0.0.1): what the aggregator holds is
never sent again, events outlive the aggregator's absence and arrive once,
gaps are reported, backoff is jittered and bounded, probe peers and drain
commands reach the daemon, and nothing the aggregator does holds up the
daemon's event hand-off."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random

import grpc
import pytest

from corefixtures import rails_config
from linkpassd._proto.linkpass.v1 import fleet_pb2, fleet_pb2_grpc
from linkpassd.adapters.links import LinkSnapshot
from linkpassd.agent.client import AgentClient, backoff_s
from linkpassd.agent.spool import Spool, SpoolWriter
from linkpassd.core.model import AggregatorSettings, ProbeSettings
from linkpassd.daemon.loop import Daemon
from test_daemon_faults import Clock, FakeKernel, link
from test_spool import events

DEADLINE_S = 20.0


async def until(predicate, what: str, timeout: float = DEADLINE_S) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


class FakeAggregator(fleet_pb2_grpc.AgentServiceServicer):
    """Stores each (boot, seq) once; acks every batch; can misbehave: modes
    "deaf", "garbage", "hangup" (ends each stream right after its Welcome);
    `swallow` (set at any time): batches are taken, neither stored nor
    acknowledged, as by a replica that dies before its commit."""

    def __init__(self, stored=None, mode: str = "normal") -> None:
        self.stored: dict[str, dict[int, object]] = stored if stored is not None else {}
        self.duplicates = 0
        self.gaps: list[tuple[str, int, int]] = []
        self.hellos: list[fleet_pb2.Hello] = []
        self.received: list[str] = []
        self.results: list[fleet_pb2.CommandResult] = []
        self.outgoing: asyncio.Queue = asyncio.Queue()
        self.mode = mode
        self.swallow = False
        self.seqs: list[int] = []  # every event's seq received, stored or not, in order

    async def Connect(self, request_iterator, context):
        reader = aiter(request_iterator)
        hello = (await anext(reader)).hello
        self.hellos.append(hello)
        stored = [fleet_pb2.EventAck(boot_id=b, seq=max(s)) for b, s in self.stored.items() if s]
        yield fleet_pb2.ConnectResponse(welcome=fleet_pb2.Welcome(
            heartbeat_s=0.2, stored=stored, max_message_bytes=1 << 20))
        if self.mode == "hangup":
            return
        if self.mode == "deaf":  # stops reading: the agent's writes back up
            await asyncio.Event().wait()
        if self.mode == "garbage":
            yield fleet_pb2.ConnectResponse(ack=fleet_pb2.EventAck(boot_id="", seq=7))
            yield fleet_pb2.ConnectResponse(peers=fleet_pb2.ProbePeers(
                generation=1, rails=[fleet_pb2.RailPeers(rail="x" * 5000, peers=["nope"])]))
            yield fleet_pb2.ConnectResponse(peers=fleet_pb2.ProbePeers(
                generation=2, rails=[fleet_pb2.RailPeers(rail="rail0", peers=["9" * (5 << 20)])]))
            return
        pump = asyncio.ensure_future(self._pump_requests(reader))
        try:
            while True:
                item = await self.outgoing.get()
                if item is None:
                    break
                yield item
        finally:
            pump.cancel()

    async def _pump_requests(self, reader) -> None:
        async for request in reader:
            body = request.WhichOneof("body")
            self.received.append(body)
            if body == "events":
                batch = request.events
                self.seqs += [e.seq for e in batch.events]
                if self.swallow:
                    continue
                if batch.gap_first:
                    self.gaps.append((batch.boot_id, batch.gap_first, batch.gap_last))
                held = self.stored.setdefault(batch.boot_id, {})
                for e in batch.events:
                    if e.seq in held:
                        self.duplicates += 1
                    held[e.seq] = e
                last = max(held) if held else 0
                await self.outgoing.put(fleet_pb2.ConnectResponse(
                    ack=fleet_pb2.EventAck(boot_id=batch.boot_id, seq=last)))
            elif body == "command_result":
                self.results.append(request.command_result)


async def serve(servicer, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    fleet_pb2_grpc.add_AgentServiceServicer_to_server(servicer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, bound


class FakeHost:
    def __init__(self) -> None:
        self.peers: list[fleet_pb2.ProbePeers] = []

    def inventory(self):
        return fleet_pb2.Inventory(rails=[fleet_pb2.RailInventory(rail="rail0", port="eth0")])

    def port_report(self):
        return fleet_pb2.PortReport(rail_paths={"rail0": "rail0"})

    def take_peers(self, message):
        self.peers.append(message)

    async def command(self, command):
        return 0, "ok"


def agent_for(port: int, spool: Spool, host, **kw) -> AgentClient:
    settings = AggregatorSettings(addresses=(f"127.0.0.1:{port}",), insecure=True,
                                  host_id="gpu-017")
    return AgentClient(settings, spool, host, boot_id="boot-a", rng=random.Random(7),
                       backoff_base_s=0.05, backoff_cap_s=0.2, **kw)


def new_spool(tmp_path, max_events: int = 100_000) -> Spool:
    spool = Spool(str(tmp_path / "spool"), max_events, segment_records=50, fsync=False)
    spool.open()
    return spool


async def running(agent: AgentClient):
    return asyncio.create_task(agent.run())


async def stop(tasks: list[asyncio.Task], server: grpc.aio.Server | None = None) -> None:
    """Cancel the tasks and wait for them, bounded, then stop the server even
    if one did not end: a task that swallows its cancellation fails the test
    by name instead of hanging it, and no live gRPC server is left behind (one
    makes the interpreter's exit wait forever in grpc's shutdown)."""
    for task in tasks:
        task.cancel()
    try:
        done, stuck = await asyncio.wait(tasks, timeout=DEADLINE_S)
    finally:
        if server is not None:
            await server.stop(None)
    for task in done:
        if not task.cancelled():
            task.exception()  # what it raised on the way out is not the point here
    assert not stuck, f"tasks ignored their cancellation: {[t.get_coro() for t in stuck]}"


def test_hello_then_welcome_drops_what_the_aggregator_holds(tmp_path):
    async def main():
        spool = new_spool(tmp_path)
        spool.append(events(10))
        fake = FakeAggregator(stored={"boot-a": {s: None for s in range(1, 6)}})
        server, port = await serve(fake)
        task = await running(agent_for(port, spool, FakeHost()))
        try:
            await until(lambda: len(fake.stored["boot-a"]) == 10, "events 6..10")
            await until(lambda: spool.pending == 0, "the spool trimmed by acks")
        finally:
            await stop([task], server)
        assert fake.duplicates == 0  # 1..5 were never sent
        assert [h.host_id for h in fake.hellos] == ["gpu-017"] and fake.hellos[0].boot_id == "boot-a"
        assert fake.received[:2] == ["inventory", "ports"]
        spool.close()
    asyncio.run(main())


def test_events_offered_while_the_aggregator_is_away_arrive_once_when_it_is_back(tmp_path):
    async def main():
        spool = new_spool(tmp_path)
        writer = SpoolWriter(spool)
        writer.opened = True
        fake = FakeAggregator()
        server, port = await serve(fake)
        agent = agent_for(port, spool, FakeHost())
        writer.on_written = agent.wake
        tasks = [asyncio.create_task(writer.run()), await running(agent)]
        all_events = events(1200)
        try:
            writer.offer(all_events[:400])
            await until(lambda: len(fake.stored.get("boot-a", {})) == 400, "the first 400")
            await server.stop(None)  # the aggregator goes away
            writer.offer(all_events[400:])
            await until(lambda: spool.total >= 800, "the rest spooled meanwhile")
            await until(lambda: agent.attempts >= 2, "failed reconnects meanwhile")
            server, _ = await serve(fake, port)  # back, with what it stored
            await until(lambda: len(fake.stored["boot-a"]) == 1200, "all 1200 stored")
            await until(lambda: spool.pending == 0, "the spool emptied")
        finally:
            await stop(tasks, server)
        assert sorted(fake.stored["boot-a"]) == list(range(1, 1201))
        assert agent.sessions >= 2
        spool.close()
    asyncio.run(main())


def test_backoff_is_exponential_with_full_jitter_and_capped():
    rng = random.Random(1)
    for attempt in range(12):
        draws = [backoff_s(attempt, rng) for _ in range(200)]
        bound = min(30.0, 0.5 * 2 ** attempt)
        assert all(0.0 <= d <= bound for d in draws)
        assert max(draws) > 0.6 * bound and min(draws) < 0.4 * bound  # spread, not fixed
    assert backoff_s(10_000, rng) <= 30.0


def test_a_dead_address_is_retried_with_bounded_jittered_waits(tmp_path):
    async def main():
        server, port = await serve(FakeAggregator())
        await server.stop(None)  # nobody listens there now
        agent = agent_for(port, new_spool(tmp_path), FakeHost())
        task = await running(agent)
        try:
            await until(lambda: len(agent.delays) >= 6, "six retries")
        finally:
            await stop([task])
        assert all(0.0 <= d <= min(0.2, 0.05 * 2 ** i) for i, d in enumerate(agent.delays))
        assert len(set(agent.delays)) == len(agent.delays)  # jittered
        assert agent.sessions == 0 and agent.last_failure[0] == "UNAVAILABLE"
    asyncio.run(main())


def test_events_the_bounded_spool_dropped_are_reported_as_a_gap(tmp_path):
    async def main():
        spool = new_spool(tmp_path, max_events=100)  # 50-record segments
        spool.append(events(160))
        fake = FakeAggregator()
        server, port = await serve(fake)
        task = await running(agent_for(port, spool, FakeHost()))
        try:
            # whole segments go: 1..50 and 51..100, so that 101..160 fit
            await until(lambda: len(fake.stored.get("boot-a", {})) == 60, "the 60 kept")
        finally:
            await stop([task], server)
        assert fake.gaps == [("boot-a", 1, 100)] and min(fake.stored["boot-a"]) == 101
        spool.close()
    asyncio.run(main())


def make_daemon(tmp_path, static=("198.19.0.1",), fabric=("198.19.0.0/16",)) -> Daemon:
    config = rails_config(2)
    rails = (dataclasses.replace(config.rails[0], probe_peers=static),) + config.rails[1:]
    config = dataclasses.replace(
        config, rails=rails, state_dir=str(tmp_path / "state"),
        probes=ProbeSettings(enabled=True, port=0, fabric_prefixes=fabric),
        aggregator=AggregatorSettings(addresses=("127.0.0.1:1",), insecure=True))
    clock = Clock()
    daemon = Daemon(config, clock=clock, wallclock=lambda: 1.8e9 + clock.t)
    daemon.kernel = FakeKernel()
    return daemon


async def reconcile_forever(daemon: Daemon) -> None:
    while True:
        await daemon.handle([await daemon.queue.get()])


@contextlib.asynccontextmanager
async def connected_agent(tmp_path, daemon: Daemon):
    """`daemon`'s agent connected to a fake aggregator (yielded), with the
    daemon's reconcile loop running; both stopped, bounded, on the way out."""
    fake = FakeAggregator()
    server, port = await serve(fake)
    agent = agent_for(port, new_spool(tmp_path), daemon.aggregator.host)
    tasks = [await running(agent), asyncio.create_task(reconcile_forever(daemon))]
    try:
        await until(lambda: agent.connected, "connected")
        yield fake
    finally:
        await stop(tasks, server)


def peers_message(generation: int, *peers: str) -> fleet_pb2.ConnectResponse:
    return fleet_pb2.ConnectResponse(peers=fleet_pb2.ProbePeers(
        generation=generation, rails=[fleet_pb2.RailPeers(rail="rail0", peers=list(peers))]))


def test_probe_peers_reach_the_echo_paths_and_staying_probers_keep_running(tmp_path):
    async def main():
        daemon = make_daemon(tmp_path)
        await daemon.handle([LinkSnapshot(samples={p: link(p) for p in ("eth0", "eth1")},
                                          reason="start")])
        daemon.sync_probes()
        def peers():
            return sorted(p.peer for p in daemon.probes.echo.probers)
        try:
            async with connected_agent(tmp_path, daemon) as fake:
                # a bad address, an on-link one and an unknown rail are ignored
                await fake.outgoing.put(peers_message(3, "198.19.0.2", "bogus", "198.18.0.7"))
                await until(lambda: peers() == ["198.19.0.1", "198.19.0.2"], "mesh peer added")
                assert any("'bogus'" in p for p in daemon.aggregator.mesh_problems)
                assert any("'198.18.0.7'" in p and "subnet" in p for p in daemon.aggregator.mesh_problems)
                static, mesh = (daemon.probes.echo.probers[p] for p in sorted(daemon.probes.echo.probers,
                                                                       key=lambda p: p.peer)[:2])
                await fake.outgoing.put(peers_message(2, "198.19.0.9"))  # stale: ignored
                await fake.outgoing.put(peers_message(4, "198.19.0.2", "198.19.0.3"))
                await until(lambda: peers() == ["198.19.0.1", "198.19.0.2", "198.19.0.3"],
                            "second plan applied")
                by_peer = {p.peer: pr for p, pr in daemon.probes.echo.probers.items()}
                assert by_peer["198.19.0.1"] is static and by_peer["198.19.0.2"] is mesh  # not reset
                assert "198.19.0.9" not in by_peer
                await fake.outgoing.put(peers_message(5))  # the mesh drops rail0's peers
                await until(lambda: peers() == ["198.19.0.1"], "static peer stays")
                assert daemon.probes.echo.probers[next(iter(daemon.probes.echo.probers))] is static
        finally:
            daemon.probes.echo.close()
    asyncio.run(main())


def test_the_hosts_that_probe_us_are_answered_and_a_bad_one_is_named_not_admitted(tmp_path):
    """The mesh is not symmetric: a host must answer peers it does not probe
    itself, or their probes of it are refused and their paths never come up."""
    from linkpassd.core.admission import ipv4_int

    async def main():
        daemon = make_daemon(tmp_path, fabric=())  # no prefix admits the probers
        await daemon.handle([LinkSnapshot(samples={p: link(p) for p in ("eth0", "eth1")},
                                          reason="start")])
        daemon.sync_probes()
        def admits(address):
            return daemon.probes.echo_spec.responder.allows(ipv4_int(address))
        try:
            async with connected_agent(tmp_path, daemon) as fake:
                assert not admits("198.19.0.44")
                await fake.outgoing.put(fleet_pb2.ConnectResponse(peers=fleet_pb2.ProbePeers(
                    generation=7, rails=[fleet_pb2.RailPeers(
                        rail="rail0", peers=["198.19.0.2"], probed_by=["198.19.0.44", "nonsense"])])))
                await until(lambda: admits("198.19.0.44"), "prober admitted")
                assert not admits("198.19.0.45")
                assert any("'nonsense'" in p and "probed_by" in p for p in daemon.aggregator.mesh_problems)
        finally:
            daemon.probes.echo.close()
    asyncio.run(main())


def test_a_drain_command_goes_through_the_drain_queue_and_its_answer_comes_back(tmp_path):
    async def main():
        daemon = make_daemon(tmp_path, static=())
        await daemon.handle([LinkSnapshot(samples={p: link(p) for p in ("eth0", "eth1")},
                                          reason="start")])
        async with connected_agent(tmp_path, daemon) as fake:
            await fake.outgoing.put(fleet_pb2.ConnectResponse(command=fleet_pb2.Command(
                id="c1", by="alice", drain=fleet_pb2.FleetDrainRequest(
                    host_id="gpu-017", port="eth0", reason="optic swap"))))
            await fake.outgoing.put(fleet_pb2.ConnectResponse(command=fleet_pb2.Command(
                id="c2", by="alice", undrain=fleet_pb2.FleetUndrainRequest(port="eth9"))))
            await until(lambda: len(fake.results) == 2, "two command results")
        results = {r.id: r for r in fake.results}
        assert results["c1"].code == grpc.StatusCode.OK.value[0]
        assert daemon.drains.by_port["eth0"].by == "alice via the aggregator"
        assert daemon.drains.by_port["eth0"].reason == "optic swap"
        assert results["c2"].code == grpc.StatusCode.NOT_FOUND.value[0]
        assert "eth9" in results["c2"].message
    asyncio.run(main())


@pytest.mark.parametrize("mode", ["deaf", "garbage"])
def test_a_misbehaving_aggregator_never_holds_up_the_event_hand_off(tmp_path, mode):
    async def main():
        spool = new_spool(tmp_path)
        writer = SpoolWriter(spool)
        writer.opened = True
        fake = FakeAggregator(mode=mode)
        server, port = await serve(fake)
        host = FakeHost()
        agent = agent_for(port, spool, host)
        writer.on_written = agent.wake
        tasks = [asyncio.create_task(writer.run()), await running(agent)]
        try:
            await until(lambda: len(fake.hellos) >= 1, "a stream")
            # 20 passes' worth of events, 1000 each, at 50,000 events/s: far
            # beyond any daemon, and within what the writer sustains while a
            # garbage-sending aggregator makes the agent reconnect and re-read
            # the spool as fast as its backoff allows (at 200,000/s, a 2-core
            # machine fell behind the 10,000-event hand-off one run in three).
            for chunk in range(20):
                writer.offer(events(1000, start=chunk * 1000))  # a plain call: never awaits
                await asyncio.sleep(0.02)
            await until(lambda: spool.total == 20_000, "every event spooled")
            if mode == "garbage":
                await until(lambda: len(fake.hellos) >= 3, "reconnects after garbage")
        finally:
            await stop(tasks, server)
        assert writer.dropped == 0  # the writer kept up although the stream was stuck
        if mode == "garbage":
            assert host.peers == [] or all(p.generation == 1 for p in host.peers)
            assert agent.last_failure is None or agent.last_failure[0] in (
                "RESOURCE_EXHAUSTED", "INTERNAL", "StreamError", "UNAVAILABLE",
                "InvalidStateError")
        spool.close()
    asyncio.run(main())


class ScriptedCall:
    """A stream call without gRPC, so the loop takes the same steps every run:
    the one operation named by `hold` ("write": the Hello, "read": the
    Welcome) waits until the test opens `gate`; after the Welcome the
    aggregator says nothing more."""

    def __init__(self, hold: str | None) -> None:
        self.hold = hold
        self.gate = asyncio.get_running_loop().create_future()
        self.holding = False
        self.welcomed = False

    async def _maybe_held(self, what: str) -> None:
        if self.hold == what:
            self.hold, self.holding = None, True
            await self.gate

    async def write(self, request) -> None:
        await self._maybe_held("write")

    async def read(self):
        await self._maybe_held("read")
        if not self.welcomed:
            self.welcomed = True
            return fleet_pb2.ConnectResponse(welcome=fleet_pb2.Welcome(heartbeat_s=3600))
        await asyncio.get_running_loop().create_future()  # quiet from now on

    def cancel(self) -> None:
        pass


@pytest.mark.parametrize("moment", ["hello_written", "welcome_read", "woken_while_idle"])
def test_a_cancel_that_lands_as_an_await_completes_still_stops_the_agent(tmp_path, moment):
    """On Python 3.11 asyncio.wait_for returns the inner result and drops a
    cancel that arrives in the loop step where the inner await completes
    (CPython gh-86296): the daemon's stop or reload then waits forever for an
    agent that never ends. Sweep the cancel across the steps after the await
    completes, so one of them lands in that step."""
    async def main():
        for steps in range(10):
            spool = new_spool(tmp_path / f"{moment}-{steps}")
            agent = agent_for(1, spool, FakeHost())
            call = ScriptedCall({"hello_written": "write", "welcome_read": "read"}.get(moment))
            task = asyncio.create_task(agent._stream(call))
            try:
                if moment == "woken_while_idle":
                    await until(lambda agent=agent: agent._wake._waiters, "the agent waiting for work")
                    agent.wake()
                else:
                    await until(lambda call=call: call.holding, f"the {moment} held")
                    call.gate.set_result(None)
                for _ in range(steps):
                    await asyncio.sleep(0)
                task.cancel()
                done, _ = await asyncio.wait({task}, timeout=DEADLINE_S)
                assert task in done and task.cancelled(), \
                    f"a cancel {steps} loop steps after the {moment} was swallowed"
            finally:
                task.cancel()
                await asyncio.wait({task}, timeout=DEADLINE_S)
                spool.close()
    asyncio.run(main())


def test_the_last_plan_outlives_a_restart_while_the_aggregator_is_away(tmp_path):
    """A daemon restarted with its aggregator away still probes its mesh
    peers and answers the hosts that probe it (mesh.json in the state
    directory), instead of leaving those paths unwatched until it is back."""
    from linkpassd.core.admission import ipv4_int
    from linkpassd.daemon.statefiles import MESH_FILE

    start = LinkSnapshot(samples={p: link(p) for p in ("eth0", "eth1")}, reason="start")

    async def first_run():
        daemon = make_daemon(tmp_path, fabric=())
        await daemon.handle([start])
        daemon.sync_probes()
        try:
            async with connected_agent(tmp_path, daemon) as fake:
                await fake.outgoing.put(fleet_pb2.ConnectResponse(peers=fleet_pb2.ProbePeers(
                    generation=9, rails=[fleet_pb2.RailPeers(
                        rail="rail0", peers=["198.19.0.2"], probed_by=["198.19.0.44"])])))
                await until(lambda: (tmp_path / "state" / MESH_FILE).exists(), "mesh.json written")
        finally:
            daemon.probes.echo.close()

    async def restart():
        daemon = make_daemon(tmp_path, fabric=())  # its aggregator (127.0.0.1:1) is away
        daemon.aggregator.restore_mesh()  # as Daemon.run does, before the probers are made
        daemon.sync_probes()
        try:
            assert sorted(p.peer for p in daemon.probes.echo.probers) == ["198.19.0.1", "198.19.0.2"]
            assert daemon.probes.echo_spec.responder.allows(ipv4_int("198.19.0.44"))
            assert not daemon.probes.echo_spec.responder.allows(ipv4_int("198.19.0.45"))
            assert daemon.files.problems == {}
            await daemon.handle([start])  # a pass with the plan unchanged writes nothing
            assert daemon.files.saved_mesh_message is daemon.aggregator.mesh_message
        finally:
            daemon.probes.echo.close()

    asyncio.run(first_run())
    written = (tmp_path / "state" / MESH_FILE).stat().st_mtime_ns
    asyncio.run(restart())
    assert (tmp_path / "state" / MESH_FILE).stat().st_mtime_ns == written


@pytest.mark.parametrize("content", ['{"version": 1, "probe_peers": {"rails": [{"rail": 5}]}}',
                                     '{"version": 2, "probe_peers": {}}', "[1, 2]", "{not json"])
def test_an_unusable_mesh_file_is_reported_and_only_the_static_peers_are_probed(tmp_path, content):
    from linkpassd.daemon.statefiles import MESH_FILE

    (tmp_path / "state").mkdir()
    (tmp_path / "state" / MESH_FILE).write_text(content)

    async def main():
        daemon = make_daemon(tmp_path)
        daemon.aggregator.restore_mesh()
        daemon.sync_probes()
        try:
            assert [p.peer for p in daemon.probes.echo.probers] == ["198.19.0.1"]
            (problem,) = daemon.files.problems.values()
            assert problem.kind == "state" and problem.what.endswith(MESH_FILE)
            assert "ignored" in problem.detail
        finally:
            daemon.probes.echo.close()
    asyncio.run(main())


def test_a_standalone_daemon_ignores_a_mesh_file(tmp_path):
    import json

    from google.protobuf import json_format

    from linkpassd.daemon.statefiles import MESH_FILE

    (tmp_path / "state").mkdir()
    message = fleet_pb2.ProbePeers(generation=1, rails=[fleet_pb2.RailPeers(rail="rail0",
                                                                             peers=["198.19.0.2"])])
    (tmp_path / "state" / MESH_FILE).write_text(json.dumps(
        {"version": 1, "probe_peers": json_format.MessageToDict(message)}))

    async def main():
        daemon = make_daemon(tmp_path)
        daemon.config = dataclasses.replace(daemon.config, aggregator=None)
        daemon.aggregator.restore_mesh()
        daemon.sync_probes()
        try:
            assert [p.peer for p in daemon.probes.echo.probers] == ["198.19.0.1"]
            assert daemon.files.problems == {}
        finally:
            daemon.probes.echo.close()
    asyncio.run(main())


def test_fence_grants_reach_the_fence_step_and_end_with_the_stream(tmp_path):
    async def main():
        daemon = make_daemon(tmp_path, static=())
        await daemon.handle([LinkSnapshot(samples={p: link(p) for p in ("eth0", "eth1")},
                                          reason="start")])
        assert daemon.fencing.grants is None  # no stream: no grant
        async with connected_agent(tmp_path, daemon) as fake:
            await fake.outgoing.put(fleet_pb2.ConnectResponse(fence=fleet_pb2.FenceGrants(
                ports=["eth0"], leaf_cap=1)))
            await until(lambda: daemon.fencing.grants == frozenset({"eth0"}), "grant taken")
            await fake.outgoing.put(None)  # the aggregator ends the stream
            await until(lambda: daemon.fencing.grants is None, "grants dropped with the stream")
    asyncio.run(main())
