"""The aggregator's web page (aggregator/web.py): what the DOM says per cell,
escaping of everything hosts send, and the small HTTP server's bounds."""

from __future__ import annotations

import asyncio
import html.parser
from collections.abc import Awaitable, Callable

import pytest

from linkpassd._proto.linkpass.v1 import control_pb2 as cpb
from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd.aggregator import web

NOW = 1_800_000_000.0
DEADLINE_S = 30.0


def ts(unix: float):
    from google.protobuf import timestamp_pb2
    t = timestamp_pb2.Timestamp()
    t.FromNanoseconds(int(unix * 1e9))
    return t


def host(host_id: str, ports: dict[str, int], *, drained: tuple[str, ...] = (), connected: bool = True,
         rail_paths: dict[str, str] | None = None, evidence: str = "") -> pb.HostView:
    """ports: rail index -> verdict; rail i is port eth{i+1}."""
    rails = [pb.RailInventory(rail=f"rail{i}", port=f"eth{i + 1}", address=f"198.18.{i}.1/24") for i in ports]
    states = []
    for i, verdict in ports.items():
        state = cpb.PortState(port=f"eth{i + 1}", verdict=verdict, evidence=[evidence] if evidence else [])
        if f"eth{i + 1}" in drained:
            state.drain.CopyFrom(cpb.DrainInfo(reason="optic swap", by="alice", since=ts(NOW - 60)))
        states.append(state)
    return pb.HostView(host_id=host_id, connected=connected, last_seen=ts(NOW - 120), rails=rails,
                       report=pb.PortReport(ports=states, rail_paths=rail_paths or {}))


def event(i: int, host_id: str = "h1", message: str = "") -> pb.FleetEvent:
    return pb.FleetEvent(host_id=host_id, id=i, event=cpb.Event(
        seq=i, time=ts(NOW - 1000 + i), kind=cpb.EVENT_KIND_VERDICT, severity=cpb.SEVERITY_WARNING,
        port="eth1", rail="rail0", message=message or f"event number {i}"))


class Dom(html.parser.HTMLParser):
    """The attributes of every element, and the page's text, as a browser sees them."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data):
        self.text.append(data)

    def cells(self) -> dict[tuple[str, str], dict[str, str]]:
        return {(a["data-host"], a["data-rail"]): a for tag, a in self.elements
                if tag == "td" and "cell" in a.get("class", "").split()}

    def tags(self, name: str) -> list[dict[str, str]]:
        return [a for tag, a in self.elements if tag == name]


def page(hosts: list[pb.HostView], events: list[pb.FleetEvent] | None = None,
         summary: pb.GetSummaryResponse | None = None, insecure: bool = False) -> str:
    return web.render_page(pb.ListHostsResponse(hosts=hosts, served_at=ts(NOW)), events or [],
                           summary or pb.GetSummaryResponse(), insecure=insecure, now=NOW)


def test_each_cell_carries_host_rail_port_and_verdict_with_its_colour() -> None:
    hosts = [host("h1", {0: cpb.VERDICT_UP, 1: cpb.VERDICT_DEGRADED, 2: cpb.VERDICT_DOWN, 3: cpb.VERDICT_UNSPECIFIED}),
             host("h2", {0: cpb.VERDICT_DEGRADED}, drained=("eth1",), rail_paths={"rail0": "rail1"})]
    cells = Dom(page(hosts)).cells()
    want = {("h1", "rail0"): ("eth1", "UP", "v-up"), ("h1", "rail1"): ("eth2", "DEGRADED", "v-degraded"),
            ("h1", "rail2"): ("eth3", "DOWN", "v-down"), ("h1", "rail3"): ("eth4", "NONE", "v-none"),
            ("h2", "rail0"): ("eth1", "DEGRADED", "v-degraded"),
            ("h2", "rail1"): ("", "NONE", "v-none"), ("h2", "rail2"): ("", "NONE", "v-none"),
            ("h2", "rail3"): ("", "NONE", "v-none")}
    assert set(cells) == set(want)
    for key, (port, verdict, css) in want.items():
        attrs = cells[key]
        assert (attrs["data-port"], attrs["data-verdict"]) == (port, verdict), key
        assert css in attrs["class"].split(), (key, attrs["class"])
    drained = cells[("h2", "rail0")]
    assert drained["data-drained"] == "true" and "drained" in drained["class"].split()
    assert drained["data-path"] == "rail1"
    assert cells[("h1", "rail0")]["data-drained"] == "false"
    # The colours themselves: green, amber, red, grey, hatched for drained.
    style = "".join(Dom(page(hosts)).text)
    for rule in (".v-up{background:#a5d6a7}", ".v-degraded{background:#ffcc80}", ".v-down{background:#e57373",
                 ".v-none{background:#e0e0e0", ".drained{background-image:repeating-linear-gradient"):
        assert rule in style, rule


def test_rails_and_hosts_come_in_natural_order() -> None:
    hosts = [host("gpu-10", {10: cpb.VERDICT_UP, 2: cpb.VERDICT_UP}), host("gpu-9", {2: cpb.VERDICT_UP})]
    dom = Dom(page(hosts))
    assert [a["data-host"] for a in dom.tags("tr") if "data-host" in a] == ["gpu-9", "gpu-10"]
    assert [a["data-rail"] for a in dom.tags("td") if a.get("data-host") == "gpu-10"] == ["rail2", "rail10"]


def test_everything_a_host_sends_is_escaped() -> None:
    """A host named like markup, and an event whose message closes an
    attribute and opens a tag: the DOM must hold them as text, and no element
    the host wrote may appear."""
    evil_host = '<script>alert("x")</script>'
    evil_msg = '"><img src=x onerror=alert(1)>'
    hosts = [host(evil_host, {0: cpb.VERDICT_DOWN}, evidence=evil_msg)]
    text = page(hosts, [event(1, evil_host, evil_msg)])
    dom = Dom(text)
    assert not dom.tags("script") and not dom.tags("img")
    assert (evil_host, "rail0") in dom.cells()
    assert evil_host in "".join(dom.text) and evil_msg in "".join(dom.text)
    assert evil_msg in dom.cells()[(evil_host, "rail0")]["title"]
    assert "<script>" not in text and "<img" not in text


def test_refreshes_itself_and_has_no_script() -> None:
    dom = Dom(page([host("h1", {0: cpb.VERDICT_UP})]))
    assert {"http-equiv": "refresh", "content": "5"} in dom.tags("meta")
    assert not dom.tags("script")


def test_an_empty_fleet_says_so() -> None:
    dom = Dom(page([]))
    text = "".join(dom.text)
    assert dom.cells() == {}
    assert "No host has reported yet." in text and "No events stored yet." in text
    assert "0 hosts, 0 connected" in text


def test_insecure_mode_shows_a_loud_banner_and_secure_mode_none() -> None:
    assert [a for a in Dom(page([], insecure=True)).tags("div") if a.get("id") == "insecure-banner"]
    assert "INSECURE MODE" in page([], insecure=True)
    assert "INSECURE" not in page([], insecure=False)


def test_only_the_newest_50_events_are_shown_newest_first() -> None:
    dom = Dom(page([], [event(i) for i in range(1, 121)]))
    ids = [int(a["data-id"]) for a in dom.tags("tr") if "data-id" in a]
    assert ids == list(range(120, 70, -1))


def test_accounting_shows_failures_absorbed_outgoing_only_and_gpu_hours_per_day() -> None:
    summary = pb.GetSummaryResponse(
        days=[pb.DaySummary(day="2027-01-14", failures_absorbed=2, gpu_hours_saved=8.0),
              pb.DaySummary(day="2027-01-15", failures_absorbed=3, gpu_hours_saved=12.5,
                            failures_outgoing_only=4)],
        restart_cost_s=1800, ports_by_verdict={"UP": 10, "DOWN": 1})
    dom = Dom(page([], summary=summary))
    text = " ".join(dom.text)
    assert [a["data-day"] for a in dom.tags("tr") if "data-day" in a] == ["2027-01-15", "2027-01-14"]
    assert "5 failures absorbed" in text and "20.5 GPU-hours saved" in text and "30 min" in text
    assert "4 outgoing only" in text
    assert "DOWN 1, UP 10" in text
    # the page says what absorbed means: both directions, and what outgoing only leaves out
    assert "both directions recovered" in text and "announced through a healthy rail" in text
    assert "no GPU-hours are counted" in text
    headers = [t for t in dom.text if t in ("failures absorbed", "outgoing only", "GPU-hours saved")]
    assert headers == ["failures absorbed", "outgoing only", "GPU-hours saved"]


def test_an_offline_host_is_marked_and_its_cells_say_so() -> None:
    dom = Dom(page([host("h1", {0: cpb.VERDICT_UP}, connected=False)]))
    assert dom.cells()[("h1", "rail0")]["data-connected"] == "false"
    assert "(offline)" in "".join(dom.text)


def test_refused_and_offline_hosts_need_a_look() -> None:
    """Issue 28: refused and offline hosts were not under "Needs a look"."""
    from linkpassd.aggregator.identity import Refusal
    refusal = Refusal("gpu-<9>", "[CN=gpu-7, DNS:gpu-7, URI:linkpass://host/gpu-7]",
                      "Hello says host 'gpu-<9>' but the certificate [CN=gpu-7] names host 'gpu-7'",
                      "ipv4:198.18.0.9:41234", NOW - 30)
    text = web.render_page(pb.ListHostsResponse(hosts=[host("h1", {0: cpb.VERDICT_UP}),
                                                       host("h2", {0: cpb.VERDICT_UP}, connected=False)],
                                                served_at=ts(NOW)),
                           [], pb.GetSummaryResponse(), insecure=False, now=NOW, refused=[refusal])
    look = text.split("<h2>Needs a look</h2>")[1].split("<h2>")[0]
    dom = Dom(look)
    rows = {a["data-host"]: a["class"] for a in dom.tags("tr") if "data-host" in a}
    assert rows == {"gpu-<9>": "refused", "h2": "offline-host"}  # h1 is connected and UP
    words = " ".join(dom.text)
    assert "names host 'gpu-7'" in words and "30s ago" in words and "2m ago" in words
    assert "<9>" not in look  # escaped like everything a host sends
    quiet = page([host("h1", {0: cpb.VERDICT_UP})]).split("<h2>Needs a look</h2>")[1]
    assert 'id="not-reporting"' not in quiet


# --------------------------------------------------------------------------
# the server
# --------------------------------------------------------------------------


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), DEADLINE_S))


async def request(address: tuple[str, int], raw: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(raw)
        await writer.drain()
        data = await reader.read()  # the server closes after one response
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ")[1]), headers, body


async def page_ok() -> str:
    return page([host("h1", {0: cpb.VERDICT_DOWN})])


def test_server_serves_the_page_and_healthz_and_refuses_the_rest() -> None:
    async def scenario() -> None:
        server = await web.serve("127.0.0.1:0", page_ok)
        try:
            a = server.address
            status, headers, body = await request(a, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status == 200 and headers["Content-Type"].startswith("text/html")
            assert int(headers["Content-Length"]) == len(body)
            assert Dom(body.decode()).cells()[("h1", "rail0")]["data-verdict"] == "DOWN"
            status, _, body = await request(a, b"HEAD /?x=1 HTTP/1.1\r\n\r\n")
            assert (status, body) == (200, b"")
            assert (await request(a, b"GET /healthz HTTP/1.1\r\n\r\n"))[::2] == (200, b"ok\n")
            assert (await request(a, b"GET /etc/passwd HTTP/1.1\r\n\r\n"))[0] == 404
            status, headers, _ = await request(a, b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
            assert status == 405 and headers["Allow"] == "GET, HEAD"
            assert (await request(a, b"GARBAGE\r\n\r\n"))[0] == 400
            assert (await request(a, b"GET / HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n"))[0] == 431
            assert (await request(a, b"GET / HTTP/1.1\r\nX: " + b"a" * 40000))[0] == 431
        finally:
            await server.close()
    run(scenario)


def test_server_answers_500_when_the_page_fails_and_503_when_unhealthy() -> None:
    async def broken() -> str:
        raise RuntimeError("store is gone")

    async def unhealthy() -> tuple[bool, str]:
        return False, "store not open"

    async def scenario() -> None:
        server = await web.serve("127.0.0.1:0", broken, unhealthy)
        try:
            status, _, body = await request(server.address, b"GET / HTTP/1.1\r\n\r\n")
            assert status == 500 and b"store is gone" in body
            assert (await request(server.address, b"GET /healthz HTTP/1.1\r\n\r\n"))[::2] == (503, b"store not open\n")
            # Still serving after a failure.
            assert (await request(server.address, b"GET /x HTTP/1.1\r\n\r\n"))[0] == 404
        finally:
            await server.close()
    run(scenario)


def test_a_stalled_client_gets_408_and_does_not_hold_the_server(monkeypatch) -> None:
    monkeypatch.setattr(web, "READ_TIMEOUT_S", 3.0)
    monkeypatch.setattr(web, "MAX_CONNECTIONS", 1)

    async def scenario() -> None:
        server = await web.serve("127.0.0.1:0", page_ok)
        try:
            reader, writer = await asyncio.open_connection(*server.address)
            writer.write(b"GET / HTTP/1.1\r\n")  # never finishes its head
            await writer.drain()
            # The only slot is taken while it stalls: another client gets 503, not a hang.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while True:
                status = (await request(server.address, b"GET / HTTP/1.1\r\n\r\n"))[0]
                if status == 503 or loop.time() > deadline:
                    break
            assert status == 503
            stalled = await asyncio.wait_for(reader.read(), 10)
            assert stalled.startswith(b"HTTP/1.1 408 ")
            writer.close()
            assert (await request(server.address, b"GET / HTTP/1.1\r\n\r\n"))[0] == 200
        finally:
            await server.close()
    run(scenario)


@pytest.mark.parametrize("listen", ["9480", "localhost", "host:99999", ":80", "[not-v6]:80"])
def test_a_bad_listen_address_is_refused_by_name(listen: str) -> None:
    with pytest.raises(ValueError, match="web listen address"):
        web.parse_listen(listen)


def test_listen_addresses_parse() -> None:
    assert web.parse_listen("127.0.0.1:9480") == ("127.0.0.1", 9480)
    assert web.parse_listen("[::1]:0") == ("::1", 0)


def test_a_port_losing_one_way_says_which_way_in_its_cell_and_the_problems() -> None:
    """The hosts' PathState.direction (the receipts) reaches the page (issue 31)."""
    h = host("h1", {0: cpb.VERDICT_DEGRADED, 1: cpb.VERDICT_UP}, evidence="probe: degraded")
    h.report.paths.extend([
        pb.PathState(port="eth1", peer="198.18.0.7", state="up", loss=0.3, direction="requests"),
        pb.PathState(port="eth1", peer="198.18.0.9", state="down", direction="requests"),
        pb.PathState(port="eth1", peer="198.18.0.5", state="up", direction="none"),
        pb.PathState(port="eth2", peer="198.18.1.7", state="up", loss=0.2, direction="replies"),
        pb.PathState(port="eth2", peer="198.18.1.9", state="up", loss=0.1, direction="requests")])
    dom = Dom(page([h]))
    cells = dom.cells()
    assert "loss towards 198.18.0.7, 198.18.0.9" in cells[("h1", "rail0")]["title"]
    assert "which way differs by peer: 198.18.1.7 replies, 198.18.1.9 requests" \
        in cells[("h1", "rail1")]["title"]
    assert "probe: degraded; loss towards 198.18.0.7, 198.18.0.9" in "".join(dom.text)
