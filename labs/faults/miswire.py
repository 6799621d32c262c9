"""Two of a host's cables swapped at the leaves.

A swap moves the leaf-side veth ends between the two leaf namespaces. Each
moved end then becomes the *leaf's* port it replaced (same name, MAC,
address, routes), because a switch port's config stays with the switch when
someone re-patches the cable. So afterwards the host's rail-a port is patched
into leaf b's port: carrier is up on both sides, but the /31s no longer match
(ARP for the host's configured gateway goes unanswered) - a gray failure that
only probes or LLDP-like checks see. ``verify()`` is that check: it asks, on
each host port, which MAC answers for the *other* rail's leaf address.
"""

from __future__ import annotations

import re
import time

from labs.faults.base import Fault
from labs.faults.link import CablePull, Flap
from labs.faults.nft import NftFault
from labs.topos.lab import Lab
from labs.topos.plan import HostPlan, LabError

CARRIER_WAIT_S = 5.0


class Miswire(Fault):
    kind = "miswire"

    def __init__(self, lab: Lab, host: str | int | HostPlan, rail_a: int | str, rail_b: int | str):
        super().__init__(lab, host, rail_a)
        self.rail_b = self.host.rail(rail_b)
        if self.rail_b.index == self.rail.index:
            raise LabError(f"miswire needs two different rails, got {rail_a!r} twice")

    @property
    def description(self) -> str:
        return (f"{self.kind} on {self.host.name}: {self.rail.port} <-> {self.rail_b.leaf_port}, "
                f"{self.rail_b.port} <-> {self.rail.leaf_port}")

    def _inject(self) -> float:
        ports = {self.rail.leaf_port, self.rail_b.leaf_port}
        for other in self.lab._faults:
            if other is not self and other.active and other.host is not None and \
                    other.host.name == self.host.name and \
                    isinstance(other, (NftFault, CablePull, Flap, Miswire)) and \
                    {other.rail.leaf_port, getattr(other, "rail_b", other.rail).leaf_port} & ports:
                raise LabError(f"{self.description}: clear {other} first "
                               f"(moving a port drops the rules and state bound to it)")
        return self._swap()

    def _clear(self) -> float:
        return self._swap()

    def _swap(self) -> float:
        """Exchange the two leaf ends; doing it twice restores the lab exactly."""
        lab, a, b = self.lab, self.rail, self.rail_b
        stamp = lab.set_link(a.leaf, a.leaf_port, up=False)
        lab.set_link(b.leaf, b.leaf_port, up=False)
        lab.run(a.leaf, ["ip", "link", "set", "dev", a.leaf_port, "netns", str(lab.pid(b.leaf))])
        lab.run(b.leaf, ["ip", "link", "set", "dev", b.leaf_port, "netns", str(lab.pid(a.leaf))])
        # The end now in leaf b takes the identity of leaf b's port, and vice versa.
        lab.run(b.leaf, ["ip", "link", "set", "dev", a.leaf_port, "name", b.leaf_port,
                         "address", b.leaf_mac])
        lab.run(a.leaf, ["ip", "link", "set", "dev", b.leaf_port, "name", a.leaf_port,
                         "address", a.leaf_mac])
        for leaf, port in ((a.leaf, a.leaf_port), (b.leaf, b.leaf_port)):
            lab.set_link(leaf, port, up=True)  # up first: routes need the connected /31
            self._reapply(leaf, port)
        self._wait_carrier()
        return stamp

    def _reapply(self, leaf: str, port: str) -> None:
        """The port's lines of the leaf's plan: sysctls, address, routes via it
        (a netns move flushes them all)."""
        setup = self.lab.plan.setup(leaf, self.lab.mechanism)
        sysctls = [f"{k}={v}" for k, v in setup.sysctls.items() if f".{port}." in k]
        if sysctls:
            self.lab.run(leaf, ["sysctl", "-q", "-w", *sysctls])
        lines = [line for line in setup.ip_batch if re.search(rf"\bdev {re.escape(port)}\b", line)]
        if lines:
            self.lab.run(leaf, ["ip", "-batch", "-"], input="\n".join(lines) + "\n")

    def _wait_carrier(self) -> None:
        deadline = time.monotonic() + CARRIER_WAIT_S
        for rail in (self.rail, self.rail_b):
            while not self.lab.carrier(self.host.name, rail.port):
                if time.monotonic() > deadline:
                    raise LabError(f"{self.description}: {rail.port} has no carrier after the swap")
                time.sleep(0.02)

    def observed(self, timeout_s: float = 0.3) -> dict[str, dict[str, str | None]]:
        """For each of the two host ports: which MAC answers ARP for each
        rail's leaf address (None: nobody)."""
        out: dict[str, dict[str, str | None]] = {}
        for port in (self.rail, self.rail_b):
            out[port.port] = {gw: self.lab.who_has(self.host.name, port.port, gw, timeout_s)
                              for gw in (self.rail.gateway, self.rail_b.gateway)}
        return out

    def verify(self) -> dict[str, dict[str, str | None]]:
        """Raise unless each host port now reaches the *other* leaf's MAC and
        not its own leaf's; return what was seen."""
        seen = self.observed()
        a, b = self.rail, self.rail_b
        want = {a.port: {b.gateway: b.leaf_mac, a.gateway: None},
                b.port: {a.gateway: a.leaf_mac, b.gateway: None}}
        if seen != want:
            raise LabError(f"{self.description}: expected {want}, saw {seen}")
        return seen
