"""What lets the echo engine send many paths' probes per wake-up (issue 11):
send slots (paths due within one slot leave together, each keeping its own
cadence), and a prober that changes in place but can still be copied.
Simulated time; no sockets, no root."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linkpassd.core.probe import PathState, ProbeConfig, Prober
from linkpassd.core.schedule import MAX_SEND_SLOT_S, MIN_BATCHED_PATHS, send_slot, slot_start

PEER = "198.19.9.1"


# ---------------------------------------------------------------- send slots


@pytest.mark.parametrize("interval_s", [0.010, 0.012, 0.050, 0.300, 1.0])
@pytest.mark.parametrize("paths", [1, 2, MIN_BATCHED_PATHS - 1, MIN_BATCHED_PATHS, 256])
def test_the_send_slot_is_a_whole_millisecond_at_most_a_tenth_of_the_interval(interval_s, paths):
    slot = send_slot(interval_s, paths)
    if paths < MIN_BATCHED_PATHS:
        assert slot == 0.0  # a few paths: each probe at its own time
        return
    assert 0.001 <= slot <= MAX_SEND_SLOT_S
    assert slot <= max(0.001, interval_s / 10) + 1e-12
    assert abs(slot * 1000 - round(slot * 1000)) < 1e-9


@given(st.floats(0, 1e6), st.sampled_from([0.001, 0.002, 0.005]))
def test_a_slot_starts_at_or_before_its_time_and_within_one_slot(when, slot):
    start = slot_start(when, slot)
    assert start <= when + 1e-6 and when - start < slot + 1e-6
    assert slot_start(start, slot) == pytest.approx(start)  # a start is its own slot's start
    assert slot_start(when, 0.0) == when


def _up(cfg: ProbeConfig, first: float) -> Prober:
    return replace(Prober(PEER, cfg), state=PathState.UP, next_send=first)


def test_a_probe_goes_at_its_slots_start_and_keeps_its_own_cadence():
    """A path whose probe falls due 3.7 ms into a 5 ms slot is sent when the
    slot starts, and every next one is sent an interval after the previous:
    the phase stays the path's (slots only group, they do not realign)."""
    cfg, slot = ProbeConfig(interval_s=0.050), 0.005
    p = _up(cfg, 10.0037)
    assert p.next_wakeup(slot) == pytest.approx(10.000)
    sent = []
    now = 10.000
    for _ in range(20):
        p, sends = p.poll(now, send_slot_s=slot)
        assert len(sends) == 1
        sent.append(now)
        assert p.next_send == pytest.approx(10.0037 + len(sent) * cfg.interval_s)
        p.on_reply(sends[0].seq, now + 0.0002, now + 0.0002)
        now = p.next_wakeup(slot)
        assert now == pytest.approx(slot_start(p.next_send, slot))
    gaps = {round(b - a, 9) for a, b in zip(sent, sent[1:])}
    assert gaps == {cfg.interval_s}
    # Without a slot, at its own time; before its slot starts, nothing goes.
    q = _up(cfg, 10.0037)
    assert q.poll(10.0036)[1] == [] and len(q.poll(10.0037)[1]) == 1
    r = _up(cfg, 10.0037)
    assert r.poll(9.9999, send_slot_s=slot)[1] == []


def test_confirmations_and_judgements_are_never_slotted():
    cfg, slot = ProbeConfig(interval_s=0.050), 0.005
    p = _up(cfg, 10.0)
    p, (send,) = p.poll(10.0, send_slot_s=slot)
    # The reply wait is judged on time, not at a slot's start.
    assert p.next_wakeup(slot) == pytest.approx(10.0 + cfg.suspect_after_s)
    p, sends = p.poll(10.0 + cfg.suspect_after_s, send_slot_s=slot)  # unanswered: silent
    assert p.state is PathState.SUSPECT and sends == []
    # Confirmations keep their grid from the first probe, not the slots' grid.
    spacing = cfg.tolerance_s / cfg.confirm_probes
    for k in (1, 2):
        assert p.next_wakeup(slot) == pytest.approx(p.next_confirm)
        assert p.next_confirm == pytest.approx(10.0 + k * spacing)
        p, sends = p.poll(p.next_confirm, send_slot_s=slot)
        assert len(sends) == 1 and all(s.burst for s in sends)


# ---------------------------------------------------------------- a mutable prober


def test_a_prober_changes_in_place_and_a_copy_is_independent():
    cfg = ProbeConfig()
    p = _up(cfg, 1.0)

    def probe(i: int) -> None:
        now = p.next_send
        _, (send,) = p.poll(now)
        assert p.on_reply(send.seq, now + 0.0002, now + 0.0002) is p  # in place

    for i in range(30):
        probe(i)
    snapshot = p.copy()
    assert snapshot.window == p.window and snapshot.counters == p.counters
    for i in range(30, 60):
        probe(i)
    assert (snapshot.counters.sent, p.counters.sent) == (30, 60)
    assert (len(snapshot.window), len(p.window)) == (30, 60)
    assert snapshot.next_send < p.next_send
    # dataclasses.replace() builds a new prober with counters of its own.
    other = replace(p, reason="x")
    other.counters.sent += 1
    assert other.counters.sent == p.counters.sent + 1


@settings(max_examples=50, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=600))
def test_the_loss_window_keeps_the_last_outcomes_and_their_count(outcomes):
    cfg = ProbeConfig(loss_window=50)
    p = _up(cfg, 0.0)
    for lost in outcomes:
        p._window_add(lost, 0.0)
    kept = outcomes[-cfg.loss_window:]
    assert p.window == tuple(kept)
    assert p.loss_ratio == pytest.approx(sum(kept) / len(kept))
