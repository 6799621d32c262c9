"""The aggregator's read-only web page, and the small HTTP server for it.

`render_page` is pure: protos in, one HTML document out (server-rendered,
inline CSS, no script, refreshing itself every 5 s), so it is tested without
a socket. Every piece of text hosts sent (names, ports, messages, evidence) is
HTML-escaped: a host is not trusted to write into an operator's browser.

`serve` is a deliberately small HTTP/1.1 server on asyncio streams (GET and
HEAD of `/` and `/healthz`, one request per connection): aiohttp would be one
more dependency for two read-only routes. It is bounded so a client cannot
hold it: request head <= 8 KiB, 10 s to send it, at most 64 connections at
once (then 503), and it never reads a body.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import ipaddress
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import structlog

from linkpassd._proto.linkpass.v1 import control_pb2 as cpb
from linkpassd._proto.linkpass.v1 import fleet_pb2
from linkpassd.aggregator.identity import Refusal
from linkpassd.aggregator.savings import INCOMING_WITHIN_S
from linkpassd.fleet import grid

log = structlog.get_logger("linkpassd.aggregator.web")

REFRESH_S = 5
EVENTS_SHOWN = 50
PROBLEMS_SHOWN = 200

# What a cell says, and its class (colour) in the style sheet below.
CELL_TEXT = {"UP": "UP", "DEGRADED": "DEG", "DOWN": "DOWN", grid.NO_REPORT: "–"}

STYLE = """
body{font-family:system-ui,sans-serif;margin:1em;color:#222;background:#fafafa}
h1{font-size:1.3em;margin:.2em 0}h2{font-size:1.1em;margin:1.2em 0 .4em}
.insecure{background:#b71c1c;color:#fff;font-weight:bold;padding:.6em 1em;font-size:1.1em;margin-bottom:.6em}
.meta{color:#555;font-size:.9em}
table{border-collapse:collapse;font-size:.85em}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:left;white-space:nowrap}
td.cell{text-align:center;min-width:3.5em;font-weight:600}
.v-up{background:#a5d6a7}.v-degraded{background:#ffcc80}.v-down{background:#e57373;color:#fff}
.v-none{background:#e0e0e0;color:#777}
.drained{background-image:repeating-linear-gradient(45deg,rgba(0,0,0,.18) 0 4px,transparent 4px 8px)}
.fenced{outline:3px dashed #222;outline-offset:-4px}
.offline td{opacity:.5}.offline th{color:#999}
.legend span{display:inline-block;padding:1px 8px;margin-right:6px;border:1px solid #ccc}
.refused td{background:#ffcdd2}.offline-host td{background:#eeeeee}
.sev-warning{color:#8a5a00}.sev-error{color:#b71c1c;font-weight:600}
"""


# --------------------------------------------------------------------------
# the page (pure)
# --------------------------------------------------------------------------


def _e(text: object) -> str:
    """Escaped for element text and quoted attribute values alike."""
    return html.escape(str(text), quote=True)


def _unix(ts) -> float:
    return ts.seconds + ts.nanos / 1e9


def _utc(unix: float, with_ms: bool = False) -> str:
    if unix <= 0:
        return "-"
    text = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(unix))
    return text + (f".{int(unix * 1000) % 1000:03d}" if with_ms else "") + " UTC"


def _ago(seconds: float) -> str:
    if seconds < 0:
        return "just now"
    if seconds < 90:
        return f"{seconds:.0f}s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f}h ago"
    return f"{seconds / 86400:.0f}d ago"


def _why(cell: grid.Cell) -> str:
    """A problem cell's evidence and, when its hosts said, which way its paths lose packets."""
    return "; ".join(x for x in (cell.evidence, cell.direction) if x) or "-"


def _cell_html(cell: grid.Cell) -> str:
    classes = ["cell", f"v-{cell.verdict.lower()}"]
    text = CELL_TEXT[cell.verdict]
    if cell.drained:
        classes.append("drained")
        text = f"{text} drained"
    if cell.fenced:
        classes.append("fenced")
        text = f"{text} {'fenced' if cell.fence == 'FENCED' else 'testing'}"
    if cell.failed_over:
        text += " ⇢"  # the rail's traffic takes another path
    title = " · ".join(x for x in (
        cell.port or "no port in inventory",
        cell.verdict if cell.verdict != grid.NO_REPORT else "no report",
        "drained" if cell.drained else "",
        {"FENCED": "fenced: taken down by its host", "TESTING": "fenced: up for a test, no traffic"}
        .get(cell.fence, ""),
        f"path {cell.path}" if cell.path else "",
        cell.evidence,
        cell.direction,
        "" if cell.connected else "host offline: last report",
    ) if x)
    return (f'<td class="{" ".join(classes)}" data-host="{_e(cell.host_id)}" data-rail="{_e(cell.rail)}" '
            f'data-port="{_e(cell.port)}" data-verdict="{_e(cell.verdict)}" '
            f'data-drained="{"true" if cell.drained else "false"}" data-fence="{_e(cell.fence)}" '
            f'data-connected="{"true" if cell.connected else "false"}" '
            f'data-path="{_e(cell.path)}" title="{_e(title)}">{_e(text)}</td>')


def _grid_html(g: grid.Grid, now: float) -> str:
    if not g.rows:
        return '<p id="no-hosts">No host has reported yet.</p>'
    head = "".join(f"<th>{_e(r)}</th>" for r in g.rails)
    rows = []
    for row in g.rows:
        h = row.host
        seen = _unix(h.last_seen)
        state = "connected" if h.connected else f"offline, last seen {_ago(now - seen)}" if seen else "offline"
        about = f"{state}; version {h.version or '?'}; boot {h.boot_id or '?'}"
        rows.append(
            f'<tr class="{"online" if h.connected else "offline"}" data-host="{_e(h.host_id)}">'
            f'<th title="{_e(about)}">{_e(h.host_id)}'
            f'{"" if h.connected else " (offline)"}</th>{"".join(_cell_html(c) for c in row.cells)}</tr>')
    legend = ('<p class="legend"><span class="v-up">UP</span><span class="v-degraded">DEG degraded</span>'
              '<span class="v-down">DOWN</span><span class="v-up drained">drained</span>'
              '<span class="v-down fenced">fenced</span>'
              '<span class="v-none">– no report</span> ⇢ the rail routes through another path</p>')
    hidden = (f'<p class="meta" id="hidden-rails">{g.hidden_rails} more rails, reported by fewer hosts, '
              'are not shown as columns</p>' if g.hidden_rails else "")
    return (f'{legend}<table id="grid"><thead><tr><th>host</th>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>{hidden}')


def _problems_html(g: grid.Grid) -> str:
    cells = g.problems()
    if not cells:
        return '<p id="problems">Every reported port is UP on its own path.</p>'
    rows = "".join(
        f'<tr><td>{_e(c.host_id)}</td><td>{_e(c.rail)}</td><td>{_e(c.port)}</td>'
        f'<td class="v-{c.verdict.lower()}{" drained" if c.drained else ""}'
        f'{" fenced" if c.fenced else ""}">{_e(c.verdict)}'
        f'{" drained" if c.drained else ""}{" " + c.fence.lower() if c.fenced else ""}</td>'
        f'<td>{_e(c.path or "-")}</td><td>{_e(_why(c))}</td></tr>'
        for c in cells[:PROBLEMS_SHOWN])
    more = (f'<p class="meta">… and {len(cells) - PROBLEMS_SHOWN} more</p>' if len(cells) > PROBLEMS_SHOWN else "")
    return ('<table id="problems"><thead><tr><th>host</th><th>rail</th><th>port</th><th>verdict</th>'
            f'<th>path now</th><th>why</th></tr></thead><tbody>{rows}</tbody></table>{more}')


def _hosts_not_reporting_html(hosts: fleet_pb2.ListHostsResponse, refused: Sequence[Refusal],
                              now: float) -> str:
    """Hosts the fleet does not hear from: refused ones (their certificate
    does not name the host they say they are: they never appear in the grid)
    and offline ones (their stream is gone); "" when there is none."""
    rows = [f'<tr class="refused" data-host="{_e(r.host_id)}"><td>{_e(r.host_id)}</td><td>refused</td>'
            f'<td>{_e(_ago(now - r.at))}</td><td>{_e(r.reason)} (from {_e(r.peer)}); fix the host\'s '
            'certificate or its [aggregator] host_id (linkpassd --check-config compares them)</td></tr>'
            for r in sorted(refused, key=lambda r: -r.at)]
    for h in sorted((h for h in hosts.hosts if not h.connected), key=lambda h: h.host_id):
        seen = _unix(h.last_seen)
        rows.append(f'<tr class="offline-host" data-host="{_e(h.host_id)}"><td>{_e(h.host_id)}</td>'
                    f'<td>offline</td><td>{_e(_ago(now - seen) if seen else "never")}</td>'
                    '<td>its stream to the aggregator is gone: linkpassd stopped, or the host or its '
                    'network is down (its cells show the last report)</td></tr>')
    if not rows:
        return ""
    shown = rows[:PROBLEMS_SHOWN]
    more = (f'<p class="meta">… and {len(rows) - PROBLEMS_SHOWN} more</p>' if len(rows) > PROBLEMS_SHOWN else "")
    return ('<table id="not-reporting"><thead><tr><th>host</th><th>state</th><th>since</th><th>why</th>'
            f'</tr></thead><tbody>{"".join(shown)}</tbody></table>{more}')


def _enum_word(enum_type, value: int, prefix: str) -> str:
    try:
        return enum_type.Name(value).removeprefix(prefix).lower()
    except ValueError:  # a value newer than this release
        return str(value)


def _events_html(events: Sequence[fleet_pb2.FleetEvent]) -> str:
    newest = sorted(events, key=lambda fe: fe.id, reverse=True)[:EVENTS_SHOWN]
    if not newest:
        return '<p id="no-events">No events stored yet.</p>'
    rows = []
    for fe in newest:
        e = fe.event
        severity = _enum_word(cpb.Severity, e.severity, "SEVERITY_")
        where = "/".join(x for x in (e.port, e.rail) if x) or "-"
        rows.append(
            f'<tr class="sev-{_e(severity)}" data-id="{fe.id}"><td>{_e(_utc(_unix(e.time), with_ms=True))}</td>'
            f'<td>{_e(fe.host_id)}</td><td>{_e(severity)}</td>'
            f'<td>{_e(_enum_word(cpb.EventKind, e.kind, "EVENT_KIND_"))}</td><td>{_e(where)}</td>'
            f'<td>{_e(e.message or e.name)}</td></tr>')
    return ('<table id="events"><thead><tr><th>time</th><th>host</th><th>severity</th><th>kind</th>'
            f'<th>port/rail</th><th>what</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')


def _summary_html(summary: fleet_pb2.GetSummaryResponse) -> str:
    days = sorted(summary.days, key=lambda d: d.day, reverse=True)
    total_failures = sum(d.failures_absorbed for d in days)
    total_outgoing = sum(d.failures_outgoing_only for d in days)
    total_hours = sum(d.gpu_hours_saved for d in days)
    rows = "".join(f'<tr data-day="{_e(d.day)}"><td>{_e(d.day)}</td><td>{d.failures_absorbed}</td>'
                   f'<td>{d.failures_outgoing_only}</td><td>{d.gpu_hours_saved:.1f}</td></tr>' for d in days)
    verdicts = ", ".join(f"{_e(k)} {v}" for k, v in sorted(summary.ports_by_verdict.items())) or "none"
    return (f'<p id="totals">{total_failures} failures absorbed, <strong>{total_hours:.1f} GPU-hours saved</strong> '
            f'over {len(days)} day{"" if len(days) == 1 else "s"} '
            f'(restart cost {summary.restart_cost_s / 60:g} min per failure × GPUs '
            f'behind the port); {total_outgoing} outgoing only. Ports now: {verdicts}.</p>'
            '<p class="meta" id="absorbed-rule">Absorbed: both directions recovered. The rail failed over '
            f'(not a drain) and, within {INCOMING_WITHIN_S:g} s, its address was withdrawn from the failed '
            'rail and announced through a healthy rail ([announce]) while the host\'s FRR was announcing. '
            'Outgoing only: the '
            'host\'s traffic moved, but traffic to the failed rail kept arriving over it (no [announce], '
            'or FRR stopped or not importing): the job may still have stalled, so no GPU-hours are '
            'counted.</p>'
            '<table id="accounting"><thead><tr><th>day (UTC)</th><th>failures absorbed</th>'
            f'<th>outgoing only</th><th>GPU-hours saved</th></tr></thead><tbody>{rows}</tbody></table>')


def _validation_html(report: fleet_pb2.ValidationReport | None, now: float) -> str:
    """The last validation run (linkpassctl validate): its findings first, as
    the terminal report shows them; hosts that gave no result are findings too."""
    if report is None:
        return '<p id="validation">No validation has run since the aggregator started (linkpassctl validate).</p>'
    finished = _unix(report.finished)
    took = finished - _unix(report.started)
    ok = sum(1 for h in report.hosts if h.status == "ok")
    meta = (f'<p class="meta" id="validation" data-run="{_e(report.run_id)}">run {_e(report.run_id)}, finished '
            f'{_e(_utc(finished))} ({_ago(now - finished)}, took {took:.0f} s); '
            f'{ok} of {len(report.hosts)} hosts answered; resolves random loss down to '
            f'{report.loss_resolution * 100:.2g} %</p>')
    if not report.findings:
        return meta + '<p id="no-findings">No findings: every checked port, cable and path matched the plan.</p>'
    rows = "".join(
        f'<tr data-kind="{_e(f.kind)}"><td>{_e(f.kind)}</td><td>{_e(f.component)}</td><td>{_e(f.rail or "-")}</td>'
        f'<td>{f.confidence:.0%}</td><td>{"<br>".join(_e(line) for line in f.evidence) or "-"}</td>'
        f'<td>{_e(f.fix or "-")}</td></tr>' for f in list(report.findings)[:PROBLEMS_SHOWN])
    more = (f'<p class="meta">… and {len(report.findings) - PROBLEMS_SHOWN} more</p>'
            if len(report.findings) > PROBLEMS_SHOWN else "")
    return (f'{meta}<table id="findings"><thead><tr><th>kind</th><th>at fault</th><th>rail</th><th>confidence</th>'
            f'<th>evidence</th><th>fix</th></tr></thead><tbody>{rows}</tbody></table>{more}')


def render_page(hosts: fleet_pb2.ListHostsResponse, events: Sequence[fleet_pb2.FleetEvent],
                summary: fleet_pb2.GetSummaryResponse, *, insecure: bool, now: float,
                validation: fleet_pb2.ValidationReport | None = None,
                refused: Sequence[Refusal] = ()) -> str:
    """The whole page. `events` in any order (the newest 50 are shown);
    `now` only for 'last seen ... ago' of offline hosts; `validation` the
    last validation report (None: none yet); `refused` the hosts this
    aggregator refused (identity.Refusal)."""
    g = grid.build(hosts)
    connected = sum(1 for h in hosts.hosts if h.connected)
    banner = ('<div class="insecure" id="insecure-banner">WARNING: INSECURE MODE — no TLS, hosts are not '
              'authenticated and anyone can send fleet commands. For labs only.</div>' if insecure else "")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="{REFRESH_S}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{"[INSECURE] " if insecure else ""}linkpass fleet</title><style>{STYLE}</style></head><body>'
        f'{banner}<h1>linkpass fleet</h1>'
        f'<p class="meta">{len(hosts.hosts)} hosts, {connected} connected · served {_e(_utc(now))} · '
        f'refreshes every {REFRESH_S}s</p>'
        f'<h2>Hosts × rails</h2>{_grid_html(g, now)}'
        f'<h2>Needs a look</h2>{_hosts_not_reporting_html(hosts, refused, now)}{_problems_html(g)}'
        f'<h2>What it saved</h2>{_summary_html(summary)}'
        f'<h2>Last validation</h2>{_validation_html(validation, now)}'
        f'<h2>Latest events</h2>{_events_html(events)}'
        '</body></html>\n')


# --------------------------------------------------------------------------
# the server
# --------------------------------------------------------------------------

PageSource = Callable[[], Awaitable[str]]
HealthSource = Callable[[], Awaitable[tuple[bool, str]]]

MAX_HEAD_BYTES = 8192
READ_TIMEOUT_S = 10.0
WRITE_TIMEOUT_S = 10.0
LINGER_S = 1.0  # a refused connection's unread request, drained before closing
MAX_CONNECTIONS = 64
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
           503: "Service Unavailable"}


def parse_listen(listen: str) -> tuple[str, int]:
    """"HOST:PORT" or "[V6]:PORT" -> (host, port); ValueError naming the input."""
    host, sep, port_text = listen.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"web listen address {listen!r} is not HOST:PORT (e.g. 127.0.0.1:9480)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"web listen address {listen!r}: {host!r} is not an IPv6 address") from None
    return host, int(port_text)


@dataclass
class WebServer:
    """The running page server; `address` is what it is bound to."""

    server: asyncio.base_events.Server
    address: tuple[str, int]
    _handlers: set[asyncio.Task] = field(default_factory=set)

    async def close(self) -> None:
        self.server.close()
        for task in list(self._handlers):
            task.cancel()
        # asyncio.timeout, not wait_for: on 3.11 wait_for can drop a cancel
        # that lands as the awaited thing completes (here: a close() that is
        # itself cancelled at shutdown would carry on).
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await self.server.wait_closed()


async def serve(listen: str, page_source: PageSource, health_source: HealthSource | None = None) -> WebServer:
    """Serve the page on `listen` until WebServer.close()."""
    host, port = parse_listen(listen)
    slots = asyncio.Semaphore(MAX_CONNECTIONS)
    handlers: set[asyncio.Task] = set()

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            handlers.add(task)
        try:
            if slots.locked():
                await _respond(writer, 503, "text/plain", b"too many connections\n", head_only=False)
                await _linger(reader, writer)
                return
            async with slots:
                await _handle(reader, writer, page_source, health_source)
        except (ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            pass  # the client went away or stalled: nothing to answer
        except Exception as exc:  # noqa: BLE001 - never let one request take the server down
            log.warning("web_request_failed", error=str(exc))
        finally:
            handlers.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):  # not wait_for: see WebServer.close
                    await writer.wait_closed()

    server = await asyncio.start_server(on_connection, host, port, limit=MAX_HEAD_BYTES * 2)
    bound = server.sockets[0].getsockname()
    return WebServer(server=server, address=(bound[0], bound[1]), _handlers=handlers)


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After answering a request that was never read (503): half-close, then
    read until the client closes (at most LINGER_S). Closing with its request
    still unread makes the kernel reset the connection, and the client can
    lose the 503 before reading it."""
    with contextlib.suppress(Exception):
        writer.write_eof()
        async with asyncio.timeout(LINGER_S):
            while await reader.read(4096):
                pass


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  page_source: PageSource, health_source: HealthSource | None) -> None:
    try:
        async with asyncio.timeout(READ_TIMEOUT_S):  # not wait_for: close() cancels handlers
            head = await reader.readuntil(b"\r\n\r\n")
    except TimeoutError:
        await _respond(writer, 408, "text/plain", b"request head not received in time\n", head_only=False)
        return
    except asyncio.LimitOverrunError:
        await _respond(writer, 431, "text/plain", b"request head over 8 KiB\n", head_only=False)
        return
    if len(head) > MAX_HEAD_BYTES:
        await _respond(writer, 431, "text/plain", b"request head over 8 KiB\n", head_only=False)
        return
    request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        await _respond(writer, 400, "text/plain", b"malformed request line\n", head_only=False)
        return
    method, target = parts[0], parts[1]
    path = target.split("?", 1)[0]
    if path not in ("/", "/index.html", "/healthz"):
        await _respond(writer, 404, "text/plain", b"not found: this server has / and /healthz\n",
                       head_only=method == "HEAD")
        return
    if method not in ("GET", "HEAD"):
        await _respond(writer, 405, "text/plain", b"read-only: GET or HEAD\n", head_only=False,
                       extra={"Allow": "GET, HEAD"})
        return
    head_only = method == "HEAD"
    if path == "/healthz":
        ok, text = (True, "ok") if health_source is None else await health_source()
        await _respond(writer, 200 if ok else 503, "text/plain", (text + "\n").encode(), head_only=head_only)
        return
    try:
        page = await page_source()
    except Exception as exc:  # noqa: BLE001 - a page that cannot be built answers 500, not a dropped connection
        log.warning("web_page_failed", error=str(exc))
        await _respond(writer, 500, "text/plain", f"the page could not be built: {exc}\n".encode(),
                       head_only=head_only)
        return
    await _respond(writer, 200, "text/html; charset=utf-8", page.encode(), head_only=head_only)


async def _respond(writer: asyncio.StreamWriter, status: int, content_type: str, body: bytes, *,
                   head_only: bool, extra: dict[str, str] | None = None) -> None:
    headers = {"Content-Type": content_type, "Content-Length": str(len(body)), "Connection": "close",
               "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
               "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'", **(extra or {})}
    head = f"HTTP/1.1 {status} {REASONS[status]}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(head.encode("latin-1") + b"\r\n" + (b"" if head_only else body))
    async with asyncio.timeout(WRITE_TIMEOUT_S):  # not wait_for: close() cancels handlers
        await writer.drain()
