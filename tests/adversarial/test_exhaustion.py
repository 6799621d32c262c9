"""Issue 30, items 3, 4 and 9 (the per-identity watcher cap): resource
exhaustion of every listening endpoint, each bounded in time. While each
flood runs, an honest agent's events are still acked within 1 s."""

from __future__ import annotations

import asyncio
import resource
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd._proto.linkpass.v1 import fleet_pb2_grpc as pb_grpc
from linkpassd.adapters.metrics import Metrics
from linkpassd.aggregator import fleet_api
from linkpassd.aggregator.metrics import AggregatorMetrics
from tests.adversarial.aggclient import RawAgent, event, run
from tests.unit.agg_tls import channel, make_pki, serving, tls_settings

FLOOD = 200
READ_TIMEOUT_S = 5.0  # adapters/READ_TIMEOUT_S
MAX_CONNECTIONS = 16  # adapters/MAX_CONNECTIONS  # idle connections: far past every cap, far below this machine's limit


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("adv-pki"))


def _scrape(port: int, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _endpoints():
    agg = AggregatorMetrics()
    yield "aggregator", lambda: agg.serve("127.0.0.1:0"), lambda s: (s[0].shutdown(), s[0].server_close())
    daemon = Metrics(lambda: (_ for _ in ()).throw(RuntimeError("no daemon in this test")))
    yield "linkpassd", lambda: daemon.serve("127.0.0.1:0"), lambda s: daemon.close()


@pytest.mark.parametrize("name", ["aggregator", "linkpassd"])
def test_idle_connections_cannot_exhaust_a_metrics_endpoint(name: str) -> None:
    """Item 4: prometheus_client's server started a thread per connection with
    no cap and no read timeout; a local user held connections open until
    linkpassd ran out of descriptors."""
    start, stop = {n: (a, b) for n, a, b in _endpoints()}[name]
    threads_before = threading.active_count()
    served = start()
    port = served[1] if isinstance(served[1], int) else served[0].server_address[1]
    socks: list[socket.socket] = []
    try:
        t0 = time.monotonic()
        for _ in range(FLOOD):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.5)
        assert time.monotonic() - t0 < READ_TIMEOUT_S - 1, "the flood took too long to test the cap"
        threads = threading.active_count() - threads_before
        # a handler thread and its deadline timer per admitted connection, the serving thread
        assert threads <= 2 * MAX_CONNECTIONS + 2, f"{threads} threads for {FLOOD} idle connections"
        status, _ = _scrape(port)
        assert status == 503  # refused at once while the slots are held, not hung
        deadline = time.monotonic() + READ_TIMEOUT_S + 10
        while True:  # the idle ones time out; a scrape gets through again
            status, body = _scrape(port)
            if status == 200:
                break
            assert time.monotonic() < deadline, "the idle connections were never timed out"
            time.sleep(0.5)
    finally:
        for s in socks:
            s.close()
        stop(served)


def test_the_caps_here_are_the_endpoints_caps() -> None:
    from linkpassd.adapters import metrics_http
    assert (metrics_http.READ_TIMEOUT_S, metrics_http.MAX_CONNECTIONS) == (READ_TIMEOUT_S, MAX_CONNECTIONS)


def test_a_client_trickling_its_request_is_cut_off() -> None:
    from linkpassd.adapters import metrics_http

    agg = AggregatorMetrics()
    server, _thread = metrics_http.serve("127.0.0.1", 0, agg.registry, deadline_s=2.0)
    try:
        s = socket.create_connection(server.server_address, timeout=10)
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        t0 = time.monotonic()
        closed = False
        while time.monotonic() - t0 < 8:
            try:
                s.sendall(b"X-A: b\r\n")
            except OSError:
                closed = True
                break
            s.settimeout(1.0)
            try:
                if s.recv(1024) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
        assert closed and time.monotonic() - t0 < 6
    finally:
        server.shutdown()
        server.server_close()


def test_fd_limit_is_raised_to_the_hard_limit() -> None:
    """Item 3: neither daemon raised its soft open-file limit (1,024 by default)."""
    code = ("import resource, sys; sys.path.insert(0, '.');"
            "from linkpassd.adapters import fdlimit;"
            "l = fdlimit.raise_nofile(3000); print(l.before, l.soft, l.hard, l.enough)")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"this machine's hard open-file limit is {hard}")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (512, 4096)))
    assert out.stdout.split() == ["512", "4096", "4096", "True"]


def test_the_aggregator_refuses_to_start_below_what_its_hosts_need(tmp_path: Path) -> None:
    """Item 3: at a limit of 1,024 the aggregator served on, and 1,100 idle
    connections locked real agents out with nothing logged."""
    config = tmp_path / "agg.toml"
    config.write_text(f'[aggregator]\nlisten = "127.0.0.1:0"\ndatabase = "{tmp_path / "f.db"}"\n'
                      'max_hosts = 2048\n[tls]\ninsecure = true\n[web]\nlisten = ""\n')
    try:
        out = subprocess.run([sys.executable, "-m", "linkpassd.aggregator.main", "--config", str(config)],
                             capture_output=True, text=True, timeout=20,
                             preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024)))
    except subprocess.TimeoutExpired:
        pytest.fail("the aggregator started at an open-file limit of 1,024 with max_hosts 2,048")
    assert out.returncode == 1
    assert "fd_limit_too_low" in out.stdout + out.stderr and "LimitNOFILE" in out.stdout + out.stderr


def test_fd_limit_describes_what_is_missing() -> None:
    from linkpassd.adapters import fdlimit

    limit = fdlimit.FdLimit(before=1024, soft=1024, hard=1024, needed=2368)
    assert not limit.enough and "at least 2368" in limit.describe()


async def _honest_agent_acked_within(ch: grpc.aio.Channel, host: str, seconds: float) -> float:
    agent = RawAgent(ch)
    await agent.connect(host)
    worst = 0.0
    for seq in range(1, 6):
        t0 = time.perf_counter()
        await agent.send(pb.ConnectRequest(events=pb.EventBatch(boot_id="boot-a", events=[event("boot-a", seq)])))
        ack = (await agent.read_kind("ack")).ack
        took = time.perf_counter() - t0
        assert ack.seq == seq
        worst = max(worst, took)
    agent.call.cancel()
    assert worst < seconds, f"an honest agent's ack took {worst:.3f} s"
    return worst


def test_idle_unauthenticated_connections_are_closed_and_agents_still_acked(pki: Path, tmp_path: Path) -> None:
    """Item 3: idle TCP connections (no TLS) to the aggregator's port were
    kept for grpc's default handshake timeout (120 s) and piled up to the
    open-file limit; now they are closed after 10 s."""
    handshake_timeout_s = 10.0  # server.HANDSHAKE_TIMEOUT_MS

    async def scenario() -> None:
        async with serving(tls_settings(pki, tmp_path / "fleet.db")) as server:
            socks = []
            for _ in range(FLOOD):
                s = socket.create_connection(("127.0.0.1", server.port))
                s.setblocking(False)
                socks.append(s)
            try:
                async with channel(server.port, pki, "h1") as ch:
                    await _honest_agent_acked_within(ch, "h1", 1.0)
                deadline = time.monotonic() + handshake_timeout_s + 10
                while True:
                    closed = 0
                    for s in socks:
                        try:
                            closed += s.recv(1) == b""
                        except BlockingIOError:
                            pass
                        except OSError:
                            closed += 1
                    if closed == len(socks):
                        break
                    assert time.monotonic() < deadline, f"{len(socks) - closed} idle connections still open"
                    await asyncio.sleep(0.5)
            finally:
                for s in socks:
                    s.close()

    run(scenario())


def test_watch_streams_are_capped_per_identity(pki: Path, tmp_path: Path) -> None:
    """Item 9: 2,000 WatchFleetEvents streams on one host certificate pinned
    the aggregator's CPU; one identity now holds at most 16, others are
    unaffected, and an honest agent is still acked within 1 s."""
    cap = fleet_api.MAX_WATCHERS_PER_IDENTITY

    async def scenario() -> None:
        async with serving(tls_settings(pki, tmp_path / "fleet.db")) as server:
            async with channel(server.port, pki, "h2") as greedy, channel(server.port, pki, "alice") as op, \
                    channel(server.port, pki, "h1") as agent_ch:
                stub = pb_grpc.FleetServiceStub(greedy)
                calls = [stub.WatchFleetEvents(pb.WatchFleetEventsRequest()) for _ in range(cap)]
                async with asyncio.timeout(20):
                    while sum(server.fleet_api.watchers.values()) < cap:
                        await asyncio.sleep(0.05)
                extra = stub.WatchFleetEvents(pb.WatchFleetEventsRequest())
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await asyncio.wait_for(extra.read(), 20)
                assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "host h2" in err.value.details() and str(cap) in err.value.details()
                mine = pb_grpc.FleetServiceStub(op).WatchFleetEvents(pb.WatchFleetEventsRequest())
                await _honest_agent_acked_within(agent_ch, "h1", 1.0)
                got = await asyncio.wait_for(mine.read(), 20)  # alice's watch sees h1's events
                assert got.event.event.seq == 1 and got.event.host_id == "h1"
                for c in calls:
                    assert (await asyncio.wait_for(c.read(), 20)).event.host_id == "h1"
                    c.cancel()
                mine.cancel()
            async with asyncio.timeout(20):  # closed streams give their slots back
                while server.fleet_api.watchers:
                    await asyncio.sleep(0.05)

    run(scenario())


def test_linkpassd_warns_and_shows_a_problem_below_its_need() -> None:
    """Item 3, the host side: linkpassd keeps protecting the host at a low
    limit, but says so in the log and in `status`."""
    code = ("import sys, time, types; sys.path.insert(0, '.');"
            "from linkpassd.daemon.cli import check_fd_limit, fds_needed;"
            "from linkpassd.daemon.statefiles import StateFiles;"
            "d = StateFiles(lambda: None, time.time);"
            "c = types.SimpleNamespace(metrics_listen='', rails=[None] * 100);"
            "check_fd_limit(d, c); p = d.problems['open-file limit'];"
            "print(p.kind, '|', p.detail)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (512, 1024)))
    assert out.returncode == 0, out.stderr
    assert "\nfd_limit | open-file limit 1024 (raised from 512)" in out.stdout
    assert "fd_limit_too_low" in out.stdout + out.stderr
