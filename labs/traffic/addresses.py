"""The lab's address guard: traffic never leaves 198.18.0.0/15 or loopback."""

from __future__ import annotations

import ipaddress

LAB_NETWORKS = (
    ipaddress.ip_network("198.18.0.0/15"),
    ipaddress.ip_network("127.0.0.0/8"),
)


class AddressError(ValueError):
    """An address the lab must not use; the message is one line for the CLI."""


def is_lab_address(addr: str) -> bool:
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False
    return ip.version == 4 and any(ip in net for net in LAB_NETWORKS)


def lab_address(addr: str, what: str = "address") -> str:
    """Return ``addr`` normalised, or raise AddressError naming what it was for."""
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        raise AddressError(f"{what} {addr!r} is not an IPv4 address") from None
    if ip.version != 4:
        raise AddressError(f"{what} {addr} is not IPv4 (the lab traffic is RoCEv2 over IPv4)")
    if not any(ip in net for net in LAB_NETWORKS):
        raise AddressError(
            f"{what} {addr} is outside the lab ranges 198.18.0.0/15 and 127.0.0.0/8; refusing"
        )
    return str(ip)
