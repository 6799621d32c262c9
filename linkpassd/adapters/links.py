"""Link sensing over rtnetlink: carrier, operstate and carrier up/down counts.

The monitor subscribes to link events *before* dumping, so nothing falls into
the gap between the two. If the kernel reports ENOBUFS (our receive buffer
overflowed and events were lost) the socket cannot be trusted any more: it is
closed, a new one is bound, and everything is re-read and reported as a fresh
snapshot, never patched up from a partial event stream.
"""

from __future__ import annotations

import asyncio
import errno
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable

import structlog
from pyroute2 import AsyncIPRoute
from pyroute2.netlink.rtnl import RTMGRP_LINK

from linkpassd.core.model import LinkSample

IFF_UP = 0x1
IFF_LOWER_UP = 0x10000

log = structlog.get_logger("linkpassd.links")


@dataclass(frozen=True)
class LinkSnapshot:
    """A full re-read of every watched port (at start and after ENOBUFS)."""

    samples: dict[str, LinkSample]
    reason: str


@dataclass(frozen=True)
class LinkEvent:
    sample: LinkSample


def sample_from_ifinfmsg(msg) -> LinkSample:
    """Normalise an RTM_NEWLINK/RTM_DELLINK message into a LinkSample."""
    name = msg.get("ifname") or msg.get("IFLA_IFNAME") or ""
    if msg.get("event") == "RTM_DELLINK":
        return LinkSample.missing(name)
    flags = msg.get("flags") or 0
    carrier_attr = msg.get("IFLA_CARRIER")
    carrier = bool(flags & IFF_LOWER_UP) if carrier_attr is None else bool(carrier_attr)
    return LinkSample(
        port=name,
        present=True,
        ifindex=int(msg.get("index") or 0),
        admin_up=bool(flags & IFF_UP),
        carrier=carrier and bool(flags & IFF_UP),
        operstate=str(msg.get("IFLA_OPERSTATE") or "UNKNOWN"),
        carrier_up_count=int(msg.get("IFLA_CARRIER_UP_COUNT") or 0),
        carrier_down_count=int(msg.get("IFLA_CARRIER_DOWN_COUNT") or 0),
    )


def _is_enobufs(exc: BaseException) -> bool:
    code = getattr(exc, "code", None) or getattr(exc, "errno", None)
    return code == errno.ENOBUFS


class LinkMonitor:
    """Feeds LinkSnapshot and LinkEvent values for the watched ports to `emit`."""

    def __init__(self, ports: Iterable[str], emit: Callable[[object], Awaitable[None]],
                 rcvbuf: int = 4 * 1024 * 1024, netns: str | None = None):
        self.ports = set(ports)
        self.emit = emit
        self.rcvbuf = rcvbuf
        self.netns = netns
        self.resyncs = 0  # full re-reads after lost events
        # Watched port -> the ifindex it had when last seen present: a rename
        # comes as an RTM_NEWLINK of that ifindex under its new name only.
        self.index_of: dict[str, int] = {}

    def watch(self, ports: Iterable[str]) -> None:
        """Change the watched ports (config reload); the next snapshot covers them."""
        self.ports = set(ports)

    async def _open(self) -> AsyncIPRoute:
        ipr = AsyncIPRoute(rcvbuf=self.rcvbuf, netns=self.netns)
        await ipr.bind(groups=RTMGRP_LINK)
        return ipr

    async def snapshot(self, ipr: AsyncIPRoute, reason: str) -> LinkSnapshot:
        seen = {}
        async for msg in await ipr.get_links():
            sample = sample_from_ifinfmsg(msg)
            if sample.port in self.ports:
                seen[sample.port] = sample
        samples = {p: seen.get(p, LinkSample.missing(p)) for p in self.ports}
        self.index_of = {p: s.ifindex for p, s in samples.items() if s.present and s.ifindex}
        return LinkSnapshot(samples=samples, reason=reason)

    def samples_of(self, msg) -> list[LinkSample]:
        """The watched ports an RTM_NEWLINK/RTM_DELLINK message tells about:
        its own (when watched), and a watched port renamed away (its ifindex
        now carries another name: from the port's side it is gone)."""
        sample = sample_from_ifinfmsg(msg)
        index = int(msg.get("index") or 0)
        out = []
        for port, known in list(self.index_of.items()):
            if index and known == index and port != sample.port:
                del self.index_of[port]
                out.append(LinkSample.missing(port))
        if sample.port in self.ports:
            if sample.present and index:
                self.index_of[sample.port] = index
            else:
                self.index_of.pop(sample.port, None)
            out.append(sample)
        return out

    async def run(self) -> None:
        reason = "start"
        while True:
            ipr = await self._open()
            try:
                await self.emit(await self.snapshot(ipr, reason))
                while True:  # get() returns after each datagram's messages
                    async for msg in ipr.get():
                        if msg.get("event") not in ("RTM_NEWLINK", "RTM_DELLINK"):
                            continue
                        for sample in self.samples_of(msg):
                            await self.emit(LinkEvent(sample))
            except Exception as exc:  # only ENOBUFS is recoverable here
                if not _is_enobufs(exc):
                    raise
                self.resyncs += 1
                reason = "enobufs"
                log.warning("netlink_overrun", action="full re-read", resyncs=self.resyncs)
            finally:
                ipr.close()
            await asyncio.sleep(0)
