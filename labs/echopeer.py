"""An echo responder alone, as a process: the far end of linkpassd's echo probes
where no linkpassd runs (a namespace standing in for a remote host).

    ip netns exec <ns> python -m labs.echopeer --duration 60 [--port 4793]
        [--allow 198.18.0.0/15 ...] [--address A ...] [--clock shared]

It answers requests from sources in `--allow` (default: the whole lab range
198.18.0.0/15), sent to any of `--address` (default: any local address, as
the namespace stands in for a whole host). `--clock`: where the clock error
bound its replies carry for one-way delay comes from, as linkpassd's
[probes] clock (default none: it says its clock is not synchronised).

Prints one JSON line when listening and one with its counters when it stops
(SIGTERM, or after --duration: every lab process is bounded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
from dataclasses import asdict

from linkpassd.adapters.clocksync import ClockWatch
from linkpassd.adapters.echoresponder import ECHO_PORT, EchoResponder
from linkpassd.core.admission import ResponderPolicy
from linkpassd.core.oneway import CLOCK_SOURCES

READY_TIMEOUT_S = 10.0
# Where netns tests put the far end of echo probes: the leaf namespace's loopback.
NETNS_PEER = "198.19.9.1"
LAB_RANGE = "198.18.0.0/15"


# --no-rate-limit: one namespace standing in for a whole rack of peers gets
# every host's probes from one source per rail, far over a real host's rate.
UNLIMITED = {"rate_pps": 1e7, "burst": 1_000_000}


async def _serve(port: int, duration: float, allow: list[str],
                 addresses: list[str] | None, limits: dict | None = None,
                 clock: str = "none") -> dict:
    responder = EchoResponder(port=port,
                              policy=ResponderPolicy.build(addresses, allow, **(limits or {})))
    watch = ClockWatch(clock, responder.set_clock)
    watch.start()
    responder.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print(json.dumps({"event": "ready", "port": port}), flush=True)
    try:
        await asyncio.wait_for(stop.wait(), duration)
    except TimeoutError:
        pass
    finally:
        watch.close()
        responder.close()
    return asdict(responder.counters)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="labs.echopeer", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=ECHO_PORT)
    parser.add_argument("--duration", type=float, default=300.0, help="stop after this many s")
    parser.add_argument("--allow", action="append", metavar="CIDR",
                        help=f"answer sources in this prefix (repeatable; default {LAB_RANGE})")
    parser.add_argument("--address", action="append", metavar="IP",
                        help="answer only requests sent to this address (repeatable; default any)")
    parser.add_argument("--clock", choices=CLOCK_SOURCES, default="none",
                        help="the clock bound the replies carry, as [probes] clock")
    parser.add_argument("--no-rate-limit", action="store_true",
                        help="no per-source rate limit (one namespace standing in for many peers)")
    args = parser.parse_args(argv)
    if not 1 <= args.port <= 65535:
        parser.error(f"--port must be 1..65535, got {args.port}")
    if not args.duration > 0:
        parser.error(f"--duration must be positive, got {args.duration:g}")
    try:
        policy_args = (args.allow or [LAB_RANGE], args.address)
        ResponderPolicy.build(policy_args[1], policy_args[0])
    except ValueError as exc:
        parser.error(f"--allow/--address: {exc}")
    counters = asyncio.run(_serve(args.port, args.duration, *policy_args,
                                  UNLIMITED if args.no_rate_limit else None, args.clock))
    print(json.dumps({"event": "stopped", "counters": counters}), flush=True)
    return 0


class EchoPeerProcess:
    """`python -m labs.echopeer` in a named namespace, stopped by PID."""

    def __init__(self, netns: str, port: int = ECHO_PORT, duration: float = 300.0,
                 clock: str = "none"):
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-m", "labs.echopeer",
             "--port", str(port), "--duration", str(duration), "--clock", clock],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def __enter__(self) -> "EchoPeerProcess":
        try:
            line = _readline(self.proc, READY_TIMEOUT_S)
            if '"ready"' not in line:
                raise RuntimeError(f"echo peer did not start: {line!r} {self.proc.stderr.read()}")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> dict | None:
        """Stop it; its final counters, when it said them."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        out = self.proc.stdout.read() if self.proc.stdout else ""
        for line in out.splitlines():
            if '"stopped"' in line:
                return json.loads(line)["counters"]
        return None


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    """One stdout line, or give up after `timeout` (the process is then stopped by the caller)."""
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            return ""
    return proc.stdout.readline()


if __name__ == "__main__":
    sys.exit(main())
