"""The agent with several aggregator replicas ([aggregator] address as an
array), against real grpc.aio AgentServices (test_agent.FakeAggregator) on
Unix sockets under tmp_path: it moves to the next replica when its stream
ends and sends again what was not acknowledged, so nothing is lost; its
backoff grows for an aggregator that welcomes and then fails at once, per
full pass over the list, and starts again only after a healthy stream.

Backoff waits are read, not timed: the agent records each wait it chose
(AgentClient.delays), and `Highest` makes every full-jitter draw its upper
bound, so the waits show the attempt count exactly."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest
from structlog.testing import capture_logs

from linkpassd._proto.linkpass.v1 import fleet_pb2_grpc
from linkpassd.agent.client import AgentClient
from linkpassd.agent.spool import SpoolWriter
from linkpassd.core.model import AggregatorSettings
from test_agent import FakeAggregator, FakeHost, new_spool, stop, until
from test_spool import events

BASE_S, CAP_S = 0.01, 0.08  # waits: 0.01, 0.02, 0.04, 0.08, 0.08, ...


class Highest:
    """An rng whose uniform(a, b) is b: full jitter shows its bound."""

    def uniform(self, low: float, high: float) -> float:
        return high


async def serve_unix(servicer, path) -> grpc.aio.Server:
    server = grpc.aio.server()
    fleet_pb2_grpc.add_AgentServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    return server


def socket_paths(tmp_path, count: int) -> list[str]:
    paths = [str(tmp_path / f"agg{i}.sock") for i in range(count)]
    if len(paths[0].encode()) > 100:  # sun_path: 107 bytes
        pytest.skip(f"tmp_path too long for a Unix socket: {paths[0]}")
    return paths


def agent_for(paths, spool, *, rng=None, start_address=None) -> AgentClient:
    settings = AggregatorSettings(addresses=tuple(f"unix:{p}" for p in paths), insecure=True,
                                  host_id="gpu-017")
    return AgentClient(settings, spool, FakeHost(), boot_id="boot-a",
                       rng=rng or random.Random(7), backoff_base_s=BASE_S,
                       backoff_cap_s=CAP_S, start_address=start_address)


async def stop_all(tasks, servers) -> None:
    await stop(tasks)
    for server in servers:
        await server.stop(None)


def test_a_replica_that_goes_away_mid_stream_loses_nothing(tmp_path):
    """The first replica takes 300 events and acknowledges them, then takes
    200 more without storing or acknowledging them and is stopped: the agent
    moves to the second replica (one shared store) and sends those 200
    again; every event is stored once and the spool empties."""
    async def main():
        paths = socket_paths(tmp_path, 2)
        shared: dict[str, dict[int, object]] = {}  # the replicas' one store
        first, second = FakeAggregator(stored=shared), FakeAggregator(stored=shared)
        servers = [await serve_unix(first, paths[0]), await serve_unix(second, paths[1])]
        spool = new_spool(tmp_path)
        writer = SpoolWriter(spool)
        writer.opened = True
        agent = agent_for(paths, spool)
        writer.on_written = agent.wake
        tasks = [asyncio.create_task(writer.run()), asyncio.create_task(agent.run())]
        all_events = events(700)
        try:
            with capture_logs() as logs:
                writer.offer(all_events[:300])
                await until(lambda: len(shared.get("boot-a", {})) == 300, "300 on the first")
                await until(lambda: spool.pending == 0, "the first's acks")
                assert agent.connected and agent.address == f"unix:{paths[0]}"
                first.swallow = True
                writer.offer(all_events[300:500])
                await until(lambda: len(first.seqs) == 500, "200 taken, unacknowledged")
                assert spool.pending == 200 and len(shared["boot-a"]) == 300
                await servers[0].stop(None)  # the replica goes away mid-stream
                await until(lambda: len(shared["boot-a"]) == 500, "the 200 on the second")
                writer.offer(all_events[500:])  # and the stream goes on there
                await until(lambda: len(shared["boot-a"]) == 700, "all 700 stored")
                await until(lambda: spool.pending == 0, "the spool emptied")
        finally:
            await stop_all(tasks, servers)
            spool.close()
        assert sorted(shared["boot-a"]) == list(range(1, 701))  # none lost
        assert first.duplicates == second.duplicates == 0  # the Welcome said what was held
        assert second.seqs[:200] == list(range(301, 501))  # the unacknowledged, sent again
        assert len(first.hellos) == 1 and len(second.hellos) == 1
        assert agent.address == agent.last_worked == f"unix:{paths[1]}"
        moved = [e for e in logs if e["event"] == "aggregator_disconnected"]
        assert moved and moved[0]["address"] == f"unix:{paths[0]}"
        assert moved[0]["next"] == f"unix:{paths[1]}" and moved[0]["status"]
        connected = [e for e in logs if e["event"] == "aggregator_connected"]
        assert connected[-1]["address"] == f"unix:{paths[1]}"
        assert connected[-1]["previous"] == f"unix:{paths[0]}"
    asyncio.run(main())


def test_a_replica_nobody_answers_at_is_passed_over(tmp_path):
    """A connection that fails moves on too: the first address has no
    server, the second has; and a restarted agent starts with the replica
    that last worked (start_address), not the first."""
    async def main():
        paths = socket_paths(tmp_path, 2)
        live = FakeAggregator()
        server = await serve_unix(live, paths[1])
        spool = new_spool(tmp_path)
        spool.append(events(50))
        agent = agent_for(paths, spool)
        task = asyncio.create_task(agent.run())
        try:
            await until(lambda: len(live.stored.get("boot-a", {})) == 50, "events on the live one")
            assert agent.address == f"unix:{paths[1]}" and agent.delays  # one wait, then moved
            assert agent.last_failure is None and agent.sessions == 1
            await stop([task])
            again = agent_for(paths, spool, start_address=agent.last_worked)
            assert again.address == f"unix:{paths[1]}"
            task = asyncio.create_task(again.run())
            await until(lambda: len(live.hellos) == 2, "the restarted agent's stream")
            assert again.delays == []  # straight to the one that worked
        finally:
            await stop([task])
            await server.stop(None)
            spool.close()
    asyncio.run(main())


def test_an_aggregator_that_welcomes_then_hangs_up_is_retried_with_growing_backoff(tmp_path):
    """The Welcome alone does not reset the backoff: each stream ends at
    once, so the waits double (to the cap) instead of staying the first."""
    async def main():
        paths = socket_paths(tmp_path, 1)
        fake = FakeAggregator(mode="hangup")
        server = await serve_unix(fake, paths[0])
        agent = agent_for(paths, new_spool(tmp_path), rng=Highest())
        task = asyncio.create_task(agent.run())
        try:
            await until(lambda: len(agent.delays) >= 6, "six streams ended")
        finally:
            await stop_all([task], [server])
        assert agent.sessions >= 6  # every one of them got its Welcome
        assert agent.delays[:6] == [0.01, 0.02, 0.04, 0.08, 0.08, 0.08]
        assert agent.failures >= 6 and agent.attempts == agent.failures
    asyncio.run(main())


def test_one_full_pass_over_the_replicas_counts_as_one_attempt(tmp_path):
    async def main():
        paths = socket_paths(tmp_path, 2)
        fakes = [FakeAggregator(mode="hangup"), FakeAggregator(mode="hangup")]
        servers = [await serve_unix(f, p) for f, p in zip(fakes, paths)]
        agent = agent_for(paths, new_spool(tmp_path), rng=Highest())
        task = asyncio.create_task(agent.run())
        try:
            await until(lambda: len(agent.delays) >= 6, "six streams ended")
        finally:
            await stop_all([task], servers)
        assert agent.delays[:6] == [0.01, 0.01, 0.02, 0.02, 0.04, 0.04]
        assert len(fakes[0].hellos) >= 3 and len(fakes[1].hellos) >= 3  # round-robin
    asyncio.run(main())


def test_the_backoff_starts_again_only_after_a_healthy_stream(tmp_path):
    """Three hang-ups grow the wait; a stream that lives two heartbeats
    resets it, so the next loss waits the shortest again."""
    async def main():
        paths = socket_paths(tmp_path, 1)
        fake = FakeAggregator(mode="hangup")
        server = await serve_unix(fake, paths[0])
        agent = agent_for(paths, new_spool(tmp_path), rng=Highest())
        task = asyncio.create_task(agent.run())
        try:
            await until(lambda: len(agent.delays) >= 3, "three hang-ups")
            fake.mode = "normal"
            await until(lambda: agent.connected and agent.failures == 0,
                        "a healthy stream (two heartbeats)")
            waits = len(agent.delays)
            assert agent.delays[:3] == [0.01, 0.02, 0.04]
            fake.mode = "hangup"
            await fake.outgoing.put(None)  # the aggregator ends the healthy stream
            await until(lambda: len(agent.delays) >= waits + 2, "the loss and a hang-up")
        finally:
            await stop_all([task], [server])
        assert agent.delays[waits:waits + 2] == [0.01, 0.02]
    asyncio.run(main())


def test_a_reload_restarts_the_agent_on_the_replica_that_worked(tmp_path):
    """daemon.aggregator: a changed [aggregator] starts a new agent; it tries the
    replica the old one last streamed to first, not the list's first."""
    import dataclasses

    from test_agent import make_daemon

    async def main():
        paths = socket_paths(tmp_path, 2)
        live = FakeAggregator()
        server = await serve_unix(live, paths[1])  # nobody at paths[0]
        daemon = make_daemon(tmp_path)
        settings = AggregatorSettings(addresses=tuple(f"unix:{p}" for p in paths),
                                      insecure=True, host_id="gpu-017")
        daemon.config = dataclasses.replace(daemon.config, aggregator=settings)
        task = asyncio.create_task(daemon.aggregator.run())
        try:
            await until(lambda: daemon.aggregator.agent is not None and daemon.aggregator.agent.connected,
                        "the first agent on the live replica")
            first = daemon.aggregator.agent
            assert first.address == f"unix:{paths[1]}" and len(first.delays) == 1
            old = daemon.config
            daemon.config = dataclasses.replace(old, aggregator=dataclasses.replace(
                settings, spool_max_events=5000))
            daemon.aggregator.reloaded(old)
            await until(lambda: daemon.aggregator.agent not in (None, first) and daemon.aggregator.agent.connected,
                        "the restarted agent's stream")
            assert daemon.aggregator.agent.delays == [] and len(live.hellos) == 2
        finally:
            await stop([task])
            await server.stop(None)
            daemon.aggregator.close()
    asyncio.run(main())
