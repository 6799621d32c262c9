"""systemd's watchdog (`WatchdogSec=`): ping only while the daemon makes progress.

A watchdog pinged from a thread or a plain timer proves only that the thread
or the timer runs. linkpassd's work happens in one reconcile loop on one event
loop, so the ping is sent *from* that event loop (a blocked loop sends
nothing) and only when the reconcile loop has *recently finished a batch of
events* (a loop stuck in one await, say a netlink request that never returns,
sends nothing either). A healthy reconcile loop always progresses: a Tick
arrives every `tick_interval_s`. systemd then kills and restarts a daemon that
stopped working, and fail-static keeps the routes meanwhile.

The decision, "is progress recent enough to ping?", is `progress_is_recent`,
a function of stamps and `now`, unit-tested with simulated time.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Callable, Mapping

import structlog

from linkpassd.adapters import sdnotify

log = structlog.get_logger("linkpassd.watchdog")


def interval_from_environment(environ: Mapping[str, str], pid: int) -> float | None:
    """systemd's watchdog interval in seconds, or None when there is none for
    us: WATCHDOG_USEC unset, or WATCHDOG_PID naming another process (a child
    that inherited the environment must not ping for its parent). A value
    that is not a positive integer is logged, naming it, and ignored: a bad
    environment must not stop the daemon."""
    raw = environ.get("WATCHDOG_USEC")
    if not raw:
        return None
    owner = environ.get("WATCHDOG_PID")
    if owner:
        try:
            if int(owner) != pid:
                return None
        except ValueError:
            log.warning("watchdog_ignored", reason=f"WATCHDOG_PID is not a pid: {owner!r}")
            return None
    try:
        usec = int(raw)
    except ValueError:
        usec = 0
    if usec <= 0:
        log.warning("watchdog_ignored", reason=f"WATCHDOG_USEC is not a positive integer: {raw!r}")
        return None
    return usec / 1e6


def progress_is_recent(last_progress: float | None, now: float, max_age_s: float) -> bool:
    """Ping only if the reconcile loop finished a batch within the last
    `max_age_s` (one ping period): after a stall starts, at most one more ping
    goes out, so systemd fires within two periods (its WatchdogSec)."""
    return last_progress is not None and now - last_progress <= max_age_s


class Watchdog:
    """Pings every half interval, from the event loop, while progress is recent."""

    def __init__(self, interval_s: float | None, clock: Callable[[], float] = time.monotonic,
                 send: Callable[[str], bool] = sdnotify.notify):
        self.interval_s = interval_s
        self.clock = clock
        self.send = send
        self.last_progress: float | None = None
        self.pings = 0
        self.withheld = 0
        self.send_errors = 0
        self.stalled = False  # the last check withheld its ping

    @classmethod
    def from_environment(cls, clock: Callable[[], float] = time.monotonic) -> "Watchdog":
        return cls(interval_from_environment(os.environ, os.getpid()), clock)

    @property
    def period_s(self) -> float | None:
        """systemd asks for a ping at least every half interval."""
        return self.interval_s / 2 if self.interval_s else None

    def progress(self, now: float) -> None:
        """The reconcile loop finished a batch of events at `now` (daemon clock)."""
        self.last_progress = now

    def check(self, now: float) -> bool:
        """One ping period has passed: ping if progress is recent; True if pinged.
        A stall is logged when it starts and when it ends, not every period."""
        assert self.period_s is not None
        if not progress_is_recent(self.last_progress, now, self.period_s):
            self.withheld += 1
            if not self.stalled:
                self.stalled = True
                age = None if self.last_progress is None else round(now - self.last_progress, 3)
                log.warning("watchdog_withheld", reason="no reconcile progress",
                            last_progress_age_s=age, interval_s=self.interval_s)
            return False
        if self.stalled:
            self.stalled = False
            log.info("watchdog_resumed", withheld=self.withheld)
        try:
            self.send("WATCHDOG=1")
        except OSError as exc:  # systemd's socket is outside us: never the daemon's end
            self.send_errors += 1
            if self.send_errors == 1:
                log.error("watchdog_send_failed", error=repr(exc))
            return False
        self.pings += 1
        return True

    async def run(self) -> None:
        """Returns at once when systemd asked for no watchdog."""
        if self.period_s is None:
            return
        log.info("watchdog_enabled", interval_s=self.interval_s, ping_every_s=self.period_s)
        while True:
            await asyncio.sleep(self.period_s)
            self.check(self.clock())
