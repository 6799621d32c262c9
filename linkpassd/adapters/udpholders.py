"""Who else holds a UDP port on this host: the echo responder's port (4793)
bound first by another process, read from /proc/net/udp and udp6.

Any local user may bind an unprivileged UDP port. One that binds the echo
port before linkpassd receives its peers' probes (linkpassd's own bind then
fails and is retried), and nothing said so. `foreign(port)` lists the
sockets on the port that are not this process's, with their owner's uid, so
linkpassd logs it at start and shows it in `status`.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

PROC_FILES = (("/proc/net/udp", 4), ("/proc/net/udp6", 6))


@dataclass(frozen=True)
class Holder:
    address: str
    port: int
    uid: int
    inode: int

    def describe(self) -> str:
        return f"{self.address}:{self.port} (uid {self.uid}, socket inode {self.inode})"


def _address(hex_addr: str, family: int) -> str:
    raw = bytes.fromhex(hex_addr)
    # /proc prints each 32-bit word in host (little-endian) order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.IPv4Address(words) if family == 4 else ipaddress.IPv6Address(words))


def holders(port: int, text_by_family: dict[int, str] | None = None) -> list[Holder]:
    """Every UDP socket bound to `port` (parsed from /proc, or from the given
    texts in tests)."""
    out = []
    for path, family in PROC_FILES:
        if text_by_family is not None:
            text = text_by_family.get(family, "")
        else:
            try:
                with open(path) as f:
                    text = f.read()
            except OSError:
                continue
        for line in text.splitlines()[1:]:
            parts = line.split()
            if len(parts) < 10:
                continue
            addr, _, hex_port = parts[1].partition(":")
            try:
                if int(hex_port, 16) != port:
                    continue
                out.append(Holder(_address(addr, family), port, int(parts[7]), int(parts[9])))
            except ValueError:
                continue
    return out


def own_socket_inodes() -> set[int]:
    inodes = set()
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def foreign(port: int) -> list[Holder]:
    """The sockets on UDP `port` that are not this process's."""
    found = holders(port)
    if not found:
        return []
    mine = own_socket_inodes()
    return [h for h in found if h.inode not in mine]
