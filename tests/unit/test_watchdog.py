"""The systemd watchdog: ping only while the reconcile loop makes progress.

Simulated time throughout: the decision is a function of stamps and `now`,
and `Watchdog.check` is what the event-loop task calls once per period.
"""

from __future__ import annotations

import asyncio

import pytest

from linkpassd.adapters.watchdog import Watchdog, interval_from_environment, progress_is_recent


class Recorder:
    def __init__(self, error: Exception | None = None):
        self.sent: list[str] = []
        self.error = error

    def __call__(self, state: str) -> bool:
        if self.error is not None:
            raise self.error
        self.sent.append(state)
        return True


@pytest.mark.parametrize("environ, pid, expected", [
    ({}, 100, None),
    ({"WATCHDOG_USEC": "10000000"}, 100, 10.0),
    ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "100"}, 100, 2.0),
    ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "101"}, 100, None),  # meant for another process
    ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "x"}, 100, None),
    ({"WATCHDOG_USEC": "ten"}, 100, None),
    ({"WATCHDOG_USEC": "0"}, 100, None),
    ({"WATCHDOG_USEC": "-5"}, 100, None),
    ({"WATCHDOG_USEC": ""}, 100, None),
])
def test_interval_from_environment(environ, pid, expected):
    assert interval_from_environment(environ, pid) == expected


def test_progress_is_recent_only_within_the_period():
    assert not progress_is_recent(None, 100.0, 5.0)  # no batch handled yet
    assert progress_is_recent(99.0, 100.0, 5.0)
    assert progress_is_recent(95.0, 100.0, 5.0)
    assert not progress_is_recent(94.9, 100.0, 5.0)


def test_pings_every_period_while_the_loop_progresses_and_stops_when_it_stalls():
    send = Recorder()
    dog = Watchdog(10.0, clock=lambda: 0.0, send=send)
    assert dog.period_s == 5.0
    pinged = []
    now = 0.0
    # Healthy: a Tick is handled every 0.5 s, the watchdog checks every 5 s.
    for step in range(1, 61):
        now = step * 0.5
        if now <= 12.0:
            dog.progress(now)  # the reconcile loop stalls after 12 s
        if step % 10 == 0:
            pinged.append((now, dog.check(now)))
    assert pinged == [(5.0, True), (10.0, True), (15.0, True), (20.0, False), (25.0, False),
                      (30.0, False)]
    assert send.sent == ["WATCHDOG=1"] * 3
    # systemd (WatchdogSec=10) sees the last ping at 15 s and fires at 25 s:
    # within two periods of the stall at 12 s.
    assert dog.withheld == 3 and dog.stalled

    dog.progress(31.0)  # the loop runs again
    assert dog.check(35.0) and send.sent[-1] == "WATCHDOG=1" and not dog.stalled


def test_no_ping_before_the_first_batch_is_handled():
    send = Recorder()
    dog = Watchdog(2.0, send=send)
    assert not dog.check(1.0) and send.sent == []


def test_a_failing_notify_socket_is_counted_not_raised():
    dog = Watchdog(2.0, send=Recorder(error=ConnectionRefusedError("gone")))
    dog.progress(0.5)
    assert dog.check(1.0) is False
    assert dog.send_errors == 1


def test_run_returns_at_once_without_a_watchdog():
    dog = Watchdog(None, send=Recorder())
    asyncio.run(asyncio.wait_for(dog.run(), 1.0))  # returns; a TaskGroup keeps the others


def test_run_pings_from_the_event_loop_on_its_period():
    """With the real loop, on a short simulated interval: progress made on the
    loop is what lets a ping out."""
    send = Recorder()
    dog = Watchdog(0.1)  # period 50 ms
    dog.send = send

    async def scenario() -> None:
        task = asyncio.create_task(dog.run())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        while not send.sent and loop.time() < deadline:
            dog.progress(dog.clock())
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(scenario())
    assert send.sent and set(send.sent) == {"WATCHDOG=1"}
