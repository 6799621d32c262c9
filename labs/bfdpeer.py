"""Our BFD (linkpassd.adapters.bfd.BfdAgent) from inside a lab host, as a process.

BfdAgent's ``netns=`` needs a *named* namespace; Mininet nodes have none, so
this runs inside the host instead (``lab.popen``) and reports on stdout, one
JSON object per line:

    {"event": "ready", "at": ..., "sessions": [...]}
    {"event": "state", "at": ..., "name": "rail0", "old": "Down", "new": "Up", ...}
    {"event": "stopped", "at": ..., "sessions": [...], "counters": {...}, "drops": {...}}

``at`` is time.monotonic(): CLOCK_MONOTONIC is one clock for every namespace,
so it compares directly with a fault's ``injected_at``. SIGTERM (the lab's
teardown) closes every session with AdminDown, so the leaf reads the end as
administrative rather than as a path failure.

    python -m labs.bfdpeer --interval-ms 100 --detect-mult 3 \\
        --session rail0 lph1-eth0 198.18.0.3 198.18.0.2

From a test, ``BfdPeerProcess.start(lab, "lph1")`` runs one session per rail
of the host toward its gateway with the lab's BFD timers and collects the
lines on a thread.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labs.jsonlines import JsonLines

if TYPE_CHECKING:
    from labs.topos.lab import Lab

REPO = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 10.0


# ---- inside the host --------------------------------------------------------------


def _line(obj: dict) -> None:
    print(json.dumps(obj, sort_keys=True), flush=True)


def _event_line(event) -> dict:
    from linkpassd.core.bfd import diag_name

    return {"event": "state", "at": event.change.at, "name": event.name,
            "port": event.spec.ifname, "peer": event.spec.peer, "old": str(event.old),
            "new": str(event.new), "diag": event.diag, "diag_name": diag_name(event.diag),
            "remote_state": str(event.change.remote_state), "ever_up": event.ever_up,
            "detection_time_s": event.detection_time_s,
            "since_last_rx_s": event.since_last_rx_s, "lag_s": event.lag_s,
            "max_lag_s": event.max_lag_s}


async def _serve(args: argparse.Namespace) -> None:
    from linkpassd.adapters.bfd import BfdAgent, PeerSpec
    from linkpassd.core.bfd import SessionConfig

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    interval_us = args.interval_ms * 1000
    config = SessionConfig(desired_min_tx_us=interval_us, required_min_rx_us=interval_us,
                           detect_mult=args.detect_mult, passive=args.passive)
    agent = BfdAgent(emit=lambda event: _line(_event_line(event)))
    async with agent:
        failed = asyncio.ensure_future(agent.run())
        for name, port, local, peer in args.session:
            agent.add(PeerSpec(port, local, peer, config, name=name))
        _line({"event": "ready", "at": time.monotonic(), "sessions": agent.status()})
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({failed, stopped}, return_when=asyncio.FIRST_COMPLETED)
        status = agent.status()
        stopped.cancel()
        if failed.done():
            failed.result()  # re-raise what broke inside the agent
        failed.cancel()
    _line({"event": "stopped", "at": time.monotonic(), "sessions": status,
           "counters": dict(agent.counters), "drops": dict(agent.drops)})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="labs.bfdpeer", description=__doc__.splitlines()[0])
    parser.add_argument("--interval-ms", type=int, required=True,
                        help="desired min TX and required min RX")
    parser.add_argument("--detect-mult", type=int, required=True)
    parser.add_argument("--passive", action="store_true", help="wait for the peer to speak first")
    parser.add_argument("--session", nargs=4, action="append", required=True,
                        metavar=("NAME", "PORT", "LOCAL", "PEER"))
    parser.add_argument("--log-level", default="warning",
                        choices=("debug", "info", "warning", "error"))
    args = parser.parse_args(argv)
    from linkpassd import logs

    logs.configure("kv", args.log_level)  # stderr: stdout carries only the JSON lines
    try:
        asyncio.run(_serve(args))
    except Exception as exc:  # noqa: BLE001 - reported as a line, then a failing exit
        _line({"event": "error", "at": time.monotonic(), "error": f"{type(exc).__name__}: {exc}"})
        return 1
    return 0


# ---- from the test / lab side --------------------------------------------------------


class BfdPeerProcess:
    """labs.bfdpeer running in a lab host; a thread collects its lines in
    ``events`` (the lab stops the process by PID on teardown)."""

    def __init__(self, proc: subprocess.Popen, host: str, log_path: Path):
        self.proc = proc
        self.host = host
        self.log_path = log_path
        assert proc.stdout is not None
        self.lines = JsonLines(proc.stdout, f"bfdpeer in {host}", self.log)
        self.events = self.lines.events

    @classmethod
    def start(cls, lab: Lab, host: str, *, rails: list[int] | None = None,
              interval_ms: int | None = None, detect_mult: int | None = None,
              passive: bool = False, log_level: str = "warning") -> BfdPeerProcess:
        """One session per rail (default all) of ``host`` toward the rail's
        gateway, named after the rail; timers default to the lab's ``bfd``
        option. Returns once the sessions exist (the ``ready`` line)."""
        plan = lab.host(host)
        bfd = lab.bfd or {}
        interval_ms = interval_ms if interval_ms is not None else bfd.get("interval_ms")
        detect_mult = detect_mult if detect_mult is not None else bfd.get("detect_mult")
        if interval_ms is None or detect_mult is None:
            raise ValueError("no BFD timers: pass interval_ms and detect_mult, "
                             "or build the lab with bfd=")
        argv = [sys.executable, "-m", "labs.bfdpeer", "--interval-ms", str(interval_ms),
                "--detect-mult", str(detect_mult), "--log-level", log_level]
        if passive:
            argv.append("--passive")
        for r in (rails if rails is not None else [x.index for x in plan.rails]):
            rail = plan.rail(r)
            argv += ["--session", rail.name, rail.port, rail.address, rail.gateway]
        log_path = lab.host_dir(plan) / "bfdpeer.log"
        with open(log_path, "ab") as log:
            proc = lab.popen(plan, argv, stdout=subprocess.PIPE, stderr=log, cwd=str(REPO),
                             text=True, bufsize=1)
        peer = cls(proc, plan.name, log_path)
        peer.wait(lambda e: e["event"] == "ready", READY_TIMEOUT_S, "ready")
        return peer

    def mark(self) -> int:
        """An index into ``events``: wait(after=mark) sees only later lines."""
        return self.lines.mark()

    def wait(self, pred: Callable[[dict], bool], timeout: float, what: str,
             after: int = 0) -> dict:
        """The first line from ``after`` on that satisfies ``pred``, waiting at
        most ``timeout`` s; an error line or the end of output fails at once."""
        return self.lines.wait(pred, timeout, what, after)

    def wait_state(self, name: str, state: str, timeout: float, after: int = 0) -> dict:
        return self.wait(lambda e: e["event"] == "state" and e["name"] == name
                         and e["new"] == state, timeout, f"{name} {state}", after)

    def changes(self, after: int = 0, name: str | None = None) -> list[dict]:
        return self.lines.select(lambda e: e["event"] == "state"
                                 and (name is None or e["name"] == name), after)

    def state(self, name: str) -> str | None:
        """The session's state after its last reported change (None: none yet)."""
        changes = self.changes(name=name)
        return changes[-1]["new"] if changes else None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def __repr__(self) -> str:
        return f"<BfdPeerProcess {self.host} pid {self.proc.pid}>"

    def stop(self, timeout: float = 5.0) -> Any:
        """SIGTERM by PID (sessions end with AdminDown); the final line."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout)
        self.lines.join(timeout)
        return next((e for e in reversed(self.events) if e["event"] == "stopped"), None)


if __name__ == "__main__":
    sys.exit(main())
