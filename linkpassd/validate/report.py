"""A validation report for people and scripts: terminal text, JSON, PNG.

Why findings first: the operator handing over a cluster needs to know what
to fix before anything else; the per-rail summary after them says what was
proven (ports checked, pairs probed, loss seen, the loss rate the burst
could resolve). JSON is the ValidationReport message itself (proto JSON
with the .proto field names), so scripts and the aggregator agree on one
schema. The PNG (matplotlib, imported only when drawing) shows hosts x rails
(ok / finding / no result) and, per rail, leaf x leaf loss.

Exit code rule (`exit_code`): 0 only when the report has no finding and
every host gave a result; otherwise ExitCode.FINDINGS (8). A host that did
not answer was not proven, so it cannot pass.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from google.protobuf import json_format

from linkpassd._proto.linkpass.v1 import fleet_pb2
from linkpassd.exitcodes import ExitCode
from linkpassd.validate.plan import CablingPlan
from linkpassd.validate.results import OK, Finding, HostResult

EVIDENCE_LINES = 6  # per finding in the terminal; JSON has all
LOSS_FLOOR = 1e-4  # the PNG's lowest loss colour (log scale)


def build_report(run_id: str, hosts: Iterable[HostResult | fleet_pb2.HostValidationResult],
                 findings: Iterable[Finding | fleet_pb2.Finding], loss_resolution: float, *,
                 started_s: float | None = None, finished_s: float | None = None) -> fleet_pb2.ValidationReport:
    """The report message; times are Unix seconds the caller read."""
    report = fleet_pb2.ValidationReport(
        run_id=run_id, loss_resolution=loss_resolution,
        hosts=[h.to_proto() if isinstance(h, HostResult) else h for h in hosts],
        findings=[f.to_proto() if isinstance(f, Finding) else f for f in findings])
    if started_s is not None:
        report.started.FromNanoseconds(round(started_s * 1e9))
    if finished_s is not None:
        report.finished.FromNanoseconds(round(finished_s * 1e9))
    return report


def exit_code(report: fleet_pb2.ValidationReport) -> int:
    """0 when nothing was found and every host answered; else FINDINGS."""
    if report.findings or any(h.status != OK for h in report.hosts):
        return int(ExitCode.FINDINGS)
    return int(ExitCode.OK)


def to_json(report: fleet_pb2.ValidationReport) -> str:
    return json_format.MessageToJson(report, preserving_proto_field_name=True, indent=2, sort_keys=True)


def from_json(text: str, source: str = "report") -> fleet_pb2.ValidationReport:
    """Read a report back; ValueError naming the source when it is not one."""
    try:
        return json_format.Parse(text, fleet_pb2.ValidationReport())
    except json_format.ParseError as exc:
        raise ValueError(f"{source}: not a ValidationReport: {exc}") from None


# --------------------------------------------------------------------------
# terminal


def render_text(report: fleet_pb2.ValidationReport) -> str:
    lines = []
    ok_hosts = sum(h.status == OK for h in report.hosts)
    lines.append(f"validation {report.run_id or '(no id)'}: {len(report.hosts)} hosts, {ok_hosts} answered"
                 + (f", {_duration(report)}" if report.HasField("started") and report.HasField("finished") else ""))
    if report.findings:
        lines.append("")
        lines.append(f"FINDINGS ({len(report.findings)}):")
        for i, f in enumerate(report.findings, start=1):
            rail = f" [{f.rail}]" if f.rail else ""
            lines.append(f"{i:>3}. {f.kind}{rail}: {f.component}  (confidence {f.confidence:.0%})")
            for text in list(f.evidence)[:EVIDENCE_LINES]:
                lines.append(f"       - {text}")
            if len(f.evidence) > EVIDENCE_LINES:
                lines.append(f"       - ... {len(f.evidence) - EVIDENCE_LINES} more (see -o json)")
            if f.fix:
                lines.append(f"       fix: {f.fix}")
    lines.append("")
    lines.append("per rail:")
    rows = _rail_rows(report)
    if not rows:
        lines.append("  (no port checked, no pair probed)")
    for rail, row in sorted(rows.items()):
        lines.append(f"  {rail}: {row['ports']} ports checked, {row['pairs']} pairs probed, {row['failed']} failing; "
                     f"low-rate loss {_loss(row['lost'], row['sent'])}, "
                     f"burst loss {_loss(row['blost'], row['bsent'])} (per round trip); {_ways(row)}; "
                     f"RTT p50 {row['p50']} us, worst p99 {row['p99']} us")
    notes = [(h.host_id, n) for h in report.hosts if h.status == OK for n in h.validation.notes]
    if notes:
        lines.append("")
        lines.append("notes (checks that ran with less than planned; the loss resolution counts what was sent):")
        lines.extend(f"  {host}: {note}" for host, note in notes[:20])
        if len(notes) > 20:
            lines.append(f"  ... {len(notes) - 20} more (see -o json)")
    silent = [h for h in report.hosts if h.status != OK]
    if silent:
        lines.append("")
        lines.append("hosts without a result: " + ", ".join(f"{h.host_id} ({h.status})" for h in silent[:20])
                     + (f" and {len(silent) - 20} more" if len(silent) > 20 else ""))
    lines.append("")
    lines.append(f"loss resolution: random loss >= {report.loss_resolution:.3%} per host port would have been seen")
    lines.append(f"{len(report.findings)} finding(s): not ready to hand over" if exit_code(report) else
                 "no finding: every checked port, cable and path is as planned")
    return "\n".join(lines)


def _duration(report: fleet_pb2.ValidationReport) -> str:
    seconds = (report.finished.ToNanoseconds() - report.started.ToNanoseconds()) / 1e9
    return f"{seconds:.1f} s"


def _loss(lost: int, sent: int) -> str:
    return f"{lost}/{sent} ({lost / sent:.2%})" if sent else "-"


def _ways(row: dict[str, int]) -> str:
    """Which way the rail's lost probes went, from the responders' receipts."""
    if not row["receipts"]:
        return "which way: unknown (no receipts from the responders: round trip only)"
    return (f"of them {row['requests']} lost sender to peer, {row['replies']} peer to sender "
            f"(receipts from {row['receipts']} of {row['pairs']} pairs)")


def _rail_rows(report: fleet_pb2.ValidationReport) -> dict[str, dict[str, int]]:
    rows: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(
        ("ports", "pairs", "failed", "sent", "lost", "bsent", "blost", "p50", "p99", "requests",
         "replies", "receipts"), 0))
    p50s: dict[str, list[int]] = defaultdict(list)
    for host in report.hosts:
        for port in host.validation.ports:
            rows[port.rail]["ports"] += 1
        for pair in host.validation.pairs:
            row = rows[pair.rail]
            row["pairs"] += 1
            lost = max(0, pair.sent - pair.received)
            row["failed"] += bool(pair.sent) and 2 * lost >= pair.sent
            row["sent"] += pair.sent
            row["lost"] += lost
            row["bsent"] += pair.burst_sent
            row["blost"] += max(0, pair.burst_sent - pair.burst_received)
            if pair.receipts:
                row["receipts"] += 1
                row["requests"] += pair.requests_lost
                row["replies"] += pair.replies_lost
            if pair.received:
                p50s[pair.rail].append(pair.rtt_p50_us)
                row["p99"] = max(row["p99"], pair.rtt_p99_us)
    for rail, values in p50s.items():
        rows[rail]["p50"] = round(statistics.median(values))
    return dict(rows)


# --------------------------------------------------------------------------
# PNG


def host_rail_status(report: fleet_pb2.ValidationReport) -> tuple[list[str], list[str], list[list[int]]]:
    """hosts, rails, and per host per rail 0 ok, 1 a finding names it, 2 no result."""
    hosts = sorted(h.host_id for h in report.hosts)
    rails = sorted({p.rail for h in report.hosts for p in h.validation.ports}
                   | {p.rail for h in report.hosts for p in h.validation.pairs}
                   | {f.rail for f in report.findings if f.rail})
    status = {h.host_id: h.status for h in report.hosts}
    flagged = {(host, f.rail) for f in report.findings for host in f.hosts}
    grid = []
    for host in hosts:
        row = []
        for rail in rails:
            if status.get(host) != OK:
                row.append(2)
            elif (host, rail) in flagged or (host, "") in flagged:
                row.append(1)
            else:
                row.append(0)
        grid.append(row)
    return hosts, rails, grid


def leaf_loss(report: fleet_pb2.ValidationReport, rail: str,
              plan: CablingPlan | None = None) -> tuple[list[str], list[list[float | None]]]:
    """Leaves of the rail and the loss between each two (None: not probed).
    Burst probes where there were any, else the low-rate phase. A host's
    leaf is the plan's switch, else the LLDP neighbour it saw, else '?'."""
    leaf_of: dict[str, str] = {}
    if plan is not None:
        leaf_of.update({p.host: p.switch for p in plan.ports if p.rail == rail})
    for host in report.hosts:
        for port in host.validation.ports:
            if port.rail == rail and host.host_id not in leaf_of:
                leaf_of[host.host_id] = port.lldp_system or "?"
    sent: dict[tuple[str, str], int] = defaultdict(int)
    lost: dict[tuple[str, str], int] = defaultdict(int)
    for host in report.hosts:
        for pair in host.validation.pairs:
            if pair.rail != rail:
                continue
            a, b = leaf_of.get(host.host_id, "?"), leaf_of.get(pair.peer_host, "?")
            n, got = (pair.burst_sent, pair.burst_received) if pair.burst_sent else (pair.sent, pair.received)
            for key in ((a, b), (b, a)) if a != b else ((a, a),):
                sent[key] += n
                lost[key] += max(0, n - got)
    leaves = sorted({x for key in sent for x in key})
    grid = [[lost[(x, y)] / sent[(x, y)] if sent.get((x, y)) else None for y in leaves] for x in leaves]
    return leaves, grid


def write_png(report: fleet_pb2.ValidationReport, path: str | Path, plan: CablingPlan | None = None) -> Path:
    """Draw the heatmaps; matplotlib is imported here only (the CLI and
    the aggregator do not need it otherwise)."""
    from matplotlib.colors import ListedColormap, LogNorm
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure state

    hosts, rails, grid = host_rail_status(report)
    per_rail = [(rail, *leaf_loss(report, rail, plan)) for rail in rails]
    columns = 1 + max(1, len(per_rail))
    fig = Figure(figsize=(4 + 3.6 * (columns - 1), max(4.0, min(14.0, 0.22 * len(hosts)))))
    axes = fig.subplots(1, columns, squeeze=False, gridspec_kw={"wspace": 0.55})
    ax = axes[0][0]
    if hosts and rails:
        ax.imshow(grid, cmap=ListedColormap(["#3a9d4a", "#d23c3c", "#9a9a9a"]), vmin=0, vmax=2,
                  aspect="auto", interpolation="nearest")
        ax.set_xticks(range(len(rails)), rails, rotation=45, ha="right", fontsize=8)
        if len(hosts) <= 64:
            ax.set_yticks(range(len(hosts)), hosts, fontsize=7)
        else:
            ax.set_ylabel(f"{len(hosts)} hosts")
    ax.set_title("hosts x rails\ngreen ok, red finding, grey no result", fontsize=9)
    image = None
    for i, (rail, leaves, loss) in enumerate(per_rail, start=1):
        ax = axes[0][i]
        if not leaves:
            ax.set_axis_off()
            continue
        values = [[max(v, LOSS_FLOOR) if v is not None else float("nan") for v in row] for row in loss]
        image = ax.imshow(values, cmap="magma_r", norm=LogNorm(vmin=LOSS_FLOOR, vmax=1.0), interpolation="nearest")
        if len(leaves) <= 16:
            ax.set_xticks(range(len(leaves)), leaves, rotation=45, ha="right", fontsize=7)
            ax.set_yticks(range(len(leaves)), leaves, fontsize=7)
            for y, row in enumerate(loss):
                for x, v in enumerate(row):
                    if v is not None:
                        ax.text(x, y, f"{v:.1%}", ha="center", va="center", fontsize=6,
                                color="white" if v > 0.05 else "black")
        ax.set_title(f"{rail}: loss leaf x leaf", fontsize=9)
    if image is not None:
        fig.colorbar(image, ax=[axes[0][i] for i in range(1, columns)], shrink=0.8, label="loss (log)")
    found = len(report.findings)
    fig.suptitle(f"validation {report.run_id}: {found} finding(s), loss resolution {report.loss_resolution:.2%}",
                 fontsize=10)
    out = Path(path)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    return out


def findings_of(report: fleet_pb2.ValidationReport) -> Sequence[Finding]:
    return [Finding.from_proto(f) for f in report.findings]
