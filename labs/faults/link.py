"""Carrier faults: a pulled cable, a flapping one.

The leaf end of the host's veth goes down, so the host port loses carrier the
way a NIC does when the far side goes dark; nothing in the host is touched.
"""

from __future__ import annotations

import threading
import time

from labs.faults.base import Fault
from labs.topos.lab import Lab
from labs.topos.plan import HostPlan, LabError


class CablePull(Fault):
    kind = "cable-pull"

    def _inject(self) -> float:
        return self.lab.set_link(self.rail.leaf, self.rail.leaf_port, up=False)

    def _clear(self) -> float:
        return self.lab.set_link(self.rail.leaf, self.rail.leaf_port, up=True)


class Flap(Fault):
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
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def description(self) -> str:
        return f"{super().description}: {self.times} flaps within {self.within_s:g}s"

    def _set(self, up: bool) -> float:
        stamp = self.lab.set_link(self.rail.leaf, self.rail.leaf_port, up=up)
        self.events.append((stamp, "up" if up else "down"))
        return stamp

    def _inject(self) -> float:
        self.events = []
        self._stop.clear()
        self._error = None
        start = self._set(False)
        self._thread = threading.Thread(target=self._run, args=(start,), daemon=True,
                                        name=f"flap-{self.rail.leaf_port}")
        self._thread.start()
        return start

    def _run(self, start: float) -> None:
        period = self.within_s / self.times
        try:
            for k in range(self.times):
                for offset, up in ((k * period, False), (k * period + period / 2, True)):
                    if k == 0 and not up:
                        continue  # done by inject()
                    if self._stop.wait(max(0.0, start + offset - time.monotonic())):
                        return
                    self._set(up)
        except BaseException as exc:  # surfaced by wait()/clear()
            self._error = exc

    def wait(self, timeout: float | None = None) -> None:
        """Until the last cycle is done (bounded: within_s + 5 s by default)."""
        if self._thread is not None:
            self._thread.join(self.within_s + 5.0 if timeout is None else timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"{self.description}: still flapping")
        if self._error is not None:
            raise LabError(f"{self.description}: {self._error}") from self._error

    def _clear(self) -> float:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            if self._thread.is_alive():
                raise LabError(f"{self.description}: flap thread did not stop")
        if self.events and self.events[-1][1] == "up" and len(self.events) == 2 * self.times:
            return self.events[-1][0]  # finished on its own: it ended at the last up
        return self._set(True)
