"""10,000 events from several agents, the aggregator SIGKILLed mid-stream and
restarted: every event is stored exactly once, in order per host.

Real pieces on both sides: the agents are linkpassd's own agent (its on-disk
spool and its gRPC client, as the daemon runs them), the aggregator is the
`linkpass-aggregator` program on a SQLite file, reached over a Unix socket.
Only the daemons are left out: the events are offered to each agent's spool
hand-off the way the daemon's event flush offers them.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from linkpassd._proto.linkpass.v1 import fleet_pb2
from linkpassd.agent.client import AgentClient
from linkpassd.agent.spool import Spool, SpoolWriter
from linkpassd.core.events import Event, EventKind, Severity
from linkpassd.core.model import AggregatorSettings

AGENTS = 4
EVENTS_PER_AGENT = 2_500
CHUNK = 25  # events per offer, as one reconcile pass would hand over
KILL_AFTER_STORED = 3_000  # SIGKILL once the aggregator holds about this many
DEADLINE_S = 180.0  # everything stored; generous for a busy 2-core machine


class Host:
    """What an agent asks of its daemon; nothing here is under test."""

    def __init__(self, name: str) -> None:
        self.name = name

    def inventory(self) -> fleet_pb2.Inventory:
        return fleet_pb2.Inventory(rails=[fleet_pb2.RailInventory(rail="rail0", port="eth0")])

    def port_report(self) -> fleet_pb2.PortReport:
        return fleet_pb2.PortReport(rail_paths={"rail0": "rail0"})

    def take_peers(self, message) -> None:
        pass

    async def command(self, command) -> tuple[int, str]:
        return 0, "ok"


class Aggregator:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.socket = workdir / "agg.sock"
        self.address = f"unix:{self.socket}"
        self.database = workdir / "fleet.db"
        self.config = workdir / "aggregator.toml"
        self.config.write_text(f'[aggregator]\nlisten = "{self.address}"\n'
                               f'database = "{self.database}"\nheartbeat_s = 1\n'
                               '[tls]\ninsecure = true\n[web]\nlisten = ""\n')
        self.log = workdir / "aggregator.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "linkpassd.aggregator.main",
                                          "--config", str(self.config)],
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                assert self.proc.poll() is None, self.log.read_text()[-2000:]
                try:
                    if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == \
                            health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                assert time.monotonic() < deadline, "aggregator not serving in 30 s"
                time.sleep(0.05)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def stored(self) -> int:
        """Events in the database, read beside the running aggregator (WAL)."""
        try:
            with sqlite3.connect(f"file:{self.database}?mode=ro", uri=True, timeout=5) as db:
                return db.execute("SELECT count(*) FROM events").fetchone()[0]
        except sqlite3.Error:
            return 0


def event(boot: str, seq: int) -> Event:
    now = time.time()
    return Event(boot_id=boot, seq=seq, wall=now, mono=time.monotonic(), kind=EventKind.SIGNAL,
                 severity=Severity.INFO, name="echo_path", port="eth0", rail="rail0",
                 message=f"event {seq}", fields=(("n", str(seq)),))


async def run_fleet(tmp_path: Path, agg: Aggregator) -> dict[str, tuple[str, Spool]]:
    agents, writers, tasks, spools = [], [], [], {}
    for i in range(AGENTS):
        name = f"lp-host-{i}"
        spool = Spool(str(tmp_path / name / "spool"), 100_000)
        writer = SpoolWriter(spool)
        boot = f"boot-{i}"
        settings = AggregatorSettings(address=agg.address, insecure=True, host_id=name)
        client = AgentClient(settings, spool, Host(name), boot_id=boot, rng=random.Random(i),
                             backoff_base_s=0.05, backoff_cap_s=1.0)
        writer.on_written = client.wake
        tasks += [asyncio.create_task(writer.run()), asyncio.create_task(client.run())]
        agents.append((name, boot, writer))
        spools[name] = (boot, spool)
    killed = False
    try:
        for start in range(1, EVENTS_PER_AGENT + 1, CHUNK):
            for _name, boot, writer in agents:
                writer.offer([event(boot, s)
                              for s in range(start, min(start + CHUNK, EVENTS_PER_AGENT + 1))])
            await asyncio.sleep(0.002)
            if not killed and await asyncio.to_thread(agg.stored) >= KILL_AFTER_STORED:
                agg.kill()  # mid-stream: batches in flight, some stored and not acked
                killed = True
                await asyncio.sleep(0.5)  # the agents find it gone and keep spooling
                await asyncio.to_thread(agg.start)
        assert killed, "the aggregator was never killed: the stream ended before the threshold"
        deadline = time.monotonic() + DEADLINE_S
        while any(spool.acked.get(boot, 0) < EVENTS_PER_AGENT for boot, spool in spools.values()):
            assert time.monotonic() < deadline, \
                {name: spool.acked for name, (boot, spool) in spools.items()}
            await asyncio.sleep(0.1)
    finally:
        for task in tasks:
            task.cancel()
        done, stuck = await asyncio.wait(tasks, timeout=30)
        for task in done:
            if not task.cancelled():
                task.exception()  # retrieved: an error on the way out is not the point
    # bounded, and named: an agent that swallowed its cancellation must fail
    # the test here rather than hang it
    assert not stuck, f"tasks ignored their cancellation: {[t.get_coro() for t in stuck]}"
    return spools


def test_every_event_is_stored_exactly_once_in_order_across_a_sigkill(tmp_path):
    agg = Aggregator(tmp_path)
    agg.start()
    try:
        spools = asyncio.run(run_fleet(tmp_path, agg))
    finally:
        agg.stop()
    with sqlite3.connect(agg.database) as db:
        for name, (boot, _spool) in spools.items():
            seqs = [row[0] for row in db.execute(
                "SELECT seq FROM events WHERE host_id = ? AND boot_id = ? ORDER BY id",
                (name, boot))]
            assert len(seqs) == EVENTS_PER_AGENT, (name, len(seqs))
            assert seqs == list(range(1, EVENTS_PER_AGENT + 1)), f"{name}: out of order or a gap"
        total = db.execute("SELECT count(*) FROM events").fetchone()[0]
    assert total == AGENTS * EVENTS_PER_AGENT
