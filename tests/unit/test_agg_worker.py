"""The aggregator's worker process (aggregator.worker): big pure-Python jobs
run in another process, small ones here; a stop kills a job in flight; a
process that cannot run falls back to a thread. And a whole fleet
validation whose plan and localisation go through the worker process gives
the report the loop would have given."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from linkpassd.aggregator import worker as worker_mod
from linkpassd.aggregator.worker import OFF_LOOP_ABOVE_HOSTS, Worker, WorkerStopped


def pid_and(value: int) -> tuple[int, int]:
    return os.getpid(), value * 2


def sleep_then(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def test_small_jobs_run_here_and_big_ones_in_one_kept_worker_process() -> None:
    async def scenario() -> None:
        w = Worker("test")
        try:
            assert await w.run(OFF_LOOP_ABOVE_HOSTS, pid_and, 4) == (os.getpid(), 8)
            assert w.jobs == 0
            first = await w.run(OFF_LOOP_ABOVE_HOSTS + 1, pid_and, 5)
            second = await w.run(10_000, pid_and, 6)
            assert first[0] != os.getpid() and first == (first[0], 10)
            assert second == (first[0], 12)  # the same process, kept
            assert w.jobs == 2
        finally:
            w.close()
    asyncio.run(scenario())


def test_close_kills_a_job_in_flight_and_the_next_job_gets_a_new_process() -> None:
    async def scenario() -> None:
        w = Worker("test")
        try:
            slow = asyncio.ensure_future(w.run(10_000, sleep_then, 60.0))
            await asyncio.sleep(0)
            deadline = time.monotonic() + 30
            while not (getattr(w._pool, "_processes", None) or {}):  # wait for the process, not a time
                assert time.monotonic() < deadline, "the worker process never started"
                await asyncio.sleep(0.05)
            (process,) = w._pool._processes.values()
            started = time.monotonic()
            w.close()
            with pytest.raises(WorkerStopped):  # the job was stopped: not its result
                async with asyncio.timeout(30):
                    await slow
            assert time.monotonic() - started < 30
            # Wait for the state, bounded: the executor's own thread reaps the
            # child too, and a poll that loses that race says "alive" once.
            deadline = time.monotonic() + 30
            while process.is_alive():
                assert time.monotonic() < deadline, "the killed worker process still runs"
                await asyncio.sleep(0.05)
            assert (await w.run(10_000, pid_and, 1))[1] == 2
        finally:
            w.close()
    asyncio.run(scenario())


def test_a_worker_process_that_cannot_start_falls_back_to_a_thread(monkeypatch) -> None:
    def no_processes(*args, **kwargs):
        raise OSError("no processes left")

    monkeypatch.setattr(worker_mod, "ProcessPoolExecutor", no_processes)

    async def scenario() -> None:
        w = Worker("test")
        assert await w.run(10_000, pid_and, 3) == (os.getpid(), 6)  # done, in this process
    asyncio.run(scenario())


def test_a_validation_planned_and_localised_in_the_worker_process_reports_as_on_the_loop(
        tmp_path: Path, monkeypatch) -> None:
    """With the threshold at 0 every validation's plan and localisation go
    to the worker process: the hosts get their commands and the report has
    every host "ok" and no finding for healthy answers (the real localiser)."""
    from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
    from linkpassd._proto.linkpass.v1 import fleet_pb2_grpc as pb_grpc
    from test_agg_validation import DEADLINE_S, HOSTS, channel, connect_agents, insecure_settings, plan, run, serving

    monkeypatch.setattr(worker_mod, "OFF_LOOP_ABOVE_HOSTS", 0)

    async def scenario() -> None:
        async with serving(insecure_settings(tmp_path / "fleet.db")) as server:
            async with channel(server.port, None) as ch:
                agents = await connect_agents(server, ch, {h: "answer" for h in HOSTS})
                call = pb_grpc.FleetServiceStub(ch).Validate(
                    pb.ValidateRequest(plan=plan(), rails=["rail1"], duration_s=3), timeout=DEADLINE_S)
                report = [r async for r in call][-1].report
                assert [h.status for h in report.hosts] == ["ok"] * len(HOSTS)
                assert list(report.findings) == [] and 0 < report.loss_resolution < 0.05
                assert all(len(a.commands) == 1 and a.commands[0].validate.targets for a in agents.values())
                assert server.fleet.worker.jobs >= 2  # the plan and the localisation
                for agent in agents.values():
                    agent.stop()

    run(scenario())
