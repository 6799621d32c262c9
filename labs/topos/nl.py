"""Sockets inside a lab node's namespace: link up/down/group, ARP who-has.

Faults stamp ``injected_at`` immediately before the request that causes them.
Spawning ``ip`` through ``mnexec`` costs milliseconds of fork/exec/setns
between stamp and effect; a netlink socket opened once in the node's
namespace brings that to tens of microseconds, which matters when the thing
being measured is a failover of a few milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading
import time

CLONE_NEWNET = 0x40000000
NETLINK_ROUTE = 0
RTM_NEWLINK = 16
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLMSG_ERROR = 2
IFF_UP = 0x1
IFLA_IFNAME = 3
IFLA_GROUP = 27

_libc = ctypes.CDLL(None, use_errno=True)


def socket_in_netns(pid: int, family: int = socket.AF_NETLINK,
                    kind: int = socket.SOCK_RAW, proto: int = NETLINK_ROUTE) -> socket.socket:
    """A socket created in the netns of ``pid`` (a socket keeps the namespace
    it was made in). setns() on a throw-away thread: the namespace is per
    thread, so this process's other threads never change namespace."""
    result: dict[str, object] = {}

    def work() -> None:
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into pid {pid}: {os.strerror(err)}")
            finally:
                os.close(fd)
            result["sock"] = socket.socket(family, kind | socket.SOCK_CLOEXEC, proto)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=work, name=f"lab-netns-{pid}")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return result["sock"]  # type: ignore[return-value]


def _attr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


class LinkSetter:
    """One netlink socket per lab node; thread-safe. Close it before the
    node stops: an open socket keeps the namespace (and its veths) alive."""

    def __init__(self, pid: int, node: str):
        self.node = node
        self._sock: socket.socket | None = socket_in_netns(pid)
        self._sock.bind((0, 0))
        self._sock.settimeout(5.0)
        self._lock = threading.Lock()
        self._seq = 0

    def set(self, ifname: str, up: bool | None = None, group: int | None = None) -> float:
        """Set ``ifname`` up/down and/or its interface group, in one request;
        return time.monotonic() taken right before it went to the kernel.
        Raises OSError with the kernel's error."""
        return self.set_timed(ifname, up=up, group=group)[0]

    def set_timed(self, ifname: str, up: bool | None = None,
                  group: int | None = None) -> tuple[float, float]:
        """As set(), returning (sent, acked): time.monotonic() right before
        the request and right after the kernel's acknowledgement. The kernel
        applies RTM_NEWLINK before it acknowledges, so the change took effect
        between the two."""
        name = ifname.encode() + b"\0"
        attrs = _attr(IFLA_IFNAME, name)
        if group is not None:
            attrs += _attr(IFLA_GROUP, struct.pack("=I", group))
        flags = IFF_UP if up else 0
        change = IFF_UP if up is not None else 0
        body = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, 0, flags, change) + attrs
        what = ", ".join(x for x in ("" if up is None else ("up" if up else "down"),
                                     "" if group is None else f"group {group}") if x)
        msg = struct.pack("=IHHII", 16 + len(body), RTM_NEWLINK,
                          NLM_F_REQUEST | NLM_F_ACK, 0, 0) + body
        return self.request(msg, f"set {ifname} {what}")

    def request(self, message: bytes, what: str) -> tuple[float, float]:
        """Send one complete rtnetlink request (encoded ahead, e.g. by
        pyroute2's IPBatch) with a fresh sequence number and the ACK flag, and
        wait for the kernel's acknowledgement: (sent, acked) as in set_timed().
        Raises OSError with the kernel's error, naming ``what``."""
        length, kind, flags = struct.unpack_from("=IHH", message)
        with self._lock:
            if self._sock is None:
                raise RuntimeError(f"{self.node}: link setter closed")
            self._seq += 1
            msg = struct.pack("=IHHII", length, kind, flags | NLM_F_REQUEST | NLM_F_ACK,
                              self._seq, 0) + message[16:]
            stamp = time.monotonic()
            self._sock.send(msg)
            while True:
                data = self._sock.recv(65536)
                _length, kind, _flags, seq, _pid = struct.unpack_from("=IHHII", data)
                if kind == NLMSG_ERROR and seq == self._seq:
                    acked = time.monotonic()
                    (code,) = struct.unpack_from("=i", data, 16)
                    if code:
                        raise OSError(-code, f"{self.node}: {what}: {os.strerror(-code)}")
                    return stamp, acked

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None



ETH_P_ARP = 0x0806


def arp_who_has(pid: int, ifname: str, target_ip: str, timeout_s: float = 1.0) -> str | None:
    """Which MAC answers ARP for ``target_ip`` on ``ifname`` of the node with
    ``pid``: the lab's stand-in for LLDP ("what is at the other end of this
    cable"). Sent as an RFC 5227 probe (sender IP 0.0.0.0), so the answering
    side learns no neighbour entry and the probe changes nothing it observes."""
    sock = socket_in_netns(pid, socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ARP))
    try:
        sock.bind((ifname, ETH_P_ARP))
        own = sock.getsockname()[4]
        tpa = socket.inet_aton(target_ip)
        frame = (b"\xff" * 6 + own + struct.pack("!H", ETH_P_ARP)
                 + struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + own + bytes(4) + bytes(6) + tpa)
        deadline = time.monotonic() + timeout_s
        sock.send(frame)
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                data = sock.recv(2048)
            except socket.timeout:
                break
            if len(data) >= 42 and struct.unpack_from("!H", data, 20)[0] == 2 \
                    and data[28:32] == tpa:
                return ":".join(f"{b:02x}" for b in data[22:28])
        return None
    finally:
        sock.close()
