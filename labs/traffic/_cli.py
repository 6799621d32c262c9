"""What the sender and receiver programs share: argument errors, limits, reports."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile

MAX_DURATION_S = 600.0
DEFAULT_DURATION_S = 10.0
MAX_RATE = 20000.0
DEFAULT_RATE = 2000.0
# QP numbers: the sender's and the receiver's, agreed out of band like rdma_cm's REQ/REP.
DEFAULT_SENDER_QP = 0x000011
DEFAULT_RECEIVER_QP = 0x000012
DEFAULT_SPORT = 49152
EXIT_USAGE = 2
EXIT_RUNTIME = 1


class UsageError(Exception):
    """A bad argument; reported as one line, exit status 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but an error is one line on stderr (no usage dump), exit 2."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def int_auto(text: str) -> int:
    """Decimal or 0x-hex, as QP numbers are usually written."""
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
    return v


def check_duration(duration: float) -> float:
    if not 0 < duration <= MAX_DURATION_S:
        raise UsageError(f"--duration must be in (0, {MAX_DURATION_S:g}] seconds, got {duration:g}")
    return duration


def check_qp(qp: int, what: str) -> int:
    if not 0 < qp < (1 << 24):
        raise UsageError(f"{what} must be a 24-bit QP number > 0, got {qp}")
    return qp


def check_port(port: int, what: str) -> int:
    if not 0 < port < 65536:
        raise UsageError(f"{what} must be a UDP port 1..65535, got {port}")
    return port


def write_report(path: str, report: dict) -> None:
    """Write JSON atomically (a reader never sees half a report); ``-`` is stdout."""
    text = json.dumps(report, indent=2, sort_keys=True) + "\n"
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def fail(prog: str, message: str, status: int) -> int:
    sys.stderr.write(f"{prog}: error: {message}\n")
    return status


class StopFlag:
    """SIGTERM/SIGINT only record intent; the run loop acts on it and the
    report is still written."""

    def __init__(self):
        self.stop = False

    def __call__(self, signum, frame):
        self.stop = True

    @classmethod
    def installed(cls) -> "StopFlag":
        flag = cls()
        signal.signal(signal.SIGTERM, flag)
        signal.signal(signal.SIGINT, flag)
        return flag


def save_report(prog: str, path: str, report: dict) -> int:
    """Write the report; 0, or the one-line failure's exit status."""
    try:
        write_report(path, report)
    except OSError as e:
        return fail(prog, f"cannot write report {path}: {e.strerror or e}", EXIT_RUNTIME)
    return 0
