"""The detection contract of core.probe, under simulated time (no root).

`Sim` plays our event loop, the network and the peer's responder. Our loop
can stall (nothing runs during a stall: what falls due runs at its end, and a
batch of probes queued just before it leaves after it); the responder can
hold requests; each direction can lose packets at random, drop them in an
outage, or hold them in a pause (a PFC-like stall: nothing lost, all
delivered at its end). Like the adapter, the loop takes `now`, reads the
replies the kernel holds (with their kernel receive times), then judges.

The contract (core.probe, docs/probing.md): no outage or pause shorter than
the tolerance ever takes a path DOWN, on either end, whatever either loop
does; an outage of tolerance + interval or longer is always DOWN, within
`detection_bound_s`.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linkpassd.core.model import Verdict
from linkpassd.core.probe import (
    TRANSITIONS,
    Evidence,
    PathState,
    ProbeConfig,
    Prober,
    chain_span_s,
    confirm_count,
    confirm_spacing_s,
    detection_bound_s,
)
from linkpassd.core.railverdict import rail_assessment

PEER = "198.18.1.2"
INF = math.inf


@dataclass
class Window:
    start: float
    end: float = INF

    def __contains__(self, t: float) -> bool:
        return self.start <= t < self.end


@dataclass
class Sim:
    config: ProbeConfig = field(default_factory=ProbeConfig)
    seed: int = 0
    rtt: float = 0.0002
    req_loss: float = 0.0  # random loss, host -> peer
    rep_loss: float = 0.0  # random loss, peer -> host
    drop_req: list[Window] = field(default_factory=list)  # outages, host -> peer
    drop_rep: list[Window] = field(default_factory=list)  # outages, peer -> host
    hold_req: list[Window] = field(default_factory=list)  # pauses, host -> peer (held, not lost)
    hold_rep: list[Window] = field(default_factory=list)  # pauses, peer -> host
    refusing: list[Window] = field(default_factory=list)  # peer host up, daemon down: ICMP
    stalls: list[Window] = field(default_factory=list)  # our loop runs nothing
    send_delay: list[Window] = field(default_factory=list)  # a batch queued in one leaves at its end
    peer_stalls: list[Window] = field(default_factory=list)  # the responder answers nothing
    peer_probes: bool = False  # the peer probes us too (feeds peer_heard)
    # Our loop preempted between reading the sockets and judging (another
    # path's turn in the same wake-up, or the scheduler): judged as of the read.
    preempted: list[Window] = field(default_factory=list)
    # Our loop's timers fire this late, every one of them (a busy host: the
    # loop wakes for a timer when the scheduler runs it, not on time).
    late: float = 0.0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.p = Prober(PEER, self.config)
        self.t = 0.0
        self.events: list[tuple[float, int, str, tuple]] = []  # (kernel arrival, order, kind, data)
        self._order = 0
        self._icmp_at = -INF
        self.phases: list[tuple[float, str]] = [(0.0, self.p.phase)]
        self.sent = 0

    @staticmethod
    def _in(windows: list[Window], t: float) -> Window | None:
        return next((w for w in windows if t in w), None)

    def _after(self, windows: list[Window], t: float) -> float:
        while (w := self._in(windows, t)) is not None:  # windows may touch or overlap
            t = w.end
        return t

    def run(self, until: float) -> "Sim":
        while True:
            wake = max(self.p.next_wakeup() + self.late, self.t)
            arrival = self.events[0][0] if self.events else INF
            handled = self._after(self.stalls, min(wake, arrival))
            if handled > until:
                break
            self.t = now = handled
            # The adapter: `now`, then every reply the kernel already holds, then judge.
            while self.events and self.events[0][0] <= now:
                t_arr, _, kind, data = heapq.heappop(self.events)
                if kind == "reply":
                    seq, sent_at, held = data
                    self.p.on_reply(seq, t_arr, sent_at, held)
                else:
                    self.p.on_refused(t_arr)
                self._record(now)
            if self.peer_probes and self._in(self.drop_rep, now) is None \
                    and self._in(self.hold_rep, now) is None:
                self.p.peer_heard(now)
            later = self._after(self.preempted, now)
            if later > now:
                self.t = later
            _, sends = self.p.poll(later, 0.0, now)
            for send in sends:
                left = self._after(self.send_delay, later)
                if left > now:
                    self.p.restamp(send.seq, left)  # as adapters.echorail does
                self._transmit(send.seq, later, left)
            self._record(later)
        self.t = max(self.t, until)
        return self

    def _record(self, now: float) -> None:
        if self.p.phase != self.phases[-1][1]:
            self.phases.append((now, self.p.phase))

    def _push(self, t: float, kind: str, data: tuple) -> None:
        self._order += 1
        heapq.heappush(self.events, (t, self._order, kind, data))

    def _transmit(self, seq: int, stamped: float, left: float) -> None:
        self.sent += 1
        if self.rng.random() < self.req_loss or self._in(self.drop_req, left):
            return
        at_peer = self._after(self.hold_req, left) + self.rtt / 2
        if self._in(self.refusing, at_peer):
            if at_peer - self._icmp_at >= 1.0:  # the kernel's ICMP rate limit
                self._icmp_at = at_peer
                if not self._in(self.drop_rep, at_peer):
                    self._push(at_peer + self.rtt / 2, "refused", ())
            return
        answered = self._after(self.peer_stalls, at_peer)
        if self.rng.random() < self.rep_loss or self._in(self.drop_rep, answered):
            return
        back = self._after(self.hold_rep, answered) + self.rtt / 2
        self._push(back, "reply", (seq, stamped, answered - at_peer))

    def first(self, phase: str, after: float = 0.0) -> float | None:
        return next((t for t, ph in self.phases if ph == phase and t >= after), None)

    def count(self, phase: str) -> int:
        return sum(1 for _, ph in self.phases if ph == phase)

    def up(self, until: float = 1.0) -> "Sim":
        self.run(until)
        assert self.p.state is PathState.UP, self.p.assessment()
        return self


FAST = ProbeConfig(interval_s=0.010)
SLOW = ProbeConfig(interval_s=0.050)


# --------------------------------------------------------------------------
# The machine and its arithmetic
# --------------------------------------------------------------------------


def test_the_transition_table_is_total():
    assert set(TRANSITIONS) == {(s, e) for s in PathState for e in Evidence}


def test_only_a_confirmed_silence_takes_a_path_down_and_only_replies_bring_it_up():
    down = {k for k, v in TRANSITIONS.items() if v is PathState.DOWN and k[0] is not PathState.DOWN}
    assert {e for _, e in down} == {Evidence.TOLERANCE}
    up = {k for k, v in TRANSITIONS.items() if v is PathState.UP and k[0] in
          (PathState.NEVER_UP, PathState.DOWN)}
    assert up == {(PathState.NEVER_UP, Evidence.RISE), (PathState.DOWN, Evidence.RISE)}
    assert all(v is PathState.NEVER_UP for (s, e), v in TRANSITIONS.items()
               if s is PathState.NEVER_UP and e is not Evidence.RISE)


@pytest.mark.parametrize("bad", [
    dict(interval_s=0), dict(tolerance_s=0), dict(suspect_after_s=0.03),
    dict(suspect_after_s=0), dict(confirm_probes=0), dict(confirm_probes=1),
    dict(confirm_probes=40), dict(rise=0),
    dict(loss_window=0), dict(max_loss_ratio=0.05), dict(false_down_odds=1.0),
])
def test_bad_config_is_rejected_with_the_reason(bad):
    with pytest.raises(ValueError, match="must|need"):
        ProbeConfig(**bad)


def test_the_documented_bound_and_spacing():
    cfg = ProbeConfig()  # 50 ms, 30 ms tolerance, 8 confirmations, 3 ms reply wait
    assert confirm_spacing_s(cfg) == pytest.approx(0.00375)
    assert detection_bound_s(cfg) == pytest.approx(0.050 + 0.030 + 0.003)
    assert detection_bound_s(FAST) == pytest.approx(0.010 + 0.030 + 0.003)
    # A lossy path's grid is finer than the reply wait: the points that pass
    # during it are made up by one probe, the rest come after the tolerance.
    assert chain_span_s(cfg, 10) == pytest.approx(0.030)  # one point passed (3 ms)
    assert chain_span_s(cfg, 12) == pytest.approx(0.030)  # one point passed (2.5 ms)
    assert chain_span_s(cfg, 32) == pytest.approx(34 * 0.030 / 32)  # three passed


def test_one_confirmation_could_never_span_the_tolerance():
    """Why confirm_probes starts at 2: one confirmation a tolerance after
    the first probe is a gap longer than half the tolerance, so the chain
    would start again for ever and a blackhole would never be DOWN."""
    with pytest.raises(ValueError, match="2 <= confirm_probes"):
        ProbeConfig(confirm_probes=1)
    two = ProbeConfig(confirm_probes=2)
    sim = Sim(two, drop_req=[Window(1.0)]).up().run(2.0)
    down = sim.first("DOWN", after=1.0)
    assert down is not None and down - 1.0 <= detection_bound_s(two) + 1e-9


def test_the_confirmation_grows_with_the_loss_already_measured():
    cfg = ProbeConfig()
    assert confirm_count(cfg, 0.0) == cfg.confirm_probes
    assert confirm_count(cfg, 0.2) == 12  # 0.2 ** 13 < 1e-9 <= 0.2 ** 12
    assert 0.2 ** (confirm_count(cfg, 0.2) + 1) <= cfg.false_down_odds
    assert confirm_count(cfg, 0.9) == cfg.confirm_max


# --------------------------------------------------------------------------
# Tolerance: nothing shorter than the tolerance fails a path over
# --------------------------------------------------------------------------


def _phase(cfg: ProbeConfig, seed: int) -> float:
    """A fault start at a random phase of the probe schedule, after the path is up."""
    return 1.0 + random.Random(seed).random() * cfg.interval_s


@pytest.mark.parametrize("cfg", [FAST, SLOW], ids=["10ms", "50ms"])
@pytest.mark.parametrize("kind", ["drop_req", "drop_rep", "both", "hold_req", "hold_rep"])
@pytest.mark.parametrize("length_ms", [5, 10, 20, 25, 29])
@pytest.mark.parametrize("seed", range(6))
def test_no_outage_or_pause_below_the_tolerance_fails_the_path(cfg, kind, length_ms, seed):
    f = _phase(cfg, seed)
    w = [Window(f, f + length_ms / 1e3)]
    args = {"drop_req": w, "drop_rep": w} if kind == "both" else {kind: w}
    sim = Sim(cfg, seed=seed, **args).up().run(2.0)
    assert sim.count("DOWN") == 0, sim.phases
    assert sim.p.state is PathState.UP


@pytest.mark.parametrize("cfg", [FAST, SLOW], ids=["10ms", "50ms"])
@pytest.mark.parametrize("length_ms", [10, 25, 29])
def test_a_stalled_peer_below_the_tolerance_fails_nothing(cfg, length_ms):
    held = []
    for seed in range(6):
        f = _phase(cfg, seed)
        sim = Sim(cfg, seed=seed, peer_stalls=[Window(f, f + length_ms / 1e3)]).up().run(2.0)
        assert sim.count("DOWN") == 0, sim.phases
        held.append(sim.p.held_max_s)
    assert max(held) > 0  # some probe did meet the stalled peer


@pytest.mark.parametrize("stall_ms", [5, 30, 100, 500])
def test_a_stall_of_our_own_loop_of_any_length_fails_nothing(stall_ms):
    """Our loop stops for longer than the tolerance: replies wait in the
    kernel, and are read (with their receive times) before anything is judged."""
    for seed in range(6):
        f = _phase(FAST, seed)
        sim = Sim(FAST, seed=seed, stalls=[Window(f, f + stall_ms / 1e3)]).up().run(2.0)
        assert sim.count("DOWN") == 0, sim.phases


@pytest.mark.parametrize("delay_ms", [5, 40, 200])
def test_probes_that_leave_late_are_judged_from_when_they_left(delay_ms):
    """A stall between stamping a batch and sending it: restamped, no verdict."""
    for seed in range(6):
        f = _phase(FAST, seed)
        sim = Sim(FAST, seed=seed, send_delay=[Window(f, f + delay_ms / 1e3)]).up().run(2.0)
        assert sim.count("DOWN") == 0, sim.phases


@pytest.mark.parametrize("length_ms", [5, 29])
def test_preempted_between_the_read_and_the_judgement_fails_nothing(length_ms):
    """Preempted for 50 ms between reading the replies and judging, while the
    peer holds our requests for nearly the tolerance: judged as of the read."""
    for seed in range(10):
        f = _phase(FAST, seed)
        sim = Sim(FAST, seed=seed, peer_stalls=[Window(f, f + length_ms / 1e3)],
                  preempted=[Window(f + length_ms / 2e3, f + length_ms / 2e3 + 0.050)])
        sim.up().run(2.0)
        assert sim.count("DOWN") == 0, sim.phases


def test_without_the_restamp_a_late_batch_would_fail_the_path():
    """The control for the test above: the restamp is what keeps it safe."""
    class NoRestamp(Prober):
        __slots__ = ()

        def restamp(self, seq, sent_at):
            return self

    sim = Sim(FAST, send_delay=[Window(1.0, 1.2)])
    sim.p = NoRestamp(PEER, FAST)
    sim.up().run(2.0)
    assert sim.count("DOWN") == 1


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([FAST, SLOW]),
       st.lists(st.tuples(st.sampled_from(["drop_req", "drop_rep", "hold_req", "hold_rep",
                                           "peer_stalls"]),
                          st.floats(0.0, 0.5), st.floats(0.0005, 0.0295)),
                min_size=1, max_size=4),
       st.lists(st.tuples(st.floats(0.0, 0.5), st.floats(0.001, 0.3)), max_size=3),
       st.integers(0, 1000))
def test_any_mix_of_short_faults_and_our_stalls_fails_nothing(cfg, faults, stalls, seed):
    """Faults shorter than the tolerance, apart from each other by more than
    it (one fault at a time), and our loop stalling at any time for any length."""
    faults = sorted(faults, key=lambda f: f[1])
    kept, end = [], -INF
    for kind, start, length in faults:
        if 1.0 + start >= end + cfg.tolerance_s:
            kept.append((kind, Window(1.0 + start, 1.0 + start + length)))
            end = 1.0 + start + length
    sim = Sim(cfg, seed=seed, stalls=[Window(1.0 + s, 1.0 + s + n) for s, n in stalls])
    for kind, w in kept:
        getattr(sim, kind).append(w)
    sim.up().run(2.5)
    assert sim.count("DOWN") == 0, (kept, sim.phases)


# --------------------------------------------------------------------------
# Detection: a longer outage is caught soon after the tolerance
# --------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [FAST, SLOW], ids=["10ms", "50ms"])
@pytest.mark.parametrize("kind", ["drop_req", "drop_rep", "both"])
def test_a_silent_blackhole_is_down_within_the_bound(cfg, kind):
    took = []
    for seed in range(20):
        f = _phase(cfg, seed)
        w = [Window(f)]
        args = {"drop_req": w, "drop_rep": w} if kind == "both" else {kind: w}
        sim = Sim(cfg, seed=seed, **args).up().run(f + 1.0)
        down = sim.first("DOWN", after=f)
        assert down is not None, sim.phases
        took.append(down - f)
        assert cfg.tolerance_s <= down - f <= detection_bound_s(cfg) + 1e-9, (down - f, sim.phases)
    assert max(took) - min(took) <= cfg.interval_s + 1e-9


@pytest.mark.parametrize("cfg", [FAST, SLOW], ids=["10ms", "50ms"])
@pytest.mark.parametrize("late_ms", [0.5, 1.0, 2.0])
def test_late_timers_delay_a_verdict_once_not_once_per_probe(cfg, late_ms):
    """Every timer of our loop fires `late_ms` late (a busy host). The
    confirmations keep their grid from the chain's first probe, so the chain
    still completes a tolerance after it, and the lateness is paid at the
    last probe and at its judgement, not at each of the nine probes (with
    each confirmation timed from the previous one's late send, a 1 ms
    lateness made the verdict 9 ms later at the 50 ms interval)."""
    late = late_ms / 1e3
    for seed in range(10):
        f = _phase(cfg, seed)
        sim = Sim(cfg, seed=seed, drop_req=[Window(f)], late=late).up().run(f + 1.0)
        down = sim.first("DOWN", after=f)
        suspect = sim.first("SUSPECT", after=f)
        assert down is not None and suspect is not None, sim.phases
        first = suspect - late - cfg.suspect_after_s  # the chain's first probe left then
        assert down - first <= cfg.tolerance_s + cfg.suspect_after_s + 2 * late + 1e-9, \
            (down - first, sim.phases)


@pytest.mark.parametrize("loss", [0.25, 0.5])
def test_a_lossy_path_is_down_within_its_own_bound(loss):
    """A path that already loses probes needs more of them (confirm_count),
    on a grid finer than the reply wait: still within detection_bound_s for
    its confirmation count."""
    for seed in range(10):
        f = 30.0 + _phase(SLOW, seed) - 1.0
        sim = Sim(SLOW, seed=seed, req_loss=loss, drop_req=[Window(f)]).up(until=f)
        confirm = confirm_count(SLOW, loss)
        sim.run(f + 1.0)
        down = sim.first("DOWN", after=f)
        assert down is not None, sim.phases[-5:]
        assert down - f <= detection_bound_s(SLOW, max(confirm, sim.p.confirm)) + 1e-9


@pytest.mark.parametrize("cfg", [FAST, SLOW], ids=["10ms", "50ms"])
def test_an_outage_of_tolerance_plus_interval_is_always_caught(cfg):
    length = cfg.tolerance_s + cfg.interval_s + cfg.suspect_after_s
    for seed in range(20):
        f = _phase(cfg, seed)
        sim = Sim(cfg, seed=seed, drop_req=[Window(f, f + length)]).up().run(f + 1.0)
        assert sim.count("DOWN") == 1, sim.phases


def test_a_pause_longer_than_the_tolerance_is_down_and_comes_back_after_rise():
    f = 1.0
    sim = Sim(FAST, hold_rep=[Window(f, f + 0.100)]).up().run(f + 0.5)
    assert sim.first("DOWN", after=f) is not None
    assert sim.first("UP", after=f + 0.100) is not None
    assert sim.p.state is PathState.UP


def test_a_stall_of_ours_during_a_blackhole_delays_the_verdict_never_spoils_it():
    f = 1.0
    sim = Sim(FAST, drop_req=[Window(f)], stalls=[Window(f + 0.005, f + 0.080)]).up().run(f + 1)
    down = sim.first("DOWN", after=f)
    assert down is not None and down >= f + 0.080


@pytest.mark.parametrize("direction", ["drop_req", "drop_rep"])
def test_one_way_loss_is_down_and_says_which_way_when_the_peer_probes_us(direction):
    sim = Sim(FAST, peer_probes=True, **{direction: [Window(1.0)]}).up().run(2.0)
    assert sim.p.state is PathState.DOWN
    detail = sim.p.assessment().detail
    assert ("our requests are being lost" in detail) == (direction == "drop_req")


# --------------------------------------------------------------------------
# Noise, quality, recovery
# --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_five_percent_random_loss_each_way_at_ten_milliseconds_fails_nothing(seed):
    sim = Sim(FAST, seed=seed, req_loss=0.05, rep_loss=0.05).up().run(120.0)
    assert sim.count("DOWN") == 0
    assert sim.p.counters.silences > 100  # it was tested: many silences, none confirmed


def test_twenty_percent_sustained_loss_is_degraded_not_down_and_clears_after():
    cfg = ProbeConfig(interval_s=0.010, loss_window=100)
    sim = Sim(cfg, seed=1, req_loss=0.25).up().run(6.0)
    assert sim.p.phase == "DEGRADED" and sim.count("DOWN") == 0
    assert sim.p.assessment().effective is Verdict.DEGRADED
    sim.req_loss = 0.0
    sim.run(10.0)
    assert sim.p.phase == "UP"


def test_recovery_needs_rise_replies_in_a_row():
    cfg = ProbeConfig(interval_s=0.010, rise=3)
    sim = Sim(cfg, drop_req=[Window(1.0, 2.0)]).up().run(2.0)
    assert sim.p.state is PathState.DOWN
    sim.run(2.0 + 4 * cfg.interval_s)
    up = sim.first("UP", after=2.0)
    # The first probe after the fault lands within one interval; the rise-th after it.
    assert up is not None and 2.0 + 2 * cfg.interval_s <= up <= 2.0 + 3 * cfg.interval_s + 1e-3


def test_a_peer_daemon_restart_answered_by_icmp_is_not_a_failure():
    sim = Sim(FAST, refusing=[Window(1.0, 4.0)]).up().run(3.0)
    assert sim.count("DOWN") == 0 and sim.p.state is PathState.NEVER_UP
    assert sim.p.assessment().effective is None and "away" in sim.p.reason
    sim.run(5.0)
    assert sim.count("DOWN") == 0 and sim.p.state is PathState.UP


def test_a_peer_host_that_vanishes_without_icmp_is_down():
    sim = Sim(FAST, drop_req=[Window(1.0)]).up().run(2.0)
    assert sim.p.state is PathState.DOWN


def test_a_path_that_never_came_up_is_never_a_failure():
    sim = Sim(FAST, drop_req=[Window(0.0)]).run(3.0)
    assert sim.p.state is PathState.NEVER_UP and sim.count("DOWN") == 0
    assert sim.p.assessment().effective is None
    assert len(sim.p.inflight) <= 64  # a dead path's memory stays bounded


def test_confirmations_go_only_while_silent_and_cost_a_few_probes():
    sim = Sim(FAST).up().run(10.0)
    assert sim.p.counters.confirmations == 0
    before = sim.sent
    sim.drop_req.append(Window(10.0005, 10.012))  # one steady probe lost
    sim.run(10.5)
    extra = sim.sent - before - round(0.5 / FAST.interval_s)
    assert 1 <= extra <= FAST.confirm_probes


def test_the_longest_silence_and_its_margin_are_kept_for_operators():
    sim = Sim(FAST, hold_rep=[Window(1.0, 1.020)]).up().run(2.0)
    assert 0.015 <= sim.p.longest_silence_s <= 0.025
    assert sim.p.margin_s == pytest.approx(FAST.tolerance_s - sim.p.longest_silence_s)
    assert "longest silence" in sim.p.assessment().detail


def test_stray_duplicate_and_stale_replies_change_nothing_but_counters():
    sim = Sim(FAST).up()
    state = (sim.p.state, sim.p.streak)
    sim.p.on_reply(999_999, sim.t, None)
    sim.p.on_reply(1, sim.t, None)  # answered long ago
    assert (sim.p.state, sim.p.streak) == state
    assert sim.p.counters.late == 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["poll", "reply", "refused", "error", "restamp"]),
                          st.floats(0, 0.02), st.integers(0, 40)), max_size=120))
def test_any_order_of_events_keeps_the_machine_consistent(events):
    p, t = Prober(PEER, FAST), 0.0
    for kind, dt, n in events:
        t += dt
        if kind == "poll":
            p.poll(t)
        elif kind == "reply":
            p.on_reply(n, t, None)
        elif kind == "refused":
            p.on_refused(t)
        elif kind == "error":
            p.on_send_error(n, t)
        else:
            p.restamp(n, t)
        assert p.state in PathState
        assert p.silence_from is None or p.state is PathState.SUSPECT
        assert p.next_confirm is None or p.state is PathState.SUSPECT
        assert len(p.inflight) <= 64 or p.state in (PathState.UP, PathState.SUSPECT)
        p.assessment()


def test_a_rail_with_one_dead_peer_is_not_down_but_all_dead_is():
    up = Sim(FAST).up().p.assessment()
    dead = Sim(FAST, drop_req=[Window(1.0)]).up().run(2.0).p.assessment()
    assert rail_assessment([up, dead, up], "echo").effective is Verdict.UP
    assert rail_assessment([dead, dead], "echo").effective is Verdict.DOWN


# --------------------------------------------------------------------------
# The rail's other paths look too (evidence, never a verdict)
# --------------------------------------------------------------------------


def test_a_silence_asks_the_rail_once_after_a_quarter_of_the_tolerance():
    sim = Sim(FAST, drop_req=[Window(1.0)]).up().run(1.0)
    p = sim.p
    asked = []
    t = 1.0
    while t < 1.2:
        t += 0.0005
        sim.run(t)
        since = p.silence_from
        if p.asks_rail(t):
            asked.append(t - since)
    assert len(asked) == 1  # once per silence
    assert FAST.tolerance_s / 4 <= asked[0] < FAST.tolerance_s


def test_random_loss_rarely_asks_the_rail():
    """Silences of random loss end with a confirmation's reply: at 5 % loss
    each way a silence reaches a quarter of the tolerance about once in a
    thousand silences."""
    sim = Sim(FAST, seed=3, req_loss=0.05, rep_loss=0.05).up()
    asks, t = 0, sim.t
    while t < 60.0:
        t += FAST.confirm_probes and confirm_spacing_s(FAST)
        sim.run(t)
        asks += sim.p.asks_rail(t)
    assert sim.p.counters.silences > 300
    assert asks <= sim.p.counters.silences / 50


def test_an_early_probe_is_not_counted_in_the_window_and_only_an_up_path_sends_it():
    p = Sim(FAST).up().p
    window = p.window
    send = p.probe_now(2.0)
    assert send is not None and send.burst and p.window == window
    never = Prober(PEER, FAST)
    assert never.probe_now(2.0) is None


def test_a_rail_asks_at_most_once_per_tolerance():
    from linkpassd.core.probe import rail_ask_due
    assert rail_ask_due(None, 5.0, FAST)
    assert not rail_ask_due(5.0, 5.0 + FAST.tolerance_s / 2, FAST)
    assert rail_ask_due(5.0, 5.0 + FAST.tolerance_s, FAST)
