"""Socket plumbing shared by sender and receiver."""

from __future__ import annotations

import socket

IP_MTU_DISCOVER = getattr(socket, "IP_MTU_DISCOVER", 10)
IP_PMTUDISC_DO = getattr(socket, "IP_PMTUDISC_DO", 2)
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
RCVBUF_BYTES = 4 << 20


def udp_socket_df(bind: tuple[str, int] | None = None) -> socket.socket:
    """A UDP socket whose datagrams leave with DF set and, unconnected, IP ID 0.

    Linux gives an unconnected socket's DF datagrams ID 0. The ICRC covers the
    IP ID, so the sender must know it in advance: forcing DF (PMTUDISC_DO)
    makes the kernel's header predictable.
    """
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        if bind is not None:
            s.bind(bind)
    except BaseException:
        s.close()
        raise
    return s


def port_holder(bind: tuple[str, int]) -> socket.socket:
    """A non-blocking UDP socket that only holds the RoCE port; its owner discards what it reads.

    Holding the port stops the kernel answering every packet with ICMP
    port-unreachable, while the measuring happens on a raw socket that sees
    the whole IP header (which the ICRC covers). Reading and discarding,
    rather than a drop-all socket filter, keeps the namespace's UdpInErrors
    counter meaning what it says.
    """
    s = udp_socket_df(bind)
    s.setblocking(False)
    return s


def raw_udp_socket(bind_addr: str | None = None) -> socket.socket:
    """Raw IPv4 socket receiving every UDP datagram (to ``bind_addr`` if given)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
    try:
        try:
            s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF_BYTES)
        except OSError:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
        if bind_addr is not None:
            s.bind((bind_addr, 0))
        s.setblocking(False)
    except BaseException:
        s.close()
        raise
    return s


def drain(s: socket.socket, limit: int = 256):
    """Yield up to ``limit`` datagrams already queued, without blocking."""
    for _ in range(limit):
        try:
            yield s.recv(65535)
        except (BlockingIOError, InterruptedError):
            return
