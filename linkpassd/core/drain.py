"""Drains: an operator's intent to take a port out of service.

A drained port is judged DEGRADED whatever its health says (a DOWN port stays
DOWN): the policy then moves its rail's table and its group memberships onto
healthy ports while any exist, exactly as for a port that degraded by itself,
and keeps using it when nothing better is left (a drain never blackholes a
host).  The intent is the operator's, so it outlives the daemon: it is written
to `drains.json` in the state directory and read back at start, and it ends
only by an undrain or when its `until` (wall clock) passes.

Pure: the daemon's adapters read and write the file and give the time.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any, Mapping

from linkpassd.core.model import Drain, GroupStatus, PortState, RailStatus, Verdict

__all__ = ["Drain", "DrainError", "UnknownPort", "NotDrained", "DrainPending", "DrainNotTaken",
           "MAX_DURATION_S", "parse_duration", "request", "active", "apply",
           "encode", "decode", "still_carried"]

FILE_VERSION = 1
MAX_REASON = 400

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class DrainError(ValueError):
    """A drain request or the drain file is not usable; the message says why."""


class UnknownPort(DrainError):
    """The port is not a configured rail's port."""


class NotDrained(DrainError):
    """Undrain of a port that is not drained."""


class DrainPending(DrainError):
    """The change is recorded (and persisted), but its pass could not move the
    routes yet (a refused write, a failed pass): the daemon keeps retrying."""


class DrainNotTaken(DrainError):
    """The change was not recorded: the daemon stopped, or did not get to it
    in time."""


MAX_DURATION_S = 366 * 86400.0  # a drain for longer is a mistake: use no --for at all


def parse_duration(text: str) -> float:
    """'90s', '30m', '2h', '1d', '1h30m' -> seconds.  A bare number is refused
    (minutes or seconds?), and so is zero."""
    cleaned = text.strip().lower()
    if not cleaned:
        raise DrainError("duration is empty; give it with a unit, e.g. 30m, 2h or 1d")
    pos, total = 0, 0.0
    for m in _DURATION.finditer(cleaned):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if pos != len(cleaned):
        raise DrainError(f"duration {text!r} is not understood; give it with a unit, "
                         "e.g. 90s, 30m, 2h, 1d or 1h30m")
    if not total > 0 or not math.isfinite(total):
        raise DrainError(f"duration {text!r} must be more than zero")
    if total > MAX_DURATION_S:
        raise DrainError(f"duration {text!r} is more than 366 days; for a drain until "
                         "undrained give no duration")
    return total


def request(port: str, reason: str, by: str, now: float, duration_s: float | None,
            rail_ports: tuple[str, ...]) -> Drain:
    """A checked drain request: the port must be a rail's port and the reason
    must say something (it is what the next person on call reads)."""
    if port not in rail_ports:
        raise UnknownPort(f"port {port!r} is not a rail's port; rail ports: "
                         f"{', '.join(rail_ports) or 'none'}")
    reason = " ".join(reason.split())
    if not reason:
        raise DrainError("a drain needs a reason (--reason): the next person on call reads it")
    if len(reason) > MAX_REASON:
        raise DrainError(f"reason is {len(reason)} characters; at most {MAX_REASON}")
    if duration_s is not None and not (duration_s > 0 and math.isfinite(duration_s)):
        raise DrainError(f"duration must be more than zero seconds, not {duration_s!r}")
    if duration_s is not None and duration_s > MAX_DURATION_S:
        raise DrainError(f"duration {duration_s:g} s is more than 366 days; for a drain until "
                         "undrained give no duration")
    until = None if duration_s is None else now + duration_s
    return Drain(port=port, reason=reason, by=by, at=now, until=until)


def active(drains: Mapping[str, Drain], now: float) -> tuple[dict[str, Drain], list[Drain]]:
    """(still in force, expired) at `now`."""
    kept: dict[str, Drain] = {}
    gone: list[Drain] = []
    for port, d in drains.items():
        if d.until is not None and now >= d.until:
            gone.append(d)
        else:
            kept[port] = d
    return kept, gone


def apply(states: Mapping[str, PortState], drains: Mapping[str, Drain]) -> dict[str, PortState]:
    """Port states as the policy must see them: a drained UP port is DEGRADED,
    with the drain as its first evidence; a port that is worse anyway keeps
    its own reason first (health.json and nccl-env show why it is down)."""
    out = dict(states)
    for port, d in drains.items():
        state = out.get(port)
        if state is None:
            continue
        if state.verdict is Verdict.UP:  # the drain is why it is not used
            out[port] = replace(state, verdict=Verdict.DEGRADED,
                                evidence=(d.describe(),) + state.evidence, drain=d)
        else:  # its own fault comes first; the drain is noted after it
            out[port] = replace(state, evidence=state.evidence + (d.describe(),), drain=d)
    return out


def encode(drains: Mapping[str, Drain]) -> dict[str, Any]:
    return {"version": FILE_VERSION,
            "drains": [{"port": d.port, "reason": d.reason, "by": d.by, "at": d.at,
                        "until": d.until} for d in sorted(drains.values(), key=lambda d: d.port)]}


def decode(doc: object) -> dict[str, Drain]:
    """The drains a file holds; DrainError naming what is wrong otherwise."""
    if not isinstance(doc, dict) or doc.get("version") != FILE_VERSION:
        raise DrainError(f"not a version {FILE_VERSION} drain file")
    items = doc.get("drains")
    if not isinstance(items, list):
        raise DrainError("'drains' must be a list")
    out: dict[str, Drain] = {}
    for i, item in enumerate(items):
        try:
            port, reason, by = item["port"], item["reason"], item["by"]
            at, until = item["at"], item.get("until")
            if not all(isinstance(v, str) and v for v in (port, reason, by)):
                raise TypeError("port, reason and by must be non-empty strings")
            if isinstance(at, bool) or not isinstance(at, (int, float)):
                raise TypeError("at must be a number")
            if until is not None and (isinstance(until, bool) or not isinstance(until, (int, float))):
                raise TypeError("until must be a number or null")
        except (KeyError, TypeError) as exc:
            raise DrainError(f"drain {i}: {exc}") from None
        if until is not None and not (math.isfinite(until) and until <= at + MAX_DURATION_S):
            raise DrainError(f"drain {i}: until {until!r} is not within 366 days of at {at!r}")
        if not math.isfinite(at):
            raise DrainError(f"drain {i}: at {at!r} is not a time")
        out[port] = Drain(port=port, reason=reason, by=by, at=float(at),
                          until=None if until is None else float(until))
    return out


def still_carried(port: str, port_rail: str | None, rails: tuple[RailStatus, ...],
                  groups: tuple[GroupStatus, ...]) -> tuple[str, ...]:
    """Why traffic is still on a drained `port` after the pass: each table
    whose path is still the port's (no healthy alternative: a drain never
    blackholes a host), and each group that keeps it to hold its floor.
    Empty when the drain moved everything off the port."""
    notes = [f"traffic stays on {port} in rail {r.name}'s table {r.table}: "
             "no healthy alternative port"
             for r in rails if r.active_port == port]
    notes += [f"traffic stays on {port} in group {g.name} ({g.destination}): it keeps "
              f"{g.min_paths} path{'s' if g.min_paths != 1 else ''} and has no healthy port to "
              "replace it"
              for g in groups if port_rail is not None and port_rail in g.members]
    return tuple(notes)
