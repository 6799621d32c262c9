"""Carrier faults: a pulled cable, a flapping one.

The leaf end of the host's veth goes down, so the host port loses carrier the
way a NIC does when the far side goes dark; nothing in the host is touched.
"""

from __future__ import annotations

import time

from labs.faults.base import BackgroundFault, Fault
from labs.topos.lab import Lab
from labs.topos.plan import HostPlan, LabError


class CablePull(Fault):
    kind = "cable-pull"

    def _inject(self) -> float:
        return self.lab.set_link(self.rail.leaf, self.rail.leaf_port, up=False)

    def _clear(self) -> float:
        return self.lab.set_link(self.rail.leaf, self.rail.leaf_port, up=True)


class Flap(BackgroundFault):
    """``times`` down/up cycles spread evenly over ``within_s`` seconds: cycle
    k goes down at k*T and up at k*T + T/2 (T = within_s/times). The first
    down happens in inject(); the rest on one bounded background thread.
    ``events`` lists every (stamp, "down"|"up") done; clear() stops early and
    leaves the link up."""

    kind = "flap"

    def __init__(self, lab: Lab, host: str | int | HostPlan, rail: int | str,
                 times: int = 3, within_s: float = 3.0):
        super().__init__(lab, host, rail)
        if not isinstance(times, int) or times < 1:
            raise LabError(f"flap times must be a positive integer, got {times!r}")
        if not within_s > 0:
            raise LabError(f"flap within_s must be > 0, got {within_s!r}")
        self.times = times
        self.within_s = float(within_s)
        self.events: list[tuple[float, str]] = []

    @property
    def budget_s(self) -> float:
        return self.within_s

    @property
    def description(self) -> str:
        return f"{super().description}: {self.times} flaps within {self.within_s:g}s"

    def _set(self, up: bool) -> float:
        stamp = self.lab.set_link(self.rail.leaf, self.rail.leaf_port, up=up)
        self.events.append((stamp, "up" if up else "down"))
        return stamp

    def _inject(self) -> float:
        self.events = []
        start = self._set(False)
        self._start(lambda: self._cycle(start), name=f"flap-{self.rail.leaf_port}")
        return start

    def _cycle(self, start: float) -> None:
        period = self.within_s / self.times
        for k in range(self.times):
            for offset, up in ((k * period, False), (k * period + period / 2, True)):
                if k == 0 and not up:
                    continue  # done by inject()
                if self._stop.wait(max(0.0, start + offset - time.monotonic())):
                    return
                self._set(up)

    def _clear(self) -> float:
        self._stop_thread()
        if self.events and self.events[-1][1] == "up" and len(self.events) == 2 * self.times:
            return self.events[-1][0]  # finished on its own: it ended at the last up
        return self._set(True)
