"""The daemon's side of the responder process (linkpassd.responder).

Why a process: a responder thread inside the daemon answers only when it gets
the daemon's interpreter lock, so a daemon busy for 16 ms (a reload, a burst
of events, a long C call holding the lock) made its replies 16 ms late, and
its peers' probers saw a dead path. Measured side by side in
labs/bench/responder_hold.py (results/responder_hold-thread-vs-process.json,
summed up in docs/health.md).

The daemon binds the socket (so "port taken" or "no permission" is its own
error, in its status and logs, and the port stays ours while a responder is
restarted), spawns `python -m linkpassd.responder` with it, and supervises it
from the event loop without ever waiting on it:
- the child's exit is a pidfd made readable (no SIGCHLD handler, no wait):
  it is reaped and started again, at once the first time, then backing off
  (`RESTART_S`) while it keeps dying young;
- the policy (rail addresses, prefixes, peers, rates) is a JSON line written
  to the child's stdin without blocking; what a full pipe does not take is
  kept (only the newest policy) and written when the pipe drains;
- the child's counters come back as JSON lines on its stdout, read when
  readable; a restarted child's counters are added to those of the ones before.
If the daemon dies, the child sees end of file on its stdin and exits.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import structlog

from linkpassd.adapters.echoresponder import ECHO_PORT, ResponderTally, _random_id, open_socket
from linkpassd.core.admission import ResponderPolicy
from linkpassd.core.model import ResponderCounters
from linkpassd.core.oneway import NOT_CONFIGURED, ClockReading
from linkpassd.responder import clock_to_wire, policy_to_wire

log = structlog.get_logger("linkpassd.responder")

RESTART_S = (0.0, 0.1, 0.5, 2.0, 5.0)  # delay before the n-th restart in a row of young deaths
# (the first at once: one SIGKILL or crash costs only a process start, ~0.2 s)
YOUNG_S = 10.0  # a child that lived this long resets the backoff
RETRY_BIND_S = 5.0  # a port we could not bind is tried again this often
_MAX_LINE = 65536  # a longer line from the child is garbage: dropped


@dataclass
class ResponderProcess:
    """One responder process on `port`/`listen`, answering by `policy`.

    `start()` and every other method return at once. `error` says why no
    responder runs ("" while one does); `counters()` is the total since
    `start()`, over every child."""

    port: int = ECHO_PORT
    listen: str = "0.0.0.0"
    policy: ResponderPolicy = field(default_factory=ResponderPolicy)
    netns: str | None = None
    python: str = sys.executable

    def __post_init__(self) -> None:
        self.responder_id = _random_id()  # the same across restarts: peers see one daemon
        self.clock: ClockReading = NOT_CONFIGURED  # sent to every child (set_clock)
        self.error = ""
        self.error_since: float | None = None
        self.sched = ""
        self.restarts = 0
        self.pid: int | None = None
        self._sock = None
        self._proc: subprocess.Popen | None = None
        self._pidfd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._out = b""  # a partial line from the child
        self._unsent = b""  # a policy line the pipe did not take yet
        self._child = ResponderTally()  # the running child's latest totals
        self._before = ResponderTally()  # every earlier child's, added up
        self._young_deaths = 0
        self._started_at = 0.0
        self._closed = False
        self._reaping: dict[int, subprocess.Popen] = {}  # pidfd -> a child being stopped

    # -- the daemon's calls ------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._closed = False
        self._bind_and_spawn()

    def set_policy(self, policy: ResponderPolicy) -> None:
        """Answer by `policy` from now on. Never blocks: the line waits in the
        pipe (or here, if the pipe is full) until the child reads it."""
        self.policy = policy
        if self._proc is not None:
            self._send(self._policy_lines(), replace=True)

    def set_clock(self, reading: ClockReading) -> None:
        """Our clock's newest error bound reading, for the replies' one-way
        fields (core.oneway). Never blocks, as set_policy."""
        self.clock = reading
        if self._proc is None:
            return
        if self._unsent:  # a child not reading: what waits stays bounded (the newest of each)
            self._send(self._policy_lines(), replace=True)
        else:
            self._send(self._clock_line(), replace=False)

    def _clock_line(self) -> bytes:
        return json.dumps({"clock": clock_to_wire(self.clock)}).encode() + b"\n"

    def _policy_lines(self) -> bytes:
        """The policy and the clock: what a new child, or a pipe whose
        pending lines are replaced, needs."""
        return (json.dumps({"policy": policy_to_wire(self.policy)}).encode() + b"\n"
                + self._clock_line())

    def counters(self) -> ResponderCounters:
        a, b = self._before, self._child
        return ResponderCounters(
            answered=a.answered + b.answered,
            refused_address=a.refused_address + b.refused_address,
            refused_source=a.refused_source + b.refused_source,
            rate_limited=a.rate_limited + b.rate_limited,
            malformed=a.malformed + b.malformed + a.ignored + b.ignored)

    def tally(self) -> dict[str, int]:
        """Every counter, for the daemon's log lines."""
        a, b = vars(self._before), vars(self._child)
        return {k: a[k] + b[k] for k in a} | {"restarts": self.restarts}

    def close(self) -> None:
        """Stop the child (SIGKILL: it holds nothing to flush) and the socket.
        The child is reaped when its pidfd says it exited, never waited for."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._stop_child()
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    # -- internals -----------------------------------------------------------

    def _set_error(self, error: str) -> None:
        if error and error != self.error:
            self.error_since = time.time()
            log.error("echo_responder_failed", error=error, port=self.port,
                      consequence="peers see our paths silent; our own probing and "
                                  "failover go on")
        elif not error and self.error:
            log.info("echo_responder_recovered", port=self.port)
            self.error_since = None
        self.error = error

    def _bind_and_spawn(self) -> None:
        self._timer = None
        if self._closed:
            return
        if self._sock is None:
            try:
                self._sock = open_socket(self.port, self.listen, self.netns)
            except OSError as exc:
                self._set_error(f"echo responder cannot bind {self.listen}:{self.port}: "
                                f"{exc.strerror or exc}")
                self._timer = self._loop.call_later(RETRY_BIND_S, self._bind_and_spawn)
                return
        fd = self._sock.fileno()
        try:
            proc = subprocess.Popen(
                [self.python, "-m", "linkpassd.responder", "--fd", str(fd),
                 "--responder-id", str(self.responder_id)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(fd,), close_fds=True)
            pidfd = os.pidfd_open(proc.pid)
        except OSError as exc:
            self._set_error(f"echo responder process cannot start: {exc}")
            self._timer = self._loop.call_later(RETRY_BIND_S, self._bind_and_spawn)
            return
        self._proc, self._pidfd, self.pid = proc, pidfd, proc.pid
        self._started_at = time.monotonic()
        self._out = b""
        os.set_blocking(proc.stdin.fileno(), False)
        os.set_blocking(proc.stdout.fileno(), False)
        self._loop.add_reader(proc.stdout.fileno(), self._readable)
        self._loop.add_reader(pidfd, self._exited)
        self._unsent = b""
        self._send(self._policy_lines(), replace=True)
        self._set_error("")

    def _send(self, line: bytes, replace: bool) -> None:
        if replace:
            self._unsent = line  # only the newest policy (and clock) matters
        else:
            self._unsent += line
        self._flush()

    def _flush(self) -> None:
        proc = self._proc
        if proc is None:
            return
        fd = proc.stdin.fileno()
        while self._unsent:
            try:
                n = os.write(fd, self._unsent)
            except BlockingIOError:
                self._loop.add_writer(fd, self._flush)
                return
            except (BrokenPipeError, ConnectionResetError):
                return  # the child is gone: its pidfd tells us, and a new one gets the policy
            self._unsent = self._unsent[n:]
        self._loop.remove_writer(fd)

    def _readable(self) -> None:
        proc = self._proc
        if proc is None:
            return
        try:
            chunk = os.read(proc.stdout.fileno(), 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._loop.remove_reader(proc.stdout.fileno())
            return
        *lines, self._out = (self._out + chunk).split(b"\n")
        if len(self._out) > _MAX_LINE:
            self._out = b""
        for line in lines[-1:]:  # totals: the newest line says everything
            try:
                msg = json.loads(line)
                counters = msg["counters"]
                self._child = ResponderTally(**{k: int(counters.get(k, 0))
                                                for k in vars(ResponderTally())})
                if msg.get("sched") and msg["sched"] != self.sched:
                    self.sched = str(msg["sched"])
                    log.info("echo_responder_running", pid=proc.pid, scheduling=self.sched,
                             port=self.port)
            except (ValueError, TypeError, KeyError) as exc:
                log.warning("echo_responder_bad_status", error=repr(exc), line=line[:200])

    def _exited(self) -> None:
        proc, pidfd = self._proc, self._pidfd
        if proc is None or pidfd is None:
            return
        self._readable()  # its last totals
        self._forget_child()
        code = proc.poll()  # exited: the pidfd said so; this does not wait
        lived = time.monotonic() - self._started_at
        self._young_deaths = self._young_deaths + 1 if lived < YOUNG_S else 0
        delay = RESTART_S[min(max(0, self._young_deaths - 1), len(RESTART_S) - 1)]
        self.restarts += 1
        why = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exit status {code}")
        log.error("echo_responder_died", pid=proc.pid, why=why, lived_s=round(lived, 3),
                  restart_in_s=delay, port=self.port)
        if not self._closed:
            self._set_error(f"echo responder process died ({why}); restarting")
            self._timer = self._loop.call_later(delay, self._bind_and_spawn)

    def _forget_child(self) -> None:
        """The running child's pipes and pidfd off the loop; its counters kept."""
        proc, pidfd = self._proc, self._pidfd
        self._proc = self._pidfd = self.pid = None
        for k, v in vars(self._child).items():
            setattr(self._before, k, getattr(self._before, k) + v)
        self._child = ResponderTally()
        if proc is not None:
            self._loop.remove_reader(proc.stdout.fileno())
            self._loop.remove_writer(proc.stdin.fileno())
            proc.stdin.close()
            proc.stdout.close()
        if pidfd is not None:
            self._loop.remove_reader(pidfd)
            os.close(pidfd)

    def _stop_child(self) -> None:
        proc = self._proc
        if proc is None:
            return
        self._readable()
        self._forget_child()
        try:
            proc.kill()
        except ProcessLookupError:
            pass
        # Reaped when it has exited (a pidfd of our own), never waited for.
        try:
            reap_fd = os.pidfd_open(proc.pid)
        except OSError:  # already reaped elsewhere, or gone
            proc.poll()
            return
        self._reaping[reap_fd] = proc

        def reap() -> None:
            self._loop.remove_reader(reap_fd)
            os.close(reap_fd)
            self._reaping.pop(reap_fd).poll()

        try:
            self._loop.add_reader(reap_fd, reap)
        except RuntimeError:  # the loop is closing: reap now (it was SIGKILLed)
            os.close(reap_fd)
            self._reaping.pop(reap_fd)
            proc.poll()
