"""One-way delay (issue 31, item 2): the wire fields, core.oneway's
arithmetic and refusals, the responder's and the prober's halves, the
responder process's clock line."""

from __future__ import annotations

import json
import time

import pytest

from linkpassd.adapters import echoresponder
from linkpassd.adapters.echo import EchoService, ProbePath
from linkpassd.core import oneway, wire
from linkpassd.core.model import OneWayDelay
from linkpassd.core.oneway import NOT_CONFIGURED, SHARED, ClockReading, OneWay, describe
from linkpassd.responder import clock_from_wire, clock_to_wire
from test_probe import RAIL_POLICY, pktinfo_cmsg, responder, timestamp_cmsg

US = 1_000


# ---------------------------------------------------------------- wire


@pytest.mark.parametrize("forward, bound", [
    (41 * US, 0), (-5 * US, 12 * US), (0, None), (2**31 - 2, 2**32 - 2), (-(2**31 - 2), 1)])
def test_one_way_fields_round_trip(forward, bound):
    field = wire.one_way_field(forward, bound)
    assert 0 <= field < 2**64
    assert wire.one_way_values(field) == (forward, bound)


def test_one_way_fields_saturate_instead_of_wrapping():
    assert wire.one_way_values(wire.one_way_field(10**12, 10**12)) == (
        wire.FORWARD_LIMIT, wire.BOUND_MAX)
    assert wire.one_way_values(wire.one_way_field(-(10**12), -3))[0] == -wire.FORWARD_LIMIT
    assert wire.one_way_values(wire.one_way_field(0, -3))[1] == 0


# ---------------------------------------------------------------- core


def samples(forward_us: float, back_us: float, peer_bound_ns: int | None = 0, n: int = 20,
            jitter_us: float = 0.0) -> OneWay:
    ow = OneWay()
    for i in range(n):
        wobble = jitter_us * US * (i % 5 - 2)
        fwd = round(forward_us * US + wobble)
        ow.add(fwd, fwd + round(back_us * US), peer_bound_ns)
    return ow


def test_shared_clocks_report_both_ways_with_bound_zero():
    d = samples(41, 38, jitter_us=3).report(SHARED, now=5.0)
    assert d.refused == "" and d.samples == 20
    assert d.towards_s == pytest.approx(41e-6) and d.back_s == pytest.approx(38e-6)
    assert d.bound_s == 0 and d.clocks == "shared"
    assert describe(d, "198.18.0.1") == ("one-way delay towards 198.18.0.1 41 us, back 38 us, "
                                         "±0 us (clocks: shared)")


def test_the_bound_is_ours_plus_the_peers_and_grows_with_the_readings_age():
    own = ClockReading("chrony", 12 * US, read_at=100.0, drift_ppm=2.0)
    d = samples(50, 60, peer_bound_ns=8 * US).report(own, now=110.0)
    # 12 us + 10 s x 2 ppm = 32 us here, 8 us at the peer.
    assert d.bound_s == pytest.approx(40e-6)
    assert d.clocks == "chrony ±32 us here, ±8 us at the peer"
    stale = own.bound_at(100.0 + oneway.STALE_S + 1)
    assert stale is None
    late = samples(50, 60, peer_bound_ns=8 * US).report(own, now=100.0 + oneway.STALE_S + 1)
    assert late.towards_s is None and "last read 31 s ago" in late.refused


def test_skewed_clocks_beyond_the_bound_are_refused_never_a_negative_delay():
    # The peer's clock is 200 us behind ours but claims +-5 us: forward reads -150 us.
    own = ClockReading("chrony", 5 * US, read_at=0.0)
    d = samples(-150, 250, peer_bound_ns=5 * US).report(own, now=0.0)
    assert d.towards_s is None and d.back_s is None and d.bound_s is None
    assert "clocks disagree by more than their bounds" in d.refused
    assert "towards -150 us" in d.refused and "±10 us" in d.refused
    assert describe(d, "p").startswith("one-way delay not reported: the clocks disagree")


def test_a_small_negative_inside_the_bound_is_reported_as_zero():
    own = ClockReading("ptp4l", 3 * US, read_at=0.0)
    d = samples(-2, 30, peer_bound_ns=1 * US).report(own, now=0.0)
    assert d.refused == "" and d.towards_s == 0 and d.back_s == pytest.approx(30e-6)


def test_saturated_forward_means_the_clocks_are_seconds_apart():
    own = ClockReading("chrony", 1 * US, read_at=0.0)
    ow = OneWay()
    for _ in range(3):
        ow.add(wire.FORWARD_LIMIT, wire.FORWARD_LIMIT + 50 * US, 1 * US)
    assert "more than 2.1 s apart" in ow.report(own, 0.0).refused


@pytest.mark.parametrize("own, ow, why", [
    (NOT_CONFIGURED, samples(10, 10), '[probes] clock = "none"'),
    (ClockReading("auto", None, "this host's clock reports no synchronisation (no chronyd "
                  "answered `chronyc -c tracking` (no chronyc on this host); no ptp4l answered "
                  "pmc (no pmc on this host))", 0.0), samples(10, 10),
     "this host's clock reports no synchronisation (no chronyd answered"),
    (SHARED, samples(10, 10, peer_bound_ns=None), "the peer's clock is not synchronised"),
    (SHARED, OneWay(plain=5), "sends no timestamps (one from before one-way delay): round "
                              "trip only"),
    (SHARED, OneWay(), "no reply yet"),
])
def test_refusals_say_why(own, ow, why):
    d = ow.report(own, now=0.0)
    assert d.towards_s is None and why in d.refused, d.refused


def test_samples_against_an_unsynchronised_peer_clock_are_not_kept():
    ow = samples(10, 10, n=10)
    ow.add(5 * US, 10 * US, None)
    assert not ow.forward and ow.report(SHARED, 0.0).refused.startswith("the peer's clock")
    ow.add(7 * US, 20 * US, 0)
    assert ow.report(SHARED, 0.0).towards_s == pytest.approx(7e-6)


def test_the_window_keeps_the_recent_replies_and_copy_is_independent():
    ow = samples(500, 500, n=oneway.WINDOW)
    for _ in range(oneway.WINDOW // 2 + 1):
        ow.add(20 * US, 40 * US, 0)
    assert ow.report(SHARED, 0.0).towards_s == pytest.approx(20e-6)  # the median moved
    twin = ow.copy()
    twin.add(1, 2, 0)
    assert len(ow.forward) == oneway.WINDOW and ow.marked == twin.marked - 1


# ---------------------------------------------------------------- responder


def asking(wall_tx_ns: int, seq: int = 7) -> bytes:
    return wire.EchoPacket(echoresponder.KIND_REQUEST, seq, 123456789, 42,
                           responder_id=wall_tx_ns).encode()


def test_the_responder_answers_a_request_that_asks_with_forward_delay_and_its_bound():
    r, _ = responder()
    r.set_clock(ClockReading("chrony", 12 * US, read_at=time.monotonic()))
    rx = time.time() - 0.003
    tx_ns = round(rx * 1e9) - 57 * US  # our request left 57 us before it arrived
    req = asking(tx_ns)
    r._answer(req, [timestamp_cmsg(rx), pktinfo_cmsg(5, "198.18.0.1")], 0, ("198.18.0.2", 40000))
    (data, _anc, _addr), = r.sock.sent
    assert len(data) == len(req)  # still never larger than the request
    reply, why = wire.parse(data)
    assert reply is not None, why
    assert reply.held_us & wire.MARK_BITS == wire.ONE_WAY_MARK
    assert 2_500 <= reply.held_us & wire.HELD_BITS <= 1_000_000
    forward, bound = wire.one_way_values(reply.responder_id)
    assert abs(forward - 57 * US) <= 1 * US  # the cmsg's float costs a fraction of a us
    assert 12 * US <= bound <= 12 * US + 100


def test_a_request_that_does_not_ask_gets_the_reply_old_probers_know():
    r, _ = responder()
    r.set_clock(SHARED)
    r._answer(wire.EchoPacket(echoresponder.KIND_REQUEST, 7, 1, 42).encode(),
              [timestamp_cmsg(time.time()), pktinfo_cmsg(5, "198.18.0.1")], 0,
              ("198.18.0.2", 40000))
    reply, _ = wire.parse(r.sock.sent[0][0])
    assert reply.responder_id == r.responder_id and reply.held_us & wire.MARK_BITS == 0


def test_a_responder_without_a_bound_says_unsynchronised():
    r, _ = responder(policy=RAIL_POLICY)
    assert r.clock is NOT_CONFIGURED  # until the daemon sends one
    r._answer(asking(time.time_ns()), [pktinfo_cmsg(5, "198.18.0.1")], 0, ("198.18.0.2", 40000))
    reply, _ = wire.parse(r.sock.sent[0][0])
    assert wire.one_way_values(reply.responder_id)[1] is None


# ---------------------------------------------------------------- prober


def test_the_prober_splits_the_round_trip_with_the_peers_forward_delay():
    svc = EchoService([ProbePath("eth0", "198.18.0.2", "198.18.0.1")], respond=False)
    svc.set_clock(SHARED)
    (prober,) = svc.probers.values()
    now = 100.0
    sent_ns = round((now - 0.0005) * 1e9)  # 500 us ago
    held_us = 100
    for seq in range(1, 6):
        fields = (wire.MAGIC, wire.VERSION, wire.KIND_REPLY, wire.receipt_field(seq), seq,
                  sent_ns, prober.prober_id, wire.one_way_field(150 * US, 0),
                  wire.ONE_WAY_MARK | held_us)
        prober.reply(fields, None, now, time.time(), 0.0)
    d = prober.assessment().one_way
    assert d == OneWayDelay(pytest.approx(150e-6), pytest.approx(250e-6), 0.0, "shared", "", 5)
    assert prober.state.held_max_s == pytest.approx(100e-6)  # the mark is not read as a hold


def test_the_way_back_is_measured_in_the_clock_the_peer_compared_with():
    """The fresh-clone CI saw a way back of -961 ns on the real kernel: the
    loop time of a wake-up and the wall clock read after it were 5 us apart
    (a busy machine), and the round trip built from that pair lost the gap.
    With the kernel's receive stamp the split uses our stamp and the wall
    time the request carried, whatever the reads' gap."""
    svc = EchoService([ProbePath("eth0", "198.18.0.2", "198.18.0.1")], respond=False)
    svc.set_clock(SHARED)
    (prober,) = svc.probers.values()
    offset_ns = 1_764_900_000 * 1_000_000_000  # CLOCK_REALTIME - CLOCK_MONOTONIC
    prober.rail.wall_offset_ns = offset_ns
    sent_ns = 100_000_000_000  # loop time 100 s
    held_us = 100
    rx = (sent_ns + offset_ns) * 1e-9 + 500e-6  # our kernel's stamp: 500 us after sending
    now = 100.0 + 510e-6  # the wake-up that reads it
    wall = rx + 40e-6  # ...and its wall-clock read, preempted 30 us after `now`
    for seq in range(1, 6):
        fields = (wire.MAGIC, wire.VERSION, wire.KIND_REPLY, wire.receipt_field(seq), seq,
                  sent_ns, prober.prober_id, wire.one_way_field(150 * US, 0),
                  wire.ONE_WAY_MARK | held_us)
        prober.reply(fields, rx, now, wall, 0.0)
    d = prober.assessment().one_way
    assert d.towards_s == pytest.approx(150e-6)
    assert d.back_s == pytest.approx(250e-6, abs=0.5e-6)  # rx as a float: a quarter us


def test_replies_from_an_old_responder_are_round_trip_only_and_said_so():
    svc = EchoService([ProbePath("eth0", "198.18.0.2", "198.18.0.1")], respond=False)
    svc.set_clock(SHARED)
    (prober,) = svc.probers.values()
    fields = (wire.MAGIC, wire.VERSION, wire.KIND_REPLY, 0, 1, round(99.9995e9),
              prober.prober_id, 0x1234_5678_9ABC_DEF0, 80)
    prober.reply(fields, None, 100.0, time.time(), 0.0)
    d = prober.assessment().one_way
    assert d.towards_s is None and "sends no timestamps" in d.refused


# ---------------------------------------------------------------- responder process


@pytest.mark.parametrize("reading", [
    SHARED, NOT_CONFIGURED, ClockReading("chrony", 1234, "", 55.5, 1.7),
    ClockReading("auto", None, "no chronyd answered", 3.0)])
def test_a_clock_reading_survives_the_pipe(reading):
    assert clock_from_wire(json.loads(json.dumps(clock_to_wire(reading)))) == reading


@pytest.mark.parametrize("fields, names", [
    ([], "object"), ({"bound_ns": 5}, "source"), ({"source": "chrony", "bound_ns": -1}, "bound_ns"),
    ({"source": "chrony", "bound_ns": "7"}, "bound_ns")])
def test_a_bad_clock_line_is_refused_naming_what_is_wrong(fields, names):
    with pytest.raises((ValueError, TypeError, KeyError), match=names):
        clock_from_wire(fields)
