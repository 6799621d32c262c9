"""Run the traffic tools in lab namespaces, stopped by PID, with faults timed
against the sender's own t0 (CLOCK_MONOTONIC, shared by every namespace).

Used by the traffic tests and by netns tests that need a real kernel-path
flow's loss across a change (a drain, a failover)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from labs.traffic.receiver import ReceiverConfig
from labs.traffic.sender import SenderConfig

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 30


class Proc:
    """A tool running in a namespace: read its stderr lines, always stopped by PID."""

    def __init__(self, ns: str, argv: list[str]):
        self.p = subprocess.Popen(
            ["ip", "netns", "exec", ns, *argv],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.buf = b""

    def line(self, prefix: str, timeout: float = 15) -> str:
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self.buf:
                raw, self.buf = self.buf.split(b"\n", 1)
                text = raw.decode()
                if text.startswith(prefix):
                    return text
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {prefix!r} line within {timeout}s")
            r, _, _ = select.select([self.p.stderr], [], [], left)
            if r:
                chunk = os.read(self.p.stderr.fileno(), 4096)
                if not chunk:
                    raise AssertionError(f"process ended before {prefix!r}: {self.buf.decode()}")
                self.buf += chunk

    def wait(self, timeout: float = RUN_TIMEOUT) -> int:
        _, err = self.p.communicate(timeout=timeout)
        assert self.p.returncode == 0, (self.buf + err).decode()
        return self.p.returncode

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=5)
        if self.p.stderr:
            self.p.stderr.close()


@dataclass
class Run:
    rx: dict
    tx: dict
    t0: float  # the sender's schedule start
    marks: dict  # fault times, CLOCK_MONOTONIC


def run_traffic(tmp_path: Path, *, rx_ns: str, tx_ns: str, mode: str, dst: str, src: str | None,
                rate: int, duration: float,
                faults: Iterable[tuple[float, str, Callable[[], object]]] = ()) -> Run:
    """Receiver in `rx_ns`, sender in `tx_ns`; `faults` are (seconds after t0,
    name, callable), each run once at its time; marks say when each was done."""
    rx_file, tx_file = tmp_path / f"rx-{mode}.json", tmp_path / f"tx-{mode}.json"
    procs: list[Proc] = []
    marks: dict[str, float] = {}
    try:
        rx_cfg = ReceiverConfig(bind=dst, duration=duration + 8)
        rx = Proc(rx_ns, rx_cfg.command(str(rx_file)))
        procs.append(rx)
        rx.line("receiver: ready")
        tx_cfg = SenderConfig(mode=mode, dst=dst, src=src, rate=rate, duration=duration)
        tx = Proc(tx_ns, tx_cfg.command(str(tx_file)))
        procs.append(tx)
        t0 = float(tx.line("sender: sending").split("t0=")[1].split()[0])
        for at, name, action in faults:
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            action()
            marks[name] = time.monotonic()
        tx.wait()
        rx.wait()
    finally:
        for p in reversed(procs):
            p.stop()
    return Run(json.loads(rx_file.read_text()), json.loads(tx_file.read_text()), t0, marks)
