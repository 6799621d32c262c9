"""The echo engine's cost per probe stays constant as paths are added: one
schedule for every path (core.schedule), phases kept through stalls, and a
backlog worked off in slices. Simulated time; the asyncio parts with a real
loop and no sockets (paths on interfaces that do not exist: no root)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linkpassd.adapters import echo
from linkpassd.core.probe import ProbeConfig, Prober
from linkpassd.core.schedule import DeadlineQueue, batched_wake

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


# ---------------------------------------------------------------- phases


def test_a_stall_does_not_realign_the_paths_phases():
    """Slots a stall swallowed are skipped, and the next probe goes at the next
    slot of the path's own grid, not `interval` after the stall ended: the
    service spreads its paths over the interval, and a stall that re-aligned
    them would make all of them due in the same millisecond from then on."""
    cfg = ProbeConfig(interval_s=0.010)
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
