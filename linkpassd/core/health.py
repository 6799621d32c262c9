"""Port health: link samples over time -> a verdict per port, with evidence.

A port is judged by a small state machine whose transitions are listed in one
table (`TRANSITIONS`), so every path through it can be read and tested.
Carrier loss is definitive (fall count, default 1); recovery is not trusted
until the port has been good for `rise` consecutive samples *and* for the
hold-down time, because links that come back often go away again.

Only `now` tells time here; the daemon passes its monotonic clock in.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from linkpassd.core.model import LinkSample, PortState, Timers, Verdict


class Phase(enum.StrEnum):
    UP = "UP"  # healthy and trusted
    FAILING = "FAILING"  # bad samples seen, fewer than `fall`
    DOWN = "DOWN"  # not usable
    RECOVERING = "RECOVERING"  # good again, serving rise count and hold-down


class Signal(enum.StrEnum):
    GOOD = "GOOD"
    BAD = "BAD"


class Guard(enum.StrEnum):
    """Conditions a transition may depend on (evaluated by `_guard`)."""

    ALWAYS = "always"
    FALL_REACHED = "fall_reached"
    FALL_NOT_REACHED = "fall_not_reached"
    RISE_AND_HOLD_DONE = "rise_and_hold_done"
    RISE_OR_HOLD_PENDING = "rise_or_hold_pending"


# (phase, signal) -> ordered [(guard, next phase)]; the first guard that holds wins.
TRANSITIONS: dict[tuple[Phase, Signal], tuple[tuple[Guard, Phase], ...]] = {
    (Phase.UP, Signal.GOOD): ((Guard.ALWAYS, Phase.UP),),
    (Phase.UP, Signal.BAD): (
        (Guard.FALL_REACHED, Phase.DOWN),
        (Guard.FALL_NOT_REACHED, Phase.FAILING),
    ),
    (Phase.FAILING, Signal.GOOD): ((Guard.ALWAYS, Phase.UP),),
    (Phase.FAILING, Signal.BAD): (
        (Guard.FALL_REACHED, Phase.DOWN),
        (Guard.FALL_NOT_REACHED, Phase.FAILING),
    ),
    (Phase.DOWN, Signal.GOOD): (
        (Guard.RISE_AND_HOLD_DONE, Phase.UP),
        (Guard.RISE_OR_HOLD_PENDING, Phase.RECOVERING),
    ),
    (Phase.DOWN, Signal.BAD): ((Guard.ALWAYS, Phase.DOWN),),
    (Phase.RECOVERING, Signal.GOOD): (
        (Guard.RISE_AND_HOLD_DONE, Phase.UP),
        (Guard.RISE_OR_HOLD_PENDING, Phase.RECOVERING),
    ),
    (Phase.RECOVERING, Signal.BAD): ((Guard.ALWAYS, Phase.DOWN),),
}

VERDICT_OF_PHASE = {
    Phase.UP: Verdict.UP,
    Phase.FAILING: Verdict.UP,  # not yet confirmed: moving traffic on one sample is a false failover
    Phase.DOWN: Verdict.DOWN,
    Phase.RECOVERING: Verdict.DOWN,  # carrier back, but not trusted yet
}


@dataclass(frozen=True)
class PortHealth:
    """Everything the state machine remembers about one port."""

    port: str
    phase: Phase
    since: float  # when the verdict last changed
    bad_streak: int = 0
    good_streak: int = 0
    good_since: float = 0.0  # start of the current unbroken good run
    last: LinkSample | None = None
    reason: str = ""

    @property
    def verdict(self) -> Verdict:
        return VERDICT_OF_PHASE[self.phase]


def initial(sample: LinkSample, now: float) -> PortHealth:
    """First sight of a port. A port that is healthy when the daemon starts is
    trusted at once: a restart must not impose a hold-down (and churn) on
    paths that were fine all along."""
    if sample.healthy:
        return PortHealth(sample.port, Phase.UP, now, good_streak=1, good_since=now,
                          last=sample, reason="healthy at start")
    return PortHealth(sample.port, Phase.DOWN, now, bad_streak=1, last=sample,
                      reason=describe_bad(sample))


def observe(state: PortHealth, sample: LinkSample, now: float, timers: Timers) -> PortHealth:
    """Feed one sample. A carrier-down counter that moved while we were not
    looking (a flap shorter than our sampling, or events lost to ENOBUFS) counts
    as a bad sample before the current one."""
    if (state.last is not None and sample.healthy
            and sample.carrier_down_count > state.last.carrier_down_count):
        flapped = replace(sample, carrier=False)
        state = _step(state, Signal.BAD, now, timers,
                      f"carrier flapped unseen (down count {state.last.carrier_down_count}"
                      f"->{sample.carrier_down_count})", flapped)
    signal = Signal.GOOD if sample.healthy else Signal.BAD
    reason = "link healthy" if signal is Signal.GOOD else describe_bad(sample)
    return _step(state, signal, now, timers, reason, sample)


def describe_bad(sample: LinkSample) -> str:
    if not sample.present:
        return "interface missing"
    if not sample.admin_up:
        return "interface administratively down"
    if not sample.carrier:
        return f"no carrier (operstate {sample.operstate})"
    return "unhealthy"


def _step(state: PortHealth, signal: Signal, now: float, timers: Timers,
          reason: str, sample: LinkSample) -> PortHealth:
    if signal is Signal.GOOD:
        good_streak = state.good_streak + 1
        good_since = state.good_since if state.good_streak else now
        bad_streak = 0
    else:
        good_streak, good_since = 0, 0.0
        bad_streak = state.bad_streak + 1
    probe = replace(state, good_streak=good_streak, good_since=good_since,
                    bad_streak=bad_streak, last=sample)
    for guard, target in TRANSITIONS[(state.phase, signal)]:
        if _guard(guard, probe, now, timers):
            break
    else:  # pragma: no cover - the table is total; a test proves it
        raise AssertionError(f"no transition for {state.phase} on {signal}")
    if VERDICT_OF_PHASE[target] != state.verdict:
        return replace(probe, phase=target, since=now, reason=reason)
    # The reason explains the verdict, so it is kept while the verdict holds.
    return replace(probe, phase=target)


def _guard(guard: Guard, s: PortHealth, now: float, timers: Timers) -> bool:
    if guard is Guard.ALWAYS:
        return True
    if guard is Guard.FALL_REACHED:
        return s.bad_streak >= timers.fall
    if guard is Guard.FALL_NOT_REACHED:
        return s.bad_streak < timers.fall
    done = s.good_streak >= timers.rise and now - s.good_since >= timers.hold_down_s
    return done if guard is Guard.RISE_AND_HOLD_DONE else not done


def port_state(state: PortHealth, now: float, timers: Timers) -> PortState:
    """The verdict and its evidence, as the policy and the operator see it."""
    last = state.last
    carrier = bool(last and last.healthy)
    evidence = [state.reason] if state.reason else []
    if last is not None and last.present:
        evidence.append(f"carrier {'up' if last.carrier else 'down'}, operstate {last.operstate}, "
                        f"carrier up/down counts {last.carrier_up_count}/{last.carrier_down_count}")
    if state.phase is Phase.RECOVERING:
        remaining = max(0.0, timers.hold_down_s - (now - state.good_since))
        evidence.append(f"recovering: {state.good_streak}/{timers.rise} good samples, "
                        f"hold-down {remaining:.1f}s of {timers.hold_down_s:.1f}s left")
    elif state.phase is Phase.FAILING:
        evidence.append(f"failing: {state.bad_streak}/{timers.fall} bad samples")
    return PortState(port=state.port, verdict=state.verdict, carrier=carrier,
                     phase=str(state.phase), since=state.since, evidence=tuple(evidence))
