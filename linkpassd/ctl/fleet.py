"""`linkpassctl fleet ...`: the fleet as linkpass-aggregator sees it.

The same habits as the rest of linkpassctl: everything shown comes from the
aggregator's answer (ages from its `served_at`), JSON is the API's own
messages, and a failure is one line on stderr with an exit code a script can
branch on (linkpassd/exitcodes.py): aggregator unreachable 3, refused (TLS
handshake failed, no operator identity) 4, unknown host or port 5, bad
argument 2. The renderers are pure functions, tested without a server.

Where the aggregator is and how to prove who we are come from options or the
environment (LINKPASS_AGGREGATOR, LINKPASS_CA, LINKPASS_CERT, LINKPASS_KEY),
so an operator's shell profile sets them once.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import click
import grpc

from linkpassd._proto.linkpass.v1 import control_pb2 as cpb
from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd._proto.linkpass.v1 import fleet_pb2_grpc as pb_grpc
from linkpassd.core.drain import DrainError, parse_duration
from linkpassd.ctl import terminal
from linkpassd.ctl.render import _one_line, duration, event_line, table, to_json, unix
from linkpassd.ctl.rpc import STATUS_EXIT, RpcTarget, status_of
from linkpassd.ctl.terminal import safe
from linkpassd.exitcodes import ExitCode
from linkpassd.fleet import grid

DEFAULT_TIMEOUT_S = 5.0
# Longer than the aggregator's own wait for the host's answer to a relayed
# command (20 s), so a slow host is answered by the aggregator, not our deadline.
COMMAND_TIMEOUT_S = 30.0


class FleetError(click.ClickException):
    """One line on stderr and the exit code that says which kind of failure."""

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILURE) -> None:
        super().__init__(message)
        self.exit_code = int(code)

    def show(self, file=None) -> None:
        terminal.echo(f"linkpassctl: fleet: {self.format_message()}", err=True)


MAX_RECEIVE_BYTES = 256 << 20


def parse_address(text: str) -> str:
    """'HOST:PORT', '[V6]:PORT' or 'unix:/abs/path' (a lab aggregator's
    socket), checked; the gRPC target for it."""
    if text.strip().startswith("unix:"):
        if not text.strip()[5:].startswith("/"):
            raise click.BadParameter(f"{text!r}: a Unix socket needs an absolute path "
                                     "(unix:/run/...)", param_hint="'--aggregator'")
        return text.strip()
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise click.BadParameter(f"{text!r} is not HOST:PORT (e.g. agg.example:7443)", param_hint="'--aggregator'")
    return f"{host}:{port}"


@dataclass(frozen=True)
class Aggregator(RpcTarget):
    """Where the aggregator is, and the channel credentials to reach it."""

    address: str
    timeout: float
    credentials: grpc.ChannelCredentials | None  # None: --insecure
    server_name: str = ""  # TLS name to expect instead of the address's host
    cert_path: str = ""  # for error messages

    stub = pb_grpc.FleetServiceStub

    def channel(self) -> grpc.Channel:
        # A validation report of a large fleet carries every probed pair
        # (about 14 MB at 2,048 hosts x 8 rails): past gRPC's 4 MB default.
        options = [("grpc.max_receive_message_length", MAX_RECEIVE_BYTES)]
        if self.credentials is None:
            return grpc.insecure_channel(self.address, options=options)
        if self.server_name:
            options.append(("grpc.ssl_target_name_override", self.server_name))
        return grpc.secure_channel(self.address, self.credentials, options=options)

    def failure(self, exc: grpc.RpcError) -> FleetError:
        code, details = status_of(exc)
        details = _one_line(details)
        low = details.lower()
        where = self.address
        if code == grpc.StatusCode.UNAVAILABLE:
            if "hostname verification" in low:
                # The aggregator answered with a certificate for another name:
                # a refusal of trust, not an aggregator that is away.
                expected = self.server_name or self.address.rpartition(":")[0]
                return FleetError(f"the certificate of {where} does not name {expected!r} "
                                  f"(check --server-name or the address): {details}", ExitCode.REFUSED)
            if any(word in low for word in ("handshake", "ssl", "certificate", "tls")):
                return FleetError(f"TLS handshake with {where} failed (is --ca the aggregator's CA, and "
                                  f"--cert/--key a certificate it trusts?): {details}", ExitCode.REFUSED)
            if "socket closed" in low and self.credentials is not None:
                # What gRPC shows when the server refused our certificate in the
                # handshake (it closes the connection; the reason stays server-side).
                return FleetError(f"{where} closed the connection during the TLS handshake: it does not trust "
                                  f"--cert {self.cert_path}, or is not serving TLS ({details})", ExitCode.REFUSED)
            if "socket closed" in low:
                return FleetError(f"{where} closed the connection: does it require TLS? then give --ca/--cert/--key "
                                  f"instead of --insecure ({details})", ExitCode.UNREACHABLE)
            if "connection refused" in low or "failed to connect" in low:
                return FleetError(f"linkpass-aggregator is not reachable at {where}: {details}",
                                  ExitCode.UNREACHABLE)
            return FleetError(f"linkpass-aggregator unavailable at {where}: {details}", ExitCode.UNREACHABLE)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return FleetError(f"linkpass-aggregator at {where} did not answer in time", ExitCode.UNREACHABLE)
        if code in STATUS_EXIT:  # the aggregator's message names what and why
            return FleetError(details, STATUS_EXIT[code])
        return FleetError(f"linkpass-aggregator answered {code.name if code else 'error'}: {details}")


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise FleetError(f"{what} file {path} does not exist", ExitCode.USAGE) from None
    except PermissionError:
        raise FleetError(f"{what} file {path}: permission denied", ExitCode.REFUSED) from None
    except OSError as exc:
        raise FleetError(f"{what} file {path}: {exc.strerror}", ExitCode.USAGE) from None


def aggregator_from_options(ctx: click.Context, address: str | None, ca: str | None, cert: str | None,
                            key: str | None, insecure: bool, server_name: str) -> Aggregator:
    if not address:
        raise click.UsageError("no aggregator: give --aggregator HOST:PORT or set LINKPASS_AGGREGATOR", ctx)
    target = parse_address(address)
    timeout = getattr(ctx.obj, "timeout", DEFAULT_TIMEOUT_S)  # linkpassctl --timeout
    if insecure:
        given = [f"--{name}" for name, value in (("ca", ca), ("cert", cert), ("key", key))
                 if value and ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
        if given:
            raise click.UsageError(f"--insecure and {', '.join(given)} exclude each other", ctx)
        return Aggregator(target, timeout, None)
    missing = [f"--{name} (or {env})" for name, value, env in (
        ("ca", ca, "LINKPASS_CA"), ("cert", cert, "LINKPASS_CERT"), ("key", key, "LINKPASS_KEY")) if not value]
    if missing:
        raise click.UsageError(f"mutual TLS needs {', '.join(missing)}; or --insecure for a lab aggregator", ctx)
    assert ca and cert and key
    credentials = grpc.ssl_channel_credentials(root_certificates=_read(ca, "--ca"),
                                               private_key=_read(key, "--key"),
                                               certificate_chain=_read(cert, "--cert"))
    return Aggregator(target, timeout, credentials, server_name, cert_path=cert)


@dataclass
class Connect:
    """The options, checked only when a command runs (so `fleet events --help`
    works without an aggregator configured); returns the Aggregator."""

    ctx: click.Context
    address: str | None
    ca: str | None
    cert: str | None
    key: str | None
    insecure: bool
    server_name: str
    output: str = "table"  # `fleet -o json CMD`: the group's -o, unless CMD has its own

    def __call__(self) -> Aggregator:
        return aggregator_from_options(self.ctx, self.address, self.ca, self.cert, self.key, self.insecure,
                                       self.server_name)


# --------------------------------------------------------------------------
# rendering (pure)
# --------------------------------------------------------------------------

SYMBOL = {"UP": "up", "DEGRADED": "DEG", "DOWN": "DOWN", grid.NO_REPORT: "-"}
DRAINED = "DRN"
FENCED = "FNC"
FAILED_OVER = "*"
LEGEND = (f"legend: up UP  DEG degraded  DOWN down  {DRAINED} drained by an operator  - no report\n"
          f"        {FENCED} fenced by its host  "
          f"{FAILED_OVER} after a symbol: the rail routes through another path now")


def cell_symbol(cell: grid.Cell) -> str:
    symbol = FENCED if cell.fenced else DRAINED if cell.drained else SYMBOL[cell.verdict]
    return symbol + (FAILED_OVER if cell.failed_over else "")


def connection_text(host: pb.HostView, served_at: float) -> str:
    if host.connected:
        return "yes"
    seen = unix(host.last_seen)
    return f"no, {duration(served_at - seen)}" if seen > 0 else "no"


def render_grid(resp: pb.ListHostsResponse) -> str:
    """Hosts down, rails across, a short symbol per cell, then what needs a
    look (with the evidence) and the counts. 8 rails fit in 80 columns with
    host names up to ~20 characters."""
    g = grid.build(resp)
    if not g.rows:
        return "no hosts have reported to the aggregator yet"
    served_at = unix(resp.served_at)
    rows = [[row.host.host_id, connection_text(row.host, served_at), *(cell_symbol(c) for c in row.cells)]
            for row in g.rows]
    parts = [table(["HOST", "CONNECTED", *g.rails], rows) if g.rails else
             table(["HOST", "CONNECTED", "RAILS"], [[*r[:2], "no inventory"] for r in rows]),
             LEGEND]
    if g.hidden_rails:
        parts.append(f"{g.hidden_rails} more rails, reported by fewer hosts, are not shown as columns "
                     "(-o json has every one)")
    problems = g.problems()
    if problems:
        parts.append(table(["HOST", "RAIL", "PORT", "VERDICT", "PATH NOW", "WHY"], [
            [c.host_id, c.rail, c.port, c.verdict + (" drained" if c.drained else "")
             + (f" {c.fence.lower()}" if c.fenced else ""), c.path or "-",
             _one_line(c.evidence) if c.evidence else "-"] for c in problems]))
    cells = [c for row in g.rows for c in row.cells]
    counts = Counter(c.verdict for c in cells)
    connected = sum(1 for row in g.rows if row.host.connected)
    parts.append(f"{len(g.rows)} hosts ({connected} connected), {len(cells)} ports: "
                 f"{counts['UP']} up, {counts['DEGRADED']} degraded, {counts['DOWN']} down, "
                 f"{sum(c.drained for c in cells)} drained, "
                 + (f"{fenced} fenced, " if (fenced := sum(c.fenced for c in cells)) else "")
                 + f"{counts[grid.NO_REPORT]} no report")
    return "\n\n".join(parts)


def fleet_event_line(fe: pb.FleetEvent, host_width: int = 16) -> str:
    return f"{safe(fe.host_id, one_line=True):<{host_width}}  {event_line(fe.event)}"


def render_fleet_events(events: list[pb.FleetEvent]) -> str:
    if not events:
        return "no events"
    width = max(len(safe(fe.host_id, one_line=True)) for fe in events)
    return "\n".join(fleet_event_line(fe, width) for fe in events)


def render_summary(resp: pb.GetSummaryResponse) -> str:
    days = sorted(resp.days, key=lambda d: d.day)
    rows = [[d.day, str(d.failures_absorbed), str(d.failures_outgoing_only), f"{d.gpu_hours_saved:.1f}"]
            for d in days]
    rows.append(["total", str(sum(d.failures_absorbed for d in days)),
                 str(sum(d.failures_outgoing_only for d in days)),
                 f"{sum(d.gpu_hours_saved for d in days):.1f}"])
    verdicts = ", ".join(f"{v} {k}" for k, v in sorted(resp.ports_by_verdict.items())) or "none reported"
    return "\n\n".join([
        table(["DAY (UTC)", "FAILURES ABSORBED", "OUTGOING ONLY", "GPU-HOURS SAVED"], rows),
        f"a failure absorbed: both directions recovered: a rail failed over to another path (not a drain),\n"
        f"and within 5 s its address was announced through a healthy rail ([announce]) with FRR announcing;\n"
        f"outgoing only: the host's traffic moved, traffic to the failed rail did not (no [announce], or FRR\n"
        f"missing): no GPU-hours counted\n"
        f"saved = GPUs behind the port x restart cost {resp.restart_cost_s / 60:g} min\n"
        f"hosts {resp.hosts} ({resp.hosts_connected} connected); ports now: {verdicts}",
    ])


# --------------------------------------------------------------------------
# commands
# --------------------------------------------------------------------------

output_option = click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table",
                             show_default=True, help="table for people, json (the API's messages) for scripts.")
# A command's own -o; without it, the group's (`fleet -o json summary` and
# `fleet summary -o json` are the same).
command_output_option = click.option("-o", "--output", type=click.Choice(["table", "json"]), default=None,
                                     help="table for people, json (the API's messages) for scripts "
                                          "[default: fleet's -o, else table].")

KINDS = [name.removeprefix("EVENT_KIND_").lower() for name in cpb.EventKind.keys()
         if name != "EVENT_KIND_UNSPECIFIED"]


@click.group(invoke_without_command=True)
@click.option("--aggregator", "address", metavar="HOST:PORT", envvar="LINKPASS_AGGREGATOR", show_envvar=True,
              help="linkpass-aggregator's gRPC address.")
@click.option("--ca", metavar="FILE", envvar="LINKPASS_CA", show_envvar=True,
              help="CA certificate (PEM) the aggregator's certificate must chain to.")
@click.option("--cert", metavar="FILE", envvar="LINKPASS_CERT", show_envvar=True,
              help="Client certificate (PEM); fleet drain/undrain need an operator certificate.")
@click.option("--key", metavar="FILE", envvar="LINKPASS_KEY", show_envvar=True, help="Its private key (PEM).")
@click.option("--insecure", is_flag=True, help="Plaintext, for a lab aggregator running with [tls] insecure.")
@click.option("--server-name", metavar="NAME", default="", envvar="LINKPASS_AGGREGATOR_NAME",
              help="Name the aggregator's certificate carries, when it differs from HOST.")
@output_option
@click.pass_context
def fleet(ctx: click.Context, address: str | None, ca: str | None, cert: str | None, key: str | None,
          insecure: bool, server_name: str, output: str) -> None:
    """The fleet from linkpass-aggregator: without a command, hosts x rails
    (verdict per port), what needs a look, and the counts."""
    ctx.obj = Connect(ctx, address, ca, cert, key, insecure, server_name, output)
    if ctx.invoked_subcommand is None:
        resp = ctx.obj().call(lambda stub: stub.ListHosts, pb.ListHostsRequest())
        terminal.echo(to_json(resp) if output == "json" else render_grid(resp))


def _duration_option(text: str | None, hint: str) -> float:
    if text is None:
        return 0.0
    try:
        return parse_duration(text)
    except DrainError as exc:
        raise click.BadParameter(str(exc), param_hint=hint) from None


@fleet.command("events")
@click.option("--host", "host_id", default="", metavar="HOST", help="Only this host's events.")
@click.option("--port", default="", metavar="PORT", help="Only events about this port (e.g. eth1).")
@click.option("--kind", type=click.Choice(KINDS, case_sensitive=False), default=None, help="Only this kind.")
@click.option("--since", metavar="DURATION", default=None,
              help="Only events of the last DURATION (host time), e.g. 30m, 2h, 1d.")
@click.option("--after", type=click.IntRange(min=0), default=0, metavar="ID",
              help="Only events stored after this cursor (a FleetEvent id) [default: the oldest held; "
                   "with --follow: only new ones].")
@click.option("--limit", type=click.IntRange(min=1), default=None, metavar="N",
              help="At most N events (with --follow: stop after N) [default: the aggregator's, 1000].")
@click.option("-f", "--follow", is_flag=True, help="Keep printing events as they are stored; Ctrl-C ends.")
@command_output_option
@click.pass_obj
def fleet_events(connect: Connect, host_id: str, port: str, kind: str | None, since: str | None, after: int,
                 limit: int | None, follow: bool, output: str) -> None:
    """Events every host reported, oldest first: HOST, then time, seq,
    severity, kind, port/rail, message (json: FleetEvent messages; with
    --follow one JSON document per line)."""
    output = output or connect.output
    kind_value = cpb.EventKind.Value("EVENT_KIND_" + kind.upper()) if kind else 0
    since_s = _duration_option(since, "'--since'") if since is not None else None
    if follow and since_s is not None:
        raise click.UsageError("--since does not go with --follow (use --after ID to resume from a cursor)")
    agg = connect()
    if not follow:
        request = pb.ListFleetEventsRequest(host_id=host_id, port=port, kind=kind_value, after_id=after,
                                            limit=limit or 0)
        if since_s is not None:
            request.since.FromNanoseconds(int((time.time() - since_s) * 1e9))
        resp = agg.call(lambda stub: stub.ListFleetEvents, request)
        if output == "json":
            terminal.echo(to_json(resp))
            return
        terminal.echo(render_fleet_events(list(resp.events)))
        if resp.events and limit is None and len(resp.events) >= 1000:
            terminal.echo(f"linkpassctl: fleet: more events follow; --after {resp.events[-1].id} shows them", err=True)
        return
    shown = 0
    stream = agg.stream(lambda stub: stub.WatchFleetEvents,
                        pb.WatchFleetEventsRequest(host_id=host_id, port=port, kind=kind_value, after_id=after))
    try:
        for msg in stream:
            terminal.echo(to_json(msg.event, indent=None) if output == "json" else fleet_event_line(msg.event))
            shown += 1
            if limit is not None and shown >= limit:
                return
    except KeyboardInterrupt:  # the way to stop following: not an error
        return
    finally:
        stream.close()
    raise FleetError("linkpass-aggregator ended the event stream (it is stopping)", ExitCode.UNREACHABLE)


@fleet.command("drain")
@click.argument("host")
@click.argument("port")
@click.option("--reason", required=True, metavar="TEXT", help="Why, for the next person on call (required).")
@click.option("--for", "for_", metavar="DURATION", default=None,
              help="End the drain by itself after DURATION, e.g. 30m, 2h, 1d [default: until undrain].")
@command_output_option
@click.pass_obj
def fleet_drain(connect: Connect, host: str, port: str, reason: str, for_: str | None, output: str) -> None:
    """Drain PORT on HOST through the aggregator (its linkpassd takes the
    port out of service, as `linkpassctl drain` there would). Needs an
    operator certificate."""
    output = output or connect.output
    if not reason.strip():
        raise click.BadParameter("the reason is empty; say why, for the next person on call",
                                 param_hint="'--reason'")
    duration_s = _duration_option(for_, "'--for'")
    resp = connect().call(lambda stub: stub.FleetDrain,
                    pb.FleetDrainRequest(host_id=host, port=port, reason=reason, duration_s=duration_s),
                    at_least=COMMAND_TIMEOUT_S)
    terminal.echo(to_json(resp) if output == "json" else f"{host} {port}: {_one_line(resp.message or 'drained')}")


@fleet.command("undrain")
@click.argument("host")
@click.argument("port")
@command_output_option
@click.pass_obj
def fleet_undrain(connect: Connect, host: str, port: str, output: str) -> None:
    """End the drain of PORT on HOST. Needs an operator certificate."""
    output = output or connect.output
    resp = connect().call(lambda stub: stub.FleetUndrain, pb.FleetUndrainRequest(host_id=host, port=port),
                    at_least=COMMAND_TIMEOUT_S)
    terminal.echo(to_json(resp) if output == "json" else f"{host} {port}: {_one_line(resp.message or 'undrained')}")


@fleet.command("summary")
@click.option("--days", type=click.IntRange(min=1, max=366), default=7, show_default=True,
              help="Days to cover, ending today (UTC).")
@command_output_option
@click.pass_obj
def fleet_summary(connect: Connect, days: int, output: str) -> None:
    """Failures absorbed and GPU-hours saved per day, hosts, ports by verdict."""
    output = output or connect.output
    resp = connect().call(lambda stub: stub.GetSummary, pb.GetSummaryRequest(days=days))
    terminal.echo(to_json(resp) if output == "json" else render_summary(resp))

