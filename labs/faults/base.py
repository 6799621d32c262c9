"""What every fault shares: a target port, timestamps, idempotent clear.

``injected_at``/``cleared_at`` are time.monotonic() taken immediately before
the action that causes (or ends) the fault. CLOCK_MONOTONIC is one clock for
every namespace on the machine, so a receiver's timestamps in any lab node
compare with them directly. Faults toggled by one netlink request also stamp
the kernel's acknowledgement (``inject_acked_at``/``clear_acked_at``): the
change took effect between the two stamps.

Arming: a fault whose rules take work to install (nftables chains, a qdisc)
installs them in arm(), before the trial, so that inject() and clear() are
one small change each (no process started, nothing parsed or committed at
fault time). arm() is optional: inject() arms an unarmed fault itself and
clear() then removes what it installed, as before. An armed fault stays
installed across inject()/clear() cycles until disarm() (or the lab's
teardown, which clears and disarms every fault it has seen).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from labs.topos.lab import Lab
from labs.topos.plan import HostPlan, HostRail, LabError


class Fault:
    """Base class: subclasses implement _inject()/_clear(), each returning
    the monotonic stamp taken right before its causing action."""

    kind = "fault"

    def __init__(self, lab: Lab, host: str | int | HostPlan, rail: int | str):
        self.host: HostPlan = lab.host(host)  # LabError names the hosts that exist
        self.rail: HostRail = self.host.rail(rail)  # ...and the rails
        self._init_state(lab)

    def _init_state(self, lab: Lab) -> None:
        """What every fault has, whatever it targets (a fault on a fabric
        link has no host port: it sets ``host``/``rail`` to None and calls this)."""
        self.lab = lab
        self.injected_at: float | None = None
        self.cleared_at: float | None = None
        self.inject_acked_at: float | None = None
        self.clear_acked_at: float | None = None
        self.armed = False
        self._lock = threading.RLock()

    @property
    def description(self) -> str:
        return f"{self.kind} on {self.host.name} rail {self.rail.index} ({self.rail.port})"

    @property
    def active(self) -> bool:
        return self.injected_at is not None and self.cleared_at is None

    def arm(self) -> "Fault":
        """Install what the fault needs, inactive, so inject() is one small
        change; idempotent. Faults with nothing to install only register."""
        with self._lock:
            self.lab._register_fault(self)  # the lab clears and disarms it on teardown
            if not self.armed:
                self._arm()
                self.armed = True
            return self

    def disarm(self) -> None:
        """Remove what arm() installed (clearing the fault first); idempotent."""
        with self._lock:
            self.clear()
            if self.armed:
                self.armed = False
                self._disarm()

    def inject(self) -> float:
        with self._lock:
            if self.active:
                raise LabError(f"{self.description}: already injected")
            self.lab._register_fault(self)  # the lab clears it on teardown
            self.cleared_at = self.inject_acked_at = self.clear_acked_at = None
            self.injected_at = self._inject()
            return self.injected_at

    def clear(self) -> float | None:
        """End the fault; a no-op (returning the earlier stamp) if it is not active."""
        with self._lock:
            if self.active:
                self.cleared_at = self._clear()
            return self.cleared_at

    def record(self) -> dict[str, Any]:
        """For result files: what was done, where, and when."""
        return {"fault": self.kind, "description": self.description, "host": self.host.name,
                "rail": self.rail.index, "port": self.rail.port, "leaf": self.rail.leaf,
                "leaf_port": self.rail.leaf_port, **self.stamps()}

    def stamps(self) -> dict[str, float | None]:
        return {"injected_at": self.injected_at, "inject_acked_at": self.inject_acked_at,
                "cleared_at": self.cleared_at, "clear_acked_at": self.clear_acked_at}

    def __enter__(self) -> "Fault":
        self.inject()
        return self

    def __exit__(self, *exc: object) -> None:
        self.clear()

    def __str__(self) -> str:
        return self.description

    def _arm(self) -> None:
        """Nothing to install by default."""

    def _disarm(self) -> None:
        """Nothing to remove by default."""

    def _inject(self) -> float:
        raise NotImplementedError

    def _clear(self) -> float:
        raise NotImplementedError


class BackgroundFault(Fault):
    """A fault that keeps acting after inject() (a flap, a ramp) on one bounded
    thread. Errors on the thread surface in wait() and clear()."""

    def __init__(self, lab: Lab, host: str | int | HostPlan, rail: int | str):
        super().__init__(lab, host, rail)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def budget_s(self) -> float:
        """How long the background work takes when left alone."""
        raise NotImplementedError

    def _start(self, work: Callable[[], None], name: str) -> None:
        self._stop.clear()
        self._error = None

        def run() -> None:
            try:
                work()
            except BaseException as exc:  # noqa: BLE001 - surfaced by wait()/clear()
                self._error = exc

        self._thread = threading.Thread(target=run, daemon=True, name=name)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> None:
        """Until the background work is done (bounded: its budget + 5 s by default)."""
        if self._thread is not None:
            self._thread.join(self.budget_s + 5.0 if timeout is None else timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"{self.description}: still running")
        self._raise_error()

    def _stop_thread(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            if self._thread.is_alive():
                raise LabError(f"{self.description}: background thread did not stop")

    def _raise_error(self) -> None:
        if self._error is not None:
            raise LabError(f"{self.description}: {self._error}") from self._error
