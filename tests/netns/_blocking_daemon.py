"""The real linkpassd Daemon, plus two ways for a test to make it stop working.

    python tests/netns/_blocking_daemon.py --control DIR --config FILE

Production code has no test hook; this harness (test code) runs the real
`Daemon` as linkpassd's main() does, and watches DIR from a thread of its own
for a request file, `request.json`, holding {"action": ..., "seconds": N}:

  block-loop       the event loop itself is blocked for N s, from outside, by
                   `loop.call_soon_threadsafe(time.sleep, N)`: nothing on the
                   loop runs (what a stuck syscall or a CPU-bound bug does);
  stall-reconcile  the reconcile loop's next batch awaits N s before it is
                   handled, while the event loop runs on (what a netlink
                   request that never returns does).

Each request is consumed (deleted) when taken; its start and its end are
appended to DIR/stamps.jsonl, stamped on CLOCK_MONOTONIC, which every
namespace shares.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from pathlib import Path

from linkpassd import config as configmod
from linkpassd import logs
from linkpassd.daemon.loop import Daemon

POLL_S = 0.02


class StallableDaemon(Daemon):
    def __init__(self, *args, control: Path, **kwargs):
        super().__init__(*args, **kwargs)
        self.control = control
        self.stall_request: float | None = None

    def record(self, action: str, phase: str) -> None:
        with open(self.control / "stamps.jsonl", "a") as out:
            out.write(json.dumps({"action": action, "phase": phase, "t": time.monotonic()}) + "\n")

    async def handle(self, events: list) -> None:
        if self.stall_request is not None:
            seconds, self.stall_request = self.stall_request, None
            self.record("stall-reconcile", "start")
            await asyncio.sleep(seconds)
            self.record("stall-reconcile", "end")
        await super().handle(events)

    def block(self, seconds: float) -> None:
        self.record("block-loop", "start")
        time.sleep(seconds)  # on the event loop's own thread: the whole loop waits
        self.record("block-loop", "end")

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        watcher = threading.Thread(target=self.watch, args=(loop, stop), daemon=True,
                                   name="test-requests")
        watcher.start()
        try:
            await super().run()
        finally:
            stop.set()
            watcher.join(2.0)

    def watch(self, loop: asyncio.AbstractEventLoop, stop: threading.Event) -> None:
        request = self.control / "request.json"
        while not stop.wait(POLL_S):
            try:
                wanted = json.loads(request.read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                continue  # none yet, or half written
            request.unlink()
            seconds = float(wanted["seconds"])
            if wanted["action"] == "block-loop":
                loop.call_soon_threadsafe(self.block, seconds)
            elif wanted["action"] == "stall-reconcile":
                loop.call_soon_threadsafe(setattr, self, "stall_request", seconds)
            else:
                print(f"_blocking_daemon: unknown action {wanted['action']!r}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--control", required=True, type=Path)
    parser.add_argument("--config", required=True)
    args = parser.parse_args()
    config = configmod.load_config(args.config)
    logs.configure(config.log_format, config.log_level)
    sys.setswitchinterval(0.001)  # as linkpassd's main() does
    daemon = StallableDaemon(config, args.config, control=args.control)
    asyncio.run(daemon.run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
