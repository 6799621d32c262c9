"""linkpassctl's output: pure functions from the daemon's answers to text.

Kept apart from the commands (ctl/main.py) so main stays a thin layer of
click and gRPC calls; everything here is tested without a daemon.  Ages are
computed from the daemon's `served_at`, never from this process's clock.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from google.protobuf import json_format, struct_pb2, timestamp_pb2
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message

from linkpassd._proto.linkpass.v1 import control_pb2 as pb
from linkpassd.core.model import OneWayDelay
from linkpassd.core.oneway import describe as describe_one_way
from linkpassd.ctl.terminal import safe
from linkpassd.timefmt import local_iso


def _one_line(text: str) -> str:
    return safe(" ".join(text.split())) or "(no details)"


# --------------------------------------------------------------------------
# formatting helpers (pure)
# --------------------------------------------------------------------------


def to_json(message: Message, *, indent: int | None = 2) -> str:
    """Proto field names, every field present even at its zero value, keys in
    field-number order (MessageToDict appends zero-valued fields last, which
    would make the order depend on the values). Fields with presence that are
    unset (a sensor reading that was not reported) are null, not missing, so
    the keys stay the same whatever the values; map keys are sorted.
    `indent=None`: one line (for streams, one JSON document per line)."""
    data = json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    return json.dumps(_in_field_order(message.DESCRIPTOR, data), indent=indent,
                      separators=None if indent is not None else (",", ":"))


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
    headers = [safe(h, one_line=True) for h in headers]
    rows = [[safe(c, one_line=True) for c in row] for row in rows]
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
    return "\n".join(f"{safe(k, one_line=True).ljust(width)}  {safe(v)}" for k, v in pairs)


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
    """Local ISO 8601 with the zone's offset (linkpassd.timefmt)."""
    return local_iso(unix)


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


def aggregator_rows(st: pb.DaemonStatus) -> list[tuple[str, str]]:
    """The link to linkpass-aggregator: whether this host reports to the
    fleet and, when not, why; the spool that waits; the last ack."""
    if not st.HasField("aggregator"):
        return [("aggregator", "none (standalone: no [aggregator] in the config)")]
    a = st.aggregator
    failure = f"{a.last_status}: {_one_line(a.last_error)}" if a.last_status else ""
    failed_ago = (f" ({duration(st.served_at - a.last_failure_at)} ago)"
                  if a.last_failure_at else "")
    if a.connected:
        link = (f"connected to {a.address} as host {a.host_id} "
                f"(since {wall_time(a.connected_at)})")
    elif a.refused:
        link = (f"REFUSED by {a.address} as host {a.host_id}{failed_ago}: {failure}; this host "
                "does not report to the fleet until its certificate or host_id is fixed "
                "(linkpassd --check-config compares them)")
    elif failure:
        link = f"not connected to {a.address} as host {a.host_id}{failed_ago}: {failure}"
    else:
        link = f"connecting to {a.address} as host {a.host_id}"
    spool = f"{a.spool_events} events waiting ({a.spool_bytes} bytes)"
    if a.events_dropped:
        spool += f", {a.events_dropped} lost"
    spool += f"; {a.events_sent} sent, {a.events_acked} acknowledged since the agent started"
    last_ack = (f"{wall_time(a.last_ack_at)} ({duration(st.served_at - a.last_ack_at)} ago)"
                if a.last_ack_at else "none yet")
    return [("aggregator", link), ("spool", spool), ("last ack", last_ack)]


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
            *aggregator_rows(st),
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
    drains = render_drains(st.ports, st.served_at)
    if drains:
        parts.append(drains)
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
    drains = render_drains([row.state for row in resp.links], resp.served_at)
    return "\n\n".join([links, *([drains] if drains else []), render_optics(sensors), render_counters(sensors),
                        render_signals(sensors)])


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


def path_lines(paths: Sequence[pb.Assessment]) -> list[str]:
    """Per echo path: "PEER: one-way delay towards PEER 41 us, back 38 us,
    ±0 us (clocks: shared)", or why one-way delay is not reported."""
    out = []
    for a in paths:
        peer = a.signal.removeprefix("probe:")
        if not a.HasField("one_way"):
            out.append(f"{peer}: {describe_one_way(None, peer)}")
            continue
        w = a.one_way
        delay = (OneWayDelay(refused=w.refused, samples=w.samples) if w.refused else
                 OneWayDelay(w.towards_s, w.back_s, w.bound_s, w.clocks, "", w.samples))
        out.append(_one_line(f"{peer}: {describe_one_way(delay, peer)}"))
    return out


def render_explanation(e: pb.ExplainPortResponse) -> str:
    state = e.state
    evidence = list(state.evidence) or ["-"]
    paths = path_lines(e.paths)
    head = key_values(
        [
            ("verdict", verdict_name(state.verdict)),
            ("carrier", "yes" if state.carrier else "no"),
            ("phase", state.phase or "-"),
            ("since", f"{since_text(state.since, e.served_at)} ({wall_time(state.since)})"
             if state.verdict != pb.VERDICT_UNSPECIFIED else "-"),
            ("evidence", evidence[0]),
            *(("", line) for line in evidence[1:]),
            *([("hold-down", f"until {wall_time(state.hold_until)} "
                              f"(in {duration(max(0.0, state.hold_until - e.served_at))}); the "
                              "verdict changes then if the port stays good")]
              if state.hold_until else []),
            *([("drained", drain_text(state.drain, e.served_at))] if state.HasField("drain") else []),
            *([("paths", paths[0])] if paths else []),
            *(("", line) for line in paths[1:]),
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
    summary = _one_line(e.summary)
    if state.hold_until:
        summary += f" In hold-down until {wall_time(state.hold_until)}."
    return "\n\n".join([summary, head, uses])


# --------------------------------------------------------------------------
# drains and events
# --------------------------------------------------------------------------


def unix(ts: timestamp_pb2.Timestamp) -> float:
    return ts.seconds + ts.nanos / 1e9


def drain_text(d: pb.DrainInfo, served_at: float | None = None) -> str:
    """'by alice (uid 1000) 10m00s ago, until 2027-01-15T09:00:00+00:00 (in 50m00s): optic swap'.
    Without `served_at` (a Drain answer has none) the times are absolute only."""
    since = wall_time(unix(d.since))
    if served_at is not None:
        since = f"{duration(served_at - unix(d.since))} ago"
    if not d.HasField("until"):
        until = "until undrained"
    elif served_at is not None:
        until = f"until {wall_time(unix(d.until))} (in {duration(unix(d.until) - served_at)})"
    else:
        until = f"until {wall_time(unix(d.until))}"
    return f"by {d.by} {'since ' if served_at is None else ''}{since}, {until}: {_one_line(d.reason)}"


def render_drains(states: Sequence[pb.PortState], served_at: float) -> str:
    """The drained ports (who, since when, until when, why); "" when none is."""
    rows = []
    for state in states:
        if not state.HasField("drain"):
            continue
        d = state.drain
        rows.append([state.port, d.by, f"{duration(served_at - unix(d.since))} ago",
                     (f"{wall_time(unix(d.until))} (in {duration(unix(d.until) - served_at)})"
                      if d.HasField("until") else "undrain"), _one_line(d.reason)])
    return table(["DRAINED", "BY", "SINCE", "UNTIL", "REASON"], rows) if rows else ""


def render_drain_change(state: pb.PortState, *, undrained: bool = False,
                        replaced: pb.DrainInfo | None = None, notes: Sequence[str] = ()) -> str:
    """What a Drain or Undrain answer says: what changed (and the drain it
    replaced), the verdict now, and why traffic is still on the port."""
    if undrained:
        head = (f"{state.port} undrained; still drained {drain_text(state.drain)}"
                if state.HasField("drain") else f"{state.port} undrained")
    else:
        head = f"{state.port} drained {drain_text(state.drain)}"
    lines = [head]
    if replaced is not None:
        lines.append(f"replaces the earlier drain {drain_text(replaced)}")
    evidence = "; ".join(state.evidence) or "-"
    lines.append(f"verdict now {verdict_name(state.verdict)} ({state.phase or '-'}): {evidence}")
    lines += list(notes)
    return "\n".join(lines)


def render_fences(resp: pb.ListFencesResponse) -> str:
    """`linkpassctl fences`: whether fencing is on and how it is bounded,
    then one row per rail port (its summary says what happens next)."""
    if not resp.enabled:
        head = "fencing off ([fence] enabled = false): linkpassd fences no port"
    else:
        grant = ("only with the aggregator's leaf grant" if resp.require_leaf_grant
                 else "on the host's own checks")
        head = f"fencing on: at most {resp.max_fenced} port(s) of this host, {grant}"
    rows = [(f.port, f.rail, f.state, str(f.fences), f.summary) for f in resp.fences]
    return head + "\n" + table(("PORT", "RAIL", "STATE", "FENCES", "WHAT NEXT"), rows)


def render_unfence(f: pb.FenceInfo) -> str:
    return f"{f.port} ({f.rail}): {f.summary}"


def _enum_word(enum_type: object, value: int, prefix: str) -> str:
    try:
        return enum_type.Name(value).removeprefix(prefix).lower()  # type: ignore[attr-defined]
    except ValueError:  # a value newer than this release (or a host's invention)
        return str(value)


def event_line(e: pb.Event) -> str:
    """One event on one line: time (local, ms, with offset), seq, severity, kind, port/rail,
    message.  Fixed-width leading columns, so `--follow` output lines up
    without knowing what comes next."""
    t = unix(e.time)
    stamp = local_iso(t, ms=True)
    where = safe("/".join(x for x in (e.port, e.rail) if x), one_line=True) or "-"
    severity = _enum_word(pb.Severity, e.severity, "SEVERITY_")
    kind = _enum_word(pb.EventKind, e.kind, "EVENT_KIND_")
    return f"{stamp}  #{e.seq:<6} {severity:<7}  {kind:<16}  {where:<14}  {_one_line(e.message or e.name)}"


def missed_warning(missed: int) -> str:
    return (f"warning: {missed} event{'s' if missed != 1 else ''} missed "
            "(linkpassd no longer holds them; its buffer moved on)")


def render_events(resp: pb.ListEventsResponse) -> str:
    if not resp.events:
        return f"no events after this point (boot {resp.boot_id}, newest #{resp.last_seq})"
    return "\n".join(event_line(e) for e in resp.events)
