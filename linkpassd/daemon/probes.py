"""The daemon's probes: BFD sessions, the echo service and our echo responder,
kept as the config (and the aggregator's probe mesh) says.

`Probes` starts, replaces and stops them; it judges nothing. What they
observe reaches the reconcile loop (daemon.loop) as events on its queue: a
`BfdEvent` from the BFD agent, an `EchoChange` when an echo path of a port
changes its verdict. The loop reads the port's assessments back from here
(`echo_assessments`) and feeds them to core.health.

`sync_echo` says whether the echo service was made anew (its paths start as
never up): the loop then restarts the echo signal of every port. Nothing here
calls back into the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import structlog

from linkpassd.adapters import udpholders
from linkpassd.adapters.bfd import BfdAgent, BfdEvent, PeerSpec
from linkpassd.adapters.clocksync import ClockWatch
from linkpassd.adapters.echo import EchoService
from linkpassd.adapters.looplag import LoopLag
from linkpassd.adapters.responderproc import ResponderProcess
from linkpassd.core.model import Assessment, Config, Problem, ResponderCounters
from linkpassd.core.oneway import NOT_CONFIGURED, ClockReading
from linkpassd.daemon.wiring import EchoSpec, echo_spec, sync_bfd

log = structlog.get_logger("linkpassd")

BFD_RETRY_S = 1.0  # a BFD session that could not start (port missing) is retried this often


@dataclass(frozen=True)
class EchoChange:
    """An echo path of this port changed its verdict."""

    port: str


def _rail_of(config: Config, port: str) -> str:
    return next((r.name for r in config.rails if r.port == port), "")


class Probes:
    """`post`: puts an event on the daemon's queue without waiting (a
    `BfdEvent` or an `EchoChange`)."""

    def __init__(self, post: Callable[[BfdEvent | EchoChange], None],
                 wallclock: Callable[[], float]) -> None:
        self.post = post
        self.wallclock = wallclock
        self.looplag = LoopLag()  # one event-loop lag meter for BFD and echo
        self.bfd: BfdAgent | None = None
        self.bfd_pending: dict[str, tuple[PeerSpec, str, float]] = {}  # session -> spec, error, since
        self.next_bfd_retry = 0.0
        self.echo: EchoService | None = None
        self.echo_spec: EchoSpec | None = None
        self.responder: ResponderProcess | None = None  # our echo responder, its own process
        self.echo_port_taken_since: float | None = None  # another process on the echo port
        # This host's clock error bound for one-way delay ([probes] clock), read
        # off the hot path while probing is on (adapters.clocksync).
        self.clock_watch: ClockWatch | None = None
        self.clock: ClockReading = NOT_CONFIGURED

    def start(self) -> None:
        """On the running loop: the lag meter and the BFD agent."""
        self.looplag.start()
        self.bfd = BfdAgent(self.post, lag=self.looplag)

    # ------------------------------------------------------------ BFD

    def sync_bfd(self, config: Config, now: float) -> None:
        """Sessions as the config says. One whose port is missing (a NIC fell
        off the bus, a rename) is reported and retried every BFD_RETRY_S;
        every other rail is protected meanwhile."""
        assert self.bfd is not None
        failed = sync_bfd(self.bfd, config)
        for name, (spec, _error, _since) in self.bfd_pending.items():
            if name in self.bfd.runs:
                log.info("bfd_session_started", session=name, port=spec.ifname,
                         rail=_rail_of(config, spec.ifname), note="after retry")
        self.bfd_pending = {name: pending for name, pending in self.bfd_pending.items()
                            if name in failed}
        for name, (spec, error) in failed.items():
            if name not in self.bfd_pending:
                log.error("bfd_session_failed", session=name, port=spec.ifname,
                          rail=_rail_of(config, spec.ifname), error=error,
                          retry_s=BFD_RETRY_S)
                self.bfd_pending[name] = (spec, error, self.wallclock())
            else:
                self.bfd_pending[name] = (spec, error, self.bfd_pending[name][2])
        self.next_bfd_retry = now + BFD_RETRY_S

    def bfd_retry_due(self, now: float) -> bool:
        return bool(self.bfd_pending) and now >= self.next_bfd_retry

    def recheck_bfd(self, name: str, detection_s: float | None) -> None:
        """Ask a session again once the loop has kept time (our lateness may
        explain what it said)."""
        if self.bfd is not None:
            self.bfd.recheck(name, detection_s)

    # ------------------------------------------------------------ echo

    def sync_echo(self, config: Config, mesh_peers: Mapping[str, Sequence[str]],
                  mesh_probers: Mapping[str, Sequence[str]]) -> bool:
        """Run the echo service the config asks for: at start, on reload and
        when the mesh's peers change. A change of timers starts it anew
        (paths begin as never up) and returns True: every port's echo signal
        must then start again. A change of peers only keeps the paths that
        stay."""
        spec = echo_spec(config, mesh_peers, mesh_probers)
        self._sync_responder(spec)
        self._sync_clock(config.probes.clock if spec is not None else None)
        if spec == self.echo_spec:
            return False
        if (self.echo is not None and spec is not None and self.echo_spec is not None
                and replace(spec, paths=(), responder=None)
                == replace(self.echo_spec, paths=(), responder=None)):
            # Only peers or who may be answered changed: paths that stay keep
            # their probers (verdict, loss window), new ones start never up.
            self.echo.set_paths(spec.paths)
            self.echo_spec = spec
            log.info("echo_peers_changed", paths=len(spec.paths))
            return False
        restarted = False
        if self.echo is not None:
            self.log_echo_counters("reloaded")
            self.echo.close()
            self.echo = None
            restarted = True
        self.echo_spec = spec
        if spec is None:
            return restarted
        self.echo = EchoService(
            spec.paths, spec.probe, echo_port=spec.port, tos=spec.tos,
            lag_period_s=spec.heartbeat_s, lag=self.looplag, respond=False,
            on_change=lambda path, _a: self.post(EchoChange(path.port)), clock=self.clock)
        self.echo.start()
        taken = self.echo_port_problems()
        if taken:
            log.error("echo_port_taken", port=spec.port, detail=taken[0].detail,
                      note="shown in status until that process lets go of the port")
        log.info("echo_probing", paths=len(spec.paths), port=spec.port,
                 interval_ms=config.probes.interval_ms)
        if not spec.responder.fabric_prefixes:
            log.warning("echo_responder_peers_only", peers=len(spec.responder.peers),
                        note="[probes] fabric_prefixes is empty: only configured probe_peers "
                             "get answers")
        return restarted

    def _sync_responder(self, spec: EchoSpec | None) -> None:
        """Our echo responder, a process of its own (adapters.responderproc):
        started with probing, handed each new policy, replaced only when its
        port changes. Nothing here waits on it: a reload never joins or
        restarts a responder for a change of timers or peers."""
        if spec is None:
            if self.responder is not None:
                log.info("echo_responder_stopped", **self.responder.tally())
                self.responder.close()
                self.responder = None
            return
        if self.responder is not None and self.responder.port == spec.port:
            if self.responder.policy != spec.responder:
                self.responder.set_policy(spec.responder)
            return
        if self.responder is not None:
            log.info("echo_responder_stopped", **self.responder.tally())
            self.responder.close()
        self.responder = ResponderProcess(spec.port, policy=spec.responder)
        self.responder.clock = self.clock
        self.responder.start()

    def _sync_clock(self, source: str | None) -> None:
        """Read the clock bound by `source` while probing is on (None: off)."""
        if self.clock_watch is not None and self.clock_watch.source == source:
            return
        if self.clock_watch is not None:
            self.clock_watch.close()
            self.clock_watch = None
        self.clock = NOT_CONFIGURED
        if source is None:
            return
        self.clock_watch = ClockWatch(source, self._clock_read)
        self.clock_watch.start()

    def _clock_read(self, reading: ClockReading) -> None:
        """A new reading of our clock's bound: to the probers and the responder."""
        had = self.clock
        self.clock = reading
        if (had.bound_ns is None) != (reading.bound_ns is None) or had.reason != reading.reason:
            if reading.bound_ns is None:
                log.info("clock_bound_none", source=reading.source, reason=reading.reason,
                         consequence="one-way delays are not reported, round trips only")
            else:
                log.info("clock_bound", source=reading.source, bound_us=reading.bound_ns / 1e3)
        if self.echo is not None:
            self.echo.set_clock(reading)
        if self.responder is not None:
            self.responder.set_clock(reading)

    def echo_assessments(self, port: str) -> Sequence[Assessment]:
        """Each echo path of `port`, as its prober judges it now."""
        return self.echo.assessments(port) if self.echo is not None else ()

    def path_assessments(self, port: str) -> tuple[Assessment, ...]:
        """For status: each echo path's own judgement (its tolerance, longest
        silence, the peer's hold and our stalls)."""
        if self.echo is None:
            return ()
        return tuple(prober.assessment() for path, prober in self.echo.probers.items()
                     if path.port == port)

    def log_echo_counters(self, why: str) -> None:
        assert self.echo is not None
        for path, prober in self.echo.probers.items():
            state = prober.state
            log.info("echo_counters", why=why, path=str(path), **vars(prober.counters),
                     longest_silence_ms=round(state.longest_silence_s * 1e3, 1),
                     peer_held_max_ms=round(state.held_max_s * 1e3, 1),
                     stall_max_ms=round(state.stall_max_s * 1e3, 1))
        log.info("echo_loop_lag", stalls=self.echo.lag.stalls,
                 max_lag_ms=round(self.echo.lag.max_lag_s * 1e3, 1), **self.echo.batching(),
                 **({"responder_" + k: v for k, v in self.responder.tally().items()}
                    if self.responder is not None else {}))

    # ------------------------------------------------------------ status

    def responder_counters(self) -> ResponderCounters | None:
        return self.responder.counters() if self.responder is not None else None

    def problems(self) -> list[Problem]:
        """BFD sessions that could not start, and a responder that failed."""
        out = [Problem("bfd", f"BFD session {name} on {spec.ifname}", error, since)
               for name, (spec, error, since) in sorted(self.bfd_pending.items())]
        r = self.responder
        if r is not None and r.error:
            out.append(Problem("responder", f"echo responder on UDP {r.port}", r.error,
                               r.error_since or 0.0))
        return out

    def echo_port_problems(self) -> list[Problem]:
        """Another process bound to the echo responder's UDP port: it receives
        the peers' probes meant for this daemon."""
        if self.echo_spec is None:
            self.echo_port_taken_since = None
            return []
        port = self.echo_spec.port
        others = udpholders.foreign(port)
        if not others:
            self.echo_port_taken_since = None
            return []
        if self.echo_port_taken_since is None:
            self.echo_port_taken_since = self.wallclock()
        error = self.responder.error if self.responder is not None else ""
        detail = ("another process holds it and receives the peers' probes: "
                  + ", ".join(h.describe() for h in others[:4]) + (f"; {error}" if error else ""))
        return [Problem("echo_port", f"echo responder UDP port {port}", detail,
                        self.echo_port_taken_since)]

    def close(self) -> None:
        """At shutdown. AdminDown tells the switch "shut down on purpose",
        not a path failure (RFC 5882): our routes stay as they are."""
        if self.bfd is not None:
            self.bfd.close(admin_down=True)
        if self.echo is not None:
            self.log_echo_counters("stopped")
            self.echo.close()
        if self.responder is not None:
            self.responder.close()
        if self.clock_watch is not None:
            self.clock_watch.close()
            self.clock_watch = None
