"""What a host says about its link to the fleet (issue 28: a host whose
host_id did not match its certificate showed nothing wrong in `status`).
A real aggregator with real certificates; the agent as the daemon runs it."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from pathlib import Path

import pytest

from agg_tls import make_pki, serving, tls_settings
from corefixtures import rails_config
from linkpassd.adapters import control_convert
from linkpassd.agent.client import AgentClient
from linkpassd.agent.spool import SpoolWriter
from linkpassd.core.events import EventKind
from linkpassd.core.model import AggregatorSettings
from linkpassd.ctl.render import render_status
from linkpassd.daemon.loop import Daemon

DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("agent-status"))


def daemon_reporting_as(tmp_path: Path, pki: Path, host_id: str, port: int) -> Daemon:
    settings = AggregatorSettings(addresses=(f"127.0.0.1:{port}",), host_id=host_id,
                                  ca=str(pki / "ca.pem"), cert=str(pki / "h1.pem"),
                                  key=str(pki / "h1-key.pem"))
    config = dataclasses.replace(rails_config(2), state_dir=str(tmp_path / "state"),
                                 aggregator=settings)
    daemon = Daemon(config)
    daemon.aggregator.open_spool()
    daemon.aggregator.spool.open()
    daemon.aggregator.agent = AgentClient(settings, daemon.aggregator.spool, daemon.aggregator.host, boot_id="boot-a",
                               rng=random.Random(7), backoff_base_s=0.05, backoff_cap_s=0.2)
    return daemon


async def until(predicate, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def status_text(daemon: Daemon) -> str:
    return render_status(control_convert.status_to_proto(daemon.report.status(), served_at=time.time()))


def test_a_host_the_aggregator_refuses_says_so_and_why(pki: Path, tmp_path: Path) -> None:
    async def scenario() -> str:
        async with serving(tls_settings(pki, tmp_path / "fleet.db")) as server:
            daemon = daemon_reporting_as(tmp_path, pki, "h9", server.port)  # the cert names h1
            task = asyncio.create_task(daemon.aggregator.agent.run())
            try:
                await until(lambda: daemon.aggregator.agent.last_failure is not None, "the refusal")
                link = daemon.aggregator.status()
                assert link.refused and not link.connected
                assert link.last_status == "PERMISSION_DENIED" and "'h9'" in link.last_error
                assert link.last_failure_at > 0 and link.host_id == "h9"
                return status_text(daemon)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                daemon.aggregator.spool.close()

    text = asyncio.run(scenario())
    line = next(line for line in text.splitlines() if line.startswith("aggregator"))
    assert "REFUSED by 127.0.0.1:" in line and "as host h9" in line and "PERMISSION_DENIED" in line
    assert "until its certificate or host_id is fixed" in line


def test_a_host_the_aggregator_takes_shows_connected_spool_and_last_ack(pki: Path, tmp_path: Path) -> None:
    async def scenario() -> str:
        async with serving(tls_settings(pki, tmp_path / "fleet.db")) as server:
            daemon = daemon_reporting_as(tmp_path, pki, "h1", server.port)
            writer = SpoolWriter(daemon.aggregator.spool)
            daemon.aggregator.spool_writer = writer
            writer.on_written = daemon.aggregator.agent.wake
            writer_task = asyncio.create_task(writer.run())
            task = asyncio.create_task(daemon.aggregator.agent.run())
            try:
                await until(lambda: daemon.aggregator.agent.connected, "the Welcome")
                for i in range(3):
                    daemon.recorder.emit(EventKind.RELOAD, "test_event", message=f"event {i}")
                daemon.recorder.flush()
                await until(lambda: daemon.aggregator.agent.events_acked >= 3, "the acks")
                await until(lambda: daemon.aggregator.spool.counts[0] == 0, "the spool to drain")
                link = daemon.aggregator.status()
                assert link.connected and not link.refused and link.last_status == ""
                assert link.events_sent >= 3 and link.events_acked >= 3 and link.last_ack_at > 0
                return status_text(daemon)
            finally:
                task.cancel()
                writer_task.cancel()
                await asyncio.gather(task, writer_task, return_exceptions=True)
                daemon.aggregator.spool.close()

    text = asyncio.run(scenario())
    rows = {line.split("  ")[0]: line for line in text.splitlines()}
    assert "connected to 127.0.0.1:" in rows["aggregator"] and "as host h1" in rows["aggregator"]
    assert "0 events waiting" in rows["spool"]
    assert "ago)" in rows["last ack"]
