"""Announce: which of the host's rail addresses the fabric is told about, on
which rail (docs/bgp.md).

linkpassd decides, the host's BGP speaker (FRR) announces. A rail's address
(/32) is announced over the rail's own session while the rail carries its own
traffic; when the routing policy moves the rail's traffic to a backup rail
(any cause the health verdicts see: carrier, counters, BFD, echo, a drain),
the address is withdrawn from the rail's own session and announced over the
session of that backup rail instead, so that traffic *to* the address also
takes a healthy rail. It comes back to its own rail when the policy does,
that is after the same hold-down as the routes. So the inbound detour is the
outbound one, by construction: this module reads the policy's decision
(`RailStatus.active_rail`), it does not judge health again.

A rail with no path at all (no candidate port has carrier) is announced
nowhere: no session that could carry it is up.

Only configured rail addresses are ever planned; the adapter also refuses any
address the host does not hold (adapters.announce).

Each announcement says which rail it goes out on by its metric,
``metric_base + position of that rail in the config``: that is what FRR's
per-neighbour route-maps match (linkpassd.announce_frr writes them).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from linkpassd.core.events import Severity
from linkpassd.core.model import AnnounceSettings, Config, RailStatus

METRIC_MAX = 0xFFFFFFFF


class Role(enum.StrEnum):
    OWNER = "owner"  # over the rail's own session
    DETOUR = "detour"  # over a backup rail's session, while the own rail is not trusted


@dataclass(frozen=True, order=True)
class Announcement:
    address: str  # the rail address, announced as a /32
    rail: str  # the rail that owns the address
    via: str  # the rail whose session announces it
    role: Role
    metric: int  # kernel route metric: says `via` to FRR

    @property
    def prefix(self) -> str:
        return f"{self.address}/32"


def metric_of(config: Config, settings: AnnounceSettings, via: str) -> int:
    """The metric that means "announce over rail `via`"."""
    for position, rail in enumerate(config.rails):
        if rail.name == via:
            return settings.metric_base + position
    raise KeyError(via)


def plan(config: Config, settings: AnnounceSettings,
         rails: Sequence[RailStatus]) -> dict[str, Announcement]:
    """Rail address -> its announcement, from the policy's rail statuses.
    Addresses with no path are absent (withdrawn everywhere)."""
    if not settings.enabled:
        return {}
    owned = {r.name: r for r in config.rails}
    out: dict[str, Announcement] = {}
    for status in rails:
        rail = owned.get(status.name)
        if rail is None or status.active_rail is None:
            continue
        via = status.active_rail
        role = Role.OWNER if via == rail.name else Role.DETOUR
        out[rail.address] = Announcement(rail.address, rail.name, via, role,
                                         metric_of(config, settings, via))
    return out


class Change(enum.StrEnum):
    ANNOUNCED = "announced"  # on its own rail (first time, or back from nowhere)
    DETOURED = "detoured"  # moved off its own rail onto a backup's session
    DETOUR_MOVED = "detour_moved"  # from one backup's session to another's
    RESTORED = "restored"  # back on its own rail
    WITHDRAWN = "withdrawn"  # announced nowhere


# (role before, role after) -> what changed and how loud: the only place the
# transitions of one address are defined. None: not announced. (DETOUR,
# DETOUR) applies only when `via` changed; equal announcements are no change.
TRANSITIONS: Mapping[tuple[Role | None, Role | None], tuple[Change, Severity]] = {
    (None, Role.OWNER): (Change.ANNOUNCED, Severity.INFO),
    (None, Role.DETOUR): (Change.DETOURED, Severity.WARNING),
    (Role.OWNER, Role.DETOUR): (Change.DETOURED, Severity.WARNING),
    (Role.DETOUR, Role.DETOUR): (Change.DETOUR_MOVED, Severity.WARNING),
    (Role.DETOUR, Role.OWNER): (Change.RESTORED, Severity.INFO),
    (Role.OWNER, None): (Change.WITHDRAWN, Severity.WARNING),
    (Role.DETOUR, None): (Change.WITHDRAWN, Severity.WARNING),
}


@dataclass(frozen=True)
class Transition:
    address: str
    rail: str
    change: Change
    severity: Severity
    before: Announcement | None
    after: Announcement | None

    @property
    def message(self) -> str:
        where = f"via {self.after.via}" if self.after else "nowhere"
        was = f"via {self.before.via}" if self.before else "nowhere"
        return f"{self.address} ({self.rail}) {self.change}: announced {where}, was {was}"


def transitions(before: Mapping[str, Announcement],
                after: Mapping[str, Announcement]) -> list[Transition]:
    """What changed between two plans, address by address (sorted)."""
    out = []
    for address in sorted(set(before) | set(after)):
        old, new = before.get(address), after.get(address)
        if old == new:
            continue
        key = (old.role if old else None, new.role if new else None)
        if key == (Role.OWNER, Role.OWNER):
            # same rail, another metric (the config's rail order changed)
            change, severity = Change.ANNOUNCED, Severity.INFO
        else:
            change, severity = TRANSITIONS[key]
        rail = (new or old).rail  # type: ignore[union-attr]
        out.append(Transition(address, rail, change, severity, old, new))
    return out


def foreign(addresses: Iterable[str], config: Config, held: Iterable[str]) -> list[str]:
    """The addresses among `addresses` that the host may not announce: not a
    configured rail address, or not held by the host (`held`: its local
    IPv4 addresses), sorted."""
    configured = {r.address for r in config.rails}
    mine = configured & set(held)
    return sorted(a for a in set(addresses) if a not in mine)
