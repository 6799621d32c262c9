"""Fencing (``[fence]``, docs/fencing.md): a port whose failure is confirmed
for `fence_after_s` is taken down administratively, so that the leaf loses
carrier (its routes and neighbours towards this host go at once) and every
RDMA queue pair on the NIC fails at once instead of retrying into a dead
path, which lets the collective layer move them now.

One state machine per port; its transitions are listed in one table
(`TRANSITIONS`), keyed by the port's fence state and what this pass saw of
it (a `Trigger`, the first of the state's triggers in `_TRIGGERS` that
holds):

  ARMED       watching; nothing done.
  CONFIRMING  the port is DOWN with carrier (a failure the leaf cannot see)
              since `since`; fenced once that has lasted `fence_after_s`
              and a fence is allowed (`Gate`): another rail is healthy, the
              host has fenced fewer than `max_fenced` ports, the leaf's
              budget allows it.
  FENCED      taken down by linkpassd; brought up for a test after the
              backoff (`backoff_initial_s`, doubled after each failed test up
              to `backoff_max_s`).
  TESTING     up again, still treated as failed by the routing (`overlay`),
              so no traffic goes back to it; its own signals (probes) must
              say UP without a break for `test_window_s` within
              `test_timeout_s`, or it is taken down again.
  LIFTED      an operator lifted the fence (or no other rail was healthy):
              not fenced again until the port is trusted again (verdict UP)
              or `lift_hold_s` has passed.

A fenced port is released at once (LIFTED) when no other rail is healthy:
a fence never leaves a host without a working rail.

Pure: the daemon gives each port's `Sight` and `now` (its monotonic clock),
and does the returned `Action`s (adapters.fence) after recording them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from linkpassd.core.bfd import BRING_UP_S
from linkpassd.core.model import Assessment, FenceSettings, PortState, Verdict


class State(enum.StrEnum):
    ARMED = "ARMED"
    CONFIRMING = "CONFIRMING"
    FENCED = "FENCED"
    TESTING = "TESTING"
    LIFTED = "LIFTED"


class Trigger(enum.StrEnum):
    HEALTHY = "healthy"  # the port is not DOWN with carrier (or is drained)
    FAILING = "failing"  # DOWN with carrier, not for fence_after_s yet
    CONFIRMED = "confirmed"  # DOWN with carrier for fence_after_s, and the gate allows a fence
    HELD = "held"  # confirmed, but the gate does not allow a fence (the reason says why)
    LAST_RAIL = "last_rail"  # no other rail is healthy
    WAITING = "waiting"  # fenced, the backoff has not passed
    BACKOFF_DONE = "backoff_done"
    PROVING = "proving"  # testing, no verdict yet
    PROVEN = "proven"  # its own signals UP for test_window_s
    TEST_FAILED = "test_failed"  # bad again after UP, or no proof by test_timeout_s
    LIFT = "lift"  # the operator lifted the fence
    TRUSTED = "trusted"  # lifted, and the port's verdict is UP again
    HOLD_OVER = "hold_over"  # lifted, lift_hold_s has passed
    STILL_LIFTED = "still_lifted"


class Action(enum.StrEnum):
    NONE = "none"
    FENCE = "fence"  # take the port down (admin down)
    TEST = "test"  # bring it up for a test; routes stay away
    REFENCE = "refence"  # the test failed: down again, backoff doubled
    UNFENCE = "unfence"  # the port proved itself: fence over
    RELEASE = "release"  # up without proof (operator lift, last healthy rail)


# (state, trigger) -> (next state, action): the only place a fence moves.
TRANSITIONS: Mapping[tuple[State, Trigger], tuple[State, Action]] = {
    (State.ARMED, Trigger.HEALTHY): (State.ARMED, Action.NONE),
    (State.ARMED, Trigger.FAILING): (State.CONFIRMING, Action.NONE),
    (State.ARMED, Trigger.LIFT): (State.LIFTED, Action.NONE),
    (State.CONFIRMING, Trigger.HEALTHY): (State.ARMED, Action.NONE),
    (State.CONFIRMING, Trigger.FAILING): (State.CONFIRMING, Action.NONE),
    (State.CONFIRMING, Trigger.HELD): (State.CONFIRMING, Action.NONE),
    (State.CONFIRMING, Trigger.CONFIRMED): (State.FENCED, Action.FENCE),
    (State.CONFIRMING, Trigger.LIFT): (State.LIFTED, Action.NONE),
    (State.FENCED, Trigger.WAITING): (State.FENCED, Action.NONE),
    (State.FENCED, Trigger.BACKOFF_DONE): (State.TESTING, Action.TEST),
    (State.FENCED, Trigger.LAST_RAIL): (State.LIFTED, Action.RELEASE),
    (State.FENCED, Trigger.LIFT): (State.LIFTED, Action.RELEASE),
    (State.TESTING, Trigger.PROVING): (State.TESTING, Action.NONE),
    (State.TESTING, Trigger.PROVEN): (State.ARMED, Action.UNFENCE),
    (State.TESTING, Trigger.TEST_FAILED): (State.FENCED, Action.REFENCE),
    (State.TESTING, Trigger.LAST_RAIL): (State.LIFTED, Action.RELEASE),
    (State.TESTING, Trigger.LIFT): (State.LIFTED, Action.RELEASE),
    (State.LIFTED, Trigger.STILL_LIFTED): (State.LIFTED, Action.NONE),
    (State.LIFTED, Trigger.TRUSTED): (State.ARMED, Action.NONE),
    (State.LIFTED, Trigger.HOLD_OVER): (State.ARMED, Action.NONE),
    (State.LIFTED, Trigger.LIFT): (State.LIFTED, Action.NONE),
}

# The triggers each state is judged on, most urgent first; the first that holds wins.
_TRIGGERS: Mapping[State, tuple[Trigger, ...]] = {
    State.ARMED: (Trigger.LIFT, Trigger.FAILING, Trigger.HEALTHY),
    State.CONFIRMING: (Trigger.LIFT, Trigger.HEALTHY, Trigger.CONFIRMED, Trigger.HELD,
                       Trigger.FAILING),
    State.FENCED: (Trigger.LIFT, Trigger.LAST_RAIL, Trigger.BACKOFF_DONE, Trigger.WAITING),
    State.TESTING: (Trigger.LIFT, Trigger.LAST_RAIL, Trigger.PROVEN, Trigger.TEST_FAILED,
                    Trigger.PROVING),
    State.LIFTED: (Trigger.LIFT, Trigger.TRUSTED, Trigger.HOLD_OVER, Trigger.STILL_LIFTED),
}

HOLDING = (State.FENCED, State.TESTING)  # states that count against max_fenced


@dataclass(frozen=True)
class Sight:
    """What one pass sees of a port.

    `verdict` and `carrier` are the health machine's (before any fence
    overlay); `drained`: an operator drain is not a failure; `evidence`: the
    port's own signals right now, UP only when its probes (echo, BFD) say so
    (None: no word from them)."""

    verdict: Verdict
    carrier: bool
    drained: bool = False
    evidence: Verdict | None = None
    singled_out: bool = False  # the DOWN evidence is the port's own (`singled_out`)


@dataclass(frozen=True)
class Gate:
    """Whether a fence is allowed for a port beyond the host's own checks:
    the leaf's budget (from the aggregator). `reason` says why not."""

    allowed: bool
    reason: str = ""


@dataclass(frozen=True)
class Fence:
    """One port's fence state."""

    port: str
    state: State = State.ARMED
    since: float = 0.0  # when this state began (CONFIRMING: when the failure was first seen)
    reason: str = ""  # why the port is in this state
    backoff_s: float = 0.0  # the current backoff (FENCED); 0 before the first fence
    until: float = 0.0  # FENCED: when to test; TESTING: test timeout; LIFTED: end of the hold
    good_since: float | None = None  # TESTING: since when its own evidence says UP
    proved_once: bool = False  # TESTING: the evidence said UP at some point of this test
    unfenced_at: float | None = None  # when the last fence ended (for the backoff's memory)
    held: str = ""  # CONFIRMING: why the fence is held back ("" when it is not)
    lift_by: str = ""  # a lift asked for and not yet taken by `step` (who asked)
    lift_until: float = 0.0  # ... and when its hold ends
    fences: int = 0  # fences of this port since the daemon started
    asking: bool = False  # CONFIRMING, held back by the leaf's gate alone: the host asks for a grant
    # when carrier last came back after this state machine saw it gone (None:
    # never seen gone): the probes' DOWN is no gray failure until they had
    # the time to come back up over the link (`_failing`)
    carrier_back_at: float | None = None
    carrier_gone: bool = False


@dataclass(frozen=True)
class Step:
    """One transition of one port."""

    port: str
    before: State
    after: State
    trigger: Trigger
    action: Action
    reason: str


def initial(port: str) -> Fence:
    return Fence(port)


def resumed(port: str, backoff_s: float, settings: FenceSettings, now: float) -> Fence:
    """A port this daemon's predecessor fenced (its file): it is brought up
    and tested at once, as after a backoff, so a restart never leaves a port
    down without an owner and never trusts it without its own proof."""
    return Fence(port, State.TESTING, now, "fenced before this start: brought up for a test",
                 backoff_s=min(max(backoff_s, settings.backoff_initial_s), settings.backoff_max_s),
                 until=now + settings.test_timeout_s)


def lift(fence: Fence, hold_s: float, now: float, who: str = "operator") -> Fence:
    """The operator's lift, applied by the next `step` (LIFT trigger)."""
    return replace(fence, lift_by=who, lift_until=now + hold_s)


def singled_out(probes: Iterable[tuple[str, Assessment]], echo_signal: str,
                min_echo_peers: int) -> bool:
    """Whether the port's DOWN evidence points at the port rather than at
    what is behind it: a single-hop BFD session with its leaf down (the
    link or the leaf itself), or the rail's echo paths to at least
    `min_echo_peers` peers all down. Echo paths to one peer cannot tell that
    peer's failure from ours: a host whose only peer on a rail is
    blackholed sees exactly what the blackholed host sees, and fencing it
    would take a healthy port down."""
    for name, a in probes:
        if a.effective is not Verdict.DOWN:
            continue
        if name != echo_signal or a.witnesses >= min_echo_peers:
            return True
    return False


def _failing(s: Sight, f: Fence, now: float) -> bool:
    """A failure the leaf cannot see: DOWN while the link has carrier, and
    the port's own probes say DOWN now, with evidence that singles the port
    out (`singled_out`): fenced on probe evidence only, as it is unfenced
    only on probe evidence. Two DOWNs are recoveries, not failures:
    - a DOWN verdict in its hold-down (the probes UP again, the routes not
      back yet): counting it would fence a port for a hiccup plus its
      hold-down;
    - the probes' DOWN within BRING_UP_S of carrier coming back: after a
      cable pull or a flap the leaf saw the failure, and a BFD session takes
      up to 2 s at its slow-start rate to come back up over the link
      (core.bfd.BRING_UP_S); counting that would fence a port that just
      healed (seen in the failover bench after every cable pull)."""
    settling = f.carrier_back_at is not None and now - f.carrier_back_at < BRING_UP_S
    return (s.verdict is Verdict.DOWN and s.carrier and not s.drained
            and s.evidence is Verdict.DOWN and s.singled_out and not settling)


def _triggered(trigger: Trigger, f: Fence, s: Sight, cfg: FenceSettings, now: float,
               why_not: str) -> bool:
    if trigger is Trigger.LIFT:
        return bool(f.lift_by)
    if trigger is Trigger.HEALTHY:
        return not _failing(s, f, now)
    if trigger is Trigger.FAILING:
        return _failing(s, f, now)
    if trigger is Trigger.CONFIRMED:
        return now - f.since >= cfg.fence_after_s and not why_not
    if trigger is Trigger.HELD:
        return now - f.since >= cfg.fence_after_s and bool(why_not)
    if trigger is Trigger.LAST_RAIL:
        return why_not.startswith(_LAST_RAIL)
    if trigger is Trigger.BACKOFF_DONE:
        return now >= f.until
    if trigger is Trigger.PROVEN:
        return f.good_since is not None and now - f.good_since >= cfg.test_window_s
    if trigger is Trigger.TEST_FAILED:
        bad_again = f.proved_once and s.evidence not in (None, Verdict.UP)
        return bad_again or now >= f.until
    if trigger is Trigger.TRUSTED:
        return s.verdict is Verdict.UP and not s.drained
    if trigger is Trigger.HOLD_OVER:
        return now >= f.until
    # WAITING, PROVING, STILL_LIFTED: nothing else held
    return True


_LAST_RAIL = "no other rail is healthy"


def _gate(port: str, sights: Mapping[str, Sight], fences: Mapping[str, Fence],
          cfg: FenceSettings, gate: Gate) -> str:
    """Why `port` may not be (or stay) fenced now; "" when it may."""
    healthy = [p for p, s in sights.items()
               if p != port and s.verdict is Verdict.UP and not s.drained
               and fences.get(p, Fence(p)).state not in HOLDING]
    if not healthy:
        return _LAST_RAIL
    holding = sorted(p for p, f in fences.items() if p != port and f.state in HOLDING)
    if len(holding) >= cfg.max_fenced:
        return (f"host cap: {len(holding)} port(s) fenced already ({', '.join(holding)}), "
                f"max_fenced {cfg.max_fenced}")
    if not gate.allowed:
        return _leaf_reason(gate)
    return ""


def _leaf_reason(gate: Gate) -> str:
    return gate.reason or "the leaf's fence budget does not allow it"


def _advance(f: Fence, s: Sight, cfg: FenceSettings, now: float, why_not: str) -> tuple[Fence, Step]:
    if not s.carrier:
        f = replace(f, carrier_gone=True)
    elif f.carrier_gone:
        f = replace(f, carrier_gone=False, carrier_back_at=now)
    if f.state is State.TESTING:
        f = _fold_evidence(f, s, now)
    for trigger in _TRIGGERS[f.state]:
        if _triggered(trigger, f, s, cfg, now, why_not):
            break
    else:  # pragma: no cover - every state ends in a trigger that always holds
        raise AssertionError(f"no trigger for {f.state}")
    after, action = TRANSITIONS[(f.state, trigger)]
    new, reason = _enter(f, after, trigger, action, s, cfg, now, why_not)
    return new, Step(f.port, f.state, after, trigger, action, reason)


def _fold_evidence(f: Fence, s: Sight, now: float) -> Fence:
    """A test follows the port's own evidence: since when it says UP without
    a break, and whether it said UP at all during this test."""
    if s.evidence is Verdict.UP:
        return replace(f, good_since=f.good_since if f.good_since is not None else now,
                       proved_once=True)
    return replace(f, good_since=None)


def _next_backoff(f: Fence, cfg: FenceSettings, now: float) -> float:
    """The first fence waits backoff_initial_s; a fence within backoff_max_s
    of the last one's end keeps doubling (a port that fails again right
    after its test is not trusted sooner for it)."""
    recent = f.unfenced_at is not None and now - f.unfenced_at < cfg.backoff_max_s
    if f.backoff_s and recent:
        return min(f.backoff_s * 2, cfg.backoff_max_s)
    return cfg.backoff_initial_s


def _enter(f: Fence, after: State, trigger: Trigger, action: Action, s: Sight,
           cfg: FenceSettings, now: float, why_not: str) -> tuple[Fence, str]:
    """The port's fence state after `trigger`, and the reason of the step."""
    if action is Action.FENCE:
        backoff = _next_backoff(f, cfg, now)
        reason = (f"DOWN with carrier for {now - f.since:.1f}s (fence_after_s "
                  f"{cfg.fence_after_s:g}); test in {backoff:g}s")
        return replace(f, state=after, since=now, reason=reason, backoff_s=backoff,
                       until=now + backoff, held="", fences=f.fences + 1), reason
    if action is Action.TEST:
        reason = (f"backoff {f.backoff_s:g}s over: up for a test, routes stay away; needs "
                  f"its own probes UP for {cfg.test_window_s:g}s within {cfg.test_timeout_s:g}s")
        return replace(f, state=after, since=now, reason=reason, until=now + cfg.test_timeout_s,
                       good_since=None, proved_once=False), reason
    if action is Action.REFENCE:
        backoff = min(f.backoff_s * 2, cfg.backoff_max_s)
        what = ("its probes said it is bad again" if f.proved_once and now < f.until
                else f"no proof from its own probes within {cfg.test_timeout_s:g}s")
        reason = f"test failed ({what}): down again, next test in {backoff:g}s"
        return replace(f, state=after, since=now, reason=reason, backoff_s=backoff,
                       until=now + backoff, good_since=None, proved_once=False), reason
    if action is Action.UNFENCE:
        reason = f"its own probes said UP for {cfg.test_window_s:g}s: fence over"
        return replace(f, state=after, since=now, reason=reason, until=0.0, good_since=None,
                       proved_once=False, unfenced_at=now), reason
    if after is State.LIFTED and f.state is not State.LIFTED:
        if trigger is Trigger.LIFT:
            reason = (f"lifted by the {f.lift_by}: not fenced again until the port is trusted "
                      f"or the hold ends")
            until = f.lift_until
        else:  # the last healthy rail
            reason = f"{why_not}: the fence is released"
            until = now + cfg.lift_hold_s
        was_held = f.state in HOLDING
        return replace(f, state=after, since=now, reason=reason, until=until, held="",
                       lift_by="", good_since=None, proved_once=False,
                       unfenced_at=now if was_held else f.unfenced_at), reason
    if after is State.LIFTED and trigger is Trigger.LIFT:  # a lift renewed
        reason = f"lift renewed by the {f.lift_by}"
        return replace(f, lift_by="", until=f.lift_until, reason=reason), reason
    if after is State.CONFIRMING and f.state is State.ARMED:
        reason = "DOWN with carrier: a failure the leaf cannot see"
        return replace(f, state=after, since=now, reason=reason, held=""), reason
    if after is State.CONFIRMING:  # FAILING or HELD: the clock runs on
        why = why_not if trigger is Trigger.HELD else ""
        return replace(f, held=why), why or f.reason
    if after is State.ARMED and f.state is not State.ARMED:
        reason = {Trigger.HEALTHY: "no longer DOWN with carrier",
                  Trigger.TRUSTED: "trusted again after the lift",
                  Trigger.HOLD_OVER: "the lift's hold is over"}.get(trigger, str(trigger))
        return replace(f, state=after, since=now, reason=reason, held="", until=0.0), reason
    return f, f.reason


def step(fences: Mapping[str, Fence], sights: Mapping[str, Sight], cfg: FenceSettings,
         gates: Mapping[str, Gate], now: float,
         order: Sequence[str] | None = None) -> tuple[dict[str, Fence], list[Step]]:
    """One pass over every port (in `order`, the config's rail order): the
    new fence states and the steps that changed a state or call for an
    action. Each port's gate counts the fences decided before it in the same
    pass, so two ports failing together never both pass a cap of one.
    Ports without a sight keep their state."""
    out = dict(fences)
    steps: list[Step] = []
    for port in order if order is not None else sorted(sights):
        s = sights.get(port)
        if s is None:
            continue
        f = out.get(port) or initial(port)
        why_not = _gate(port, sights, out, cfg, gates.get(port, Gate(True)))
        if not cfg.enabled and f.state not in HOLDING:
            out[port] = f if f.state is State.ARMED else replace(f, state=State.ARMED, since=now,
                                                                  held="", reason="fencing off")
            continue
        if not cfg.enabled:  # turned off by a reload: release what we hold
            why_not = "fencing turned off"
            new = replace(f, state=State.ARMED, since=now, reason=why_not, held="", until=0.0,
                          unfenced_at=now)
            out[port] = new
            steps.append(Step(port, f.state, State.ARMED, Trigger.LIFT, Action.RELEASE, why_not))
            continue
        new, st = _advance(f, s, cfg, now, why_not)
        gate = gates.get(port, Gate(True))
        asking = (new.state is State.CONFIRMING and not gate.allowed
                  and new.held == _leaf_reason(gate))
        if asking != new.asking:
            new = replace(new, asking=asking)
        out[port] = new
        if st.before != st.after or st.action is not Action.NONE or new.held != f.held:
            steps.append(st)
    return out, steps


ASKING_PHASE = "FENCE_ASKING"
HOLDING_PHASES = tuple(f"FENCE_{s}" for s in HOLDING)  # what overlay sets on a held port


def overlay(states: Mapping[str, PortState], fences: Mapping[str, Fence]) -> dict[str, PortState]:
    """Port states as the routing sees them: a fenced port, and one up for a
    test, is DOWN whatever its health says, so no traffic goes back to it
    before the fence is over. A port that would be fenced but for its leaf's
    grant keeps its verdict and says so in its phase (`ASKING_PHASE`): that
    is how the aggregator hears the ask (the port report carries phases)."""
    out = dict(states)
    for port, f in fences.items():
        st = out.get(port)
        if st is not None and f.asking:
            out[port] = replace(st, phase=ASKING_PHASE)
        if st is None or f.state not in HOLDING:
            continue
        out[port] = replace(st, verdict=Verdict.DOWN, phase=f"FENCE_{f.state}",
                            evidence=(f"fenced by linkpassd ({f.state}): {f.reason}",
                                      *st.evidence))
    return out


def holding(fences: Mapping[str, Fence]) -> list[str]:
    """Ports linkpassd holds fenced (down, or up for a test), sorted."""
    return sorted(p for p, f in fences.items() if f.state in HOLDING)


def describe(f: Fence, now: float) -> str:
    """One line for status and explain."""
    if f.lift_by:
        return f"{f.state.lower()}; lift asked by the {f.lift_by}, taken at the next pass"
    if f.state is State.FENCED:
        return f"fenced: {f.reason}; test in {max(0.0, f.until - now):.1f}s"
    if f.state is State.TESTING:
        good = f"UP for {now - f.good_since:.1f}s" if f.good_since is not None else "not UP yet"
        return (f"testing (routes stay away): its probes {good}; "
                f"gives up in {max(0.0, f.until - now):.1f}s")
    if f.state is State.CONFIRMING:
        held = f"; held: {f.held}" if f.held else ""
        return f"confirming: DOWN with carrier for {now - f.since:.1f}s{held}"
    if f.state is State.LIFTED:
        return f"lifted: {f.reason}; hold ends in {max(0.0, f.until - now):.1f}s"
    return "armed"


class FenceRequestError(ValueError):
    """An operator's fence request that cannot be done; the message says why
    (a bad hold, for instance)."""


class NotAFencePort(FenceRequestError):
    """The port is not a configured rail's port."""


class FencingOff(FenceRequestError):
    """[fence] is off: there is nothing to lift."""


@dataclass(frozen=True)
class View:
    """One port's fence as operators see it (times are unix time)."""

    port: str
    rail: str
    state: State
    reason: str
    since: float
    until: float  # 0: none
    backoff_s: float
    held: str
    fences: int
    summary: str


def view(f: Fence, rail: str, now: float, to_wall: float) -> View:
    """`to_wall`: add to a time of `now`'s clock to get unix time."""
    return View(f.port, rail, f.state, f.reason, f.since + to_wall if f.since else 0.0,
                f.until + to_wall if f.until else 0.0, f.backoff_s, f.held, f.fences,
                describe(f, now))


FILE_VERSION = 1


class FenceFileError(ValueError):
    """The fence file is not usable; the message says why."""


def encode(down: Mapping[str, float], wall_now: float) -> dict[str, object]:
    """fences.json: the ports linkpassd holds administratively down, with
    their backoff, so that the next start brings them up and tests them."""
    return {"version": FILE_VERSION, "written_at": wall_now,
            "down": {p: {"backoff_s": b} for p, b in sorted(down.items())}}


def decode(doc: Mapping[str, object]) -> dict[str, float]:
    """Port -> backoff_s from a fence file; FenceFileError naming what is wrong."""
    if doc.get("version") != FILE_VERSION:
        raise FenceFileError(f"version {doc.get('version')!r}, expected {FILE_VERSION}")
    down = doc.get("down")
    if not isinstance(down, dict):
        raise FenceFileError(f"'down' must be an object, got {type(down).__name__}")
    out: dict[str, float] = {}
    for port, entry in down.items():
        if not isinstance(port, str) or not port or len(port) > 15:
            raise FenceFileError(f"port {port!r} is not an interface name")
        backoff = entry.get("backoff_s") if isinstance(entry, dict) else None
        if isinstance(backoff, bool) or not isinstance(backoff, (int, float)) or not backoff >= 0:
            raise FenceFileError(f"port {port}: backoff_s {backoff!r} is not a number >= 0")
        out[port] = float(backoff)
    return out
