"""A child's stdout of JSON lines, collected on a thread and waited on.

The lab's in-host helpers (labs.bfdpeer, labs.routewatch) run as processes in
a Mininet node and report one JSON object per line, stamped with
time.monotonic(). This keeps every line in order and lets a test wait for the
first line that matches, bounded; a line that is not JSON, an ``error`` line
or the end of output ends a wait at once instead of running out its timeout.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable

FAILED = ("error", "eof", "garbage")


class JsonLines:
    """Lines of ``stream`` (text, line-buffered) in ``events``, read on a
    daemon thread; ``who`` and ``log`` make failures say where they came from."""

    def __init__(self, stream: Iterable[str], who: str, log: Callable[[], str] = lambda: ""):
        self.who = who
        self.log = log
        self.events: list[dict] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, args=(stream,), daemon=True,
                                        name=f"jsonlines-{who}")
        self._reader.start()

    def _read(self, stream: Iterable[str]) -> None:
        for raw in stream:
            try:
                event = json.loads(raw)
            except ValueError:
                event = {"event": "garbage", "line": raw.rstrip("\n"), "at": time.monotonic()}
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()
        with self._cond:
            self.events.append({"event": "eof", "at": time.monotonic()})
            self._cond.notify_all()

    def mark(self) -> int:
        """An index into ``events``: wait(after=mark) sees only later lines."""
        with self._cond:
            return len(self.events)

    def select(self, pred: Callable[[dict], bool], after: int = 0) -> list[dict]:
        with self._cond:
            return [e for e in self.events[after:] if pred(e)]

    def wait(self, pred: Callable[[dict], bool], timeout: float, what: str,
             after: int = 0) -> dict:
        """The first line from ``after`` on that satisfies ``pred``, waiting at
        most ``timeout`` s; an error line or the end of output fails at once."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for event in self.events[after:]:
                    if pred(event):
                        return event
                    if event["event"] in FAILED:
                        raise AssertionError(f"{self.who} {event['event']} while waiting for "
                                             f"{what}: {event}\n{self.log()}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"{self.who}: no {what} within {timeout}s; "
                                         f"lines: {self.events[after:]}")
                self._cond.wait(remaining)

    def join(self, timeout: float) -> None:
        self._reader.join(timeout)
