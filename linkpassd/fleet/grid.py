"""The fleet's hosts x rails grid, from a ListHostsResponse (pure).

One place decides what a cell shows, so the web page and `linkpassctl fleet`
never disagree about a port: its rail's port from the host's inventory, that
port's verdict from the host's last PortReport, whether an operator drained
it, and whether the rail routes through another path now (failed over).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from linkpassd._proto.linkpass.v1 import control_pb2 as cpb
from linkpassd._proto.linkpass.v1 import fleet_pb2

MAX_COLUMNS = 64  # rails shown as columns; a fleet with more shows the most common ones
FENCE_PHASE = "FENCE_"  # a port's phase while its host holds it fenced: FENCE_FENCED, FENCE_TESTING
NO_REPORT = "NONE"  # no inventory port for the rail, or the port's state was never reported / judged
VERDICTS = ("UP", "DEGRADED", "DOWN", NO_REPORT)


@dataclass(frozen=True)
class Cell:
    host_id: str
    rail: str
    port: str  # "" when the host's inventory has no port for this rail
    verdict: str  # one of VERDICTS
    drained: bool
    path: str  # the path the rail's table routes through now; "" unknown, "none" no path
    connected: bool  # the host's stream is open (else the cell shows its last report)
    evidence: str  # the first reason for the verdict (a drained port's: its drain)
    direction: str = ""  # which way its troubled echo paths lose packets, in words ("": not said)
    fence: str = ""  # "FENCED" (down) or "TESTING" (up for a test) while its host fences it; "" not

    @property
    def fenced(self) -> bool:
        return bool(self.fence)

    @property
    def failed_over(self) -> bool:
        """The rail routes through another rail's port (or through none)."""
        return bool(self.path) and self.path != self.rail


@dataclass(frozen=True)
class Row:
    host: fleet_pb2.HostView
    cells: tuple[Cell, ...]  # one per Grid.rails, in that order


@dataclass(frozen=True)
class Grid:
    rails: tuple[str, ...]
    rows: tuple[Row, ...]
    hidden_rails: int = 0  # rails some host has that are not columns (over MAX_COLUMNS)

    def cell(self, host_id: str, rail: str) -> Cell:
        for row in self.rows:
            if row.host.host_id == host_id:
                return row.cells[self.rails.index(rail)]
        raise KeyError(host_id)

    def problems(self) -> list[Cell]:
        """Cells an operator looks at first: reported and not UP, drained,
        fenced, or failed over."""
        return [c for row in self.rows for c in row.cells
                if c.verdict != NO_REPORT and (c.verdict != "UP" or c.drained or c.fenced
                                               or c.failed_over)]


def natural_key(text: str) -> tuple:
    """'rail2' before 'rail10', 'gpu-9' before 'gpu-10'."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part)
                 for part in re.split(r"(\d+)", text) if part)


def verdict_word(verdict: int) -> str:
    if verdict in (cpb.VERDICT_UP, cpb.VERDICT_DEGRADED, cpb.VERDICT_DOWN):
        return cpb.Verdict.Name(verdict).removeprefix("VERDICT_")
    return NO_REPORT  # unspecified (not judged yet) or a value newer than this release


# PathState.direction of a path that loses packets, as the page says it.
DIRECTION_WORDS = {"requests": "loss towards", "replies": "replies lost from",
                   "both": "loss both ways with"}


def direction_words(paths) -> str:
    """Which way a port's troubled echo paths (down, or losing) lose
    packets, from the hosts' receipts: "loss towards 198.18.1.7, 198.18.1.9",
    "which way differs by peer", or "" when no troubled path says."""
    troubled = [p for p in paths if p.direction in DIRECTION_WORDS
                and (p.state == "down" or p.loss > 0)]
    kinds = {p.direction for p in troubled}
    if not kinds:
        return ""
    if len(kinds) > 1:
        return "which way differs by peer: " + ", ".join(
            f"{p.peer} {p.direction}" for p in sorted(troubled, key=lambda p: p.peer))
    return f"{DIRECTION_WORDS[kinds.pop()]} " + ", ".join(sorted(p.peer for p in troubled))


def fence_of(phase: str) -> str:
    """FENCED or TESTING from a port's phase ([fence], docs/fencing.md); "" otherwise."""
    return phase.removeprefix(FENCE_PHASE) if phase.startswith(FENCE_PHASE) else ""


def build(hosts: fleet_pb2.ListHostsResponse, max_columns: int = MAX_COLUMNS) -> Grid:
    """Hosts and rails in natural order; a rail any host has is a column, up
    to `max_columns` (the rails most hosts have): the page and `linkpassctl
    fleet` cost hosts x columns, and one host must not make that unbounded."""
    count: dict[str, int] = {}
    for h in hosts.hosts:
        for rail in {r.rail for r in h.rails if r.rail} | {rail for rail in h.report.rail_paths if rail}:
            count[rail] = count.get(rail, 0) + 1
    hidden = max(0, len(count) - max_columns)
    shown = count if not hidden else sorted(count, key=lambda r: (-count[r], natural_key(r)))[:max_columns]
    rails = sorted(shown, key=natural_key)
    rows = []
    for host in sorted(hosts.hosts, key=lambda h: natural_key(h.host_id)):
        port_of = {r.rail: r.port for r in host.rails}
        state_of = {p.port: p for p in host.report.ports}
        paths_of: dict[str, list[fleet_pb2.PathState]] = {}
        for path in host.report.paths:
            paths_of.setdefault(path.port, []).append(path)
        cells = []
        for rail in rails:
            port = port_of.get(rail, "")
            state = state_of.get(port) if port else None
            cells.append(Cell(
                host_id=host.host_id, rail=rail, port=port,
                verdict=verdict_word(state.verdict) if state is not None else NO_REPORT,
                drained=state is not None and state.HasField("drain"),
                path=host.report.rail_paths.get(rail, ""),
                connected=host.connected,
                evidence=(state.evidence[0] if state is not None and state.evidence else ""),
                direction=direction_words(paths_of.get(port, ())) if port else "",
                fence=fence_of(state.phase) if state is not None else "",
            ))
        rows.append(Row(host=host, cells=tuple(cells)))
    return Grid(rails=tuple(rails), rows=tuple(rows), hidden_rails=hidden)
