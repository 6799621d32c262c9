"""One kernel-path RoCEv2 flow between two lab hosts (labs/traffic), for a
trial: start() returns once the receiver listens and the sender's schedule
has begun (``t0``); report() waits for both to finish and returns the
receiver's report. Both stop by themselves (``duration``), and the lab stops
them by PID on teardown.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from labs.topos.lab import Lab
from labs.traffic.receiver import ReceiverConfig
from labs.traffic.sender import SenderConfig

READY_S = 15.0


def _start(lab: Lab, host: str, argv: list[str], log: Path, ready: str) -> subprocess.Popen:
    with open(log, "wb") as out:
        proc = lab.popen(host, argv, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + READY_S
    while ready not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
            raise RuntimeError(f"{argv[:3]} in {host} not {ready!r}: {log.read_text()[-2000:]}")
        time.sleep(0.01)
    return proc


@dataclass
class LabFlow:
    """``src_host``'s ``src`` address sends ``rate`` packets a second to
    ``dst`` (an address of ``dst_host``) for ``duration`` seconds."""

    lab: Lab
    src_host: str
    src: str
    dst_host: str
    dst: str
    duration: float
    workdir: Path
    rate: float = 1000.0
    t0: float | None = None
    _procs: list[subprocess.Popen] = field(default_factory=list)

    def start(self) -> float:
        self.workdir.mkdir(parents=True, exist_ok=True)
        rx_cfg = ReceiverConfig(bind=self.dst, duration=self.duration + 5).validated()
        rx = _start(self.lab, self.dst_host, rx_cfg.command(str(self.workdir / "rx.json")),
                    self.workdir / "rx.log", "ready")
        self._procs.append(rx)
        tx_cfg = SenderConfig(mode="kernel-path", dst=self.dst, src=self.src, rate=self.rate,
                              duration=self.duration).validated()
        tx = _start(self.lab, self.src_host, tx_cfg.command(str(self.workdir / "tx.json")),
                    self.workdir / "tx.log", "sending t0=")
        self._procs.insert(0, tx)
        self.t0 = float((self.workdir / "tx.log").read_text().split("t0=")[1].split()[0])
        return self.t0

    def report(self) -> dict:
        """The receiver's report, once sender and receiver have finished."""
        try:
            for proc in self._procs:
                proc.wait(self.duration + 15)
        finally:
            self.stop()
        return json.loads((self.workdir / "rx.json").read_text())

    def stop(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)


def gap_spanning(report: dict, t: float, slack_s: float = 0.002) -> dict | None:
    """The receiver's gap (of its top gaps) that spans monotonic ``t`` (a
    fault's injection): silence that began at most ``slack_s`` after ``t``."""
    for gap in report.get("top_gaps") or []:
        if gap.get("start_t") is not None and gap.get("end_t") is not None \
                and gap["start_t"] <= t + slack_s < gap["end_t"]:
            return gap
    return None


def gap_overlapping(report: dict, start: float, end: float) -> dict | None:
    """The longest of the receiver's top gaps that overlaps the monotonic
    window [start, end] (a fault's injection to its clearing): the silence
    the fault caused, wherever within the window the flow fell silent."""
    gaps = [g for g in report.get("top_gaps") or []
            if g.get("start_t") is not None and g.get("end_t") is not None
            and g["start_t"] < end and g["end_t"] > start]
    return max(gaps, key=lambda g: g["gap_s"], default=None)
