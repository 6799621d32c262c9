"""Port health: samples over time -> a verdict per port (UP, DEGRADED, DOWN),
with the evidence that produced it.

Every evaluation combines carrier (from link samples) with the debounced
signals of core.signals (counters, optics, flap dampening) into one severity,
and a small state machine decides whether the verdict moves. Its transitions
are listed in one table (`TRANSITIONS`), keyed by the current verdict and how
the evaluation compares with it:

  worse   the verdict follows once `fall` consecutive evaluations agree (carrier
          loss, fall 1 by default, is definitive; counters and optics arrive
          already confirmed by their own readings);
  better  the verdict follows only after `rise` consecutive better evaluations
          *and* `hold_down_s` of them without a break, because links that come
          back often go away again; it recovers to the worst severity seen
          during that run;
  same    nothing pending.

Only `now` tells time here; the daemon passes its monotonic clock in.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from linkpassd.core.model import (
    Assessment,
    CounterSample,
    HealthPolicy,
    LinkSample,
    OpticsReading,
    PortState,
    Timers,
    Unreadable,
    Verdict,
)
from linkpassd.core.signals import CounterHistory, OpticsHistory, Signals, worst

DEFAULT_POLICY = HealthPolicy()
_RANK = {Verdict.UP: 0, Verdict.DEGRADED: 1, Verdict.DOWN: 2}


class Relation(enum.StrEnum):
    SAME = "same"
    WORSE = "worse"
    BETTER = "better"


class Guard(enum.StrEnum):
    ALWAYS = "always"
    FALL_REACHED = "fall_reached"
    FALL_NOT_REACHED = "fall_not_reached"
    RISE_AND_HOLD_DONE = "rise_and_hold_done"
    RISE_OR_HOLD_PENDING = "rise_or_hold_pending"


class Action(enum.StrEnum):
    STAY = "stay"  # verdict unchanged, nothing pending
    PEND = "pend"  # verdict unchanged, a change is pending (FAILING / RECOVERING)
    FOLLOW = "follow"  # verdict becomes the evaluated severity
    RECOVER = "recover"  # verdict becomes the worst severity of the better run


_MOVE_WORSE = ((Guard.FALL_REACHED, Action.FOLLOW), (Guard.FALL_NOT_REACHED, Action.PEND))
_MOVE_BETTER = ((Guard.RISE_AND_HOLD_DONE, Action.RECOVER), (Guard.RISE_OR_HOLD_PENDING, Action.PEND))
_STAY = ((Guard.ALWAYS, Action.STAY),)

# (current verdict, relation of the evaluation) -> ordered (guard, action); first guard that holds wins.
TRANSITIONS: dict[tuple[Verdict, Relation], tuple[tuple[Guard, Action], ...]] = {
    (Verdict.UP, Relation.SAME): _STAY,
    (Verdict.UP, Relation.WORSE): _MOVE_WORSE,
    (Verdict.UP, Relation.BETTER): _STAY,  # nothing is better than UP
    (Verdict.DEGRADED, Relation.SAME): _STAY,
    (Verdict.DEGRADED, Relation.WORSE): _MOVE_WORSE,
    (Verdict.DEGRADED, Relation.BETTER): _MOVE_BETTER,
    (Verdict.DOWN, Relation.SAME): _STAY,
    (Verdict.DOWN, Relation.WORSE): _STAY,  # nothing is worse than DOWN
    (Verdict.DOWN, Relation.BETTER): _MOVE_BETTER,
}


@dataclass(frozen=True)
class PortHealth:
    """Everything the state machine remembers about one port."""

    port: str
    verdict: Verdict
    since: float  # when the verdict last changed
    reason: str = ""
    bad_streak: int = 0
    good_streak: int = 0
    good_since: float = 0.0
    good_worst: Verdict = Verdict.UP  # worst severity seen during the current better run
    last: LinkSample | None = None
    signals: Signals = field(default_factory=Signals)
    # Signals that must say the port is healthy before it may recover: a
    # verdict carried over a restart or a reload is held until the evidence
    # that made it is refuted by a fresh reading, never because the daemon forgot.
    awaiting: tuple[str, ...] = ()

    @property
    def phase(self) -> str:
        if self.bad_streak:
            return "FAILING"
        if self.good_streak:
            return "RECOVERING"
        return str(self.verdict)


def initial(sample: LinkSample, now: float) -> PortHealth:
    """First sight of a port. A port that is healthy when the daemon starts is
    trusted at once: a restart must not impose a hold-down (and churn) on
    paths that were fine all along."""
    if sample.healthy:
        return PortHealth(sample.port, Verdict.UP, now, reason="healthy at start", last=sample)
    return PortHealth(sample.port, Verdict.DOWN, now, reason=describe_bad(sample), last=sample)


def restore(state: PortHealth, verdict: Verdict, reason: str, awaiting: Iterable[str], now: float) -> PortHealth:
    """A port that was not trusted when the daemon last looked (a verdict file
    from before a restart, or its table found on a backup rail at adoption)
    starts as not trusted: with that verdict (or worse, if its link is bad
    now) until every signal in `awaiting` has reported it healthy, then
    `rise` good evaluations and the hold-down."""
    if verdict is Verdict.UP:
        return state
    target = worst(verdict, state.verdict) or verdict
    if state.last is not None and not state.last.healthy:
        # What the link says now comes first ("no such port", "no carrier");
        # what the last daemon knew is history.
        reason = f"{state.reason}; before this start: {reason}"
    return replace(state, verdict=target, since=now, reason=reason, bad_streak=0, good_streak=0,
                   awaiting=tuple(sorted(set(awaiting))))


SENSOR_SIGNALS = ("counters", "optics")


def reset_signals(state: PortHealth, policy: HealthPolicy = DEFAULT_POLICY, *,
                  drop: Iterable[str] = (), restart: Iterable[str] = ()) -> PortHealth:
    """The one place signals are forgotten (reloads, a new sensor backend, a
    new probe service).

    `drop`: signals that no longer exist (a probe removed from the config):
    their opinion and any proof awaited from them go. `restart`: signals
    whose source starts anew (a new sensor, a new BFD session or echo
    service): their history goes, and if their judgement was part of a bad
    verdict, the port now awaits their proof instead, so the verdict holds."""
    drop, restart = set(drop), set(restart)
    judged = {a.signal: a for a in state.signals.assessments(policy)}
    bad = {name for name in restart
           if name in judged and judged[name].effective not in (None, Verdict.UP)}
    signals = state.signals
    if "counters" in drop | restart:
        signals = replace(signals, counters=CounterHistory())
    if "optics" in drop | restart:
        signals = replace(signals, optics=OpticsHistory())
    gone = (drop | restart) - set(SENSOR_SIGNALS)
    signals = replace(signals, probes=tuple((n, a) for n, a in signals.probes if n not in gone))
    awaiting = set(state.awaiting) - drop
    if state.verdict is not Verdict.UP:
        awaiting |= bad
    return replace(state, signals=signals, awaiting=tuple(sorted(awaiting)))


def bad_signals(state: PortHealth, policy: HealthPolicy = DEFAULT_POLICY) -> tuple[str, ...]:
    """The signals behind a bad verdict (what a restart must see refuted)."""
    judged = {a.signal for a in state.signals.assessments(policy)
              if a.effective not in (None, Verdict.UP)}
    return tuple(sorted(judged | set(state.awaiting)))


EEPROM_QUIET_S = 2.0  # no module reads this long after a port's verdict changed


def eeprom_paused(state: PortHealth | None, now: float) -> str | None:
    """Why a module EEPROM read must wait, or None. Reads hold the kernel's
    RTNL lock for milliseconds per page, which would delay our own route
    writes exactly when a port is failing and its traffic is being moved; a
    port without link tells nothing through its module anyway."""
    if state is None:
        return None
    if state.last is not None and not state.last.healthy:
        return "link down"
    if state.phase == "FAILING":
        return "port failing"
    if now - state.since < EEPROM_QUIET_S:
        return "verdict just changed"
    return None


def observe(state: PortHealth, sample: LinkSample, now: float, timers: Timers,
            policy: HealthPolicy = DEFAULT_POLICY) -> PortHealth:
    """A link sample (event or periodic re-sample). A carrier loss feeds the
    flap damper; a carrier-down counter that moved while we were not looking
    (a flap shorter than our sampling, or events lost to ENOBUFS) counts as a
    bad evaluation before the current one."""
    prev = state.last
    unseen_flap = (prev is not None and sample.healthy
                   and sample.carrier_down_count > prev.carrier_down_count)
    lost_carrier = prev is not None and prev.healthy and not sample.healthy
    if unseen_flap or lost_carrier:
        state = replace(state, signals=replace(state.signals,
                                               flaps=state.signals.flaps.flap(now, policy)))
    if unseen_flap and prev is not None:  # (an unseen flap has a previous sample)
        state = _evaluate(replace(state, last=replace(sample, carrier=False)), now, timers, policy,
                          f"carrier flapped unseen (down count {prev.carrier_down_count}"
                          f"->{sample.carrier_down_count})")
    return _evaluate(replace(state, last=sample), now, timers, policy)


def observe_counters(state: PortHealth, sample: CounterSample, now: float, timers: Timers,
                     policy: HealthPolicy = DEFAULT_POLICY) -> PortHealth:
    counters = state.signals.counters.observe(sample, now, policy)
    return _evaluate(replace(state, signals=replace(state.signals, counters=counters)),
                     now, timers, policy)


def observe_optics(state: PortHealth, reading: OpticsReading | Unreadable, now: float,
                   timers: Timers, policy: HealthPolicy = DEFAULT_POLICY) -> PortHealth:
    optics = state.signals.optics.observe(reading, now, policy)
    return _evaluate(replace(state, signals=replace(state.signals, optics=optics)),
                     now, timers, policy)


def observe_probe(state: PortHealth, name: str, assessment: Assessment, now: float,
                  timers: Timers, policy: HealthPolicy = DEFAULT_POLICY) -> PortHealth:
    """A path probe's judgement (BFD session, echo prober). Probes confirm
    their own verdicts (detect multiplier, confirmation burst) before they
    report, so one report is enough here."""
    return _evaluate(replace(state, signals=state.signals.with_probe(name, assessment)),
                     now, timers, policy)


def describe_bad(sample: LinkSample) -> str:
    if not sample.present:
        return "no such port: the interface does not exist (missing, or renamed)"
    if not sample.admin_up:
        return "interface administratively down"
    if not sample.carrier:
        return f"no carrier (operstate {sample.operstate})"
    return "unhealthy"


def evaluation(state: PortHealth, policy: HealthPolicy) -> tuple[Verdict, str]:
    """The combined severity right now, and the words for it."""
    sample = state.last
    if sample is not None and not sample.healthy:
        return Verdict.DOWN, describe_bad(sample)
    judged = [a for a in state.signals.assessments(policy) if a.effective is not None]
    severity = worst(Verdict.UP, *(a.effective for a in judged)) or Verdict.UP
    if state.awaiting and _RANK[severity] < _RANK[state.verdict]:
        return state.verdict, f"awaiting proof from {', '.join(state.awaiting)}: {state.reason}"
    if severity is Verdict.UP:
        return Verdict.UP, "link healthy"
    return severity, "; ".join(f"{a.signal}: {a.detail}" for a in judged if a.effective is severity)


def _proven(state: PortHealth, policy: HealthPolicy) -> PortHealth:
    """Awaited signals that now say the port is healthy are proof given."""
    if not state.awaiting:
        return state
    up = {a.signal for a in state.signals.assessments(policy) if a.effective is Verdict.UP}
    return replace(state, awaiting=tuple(n for n in state.awaiting if n not in up))


def _evaluate(state: PortHealth, now: float, timers: Timers, policy: HealthPolicy,
              reason: str | None = None) -> PortHealth:
    flaps = state.signals.flaps.decayed(now, policy)
    state = _proven(replace(state, signals=replace(state.signals, flaps=flaps)), policy)
    severity, why = evaluation(state, policy)
    reason = reason or why
    current = state.verdict
    if _RANK[severity] > _RANK[current]:
        relation = Relation.WORSE
        state = replace(state, bad_streak=state.bad_streak + 1, good_streak=0)
    elif _RANK[severity] < _RANK[current]:
        relation = Relation.BETTER
        run = state.good_streak > 0
        state = replace(state, bad_streak=0, good_streak=state.good_streak + 1,
                        good_since=state.good_since if run else now,
                        good_worst=worst(state.good_worst, severity) or severity if run else severity)
    else:
        relation = Relation.SAME
    for guard, candidate in TRANSITIONS[(current, relation)]:
        if _guard(guard, state, severity, now, timers):
            action = candidate
            break
    else:  # pragma: no cover - the table is total; a test proves it
        raise AssertionError(f"no transition for {current} on {relation}")

    if action is Action.STAY:
        return replace(state, bad_streak=0, good_streak=0)
    if action is Action.PEND:
        return state
    target = severity if action is Action.FOLLOW else state.good_worst
    # The reason explains the verdict, so it changes only with the verdict.
    return replace(state, verdict=target, since=now, reason=reason, bad_streak=0, good_streak=0)


def _guard(guard: Guard, s: PortHealth, severity: Verdict, now: float, timers: Timers) -> bool:
    if guard is Guard.ALWAYS:
        return True
    if guard in (Guard.FALL_REACHED, Guard.FALL_NOT_REACHED):
        # Carrier loss counts evaluations (fall); the other signals were
        # already confirmed by `confirm` readings of their own.
        needed = timers.fall if severity is Verdict.DOWN else 1
        reached = s.bad_streak >= needed
        return reached if guard is Guard.FALL_REACHED else not reached
    done = s.good_streak >= timers.rise and now - s.good_since >= timers.hold_down_s
    return done if guard is Guard.RISE_AND_HOLD_DONE else not done


def port_state(state: PortHealth, now: float, timers: Timers,
               policy: HealthPolicy = DEFAULT_POLICY) -> PortState:
    """The verdict and its evidence, as the policy and the operator see it."""
    last = state.last
    carrier = bool(last and last.healthy)
    evidence = [state.reason] if state.reason else []
    hold_until = 0.0
    if state.phase == "RECOVERING":
        hold_until = state.good_since + timers.hold_down_s
        if state.reason:  # the reason is the past: say that the port is on its way back
            evidence = [f"in hold-down after: {state.reason}"]
    if last is not None and last.present:
        evidence.append(f"carrier {'up' if last.carrier else 'down'}, operstate {last.operstate}, "
                        f"carrier up/down counts {last.carrier_up_count}/{last.carrier_down_count}")
    for a in state.signals.assessments(policy):
        pending = "" if a.confirmed else " (not yet confirmed)"
        evidence.append(f"{a.signal}: {a.status}{pending}" + (f": {a.detail}" if a.detail else ""))
    if state.awaiting:
        evidence.append(f"not trusted until {', '.join(state.awaiting)} "
                        f"{'says' if len(state.awaiting) == 1 else 'say'} it is healthy")
    if state.phase == "RECOVERING":
        remaining = max(0.0, timers.hold_down_s - (now - state.good_since))
        evidence.append(f"recovering to {state.good_worst}: {state.good_streak}/{timers.rise} "
                        f"good samples, hold-down {remaining:.1f}s of {timers.hold_down_s:.1f}s left")
    elif state.phase == "FAILING":
        evidence.append(f"failing: {state.bad_streak}/{timers.fall} bad samples")
    return PortState(port=state.port, verdict=state.verdict, carrier=carrier,
                     phase=state.phase, since=state.since, evidence=tuple(evidence),
                     hold_until=hold_until)
