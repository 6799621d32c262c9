"""Issue 30, items 1, 2 and 8: what one host certificate can send the
aggregator. Each case ends the sender's stream with a status that names the
bad field (never OK, so a real agent does not resend it for ever), and the
fleet view stays readable for everyone else."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc

from linkpassd._proto.linkpass.v1 import control_pb2 as cpb
from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd._proto.linkpass.v1 import fleet_pb2_grpc as pb_grpc
from linkpassd.aggregator import server as agg_server
from linkpassd.aggregator.store import EventQuery
from tests.adversarial.aggclient import RawAgent, event, insecure_settings, run, serving

HUGE_SEQ = 2**63 - 1


async def _refused(port: int, *messages: pb.ConnectRequest | bytes, host: str = "h1",
                   boot: str = "boot-a") -> tuple[grpc.StatusCode, str]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        agent = RawAgent(ch)
        await agent.connect(host, boot)
        for m in messages:
            await agent.send(m)
        return await agent.outcome()


def _batch(boot: str, *events: cpb.Event, **kw) -> pb.ConnectRequest:
    return pb.ConnectRequest(events=pb.EventBatch(boot_id=boot, events=list(events), **kw))


def test_a_huge_seq_in_two_boots_is_refused_and_the_fleet_view_stays_readable(tmp_path: Path) -> None:
    """Item 1: seq 2**63-1 in each of two boots made each boot count ~2**63
    lost events, and SQLite's SUM() over them overflowed: ListHosts and
    GetSummary failed for everyone, persistently."""
    async def scenario() -> None:
        async with serving(insecure_settings(tmp_path / "fleet.db")) as server:
            for boot in ("boot-a", "boot-b"):
                code, details = await _refused(server.port, _batch(boot, event(boot, HUGE_SEQ)), boot=boot)
                assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
                assert "seq" in details and str(HUGE_SEQ) in details
            code, details = await _refused(
                server.port, _batch("boot-c", event("boot-c", 1), gap_first=2, gap_last=HUGE_SEQ), boot="boot-c")
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "gap_last" in details, (code, details)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
                fleet = pb_grpc.FleetServiceStub(ch)
                hosts = await fleet.ListHosts(pb.ListHostsRequest(), timeout=20)
                assert [h.host_id for h in hosts.hosts] == ["h1"]
                await fleet.GetSummary(pb.GetSummaryRequest(), timeout=20)

    run(scenario())


def test_lost_counts_past_int64_sum_without_overflow(tmp_path: Path) -> None:
    """Item 1 at the store: whatever got in before the bound (or a jump
    inside it, boot after boot) sums without overflow, clamped."""
    from linkpassd.aggregator.sqlite_store import SqliteStore
    from linkpassd.aggregator.store import EventRow

    async def scenario() -> None:
        store = SqliteStore(str(tmp_path / "fleet.db"))
        await store.open()
        try:
            for n in range(3):  # written directly, as an older release would have let in
                def put(conn, n=n) -> None:
                    conn.execute("INSERT INTO hosts (host_id, boot_id, first_seen, last_seen) VALUES "
                                 "('h1', ?, 0, 0) ON CONFLICT DO NOTHING", (f"b{n}",))
                    conn.execute("INSERT INTO boots (host_id, boot_id, last_seq, lost) VALUES ('h1', ?, ?, ?)",
                                 (f"b{n}", HUGE_SEQ, HUGE_SEQ))
                await store._run(lambda conn, put=put: store._write(conn, lambda: put(conn)))
            await store.add_events("h1", "b9", [EventRow(1, time.time(), "verdict", "info", "eth1", "rail0",
                                                         b"", 0)], None, time.time())
            rows = await store.hosts()
            assert rows[0].events_lost == HUGE_SEQ
        finally:
            await store.close()

    run(scenario())


def test_an_out_of_range_event_time_is_refused_naming_it(tmp_path: Path) -> None:
    """Item 8: an Event.time outside the Timestamp range ended the stream as
    OK with no ack; the agent resent it for ever."""
    async def scenario() -> None:
        async with serving(insecure_settings(tmp_path / "fleet.db")) as server:
            bad = event("boot-a", 1)
            bad.time.seconds = 2**62
            code, details = await _refused(server.port, _batch("boot-a", bad))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
            assert "time" in details and "seq 1" in details
            assert await server.fleet.store.events(EventQuery()) == []

    run(scenario())


def test_garbage_after_hello_is_refused_with_a_reason(tmp_path: Path) -> None:
    """Item 8: bytes that are not a ConnectRequest, after a good Hello, ended
    the stream as OK (logged at info as if the agent had gone away)."""
    async def scenario() -> None:
        async with serving(insecure_settings(tmp_path / "fleet.db")) as server:
            code, details = await _refused(server.port, b"\xff\xff\xff\xff\x0f garbage")
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
            assert "ConnectRequest" in details

    run(scenario())


def _report(rails: int, paths: int = 0, ports: int = 1) -> pb.ConnectRequest:
    return pb.ConnectRequest(ports=pb.PortReport(
        ports=[cpb.PortState(port=f"eth{i}", verdict=cpb.VERDICT_UP) for i in range(ports)],
        paths=[pb.PathState(port="eth0", peer=f"198.18.{i // 250}.{i % 250 + 1}", state="up")
               for i in range(paths)],
        rail_paths={f"r{i}": "rail0" for i in range(rails)}))


def test_an_oversized_port_report_is_refused_naming_the_field(tmp_path: Path) -> None:
    """Item 2: PortReport.rail_paths had no bound, and every entry became a
    column of the page for every host (150,000 entries stalled the loop 46 s)."""
    async def scenario() -> None:
        async with serving(insecure_settings(tmp_path / "fleet.db")) as server:
            code, details = await _refused(server.port, _report(rails=20_000))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
            assert "rail_paths" in details
            code, details = await _refused(server.port, _report(rails=1, ports=5000))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "ports" in details, (code, details)
            code, details = await _refused(server.port, _report(rails=1, paths=agg_server.MAX_PATHS + 1))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "paths" in details, (code, details)
            rows = await server.fleet.store.hosts()
            assert all(not r.report for r in rows)

    run(scenario())


def test_an_oversized_event_field_is_refused_naming_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(insecure_settings(tmp_path / "fleet.db")) as server:
            code, details = await _refused(server.port, _batch("boot-a", event("boot-a", 1, port="e" * 5000)))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "port" in details, (code, details)

    run(scenario())


def test_the_page_is_rendered_off_the_event_loop(tmp_path: Path) -> None:
    """Item 2: the page was rendered on the loop, so a big fleet view held
    every host's acks; now it is built in a thread and the loop keeps ticking."""
    from linkpassd.aggregator import main as agg_main
    from linkpassd.aggregator import web

    async def scenario() -> None:
        settings = insecure_settings(tmp_path / "fleet.db", web_listen="127.0.0.1:0")
        async with serving(settings) as server:
            loop_thread = []
            real = web.render_page

            def spy(*a, **kw):
                import threading
                loop_thread.append(threading.current_thread() is threading.main_thread())
                return real(*a, **kw)

            web.render_page = spy
            try:
                page_server = await agg_main._start_web(settings, server, server.fleet.store)
                try:
                    host, port = page_server.address
                    reader, writer = await asyncio.open_connection(host, port)
                    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                    body = await asyncio.wait_for(reader.read(), 20)
                    writer.close()
                    assert body.startswith(b"HTTP/1.1 200"), body[:200]
                finally:
                    await page_server.close()
            finally:
                web.render_page = real
            assert loop_thread == [False]

    run(scenario())


def test_postgresql_lost_counts_past_int64_sum_without_overflow(pg_databases) -> None:
    """Item 1 on the shared store: SUM(lost)::BIGINT overflowed the cast."""
    import asyncpg

    from linkpassd.aggregator.pg_store import PgStore

    async def scenario() -> None:
        dsn = pg_databases()
        store = PgStore(dsn)
        await store.open()
        try:
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute("INSERT INTO hosts (host_id, boot_id, first_seen, last_seen) "
                                   "VALUES ('h1', 'b0', 0, 0)")
                for n in range(3):
                    await conn.execute("INSERT INTO boots (host_id, boot_id, last_seq, lost) VALUES ('h1', $1, $2, $2)",
                                       f"b{n}", HUGE_SEQ)
            finally:
                await conn.close()
            rows = await store.hosts()
            assert rows[0].events_lost == HUGE_SEQ
        finally:
            await store.close()

    run(scenario())


def test_the_grid_has_a_bounded_number_of_columns() -> None:
    """Item 2: every rail any host named became a column for every host."""
    from linkpassd.fleet import grid

    hosts = pb.ListHostsResponse(hosts=[
        pb.HostView(host_id="good", rails=[pb.RailInventory(rail=f"rail{i}", port=f"eth{i}") for i in range(8)]),
        pb.HostView(host_id="good2", rails=[pb.RailInventory(rail=f"rail{i}", port=f"eth{i}") for i in range(8)]),
        pb.HostView(host_id="evil", report=pb.PortReport(rail_paths={f"x{i}": "none" for i in range(5000)}))])
    g = grid.build(hosts)
    assert len(g.rails) == grid.MAX_COLUMNS and g.hidden_rails == 5008 - grid.MAX_COLUMNS
    assert all(f"rail{i}" in g.rails for i in range(8))  # the rails most hosts have stay
