"""What linkpass saved: failures absorbed and the GPU time they would have cost.

A failure is *absorbed* when both directions of the failed rail recovered:

- **outgoing**: the rail's table moved to another rail's path (a `rail_path`
  event whose `path` is neither "none" nor the rail itself, from the rail's
  own path) for a reason other than an operator's drain (`failover`);
- **incoming**: the rail's address was withdrawn from the rail's own BGP
  session and announced through the healthy rail (an `announce` event with
  `change` "detoured", `[announce]`, docs/bgp.md) within INCOMING_WITHIN_S of
  the failover, and FRR was announcing: no `announce` event with `frr`
  "missing" was in effect at that move or came within INCOMING_WITHIN_S
  after it (FRR stopped, or zebra not importing the table).

A failover without that is counted *outgoing only*: traffic to the failed
rail's address kept arriving over the broken link, so a collective waiting
on this host may still have stalled, and no GPU time is claimed for it. A
host without `[announce]` never moves its address: each of its failovers
is outgoing only.

Without linkpass, the job would have died and restarted from its checkpoint.
What that restart costs is the GPUs behind the failed port (the rail's `gpus`
in the host's inventory) x a configured restart cost (checkpoint reload +
lost progress, default 30 min).

Pure: no I/O, no clock. The server turns each event into at most one *fact*
(`fact`); the store keeps the facts (they survive event retention) and
hands them back to `day_totals`, which pairs each failover with its boot's
address moves and FRR reports, whatever order they arrived in; the server
and the page turn the day totals into GPU-hours with `summarize`.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from linkpassd.aggregator.store import DayTotal
from linkpassd.core.events import EventKind

NO_PATH = "none"  # the `path` field of a rail_path event when the rail has no path at all
DRAIN_CAUSE = "drain"  # an operator moved the traffic away: nothing failed
DEFAULT_GPUS = 1  # a rail whose inventory does not say how many GPUs it carries
DETOURED = "detoured"  # an announce event's `change` when the address left its own rail's session
# How far apart (event times, either way) a failover and the move of its
# rail's address may be, and how long after that move an FRR failure report
# still undoes it. linkpassd moves the address in the same pass as the routes
# (milliseconds apart; a failed write is retried on the next pass), and reads
# FRR's state 1 s after each write and every 5 s (daemon.announcing).
INCOMING_WITHIN_S = 5.0


class Fact(enum.StrEnum):
    """What the accounting keeps of an event (the store's `absorbed.fact`)."""

    FAILOVER = "failover"  # outgoing: a rail's table moved to another rail's path
    DETOURED = "detoured"  # incoming: the rail's address announced through another rail
    FRR_OK = "frr_ok"  # the host's FRR announces the table again
    FRR_MISSING = "frr_missing"  # the host's FRR cannot announce (stopped, not importing)


class _DayTotalLike(Protocol):
    day: str
    failures_absorbed: int
    gpus: int
    failures_outgoing_only: int


def failover(kind: str, rail: str, fields: Mapping[str, str]) -> bool:
    """Whether an event records the outgoing half of an absorbed failure: a
    rail that failed over to another rail's path (not to "none": then
    traffic stopped, nothing was absorbed; not back to itself: that is the
    failback), for a cause other than a drain (an operator's choice, not a
    failure), from the rail's own path. A move from "unknown" is a daemon
    that restarted while the rail was already failed over: that failure was
    counted when it happened, before the restart, and is not counted again."""
    if kind != EventKind.RAIL_PATH.value:
        return False
    path = fields.get("path", "")
    if not path or path == NO_PATH or path == rail or fields.get("previous", "") != rail:
        return False
    return fields.get("cause", "") != DRAIN_CAUSE


def fact(kind: str, rail: str, fields: Mapping[str, str]) -> Fact | None:
    """The fact an event gives the accounting, or None: a failover
    (`failover`); an `announce` event that moved the rail's address off its
    own rail's session onto another rail's (`change` "detoured", `via`
    another rail); an `announce` event with FRR's state (`frr` "ok" or
    "missing")."""
    if kind == EventKind.RAIL_PATH.value:
        return Fact.FAILOVER if failover(kind, rail, fields) else None
    if kind != EventKind.ANNOUNCE.value:
        return None
    frr = fields.get("frr")
    if frr == "ok":
        return Fact.FRR_OK
    if frr is not None:
        return Fact.FRR_MISSING  # "missing", or a word a newer daemon uses: not known to work
    via = fields.get("via", "")
    if rail and fields.get("change") == DETOURED and via not in ("", NO_PATH, rail):
        return Fact.DETOURED
    return None


@dataclass(frozen=True)
class FactRow:
    """One stored fact of a host's boot."""

    host_id: str
    boot_id: str
    seq: int
    wall: float
    rail: str
    fact: str  # a Fact value (a stored row from a newer aggregator may hold another word)
    gpus: int = 0  # failovers: the GPUs behind the rail
    day: str = ""  # failovers: the UTC day of `wall`


@dataclass(frozen=True)
class Outcome:
    """A failover and whether its incoming direction recovered too."""

    failover: FactRow
    incoming: FactRow | None  # the address move paired with it (None: none within INCOMING_WITHIN_S)
    frr_ok: bool  # FRR announced that move (no "missing" in effect at it or within the window after)

    @property
    def absorbed(self) -> bool:
        return self.incoming is not None and self.frr_ok


def judge_boot(facts: Iterable[FactRow]) -> list[Outcome]:
    """Each failover among one boot's facts, paired with its address move.

    In seq order (the host's own order; arrival order does not matter), each
    failover takes the first address move of the same rail not taken by an
    earlier failover and within INCOMING_WITHIN_S of it, before or after: so
    a rail that flaps needs a move per failover. FRR's state at a move is
    the last FRR report before it (none: working, as the daemon reports
    FRR only once it is missing or back); a "missing" report up to
    INCOMING_WITHIN_S after the move also counts against it."""
    ordered = sorted(facts, key=lambda f: f.seq)
    frr_ok_at: dict[int, bool] = {}
    working = True
    for index, f in enumerate(ordered):
        if f.fact == Fact.FRR_OK:
            working = True
        elif f.fact == Fact.FRR_MISSING:
            working = False
        elif f.fact == Fact.DETOURED:
            frr_ok_at[index] = working
    for index in list(frr_ok_at):
        move = ordered[index]
        for later in ordered[index + 1:]:
            if later.fact == Fact.FRR_MISSING and later.wall <= move.wall + INCOMING_WITHIN_S:
                frr_ok_at[index] = False
                break
    taken: set[int] = set()
    out = []
    for f in ordered:
        if f.fact != Fact.FAILOVER:
            continue
        match = next((i for i in frr_ok_at if i not in taken and ordered[i].rail == f.rail
                      and abs(ordered[i].wall - f.wall) <= INCOMING_WITHIN_S), None)
        if match is None:
            out.append(Outcome(f, None, False))
        else:
            taken.add(match)
            out.append(Outcome(f, ordered[match], frr_ok_at[match]))
    return out


def count_days(facts: Iterable[FactRow], since: float, until: float) -> list[DayTotal]:
    """Per UTC day, oldest first: the failovers with wall time in [since,
    until), absorbed or outgoing only (`judge_boot`, boot by boot). `facts`:
    those failovers and every other fact of their boots (the FRR state of a
    move can come from a report long before the range)."""
    boots: dict[tuple[str, str], list[FactRow]] = {}
    for f in facts:
        boots.setdefault((f.host_id, f.boot_id), []).append(f)
    days: dict[str, list[int]] = {}
    for boot in boots.values():
        for outcome in judge_boot(boot):
            fo = outcome.failover
            if not since <= fo.wall < until:
                continue
            count = days.setdefault(fo.day or day_of(fo.wall), [0, 0, 0])
            if outcome.absorbed:
                count[0] += 1
                count[1] += fo.gpus
            else:
                count[2] += 1
    return [DayTotal(day=day, failures_absorbed=a, gpus=g, failures_outgoing_only=o)
            for day, (a, g, o) in sorted(days.items())]


def gpus_for(inventory_rails: Iterable[Any], rail: str) -> int:
    """The GPUs behind `rail` according to a host's inventory (items with
    `.rail` and `.gpus`, e.g. linkpass.v1.RailInventory). A rail the
    inventory lacks, or one with gpus 0 (unset in proto3), counts as 1: the
    failure still happened, and one GPU is the least it can have cost."""
    for item in inventory_rails:
        if getattr(item, "rail", None) == rail:
            gpus = int(getattr(item, "gpus", 0) or 0)
            return gpus if gpus > 0 else DEFAULT_GPUS
    return DEFAULT_GPUS


def gpus_by_rail(inventory_rails: Iterable[Any]) -> dict[str, int]:
    """rail -> gpus_for(inventory_rails, rail), for every rail the inventory
    has (the server makes it once per inventory and looks events up in it;
    a rail absent from it counts DEFAULT_GPUS, as in gpus_for). The first
    item of a rail wins, as in gpus_for."""
    out: dict[str, int] = {}
    for item in inventory_rails:
        rail = getattr(item, "rail", None)
        if rail is not None and rail not in out:
            gpus = int(getattr(item, "gpus", 0) or 0)
            out[rail] = gpus if gpus > 0 else DEFAULT_GPUS
    return out


def gpu_hours(gpus: int, restart_cost_min: float) -> float:
    """GPU-hours a restart of `gpus` GPUs costs at `restart_cost_min` minutes each."""
    if gpus < 0:
        raise ValueError(f"gpus must be 0 or more, not {gpus}")
    if restart_cost_min < 0:
        raise ValueError(f"restart_cost_min must be 0 or more, not {restart_cost_min}")
    return gpus * restart_cost_min / 60.0


def day_of(wall: float) -> str:
    """The UTC day ("YYYY-MM-DD") of a unix time; the fleet's days are UTC so
    that hosts in different time zones add up to the same day."""
    return dt.datetime.fromtimestamp(wall, tz=dt.timezone.utc).strftime("%Y-%m-%d")


def summarize(day_totals: Iterable[_DayTotalLike], restart_cost_min: float, days: int,
              today: str) -> list[tuple[str, int, float, int]]:
    """(day, failures absorbed, GPU-hours saved, failures outgoing only) for
    each of the `days` UTC days ending with `today` ("YYYY-MM-DD"), oldest
    first. A day without a total is there with zeros, so a chart's days line
    up; totals outside the range are ignored. Only absorbed failures save
    GPU-hours."""
    if days < 1:
        raise ValueError(f"days must be 1 or more, not {days}")
    try:
        last = dt.date.fromisoformat(today)
    except ValueError:
        raise ValueError(f"today must be a day as YYYY-MM-DD, not {today!r}") from None
    by_day: dict[str, tuple[int, int, int]] = {}
    for total in day_totals:
        failures, gpus, outgoing = by_day.get(total.day, (0, 0, 0))
        by_day[total.day] = (failures + total.failures_absorbed, gpus + total.gpus,
                             outgoing + total.failures_outgoing_only)
    summary = []
    for back in range(days - 1, -1, -1):
        day = (last - dt.timedelta(days=back)).isoformat()
        failures, gpus, outgoing = by_day.get(day, (0, 0, 0))
        summary.append((day, failures, gpu_hours(gpus, restart_cost_min), outgoing))
    return summary
