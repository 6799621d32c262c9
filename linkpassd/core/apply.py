"""Applying a plan so that one refused write stalls nothing else, in waves of independent writes.

The planner (core.plan) orders operations make-before-break. Applying them
must not stop at the first error: a foreign nexthop squatting on one of our
ids, or a foreign route in one of our tables, would otherwise block every
unrelated failover behind it, tick after tick. Instead each operation is
checked against the kernel as it stands after the writes that succeeded:

  * a create or replace whose references are missing (a group whose member
    nexthop was refused, a route through such a group) is skipped: it would
    be refused too;
  * a delete of a nexthop or group that a route or group still uses is
    skipped: the kernel would flush that route with it, and a route we could
    have kept must not go (this is what keeps the old group alive when the
    route could not be moved to the new one);
  * an operation that failed recently waits out its backoff, while every
    other operation goes ahead at once.

Operations that do not depend on each other are sent together, a wave at a
time (`joins_wave`): the daemon does not wait for one acknowledgement before
it sends the next, so a failover that changes a rail's table and the fabric
group moves both at once, not one round trip after the other. The kernel may
take a wave's writes in any order, which is why a wave holds only writes
that do not depend on each other: an operation joins the wave in flight only
when it is valid both before the wave and after it (so it is valid whichever
of the wave's writes the kernel takes or refuses, and would have been sent one
at a time just the same), and when it neither writes what a write of the wave
writes or refers to, nor refers to what one writes. A route and a rule write
their table too, so the plan's make-before-break order within a table (its
routes in place before the rule that sends traffic to it, the rule gone before
them) and between a route or group and the group or nexthops it uses is kept
across waves. Otherwise the wave is finished first and the operation is
judged against what the kernel took.

Everything here is a pure function of the operation, the simulated kernel
view, the failures remembered so far and `now`; the daemon does the writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from linkpassd.core.model import KernelState, Nexthop, NexthopGroup, Op, OpKind, Route, Rule
from linkpassd.core.plan import KernelSemanticsError, simulate

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0


@dataclass(frozen=True)
class Failure:
    """An operation the kernel refused, remembered until it succeeds or is no
    longer wanted."""

    op: Op
    error: str
    foreign: bool  # a foreign object is in the way (a conflict, not a stale view)
    since: float  # first refusal
    attempts: int
    retry_at: float


def backoff_s(attempts: int) -> float:
    """0.5 s after the first refusal, doubling, at most 30 s."""
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0 ** max(0, attempts - 1))


def refused(previous: Failure | None, op: Op, error: str, foreign: bool, now: float) -> Failure:
    attempts = previous.attempts + 1 if previous else 1
    return Failure(op=op, error=error, foreign=foreign,
                   since=previous.since if previous else now, attempts=attempts,
                   retry_at=now + backoff_s(attempts))


def in_backoff(op: Op, failures: dict[Op, Failure], now: float) -> bool:
    """`op` was refused and waits out its backoff."""
    failure = failures.get(op)
    return failure is not None and now < failure.retry_at


def blocked(op: Op, view: KernelState, failures: dict[Op, Failure], now: float) -> str | None:
    """Why `op` must not be sent now, or None when it may go."""
    failure = failures.get(op)
    if failure is not None and in_backoff(op, failures, now):
        return f"refused {failure.attempts}x, retrying in {failure.retry_at - now:.1f}s"
    if op.kind is OpKind.DELETE and isinstance(op.obj, (Nexthop, NexthopGroup)):
        users = users_of(view, op.obj.id)
        if users:
            return f"still used by {users[0]}"
    try:
        simulate(view, op)
    except KernelSemanticsError as exc:
        return f"depends on what is not in place: {exc}"
    return None


def joins_wave(op: Op, view: KernelState, wave: list[Op], wave_view: KernelState,
               now: float) -> bool:
    """Whether `op` may go with `wave`, the writes sent since the kernel last
    answered: `view` is the kernel before them, `wave_view` after them all.
    Valid against both, and independent of every write of the wave (neither
    writes what the other writes or refers to), it is valid against whatever
    part of the wave the kernel takes, in whatever order: each object changes
    at most once in a wave, so what `op` needs holds before and after every
    write of it."""
    writes, refers = _writes(op.obj), _refers(op.obj)
    for other in wave:
        theirs = _writes(other.obj)
        if writes & (theirs | _refers(other.obj)) or refers & theirs:
            return False
    return blocked(op, view, {}, now) is None and blocked(op, wave_view, {}, now) is None


def _writes(obj: Nexthop | NexthopGroup | Route | Rule) -> frozenset[tuple[str, object]]:
    """What a write of `obj` changes: the object (nexthops and groups share one
    id space), and for a route or rule the table's make-before-break order."""
    if isinstance(obj, (Nexthop, NexthopGroup)):
        return frozenset({("id", obj.id)})
    if isinstance(obj, Route):
        return frozenset({("route", obj.key), ("table", obj.table)})
    return frozenset({("rule", obj), ("table", obj.table)})


def _refers(obj: Nexthop | NexthopGroup | Route | Rule) -> frozenset[tuple[str, object]]:
    """The objects a write of `obj` needs in place: a group's members, a route's nexthop."""
    if isinstance(obj, NexthopGroup):
        return frozenset(("id", m) for m in obj.members)
    if isinstance(obj, Route):
        return frozenset({("id", obj.nhid)})
    return frozenset()


def users_of(view: KernelState, nh_id: int) -> list[str]:
    """Routes and groups that reference nexthop id `nh_id`."""
    out = [f"route {r.dst} table {r.table}" for r in sorted(view.routes) if r.nhid == nh_id]
    out += [f"group {g.id}" for g in sorted(view.groups) if nh_id in g.members]
    return out


def prune(failures: dict[Op, Failure], planned: list[Op]) -> dict[Op, Failure]:
    """Failures of operations the plan no longer contains are forgotten: the
    desired state moved on (or the kernel already has what we wanted)."""
    wanted = set(planned)
    return {op: f for op, f in failures.items() if op in wanted}


def describe(op: Op) -> str:
    """What and where, for status and logs: `route 0.0.0.0/0 table 10100`."""
    obj = op.obj
    if isinstance(obj, Route):
        return f"{op.kind} route {obj.dst} table {obj.table}"
    if isinstance(obj, NexthopGroup):
        return f"{op.kind} nexthop group {obj.id}"
    if isinstance(obj, Nexthop):
        return f"{op.kind} nexthop {obj.id} ({obj.port} via {obj.gateway})"
    return f"{op.kind} rule priority {obj.priority} table {obj.table}"


def next_retry(failures: dict[Op, Failure]) -> float | None:
    return min((f.retry_at for f in failures.values()), default=None)

