"""The echo responder as its own small process: answers never wait on the daemon.

    python -m linkpassd.responder --fd N [--responder-id ID]

Started and supervised by linkpassd (adapters.responderproc), never by hand.
The daemon binds the responder's UDP socket itself (so a port taken by
another process, or a missing capability, is the daemon's error to report,
and a restarted responder finds its queue where the last one left it) and
hands it over as file descriptor N. Nothing here needs the daemon's event
loop or interpreter lock: a reply is late only by this process's own
scheduling, which is why it asks for SCHED_FIFO (lowest real-time priority)
and falls back to nice -10, then to nothing, saying which it got.

Pipes, one JSON object a line, neither side ever waiting on the other:
- stdin, from the daemon: {"policy": {...}} (core.admission.ResponderPolicy's
  fields), at start (no request is read before it) and on every reload; and
  {"clock": {...}} (core.oneway.ClockReading's fields, `read_at` on the
  monotonic clock, which the two processes share), the host's clock error
  bound for one-way delay, after each policy and whenever the daemon reads
  it again. End of file (the daemon is gone): exit at once, so a restarted
  daemon can bind the port again.
- stdout, to the daemon: {"counters": {...}, "sched": "...", "pid": N} at
  start and at most every `STATUS_S` while they change. Written without
  blocking; a full pipe (a daemon that is not reading) skips a line, and the
  next one carries the same totals.
Bad lines from the daemon are reported on stderr and ignored (the last good
policy stays), never fatal.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import select
import socket
import sys
import time
from dataclasses import asdict

from linkpassd.adapters.echoresponder import EchoResponder, batch_buffers
from linkpassd.core.admission import ResponderPolicy
from linkpassd.core.oneway import ClockReading

FIRST_POLICY_S = 10.0  # the daemon writes it as it starts us: waiting longer means it is stuck
STATUS_S = 0.1  # counters reach the daemon at most this often (and this late)
RT_PRIORITY = 1  # the lowest SCHED_FIFO priority: above every normal task, below the kernel's
NICE = -10


def policy_from_wire(fields: dict) -> ResponderPolicy:
    """The policy the daemon sent (ValueError/TypeError naming what is wrong)."""
    if not isinstance(fields, dict):
        raise ValueError(f"policy must be an object, not {type(fields).__name__}")
    local = fields.get("local_addresses")
    return ResponderPolicy.build(None if local is None else list(local),
                                 list(fields.get("fabric_prefixes", ())),
                                 list(fields.get("peers", ())),
                                 rate_pps=float(fields["rate_pps"]), burst=int(fields["burst"]),
                                 max_sources=int(fields["max_sources"]))


def policy_to_wire(policy: ResponderPolicy) -> dict:
    return {"local_addresses": (None if policy.local_addresses is None
                                else sorted(policy.local_addresses)),
            "fabric_prefixes": list(policy.fabric_prefixes), "peers": sorted(policy.peers),
            "rate_pps": policy.rate_pps, "burst": policy.burst, "max_sources": policy.max_sources}


def clock_to_wire(reading: ClockReading) -> dict:
    return {"source": reading.source, "bound_ns": reading.bound_ns, "reason": reading.reason,
            "read_at": reading.read_at, "drift_ppm": reading.drift_ppm}


def clock_from_wire(fields: dict) -> ClockReading:
    """The clock reading the daemon sent (ValueError/TypeError naming what is wrong)."""
    if not isinstance(fields, dict):
        raise ValueError(f"clock must be an object, not {type(fields).__name__}")
    bound, read_at = fields.get("bound_ns"), fields.get("read_at")
    if bound is not None and (not isinstance(bound, int) or bound < 0):
        raise ValueError(f"clock bound_ns must be a count of ns or null, not {bound!r}")
    return ClockReading(str(fields["source"]), bound, str(fields.get("reason", "")),
                        None if read_at is None else float(read_at),
                        float(fields.get("drift_ppm", 1.0)))


def raise_priority() -> str:
    """Run ahead of the host's normal tasks if we may; say how we run."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))
        return f"SCHED_FIFO {RT_PRIORITY}"
    except OSError as exc:
        fifo_error = exc.strerror or str(exc)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, NICE)
        return f"nice {NICE} (SCHED_FIFO refused: {fifo_error})"
    except OSError as exc:
        return f"normal (SCHED_FIFO refused: {fifo_error}; nice {NICE} refused: {exc.strerror})"


class Child:
    """The responder's main loop: the socket, the daemon's pipe, the status pipe."""

    def __init__(self, sock: socket.socket, responder_id: int | None):
        self.sock = sock
        self.responder = EchoResponder(policy=ResponderPolicy(), responder_id=responder_id)
        self.responder.sock = sock
        self.sched = raise_priority()
        self.policies = 0
        self.bad_lines = 0
        self._pending = b""  # a partial line from the daemon
        self._reported: dict | None = None
        self._reported_at = 0.0
        os.set_blocking(sys.stdout.fileno(), False)

    def run(self) -> int:
        fd, ctl = self.sock.fileno(), sys.stdin.fileno()
        os.set_blocking(ctl, False)
        if not self.first_policy(ctl):
            return 0
        received, replies = batch_buffers()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.register(ctl, select.POLLIN)
        self.report(force=True)
        while True:
            try:
                ready = poller.poll(int(STATUS_S * 1000))
            except InterruptedError:
                continue
            for which, _events in ready:
                if which == fd:
                    self.responder.serve_batch(fd, received, replies)
                elif not self.read_control(ctl):
                    return 0  # the daemon is gone
            self.report()

    def first_policy(self, ctl: int) -> bool:
        """Wait (at most `FIRST_POLICY_S`) for the daemon's policy before
        reading a request: requests queued meanwhile wait in the socket and
        are judged by it, never refused by the empty policy we start with.
        False: the daemon is gone or said nothing usable."""
        deadline = time.monotonic() + FIRST_POLICY_S
        poller = select.poll()
        poller.register(ctl, select.POLLIN)
        while self.policies == 0:
            left = deadline - time.monotonic()
            if left <= 0:
                print("linkpassd.responder: no policy from the daemon; exiting", file=sys.stderr,
                      flush=True)
                return False
            poller.poll(int(left * 1000) + 1)
            if not self.read_control(ctl):
                return False
        return True

    def read_control(self, ctl: int) -> bool:
        """The daemon's lines; False at end of file."""
        try:
            chunk = os.read(ctl, 65536)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        for line in lines:
            if line.strip():
                self.apply(line)
        return True

    def apply(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
            if isinstance(msg, dict) and "clock" in msg and "policy" not in msg:
                self.responder.set_clock(clock_from_wire(msg["clock"]))
                return
            policy = policy_from_wire(msg["policy"])
        except (ValueError, TypeError, KeyError) as exc:
            self.bad_lines += 1
            print(f"linkpassd.responder: ignored a bad line from the daemon ({exc!r}): "
                  f"{line[:200]!r}", file=sys.stderr, flush=True)
            return
        self.responder.set_policy(policy)
        self.policies += 1
        self.report(force=True)

    def report(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._reported_at < STATUS_S:
            return
        counters = asdict(self.responder.counters)
        if not force and counters == self._reported:
            return
        line = json.dumps({"counters": counters, "sched": self.sched, "pid": os.getpid(),
                           "policies": self.policies, "bad_lines": self.bad_lines}) + "\n"
        try:  # shorter than PIPE_BUF: all or nothing
            os.write(sys.stdout.fileno(), line.encode())
        except BlockingIOError:
            return  # the daemon is not reading: the next line has the same totals
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                return
            raise
        self._reported, self._reported_at = counters, now


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="linkpassd.responder", description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True,
                        help="the bound UDP socket, inherited from the daemon")
    parser.add_argument("--responder-id", type=int, default=None,
                        help="the id the replies carry (kept across restarts by the daemon)")
    args = parser.parse_args(argv)
    try:
        sock = socket.socket(fileno=args.fd)
    except OSError as exc:
        parser.error(f"--fd {args.fd}: not a socket ({exc.strerror})")
    if sock.type != socket.SOCK_DGRAM or sock.family != socket.AF_INET:
        parser.error(f"--fd {args.fd}: not an IPv4 UDP socket")
    sock.setblocking(False)
    return Child(sock, args.responder_id).run()


if __name__ == "__main__":
    sys.exit(main())
