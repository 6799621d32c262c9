"""Active path probing: a UDP echo to a peer daemon, judged by suspicion and confirmation.

A path is one local rail (interface + source address) to one peer daemon. The
prober sends a numbered echo request every `interval_s`; a reply matches by
sequence number. Carrier cannot see the faults that hurt most (dead ASIC port,
one-way optic, blackholing upstream); these probes can. But a probe verdict that
fails paths on noise is as harmful as none (Alibaba HPN dropped rerouting over
false reroutes), so:

* **A miss only raises suspicion.** A steady probe with no reply
  `suspect_after_s` after it left moves the path to SUSPECT and starts a
  burst of `burst_count` probes, `burst_interval_s` apart; the probe itself is
  judged (for the loss window) only at `timeout_s`, so a slow reply costs a
  burst and nothing else. Any reply (even a late one) is proof of life and
  ends the suspicion. Only when the burst is lost too is the path DOWN. One-way
  loss (requests *or* replies dropped) and a silent blackhole look the same
  from here, and both are DOWN: the path cannot carry a conversation.
* **A burst probe is lost when it times out, or when the peer says so by
  answering something later.** A responder answers requests in the order they
  reach it, so when the same peer daemon (replies carry its id) answers, on
  another path, a probe sent after our burst's last, and `order_margin_s`
  later ours are still unanswered, they were lost on this path: the peer was
  answering, and a stalled peer answers nothing later either, so waiting out
  `timeout_s` would tell nothing more (`peer_answered`; the adapter pokes such
  a path after a burst's last probe, core.peerwatch). Without that evidence
  the timeouts decide, as before.
* **Random loss is a quality problem, not an outage.** The steady probes (not
  the burst, which would over-sample bad moments) feed a window of
  `loss_window` outcomes; above `max_loss_ratio` the path is DEGRADED, and it
  clears at `clear_loss_ratio` (hysteresis, so it does not oscillate). A path
  that already loses probes gets a longer burst (`burst_size()`), so its loss
  cannot fake a DOWN more often than `false_down_odds` per probe.
* **Our own stalls are not the path's fault.** The adapter reports how late
  each handling ran (event-loop lag). A miss whose time in flight was covered
  by stalls for `max_stall_ratio` of the timeout (all of it, by default) is
  UNKNOWN, not lost (the loop's stalls are the host's, kept once for all paths
  in a core.stalls.StallLog the adapter passes in as `host_stalls`; a path
  keeps only its own, such as a reply's wait in its socket); so is a reply
  that was late only by the time we, or the responder (it reports how long it
  held the request), sat on it. An unjudged
  burst probe is replaced (up to `burst_max`) rather than spoiling the burst.
  An ICMP port unreachable from the peer (host up, daemon restarting) makes
  misses UNKNOWN for `refused_grace_s`.
* **A path that never came up is not a failure** (FRR #4133): it stays
  NEVER_UP, with no opinion, until `rise` replies in a row; its misses are
  counted as unanswered, never as lost.
* Recovery from DOWN needs `rise` on-time replies in a row. Hold-down is not
  here: the port health machine (core.health) applies it to the port verdict.
* **One rail-wide fault, a few confirmations** (core.railwatch): a
  `coordinated` prober (the echo service's) does not burst by itself when it
  becomes suspect; it waits (`burst_held`) for its rail's turn, since a dead
  rail makes every path of it suspect at once, and 128 bursts at once stalled
  the daemon. A rail judged dead takes its live paths DOWN (`rail_down`).

Detection arithmetic (the worst case, the fault landing just after a reply):
the next steady probe leaves within `interval_s`; it raises suspicion
`suspect_after_s` later; the burst spans `(burst_count - 1) * burst_interval_s`;
the last burst probe's miss is judged `timeout_s` after it. So

    detection = interval + suspect_after + (burst_count - 1) * burst_interval + timeout

when another live path of the host answered during the burst (its witness
probe: see `witnessed`). A path with no live witness waits `peer_grace_s`
(25 ms) more for a late reply before DOWN: its only peer may just be slow to
answer, and nothing else can say the host and the peer are fine. With
ordering evidence (the same peer daemon reachable over another path, as in
a rail-optimized mesh), the last `timeout` becomes that path's round trip
plus `order_margin_s`.

With the defaults, 50 + 3 + 7 * 0.5 + 8 = 64.5 ms, or 50 + 3 + 3.5 + ~0.2 + 2
= 58.7 ms with ordering, against BFD's detect-mult x interval = 3 x 50 = 150 ms
at the same steady interval; at a 10 ms interval, 24.5 / 18.7 ms against 30 ms
(on average, fault at a random phase, half an interval less). The suspicion
and the burst are fast because a probe's round trip in one fabric is well
under a millisecond, stalls of ours are accounted for separately, and the
burst's job is only to tell "everything is lost" from "some is lost".

The price of the ordering evidence, stated: a path is DOWN once it has been
silent for about `suspect_after_s` + the burst span + `order_margin_s`
(~8.5 ms) while the same peer answers on another path, where the timeouts
alone gave it ~20 ms; so a path whose round trip jumps above ~8 ms (or that
drops everything for that long) while its sibling paths answer at once is
failed over, as a silent one would be.

Noise arithmetic: a false DOWN needs 1 + `burst_count` probe exchanges lost in a
row. With 5 % random loss in each direction an exchange is lost with
q = 1 - 0.95**2 = 9.75 %, and q**9 = 8e-10 per steady probe: one false DOWN per
~2 years of a path at 20 probes/s under that (already bad) loss. A 200-probe
window at q = 9.75 % exceeds 20 % with probability 4e-6; at 20 % loss each way
(q = 36 %) it stays under 20 % with probability 6e-7, and the burst grows to 20
probes so that q**21 < 1e-9.

Pure: `now` and the lag are passed in. A Prober is mutable: every method
updates it in place and returns it (so `p = p.poll(...)[0]` chains read as
before); `copy()` gives an independent one. Why not frozen values, as
before: the prober runs for every probe of every path, and copying a
35-field record (and its 200-outcome window, and its 256 judged probes)
several times per probe was most of the engine's CPU at fleet scale (issue
11). Now a steady probe and its on-time reply touch a few fields, a dict
entry and two ring buffers.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass, field, replace

from linkpassd.core.model import Assessment, Verdict
from linkpassd.core.probeconfig import ProbeConfig, burst_size, detection_bound_s  # noqa: F401
from linkpassd.core.railverdict import rail_assessment  # noqa: F401  (re-exported)
from linkpassd.core.schedule import slot_start
from linkpassd.core.stalls import STALL_MEMORY_S, StallLog, stalled_time

SEQ_MODULO = 2**32  # sequence numbers are 32-bit on the wire
_JUDGED_MEMORY = 256  # recently judged probes remembered, to recognise late replies
_STALL_MEMORY_S = STALL_MEMORY_S  # how long a recorded stall can matter for a probe in flight
_MIN_LOSS_SAMPLE = 20  # steady outcomes needed before the measured loss sizes the burst
_NO_SEND = float("-inf")


class PathState(enum.StrEnum):
    NEVER_UP = "NEVER_UP"
    UP = "UP"
    SUSPECT = "SUSPECT"
    DOWN = "DOWN"


class Outcome(enum.StrEnum):
    OK = "ok"  # reply by the deadline
    LOST = "lost"  # no reply by the deadline, and nothing stopped us from seeing one
    LATE = "late"  # reply after the deadline: a loss for the window, but proof of life
    UNKNOWN = "unknown"  # cannot be judged (stall, send failure, peer port closed)


@dataclass(slots=True)
class Send:
    """A probe the adapter must send now (stamped with the `now` of the call)."""

    seq: int
    burst: bool


@dataclass(slots=True)
class InFlight:
    """A probe sent and not yet judged (never changed once made; not frozen
    only because a frozen dataclass costs several times more to build)."""

    seq: int
    sent_at: float
    deadline: float
    burst: bool  # a confirmation (or witness) probe: never counted in the loss window


@dataclass
class ProbeCounters:
    """Counted in place (the prober owns its counters; `copy()` copies them)."""

    sent: int = 0
    received: int = 0  # replies by the deadline
    lost: int = 0  # misses judged lost (path was up)
    late: int = 0  # replies after their deadline
    unknown_lag: int = 0  # unjudged: a stall (ours or the responder's) ate the timeout
    unknown_other: int = 0  # unjudged: send failed, or the peer's port was closed
    unanswered: int = 0  # misses while the path was never up: not failures
    malformed: int = 0  # datagrams on the prober socket that do not parse
    stray: int = 0  # well-formed replies that match no probe of ours
    send_errors: int = 0
    refused: int = 0  # ICMP port unreachable: the peer host answers, its daemon does not
    bursts: int = 0  # suspicions raised
    host_silences: int = 0  # lost bursts not counted: every other path was silent too
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
    burst_due: tuple[float, ...] = ()
    burst_from: float = 0.0  # when the current burst started; older burst probes do not count
    burst_size: int = 0  # lost burst probes that confirm DOWN
    burst_scheduled: int = 0  # probes in the current burst, replacements for unjudged ones included
    burst_outcomes: tuple[Outcome, ...] = ()
    streak: int = 0  # on-time replies in a row
    stalls: tuple[tuple[float, float], ...] = ()  # merged, oldest first
    refused_at: float | None = None
    heard_at: float | None = None  # last time the peer's own probes reached us on this path
    rtt_s: float | None = None
    # Witnesses: the daemon's other paths. `others_live`: one of them is UP or
    # SUSPECT (so it could answer during our burst); `others_heard_at`: the
    # last reply any of them received. Set by the adapter (see `witnessed`).
    others_live: bool = False
    others_heard_at: float | None = None
    grace_until: float | None = None  # a lost burst, alone: DOWN at this time unless a reply comes
    # Rail coordination (core.railwatch): with `coordinated`, a suspicion does
    # not burst by itself; it waits (`burst_held`) until the adapter calls
    # start_burst(), so a rail-wide fault is confirmed by a few paths, not all.
    coordinated: bool = False
    burst_held: bool = False
    suspect_since: float = 0.0  # when the probe whose loss raised the suspicion was sent
    lost_sent_at: float | None = None  # send time of the latest probe judged lost
    # Ordering evidence (see `peer_answered`): the latest-sent probe of another
    # path that the same peer daemon answered, and when its reply came.
    peer_answered_sent: float = float("-inf")
    peer_answered_at: float = float("-inf")
    counters: ProbeCounters = field(default_factory=ProbeCounters)
    # Probes in flight by sequence number, the recently judged ones (seq,
    # sent_at) newest last, and the steady outcomes (True = lost) with their
    # running count of losses: each updated in O(1) per probe.
    _flights: dict[int, InFlight] = field(default_factory=dict, init=False, repr=False)
    _judged: deque = field(init=False, repr=False)
    _window: deque = field(init=False, repr=False)
    _window_lost: int = field(default=0, init=False, repr=False)
    _early_seq: int = field(default=0, init=False, repr=False)  # steady probe already suspected

    def __post_init__(self) -> None:
        # Its own counters, even when built by dataclasses.replace() from another.
        self.counters = replace(self.counters)
        self._judged = deque(maxlen=_JUDGED_MEMORY)
        self._window = deque(maxlen=self.config.loss_window)

    def copy(self) -> "Prober":
        """An independent prober in the same state (the object is mutable)."""
        new = replace(self)
        new._flights = dict(self._flights)
        new._judged = deque(self._judged, maxlen=_JUDGED_MEMORY)
        new._window = deque(self._window, maxlen=self.config.loss_window)
        new._window_lost = self._window_lost
        new._early_seq = self._early_seq
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
    def inflight(self) -> tuple[InFlight, ...]:
        """The probes sent and not yet judged, oldest first."""
        return tuple(self._flights.values())

    @property
    def judged(self) -> tuple[tuple[int, float], ...]:
        return tuple(self._judged)

    @property
    def window(self) -> tuple[bool, ...]:
        """The steady probes' outcomes in the loss window (True = lost), oldest first."""
        return tuple(self._window)

    @property
    def loss_ratio(self) -> float | None:
        return self._window_lost / len(self._window) if self._window else None

    def next_wakeup(self, send_slot_s: float = 0.0) -> float:
        """When the adapter must call poll() next (a send is due or a deadline
        passes). With `send_slot_s`, the steady probe is due at the start of
        the slot its time falls in (see poll)."""
        if self.next_send is None:
            return _NO_SEND
        t = slot_start(self.next_send, send_slot_s) if send_slot_s else self.next_send
        if not self._flights:  # the common case: answered, and the next send is all
            if self.burst_due and self.burst_due[0] < t:
                t = self.burst_due[0]
            if self.grace_until is not None and self.grace_until < t:
                t = self.grace_until
            return t
        early = self._early_suspicion_at()
        ordered = self._ordered_at() if self.state is PathState.SUSPECT else None
        for f in self._flights.values():
            if f.deadline < t:
                t = f.deadline
            if early is not None and not f.burst and f.seq != self._early_seq:
                at = f.sent_at + early
                if at < t:
                    t = at
            if ordered is not None and f.burst and f.sent_at <= self.peer_answered_sent \
                    and ordered < t:
                t = ordered
        if self.burst_due and self.burst_due[0] < t:
            t = self.burst_due[0]
        if self.grace_until is not None and self.grace_until < t:
            t = self.grace_until
        return t

    def deadline_passed(self, now: float) -> bool:
        """Whether a probe in flight or the grace is due to be judged by `now`
        (the adapter reads its sockets first, then)."""
        if not self._flights:
            return self.grace_until is not None and self.grace_until <= now
        early = self._early_suspicion_at()
        ordered = self._ordered_at() if self.state is PathState.SUSPECT else None
        for f in self._flights.values():
            if f.deadline <= now:
                return True
            if early is not None and not f.burst and f.seq != self._early_seq \
                    and f.sent_at + early <= now:
                return True
            if ordered is not None and f.burst and f.sent_at <= self.peer_answered_sent \
                    and ordered <= now:
                return True
        return self.grace_until is not None and self.grace_until <= now

    def assessment(self) -> Assessment:
        """This path's judgement as a health signal (see core.signals)."""
        sig, c, cfg = self.signal, self.counters, self.config
        if self.state is PathState.NEVER_UP:
            return Assessment(sig, None, "never up",
                              f"{self.streak} of {cfg.rise} replies in a row so far, "
                              f"{c.unanswered} probes unanswered, {c.refused} refused; "
                              "a path that never came up is not a failure")
        if self.state is PathState.DOWN:
            recovering = (f"; recovering: {self.streak} of {cfg.rise} replies"
                          if self.streak else "")
            # The peer's own probes reaching us since then: peer-to-us delivers.
            one_way = ("; the peer's own probes have reached us since, so our requests are "
                       "being lost (one-way)"
                       if self.heard_at is not None and self.heard_at > self.since else "")
            return Assessment(sig, Verdict.DOWN, "down", self.reason + one_way + recovering)
        stats = self._stats()
        if self.state is PathState.SUSPECT:
            lost = self.burst_outcomes.count(Outcome.LOST)
            if self.burst_held:
                text = ("suspect: probe missed, waiting while other paths of the rail confirm "
                        f"a loss; {stats}")
                if self.degraded:
                    return Assessment(sig, Verdict.DEGRADED, "suspect", text)
                return Assessment(sig, Verdict.DOWN, "suspect", text, confirmed=False)
            text = (f"suspect: probe missed, confirming with {self.burst_size} probes "
                    f"({lost} lost so far); {stats}")
            if self.degraded:
                return Assessment(sig, Verdict.DEGRADED, "suspect", text)
            return Assessment(sig, Verdict.DOWN, "suspect", text, confirmed=False)
        if self.degraded:
            return Assessment(sig, Verdict.DEGRADED, "degraded", f"{self.reason}; {stats}")
        return Assessment(sig, Verdict.UP, "ok", stats)

    def _stats(self) -> str:
        c = self.counters
        parts = []
        if self.rtt_s is not None:
            parts.append(f"rtt {self.rtt_s * 1e3:.2f} ms")
        if self._window:
            parts.append(f"loss {self._window_lost}/{len(self._window)} recent probes")
        if c.unknown_lag or c.unknown_other:
            parts.append(f"{c.unknown_lag + c.unknown_other} unjudged "
                         f"({c.unknown_lag} stalled, {c.unknown_other} other)")
        return ", ".join(parts) or "no replies judged yet"

    # --------------------------------------------------------------- inputs

    def note_lag(self, now: float, lag: float) -> "Prober":
        """The event loop ran a handler `lag` seconds late: it was stalled over
        [now - lag, now]. Below `lag_tolerance_s` that is ordinary jitter."""
        if lag < self.config.lag_tolerance_s:
            return self
        start = now - lag
        stalls = self.stalls
        if not stalls or start >= stalls[-1][0]:
            # The usual order (stalls are measured as they end): append or
            # merge with the last, no sort; forget what ended too long ago.
            keep = 0
            while keep < len(stalls) and stalls[keep][1] < now - _STALL_MEMORY_S:
                keep += 1
            stalls = stalls[keep:]
            if stalls and start <= stalls[-1][1]:
                last = stalls[-1]
                self.stalls = stalls[:-1] + ((last[0], max(last[1], now)),)
            else:
                self.stalls = stalls + ((start, now),)
            return self
        merged: list[tuple[float, float]] = []
        for s, e in sorted(self.stalls + ((start, now),)):
            if e < now - _STALL_MEMORY_S:
                continue
            if merged and s <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], e))
            else:
                merged.append((s, e))
        self.stalls = tuple(merged)
        return self

    def poll(self, now: float, lag: float = 0.0, host_stalls: StallLog | None = None,
             send_slot_s: float = 0.0) -> tuple["Prober", list[Send]]:
        """Judge the probes whose deadline passed, then say which probes to send now.
        `host_stalls`: the loop's stalls, kept once for all paths (core.stalls);
        they count as this path's own. `send_slot_s`: the steady probe goes at
        the start of the slot (of the grid of that width) its time falls in,
        so that an adapter with many paths sends those of one slot together;
        its cadence and phase stay the path's own (next = previous + interval)."""
        if lag >= self.config.lag_tolerance_s:
            self.note_lag(now, lag)
        if self._flights:
            self._expire(now, host_stalls)
            if self.state is PathState.UP and self._flights:
                self._suspect_early(now, host_stalls)
        if (self.grace_until is not None and now >= self.grace_until
                and self.state is PathState.SUSPECT):
            self._go_down(now)
        sends: list[Send] = []
        nxt = self.next_send
        if nxt is None or now >= (slot_start(nxt, send_slot_s) if send_slot_s else nxt):
            # Keep the cadence and its phase, but never catch up on slots a
            # stall swallowed: the next slot of the grid after now. (The phase
            # matters: the adapter spreads its paths over one interval, and a
            # stall that re-aligned them would make them all due at once, for good.)
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
            sends.append(self._send(now, False))
        while self.burst_due and self.burst_due[0] <= now:
            self.burst_due = self.burst_due[1:]
            sends.append(self._send(now, True))
        return self, sends

    def on_reply(self, seq: int, received_at: float, now: float, lag: float = 0.0,
                 echoed_sent_at: float | None = None, peer_delay_s: float = 0.0,
                 host_stalls: StallLog | None = None) -> "Prober":
        """A reply to probe `seq` arrived at `received_at` (the kernel's receive
        time when the adapter has it, else `now`). `echoed_sent_at` is the send
        time the reply carries (it must match ours); `peer_delay_s` is how long
        the responder held the request before answering."""
        if lag >= self.config.lag_tolerance_s:
            self.note_lag(now, lag)
        flight = self._flights.get(seq)
        if flight is not None and echoed_sent_at is not None \
                and abs(echoed_sent_at - flight.sent_at) > 1e-6:
            flight = None  # same number, another probe: a stale reply
        if flight is None:
            return self._late_or_stray(seq, echoed_sent_at, now)
        del self._flights[seq]
        if received_at <= flight.deadline:
            self.rtt_s = max(0.0, received_at - flight.sent_at)
            if self.state is PathState.UP and not flight.burst:
                # The common case, in place: what _judge does for an on-time
                # steady reply on a path that is up.
                self._judged.append((seq, flight.sent_at))
                self.counters.received += 1
                self._window_add(False, now)
                return self
            return self._judge(flight, Outcome.OK, now, replied=True)
        self.counters.late += 1
        # Late only by the time we or the responder sat on it: not the path's doing.
        ours = stalled_time(self.stalls, flight.sent_at, received_at, host_stalls)
        on_time_but_for_stalls = (received_at - peer_delay_s - ours <= flight.deadline
                                  or ours >= self.config.stall_budget_s)
        if on_time_but_for_stalls:
            self.counters.unknown_lag += 1
            return self._judge(flight, Outcome.UNKNOWN, now, replied=True)
        return self._judge(flight, Outcome.LATE, now, replied=True)

    def start_burst(self, now: float) -> "Prober":
        """Start the held confirmation now (a coordinated suspect's turn, see
        core.railwatch): the next poll sends its first probe."""
        if self.state is not PathState.SUSPECT or not self.burst_held:
            return self
        cfg = self.config
        self.burst_held = False
        self.burst_from = now
        self.burst_due = tuple(now + i * cfg.burst_interval_s for i in range(self.burst_size))
        self.burst_scheduled = self.burst_size
        self.burst_outcomes = ()
        return self

    def rail_down(self, now: float, why: str) -> "Prober":
        """The path's rail was judged dead (core.railwatch): an UP or suspect
        path is DOWN; a DOWN or never-up one stays as it is."""
        if self.state not in (PathState.UP, PathState.SUSPECT):
            return self
        return self._go_down(now, why)

    def on_send_error(self, seq: int, now: float) -> "Prober":
        """The probe could not be sent: no evidence either way."""
        self.counters.send_errors += 1
        flight = self._flights.pop(seq, None)
        if flight is None:
            return self
        self.counters.unknown_other += 1
        return self._judge(flight, Outcome.UNKNOWN, now)

    def on_refused(self, now: float) -> "Prober":
        """ICMP port unreachable from the peer: the path delivered our probe and
        the peer's answer, but no daemon listens (restart, upgrade). Misses in
        the next `refused_grace_s` are not the path's fault."""
        self.counters.refused += 1
        self.refused_at = now
        return self

    def witnessed(self, others_live: bool, heard_at: float | None = None) -> "Prober":
        """What the daemon's other paths show: whether any is live, and (when
        given) that one of them just received a reply at `heard_at`."""
        if heard_at is not None and (self.others_heard_at is None
                                     or heard_at > self.others_heard_at):
            self.others_heard_at = heard_at
        self.others_live = others_live
        return self

    def poke(self, now: float, witness: bool = True) -> tuple["Prober", Send]:
        """Send a probe now, ahead of the schedule (which stays). A witness's
        (another path is confirming a loss: a reply here within its burst shows
        our host's stack is not what is silent) is never counted in the loss
        window and its loss raises no suspicion. Otherwise it is a steady probe,
        whose loss does: a rail too small for a rail verdict (core.railwatch)
        asks its other paths now, and each that misses confirms on its own."""
        return self, self._send(now, witness)

    def peer_answered(self, sent_at: float, received_at: float) -> "Prober":
        """The peer's daemon (the same responder, known by its id) answered, on
        another path, a probe we sent at `sent_at`; the reply came at
        `received_at`. A responder answers its requests in the order they
        reach it, so a confirmation probe of ours sent before that one, and
        still unanswered a margin after that reply, was lost on this path:
        the peer was answering (a stalled peer answers nothing later), and
        waiting out the whole timeout tells nothing more. See _expire. That
        reply is also a witness's (see `witnessed`): our host is not silent."""
        if sent_at > self.peer_answered_sent:
            self.peer_answered_sent, self.peer_answered_at = sent_at, received_at
        return self.witnessed(True, received_at)  # another path is live, and just heard

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

    # ------------------------------------------------------------- internals

    def _count(self, **deltas: int) -> "Prober":
        c = self.counters
        for k, v in deltas.items():
            setattr(c, k, getattr(c, k) + v)
        return self

    def _send(self, now: float, burst: bool) -> Send:
        """Record a probe sent now (this runs for every probe of every path)."""
        seq = self.next_seq
        self.next_seq = seq % (SEQ_MODULO - 1) + 1
        self._flights[seq] = InFlight(seq, now, now + self.config.timeout_s, burst)
        self.counters.sent += 1
        return Send(seq, burst)

    def _ordered_at(self) -> float | None:
        """When confirmation probes sent before `peer_answered_sent` count as
        lost (None: no such evidence, or none wanted, or not confirming)."""
        margin = self.config.order_margin_s
        if margin is None or self.state is not PathState.SUSPECT or self.burst_held \
                or self.peer_answered_sent < self.burst_from:
            return None
        if self.rtt_s is not None and 4 * self.rtt_s > margin:
            margin = 4 * self.rtt_s  # a path slower than its peers gets more time
        return self.peer_answered_at + margin

    def _early_suspicion_at(self) -> float | None:
        """How long after its send an unanswered steady probe raises suspicion
        (None: not before its deadline)."""
        if self.state is not PathState.UP or self.config.suspect_after_s >= self.config.timeout_s:
            return None
        return self.config.suspect_after_s

    def _suspect_early(self, now: float, host_stalls: StallLog | None) -> None:
        """A steady probe unanswered `suspect_after_s` after it left: suspect
        the path now (confirmation starts), judge the probe at its deadline.
        Not when a stall of ours or a refusal could explain the silence."""
        cfg = self.config
        for f in self._flights.values():
            if f.burst or f.seq == self._early_seq or f.sent_at + cfg.suspect_after_s > now:
                continue
            self._early_seq = f.seq
            if self.refused_at is not None and now - self.refused_at <= cfg.refused_grace_s:
                continue
            if stalled_time(self.stalls, f.sent_at, now, host_stalls) >= \
                    cfg.suspect_after_s * cfg.max_stall_ratio:
                continue
            self._suspect(now, f.sent_at)
            return

    def _expire(self, now: float, host_stalls: StallLog | None = None) -> None:
        ordered = self._ordered_at()
        if ordered is not None and ordered <= now:
            sent_by = self.peer_answered_sent
            due = [f for f in self._flights.values()
                   if f.deadline <= now or (f.burst and f.sent_at <= sent_by)]
        else:
            due = [f for f in self._flights.values() if f.deadline <= now]
        for flight in due:
            if self._flights.pop(flight.seq, None) is None:
                continue  # judged meanwhile (a conclusion clears nothing, but be safe)
            if self.refused_at is not None and now - self.refused_at <= self.config.refused_grace_s:
                self.counters.unknown_other += 1
                self._judge(flight, Outcome.UNKNOWN, now)
            elif (stalled_time(self.stalls, flight.sent_at, now, host_stalls)
                  >= self.config.stall_budget_s):
                self.counters.unknown_lag += 1
                self._judge(flight, Outcome.UNKNOWN, now)
            else:
                self._judge(flight, Outcome.LOST, now)

    def _late_or_stray(self, seq: int, echoed_sent_at: float | None, now: float) -> "Prober":
        for j_seq, sent_at in reversed(self._judged):
            if j_seq == seq and (echoed_sent_at is None or abs(echoed_sent_at - sent_at) <= 1e-6):
                self.counters.late += 1
                if self.state is PathState.SUSPECT:
                    return self._end_suspicion(now, "a late reply arrived: the path is slow, "
                                                    "not dead")
                return self
        self.counters.stray += 1
        return self

    def _judge(self, flight: InFlight, outcome: Outcome, now: float,
               replied: bool = False) -> "Prober":
        """Apply one probe's outcome. `replied`: a reply came, however late."""
        self._judged.append((flight.seq, flight.sent_at))
        c = self.counters
        if outcome is Outcome.OK:
            c.received += 1
        elif outcome is Outcome.LOST:
            if self.state is PathState.NEVER_UP:
                c.unanswered += 1
            else:
                c.lost += 1
                self.lost_sent_at = flight.sent_at
        missed = outcome is Outcome.LOST or outcome is Outcome.LATE

        if self.state is PathState.NEVER_UP or self.state is PathState.DOWN:
            if outcome is Outcome.OK:
                self.streak += 1
                if self.streak >= self.config.rise:
                    first = self.state is PathState.NEVER_UP
                    return self._become_up(now, f"{self.streak} replies in a row"
                                           + (" (first contact)" if first else " after DOWN"))
            elif missed:
                self.streak = 0
            return self

        # UP or SUSPECT: the steady probes measure loss; a lost one raises suspicion.
        if not flight.burst and outcome is not Outcome.UNKNOWN:
            self._window_add(missed, now)
        if self.state is PathState.SUSPECT:
            if replied:
                return self._end_suspicion(now, "a reply arrived during confirmation")
            if flight.burst and not self.burst_held and flight.sent_at >= self.burst_from:
                self.burst_outcomes += (outcome,)
                if outcome is Outcome.UNKNOWN and self.burst_scheduled < self.config.burst_max:
                    # No evidence either way: replace it, rather than give up on the burst.
                    after = self.burst_due[-1] if self.burst_due else now
                    self.burst_due += (after + self.config.burst_interval_s,)
                    self.burst_scheduled += 1
                if (self.burst_outcomes.count(Outcome.LOST) >= self.burst_size
                        or len(self.burst_outcomes) >= self.burst_scheduled):
                    return self._conclude_burst(now)
            return self
        if outcome is Outcome.LOST and not flight.burst:
            return self._suspect(now, flight.sent_at)
        return self

    def _window_add(self, lost: bool, now: float) -> None:
        cfg, window = self.config, self._window
        if len(window) == cfg.loss_window:
            self._window_lost -= window[0]
        window.append(lost)
        self._window_lost += lost
        if len(window) < cfg.loss_window:
            return
        ratio = self._window_lost / len(window)
        if not self.degraded and ratio > cfg.max_loss_ratio:
            self.degraded, self.since = True, now
            self.reason = (f"loss {ratio:.0%} over the last {len(window)} probes "
                           f"> {cfg.max_loss_ratio:.0%}")
            self.counters.degradations += 1
        elif self.degraded and ratio <= cfg.clear_loss_ratio:
            self.degraded, self.since = False, now
            self.reason = f"loss back to {ratio:.0%} (<= {cfg.clear_loss_ratio:.0%})"

    def _clear_window(self) -> None:
        self._window.clear()
        self._window_lost = 0

    def _suspect(self, now: float, since: float) -> "Prober":
        cfg = self.config
        n = len(self._window)
        k = burst_size(cfg, self._window_lost / n if n >= _MIN_LOSS_SAMPLE else 0.0)
        self.state = PathState.SUSPECT
        self.burst_from = now
        self.burst_due = () if self.coordinated else tuple(
            now + i * cfg.burst_interval_s for i in range(k))
        self.burst_size = self.burst_scheduled = k
        self.burst_outcomes = ()
        self.grace_until = None
        self.burst_held = self.coordinated
        self.suspect_since = since
        self.counters.bursts += 1
        return self

    def _end_suspicion(self, now: float, why: str) -> "Prober":
        # `since` is untouched: the reported verdict (UP or DEGRADED) never changed.
        self.state = PathState.UP
        self.burst_due = self.burst_outcomes = ()
        self.grace_until = None
        self.burst_held = False
        self.reason = f"suspicion cleared: {why}"
        return self

    def _conclude_burst(self, now: float) -> "Prober":
        if self.grace_until is not None:
            return self  # already concluded; waiting out the grace
        lost = self.burst_outcomes.count(Outcome.LOST)
        if lost < self.burst_size:
            return self._end_suspicion(
                now, f"confirmation inconclusive ({lost} of {self.burst_scheduled} lost, "
                     "the rest unjudged)")
        if self.others_live and (self.others_heard_at is None
                                 or self.others_heard_at < self.burst_from):
            # Every other live path went silent over the same burst (their
            # witness probes unanswered too): a stall of this host's network
            # stack or of the peer, not a fault of this path.
            self.counters.host_silences += 1
            return self._end_suspicion(
                now, "every other path was silent during the confirmation too: a stall of "
                     "this host, not a path fault")
        if not self.others_live and self.config.peer_grace_s > 0:
            # No other path can vouch for the host or the peer: give a stalled
            # peer (its reply would carry how long it held our probe) a moment.
            self.burst_due = ()
            self.grace_until = now + self.config.peer_grace_s
            return self
        return self._go_down(now)

    def _go_down(self, now: float, reason: str = "") -> "Prober":
        if not reason:
            lost = self.burst_outcomes.count(Outcome.LOST)
            reason = (f"no reply to a probe nor to {lost} confirmation probes "
                      "(blackhole or one-way loss)")
        self.state = PathState.DOWN
        self.degraded = False
        self.since, self.reason = now, reason
        self.burst_due = self.burst_outcomes = ()
        self._clear_window()
        self.streak = 0
        self.grace_until = None
        self.burst_held = False
        self.counters.downs += 1
        return self

    def _become_up(self, now: float, why: str) -> "Prober":
        self.state = PathState.UP
        self.degraded = False
        self.since, self.reason = now, why
        self._clear_window()
        self.burst_due = self.burst_outcomes = ()
        self.burst_held = False
        return self
