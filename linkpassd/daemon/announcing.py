"""The daemon's announce step (``[announce]``, docs/bgp.md): after each
decision, make the announcement table say what core.announce plans, record
every change as an ``announce`` event, and keep FRR's state (running?
importing the table?) in the status's problems and in an event when it
changes.

It never raises into the reconcile loop: FRR missing or a refused write is a
problem to report, and outgoing protection goes on regardless. Nothing is
withdrawn when the daemon stops; turning ``[announce]`` off (reload)
withdraws what linkpassd wrote.

A collaborator of the loop: the daemon builds one `Announcements` with the
event recorder's `emit` and its wall clock, calls ``await step(config,
decision, now)`` once per pass, and the status report reads `problems()`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from linkpassd.adapters.announce import Announcer, FrrState
from linkpassd.core import announce
from linkpassd.core.announce import Announcement
from linkpassd.core.events import EventKind, Severity
from linkpassd.core.model import AnnounceSettings, Config, Problem

log = structlog.get_logger("linkpassd")

FRR_CHECK_INTERVAL_S = 5.0  # how often FRR's state is read while nothing changes
# zebra imports within milliseconds; read it this long after the latest write
# (writes come at most once per change, so churn postpones the check only while
# it lasts)
FRR_CHECK_AFTER_WRITE_S = 1.0


def _default_ipr():
    from pyroute2 import AsyncIPRoute

    return AsyncIPRoute()


@dataclass
class Announcing:
    settings: AnnounceSettings
    adapter: Announcer
    ipr: object
    planned: dict[str, Announcement] = field(default_factory=dict)
    started: bool = False  # a first plan was written since this daemon started
    dirty: bool = True  # the table must be written again (a write failed, or first pass)
    next_check: float = 0.0
    frr_problems: tuple[str, ...] | None = None  # None: not read yet
    writes: int = 0


class Announcements:
    """The announce step's state between passes, and its problems."""

    def __init__(self, emit: Callable[..., object], wallclock: Callable[[], float],
                 make_ipr: Callable[[], object] = _default_ipr) -> None:
        self.emit = emit
        self.wallclock = wallclock
        self.make_ipr = make_ipr
        self.state: Announcing | None = None
        self._problems: dict[str, Problem] = {}

    def problems(self) -> list[Problem]:
        return list(self._problems.values())

    def _problem(self, key: str, what: str, detail: str) -> None:
        old = self._problems.get(key)
        if old is None or old.detail != detail:
            since = old.since if old is not None else self.wallclock()
            self._problems[key] = Problem("announce", what, detail, since)

    def _clear(self, key: str | None = None) -> None:
        for k in [k for k in self._problems if key is None or k == key]:
            del self._problems[k]

    async def step(self, config: Config, decision, now: float) -> None:
        try:
            await self._step(config, decision, now)
        except Exception as exc:
            log.error("announce_failed", error=repr(exc), exc_info=exc)
            if self.state is not None:
                self.state.dirty = True
            self._problem("step", "announcements", f"failed: {exc!r}")

    async def _step(self, config: Config, decision, now: float) -> None:
        settings = config.announce
        st = self.state
        if not settings.enabled:
            if st is not None:  # turned off by a reload: withdraw what we wrote
                await st.adapter.apply(config, {})
                self.state = None
            self._clear()
            return
        if st is None:
            ipr = self.make_ipr()
            st = Announcing(settings, Announcer(ipr, settings, settings.frr_run_dir), ipr)
            self.state = st
        elif st.settings != settings:
            if (st.settings.table, st.settings.route_protocol) != (settings.table,
                                                                 settings.route_protocol):
                await st.adapter.apply(config, {})  # the old table or protocol: withdraw there
            st.settings = settings
            st.adapter = Announcer(st.ipr, settings, settings.frr_run_dir)
            st.dirty = True

        want = announce.plan(config, settings, decision.rails, st.planned, now)
        if want != st.planned or st.dirty:
            result = await st.adapter.apply(config, want)
            st.writes += len(result.added) + len(result.removed)
            for t in announce.transitions(st.planned, want):
                previous = f"{t.before.via}" if t.before else ("unknown" if not st.started else "none")
                self.emit(EventKind.ANNOUNCE, "announce", rail=t.rail, severity=t.severity,
                          message=t.message, address=t.address, change=str(t.change),
                          via=t.after.via if t.after else "none",
                          role=str(t.after.role) if t.after else "none", previous=previous)
            if result.refused:
                self._problem("refused", "announcements refused",
                              "not held by this host or not a rail address: " + ", ".join(result.refused))
            else:
                self._clear("refused")
            if result.errors:
                self._problem("write", "announcement table", "; ".join(result.errors))
            else:
                self._clear("write")
            self._clear("step")
            st.planned, st.started = want, True
            st.dirty = bool(result.errors)
            if result.added or result.removed:
                # zebra's import is read a moment after the latest write, never in
                # the step that wrote (a check already due would read it mid-import)
                st.next_check = now + FRR_CHECK_AFTER_WRITE_S
        if now >= st.next_check:
            frr: FrrState = await st.adapter.frr_state(want)
            st.next_check = now + FRR_CHECK_INTERVAL_S
            if frr.problems != st.frr_problems:
                first = st.frr_problems is None
                st.frr_problems = frr.problems
                if frr.problems or not first:
                    self.emit(EventKind.ANNOUNCE, "announce_frr",
                              severity=Severity.INFO if frr.ok else Severity.WARNING,
                              message="FRR announces the table" if frr.ok else
                              "FRR cannot announce: " + "; ".join(frr.problems),
                              frr="ok" if frr.ok else "missing", table=settings.table,
                              problems="; ".join(frr.problems) or "none")
            if frr.ok:
                self._clear("frr")
            else:
                self._problem("frr", "FRR (bgpd, zebra)", "; ".join(frr.problems)
                              + " — addresses are not announced; outgoing failover goes on")
