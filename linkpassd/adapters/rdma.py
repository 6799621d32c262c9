"""Which RDMA device and port sits behind a netdev, read from sysfs.

health.json names, per rail port, the RDMA device a launcher must put in
NCCL_IB_HCA (`mlx5_3:1`), because NCCL selects RDMA devices by their verbs
names while linkpass judges netdevs.  The kernel states the link in two places:

- `/sys/class/infiniband/<dev>/ports/<n>/gid_attrs/ndevs/<i>`: for a RoCE port,
  the netdev each GID entry belongs to.  This is the authoritative one: it is
  per port, so it tells the two ports of a dual-port NIC apart, and it follows
  bonds (mlx5_bond_0) and other upper devices.
- `/sys/class/net/<netdev>/device/infiniband/<dev>`: the RDMA device of the
  netdev's PCI function (also IPoIB netdevs, which have no GID ndevs).  The
  port is then the device's only port, or `dev_port + 1` when it has several.

sysfs varies by driver and kernel, and an unset GID entry reads as EINVAL:
every odd or missing file is skipped, never raised.  A netdev with no RDMA
device (veth in the labs, a plain Ethernet NIC) is simply absent from the
answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

__all__ = ["rdma_ports"]

_MAX_READ = 256  # a sysfs attribute here is a name or a number


def rdma_ports(netdevs: Iterable[str], sysfs: str = "/sys") -> dict[str, tuple[str, int]]:
    """netdev -> (RDMA device, port number) for those of `netdevs` that have one.

    When a netdev is named by several ports' GID tables (unusual: a bond's
    members are named through the bond), the first in (device, port) order
    wins, so the answer is the same on every call.
    """
    wanted = set(netdevs)
    root = Path(sysfs)
    found: dict[str, tuple[str, int]] = {}
    for device, port_number, port_dir in _ib_ports(root):
        for netdev in _gid_netdevs(port_dir):
            if netdev in wanted and netdev not in found:
                found[netdev] = (device, port_number)
    for netdev in sorted(wanted - found.keys()):
        by_pci = _by_pci_function(root, netdev)
        if by_pci is not None:
            found[netdev] = by_pci
    return found


def _ib_ports(root: Path) -> list[tuple[str, int, Path]]:
    """(device, port number, port directory) of every RDMA port, sorted."""
    out = []
    for device_dir in _children(root / "class" / "infiniband"):
        for port_dir in _children(device_dir / "ports"):
            number = _port_number(port_dir.name)
            if number is not None:
                out.append((device_dir.name, number, port_dir))
    return sorted(out, key=lambda item: (_natural(item[0]), item[1]))


def _gid_netdevs(port_dir: Path) -> set[str]:
    names = set()
    for entry in _children(port_dir / "gid_attrs" / "ndevs"):
        name = _read(entry)
        if name:
            names.add(name)
    return names


def _by_pci_function(root: Path, netdev: str) -> tuple[str, int] | None:
    if not _safe_name(netdev):
        return None
    net_dir = root / "class" / "net" / netdev
    devices = _children(net_dir / "device" / "infiniband")
    if len(devices) != 1:
        return None  # none, or ambiguous: leave it out rather than guess
    device = devices[0].name
    ports = sorted(n for n in (_port_number(p.name)
                               for p in _children(root / "class" / "infiniband" / device / "ports"))
                   if n is not None)
    if len(ports) == 1:
        return (device, ports[0])
    dev_port = _read(net_dir / "dev_port")
    if dev_port is not None and dev_port.isdigit() and int(dev_port) + 1 in ports:
        return (device, int(dev_port) + 1)
    return None


def _children(path: Path) -> list[Path]:
    try:
        return sorted(path.iterdir(), key=lambda p: _natural(p.name))
    except OSError:
        return []


def _read(path: Path) -> str | None:
    """The attribute's text stripped, None when it cannot be read (missing,
    EINVAL for an unset GID entry, a directory, not text)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(_MAX_READ)
        return data.decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _port_number(name: str) -> int | None:
    return int(name) if name.isdigit() and 0 < int(name) < 256 else None


def _safe_name(netdev: str) -> bool:
    """A netdev name cannot hold '/' and is not '.' or '..' (so it cannot
    walk out of /sys/class/net)."""
    return bool(netdev) and "/" not in netdev and netdev not in (".", "..") and "\0" not in netdev


def _natural(name: str) -> tuple:
    """mlx5_2 before mlx5_10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))
