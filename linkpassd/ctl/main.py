"""linkpassctl: the operator CLI for the local linkpassd control socket.

Everything shown comes from the daemon's answer; ages and uptime are computed
from the time the daemon put in that answer (`served_at`), never from this
process's clock. Failures print one line on stderr and exit 1: operators run
this from scripts and during incidents, where a traceback is noise.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import click

# gRPC core logs connection failures straight to stderr; our own one-line
# errors say the same thing better. Must be set before gRPC initialises.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import grpc  # noqa: E402
from google.protobuf import json_format, struct_pb2  # noqa: E402
from google.protobuf.descriptor import Descriptor  # noqa: E402
from google.protobuf.message import Message  # noqa: E402

from linkpassd import __version__  # noqa: E402
from linkpassd._proto.linkpass.v1 import control_pb2 as pb  # noqa: E402
from linkpassd._proto.linkpass.v1 import control_pb2_grpc as pb_grpc  # noqa: E402

DEFAULT_SOCKET = "/run/linkpass/linkpassd.sock"
DEFAULT_TIMEOUT_S = 5.0

R = TypeVar("R", bound=Message)


class CtlError(click.ClickException):
    """An expected failure: one line on stderr, exit 1, no traceback."""

    def show(self, file=None) -> None:  # noqa: ANN001 - click's signature
        click.echo(f"linkpassctl: {self.format_message()}", err=True)


@dataclass(frozen=True)
class Target:
    socket_path: str
    timeout: float

    def call(self, method: Callable[[pb_grpc.ControlServiceStub], Callable[..., R]], request: Message) -> R:
        """Make one unary call, turning every failure into one CtlError line."""
        self._check_socket()
        try:
            with grpc.insecure_channel(f"unix:{os.path.abspath(self.socket_path)}") as channel:
                return method(pb_grpc.ControlServiceStub(channel))(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise CtlError(self._describe(exc)) from None

    def _check_socket(self) -> None:
        path = self.socket_path
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise CtlError(f"linkpassd is not running? no socket at {path}") from None
        except PermissionError:
            raise CtlError(f"permission denied reaching {path} (run as root or a member of its group)") from None
        except OSError as exc:
            raise CtlError(f"cannot reach {path}: {exc.strerror}") from None
        if not stat.S_ISSOCK(st.st_mode):
            raise CtlError(f"{path} is not a socket")
        if not os.access(path, os.W_OK):  # connect(2) needs write permission
            raise CtlError(f"permission denied on {path} (run as root or a member of its group)")

    def _describe(self, exc: grpc.RpcError) -> str:
        code = exc.code() if hasattr(exc, "code") else None
        details = (exc.details() if hasattr(exc, "details") else None) or ""
        path = self.socket_path
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return f"linkpassd did not answer within {self.timeout:g}s on {path}"
        if code == grpc.StatusCode.UNAVAILABLE:
            low = details.lower()
            if "permission denied" in low:
                return f"permission denied on {path} (run as root or a member of its group)"
            if "connection refused" in low or "no such file" in low:
                return f"linkpassd is not running? nothing listens on {path}"
            return f"linkpassd unavailable on {path}: {_one_line(details)}"
        if code == grpc.StatusCode.NOT_FOUND:  # the daemon's message names what was not found
            return _one_line(details)
        name = code.name if code is not None else "error"
        return f"linkpassd answered {name}: {_one_line(details)}"


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "(no details)"


# --------------------------------------------------------------------------
# formatting helpers (pure)
# --------------------------------------------------------------------------


def to_json(message: Message) -> str:
    """Proto field names, every field present even at its zero value, keys in
    field-number order (MessageToDict appends zero-valued fields last, which
    would make the order depend on the values). Fields with presence that are
    unset (a sensor reading that was not reported) are null, not missing, so
    the keys stay the same whatever the values; map keys are sorted."""
    data = json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    return json.dumps(_in_field_order(message.DESCRIPTOR, data), indent=2)


def _in_field_order(descriptor: Descriptor, data: dict) -> dict:
    ordered = {}
    for field in descriptor.fields:
        if field.name not in data:
            if field.has_presence:  # unset optional scalar or message: "not reported"
                ordered[field.name] = None
            continue
        value = data[field.name]
        sub = field.message_type
        if sub is not None and sub.GetOptions().map_entry:
            value_type = sub.fields_by_name["value"].message_type
            value = {
                k: _in_field_order(value_type, v) if value_type is not None and isinstance(v, dict) else v
                for k, v in sorted(value.items())
            }
        elif sub is not None:  # well-known types are not dicts: kept as is
            if isinstance(value, dict):
                value = _in_field_order(sub, value)
            elif isinstance(value, list):
                value = [_in_field_order(sub, v) if isinstance(v, dict) else v for v in value]
        ordered[field.name] = value
    return ordered


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell; the last one is left ragged so a
    long evidence string does not pad every line. A row with fewer cells than
    headers is a note: its last cell runs on across the remaining columns."""
    widths = [len(h) for h in headers]
    for row in rows:
        if not 0 < len(row) <= len(headers):
            raise ValueError(f"row {row!r} does not fit headers {headers!r}")
        cells = row if len(row) == len(headers) else row[:-1]
        for i, cell in enumerate(cells):
            widths[i] = max(widths[i], len(cell))
    return "\n".join(
        "  ".join([*(c.ljust(w) for c, w in zip(line[:-1], widths)), line[-1]]).rstrip()
        for line in [headers, *rows]
    )


def key_values(pairs: Sequence[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in pairs)


def duration(seconds: float) -> str:
    if seconds < 0:
        return "?"
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d{h:02d}h{m:02d}m"
    if h:
        return f"{h}h{m:02d}m{s:02d}s"
    if m:
        return f"{m}m{s:02d}s"
    return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"


def wall_time(unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix))


def since_text(since: float, served_at: float) -> str:
    return f"{duration(served_at - since)} ago"


def verdict_name(verdict: int) -> str:
    if verdict == pb.VERDICT_UNSPECIFIED:
        return "-"
    return pb.Verdict.Name(verdict).removeprefix("VERDICT_")


def active_path(rail: pb.RailStatus) -> str:
    if not rail.active_rail:
        return "NO PATH"
    role = "primary" if rail.active_rail == rail.name else "backup"
    return f"{rail.active_rail} ({role})"


def echo_responder_text(c: pb.ResponderCounters) -> str:
    return (f"{c.answered} answered; refused {c.refused_address} (not a rail address), "
            f"{c.refused_source} (source not allowed); {c.rate_limited} rate-limited, "
            f"{c.malformed} malformed")


def render_status(st: pb.DaemonStatus) -> str:
    verdicts = {p.port: p.verdict for p in st.ports}
    if st.last_reconcile_at:
        last = f"last {duration(st.served_at - st.last_reconcile_at)} ago"
    else:
        last = "none yet"
    head = key_values(
        [
            ("host", st.hostname),
            ("version", st.version),
            ("uptime", f"{duration(st.served_at - st.started_at)} (since {wall_time(st.started_at)})"),
            ("config", st.config_source),
            ("reconciles", f"{st.reconciles} ({last})"),
            ("netlink writes", str(st.netlink_writes)),
            ("last error", (f"{_one_line(st.last_error)} ({duration(st.served_at - st.last_error_at)} ago)"
                            if st.last_error and st.last_error_at else
                            _one_line(st.last_error) if st.last_error else "-")),
            *([("echo responder", echo_responder_text(st.responder))]
              if st.HasField("responder") else []),
        ]
    )
    rails = table(
        ["RAIL", "PORT", "VERDICT", "TABLE", "ACTIVE PATH"],
        [
            [r.name, r.port, verdict_name(verdicts.get(r.port, pb.VERDICT_UNSPECIFIED)), str(r.table), active_path(r)]
            for r in st.rails
        ],
    )
    parts = [head, rails]
    if st.groups:
        parts.append(
            table(
                ["GROUP", "DESTINATION", "TABLE", "MIN PATHS", "MEMBERS"],
                [
                    [g.name, g.destination, str(g.table), str(g.min_paths), ",".join(g.members) or "NONE"]
                    for g in st.groups
                ],
            )
        )
    else:
        parts.append("no multipath groups")
    if st.problems:
        parts.append(table(
            ["PROBLEM", "WHAT", "SINCE", "DETAIL"],
            [[p.kind, p.what, f"{duration(st.served_at - p.since)} ago"
              + (f" ({p.attempts} attempts)" if p.attempts else ""), _one_line(p.detail)]
             for p in st.problems]))
    return "\n\n".join(parts)


def render_links(resp: pb.ListLinksResponse) -> str:
    def yn(flag: bool) -> str:
        return "yes" if flag else "no"

    rows = []
    for row in resp.links:
        link, state = row.link, row.state
        judged = state.verdict != pb.VERDICT_UNSPECIFIED
        rows.append(
            [
                row.port,
                ",".join(row.rails) or "-",
                yn(link.present),
                ("up" if link.admin_up else "down") if link.present else "-",
                yn(link.carrier) if link.present else "-",
                link.operstate if link.present else "-",
                str(link.carrier_up_count),
                str(link.carrier_down_count),
                verdict_name(state.verdict),
                state.phase or "-",
                since_text(state.since, resp.served_at) if judged else "-",
                "; ".join(state.evidence) or "-",
            ]
        )
    links = table(
        ["PORT", "RAIL", "PRESENT", "ADMIN", "CARRIER", "OPERSTATE", "UPS", "DOWNS",
         "VERDICT", "PHASE", "SINCE", "EVIDENCE"],
        rows,
    )
    sensors = [row.sensors for row in resp.links]
    return "\n\n".join([links, render_optics(sensors), render_counters(sensors), render_signals(sensors)])


# Marks on a reading past the module's own levels (legend printed with them).
WARN_MARK = "!"
ALARM_MARK = "!!"
NOT_REPORTED = "n/a"


def _opt(message: Message, field: str) -> float | int | str | None:
    """An optional field's value, None when it is unset (not reported)."""
    return getattr(message, field) if message.HasField(field) else None


def _lane_values(values: Sequence[struct_pb2.Value]) -> list[float | None]:
    return [v.number_value if v.WhichOneof("kind") == "number_value" else None for v in values]


def _unreadable_levels(levels: pb.Thresholds) -> bool:
    """Four equal levels: a blank threshold block (core.signals.thresholds_unreadable)."""
    values = [_opt(levels, f) for f in ("high_alarm", "high_warn", "low_warn", "low_alarm")]
    return None not in values and len(set(values)) == 1


def _mark(value: float, levels: pb.Thresholds | None) -> str:
    """Same comparisons as the health signals: strictly past a level, and
    nothing against unreadable levels."""
    if levels is None or _unreadable_levels(levels):
        return ""
    lo_alarm, lo_warn = _opt(levels, "low_alarm"), _opt(levels, "low_warn")
    hi_alarm, hi_warn = _opt(levels, "high_alarm"), _opt(levels, "high_warn")
    if (lo_alarm is not None and value < lo_alarm) or (hi_alarm is not None and value > hi_alarm):
        return ALARM_MARK
    if (lo_warn is not None and value < lo_warn) or (hi_warn is not None and value > hi_warn):
        return WARN_MARK
    return ""


def _reading(value: float | None, levels: pb.Thresholds | None, digits: int = 1) -> str:
    return NOT_REPORTED if value is None else f"{value:.{digits}f}{_mark(value, levels)}"


def _per_lane(values: Sequence[struct_pb2.Value], levels: pb.Thresholds | None) -> str:
    """Lane 0 first, space separated."""
    return " ".join(_reading(v, levels) for v in _lane_values(values)) or "-"


def _levels(optics: pb.OpticsReading, quantity: str) -> pb.Thresholds | None:
    return optics.thresholds[quantity] if quantity in optics.thresholds else None


def _low_levels(levels: pb.Thresholds | None) -> str:
    if levels is None:
        return "-"
    if _unreadable_levels(levels):
        return "unreadable"
    warn, alarm = _opt(levels, "low_warn"), _opt(levels, "low_alarm")
    if warn is None and alarm is None:
        return "-"
    return "/".join(NOT_REPORTED if v is None else f"{v:.1f}" for v in (warn, alarm))


def render_optics(sensors: Sequence[pb.PortSensors]) -> str:
    """Per port: the module and its readings against the module's own levels."""
    rows: list[list[str]] = []
    marked = False
    for s in sensors:
        if not s.HasField("optics"):
            note = f"unreadable: {_one_line(s.optics_unreadable)}" if s.optics_unreadable else "no module data"
            rows.append([s.port, note])
            continue
        o = s.optics
        module = " ".join(x for x in (o.identity.vendor, o.identity.part) if x) or "?"
        row = [
            s.port,
            module,
            _reading(_opt(o, "temperature_c"), _levels(o, "temperature_c")),
            _per_lane(o.rx_power_dbm, _levels(o, "rx_power_dbm")),
            _low_levels(_levels(o, "rx_power_dbm")),
            _per_lane(o.tx_power_dbm, _levels(o, "tx_power_dbm")),
            _per_lane(o.tx_bias_ma, _levels(o, "tx_bias_ma")),
            ",".join(o.flags) or "-",
        ]
        marked = marked or any(WARN_MARK in cell for cell in row[2:-1])
        rows.append(row)
    if not rows:
        return "OPTICS\nno ports"
    out = "OPTICS\n" + table(
        ["PORT", "MODULE", "TEMP °C", "RX dBm", "RX LOW WARN/ALARM", "TX dBm", "BIAS mA", "FLAGS"], rows
    )
    if marked:
        out += (f"\n{WARN_MARK} past the module's warning level, {ALARM_MARK} past its alarm level; "
                f"lanes from 0; {NOT_REPORTED}: not reported")
    return out


COUNTERS = [
    ("CRC", "rx_crc_errors"),
    ("SYMBOL", "symbol_errors"),
    ("LENGTH", "length_errors"),
    ("MISSED", "rx_missed"),
    ("FEC CORR", "fec_corrected"),
    ("FEC UNCORR", "fec_uncorrectable"),
    ("LINK DOWNS", "link_down_events"),
]


def render_counters(sensors: Sequence[pb.PortSensors]) -> str:
    """Counter totals as the driver reports them; n/a: the driver has no such counter."""
    rows: list[list[str]] = []
    for s in sensors:
        if not s.HasField("counters"):
            rows.append([s.port, "no counter data"])
            continue
        c = s.counters
        values = [_opt(c, field) for _, field in COUNTERS]
        ext = " / ".join(x for x in (_opt(c, "ext_state"), _opt(c, "ext_substate")) if x) or "-"
        rows.append([s.port, *(NOT_REPORTED if v is None else str(v) for v in values), ext])
    if not rows:
        return "COUNTERS\nno ports"
    return "COUNTERS\n" + table(["PORT", *(h for h, _ in COUNTERS), "LINK DOWN REASON"], rows)


def render_signals(sensors: Sequence[pb.PortSensors]) -> str:
    """Each health signal's judgement per port."""
    rows: list[list[str]] = []
    for s in sensors:
        if not s.assessments:
            rows.append([s.port, "no assessments"])
        for a in s.assessments:
            severity = verdict_name(a.severity) if a.HasField("severity") else "-"
            if a.HasField("severity") and not a.confirmed:
                severity += " (unconfirmed)"
            rows.append([s.port, a.signal, a.status, severity, _one_line(a.detail) or "-"])
    if not rows:
        return "SIGNALS\nno ports"
    return "SIGNALS\n" + table(["PORT", "SIGNAL", "STATUS", "SEVERITY", "DETAIL"], rows)


def render_explanation(e: pb.ExplainPortResponse) -> str:
    state = e.state
    evidence = list(state.evidence) or ["-"]
    head = key_values(
        [
            ("verdict", verdict_name(state.verdict)),
            ("carrier", "yes" if state.carrier else "no"),
            ("phase", state.phase or "-"),
            ("since", f"{since_text(state.since, e.served_at)} ({wall_time(state.since)})"
             if state.verdict != pb.VERDICT_UNSPECIFIED else "-"),
            ("evidence", evidence[0]),
            *(("", line) for line in evidence[1:]),
        ]
    )
    if e.consequences:
        uses = table(
            ["KIND", "NAME", "TABLE", "ROLE", "CARRIES PORT", "DETAIL"],
            [[c.kind, c.name, str(c.table), c.role, "yes" if c.carries_port else "no", c.detail or "-"]
             for c in e.consequences],
        )
    else:
        uses = "no table or group uses this port"
    return "\n\n".join([_one_line(e.summary), head, uses])


# --------------------------------------------------------------------------
# commands
# --------------------------------------------------------------------------

output_option = click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="table for people, json (proto field names, fixed keys) for scripts.",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--socket",
    "socket_path",
    metavar="PATH",
    envvar="LINKPASS_SOCKET",
    default=DEFAULT_SOCKET,
    show_default=True,
    show_envvar=True,
    help="linkpassd control socket.",
)
@click.option(
    "--timeout",
    metavar="SECONDS",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    help="Seconds to wait for linkpassd to answer.",
)
@click.version_option(__version__, prog_name="linkpassctl")
@click.pass_context
def cli(ctx: click.Context, socket_path: str, timeout: float) -> None:
    """Query the local linkpassd."""
    ctx.obj = Target(socket_path, timeout)


@cli.command()
@output_option
@click.pass_obj
def status(target: Target, output: str) -> None:
    """Daemon summary, the path each rail's table uses, multipath groups."""
    resp = target.call(lambda stub: stub.GetStatus, pb.GetStatusRequest())
    click.echo(to_json(resp.status) if output == "json" else render_status(resp.status))


@cli.command()
@output_option
@click.pass_obj
def links(target: Target, output: str) -> None:
    """Per port: link state, flap counters, health verdict with evidence, optics
    against the module's levels, error counters and each health signal."""
    resp = target.call(lambda stub: stub.ListLinks, pb.ListLinksRequest())
    click.echo(to_json(resp) if output == "json" else render_links(resp))


@cli.command()
@click.argument("port")
@output_option
@click.pass_obj
def explain(target: Target, port: str, output: str) -> None:
    """Why PORT has its verdict, and what that did to every table and group using it."""
    resp = target.call(lambda stub: stub.ExplainPort, pb.ExplainPortRequest(port=port))
    click.echo(to_json(resp) if output == "json" else render_explanation(resp))


def main() -> None:
    cli(prog_name="linkpassctl")


if __name__ == "__main__":
    main()
