"""Throw-away network namespaces for tests that need the real kernel.

Everything created here carries the project prefix (namespaces ``lp-...``,
links ``lp...``), uses addresses from 198.18.0.0/15 only, and is deleted by
name: a test never touches a namespace or link it did not create.  ``ip`` is
used to build the fixture and as an independent witness of kernel state; the
code under test talks netlink through pyroute2.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pyroute2 import AsyncIPRoute

from linkpassd.ctl.nccl import pid_alive

PREFIX = "lp-"
IP_TIMEOUT_S = 10
_serial = itertools.count()
_OWN_NAME = re.compile(rf"^{PREFIX}[a-z]+(\d+)-\d+$")  # unique_name's: lp-<tag><pid>-<n>
_reaped = False  # stale namespaces looked for once per process

T = TypeVar("T")


def unique_name(tag: str = "t") -> str:
    """``lp-<tag><pid>-<n>``: unique across concurrent test processes."""
    return f"{PREFIX}{tag}{os.getpid()}-{next(_serial)}"


def stale_names(names: list[str], alive: Callable[[int], bool]) -> list[str]:
    """Of `names`, those unique_name() made in a process that is gone: a test
    run stopped by SIGKILL (or a SIGTERM before tests/conftest.py turned it
    into an interrupt) never ran its fixtures' teardown. A name whose process
    still lives (another test run, or a reused pid) is never touched."""
    return [n for n in names if (m := _OWN_NAME.match(n)) and not alive(int(m.group(1)))]


def reap_stale_namespaces() -> list[str]:
    """Delete, by name, the namespaces stale_names() finds; the names deleted."""
    listed = run_ip("netns", "list", check=False).stdout.split("\n")
    gone = stale_names([line.split()[0] for line in listed if line.strip()],
                       lambda pid: pid_alive(pid) is not False)  # unknown: alive
    for name in gone:
        run_ip("netns", "delete", name, check=False)
    return gone


def run_ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ip", *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=IP_TIMEOUT_S,
    )


@dataclass
class Netns:
    name: str

    def ip(self, *args: str, check: bool = True) -> str:
        """Run ``ip -n <ns> ...``; raise with ip's stderr on failure."""
        proc = run_ip("-n", self.name, *args, check=False)
        if check and proc.returncode != 0:
            raise RuntimeError(f"ip -n {self.name} {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def ipj(self, *args: str) -> Any:
        """``ip -j -n <ns> ...`` parsed; [] when ip prints nothing."""
        out = self.ip("-j", *args)
        return json.loads(out) if out.strip() else []

    def nft(self, script: str) -> None:
        """Apply an nftables script in the namespace; raise with nft's stderr."""
        proc = subprocess.run(["ip", "netns", "exec", self.name, "nft", "-f", "-"], input=script,
                              text=True, capture_output=True, timeout=10)
        if proc.returncode != 0:
            raise RuntimeError(f"nft in {self.name}: {proc.stderr.strip()}\n{script}")

    def route_nhid(self, table: int, dst: str = "default") -> int | None:
        """The nexthop id of the route to `dst` in `table`, or None."""
        return next((r.get("nhid") for r in self.ipj("route", "show", "table", str(table))
                     if r["dst"] == dst), None)

    def iproute(self) -> AsyncIPRoute:
        """An AsyncIPRoute whose socket lives in this namespace.  flags=0:
        open the namespace, never create it (pyroute2 defaults to O_CREAT)."""
        return AsyncIPRoute(netns=self.name, flags=0)

    def sysctl(self, key: str) -> str:
        proc = subprocess.run(
            ["ip", "netns", "exec", self.name, "sysctl", "-n", key],
            capture_output=True,
            text=True,
            check=True,
            timeout=IP_TIMEOUT_S,
        )
        return proc.stdout.strip()

    def has_carrier(self, ifname: str) -> bool:
        (link,) = self.ipj("link", "show", "dev", ifname)
        return "LOWER_UP" in link["flags"]


class NetnsFactory:
    """Creates namespaces and remembers them, so teardown deletes exactly
    those (never ``ip -all netns delete``)."""

    def __init__(self) -> None:
        global _reaped
        self.created: list[str] = []
        if not _reaped:  # what an earlier, killed run left behind
            _reaped = True
            reap_stale_namespaces()

    def __call__(self, tag: str = "t") -> Netns:
        name = unique_name(tag)
        run_ip("netns", "add", name)
        self.created.append(name)
        ns = Netns(name)
        ns.ip("link", "set", "lo", "up")
        return ns

    def cleanup(self) -> list[str]:
        """Delete every namespace created here (links inside go with it).
        Returns the error messages, after trying all of them."""
        errors = []
        while self.created:
            name = self.created.pop()
            proc = run_ip("netns", "delete", name, check=False)
            if proc.returncode != 0:
                errors.append(f"{name}: {proc.stderr.strip()}")
        return errors


@dataclass
class Rail:
    index: int
    port: str  # host side
    peer: str  # leaf side
    address: str  # host address
    gateway: str  # leaf address
    prefixlen: int = 24


@dataclass
class HostLab:
    """A host namespace with N rails, each a veth to a leaf namespace.

    rail i: host ``lprail<i>`` 198.18.<i>.2/24  <->  leaf ``lpleaf<i>``
    198.18.<i>.1/24.  Setting ``lpleaf<i>`` down drops carrier on the host
    port, the lab's stand-in for a cable pull.
    """

    host: Netns
    leaf: Netns
    rails: list[Rail] = field(default_factory=list)

    @classmethod
    def build(cls, factory: NetnsFactory, n_rails: int = 2) -> "HostLab":
        lab = cls(host=factory("h"), leaf=factory("l"))
        for i in range(n_rails):
            rail = Rail(
                index=i,
                port=f"lprail{i}",
                peer=f"lpleaf{i}",
                address=f"198.18.{i}.2",
                gateway=f"198.18.{i}.1",
            )
            lab.host.ip(
                "link", "add", rail.port, "type", "veth",
                "peer", "name", rail.peer, "netns", lab.leaf.name,
            )
            lab.host.ip("addr", "add", f"{rail.address}/24", "dev", rail.port)
            lab.leaf.ip("addr", "add", f"{rail.gateway}/24", "dev", rail.peer)
            lab.host.ip("link", "set", rail.port, "up")
            lab.leaf.ip("link", "set", rail.peer, "up")
            lab.rails.append(rail)
        for rail in lab.rails:
            wait_for_sync(lambda r=rail: lab.host.has_carrier(r.port), 3.0, f"carrier on {rail.port}")
        return lab

    def cut(self, rail: Rail) -> None:
        self.leaf.ip("link", "set", rail.peer, "down")

    def restore(self, rail: Rail) -> None:
        self.leaf.ip("link", "set", rail.peer, "up")


def wait_for_sync(pred: Callable[[], T], timeout: float, what: str) -> T:
    """Poll a cheap predicate for at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


async def wait_for(pred: Callable[[], Awaitable[T]], timeout: float, what: str) -> T:
    """Async twin of wait_for_sync."""
    deadline = time.monotonic() + timeout
    while True:
        value = await pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


def run(coro: Awaitable[T], timeout: float = 30.0) -> T:
    """Run one test scenario on a fresh event loop, bounded in time."""

    async def bounded():
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())
