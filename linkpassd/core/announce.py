"""Announce: which of the host's rail addresses the fabric is told about, on
which rail (docs/bgp.md).

linkpassd decides, the host's BGP speaker (FRR) announces. A rail's address
(/32) is announced over the rail's own session while the rail carries its own
traffic; when the routing policy moves the rail's traffic to a backup rail
(any cause the health verdicts see: carrier, counters, BFD, echo, a drain),
the address is withdrawn from the rail's own session and announced over the
session of that backup rail instead, so that traffic *to* the address also
takes a healthy rail. It comes back to its own rail when the policy does,
that is after the same hold-down as the routes, in two steps: first it
*settles* (``settle_s``): still over the detour rail's session, but with
NO_EXPORT, so that leaf keeps delivering it over the host's detour port
while it withdraws the detour from the rest of the fabric; then over its own
session. Withdrawn at once, the detour's leaf would fall back to the fabric's
route for the owner's subnet (through the spine) while the spine and the
owner's leaf still held the detour: a routing loop until BGP converged
(seen in the bgp lab as ~150 ms of loss to the address, enough for the echo
probes to fail the rail again, every hold-down). So the inbound detour is the
outbound one, by construction: this module reads the policy's decision
(`RailStatus.active_rail`), it does not judge health again.

A rail with no path at all (no candidate port has carrier) is announced
nowhere: no session that could carry it is up.

Only configured rail addresses are ever planned; the adapter also refuses any
address the host does not hold (adapters.announce).

Each announcement says which rail it goes out on by its metric,
``metric_base + position of that rail in the config`` (settling:
``metric_base + number of rails + position``): that is what FRR's
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
    SETTLING = "settling"  # trusted again; still over the detour's session, NO_EXPORT, until `until`


@dataclass(frozen=True, order=True)
class Announcement:
    address: str  # the rail address, announced as a /32
    rail: str  # the rail that owns the address
    via: str  # the rail whose session announces it
    role: Role
    metric: int  # kernel route metric: says `via` (and settling or not) to FRR
    until: float = 0.0  # SETTLING: when it goes back to its own rail's session

    @property
    def prefix(self) -> str:
        return f"{self.address}/32"


def metric_of(config: Config, settings: AnnounceSettings, via: str) -> int:
    """The metric that means "announce over rail `via`"."""
    for position, rail in enumerate(config.rails):
        if rail.name == via:
            return settings.metric_base + position
    raise KeyError(via)


def settle_metric_of(config: Config, settings: AnnounceSettings, via: str) -> int:
    """The metric that means "announce over rail `via`, NO_EXPORT" (settling)."""
    return metric_of(config, settings, via) + len(config.rails)


def plan(config: Config, settings: AnnounceSettings, rails: Sequence[RailStatus],
         previous: Mapping[str, Announcement] | None = None,
         now: float = 0.0) -> dict[str, Announcement]:
    """Rail address -> its announcement, from the policy's rail statuses,
    the previous plan and the time (for settling, see the module doc).
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
        if via == rail.name:
            before = (previous or {}).get(rail.address)
            settling = _settling(config, settings, before, now)
            out[rail.address] = settling or Announcement(
                rail.address, rail.name, via, Role.OWNER, metric_of(config, settings, via))
            continue
        out[rail.address] = Announcement(rail.address, rail.name, via, Role.DETOUR,
                                         metric_of(config, settings, via))
    return out


def _settling(config: Config, settings: AnnounceSettings, before: Announcement | None,
              now: float) -> Announcement | None:
    """The settling announcement of an address whose own rail is trusted
    again, if it still settles at `now` (None: back on its own session)."""
    if before is None or settings.settle_s <= 0 or before.role is Role.OWNER:
        return None
    if before.via not in {r.name for r in config.rails}:
        return None  # the detour rail left the config: nothing to settle over
    until = before.until if before.role is Role.SETTLING else now + settings.settle_s
    if now >= until:
        return None
    return Announcement(before.address, before.rail, before.via, Role.SETTLING,
                        settle_metric_of(config, settings, before.via), until)


class Change(enum.StrEnum):
    ANNOUNCED = "announced"  # on its own rail (first time, or back from nowhere)
    DETOURED = "detoured"  # moved off its own rail onto a backup's session
    DETOUR_MOVED = "detour_moved"  # from one backup's session to another's
    SETTLING = "settling"  # own rail trusted again: NO_EXPORT over the detour's session
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
    (Role.DETOUR, Role.OWNER): (Change.RESTORED, Severity.INFO),  # settle_s = 0
    (Role.DETOUR, Role.SETTLING): (Change.SETTLING, Severity.INFO),
    (Role.SETTLING, Role.OWNER): (Change.RESTORED, Severity.INFO),
    (Role.SETTLING, Role.DETOUR): (Change.DETOURED, Severity.WARNING),
    (Role.SETTLING, None): (Change.WITHDRAWN, Severity.WARNING),
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
