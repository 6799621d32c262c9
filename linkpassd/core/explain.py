"""Why is this port in or out of use, and what did that do to the routing?

`linkpassctl explain PORT` answers from this: the verdict and its evidence
(from health), and every routing object the port takes part in (from the
policy's decision), with what uses it now.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from linkpassd.core.model import Assessment, Config, PortState, Verdict
from linkpassd.core.policy import Decision


@dataclass(frozen=True)
class Consequence:
    kind: str  # "rail-table" or "group"
    name: str  # the rail or group
    table: int
    role: str  # "primary", "backup 1", "member"
    carries_port: bool  # does this table or group send traffic through the port now?
    detail: str


@dataclass(frozen=True)
class Explanation:
    port: str
    rail: str
    state: PortState
    consequences: tuple[Consequence, ...]
    summary: str
    # Each echo path of the port as its prober judges it now (direction,
    # one-way delays); the daemon adds them (they are not the verdict's).
    paths: tuple[Assessment, ...] = ()


def explain(config: Config, decision: Decision, ports: Mapping[str, PortState],
            port: str) -> Explanation | None:
    """None when the port is not one of the configured rails' ports."""
    rail = next((r for r in config.rails if r.port == port), None)
    state = ports.get(port)
    if rail is None or state is None:
        return None
    active = {r.name: r for r in decision.rails}
    out: list[Consequence] = []

    own = active[rail.name]
    if own.active_rail == rail.name:
        detail = f"table {rail.table} routes through this port"
    elif own.active_rail:
        detail = f"table {rail.table} routes through {own.active_rail} ({own.active_port}) instead"
    else:
        detail = f"table {rail.table} has no route: no candidate port has carrier"
    out.append(Consequence("rail-table", rail.name, rail.table, "primary",
                           own.active_rail == rail.name, detail))

    for other in config.rails:
        if rail.name not in other.backups:
            continue
        rank = other.backups.index(rail.name) + 1
        now = active[other.name].active_rail
        uses = now == rail.name
        detail = (f"{other.name}'s table {other.table} fails over through this port now" if uses
                  else f"{other.name}'s table {other.table} uses {now or 'no path'}")
        out.append(Consequence("rail-table", other.name, other.table, f"backup {rank}", uses, detail))

    groups = {g.name: g for g in decision.groups}
    for mp in config.multipath:
        if rail.name not in mp.rails:
            continue
        members = groups[mp.name].members
        member = rail.name in members
        if member and state.verdict is not Verdict.UP:
            detail = (f"kept in {mp.destination} despite {state.verdict}: capacity floor "
                      f"min_paths={mp.min_paths}, members {', '.join(members)}")
        elif member:
            detail = f"one of {len(members)} paths to {mp.destination}: {', '.join(members)}"
        else:
            detail = (f"left out of {mp.destination}; members now "
                      f"{', '.join(members) if members else 'none'}")
        out.append(Consequence("group", mp.name, mp.table, "member", member, detail))

    carried = [c for c in out if c.carries_port]
    why = state.evidence[0] if state.evidence else ""
    if state.verdict is Verdict.UP:
        summary = (f"{port} ({rail.name}) is UP and carries "
                   + (", ".join(f"{c.name} ({c.role})" for c in carried) or "no traffic")
                   + ".")
    else:
        drained = "still carries " + ", ".join(c.name for c in carried) if carried else "carries no traffic"
        summary = f"{port} ({rail.name}) is {state.verdict} ({why}); it {drained}."
    return Explanation(port=port, rail=rail.name, state=state, consequences=tuple(out),
                       summary=summary)
