"""A pause without loss: the leaf holds every frame towards the host, as a
PFC-paused switch port does, and sends what it held once the pause ends.

A ``tbf`` root qdisc on the leaf's host-facing port: open (10 Gbit/s, a
1 MB bucket) while idle; inject() changes its rate to 800 bit/s with a
256-byte bucket, so after the two or three small frames the bucket still
holds, nothing leaves: at 100 bytes a second the bucket earns less than one
60-byte frame in any pause up to 0.6 s. clear() opens it again and the queue
drains at once (tests/netns/test_fault_toggle.py checks both, and that
nothing is lost). Not LAB.md's ``tc`` example of 8 bit/s: the rate table
pyroute2 builds for it overflows, and at 80 bit/s the kernel then drops
every frame at enqueue (measured: dropped, not queued), which is loss, not
a pause.

The queue is bounded (``LIMIT_BYTES``; beyond it the qdisc drops, as a
switch buffer would), so a pause left on cannot grow memory, and the lab's
teardown opens and removes the qdisc. Only the leaf-to-host direction
pauses; the host keeps sending.

Timing: arm() installs the open qdisc (pyroute2, in the leaf's namespace)
and has pyroute2 encode the two change requests (IPBatch) without sending
them; inject() and clear() then each send one of those messages on the
netlink socket the lab keeps in the leaf (Lab.netlink_request), stamped
right before it and after the kernel's acknowledgement (the qdisc's new
rate is in force between the two). Unarmed, inject() arms first and clear()
disarms, as the nft faults do.
"""

from __future__ import annotations

from pyroute2 import IPBatch, IPRoute

from labs.faults.base import Fault
from labs.topos.lab import Lab
from labs.topos.plan import HostPlan, LabError

HANDLE = 0x4C500000  # "LP": 4c50:0, the lab's root qdisc on the port
OPEN = {"rate": "10gbit", "burst": 1 << 20}
PAUSED = {"rate": "800bit", "burst": 256}
LIMIT_BYTES = 1 << 20
TC_H_ROOT = 0xFFFFFFFF


class LeafPause(Fault):
    """The leaf sends nothing to the host's port while injected, and loses
    nothing (up to LIMIT_BYTES queued)."""

    kind = "pause"

    def __init__(self, lab: Lab, host: str | int | HostPlan, rail: int | str):
        super().__init__(lab, host, rail)
        self.node, self.port = self.rail.leaf, self.rail.leaf_port
        self._index: int | None = None
        self._requests: dict[str, bytes] = {}
        self._armed_by_inject = False

    @property
    def description(self) -> str:
        return (f"{self.kind} on {self.rail.leaf} {self.rail.leaf_port} "
                f"(towards {self.host.name} {self.rail.port})")

    def _iproute(self) -> IPRoute:
        return IPRoute(netns=f"/proc/{self.lab.pid(self.node)}/ns/net", flags=0)

    def _arm(self) -> None:
        with self._iproute() as ipr:
            found = ipr.link_lookup(ifname=self.port)
            if not found:
                raise LabError(f"{self.description}: no {self.port} in {self.node}")
            self._index = found[0]
            ipr.tc("replace", "tbf", self._index, HANDLE, parent=TC_H_ROOT, limit=LIMIT_BYTES,
                   **OPEN)
        for name, params in (("paused", PAUSED), ("open", OPEN)):
            batch = IPBatch()
            batch.tc("change", "tbf", self._index, HANDLE, parent=TC_H_ROOT, limit=LIMIT_BYTES,
                     **params)
            self._requests[name] = bytes(batch.batch)

    def _disarm(self) -> None:
        self._requests = {}
        with self._iproute() as ipr:
            # pyroute2 encodes a tbf's options even to delete it: give the open ones
            ipr.tc("del", "tbf", self._index, HANDLE, parent=TC_H_ROOT, limit=LIMIT_BYTES,
                   **OPEN)

    def _change(self, name: str) -> tuple[float, float]:
        return self.lab.netlink_request(self.node, self._requests[name],
                                        f"tbf {name} on {self.port}")

    def _inject(self) -> float:
        self._armed_by_inject = not self.armed
        self.arm()
        stamp, self.inject_acked_at = self._change("paused")
        return stamp

    def _clear(self) -> float:
        stamp, self.clear_acked_at = self._change("open")
        if self._armed_by_inject:
            self.armed = False
            self._disarm()
        return stamp

    def record(self) -> dict:
        return {**super().record(), "paused": PAUSED, "open": OPEN, "limit_bytes": LIMIT_BYTES}
