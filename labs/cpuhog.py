"""Bounded busy loops for load trials, started ahead and released at once.

``CpuHogs([0, 1], busy_s=2.0)`` starts one Python process per CPU, pinned to
it, each blocked on its stdin; go() writes one byte to every hog (no process
is started at that moment) and returns the monotonic stamp taken right
before; each hog then spins for ``busy_s`` and exits by itself. A hog that is
never released exits after ``wait_s``. stop() ends them early by PID.

``pin_threads(pid, cpus)`` moves every thread of a process onto ``cpus`` and
returns what to restore: how a load trial puts a peer daemon on the core
its hog spins on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

HOG = """
import os, select, sys, time
ready, _, _ = select.select([0], [], [], {wait_s})
if not ready or not os.read(0, 1):
    sys.exit(0)
end = time.monotonic() + {busy_s}
while time.monotonic() < end:
    pass
"""
MAX_BUSY_S = 60.0


class CpuHogs:
    def __init__(self, cpus: list[int], busy_s: float, wait_s: float = 120.0):
        if not 0 < busy_s <= MAX_BUSY_S:
            raise ValueError(f"busy_s must be in (0, {MAX_BUSY_S:g}], got {busy_s!r}")
        known = os.sched_getaffinity(0) | set(range(os.cpu_count() or 1))
        if bad := [c for c in cpus if c not in known]:
            raise ValueError(f"no CPU {bad} on this machine (CPUs: {sorted(known)})")
        self.cpus = list(cpus)
        self.busy_s = float(busy_s)
        self.procs: list[subprocess.Popen] = []
        code = HOG.format(wait_s=float(wait_s), busy_s=self.busy_s)
        try:
            for cpu in self.cpus:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-c", code], stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    preexec_fn=lambda c=cpu: os.sched_setaffinity(0, {c})))
        except BaseException:
            self.stop()
            raise
        self.started_at: float | None = None

    def go(self) -> float:
        stamp = time.monotonic()
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(b"g")
            proc.stdin.flush()
        self.started_at = stamp
        return stamp

    def stop(self) -> float:
        """End every hog (SIGTERM by PID, then SIGKILL); the stamp right before."""
        stamp = time.monotonic()
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            if proc.stdin is not None:
                proc.stdin.close()
        return stamp

    def __enter__(self) -> CpuHogs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def pin_threads(pid: int, cpus: set[int]) -> dict[int, set[int]]:
    """Every thread of ``pid`` onto ``cpus``; returns {tid: old affinity}."""
    old = {}
    for tid in threads(pid):
        try:
            old[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:  # a thread that just ended
            continue
    if not old:
        raise ProcessLookupError(f"no process {pid} to pin")
    return old


def restore_threads(old: dict[int, set[int]]) -> None:
    for tid, cpus in old.items():
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            continue
