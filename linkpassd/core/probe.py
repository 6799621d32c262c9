"""Active path probing: one path's UDP echo prober, judged by a stated tolerance.

A path is one local rail (interface + source address) to one peer daemon. The
prober sends a numbered echo request every `interval_s`; a reply matches by
sequence number. Carrier cannot see the faults that hurt most (a dead ASIC
port, a one-way optic, a blackholing spine); these probes can. But a prober
that moves healthy traffic is as harmful as none (Alibaba HPN dropped
cross-rail rerouting over false reroutes), so the judgement follows one
contract, stated like BFD's detection time (docs/probing.md has the proof and
the numbers):

* **Tolerance.** No outage, delay or pause of the path shorter than
  `tolerance_s` ever takes it DOWN, on either end, whatever either host's
  CPU is doing.
* **Detection.** An outage that lasts `tolerance_s` + `interval_s` or more is
  always DOWN, at most `detection_bound_s(config)` after it began (one
  interval until a probe meets it, the tolerance, and the reply wait); a
  shorter one above the tolerance is caught when a probe meets it early
  enough.

**The rule (persistence over time, as BFD's).** A reply to a probe proves the
path delivered at the time that probe was sent; so the evidence of a silence
is the run of probes sent after the newest answered one, all unanswered (the
*chain*). The path is DOWN when its chain spans the tolerance: its first
probe `s0` and a probe sent `tolerance_s` or more after it are both
unanswered, the later one for at least `suspect_after_s` (the reply wait),
with at least `confirm + 1` probes in between and no gap between two of them
longer than half the tolerance (a gap is time nobody looked; the chain starts
again after it). Why it keeps the contract: a pause or outage must have begun
before `s0` left (less a round trip) and still lasted when the later probe's
reply wait ran out, so it lasted at least the tolerance; one that ends sooner
lets a reply through, and any reply ends the chain.

**What is not in the rule, and why it needs no exception.** Our own lateness:
probes are stamped after they leave (adapters.echorail restamps a batch that
left late), replies by the kernel's receive time, and the sockets are read
before anything is judged; so a stall of ours delays a verdict and never makes
one. The peer's lateness: a reply the responder held still arrives, and any
reply ends the chain; the responder runs apart from its daemon so that its
hold stays in microseconds (adapters.echoresponder). Both are recorded and
reported (`stall_max_s`, `held_max_s`), never read as loss.

**Confirmation.** A probe unanswered `suspect_after_s` after it left makes
the path SUSPECT: it then probes on a grid of `tolerance_s / confirm` laid
from the chain's first probe until a reply ends the silence or the chain
spans the tolerance, so that a verdict rests on many probes spread over the
tolerance, never one window. The grid's `confirm`-th point is exactly a
tolerance after the first probe, so the chain spans it then; a point our loop
reaches late is sent at once and the next one stays on the grid, so our own
timer lateness delays a verdict once, not once per probe. `confirm` is
`confirm_probes` on a clean path and more on a lossy one, so that random loss
fakes a DOWN with at most `false_down_odds` per steady probe: the chain's
`confirm + 1` probes must all be lost.

**The rail's other paths look too.** A silence that has lasted a quarter of
the tolerance (the first probe and a confirmation unanswered: random loss
rarely gets there)
asks the other UP paths of its rail to probe at once (`asks_rail`,
`rail_ask_due`): if the rail is what failed, each of them starts its own
chain now instead of at its next steady probe, up to an interval later, so
a rail with many peers is judged as soon as one with a single peer. It adds
probes, never a verdict: each path is still judged on its own chain. Once
per rail per tolerance, so a rail fault asks once, not once per path.

**Quality.** The steady probes (not the confirmations, which would over-sample
bad moments) feed a window of `loss_window` outcomes (a steady probe is lost
when it has no reply within the tolerance); above `max_loss_ratio` the path is
DEGRADED, and it clears at `clear_loss_ratio`.

**A path that never came up is not a failure** (FRR #4133): it stays
NEVER_UP, with no opinion, until `rise` replies in a row. Recovery from DOWN
needs `rise` replies in a row too; the hold-down is the port machine's
(core.health). An ICMP port unreachable from the peer (its daemon is
restarting) proves the path delivers but leaves nobody to answer: the path
has no opinion again (NEVER_UP, "peer away") until `rise` replies, so a
peer's restart never fails a path, and the kernel's rate limit on ICMP (about
one a second) cannot make the silence between two refusals look like a fault.

The states and their transitions are one table, `TRANSITIONS`. Pure: `now`
is passed in. A Prober changes in place (it runs for every probe of every
path, and copying a record per probe was most of the engine's cost at fleet
scale); `copy()` gives an independent one.
"""

from __future__ import annotations

import enum
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace

from linkpassd.core.direction import Direction, Receipts, describe, judge
from linkpassd.core.model import Assessment, Verdict
from linkpassd.core.oneway import OneWay
from linkpassd.core.schedule import slot_start

SEQ_MODULO = 2**32  # sequence numbers are 32-bit on the wire
_MIN_LOSS_SAMPLE = 20  # steady outcomes needed before the measured loss sizes the confirmation
_PRUNE_AFTER = 64  # unanswered probes remembered on a path that is not being judged
_NO_SEND = float("-inf")
# Float rounding of sums of send times and spacings (a nanosecond: far below
# any clock this runs on): a grid point computed a tolerance after the chain's
# first probe spans the tolerance even if the sum rounds down.
_FLOAT_NOISE = 1e-9
# Upper bounds of a path's reply round-trip histogram (seconds; +Inf is
# implied): the echo prober counts each reply into them (one bisect and one
# integer increment), metrics export them, reports take the median from them
# (docs/metrics.md).
RTT_BUCKETS_S = (50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 4e-3, 8e-3, 16e-3, 32e-3, 64e-3,
                 0.128, 0.256, 0.512, 1.024)


# --------------------------------------------------------------------------
# Configuration and the arithmetic that follows from it
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeConfig:
    """Timers and thresholds of one path's prober (the contract: module docstring)."""

    interval_s: float = 0.050  # steady probes, one per interval
    tolerance_s: float = 0.030  # the longest silence, delay or pause that never fails the path
    suspect_after_s: float = 0.003  # the reply wait: unanswered this long, a probe is a silence
    confirm_probes: int = 8  # probes spread over the tolerance on a clean path
    confirm_max: int = 32  # cap on them on a lossy path
    false_down_odds: float = 1e-9  # wanted chance, per steady probe, that random loss fakes DOWN
    rise: int = 3  # replies in a row before a path is UP (first time, or after DOWN)
    loss_window: int = 200  # steady outcomes the loss ratio is taken over
    max_loss_ratio: float = 0.20  # DEGRADED above this share of lost steady probes...
    clear_loss_ratio: float = 0.10  # ...and no longer at or below this one
    lag_tolerance_s: float = 0.001  # loop lag below this is ordinary jitter (reported stalls)

    def __post_init__(self) -> None:
        problems = []
        if not self.interval_s > 0:
            problems.append("interval_s must be > 0")
        if not self.tolerance_s > 0:
            problems.append("tolerance_s must be > 0")
        if not 0 < self.suspect_after_s < self.tolerance_s:
            problems.append("suspect_after_s must be > 0 and below tolerance_s")
        if not 2 <= self.confirm_probes <= self.confirm_max:
            # One confirmation would leave the chain's probes a whole tolerance
            # apart, more than max_gap_s: the chain would restart for ever.
            problems.append("need 2 <= confirm_probes <= confirm_max")
        if not 0 < self.false_down_odds < 1:
            problems.append("false_down_odds must be in (0, 1)")
        if self.rise < 1:
            problems.append("rise must be >= 1")
        if self.loss_window < 1:
            problems.append("loss_window must be >= 1")
        if not 0 <= self.clear_loss_ratio < self.max_loss_ratio <= 1:
            problems.append("need 0 <= clear_loss_ratio < max_loss_ratio <= 1")
        if self.lag_tolerance_s < 0:
            problems.append("lag_tolerance_s must be >= 0")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def max_gap_s(self) -> float:
        """The longest gap between two probes of a chain: a longer one is time
        nobody looked (a stall of ours), and the chain starts again after it."""
        return self.tolerance_s / 2


def confirm_count(config: ProbeConfig, loss_ratio: float) -> int:
    """Probes spread over the tolerance so that random loss at `loss_ratio`
    (per probe exchange) fakes a DOWN with at most `false_down_odds` per
    steady probe: the chain's k + 1 probes must all be lost, loss**(k+1) <= odds."""
    if loss_ratio <= 0:
        return config.confirm_probes
    if loss_ratio >= 1:
        return config.confirm_max
    need = math.ceil(math.log(config.false_down_odds) / math.log(loss_ratio) - 1e-9) - 1
    return min(config.confirm_max, max(config.confirm_probes, need))


def confirm_spacing_s(config: ProbeConfig, confirm: int | None = None) -> float:
    """Time between confirmation probes: `confirm` of them over the tolerance."""
    return config.tolerance_s / (config.confirm_probes if confirm is None else confirm)


def confirm_due_after(start: float, now: float, spacing: float) -> float:
    """The first point after `now` of the confirmation grid laid every
    `spacing` from the chain's first probe at `start` (Prober.poll)."""
    return start + (math.floor((now - start) / spacing + _FLOAT_NOISE) + 1) * spacing


def chain_span_s(config: ProbeConfig, confirm: int | None = None) -> float:
    """From a chain's first probe to the probe that completes it (timers on
    time): the grid's `confirm`-th point, a tolerance later, when the chain
    then holds `confirm + 1` probes. Grid points that pass during the reply
    wait (only when the spacing is below it: a path that already loses many
    probes) are made up by one probe sent at once, so the chain needs as many
    more points after the tolerance, less one."""
    c = config.confirm_probes if confirm is None else confirm
    spacing = confirm_spacing_s(config, c)
    passed = math.floor(config.suspect_after_s / spacing + _FLOAT_NOISE)
    return max(config.tolerance_s, (c + passed - 1) * spacing)


def detection_bound_s(config: ProbeConfig, confirm: int | None = None) -> float:
    """Worst-case time from the start of a silent blackhole to DOWN, timers on
    time: a steady probe meets it within one interval; the chain completes a
    tolerance later (`chain_span_s`) and is judged after the reply wait."""
    return config.interval_s + chain_span_s(config, confirm) + config.suspect_after_s


def rail_ask_due(last_asked: float | None, now: float, config: ProbeConfig) -> bool:
    """Whether a rail may ask its paths to probe now: at most once per
    tolerance (a rail fault makes every path of it silent at once)."""
    return last_asked is None or now - last_asked >= config.tolerance_s


# --------------------------------------------------------------------------
# The state machine
# --------------------------------------------------------------------------


class PathState(enum.StrEnum):
    NEVER_UP = "NEVER_UP"
    UP = "UP"
    SUSPECT = "SUSPECT"
    DOWN = "DOWN"


class Evidence(enum.StrEnum):
    """What a step of the prober observed."""

    REPLY = "reply"  # a reply: the path delivered when that probe left
    RISE = "rise"  # a reply that completes `rise` in a row
    REFUSED = "refused"  # ICMP port unreachable: the path delivers, the peer's daemon is away
    SILENCE = "silence"  # a probe unanswered for the reply wait
    TOLERANCE = "tolerance"  # the chain spans the tolerance, confirmed


_S, _E = PathState, Evidence
# (state, evidence) -> next state: the whole machine. Entering SUSPECT starts
# the confirmation probes, leaving it stops them; entering DOWN or UP resets
# the rise count and the loss window (see Prober._enter).
TRANSITIONS: dict[tuple[PathState, Evidence], PathState] = {
    (_S.NEVER_UP, _E.REPLY): _S.NEVER_UP,
    (_S.NEVER_UP, _E.RISE): _S.UP,
    (_S.NEVER_UP, _E.REFUSED): _S.NEVER_UP,
    (_S.NEVER_UP, _E.SILENCE): _S.NEVER_UP,  # never up: silence is no failure
    (_S.NEVER_UP, _E.TOLERANCE): _S.NEVER_UP,
    (_S.UP, _E.REPLY): _S.UP,
    (_S.UP, _E.RISE): _S.UP,
    (_S.UP, _E.REFUSED): _S.NEVER_UP,  # the peer's daemon is away: no opinion until it answers
    (_S.UP, _E.SILENCE): _S.SUSPECT,
    (_S.UP, _E.TOLERANCE): _S.DOWN,  # not reached: a silence comes first
    (_S.SUSPECT, _E.REPLY): _S.UP,
    (_S.SUSPECT, _E.RISE): _S.UP,
    (_S.SUSPECT, _E.REFUSED): _S.NEVER_UP,
    (_S.SUSPECT, _E.SILENCE): _S.SUSPECT,
    (_S.SUSPECT, _E.TOLERANCE): _S.DOWN,
    (_S.DOWN, _E.REPLY): _S.DOWN,
    (_S.DOWN, _E.RISE): _S.UP,
    (_S.DOWN, _E.REFUSED): _S.NEVER_UP,  # the path delivers; the peer has yet to answer
    (_S.DOWN, _E.SILENCE): _S.DOWN,
    (_S.DOWN, _E.TOLERANCE): _S.DOWN,
}


def next_state(state: PathState, evidence: Evidence) -> PathState:
    return TRANSITIONS[(state, evidence)]


@dataclass(slots=True)
class Send:
    """A probe the adapter must send now (stamped with the `now` of the call)."""

    seq: int
    burst: bool  # a confirmation probe (not counted in the loss window)


@dataclass(slots=True)
class Flight:
    """A probe sent and not yet answered, after the newest answered one."""

    seq: int
    sent_at: float
    steady: bool


@dataclass
class ProbeCounters:
    """Counted in place (the prober owns its counters; `copy()` copies them)."""

    sent: int = 0
    received: int = 0  # replies (on time or late)
    late: int = 0  # replies later than the tolerance, or to a probe already given up
    lost: int = 0  # steady probes judged lost (path up), for the loss window
    unanswered: int = 0  # probes given up on while the path was never up or down
    malformed: int = 0  # datagrams on the prober socket that do not parse
    stray: int = 0  # well-formed replies that match no probe of ours
    send_errors: int = 0
    refused: int = 0  # ICMP port unreachable: the peer host answers, its daemon does not
    silences: int = 0  # suspicions raised (a probe unanswered for the reply wait)
    confirmations: int = 0  # confirmation probes sent
    rail_probes: int = 0  # probes sent early because another path of the rail went silent
    downs: int = 0  # transitions to DOWN
    degradations: int = 0  # transitions to DEGRADED


@dataclass(eq=False, slots=True)
class Prober:
    """Everything one path's prober remembers. Start with `Prober(peer, config)`."""

    peer: str
    config: ProbeConfig = field(default_factory=ProbeConfig)
    state: PathState = PathState.NEVER_UP
    degraded: bool = False
    since: float = 0.0  # when the reported verdict last changed
    reason: str = "no reply yet"
    next_seq: int = 1
    next_send: float | None = None  # next steady probe; None: at the first poll
    next_confirm: float | None = None  # next confirmation probe (SUSPECT only)
    confirm: int = 0  # probes the current silence needs (set when it begins)
    streak: int = 0  # replies in a row (towards `rise`)
    rtt_s: float | None = None
    heard_at: float | None = None  # last time the peer's own probes reached us on this path
    # What the contract is measured by, for operators: the longest silence that
    # ended with a reply (its margin is the tolerance minus it), the longest
    # time the peer's responder said it held a request, our longest stall.
    longest_silence_s: float = 0.0
    held_max_s: float = 0.0
    stall_max_s: float = 0.0
    silence_from: float | None = None  # first probe of the current chain (SUSPECT)
    rail_asked: bool = False  # this silence has asked the rail's other paths to probe
    down_receipts: tuple[int, int] = (0, 0)  # receipts' (requests, replies) lost when DOWN began
    now: float = 0.0  # the latest time the prober was told (for the texts it writes)
    counters: ProbeCounters = field(default_factory=ProbeCounters)
    # The responder's receipts (core.direction): which way lost probes were lost.
    receipts: Receipts = field(default_factory=lambda: Receipts(seq_modulo=SEQ_MODULO - 1))
    # One-way delay samples (core.oneway), fed by the adapter from each reply.
    oneway: OneWay = field(default_factory=OneWay)
    _flights: OrderedDict[int, Flight] = field(default_factory=OrderedDict, init=False, repr=False)
    _window: deque[bool] = field(init=False, repr=False)
    _window_lost: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        self.counters = replace(self.counters)
        self._window = deque(maxlen=self.config.loss_window)

    def copy(self) -> "Prober":
        """An independent prober in the same state (the object is mutable)."""
        new = replace(self)
        new._flights = OrderedDict((k, replace(f)) for k, f in self._flights.items())
        new._window = deque(self._window, maxlen=self.config.loss_window)
        new._window_lost = self._window_lost
        new.receipts = replace(self.receipts, recent=deque(self.receipts.recent,
                                                           maxlen=self.receipts.recent.maxlen))
        new.oneway = self.oneway.copy()
        return new

    # ---------------------------------------------------------------- views

    @property
    def signal(self) -> str:
        return f"probe:{self.peer}"

    @property
    def phase(self) -> str:
        """NEVER_UP, UP, DEGRADED, SUSPECT or DOWN, for operators."""
        if self.state is PathState.UP and self.degraded:
            return "DEGRADED"
        return str(self.state)

    @property
    def inflight(self) -> tuple[Flight, ...]:
        """The probes sent after the newest answered one and not answered, oldest first."""
        return tuple(self._flights.values())

    @property
    def window(self) -> tuple[bool, ...]:
        """The steady probes' outcomes in the loss window (True = lost), oldest first."""
        return tuple(self._window)

    @property
    def loss_ratio(self) -> float | None:
        return self._window_lost / len(self._window) if self._window else None

    @property
    def margin_s(self) -> float:
        """How far the longest silence that ended by itself stayed below the tolerance."""
        return self.config.tolerance_s - self.longest_silence_s

    def next_wakeup(self, send_slot_s: float = 0.0) -> float:
        """When the adapter must call poll() next. With `send_slot_s`, the
        steady probe is due at the start of the slot its time falls in."""
        if self.next_send is None:
            return _NO_SEND
        t = slot_start(self.next_send, send_slot_s) if send_slot_s else self.next_send
        if not self._flights:  # the common case: answered, and the next send is all
            return t
        if self.state is PathState.UP:
            first = next(iter(self._flights.values()))
            return min(t, first.sent_at + self.config.suspect_after_s)
        if self.state is PathState.SUSPECT:
            if self.next_confirm is not None and self.next_confirm < t:
                t = self.next_confirm
            judge = self._chain()[1]
            return t if judge is None else min(t, judge)
        return t

    def deadline_passed(self, now: float) -> bool:
        """Whether a judgement is due by `now` (the adapter reads its sockets
        first, then): a silence to raise, or a chain to judge."""
        if not self._flights:
            return False
        if self.state is PathState.UP:
            first = next(iter(self._flights.values()))
            return first.sent_at + self.config.suspect_after_s <= now
        if self.state is PathState.SUSPECT:
            judge = self._chain()[1]
            return judge is not None and judge <= now
        return False

    def assessment(self) -> Assessment:
        """This path's judgement as a health signal (see core.signals)."""
        sig, c, cfg = self.signal, self.counters, self.config
        if self.state is PathState.NEVER_UP:
            return Assessment(sig, None, "never up",
                              f"{self.reason}; {self.streak} of {cfg.rise} replies in a row so "
                              f"far, {c.unanswered} probes unanswered, {c.refused} refused; "
                              "a path that is not up yet is not a failure")
        if self.state is PathState.DOWN:
            recovering = (f"; recovering: {self.streak} of {cfg.rise} replies"
                          if self.streak else "")
            # The peer's own probes reaching us since then: peer-to-us delivers.
            if self.heard_at is not None and self.heard_at > self.since:
                one_way = (f"; loss towards {self.peer}: the peer's own probes have reached "
                           "us since, so our requests are being lost (one-way)")
                direction = Direction.REQUESTS
            elif self.receipts.round_trip_only:
                one_way = ("; which way is unknown: the peer's responder keeps no receipts "
                           "(round trip only)")
                direction = Direction.UNKNOWN
            else:
                one_way = ("; which way is unknown while nothing comes back (the first reply's "
                           "receipt will say)")
                direction = Direction.UNKNOWN
            return Assessment(sig, Verdict.DOWN, "down", self.reason + one_way + recovering,
                              direction=str(direction))
        stats = self._stats()
        way = str(self.receipts.direction())
        if self.state is PathState.SUSPECT:
            text = (f"suspect: silent since a probe {self._ms(self.silence_from)} ago; "
                    f"DOWN if the silence lasts the {cfg.tolerance_s * 1e3:g} ms tolerance; "
                    f"{stats}")
            if self.degraded:
                return Assessment(sig, Verdict.DEGRADED, "suspect", text, direction=way)
            return Assessment(sig, Verdict.DOWN, "suspect", text, confirmed=False,
                              direction=way)
        if self.degraded:
            return Assessment(sig, Verdict.DEGRADED, "degraded",
                              f"{self.reason}: {self.receipts.words(self.peer)}; {stats}",
                              direction=way)
        return Assessment(sig, Verdict.UP, "ok", stats, direction=way)

    def _ms(self, at: float | None) -> str:
        return "?" if at is None else f"{(self.now - at) * 1e3:.1f} ms"

    def _stats(self) -> str:
        parts = []
        if self.rtt_s is not None:
            parts.append(f"rtt {self.rtt_s * 1e3:.2f} ms")
        if self._window:
            parts.append(f"loss {self._window_lost}/{len(self._window)} recent probes")
        parts.append(f"longest silence {self.longest_silence_s * 1e3:.1f} ms of "
                     f"{self.config.tolerance_s * 1e3:g} ms tolerance")
        if self.held_max_s >= self.config.lag_tolerance_s:
            parts.append(f"peer held a request up to {self.held_max_s * 1e3:.1f} ms")
        if self.stall_max_s >= self.config.lag_tolerance_s:
            parts.append(f"our longest stall {self.stall_max_s * 1e3:.1f} ms")
        r = self.receipts
        if (r.requests_lost or r.replies_lost or r.round_trip_only) and not self.degraded:
            parts.append(r.words(self.peer))  # a degraded path's reason says it already
        return ", ".join(parts)

    # --------------------------------------------------------------- inputs

    def note_stall(self, lag: float) -> "Prober":
        """Our loop ran `lag` late: recorded for operators, never a verdict."""
        if lag > self.stall_max_s:
            self.stall_max_s = lag
        return self

    def poll(self, now: float, send_slot_s: float = 0.0,
             judged_at: float | None = None) -> tuple["Prober", list[Send]]:
        """Judge what is due by `judged_at` (default `now`: the time as of which
        the adapter has read every reply the kernel held), then say which
        probes to send now. `send_slot_s`: the steady probe goes at
        the start of the slot (of the grid of that width) its time falls in,
        so an adapter with many paths sends those of one slot together; its
        cadence and phase stay the path's own (next = previous + interval)."""
        self.now = now
        if self._flights:
            self._judge(now if judged_at is None or judged_at > now else judged_at)
        sends: list[Send] = []
        nxt = self.next_send
        if nxt is None or now >= (slot_start(nxt, send_slot_s) if send_slot_s else nxt):
            # Keep the cadence and its phase, but never catch up on slots a
            # stall swallowed: the next slot of the grid after now.
            interval = self.config.interval_s
            if nxt is None:
                nxt = now + interval
            else:
                nxt += interval
                if nxt <= now:
                    nxt += math.floor((now - nxt) / interval + 1) * interval
                    if nxt <= now:  # rounding
                        nxt += interval
            self.next_send = nxt
            sends.append(self._send(now, True))
        nc = self.next_confirm
        if nc is not None and now >= nc and self.state is PathState.SUSPECT:
            if not sends:  # a steady probe leaving now is this moment's confirmation too
                sends.append(self._send(now, False))
                self.counters.confirmations += 1
            if self._chain_covered():
                self.next_confirm = None  # enough sent: the last one's reply wait decides
            else:  # the grid's next point, however late this one went
                start = self.silence_from
                self.next_confirm = confirm_due_after(now if start is None else start, now,
                                                      self._spacing())
        return self, sends

    def on_reply(self, seq: int, received_at: float, echoed_sent_at: float | None = None,
                 held_s: float = 0.0, receipt: int | None = None) -> "Prober":
        """A reply to probe `seq` arrived at `received_at` (the kernel's receive
        time when the adapter has it). `echoed_sent_at` is the send time the
        reply carries (it must match ours); `held_s` is how long the
        responder held the request before answering; `receipt` the
        responder's count (core.wire; None: it keeps none)."""
        self.receipts.on_reply(seq, receipt)
        flight = self._flights.get(seq)
        if flight is not None and echoed_sent_at is not None \
                and abs(echoed_sent_at - flight.sent_at) > 0.5:
            flight = None  # same number, another probe (a previous wrap): stale
        if held_s > self.held_max_s:
            self.held_max_s = held_s
        if flight is None:
            self.counters.late += 1  # answered after a later probe was, or given up on
            return self
        c = self.counters
        c.received += 1
        took = received_at - flight.sent_at
        self.rtt_s = max(0.0, took - held_s)
        counting = self.state is PathState.UP or self.state is PathState.SUSPECT
        first = next(iter(self._flights))
        if first == seq:  # the common case: the oldest (usually only) probe in flight
            self._flights.popitem(last=False)
            unanswered_before = False
        else:
            unanswered_before = True
            while True:
                k, f = self._flights.popitem(last=False)
                if k == seq:
                    break
                if f.steady and counting:
                    self._window_add(True, received_at)
        if flight.steady and counting:
            late = took > self.config.tolerance_s
            c.late += late
            self._window_add(late, received_at)
        if self.state is PathState.SUSPECT and self.silence_from is not None:
            silence = received_at - self.silence_from - held_s
            if silence > self.longest_silence_s:
                self.longest_silence_s = silence
        self.streak = 1 if unanswered_before else self.streak + 1
        if self.state is not PathState.UP and self.streak >= self.config.rise:
            return self._step(Evidence.RISE, received_at, f"{self.streak} replies in a row")
        if self.state is PathState.SUSPECT:
            return self._step(Evidence.REPLY, received_at, "a reply ended the silence")
        return self

    def on_send_error(self, seq: int, now: float) -> "Prober":
        """The probe could not be sent: no evidence either way."""
        self.counters.send_errors += 1
        self.receipts.on_unsent()
        self._flights.pop(seq, None)
        return self

    def restamp(self, seq: int, sent_at: float) -> "Prober":
        """Probe `seq` left at `sent_at`, later than it was stamped (the batch
        it was in went out late): its silence counts from then."""
        flight = self._flights.get(seq)
        if flight is not None and sent_at > flight.sent_at:
            flight.sent_at = sent_at
        return self

    def on_refused(self, now: float) -> "Prober":
        """ICMP port unreachable from the peer: the path carried our probe and
        the peer host's answer, but no daemon listens (restart, upgrade): no
        opinion until the peer answers `rise` times in a row."""
        self.counters.refused += 1
        self._flights.clear()
        self.streak = 0
        return self._step(Evidence.REFUSED, now,
                          "the peer's daemon is away (ICMP port unreachable): no opinion")

    def peer_heard(self, now: float) -> "Prober":
        """The peer's own probes reached our responder over this path: the
        peer-to-us direction delivers. Used to say which way a one-way fault runs."""
        self.heard_at = now
        return self

    def count_malformed(self, n: int = 1) -> "Prober":
        self.counters.malformed += n
        return self

    def count_stray(self, n: int = 1) -> "Prober":
        self.counters.stray += n
        return self

    def asks_rail(self, now: float) -> bool:
        """Whether this silence should ask the rail's other paths to probe now
        (module docstring): once per silence, when it has lasted a quarter of
        the tolerance. Calling it says the ask is made."""
        if self.state is not PathState.SUSPECT or self.rail_asked or self.silence_from is None \
                or now - self.silence_from < self.config.tolerance_s / 4:
            return False
        self.rail_asked = True
        return True

    def probe_now(self, now: float) -> Send | None:
        """A probe now, ahead of the schedule (which stays), when another path
        of the rail went silent: not counted in the loss window; unanswered,
        it starts this path's own silence. Only an UP path probes early."""
        if self.state is not PathState.UP:
            return None
        self.counters.rail_probes += 1
        return self._send(now, False)

    # ------------------------------------------------------------- internals

    def _send(self, now: float, steady: bool) -> Send:
        """Record a probe sent now (this runs for every probe of every path)."""
        seq = self.next_seq
        self.next_seq = seq % (SEQ_MODULO - 1) + 1
        flights = self._flights
        flights[seq] = Flight(seq, now, steady)
        if len(flights) > _PRUNE_AFTER and self.state not in (PathState.UP, PathState.SUSPECT):
            flights.popitem(last=False)
            self.counters.unanswered += 1
        self.counters.sent += 1
        return Send(seq, not steady)

    def _spacing(self) -> float:
        return confirm_spacing_s(self.config, self.confirm or None)

    def _chain(self) -> tuple[bool, float | None, float | None]:
        """The chain of unanswered probes (module docstring): whether it spans
        the tolerance (its last probe's reply wait over), when it will be
        judged (None: not yet known), and its first probe's send time."""
        cfg = self.config
        wait, span, gap = cfg.suspect_after_s, cfg.tolerance_s, cfg.max_gap_s
        need = (self.confirm or cfg.confirm_probes) + 1
        start: float | None = None
        prev = 0.0  # read only once start is set
        count = 0
        for f in self._flights.values():
            t = f.sent_at
            if start is None or t - prev > gap:
                start, count = t, 0
            prev = t
            count += 1
            if t - start >= span - _FLOAT_NOISE and count >= need:
                return True, t + wait, start
        return False, None, start

    def _chain_covered(self) -> bool:
        return self._chain()[1] is not None

    def _judge(self, now: float) -> None:
        state, cfg = self.state, self.config
        if state is PathState.UP:
            first = next(iter(self._flights.values()))
            if first.sent_at + cfg.suspect_after_s <= now:
                self._step(Evidence.SILENCE, now, "a probe went unanswered")
            return
        if state is PathState.SUSPECT:
            spans, at, start = self._chain()
            self.silence_from = start
            if spans and at is not None and start is not None and at <= now:
                n = len(self._flights)
                self._step(Evidence.TOLERANCE, now,
                           f"no reply to {n} probes over {(now - start) * 1e3:.1f} ms, longer "
                           f"than the {cfg.tolerance_s * 1e3:g} ms tolerance "
                           "(blackhole or one-way loss)")
            return
        # NEVER_UP or DOWN: probes unanswered within the tolerance are given up.
        flights = self._flights
        while flights:
            first = next(iter(flights.values()))
            if first.sent_at + cfg.tolerance_s > now:
                break
            flights.popitem(last=False)
            self.counters.unanswered += 1
            self.streak = 0
            self._step(Evidence.SILENCE, now, "")

    def _step(self, evidence: Evidence, now: float, why: str) -> "Prober":
        old = self.state
        new = next_state(old, evidence)
        if new is not old:
            self._enter(old, new, now, why)
        return self

    def _enter(self, old: PathState, new: PathState, now: float, why: str) -> None:
        self.state = new
        cfg = self.config
        if new is PathState.SUSPECT:
            self.counters.silences += 1
            n = len(self._window)
            self.confirm = confirm_count(cfg, self._window_lost / n
                                         if n >= _MIN_LOSS_SAMPLE else 0.0)
            self.silence_from = next(iter(self._flights.values())).sent_at
            # The grid's first point: passed already (spacing below the
            # reply wait) means the first confirmation leaves at once.
            self.next_confirm = self.silence_from + self._spacing()
            self.rail_asked = False
            return
        self.next_confirm = None
        self.silence_from = None
        if old is PathState.SUSPECT and new is PathState.UP:
            return  # the reported verdict (UP or DEGRADED) never changed
        self.since, self.reason = now, why
        self._window.clear()
        self._window_lost = 0
        self.degraded = False
        if new is PathState.DOWN:
            self.counters.downs += 1
            self.streak = 0
            self._flights.clear()
            self.down_receipts = (self.receipts.requests_lost, self.receipts.replies_lost)
        elif new is PathState.UP:
            self.reason = why + (" (first contact)" if old is PathState.NEVER_UP else " after DOWN")
            if old is PathState.DOWN:
                self.reason += self._outage_direction()

    def _outage_direction(self) -> str:
        """Which way the outage that just ended lost probes: the first reply
        after it carried the receipt that classes them (core.direction)."""
        r = self.receipts
        if r.round_trip_only:
            return "; which way the outage ran is unknown (the peer keeps no receipts)"
        requests = r.requests_lost - self.down_receipts[0]
        replies = r.replies_lost - self.down_receipts[1]
        if requests <= 0 and replies <= 0:
            return ""
        words = describe(judge(max(0, requests), max(0, replies)), self.peer,
                         max(0, requests), max(0, replies))
        return f"; the outage was {words}"

    def _window_add(self, lost: bool, now: float) -> None:
        cfg, window = self.config, self._window
        if len(window) == cfg.loss_window:
            self._window_lost -= window[0]
        window.append(lost)
        self._window_lost += lost
        self.counters.lost += lost
        if len(window) < cfg.loss_window:
            return
        if self._window_lost == 0 and self.receipts.recent:
            # A whole window without loss: what was lost before it says nothing
            # about which way the next loss runs (an earlier fault, since repaired).
            self.receipts.forget_direction()
        ratio = self._window_lost / len(window)
        if not self.degraded and ratio > cfg.max_loss_ratio:
            self.degraded, self.since = True, now
            self.reason = (f"loss {ratio:.0%} over the last {len(window)} probes "
                           f"> {cfg.max_loss_ratio:.0%}")
            self.counters.degradations += 1
        elif self.degraded and ratio <= cfg.clear_loss_ratio:
            self.degraded, self.since = False, now
            self.reason = f"loss back to {ratio:.0%} (<= {cfg.clear_loss_ratio:.0%})"
            self.receipts.forget_direction()  # that degradation's direction is history
