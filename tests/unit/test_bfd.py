"""BFD core (RFC 5880/5881): codec against scapy's BFD layer, reception checks,
and the session state machine with simulated time; plus the adapter's
demultiplexing, GTSM check and lag meter without sockets."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import socket
import struct
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.compat import raw
from scapy.contrib.bfd import BFD

from linkpassd.adapters import bfd as adapter
from linkpassd.adapters.looplag import LoopLag
from linkpassd.core import bfd
from linkpassd.core.bfd import (
    SLOW_TX_US,
    TRANSITIONS,
    ControlPacket,
    Diag,
    Discarded,
    Invalid,
    Reason,
    Send,
    Session,
    SessionConfig,
    State,
    StateChange,
    decode,
    encode,
    jitter_factor,
)
from linkpassd.core.looplag import LagHistory

U32 = st.integers(0, 0xFFFFFFFF)
NZ32 = st.integers(1, 0xFFFFFFFF)


# --------------------------------------------------------------------------
# Codec
# --------------------------------------------------------------------------


def test_encode_matches_the_rfc_layout_byte_for_byte():
    pkt = ControlPacket(my_discr=1, your_discr=2, state=State.UP, diag=Diag.PATH_DOWN,
                        detect_mult=3, desired_min_tx_us=100_000, required_min_rx_us=300_000,
                        poll=True)
    wire = encode(pkt)
    assert wire == bytes.fromhex("25" "e0" "03" "18" "00000001" "00000002"
                                 "000186a0" "000493e0" "00000000")
    assert decode(wire) == pkt


@st.composite
def valid_packets(draw):
    state = draw(st.sampled_from(list(State)))
    your = draw(NZ32 if state in (State.INIT, State.UP) else U32)
    poll = draw(st.booleans())
    return ControlPacket(
        my_discr=draw(NZ32), your_discr=your, state=state, diag=draw(st.integers(0, 31)),
        detect_mult=draw(st.integers(1, 255)), desired_min_tx_us=draw(U32),
        required_min_rx_us=draw(U32), required_min_echo_rx_us=draw(U32),
        poll=poll, final=draw(st.booleans()) and not poll, cpi=draw(st.booleans()),
        demand=draw(st.booleans()))


@given(valid_packets())
def test_valid_packets_round_trip(pkt):
    assert decode(encode(pkt)) == pkt


def scapy_flags(pkt: ControlPacket) -> int:
    bits = {"multipoint": 0x01, "demand": 0x02, "auth": 0x04, "cpi": 0x08, "final": 0x10,
            "poll": 0x20}
    return sum(bit for name, bit in bits.items() if getattr(pkt, name))


@st.composite
def any_fields(draw):
    """Field values valid or not (A bit aside: scapy then expects an auth section)."""
    return ControlPacket(
        my_discr=draw(U32), your_discr=draw(U32), state=draw(st.sampled_from(list(State))),
        diag=draw(st.integers(0, 31)), detect_mult=draw(st.integers(0, 255)),
        desired_min_tx_us=draw(U32), required_min_rx_us=draw(U32),
        required_min_echo_rx_us=draw(U32), poll=draw(st.booleans()), final=draw(st.booleans()),
        cpi=draw(st.booleans()), demand=draw(st.booleans()), multipoint=draw(st.booleans()),
        version=draw(st.integers(0, 7)))


def to_scapy(pkt: ControlPacket) -> BFD:
    return BFD(version=pkt.version, diag=int(pkt.diag), sta=int(pkt.state),
               flags=scapy_flags(pkt), detect_mult=pkt.detect_mult, len=pkt.length,
               my_discriminator=pkt.my_discr, your_discriminator=pkt.your_discr,
               min_tx_interval=pkt.desired_min_tx_us, min_rx_interval=pkt.required_min_rx_us,
               echo_rx_interval=pkt.required_min_echo_rx_us)


@given(any_fields())
def test_our_encoder_and_scapys_agree_on_every_field(pkt):
    ours = encode(pkt)
    assert ours == raw(to_scapy(pkt))
    theirs = BFD(ours)
    assert (theirs.version, theirs.diag, theirs.sta, int(theirs.flags), theirs.detect_mult,
            theirs.len) == (pkt.version, pkt.diag, pkt.state, scapy_flags(pkt),
                            pkt.detect_mult, 24)
    assert (theirs.my_discriminator, theirs.your_discriminator, theirs.min_tx_interval,
            theirs.min_rx_interval, theirs.echo_rx_interval) == (
        pkt.my_discr, pkt.your_discr, pkt.desired_min_tx_us, pkt.required_min_rx_us,
        pkt.required_min_echo_rx_us)


@given(valid_packets())
def test_scapy_built_packets_decode_to_the_same_fields(pkt):
    assert decode(raw(to_scapy(pkt))) == pkt


# ---- reception checks (RFC 5880 6.8.6) --------------------------------------

GOOD = ControlPacket(my_discr=7, your_discr=9, state=State.UP, detect_mult=3,
                     desired_min_tx_us=300_000, required_min_rx_us=300_000)


@given(st.binary(max_size=80))
def test_random_bytes_never_raise(data):
    out = decode(data)
    assert isinstance(out, (ControlPacket, Invalid))


@given(st.binary(min_size=24, max_size=80))
def test_anything_accepted_is_a_consistent_packet(data):
    out = decode(data)
    if isinstance(out, ControlPacket):
        assert out.version == 1 and out.detect_mult and out.my_discr and not out.multipoint
        assert encode(out)[:24] == bytes(data[:24])


@given(valid_packets(), st.data())
def test_truncated_packets_are_invalid(pkt, data):
    wire = encode(pkt)
    cut = data.draw(st.integers(0, len(wire) - 1))
    assert decode(wire[:cut]) == Invalid(Reason.TRUNCATED, f"{cut} bytes")


@given(valid_packets(), st.sampled_from([0, 2, 3, 4, 5, 6, 7]))
def test_wrong_version_is_invalid(pkt, version):
    assert decode(encode(replace(pkt, version=version))).reason is Reason.VERSION


@given(valid_packets(), st.integers(0, 23))
def test_length_below_24_is_invalid(pkt, length):
    wire = bytearray(encode(pkt))
    wire[3] = length
    assert decode(bytes(wire)).reason is Reason.LENGTH_TOO_SHORT


@given(valid_packets(), st.integers(25, 255))
def test_length_beyond_the_datagram_is_invalid(pkt, length):
    wire = bytearray(encode(pkt))
    wire[3] = length
    assert decode(bytes(wire)).reason is Reason.LENGTH_EXCEEDS_DATAGRAM


def test_longer_length_and_trailing_bytes_are_accepted():
    assert decode(encode(replace(GOOD, length=30))) == replace(GOOD, length=30)
    assert decode(encode(GOOD) + b"\xff" * 8) == GOOD


@given(valid_packets())
def test_multipoint_bit_is_invalid(pkt):
    assert decode(encode(replace(pkt, multipoint=True))).reason is Reason.MULTIPOINT


@given(valid_packets())
def test_zero_detect_mult_is_invalid(pkt):
    assert decode(encode(replace(pkt, detect_mult=0))).reason is Reason.DETECT_MULT_ZERO


@given(valid_packets())
def test_zero_my_discriminator_is_invalid(pkt):
    assert decode(encode(replace(pkt, my_discr=0))).reason is Reason.MY_DISCR_ZERO


@pytest.mark.parametrize("state,ok", [(State.ADMIN_DOWN, True), (State.DOWN, True),
                                      (State.INIT, False), (State.UP, False)])
def test_zero_your_discriminator_only_in_down_and_admin_down(state, ok):
    out = decode(encode(replace(GOOD, state=state, your_discr=0)))
    assert isinstance(out, ControlPacket) if ok else out.reason is Reason.YOUR_DISCR_ZERO


def test_auth_bit_without_auth_configured_is_discarded():
    # With A set the minimum length is 26; a correct length still fails: no auth here.
    assert decode(encode(replace(GOOD, auth=True))).reason is Reason.LENGTH_TOO_SHORT
    assert decode(encode(replace(GOOD, auth=True, length=28))).reason \
        is Reason.AUTH_NOT_CONFIGURED


def test_not_bytes_at_all_is_invalid_not_an_exception():
    assert isinstance(decode(None), Invalid)  # type: ignore[arg-type]
    assert decode(memoryview(encode(GOOD))) == GOOD


def test_unknown_diag_codes_decode_as_plain_ints():
    out = decode(encode(replace(GOOD, diag=29)))
    assert out.diag == 29 and bfd.diag_name(29) == "diag29"


def test_encode_refuses_values_that_do_not_fit():
    with pytest.raises(ValueError):
        encode(replace(GOOD, my_discr=1 << 32))


# --------------------------------------------------------------------------
# Session: simulated time
# --------------------------------------------------------------------------

FAST = SessionConfig(desired_min_tx_us=10_000, required_min_rx_us=10_000, detect_mult=3)


def sends(actions):
    return [a for a in actions if isinstance(a, Send)]


def changes(actions):
    return [a for a in actions if isinstance(a, StateChange)]


class Wire:
    """Two sessions joined by a simulated link (fixed one-way delay); each
    direction can be cut. Every packet crosses as bytes through the codec."""

    def __init__(self, a: Session, b: Session, delay: float = 0.0002, now: float = 0.0):
        self.s = {"a": a, "b": b}
        self.delay = delay
        self.now = now
        self.flight: list = []
        self.cut: set[str] = set()
        self.seq = itertools.count()
        self.changes = {"a": [], "b": []}
        self.sent = {"a": [], "b": []}
        self.discards = {"a": [], "b": []}

    def apply(self, who: str, session: Session, actions) -> None:
        other = "b" if who == "a" else "a"
        self.s[who] = session
        for act in actions:
            if isinstance(act, Send):
                assert not (act.packet.poll and act.packet.final)
                self.sent[who].append((self.now, act))
                if f"{who}>{other}" not in self.cut:
                    heapq.heappush(self.flight, (self.now + self.delay, next(self.seq), other,
                                                 encode(act.packet)))
            elif isinstance(act, StateChange):
                self.changes[who].append(act)
            else:
                self.discards[who].append(act)

    def start(self) -> Wire:
        for who in ("a", "b"):
            self.apply(who, *self.s[who].tick(self.now))
        return self

    def run_until(self, t: float) -> Wire:
        while True:
            times = [d for d in (s.next_deadline() for s in self.s.values()) if d is not None]
            if self.flight:
                times.append(self.flight[0][0])
            nxt = min(times, default=None)
            if nxt is None or nxt > t:
                self.now = t
                return self
            self.now = max(self.now, nxt)
            while self.flight and self.flight[0][0] <= self.now:
                _, _, dst, wire = heapq.heappop(self.flight)
                pkt = decode(wire)
                assert isinstance(pkt, ControlPacket), pkt
                self.apply(dst, *self.s[dst].receive(pkt, self.now))
            for who in ("a", "b"):
                d = self.s[who].next_deadline()
                if d is not None and d <= self.now:
                    self.apply(who, *self.s[who].tick(self.now))

    def run_until_state(self, who: str, state: State, limit: float) -> float:
        while self.now < limit:
            self.run_until(min(limit, self.now + 0.001))
            if self.s[who].state is state:
                return self.now
        raise AssertionError(f"{who} not {state} by {limit}: {self.s[who].state}")

    def states(self) -> tuple[State, State]:
        return self.s["a"].state, self.s["b"].state


def pair(cfg_a=FAST, cfg_b=FAST, **kw) -> Wire:
    return Wire(Session.create(0xA, cfg_a, 0.0, seed=1), Session.create(0xB, cfg_b, 0.0, seed=2),
                **kw).start()


def test_transition_table_is_total_over_live_states():
    for local, received in itertools.product((State.DOWN, State.INIT, State.UP), State):
        assert (local, received) in TRANSITIONS


@pytest.mark.parametrize("local,received,new,diag", [
    (State.DOWN, State.DOWN, State.INIT, Diag.NONE),
    (State.DOWN, State.INIT, State.UP, Diag.NONE),
    (State.DOWN, State.UP, State.DOWN, None),
    (State.DOWN, State.ADMIN_DOWN, State.DOWN, None),
    (State.INIT, State.DOWN, State.INIT, None),
    (State.INIT, State.INIT, State.UP, Diag.NONE),
    (State.INIT, State.UP, State.UP, Diag.NONE),
    (State.INIT, State.ADMIN_DOWN, State.DOWN, Diag.NEIGHBOR_SIGNALED_SESSION_DOWN),
    (State.UP, State.INIT, State.UP, None),
    (State.UP, State.UP, State.UP, None),
    (State.UP, State.DOWN, State.DOWN, Diag.NEIGHBOR_SIGNALED_SESSION_DOWN),
    (State.UP, State.ADMIN_DOWN, State.DOWN, Diag.NEIGHBOR_SIGNALED_SESSION_DOWN),
])
def test_reception_transitions(local, received, new, diag):
    s = replace(Session.create(5, FAST, 0.0), state=local)
    your = 5 if received in (State.INIT, State.UP) else 0
    s2, actions = s.receive(ControlPacket(my_discr=77, your_discr=your, state=received), 1.0)
    assert s2.state is new and s2.remote_discr == 77 and s2.remote_state is received
    if diag is None:
        assert changes(actions) == []
    else:
        (change,) = changes(actions)
        assert (change.old, change.new, change.diag) == (local, new, diag)
        (send,) = sends(actions)  # the new state goes out at once
        assert send.packet.state is new and send.packet.your_discr == 77


def test_three_way_handshake_both_active():
    w = pair()
    w.run_until(0.01)
    assert w.states() == (State.UP, State.UP)
    assert [(c.old, c.new) for c in w.changes["a"]] == [(State.DOWN, State.INIT),
                                                       (State.INIT, State.UP)]
    assert w.s["a"].ever_up and w.s["a"].remote_discr == 0xB and w.s["b"].remote_discr == 0xA


@pytest.mark.parametrize("late", ["a", "b"])
def test_three_way_handshake_from_either_side(late):
    """One side starts a little later, or is passive: Down -> Init -> Up on one
    side, Down -> Up on the other, whichever starts first."""
    cfg_late = replace(FAST, passive=True)
    w = pair(cfg_a=cfg_late if late == "a" else FAST, cfg_b=cfg_late if late == "b" else FAST)
    early = "b" if late == "a" else "a"
    assert [s.why for _, s in w.sent[late]] == []  # passive: silent until spoken to
    w.run_until(0.01)
    assert w.states() == (State.UP, State.UP)
    assert [(c.old, c.new) for c in w.changes[late]] == [(State.DOWN, State.INIT),
                                                        (State.INIT, State.UP)]
    assert [(c.old, c.new) for c in w.changes[early]] == [(State.DOWN, State.UP)]


def test_detection_timeout_goes_down_with_diag_1_at_the_detection_time():
    # a: rx 50 ms; b: tx 200 ms x5 -> a detects after 5 x max(50, 200) ms = 1 s.
    a_cfg = SessionConfig(desired_min_tx_us=50_000, required_min_rx_us=50_000, detect_mult=3)
    b_cfg = SessionConfig(desired_min_tx_us=200_000, required_min_rx_us=200_000, detect_mult=5)
    w = pair(a_cfg, b_cfg)
    w.run_until(5.0)
    assert w.states() == (State.UP, State.UP)
    assert w.s["a"].detection_time_us == 1_000_000
    assert w.s["b"].detection_time_us == 3 * 200_000  # 3 x max(200 ms, 50 ms)
    w.cut.add("b>a")
    last_rx = w.s["a"].last_rx
    w.run_until(10.0)
    down = [c for c in w.changes["a"] if c.new is State.DOWN][0]
    assert down.diag == Diag.CONTROL_DETECTION_TIME_EXPIRED and down.old is State.UP
    assert down.at == pytest.approx(last_rx + 1.0)
    assert down.ever_up
    # a's Down reaches b, which goes Down with "neighbour signalled".
    b_down = [c for c in w.changes["b"] if c.new is State.DOWN][0]
    assert b_down.diag == Diag.NEIGHBOR_SIGNALED_SESSION_DOWN and b_down.remote_state is State.DOWN
    assert w.s["a"].remote_discr == 0  # forgotten after a detection time of silence


def test_comes_back_up_after_the_cut_heals_and_never_up_is_distinguishable():
    w = pair()
    w.run_until(1.0)
    w.cut |= {"a>b", "b>a"}
    w.run_until(2.0)
    assert w.states() == (State.DOWN, State.DOWN)
    w.cut.clear()
    t = w.run_until_state("a", State.UP, 5.0)
    assert t < 2.0 + 1.0 + 0.01  # one slow-start period at most
    assert w.s["a"].up_count == 2 and w.s["a"].down_count == 1

    lone = Wire(Session.create(1, FAST, 0.0), Session.create(2, FAST, 0.0)).start()
    lone.cut.add("a>b")  # b hears a, a never hears b: b sits in Init then times out
    lone.run_until(10.0)
    timeout = [c for c in lone.changes["b"] if c.diag == Diag.CONTROL_DETECTION_TIME_EXPIRED]
    assert timeout and timeout[0].old is State.INIT and not timeout[0].ever_up


def test_neighbour_admin_down_and_back():
    w = pair()
    w.run_until(1.0)
    w.apply("b", *w.s["b"].admin_down(w.now))
    w.run_until(1.1)
    change = w.changes["a"][-1]
    assert (change.old, change.new, change.diag) == (State.UP, State.DOWN,
                                                    Diag.NEIGHBOR_SIGNALED_SESSION_DOWN)
    assert change.remote_state is State.ADMIN_DOWN  # administrative, not a path failure
    assert w.s["b"].state is State.ADMIN_DOWN and w.s["b"].local_diag == Diag.ADMINISTRATIVELY_DOWN
    # b keeps telling a (AdminDown packets, slow rate), and a stays Down meanwhile.
    w.run_until(5.0)
    assert w.states() == (State.DOWN, State.ADMIN_DOWN)
    admin = [s.packet for t, s in w.sent["b"] if t > 1.0]
    assert admin and all(p.state is State.ADMIN_DOWN and p.diag == 7 for p in admin)
    w.apply("b", *w.s["b"].admin_up(w.now))
    w.run_until_state("a", State.UP, 7.0)
    w.run_until(w.now + 0.1)
    assert w.states() == (State.UP, State.UP)


def test_admin_down_discards_what_it_receives():
    s = Session.create(5, FAST, 0.0)
    s, actions = s.admin_down(0.0)
    assert [c.new for c in changes(actions)] == [State.ADMIN_DOWN]
    s2, actions = s.receive(ControlPacket(my_discr=9, state=State.DOWN, poll=True), 0.1)
    assert s2.state is State.ADMIN_DOWN and actions == [Discarded("admin_down")]
    assert s.admin_down(0.2) == (s, [])


def test_your_discriminator_of_another_session_is_discarded():
    s = Session.create(5, FAST, 0.0)
    out, actions = s.receive(ControlPacket(my_discr=9, your_discr=6, state=State.UP), 0.1)
    assert out is s and actions == [Discarded("your_discriminator_mismatch")]


# ---- slow start, poll/final, timers ------------------------------------------


def tx_times(w, who, since=0.0, until=float("inf"), why=("periodic",)):
    return [t for t, s in w.sent[who] if since <= t <= until and s.why in why]


def test_slow_start_one_second_until_up_then_the_configured_rate_after_a_poll():
    w = Wire(Session.create(1, FAST, 0.0, seed=1), Session.create(2, FAST, 0.0, seed=2))
    w.cut |= {"a>b", "b>a"}  # nobody hears anybody: both stay Down
    w.start().run_until(5.0)
    assert w.s["a"].state is State.DOWN
    times = tx_times(w, "a")
    gaps = [y - x for x, y in zip(times, times[1:])]
    assert gaps and all(0.75 <= g <= 1.0 for g in gaps)
    assert all(s.packet.desired_min_tx_us == SLOW_TX_US for _, s in w.sent["a"])
    w.cut.clear()
    t_up = w.run_until_state("a", State.UP, 7.0)
    w.run_until(t_up + 1.0)
    after = [s.packet for t, s in w.sent["a"] if t >= t_up]
    assert after[0].desired_min_tx_us == 10_000 and after[0].poll  # the poll announces it
    assert not w.s["a"].poll  # ... and b answered Final
    times = tx_times(w, "a", since=t_up + 0.1)
    gaps = [y - x for x, y in zip(times, times[1:])]
    assert all(0.0075 - 1e-9 <= g <= 0.010 + 1e-9 for g in gaps)
    assert w.s["a"].detection_time_us == 30_000


def test_configured_tx_above_one_second_needs_no_slow_start():
    slow = SessionConfig(desired_min_tx_us=2_000_000, required_min_rx_us=2_000_000)
    w = pair(slow, slow)
    w.run_until(10.0)
    assert w.states() == (State.UP, State.UP)
    assert all(s.packet.desired_min_tx_us == 2_000_000 for _, s in w.sent["a"])
    assert not any(s.packet.poll for _, s in w.sent["a"])


def test_poll_is_answered_with_final_at_once():
    s = replace(Session.create(5, FAST, 0.0), state=State.UP, remote_discr=9,
                desired_min_tx_us=10_000, confirmed_tx_us=10_000)
    s2, actions = s.receive(ControlPacket(my_discr=9, your_discr=5, state=State.UP, poll=True,
                                          desired_min_tx_us=50_000,
                                          required_min_rx_us=50_000), 3.0)
    (send,) = sends(actions)
    assert send.why == "final" and send.packet.final and not send.packet.poll
    assert s2.remote_min_rx_us == 50_000 and s2.transmit_interval_us == 50_000


def test_raising_tx_while_up_waits_for_the_final():
    w = pair()
    w.run_until(1.0)
    assert not w.s["a"].poll
    w.cut.add("b>a")  # no Final can come back yet
    slower = replace(FAST, desired_min_tx_us=100_000)
    w.apply("a", *w.s["a"].set_timers(slower, w.now))
    w.run_until(1.02)  # under b's 30 ms detection time
    a = w.s["a"]
    assert a.poll == (100_000, 10_000) and a.desired_min_tx_us == 100_000
    assert a.transmit_interval_us == 10_000  # still the old rate: b's detection needs it
    polled = [s.packet for t, s in w.sent["a"] if t > 1.0]
    assert polled and all(p.poll and p.desired_min_tx_us == 100_000 for p in polled)
    w.cut.clear()
    w.run_until(1.05)
    assert w.s["a"].poll is None and w.s["a"].transmit_interval_us == 100_000
    assert w.s["b"].detection_time_us == 3 * 100_000
    w.run_until(3.0)
    assert w.states() == (State.UP, State.UP)


def test_lowering_rx_while_up_keeps_the_old_detection_time_until_the_final():
    w = pair(cfg_a=replace(FAST, required_min_rx_us=50_000))
    w.run_until(1.0)
    assert w.s["a"].detection_time_us == 3 * 50_000
    w.cut.add("b>a")  # a's Poll reaches b, b's Final does not come back yet
    w.apply("a", *w.s["a"].set_timers(replace(FAST, required_min_rx_us=20_000), w.now))
    w.run_until(1.05)
    a = w.s["a"]
    assert a.required_min_rx_us == 20_000 and a.poll == (10_000, 20_000)
    assert a.detection_time_us == 3 * 50_000  # b may still be sending every 50 ms
    assert w.s["b"].transmit_interval_us == 20_000  # b has heard it
    w.cut.clear()
    w.run_until(1.1)
    assert w.s["a"].poll is None and w.s["a"].detection_time_us == 3 * 20_000
    assert w.states() == (State.UP, State.UP)


def test_raising_rx_takes_effect_at_once():
    w = pair()
    w.run_until(1.0)
    w.apply("a", *w.s["a"].set_timers(replace(FAST, required_min_rx_us=50_000), w.now))
    assert w.s["a"].detection_time_us == 3 * 50_000
    w.run_until(2.0)
    assert w.s["b"].transmit_interval_us == 50_000  # b honours it as soon as it hears it


def test_remote_required_rx_zero_stops_periodic_transmission():
    s = Session.create(5, FAST, 0.0)
    s, _ = s.receive(ControlPacket(my_discr=9, state=State.DOWN, required_min_rx_us=0), 0.0)
    assert not s.periodic_tx_enabled
    s, actions = s.tick(0.5)
    assert not [a for a in sends(actions) if a.why == "periodic"]


def test_remote_demand_mode_stops_periodic_transmission_only_when_both_up():
    s = replace(Session.create(5, FAST, 0.0), state=State.UP)
    s, _ = s.receive(ControlPacket(my_discr=9, your_discr=5, state=State.UP, demand=True), 0.0)
    assert not s.periodic_tx_enabled
    s, _ = s.receive(ControlPacket(my_discr=9, your_discr=5, state=State.INIT, demand=True), 0.0)
    assert s.periodic_tx_enabled


def test_the_remote_discriminator_is_forgotten_after_a_detection_time_in_down():
    s = Session.create(5, FAST, 0.0)
    s, _ = s.receive(ControlPacket(my_discr=9, state=State.UP, detect_mult=2,
                                   desired_min_tx_us=1_000_000), 0.0)  # Up while we are Down
    assert s.state is State.DOWN and s.remote_discr == 9 and s.detect_deadline == 2.0
    s, actions = s.tick(2.0)
    assert s.remote_discr == 0 and changes(actions) == []


def test_a_lowered_remote_rx_is_honoured_immediately():
    s = replace(Session.create(5, SessionConfig(desired_min_tx_us=10_000), 0.0), state=State.UP,
                desired_min_tx_us=10_000)
    s, _ = s.receive(ControlPacket(my_discr=9, your_discr=5, state=State.UP,
                                   required_min_rx_us=1_000_000), 0.0)
    s, _ = s.tick(0.0)
    assert s.next_tx >= 0.75
    s, _ = s.receive(ControlPacket(my_discr=9, your_discr=5, state=State.UP,
                                   required_min_rx_us=10_000), 0.001)
    assert s.next_tx <= 0.0 + 0.010  # re-timed from the last packet sent


def test_session_config_is_validated():
    with pytest.raises(ValueError):
        SessionConfig(detect_mult=0)
    with pytest.raises(ValueError):
        SessionConfig(desired_min_tx_us=0)
    with pytest.raises(ValueError):
        Session.create(0, FAST, 0.0)


# ---- jitter ------------------------------------------------------------------


@given(st.floats(0.0, 1.0, exclude_max=True))
def test_jitter_factor_bounds(u):
    assert 0.75 <= jitter_factor(u, 3) <= 1.0
    assert 0.75 <= jitter_factor(u, 1) <= 0.9


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), mult=st.sampled_from([1, 3]))
def test_periodic_intervals_stay_within_the_jitter_bounds(seed, mult):
    cfg = replace(FAST, detect_mult=mult)
    w = Wire(Session.create(1, cfg, 0.0, seed=seed), Session.create(2, cfg, 0.0, seed=~seed & 0xFF))
    w.start().run_until(2.0)
    assert w.states() == (State.UP, State.UP)
    times = tx_times(w, "a", since=0.5, why=("periodic",))
    gaps = [y - x for x, y in zip(times, times[1:])]
    top = 0.9 if mult == 1 else 1.0
    assert len(gaps) > 100
    assert all(0.75 * 0.010 - 1e-9 <= g <= top * 0.010 + 1e-9 for g in gaps)
    mean = sum(gaps) / len(gaps)
    assert 0.75 * 0.010 < mean < top * 0.010  # actually jittered, not pinned to a bound


def test_same_seed_same_run():
    def run(seed):
        w = Wire(Session.create(1, FAST, 0.0, seed=seed), Session.create(2, FAST, 0.0, seed=3))
        return [t for t, _ in w.start().run_until(1.0).sent["a"]]
    assert run(11) == run(11) != run(12)


# --------------------------------------------------------------------------
# Adapter without sockets: GTSM, demultiplexing, drop counters, lag
# --------------------------------------------------------------------------


def ttl_cmsg(ttl):
    return [(socket.IPPROTO_IP, socket.IP_TTL, struct.pack("i", ttl))]


class FakeSock:
    def __init__(self):
        self.sent = []

    def send(self, data):
        self.sent.append(data)

    def close(self):
        pass

    def fileno(self):
        return -1

    def getsockname(self):
        return ("198.18.0.2", 50000)


def agent_with_session(peer="198.18.0.1", lag=None):
    agent = adapter.BfdAgent(lag=lag)
    ep = adapter._Endpoint("lprail0", "198.18.0.2", FakeSock())
    spec = adapter.PeerSpec("lprail0", "198.18.0.2", peer, FAST)
    run = adapter._Run(spec, Session.create(0x1234, FAST, agent.now(), seed=5), ep, FakeSock())
    agent.runs[spec.key] = run
    agent.by_discr[0x1234] = run
    ep.by_peer[peer] = run
    return agent, ep, run


def test_adapter_drops_are_counted_by_reason_and_good_packets_reach_the_session():
    async def scenario():
        agent, ep, run = agent_with_session()
        events = []
        agent.emit = events.append
        src = ("198.18.0.1", 49999)
        down = encode(ControlPacket(my_discr=0x99, state=State.DOWN))
        agent._datagram(ep, down, ttl_cmsg(64), 0, src, agent.now())
        agent._datagram(ep, down, [], 0, src, agent.now())
        agent._datagram(ep, b"\x00" * 3, ttl_cmsg(255), 0, src, agent.now())
        agent._datagram(ep, down, ttl_cmsg(255), socket.MSG_TRUNC, src, agent.now())
        agent._datagram(ep, down, ttl_cmsg(255), 0, ("198.18.0.9", 1), agent.now())
        other = encode(ControlPacket(my_discr=0x99, your_discr=0x4321, state=State.UP))
        agent._datagram(ep, other, ttl_cmsg(255), 0, src, agent.now())
        ours = encode(ControlPacket(my_discr=0x99, your_discr=0x1234, state=State.UP))
        agent._datagram(ep, ours, ttl_cmsg(255), 0, ("198.18.0.9", 1), agent.now())
        assert dict(agent.drops) == {"ttl": 1, "no_ttl": 1, "truncated": 1, "oversize": 1,
                                     "no_session_for_source": 1, "unknown_discriminator": 1,
                                     "wrong_source": 1}
        assert run.session.state is State.DOWN
        agent._datagram(ep, down, ttl_cmsg(255), 0, src, agent.now())
        assert run.session.state is State.INIT and run.session.remote_discr == 0x99
        (event,) = events
        assert (event.old, event.new, event.ever_up) == (State.DOWN, State.INIT, False)
        assert decode(run.tx.sent[-1]).state is State.INIT
        init = encode(ControlPacket(my_discr=0x99, your_discr=0x1234, state=State.INIT))
        agent._datagram(ep, init, ttl_cmsg(255), 0, src, agent.now())
        assert run.session.state is State.UP and events[-1].ever_up
        assert run.timer is not None
        run.timer.cancel()

    asyncio.run(scenario())


@given(st.binary(max_size=64), st.integers(0, 255))
@settings(max_examples=200, deadline=None)
def test_adapter_never_raises_on_garbage(data, ttl):
    async def scenario():
        agent, ep, run = agent_with_session()
        agent._datagram(ep, data, ttl_cmsg(ttl), 0, ("198.18.0.1", 4000), agent.now())
        if run.timer:
            run.timer.cancel()
        return sum(agent.drops.values()) + agent.counters["rx_packets"]

    assert asyncio.run(scenario()) == 1


def test_lag_meter_keeps_the_worst_of_a_window():
    lag = LagHistory(window_s=10.0)
    for t, v in [(0.0, 0.001), (1.0, 0.2), (2.0, 0.003), (3.0, 0.05), (4.0, 0.001)]:
        lag.record(t, v)
    assert lag.worst_since(0.0) == 0.2
    assert lag.worst_since(1.5) == 0.05
    assert lag.worst_since(3.5) == 0.001
    assert lag.worst_since(5.0) == 0.0
    lag.record(20.0, 0.0)  # 0.2 ages out of the window
    assert lag.worst_since(0.0) == 0.0 and lag.max == 0.2 and lag.count == 6
    assert lag.stalls == 5  # every lag of at least the 1 ms tolerance


def test_bfd_and_echo_share_one_lag_meter():
    """A stall BFD's timer measured reaches the echo probers' listeners, and a
    stall the echo heartbeat saw is in the worst lag a BFD change reports."""
    async def scenario():
        shared = LoopLag()
        shared.start()
        agent, ep, run = agent_with_session(lag=shared)
        heard = []
        shared.listeners.append(lambda now, lag: heard.append(lag))
        now = agent.now()
        agent._on_timer(run, scheduled=now - 0.3)  # BFD's timer ran 0.3 s late
        assert heard and heard[0] >= 0.3
        shared.record(agent.now(), 0.7)  # e.g. the echo heartbeat saw a 0.7 s stall
        events = []
        agent.emit = events.append
        run.session = replace(run.session, state=State.UP, remote_discr=0x99, ever_up=True,
                              remote_detect_mult=3, remote_desired_tx_us=10_000,
                              last_rx=agent.now() - 1.0)
        agent._on_timer(run, scheduled=agent.now())
        (event,) = events
        assert event.new is State.DOWN and event.max_lag_s >= 0.7
        if run.timer:
            run.timer.cancel()
        shared.close()

    asyncio.run(scenario())


def test_a_stalled_loop_is_reported_with_the_detection():
    """A timer that fires late reports its lag with the state change."""
    async def scenario():
        agent, ep, run = agent_with_session()
        events = []
        agent.emit = events.append
        now = agent.now()
        s = replace(run.session, state=State.UP, remote_discr=0x99, remote_detect_mult=3,
                    remote_desired_tx_us=10_000, last_rx=now - 1.0, ever_up=True)
        run.session = s
        agent._on_timer(run, scheduled=now - 0.97)  # detection was due 0.97 s ago
        (event,) = events
        assert event.new is State.DOWN and event.diag == Diag.CONTROL_DETECTION_TIME_EXPIRED
        assert event.lag_s >= 0.97 and event.max_lag_s >= 0.97
        assert event.detection_time_s == pytest.approx(0.03)
        assert event.since_last_rx_s >= 1.0
        if run.timer:
            run.timer.cancel()

    asyncio.run(scenario())


class QueuedSock(FakeSock):
    """A receive socket holding datagrams the loop has not read yet."""

    def __init__(self, datagrams):
        super().__init__()
        self.datagrams = list(datagrams)

    def fileno(self):
        return 3

    def recvmsg(self, *_):
        if not self.datagrams:
            raise BlockingIOError
        return self.datagrams.pop(0), ttl_cmsg(255), 0, ("198.18.0.1", 49152)


def test_packets_queued_during_a_stall_count_before_the_detection_is_judged():
    async def scenario():
        agent, ep, run = agent_with_session()
        events = []
        agent.emit = events.append
        now = agent.now()
        run.session = replace(run.session, state=State.UP, remote_discr=0x99, ever_up=True,
                              remote_detect_mult=3, remote_desired_tx_us=10_000,
                              last_rx=now - 0.5)  # detection (30 ms) long overdue ...
        up = encode(ControlPacket(my_discr=0x99, your_discr=0x1234, state=State.UP,
                                  desired_min_tx_us=10_000, required_min_rx_us=10_000))
        ep.sock = QueuedSock([up])  # ... but the peer's packet is waiting in the socket
        agent._on_timer(run, scheduled=now - 0.47)
        assert events == [] and run.session.state is State.UP
        assert run.session.last_rx >= now
        run.timer.cancel()

    asyncio.run(scenario())


def test_a_peer_down_seen_after_our_stall_carries_the_stall():
    """After a stall asyncio runs readers before the overdue timer: the lag is
    read off that timer, so a peer's Down (caused by our silence) shows it."""
    async def scenario():
        agent, ep, run = agent_with_session()
        events, lags = [], []
        agent.emit = events.append
        agent.on_lag = lambda now, lag: lags.append(lag)
        now = agent.now()
        run.session = replace(run.session, state=State.UP, remote_discr=0x99, ever_up=True,
                              remote_detect_mult=3, remote_desired_tx_us=10_000, last_rx=now)
        run.timer_at = now - 0.8  # the loop did not run for 0.8 s
        ep.sock = QueuedSock([encode(ControlPacket(
            my_discr=0x99, your_discr=0x1234, state=State.DOWN,
            diag=Diag.CONTROL_DETECTION_TIME_EXPIRED))])
        agent._on_readable(ep)
        (event,) = events
        assert event.new is State.DOWN and event.diag == Diag.NEIGHBOR_SIGNALED_SESSION_DOWN
        assert event.lag_s >= 0.8 and event.max_lag_s >= 0.8
        assert agent.lag.max >= 0.8 and lags and lags[0] >= 0.8
        if run.timer:
            run.timer.cancel()

    asyncio.run(scenario())
