"""The echo engine's cost per probe stays constant as paths are added (issue 11):
one schedule for every path (core.schedule), one stall log for the host
(core.stalls), phases kept through stalls, and witness bookkeeping that does
not walk every path. Simulated time; the asyncio parts with a real loop and
no sockets (paths on interfaces that do not exist: no root)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from linkpassd.adapters import echo
from linkpassd.core.probe import PathState, Prober, ProbeConfig
from linkpassd.core.schedule import DeadlineQueue, batched_wake
from linkpassd.core.stalls import StallLog, stalled_time

PEER = "198.18.1.2"


# ---------------------------------------------------------------- DeadlineQueue


def test_the_queue_yields_the_earliest_deadline_and_moves_keys():
    q: DeadlineQueue[str] = DeadlineQueue()
    assert q.earliest() is None and q.pop_due(100.0) == []
    q.set("a", 3.0)
    q.set("b", 1.0)
    q.set("c", 2.0)
    assert q.earliest() == 1.0
    q.set("b", 5.0)  # moved later: the old entry must not surface
    assert q.earliest() == 2.0
    assert q.pop_due(3.0) == [("c", 2.0), ("a", 3.0)]
    assert len(q) == 1 and "b" in q and q.get("b") == 5.0
    q.discard("b")
    assert q.earliest() is None and q.pop_due(10.0) == []


def test_a_key_popped_once_even_when_set_back_to_an_old_deadline():
    q: DeadlineQueue[str] = DeadlineQueue()
    q.set("a", 1.0)
    q.set("a", 2.0)
    q.set("a", 1.0)
    assert q.pop_due(5.0) == [("a", 1.0)]
    assert q.pop_due(5.0) == []


def test_moving_deadlines_forever_keeps_the_heap_bounded():
    q: DeadlineQueue[int] = DeadlineQueue()
    for i in range(10):
        q.set(i, float(i))
    for n in range(10_000):
        q.set(n % 10, 100.0 + n)
    assert len(q) == 10 and len(q._heap) <= 2 * 10 + 64 + 1
    assert [k for k, _ in q.pop_due(1e9)] == list(range(10))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.floats(0, 100, allow_nan=False)),
                max_size=200), st.floats(0, 100, allow_nan=False))
def test_the_queue_agrees_with_a_plain_dict(ops, now):
    q: DeadlineQueue[int] = DeadlineQueue()
    model: dict[int, float] = {}
    for key, when in ops:
        q.set(key, when)
        model[key] = when
    assert q.earliest() == (min(model.values()) if model else None)
    due = q.pop_due(now)
    assert sorted(due) == sorted((k, w) for k, w in model.items() if w <= now)
    assert [w for _, w in due] == sorted(w for _, w in due)


def test_deadlines_within_one_grain_share_a_wake_up():
    assert batched_wake(1.0003) == pytest.approx(1.001)
    assert batched_wake(1.0009) == pytest.approx(1.001)
    assert batched_wake(1.001) == pytest.approx(1.001)  # on the grid: not a grain later
    assert batched_wake(1.0011) == pytest.approx(1.002)
    assert batched_wake(1.0003, 0) == 1.0003


def test_256_paths_at_10_ms_wake_the_loop_once_per_ms_and_none_runs_late():
    """Simulated loop: 256 paths spread over a 10 ms interval, as the service
    starts them. Each wake-up runs every path due by then; none runs more than
    one grain after its deadline; the loop wakes at most once per ms (a
    handle per path would wake it 25,600 times a second)."""
    interval, n = 0.010, 256
    q: DeadlineQueue[int] = DeadlineQueue()
    for i in range(n):
        q.set(i, 1.0 + i * interval / n)
    wakeups, runs, worst = 0, 0, 0.0
    while True:
        wake = batched_wake(q.earliest())
        if wake > 2.0:
            break
        wakeups += 1
        now = wake + 1e-6  # a loop runs a timer a little after its time, never before
        for key, when in q.pop_due(now):
            runs += 1
            worst = max(worst, now - when)
            q.set(key, when + interval)
    assert abs(runs - n * 100) <= 1  # every path, every interval, for 1 s (the edge: float)
    assert wakeups <= 1000 + 1 and worst <= 0.001 + 2e-6


# ---------------------------------------------------------------- StallLog


def test_the_stall_log_merges_and_measures():
    log = StallLog()
    log.add(1.0, 1.002)
    log.add(1.001, 1.004)  # overlaps: merged
    log.add(1.010, 1.011)
    assert log.intervals() == ((1.0, 1.004), (1.010, 1.011))
    assert log.covered(0.0, 2.0) == pytest.approx(0.005)
    assert log.covered(1.003, 1.0105) == pytest.approx(0.0015)
    assert log.covered(1.004, 1.010) == 0.0
    log.add(0.9, 1.0105)  # measured late, spanning both: one interval
    assert log.intervals() == ((0.9, 1.011),)


def test_the_stall_log_forgets_what_no_probe_in_flight_can_need():
    log = StallLog(memory_s=2.0)
    for i in range(1000):
        log.add(i * 0.01, i * 0.01 + 0.001)
    assert len(log) <= 202
    assert log.covered(0.0, 1.0) == 0.0  # forgotten
    assert log.covered(9.0, 10.0) == pytest.approx(0.1)


def test_a_stall_must_not_end_before_it_starts():
    with pytest.raises(ValueError, match=r"\[2.0, 1.0\]"):
        StallLog().add(2.0, 1.0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 0.2)), max_size=30),
       st.floats(0, 1), st.floats(0, 1), st.randoms(use_true_random=False))
def test_own_and_host_stalls_count_each_moment_once(stalls, a, b, rnd):
    """However the stalls are split between a path's own list and the host's
    log (overlapping or not), the stalled time of a flight is the measure of
    their union: the same as when the path alone knew all of them."""
    start, end = min(a, b), max(a, b)
    intervals = [(s, s + d) for s, d in stalls]
    own, log = [], StallLog(memory_s=100.0)
    for s, e in intervals:
        where = rnd.random()
        if where < 0.4:
            own.append((s, e))
        elif where < 0.8:
            log.add(s, e)
        else:
            own.append((s, e))
            log.add(s, e)
    merged: list[list[float]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    expected = sum(max(0.0, min(e, end) - max(s, start)) for s, e in merged)
    assert stalled_time(tuple(sorted(own)), start, end, log) == pytest.approx(expected, abs=1e-9)


def test_a_host_stall_over_the_whole_flight_makes_the_miss_unknown():
    """The judgement with the stall in the host's log is the one the path made
    when it was told the stall itself (note_lag)."""
    cfg = ProbeConfig()
    up = replace(Prober(PEER, cfg), state=PathState.UP, next_send=0.0)
    p, _ = up.poll(0.0)
    log = StallLog()
    log.add(0.0005, 0.0095)  # the loop stalled over the whole timeout
    shared, _ = p.copy().poll(0.0095, 0.0, log)  # a prober changes in place: one copy each
    told, _ = p.copy().note_lag(0.0095, 0.009).poll(0.0095)
    alone, _ = p.copy().poll(0.0095)
    assert shared.counters.unknown_lag == told.counters.unknown_lag == 1
    assert shared.state is told.state is PathState.UP
    assert alone.counters.lost == 1 and alone.state is PathState.SUSPECT  # the control


# ---------------------------------------------------------------- phases


def test_a_stall_does_not_realign_the_paths_phases():
    """Slots a stall swallowed are skipped, and the next probe goes at the next
    slot of the path's own grid, not `interval` after the stall ended: the
    service spreads its paths over the interval, and a stall that re-aligned
    them would make all of them due in the same millisecond from then on."""
    cfg = ProbeConfig(interval_s=0.010, timeout_s=0.004)
    phases = []
    for first in (0.0013, 0.0047, 0.0081):
        p = replace(Prober(PEER, cfg), next_send=first)
        p, sends = p.poll(first)
        assert len(sends) == 1
        p, sends = p.poll(0.2345)  # a 230 ms stall, then the loop runs late
        assert len(sends) == 1  # one probe, no catching up
        assert 0.2345 < p.next_send <= 0.2345 + cfg.interval_s
        phases.append(round((p.next_send - first) / cfg.interval_s, 6) % 1)
    assert phases == [0.0, 0.0, 0.0]


# ---------------------------------------------------------------- the service


def _service(n_per_port: int, ports=("lpnone0", "lpnone1")) -> echo.EchoService:
    paths = [echo.ProbePath(port, f"198.18.{i}.2", f"198.19.9.{j + 1}")
             for i, port in enumerate(ports) for j in range(n_per_port)]
    return echo.EchoService(paths, ProbeConfig(), respond=False, lag_period_s=None)


def test_a_stall_is_recorded_once_not_told_to_every_path():
    """The old engine gave every prober a listener on the loop-lag meter, so a
    stall cost O(paths) (and each path re-sorted its own stall list): most of
    the daemon's CPU at 64 paths. Now the meter keeps one log the paths read."""
    async def scenario():
        svc = _service(32)
        svc.start()
        try:
            assert svc.lag.listeners == []
            svc.lag.record(svc.timer._loop.time() if svc.timer._loop else 1.0, 0.005)
            assert len(svc.lag.stall_log) == 1
            assert all(pr.state.stalls == () for pr in svc.probers.values())
        finally:
            svc.close()
    asyncio.run(scenario())


def test_the_service_runs_its_paths_from_one_timer_spread_over_the_interval():
    async def scenario():
        svc = _service(8)
        svc.start()
        try:
            firsts = sorted(pr.state.next_send for pr in svc.probers.values())
            gaps = [b - a for a, b in zip(firsts, firsts[1:])]
            assert gaps and min(gaps) == pytest.approx(svc.config.interval_s / 16, rel=0.01)
            assert len(svc.timer.queue) == 16  # every path in the one schedule
            assert all(pr.timer is svc.timer for pr in svc.probers.values())
        finally:
            svc.close()
        assert len(svc.timer.queue) == 0 and svc.timer._handle is None
    asyncio.run(scenario())


class _FakeSock:
    def fileno(self) -> int:
        return -1


def test_a_suspect_pokes_a_few_witnesses_on_other_rails_first():
    """When one path starts confirming a loss, a few live paths probe at once
    (other rails first), not every live path: a rail blackhole makes all of
    its paths suspect within one interval, and each poking all the others
    was O(paths^2) probes."""
    svc = _service(20)
    poked = []
    for rail in svc.sockets.values():  # one socket per rail, shared by its paths
        rail.sock = _FakeSock()
    for pr in svc.probers.values():
        pr.state = replace(pr.state, state=PathState.UP)
        pr.poke = lambda pr=pr: poked.append(pr)
        svc._changed(pr, pr.assessment())
    suspect = next(iter(svc.probers.values()))
    # A suspicion of the service's (coordinated: core.railwatch) waits for its
    # rail's turn; the first of its rail confirms at once, and then pokes.
    suspect.state = replace(suspect.state, state=PathState.SUSPECT, burst_held=True)
    started = []
    suspect.start_burst = lambda: started.append(suspect)
    svc._changed(suspect, suspect.assessment())
    assert started == [suspect]
    assert len(poked) == echo._WITNESS_POKES
    assert all(p.path.port != suspect.path.port for p in poked)
    assert suspect.state.others_live
    # With no other live path, nobody to poke and nobody to vouch.
    alone = _service(1, ports=("lpnone0",))
    (only,) = alone.probers.values()
    only.state = replace(only.state, state=PathState.SUSPECT)
    alone._changed(only, only.assessment())
    assert not only.state.others_live


def test_a_suspect_reads_the_latest_reply_of_any_other_path():
    svc = _service(3)
    a, b, c = list(svc.probers.values())[:3]
    assert svc._others_heard(a) is None
    svc._reply_heard(a, 1.0, 1.0 - 0.001, 7)
    assert svc._others_heard(a) is None and svc._others_heard(b) == 1.0
    svc._reply_heard(b, 2.0, 2.0 - 0.001, 7)
    assert svc._others_heard(a) == 2.0 and svc._others_heard(b) == 1.0
    svc._reply_heard(b, 3.0, 3.0 - 0.001, 7)
    svc._reply_heard(c, 2.5, 2.5 - 0.001, 7)  # older than b's latest
    assert svc._others_heard(b) == 2.5 and svc._others_heard(a) == 3.0
    rnd = random.Random(5)
    probers = list(svc.probers.values())
    latest: dict[object, float] = {}
    for _ in range(500):
        pr, t = rnd.choice(probers), rnd.uniform(0, 100)
        svc._reply_heard(pr, t, t - 0.001, 7)
        latest[pr] = max(latest.get(pr, t), t, latest.get(pr, t))
    for pr in probers:
        others = [t for q, t in latest.items() if q is not pr]
        assert svc._others_heard(pr) >= max(others)


def test_a_backlog_runs_in_slices_with_the_loop_free_in_between():
    """100 paths due at once (after a stall) run 32 per wake-up, and other
    callbacks (carrier, BFD) get the loop between slices."""
    from linkpassd.adapters.wakeups import MAX_RUNS_PER_WAKEUP, SharedTimer

    class Key:
        def __init__(self, log):
            self.log = log

        def due(self, now, lag):
            self.log.append("probe")

    async def scenario():
        log: list[str] = []
        timer = SharedTimer()
        loop = asyncio.get_running_loop()
        keys = [Key(log) for _ in range(100)]
        for k in keys:
            timer.set(k, loop.time() - 1.0)
        other = loop.call_soon(log.append, "other")  # e.g. a carrier event, already ready
        deadline = loop.time() + 5.0
        while log.count("probe") < 100 and loop.time() < deadline:
            await asyncio.sleep(0.001)
        other.cancel()
        return log, timer

    log, timer = asyncio.run(scenario())
    assert log.count("probe") == 100 and timer.wakeups >= 4
    first_other = log.index("other")
    assert first_other <= MAX_RUNS_PER_WAKEUP  # not behind the whole backlog


def _note_lag_reference(stalls, now, lag, tolerance=0.001, memory=2.0):
    """The merge note_lag did before its fast path: sort everything, merge, forget."""
    if lag < tolerance:
        return stalls
    merged = []
    for s, e in sorted(stalls + ((now - lag, now),)):
        if e < now - memory:
            continue
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return tuple(merged)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 0.5), st.floats(0, 0.3)), max_size=60))
def test_note_lag_merges_as_the_full_sort_did(steps):
    """note_lag appends in the usual order without sorting; in any order it
    keeps exactly what sorting and merging everything kept."""
    p, ref, now = Prober(PEER), (), 0.0
    for advance, lag in steps:
        now += advance
        p = p.note_lag(now, lag)
        ref = _note_lag_reference(ref, now, lag)
        assert [x for iv in p.stalls for x in iv] == pytest.approx([x for iv in ref for x in iv])
