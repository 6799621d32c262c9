"""Path resolution the way rdma_cm does it for a hardware RoCE queue pair.

At connect a QP asks the kernel FIB for the route to the peer *without a
source address* (RTM_GETROUTE): that yields the egress interface, the gateway
(or on-link), and the preferred source address, which becomes the QP's source
GID. It then needs the next hop's MAC from the neighbour table, triggering
resolution if there is none. From then on the NIC sends with that port, MAC
and source: later route changes do not move it. ``resolve_path`` is that
one-shot resolution; the sender calls it again only when it reconnects.
"""

from __future__ import annotations

import errno
import socket
import time
from dataclasses import asdict, dataclass

from labs.traffic.addresses import is_lab_address

# Neighbour states that hold a usable MAC (NUD_REACHABLE|STALE|DELAY|PROBE|NOARP|PERMANENT).
NUD_USABLE = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80
IFF_UP = 0x1
IFF_LOWER_UP = 0x10000
RTN_UNICAST = 1
RTN_LOCAL = 2
SO_BINDTODEVICE = getattr(socket, "SO_BINDTODEVICE", 25)
DISCARD_PORT = 9  # the neighbour-resolution trigger goes here; nothing listens
NEIGH_POLL_S = 0.002


class ResolveError(Exception):
    """The path cannot be resolved now (no route, no carrier, no MAC yet)."""


class PathRefused(Exception):
    """A path the lab will not use (it leaves the lab, or is this host); never retried."""


@dataclass(frozen=True)
class Path:
    ifname: str
    ifindex: int
    src: str  # the route's preferred source: the QP's source address
    nexthop: str  # gateway, or the destination itself when on-link
    gateway: bool
    src_mac: str
    dst_mac: str

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_path(dst: str, *, neigh_timeout: float = 0.05) -> Path:
    """Resolve egress interface, source and next-hop MAC for ``dst`` now.

    Raises ResolveError if any step fails within ``neigh_timeout`` (the caller
    retries at its own pace) and PathRefused if the route leaves the lab or
    stays on this host.
    """
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    with IPRoute() as ipr:
        try:
            routes = list(ipr.route("get", dst=dst))
        except NetlinkError as e:
            raise ResolveError(
                f"no route to {dst}: {errno.errorcode.get(e.code, e.code)}"
            ) from None
        if not routes:
            raise ResolveError(f"no route to {dst}")
        r = routes[0]
        rtype, oif = r["type"], r.get("oif")
        prefsrc, gateway = r.get("prefsrc"), r.get("gateway")
        if rtype == RTN_LOCAL:
            # Frames written to lo are routed again on input without the output
            # path's dst, and the kernel drops a local source as martian: a
            # pinned path needs a real link.
            raise PathRefused(
                f"{dst} is an address of this host; qp-pinned needs a peer across a link"
            )
        if rtype != RTN_UNICAST or oif is None:
            raise ResolveError(f"route to {dst} is type {rtype}, not unicast")
        if prefsrc is None or not is_lab_address(prefsrc):
            raise PathRefused(f"route to {dst} uses source {prefsrc}, outside the lab")
        if gateway is not None and not is_lab_address(gateway):
            raise PathRefused(f"route to {dst} goes via {gateway}, outside the lab")
        links = list(ipr.link("get", index=oif))
        if not links:
            raise ResolveError(f"egress interface {oif} vanished")
        link = links[0]
        ifname, src_mac = link.get("ifname"), link.get("address") or "00:00:00:00:00:00"
        flags = link["flags"]
        if not (flags & IFF_UP and flags & IFF_LOWER_UP):
            raise ResolveError(f"{ifname} has no carrier")  # a port that is down cannot connect
        nexthop = gateway or dst
        mac = _usable_neighbour(ipr, nexthop, oif)
        if mac is None:
            _trigger_resolution(ifname, prefsrc, nexthop)
            deadline = time.monotonic() + neigh_timeout
            while mac is None and time.monotonic() < deadline:
                time.sleep(NEIGH_POLL_S)
                mac = _usable_neighbour(ipr, nexthop, oif)
        if mac is None:
            raise ResolveError(f"no MAC for next hop {nexthop} on {ifname}")
        return Path(ifname, oif, prefsrc, nexthop, gateway is not None, src_mac, mac)


def _usable_neighbour(ipr, addr: str, ifindex: int) -> str | None:
    for n in ipr.neigh("dump", ifindex=ifindex):
        if n.get("dst") == addr and n["state"] & NUD_USABLE and n.get("lladdr"):
            return n.get("lladdr")
    return None


def _trigger_resolution(ifname: str, src: str, nexthop: str) -> None:
    """Make the kernel ARP for ``nexthop`` on ``ifname``: send it one empty datagram.

    A kernel-originated ARP keeps the neighbour table the single source of
    truth, as it is for rdma_cm. The datagram goes to the discard port of a lab
    address on that link and is dropped there (at worst an ICMP unreachable).
    """
    if not is_lab_address(nexthop):
        raise PathRefused(f"next hop {nexthop} is outside the lab")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, ifname.encode())
            s.bind((src, 0))
            s.sendto(b"", (nexthop, DISCARD_PORT))
        except OSError:
            pass  # resolution is then simply not triggered; the caller times out and retries


class AckTracker:
    """The requester's ACK timer, as a pure state machine (time is passed in).

    IBA semantics, simplified for the lab: a timer runs while any packet is
    unacknowledged and restarts on every ACK that makes progress. Each expiry
    of ``ack_timeout`` is one retry (a real QP would retransmit; this one does
    not, loss is what the lab measures). After ``retry_count`` consecutive
    expiries the budget is spent: a real QP goes to the error state and the
    application reconnects; the lab sender reconnects at once. The budget is
    ``ack_timeout * retry_count``, like 4.096 us * 2^timeout * retry_cnt.
    """

    def __init__(self, ack_timeout: float, retry_count: int, first_psn: int):
        if ack_timeout <= 0 or retry_count < 1:
            raise ValueError("ack_timeout must be > 0 and retry_count >= 1")
        self.ack_timeout = ack_timeout
        self.retry_count = retry_count
        self.acked = first_psn - 1  # highest acknowledged, extended PSN
        self.high = first_psn - 1  # highest sent, extended PSN
        self.timer_start: float | None = None
        self.expiries = 0  # consecutive, since the last progress
        self.timeouts = 0  # all expiries in the run
        self.acks = 0
        self.stale_acks = 0
        self.last_ack_t: float | None = None
        self.last_acked: int | None = None  # extended PSN of the newest ACK that made progress

    @property
    def outstanding(self) -> int:
        return self.high - self.acked

    def sent(self, ext_psn: int, now: float) -> None:
        self.high = max(self.high, ext_psn)
        if self.timer_start is None:
            self.timer_start = now

    def ack(self, psn: int, now: float) -> bool:
        """Record an ACK carrying the 24-bit ``psn``; True if it made progress."""
        from labs.traffic.analysis import PSN_MOD

        self.acks += 1
        ext = self.high - ((self.high - psn) % PSN_MOD)  # the newest sent PSN it can mean
        if ext <= self.acked:
            self.stale_acks += 1
            return False
        self.acked = self.last_acked = ext
        self.last_ack_t = now
        self.expiries = 0
        self.timer_start = now if self.high > self.acked else None
        return True

    def exhausted(self, now: float) -> bool:
        """Advance the timer to ``now``; True once the retry budget is spent."""
        while self.timer_start is not None and now - self.timer_start >= self.ack_timeout:
            self.timeouts += 1
            self.expiries += 1
            self.timer_start += self.ack_timeout
            if self.expiries >= self.retry_count:
                return True
        return False

    def abandon(self) -> None:
        """On reconnect: outstanding packets are given up, the new QP starts clean."""
        self.acked = self.high
        self.timer_start = None
        self.expiries = 0
