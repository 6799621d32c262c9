"""Applying a plan one object at a time, so one refused write stalls nothing else.

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

Everything here is a pure function of the operation, the simulated kernel
view, the failures remembered so far and `now`; the daemon does the writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from linkpassd.core.model import KernelState, Nexthop, NexthopGroup, Op, OpKind, Route
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


def blocked(op: Op, view: KernelState, failures: dict[Op, Failure], now: float) -> str | None:
    """Why `op` must not be sent now, or None when it may go."""
    failure = failures.get(op)
    if failure is not None and now < failure.retry_at:
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

