"""Where a host's kernel sends a destination, watched from inside the host.

Mechanism-neutral: it asks the kernel the question a packet does
(``ip route get <dst> [from <src>]``, RTM_GETROUTE through pyroute2) rather
than reading any table, so FRR's routes in main, static rail tables and
linkpassd's rules to tables with nexthop ids or resilient groups all look
the same (for a group the kernel resolves one member; so do packets of a
flow). It re-asks after every netlink notification that can change the
answer (IPv4 routes, rules, nexthop objects, links: carrier loss changes no
route but can change the answer, with ignore_routes_with_linkdown) and once
every ``--poll-s`` as a safety net. One JSON object per line on stdout:

    {"event": "ready", "at": ..., "oif": "lph1-eth0", "gateway": "198.18.0.2", ...}
    {"event": "change", "at": ..., "resolved_at": ..., "oif": ..., "gateway": ...,
     "prev_oif": ..., "prev_gateway": ..., "cause": ["nexthop", "route"], ...}
    {"event": "stopped", "at": ..., "changes": N, "notifications": M}

``at`` is time.monotonic() when the notification batch that led to the new
answer was read (``cause`` ``poll``: when the poll ran), ``resolved_at`` when
the answer came back. CLOCK_MONOTONIC is one clock for every namespace, so
``at`` compares directly with a fault's inject() stamp; it is an upper bound
on when the kernel changed. A lookup that fails (unreachable) is an answer
too: ``oif`` and ``gateway`` null, ``error`` set. A change is a change of
(oif, gateway); ``table``/``prefsrc`` ride along.

    python -m labs.routewatch --dst 198.18.0.5 [--src 198.18.0.3] --duration 60

Runs at most ``--duration`` seconds and stops cleanly on SIGTERM or SIGINT.
From a test, ``RouteWatch.start(lab, "lph1", dst)`` runs it in a lab host.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labs.jsonlines import JsonLines

if TYPE_CHECKING:
    from labs.topos.lab import Lab

REPO = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 10.0
DEFAULT_POLL_S = 1.0

# rtnetlink groups: legacy bitmask for links, IPv4 routes and rules; nexthop
# objects only have a group number (32), joined with NETLINK_ADD_MEMBERSHIP.
RTMGRP_LINK, RTMGRP_IPV4_ROUTE, RTMGRP_IPV4_RULE = 0x1, 0x40, 0x80
RTNLGRP_NEXTHOP = 32
SOL_NETLINK, NETLINK_ADD_MEMBERSHIP = 270, 1
NLMSG_HDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
CAUSES = {16: "link", 17: "link", 24: "route", 25: "route", 32: "rule", 33: "rule",
          104: "nexthop", 105: "nexthop"}
RCVBUF = 4 << 20


# ---- inside the host ------------------------------------------------------------------


def _line(obj: dict) -> None:
    print(json.dumps(obj, sort_keys=True), flush=True)


def subscribe() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
    sock.bind((0, RTMGRP_LINK | RTMGRP_IPV4_ROUTE | RTMGRP_IPV4_RULE))
    sock.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, RTNLGRP_NEXTHOP)
    sock.setblocking(False)
    return sock


def drain(sock: socket.socket) -> set[str]:
    """Every pending notification, as the kinds they were; ``overflow`` if
    the kernel dropped some (then anything may have changed)."""
    causes: set[str] = set()
    while True:
        try:
            data = sock.recv(1 << 16)
        except BlockingIOError:
            return causes
        except OSError as exc:
            if exc.errno != errno.ENOBUFS:
                raise
            causes.add("overflow")
            continue
        offset = 0
        while offset + NLMSG_HDR.size <= len(data):
            length, kind, _, _, _ = NLMSG_HDR.unpack_from(data, offset)
            causes.add(CAUSES.get(kind, f"type{kind}"))
            offset += max(NLMSG_HDR.size, (length + 3) & ~3)


class Resolver:
    """``route get dst [from src]`` on its own netlink socket (pyroute2),
    with interface names looked up by index."""

    def __init__(self, dst: str, src: str | None):
        from pyroute2 import IPRoute

        self.dst, self.src = dst, src
        self.ipr = IPRoute()
        self._names: dict[int, str] = {}

    def name(self, index: int, refresh: bool = False) -> str:
        if refresh or index not in self._names:
            (link,) = self.ipr.link("get", index=index)
            self._names[index] = link.get("IFLA_IFNAME")
        return self._names[index]

    def resolve(self, refresh_names: bool = False) -> dict[str, Any]:
        from pyroute2.netlink.exceptions import NetlinkError

        query: dict[str, Any] = {"dst": self.dst}
        if self.src:
            query.update(src=self.src, src_len=32)  # `from`: an output lookup with this source
        try:
            (msg,) = self.ipr.route("get", **query)
        except NetlinkError as exc:
            return {"oif": None, "gateway": None, "table": None, "prefsrc": None,
                    "error": f"{errno.errorcode.get(exc.code, exc.code)}: {os.strerror(exc.code)}"}
        oif = msg.get("RTA_OIF")
        return {"oif": self.name(oif, refresh_names) if oif else None,
                "gateway": msg.get("RTA_GATEWAY"), "table": msg.get("RTA_TABLE"),
                "prefsrc": msg.get("RTA_PREFSRC"), "error": None}

    def close(self) -> None:
        self.ipr.close()


def watch(args: argparse.Namespace) -> int:
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    stopping: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stopping.append(signum))
    sock = subscribe()  # before the first answer: nothing can slip between them
    resolver = Resolver(args.dst, args.src)
    try:
        current = resolver.resolve()
        ready_at = time.monotonic()
        end = ready_at + args.duration
        _line({"event": "ready", "at": ready_at, "dst": args.dst, "src": args.src, **current})
        changes = notifications = 0
        next_poll = time.monotonic() + args.poll_s if args.poll_s > 0 else float("inf")
        while not stopping:
            now = time.monotonic()
            if now >= end:
                break
            ready, _, _ = select.select([sock, wake_r], [], [],
                                        max(0.0, min(end, next_poll) - now))
            at = time.monotonic()
            if wake_r in ready:
                os.read(wake_r, 64)
            if sock in ready:
                causes = drain(sock)
                notifications += 1
            elif at >= next_poll:
                causes = {"poll"}
            else:
                continue
            if at >= next_poll:
                next_poll = at + args.poll_s
            answer = resolver.resolve(refresh_names="link" in causes)
            if (answer["oif"], answer["gateway"]) != (current["oif"], current["gateway"]):
                changes += 1
                _line({"event": "change", "at": at, "resolved_at": time.monotonic(),
                       "cause": sorted(causes), "prev_oif": current["oif"],
                       "prev_gateway": current["gateway"], **answer})
            current = answer
        _line({"event": "stopped", "at": time.monotonic(), "changes": changes,
               "notifications": notifications,
               "reason": "signal" if stopping else "duration", **current})
    finally:
        resolver.close()
        sock.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="labs.routewatch", description=__doc__.splitlines()[0])
    parser.add_argument("--dst", required=True, help="destination address to resolve")
    parser.add_argument("--src", help="resolve as `route get DST from SRC` (a bound source)")
    parser.add_argument("--duration", type=float, required=True, metavar="S",
                        help="exit after this many seconds")
    parser.add_argument("--poll-s", type=float, default=DEFAULT_POLL_S, metavar="S",
                        help="also re-resolve this often (0: only on notifications)")
    args = parser.parse_args(argv)
    if args.duration <= 0:
        parser.error("--duration must be positive")
    try:
        return watch(args)
    except Exception as exc:  # noqa: BLE001 - reported as a line, then a failing exit
        _line({"event": "error", "at": time.monotonic(), "error": f"{type(exc).__name__}: {exc}"})
        return 1


# ---- from the test / lab side -----------------------------------------------------------


@dataclass(frozen=True)
class RouteChange:
    """One answer of the kernel: where ``dst`` went from ``at`` on."""

    at: float
    oif: str | None
    gateway: str | None
    cause: tuple[str, ...] = ()
    error: str | None = None

    @classmethod
    def of(cls, line: dict) -> RouteChange:
        return cls(line["at"], line.get("oif"), line.get("gateway"),
                   tuple(line.get("cause", ())), line.get("error"))


class RouteWatch:
    """labs.routewatch in a lab host: ``initial`` is the answer when it was
    ready, ``changes()`` every later one (the lab stops it by PID on teardown)."""

    def __init__(self, proc: subprocess.Popen, host: str, log_path: Path):
        self.proc = proc
        self.host = host
        self.log_path = log_path
        assert proc.stdout is not None
        self.lines = JsonLines(proc.stdout, f"routewatch in {host}", self.log)
        self.initial: RouteChange | None = None

    @classmethod
    def start(cls, lab: Lab, host: str, dst: str, *, src: str | None = None,
              duration_s: float = 120.0, poll_s: float = DEFAULT_POLL_S) -> RouteWatch:
        """Watch ``dst`` (``from src``) in ``host`` for at most ``duration_s``;
        returns once the watcher is subscribed and has its first answer."""
        plan = lab.host(host)
        argv = [sys.executable, "-m", "labs.routewatch", "--dst", dst,
                "--duration", f"{duration_s:g}", "--poll-s", f"{poll_s:g}"]
        if src:
            argv += ["--src", src]
        log_path = lab.host_dir(plan) / "routewatch.log"
        with open(log_path, "ab") as log:
            proc = lab.popen(plan, argv, stdout=subprocess.PIPE, stderr=log, cwd=str(REPO),
                             text=True, bufsize=1)
        watch = cls(proc, plan.name, log_path)
        watch.initial = RouteChange.of(watch.lines.wait(lambda e: e["event"] == "ready",
                                                        READY_TIMEOUT_S, "ready"))
        return watch

    def mark(self) -> int:
        """An index into the lines: later calls with ``after=mark`` see only
        what came after."""
        return self.lines.mark()

    def changes(self, after: int = 0) -> list[RouteChange]:
        return [RouteChange.of(e) for e in self.lines.select(lambda e: e["event"] == "change",
                                                             after)]

    def current(self) -> RouteChange | None:
        changes = self.changes()
        return changes[-1] if changes else self.initial

    def wait_change(self, pred, timeout: float, what: str, after: int = 0) -> RouteChange:
        """The first change from ``after`` on for which ``pred(change)`` holds."""
        return RouteChange.of(self.lines.wait(
            lambda e: e["event"] == "change" and pred(RouteChange.of(e)), timeout, what, after))

    def wait_oif(self, oif: str, timeout: float, after: int = 0) -> RouteChange:
        return self.wait_change(lambda c: c.oif == oif, timeout, f"route via {oif}", after)

    def first_off(self, oif: str, since: float) -> RouteChange | None:
        """The first change at or after monotonic ``since`` that leaves
        ``oif`` (the faulted rail's port): what a failover time is measured to."""
        return next((c for c in self.changes() if c.at >= since and c.oif != oif), None)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 5.0) -> dict | None:
        """SIGTERM by PID; the ``stopped`` line (None if it never came)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout)
        self.lines.join(timeout)
        return next(iter(self.lines.select(lambda e: e["event"] == "stopped")), None)

    def __repr__(self) -> str:
        return f"<RouteWatch {self.host} pid {self.proc.pid}>"


if __name__ == "__main__":
    sys.exit(main())
