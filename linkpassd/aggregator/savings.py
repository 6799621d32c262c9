"""What linkpass saved: failures absorbed and the GPU time they would have cost.

A failure is *absorbed* when a rail's table moved to another rail's path (a
`rail_path` event whose `path` is neither "none" nor the rail itself) for a
reason other than an operator's drain: traffic kept flowing where, without
linkpass, the job would have died and restarted from its checkpoint. What
that restart costs is the GPUs behind the failed port (the rail's `gpus` in
the host's inventory) x a configured restart cost (checkpoint reload + lost
progress, default 30 min).

Pure: no I/O, no clock. The store records each absorbed failure with its GPUs
and UTC day (so totals survive event retention); the server and the page turn
those day totals into GPU-hours with `summarize`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from linkpassd.core.events import EventKind

NO_PATH = "none"  # the `path` field of a rail_path event when the rail has no path at all
DRAIN_CAUSE = "drain"  # an operator moved the traffic away: nothing failed
DEFAULT_GPUS = 1  # a rail whose inventory does not say how many GPUs it carries


class _DayTotalLike(Protocol):
    day: str
    failures_absorbed: int
    gpus: int


def absorbed(kind: str, rail: str, fields: Mapping[str, str]) -> bool:
    """Whether an event records a failure linkpass absorbed: a rail that
    failed over to another rail's path (not to "none": then traffic stopped,
    nothing was absorbed; not back to itself: that is the failback), for a
    cause other than a drain (an operator's choice, not a failure), from the
    rail's own path. A move from "unknown" is a daemon that restarted while
    the rail was already failed over: that failure was counted when it
    happened, before the restart, and is not counted again."""
    if kind != EventKind.RAIL_PATH.value:
        return False
    path = fields.get("path", "")
    if not path or path == NO_PATH or path == rail or fields.get("previous", "") != rail:
        return False
    return fields.get("cause", "") != DRAIN_CAUSE


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
              today: str) -> list[tuple[str, int, float]]:
    """(day, failures absorbed, GPU-hours saved) for each of the `days` UTC
    days ending with `today` ("YYYY-MM-DD"), oldest first. A day without a
    total is there with zeros, so a chart's days line up; totals outside the
    range are ignored."""
    if days < 1:
        raise ValueError(f"days must be 1 or more, not {days}")
    try:
        last = dt.date.fromisoformat(today)
    except ValueError:
        raise ValueError(f"today must be a day as YYYY-MM-DD, not {today!r}") from None
    by_day: dict[str, tuple[int, int]] = {}
    for total in day_totals:
        failures, gpus = by_day.get(total.day, (0, 0))
        by_day[total.day] = (failures + total.failures_absorbed, gpus + total.gpus)
    summary = []
    for back in range(days - 1, -1, -1):
        day = (last - dt.timedelta(days=back)).isoformat()
        failures, gpus = by_day.get(day, (0, 0))
        summary.append((day, failures, gpu_hours(gpus, restart_cost_min)))
    return summary
