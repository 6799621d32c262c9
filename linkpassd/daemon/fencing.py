"""The daemon's fence step (``[fence]``, docs/fencing.md): each pass, feed
core.fence what the loop saw of every port, record every step as a ``fence``
event, and make the ports' administrative state follow: a FENCED port down,
every other port linkpassd once set down up again. Level-triggered, like the
route reconcile: a write that failed is tried again on the next pass.

Who owns a port that is down: `fences.json` in the state directory lists the
ports linkpassd set down (written before the write that takes one down), so a
restart neither mistakes its own fence for somebody else's nor leaves a port
down without an owner: at start every port in the file is brought up and
tested (core.fence.resumed), or just brought up if fencing is off now. On a
clean stop the fenced ports are brought up too: a fence lives only while
linkpassd does (a fenced port with nobody to test it would stay down).

A collaborator of the loop: the daemon builds one `Fencing` with the event
recorder's `emit` and its wall clock; `decide(...)` once per pass before the
policy (its `overlay` keeps routes off held ports), `await act()` after the
route writes, `lift(port, ...)` for the operator, and the status reads
`problems()`, `lines(now)` and `fences`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

import structlog

from linkpassd.adapters.fence import FenceWriteError, set_admin
from linkpassd.adapters.statefile import StateFileError, read_json, write_json_atomic
from linkpassd.core import fence
from linkpassd.core.events import EventKind, Severity
from linkpassd.core.fence import Action, Fence, Gate, Sight, State
from linkpassd.core.health import PortHealth
from linkpassd.core.model import Config, FenceSettings, LinkSample, PortState, Problem, Verdict
from linkpassd.core.signals import worst
from linkpassd.daemon.statefiles import ECHO_SIGNAL

log = structlog.get_logger("linkpassd")

FENCE_FILE = "fences.json"  # in the state directory

NO_STREAM = ("no leaf grant: no stream to the aggregator, and a fence needs its grant for the "
             "port's leaf ([fence] require_leaf_grant)")
NOT_GRANTED = "no leaf grant yet: asked the aggregator (its leaf's cap may be in use)"

_SEVERITY = {Action.FENCE: Severity.WARNING, Action.REFENCE: Severity.WARNING,
             Action.TEST: Severity.INFO, Action.UNFENCE: Severity.INFO,
             Action.RELEASE: Severity.WARNING, Action.NONE: Severity.INFO}


UnknownPort = fence.NotAFencePort
MAX_LIFT_HOLD_S = 366 * 86400.0


def _default_ipr():
    from pyroute2 import AsyncIPRoute

    return AsyncIPRoute()


def evidence(h: PortHealth, link: LinkSample | None) -> Verdict | None:
    """The port's own word while it is tested: what its probes (echo, BFD)
    judge now; None while none of them has an opinion. Carrier alone is no
    evidence (a blackhole keeps carrier)."""
    judged = [a.effective for _, a in h.signals.probes if a.effective is not None]
    if not judged:
        return None
    if link is None or not link.healthy:
        return Verdict.DOWN
    return worst(*judged)


def sights(config: Config, health: Mapping[str, PortHealth], links: Mapping[str, LinkSample],
           drained: Iterable[str]) -> dict[str, Sight]:
    drained = set(drained)
    out = {}
    for rail in config.rails:
        h, link = health.get(rail.port), links.get(rail.port)
        if h is None:
            continue
        out[rail.port] = Sight(h.verdict, carrier=bool(link and link.healthy),
                               drained=rail.port in drained, evidence=evidence(h, link),
                               singled_out=fence.singled_out(h.signals.probes, ECHO_SIGNAL,
                                                             config.fence.min_echo_peers))
    return out


def _unsingled(h: PortHealth, min_echo_peers: int) -> str:
    peers = max((a.witnesses for n, a in h.signals.probes if n == ECHO_SIGNAL), default=0)
    return (f"not fenced: its DOWN rests on echo paths to {peers} peer(s) (min_echo_peers "
            f"{min_echo_peers}) and no BFD session with its leaf is down; one peer cannot tell "
            "its own failure from this port's")


class Fencing:
    """The fence states between passes, the ports set down, and their problems."""

    def __init__(self, emit: Callable[..., object], wallclock: Callable[[], float],
                 make_ipr: Callable[[], object] = _default_ipr, *,
                 config: Callable[[], Config] | None = None,
                 clock: Callable[[], float] | None = None,
                 nudge: Callable[[], object] = lambda: None) -> None:
        self.emit = emit
        self.wallclock = wallclock
        self.config = config  # the running config, for the control API
        self.clock = clock  # the loop's monotonic clock, for the control API
        self.nudge = nudge  # asks the loop for a pass (an operator's lift takes effect at once)
        self.make_ipr = make_ipr
        self.ipr: object | None = None
        self.fences: dict[str, Fence] = {}
        # Ports DOWN with carrier on evidence that does not single them out
        # (core.fence.singled_out) -> why they are not fenced, for status.
        self.unsingled: dict[str, str] = {}
        self.down: dict[str, float] = {}  # ports linkpassd owns down (the file) -> backoff_s
        self.written_down: set[str] = set()  # ... of which a down write succeeded
        self.saved: dict[str, float] | None = None
        self.state_dir = ""
        self._problems: dict[str, Problem] = {}
        # The aggregator's leaf grants: the ports it lets this host fence;
        # None while there is no stream (AggregatorLink sets it).
        self.grants: frozenset[str] | None = None

    # --------------------------------------------------------------- problems

    def problems(self) -> list[Problem]:
        return list(self._problems.values())

    def _problem(self, key: str, what: str, detail: str) -> None:
        old = self._problems.get(key)
        if old is None or old.detail != detail:
            log.warning("fence_problem", what=what, detail=detail)
            self._problems[key] = Problem("fence", what, detail,
                                          old.since if old is not None else self.wallclock())

    def _clear(self, key: str) -> None:
        self._problems.pop(key, None)

    # --------------------------------------------------------------- the file

    def _path(self) -> str:
        return os.path.join(self.state_dir, FENCE_FILE)

    def load(self, config: Config, now: float) -> None:
        """At start: the ports the last daemon left down become tests (or are
        just brought up by the first `act` when fencing is off)."""
        self.state_dir = config.state_dir
        path = self._path()
        try:
            doc = read_json(path)
            left = fence.decode(doc) if doc is not None else {}
        except (StateFileError, fence.FenceFileError) as exc:
            self._problem("file", path, f"fence file unusable: {exc}; ports it may list stay "
                          "as they are (bring them up by hand: ip link set PORT up)")
            return
        self.saved = dict(left)
        ports = {r.port for r in config.rails}
        for port, backoff in left.items():
            if port not in ports:
                log.warning("fence_left_unknown_port", port=port,
                            note="in fences.json but no rail's port; brought up")
            self.down[port] = backoff  # `act` brings it up: no fence state holds it down
            self.written_down.add(port)
            if config.fence.enabled and port in ports:
                self.fences[port] = fence.resumed(port, backoff, config.fence, now)
                self._event(port, config, fence.Step(port, State.FENCED, State.TESTING,
                                                     fence.Trigger.BACKOFF_DONE, Action.TEST,
                                                     self.fences[port].reason))

    def _save(self) -> None:
        if self.down == self.saved or not self.state_dir:
            return
        path = self._path()
        try:
            write_json_atomic(path, fence.encode(self.down, self.wallclock()))
        except OSError as exc:
            self._problem("file", path, f"cannot write the fence file: {exc}")
            raise
        self._clear("file")
        self.saved = dict(self.down)

    # --------------------------------------------------------------- the pass

    def decide(self, config: Config, health: Mapping[str, PortHealth],
               links: Mapping[str, LinkSample], drained: Iterable[str], now: float) -> None:
        """Step every port's fence (pure, core.fence) and record the steps."""
        self.state_dir = config.state_dir
        seen = sights(config, health, links, drained)
        gates = {p: self._gate(config, p) for p in seen}
        order = [r.port for r in config.rails]
        self.fences = {p: f for p, f in self.fences.items() if p in seen or p in order}
        self.fences, steps = fence.step(self.fences, seen, config.fence, gates, now, order)
        self.unsingled = {
            p: _unsingled(health[p], config.fence.min_echo_peers) for p, s in seen.items()
            if s.verdict is Verdict.DOWN and s.carrier and not s.drained
            and s.evidence is Verdict.DOWN and not s.singled_out}
        for st in steps:
            self._event(st.port, config, st)

    def _gate(self, config: Config, port: str) -> Gate:
        if not config.fence.require_leaf_grant:
            return Gate(True)
        if self.grants is None:
            return Gate(False, NO_STREAM)
        return Gate(True) if port in self.grants else Gate(False, NOT_GRANTED)

    def granted(self, ports: Iterable[str] | None) -> None:
        """The aggregator's grants (None: the stream ended, no grant holds).
        A grant gates new fences only: a fence made stays under the host's
        own rules until it ends."""
        new = None if ports is None else frozenset(ports)
        if new != self.grants:
            log.info("fence_grants", ports=sorted(new) if new is not None else "no stream")
        self.grants = new

    def _event(self, port: str, config: Config, st: fence.Step) -> None:
        rail = next((r.name for r in config.rails if r.port == port), "")
        f = self.fences.get(port)
        if st.action is Action.NONE:
            if st.before == st.after and not (f and f.held):
                return
            if st.before == st.after:  # held back: say why, once per reason
                self.emit(EventKind.FENCE, "fence_held", port=port, rail=rail,
                          severity=Severity.WARNING,
                          message=f"{port} would be fenced, held back: {f.held if f else ''}",
                          state=str(st.after), previous=str(st.before), action="held",
                          reason=f.held if f else "")
                return
            if {st.before, st.after} <= {State.ARMED, State.CONFIRMING}:
                return  # the clock starting or stopping is no event: the verdict event says it
        self.emit(EventKind.FENCE, f"fence_{st.action}" if st.action is not Action.NONE
                  else "fence_state", port=port, rail=rail, severity=_SEVERITY[st.action],
                  message=f"{port} {st.action if st.action is not Action.NONE else st.after}: "
                          f"{st.reason}",
                  state=str(st.after), previous=str(st.before), action=str(st.action),
                  reason=st.reason, backoff_s=f.backoff_s if f else 0.0)

    def overlay(self, states: Mapping[str, PortState], now: float) -> dict[str, PortState]:
        """Port states as the routing sees them (core.fence.overlay), with a
        line of evidence for a port the fence is watching."""
        out = fence.overlay(states, self.fences)
        for port, f in self.fences.items():
            st = out.get(port)
            if st is not None and f.state in (State.CONFIRMING, State.LIFTED):
                out[port] = replace(st, evidence=(*st.evidence, "fence " + fence.describe(f, now)))
            elif st is not None and f.state is State.ARMED and port in self.unsingled:
                out[port] = replace(st, evidence=(*st.evidence, "fence " + self.unsingled[port]))
        return out

    # ------------------------------------------------------- the control API

    def _running(self) -> tuple[Config, float, float]:
        assert self.config is not None and self.clock is not None, "made without the loop"
        now = self.clock()
        return self.config(), now, self.wallclock() - now

    def list_fences(self) -> tuple[FenceSettings, list[fence.View]]:
        config, now, to_wall = self._running()
        return config.fence, [fence.view(self.fences.get(r.port) or fence.initial(r.port),
                                         r.name, now, to_wall) for r in config.rails]

    async def unfence(self, port: str, hold_s: float | None, by: str) -> fence.View:
        """The operator's lift (`linkpassctl unfence`); core.fence's
        NotAFencePort, FencingOff or FenceRequestError (a bad hold)."""
        config, now, to_wall = self._running()
        rail = next((r.name for r in config.rails if r.port == port), None)
        if rail is None:
            raise UnknownPort(f"{port!r} is no rail's port; rail ports: "
                              + ", ".join(r.port for r in config.rails))
        if not config.fence.enabled:
            raise fence.FencingOff("fencing is off ([fence] enabled = false): nothing to lift")
        hold = config.fence.lift_hold_s if not hold_s else hold_s
        if not (0 < hold <= MAX_LIFT_HOLD_S):
            raise fence.FenceRequestError(f"hold {hold_s!r} must be more than 0 and at most "
                             f"{MAX_LIFT_HOLD_S:g} seconds")
        self.fences.setdefault(port, fence.initial(port))
        f = self.lift(port, hold, now, by)
        self.nudge()
        return fence.view(f, rail, now, to_wall)

    def lift(self, port: str, hold_s: float, now: float, who: str) -> Fence:
        f = self.fences.get(port)
        if f is None:
            raise UnknownPort(f"{port!r} is no rail's port")
        self.fences[port] = fence.lift(f, hold_s, now, who)
        return self.fences[port]

    async def act(self) -> None:
        """Make the ports' administrative state follow the fences. Never
        raises into the loop."""
        want_down = {p: f.backoff_s for p, f in self.fences.items() if f.state is State.FENCED}
        up = [p for p in self.down if p not in want_down]
        down = [p for p in want_down if p not in self.written_down]
        if not up and not down:
            return
        if self.ipr is None:
            try:
                self.ipr = self.make_ipr()
            except Exception as exc:  # noqa: BLE001 - never the loop's end; tried again next pass
                self._problem("socket", "fence writes", f"no netlink socket: {exc!r}")
                return
            self._clear("socket")
        added = [p for p in down if p not in self.down]
        self.down.update({p: want_down[p] for p in down})
        try:
            self._save()  # the owner is on disk before the port goes down
        except OSError:
            for port in added:
                del self.down[port]
            down = []
        for port in down:
            if await self._write(port, up=False):
                self.written_down.add(port)
        for port in up:
            if await self._write(port, up=True):
                del self.down[port]
                self.written_down.discard(port)
        try:
            self._save()
        except OSError:
            pass

    async def _write(self, port: str, up: bool) -> bool:
        try:
            await set_admin(self.ipr, port, up)
        except FenceWriteError as exc:
            self._problem(f"write:{port}", f"fence of {port}", str(exc))
            return False
        except Exception as exc:  # noqa: BLE001 - never the loop's end
            self._problem(f"write:{port}", f"fence of {port}", repr(exc))
            return False
        self._clear(f"write:{port}")
        log.info("fence_write", port=port, state="up" if up else "down")
        return True

    async def stop(self) -> None:
        """A clean stop brings fenced ports up: nobody would test them."""
        self.fences = {p: replace(f, state=State.ARMED) for p, f in self.fences.items()}
        await self.act()

    def close(self) -> None:
        if self.ipr is not None:
            close = getattr(self.ipr, "close", None)
            if close is not None:
                close()
            self.ipr = None
