"""This host's clock error bound, from its clock synchronisation (chrony or ptp4l).

One-way delays (core.oneway) are reported only within a bound: how far this
host's clock may be from true time, plus the peer's. This module reads ours:

* chrony: `chronyc -c tracking`, one CSV line whose fields are, in order,
  reference ID, reference name, stratum, reference time, system time offset
  (s), last offset, RMS offset, frequency, residual frequency, skew (ppm),
  root delay (s), root dispersion (s), update interval and leap status. The
  bound is |system time offset| + root dispersion + root delay / 2, and it
  grows by the skew plus 1 ppm per second until the next reading; leap
  status "Not synchronised" is no bound.
* ptp4l: `pmc -u -b 0 'GET TIME_STATUS_NP'`: with `gmPresent true`, the
  bound is |master_offset| (ns, the PTP clock against its grandmaster).
  That is the PTP hardware clock; the system clock follows it through
  phc2sys, whose own offset is not added.
* "auto": chrony, else ptp4l, else none, saying why for each.

Readings are taken off the hot path (`ClockWatch`, every `REFRESH_S`, each
command bounded by `COMMAND_TIMEOUT_S`) and never raise: a missing program,
a timeout or output that does not parse gives a reading with no bound and
the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable

from linkpassd.core.oneway import DRIFT_PPM, ClockReading, fixed_reading

REFRESH_S = 5.0  # how often the bound is read again
COMMAND_TIMEOUT_S = 2.0  # one chronyc or pmc run at most
CHRONY = ("chronyc", "-c", "tracking")
PTP = ("pmc", "-u", "-b", "0", "GET TIME_STATUS_NP")
_CHRONY_FIELDS = 14
NOT_SYNCHRONISED = "Not synchronised"


def _number(text: str, what: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{what} is {text!r}")
    return value


def parse_chrony(output: str, read_at: float) -> ClockReading:
    """The reading from `chronyc -c tracking`'s output (module docstring)."""
    lines = [line for line in output.splitlines() if line.strip()]
    if not lines:
        return ClockReading("chrony", None, "chronyc -c tracking printed nothing", read_at)
    fields = lines[0].strip().split(",")
    if len(fields) < _CHRONY_FIELDS:
        return ClockReading("chrony", None, f"chronyc -c tracking printed {len(fields)} fields, "
                            f"not {_CHRONY_FIELDS}: {lines[0][:80]!r}", read_at)
    leap = fields[13].strip()
    if leap == NOT_SYNCHRONISED:
        return ClockReading("chrony", None, "chronyd reports this host's clock not synchronised "
                            f"(leap status {leap!r})", read_at)
    try:
        offset = _number(fields[4], "the system time offset")
        skew = _number(fields[9], "the skew")
        root_delay = _number(fields[10], "the root delay")
        root_dispersion = _number(fields[11], "the root dispersion")
    except ValueError as exc:
        return ClockReading("chrony", None, f"chronyc -c tracking: a field is not a number "
                            f"({exc}): {lines[0][:80]!r}", read_at)
    if root_delay < 0 or root_dispersion < 0 or skew < 0:
        return ClockReading("chrony", None, "chronyc -c tracking: a negative root delay, "
                            f"dispersion or skew: {lines[0][:80]!r}", read_at)
    bound_s = abs(offset) + root_dispersion + root_delay / 2
    return ClockReading("chrony", round(bound_s * 1e9), "", read_at, drift_ppm=DRIFT_PPM + skew)


def parse_pmc(output: str, read_at: float) -> ClockReading:
    """The reading from `pmc -u -b 0 'GET TIME_STATUS_NP'`'s output."""
    values: dict[str, str] = {}
    answered = False
    for line in output.splitlines():
        parts = line.split()
        if "RESPONSE" in parts and "TIME_STATUS_NP" in parts:
            answered = True
        elif answered and len(parts) == 2:
            values.setdefault(parts[0], parts[1])
    if not answered:
        return ClockReading("ptp4l", None, "no ptp4l answered pmc (no TIME_STATUS_NP response)",
                            read_at)
    present = values.get("gmPresent")
    if present != "true":
        return ClockReading("ptp4l", None, "ptp4l has no grandmaster (gmPresent "
                            f"{present or 'missing'})", read_at)
    try:
        offset = int(values["master_offset"])
    except (KeyError, ValueError):
        return ClockReading("ptp4l", None, "pmc's TIME_STATUS_NP has no integer master_offset "
                            f"({values.get('master_offset', 'missing')!r})", read_at)
    return ClockReading("ptp4l", abs(offset), "", read_at)


async def run_command(argv: tuple[str, ...], timeout_s: float = COMMAND_TIMEOUT_S
                      ) -> tuple[int | None, str, str]:
    """(exit status or None, stdout, why it failed) of `argv`, killed after
    `timeout_s`. Never raises for a missing program or a hang."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
    except FileNotFoundError:
        return None, "", f"no {argv[0]} on this host"
    except OSError as exc:
        return None, "", f"{argv[0]}: {exc.strerror or exc}"
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(Exception):
            await proc.wait()
        return None, "", f"{argv[0]} did not answer within {timeout_s:g} s"
    text = out.decode("utf-8", "replace")
    if proc.returncode != 0:
        why = err.decode("utf-8", "replace").strip().splitlines()
        return proc.returncode, text, (f"{argv[0]} exited with {proc.returncode}"
                                       + (f": {why[-1][:120]}" if why else ""))
    return 0, text, ""


async def read_chrony(timeout_s: float = COMMAND_TIMEOUT_S) -> ClockReading:
    status, out, why = await run_command(CHRONY, timeout_s)
    if status != 0:
        return ClockReading("chrony", None, f"no chronyd answered `chronyc -c tracking` ({why})",
                            time.monotonic())
    return parse_chrony(out, time.monotonic())


async def read_ptp(timeout_s: float = COMMAND_TIMEOUT_S) -> ClockReading:
    status, out, why = await run_command(PTP, timeout_s)
    if status != 0:
        return ClockReading("ptp4l", None, f"no ptp4l answered pmc ({why})", time.monotonic())
    return parse_pmc(out, time.monotonic())


async def read_clock(source: str, timeout_s: float = COMMAND_TIMEOUT_S) -> ClockReading:
    """This host's clock bound by `source` (config [probes] clock)."""
    fixed = fixed_reading(source)
    if fixed is not None:
        return fixed
    if source == "chrony":
        return await read_chrony(timeout_s)
    if source == "ptp4l":
        return await read_ptp(timeout_s)
    chrony = await read_chrony(timeout_s)
    if chrony.bound_ns is not None:
        return chrony
    ptp = await read_ptp(timeout_s)
    if ptp.bound_ns is not None:
        return ptp
    return ClockReading("auto", None, "this host's clock reports no synchronisation ("
                        f"{chrony.reason}; {ptp.reason})", time.monotonic())


class ClockWatch:
    """Reads the clock bound by `source` now and every `refresh_s`, on the
    running loop, handing each reading to `on_reading`. Sources that need no
    reading ("none", "shared") are handed over once."""

    def __init__(self, source: str, on_reading: Callable[[ClockReading], None],
                 refresh_s: float = REFRESH_S) -> None:
        self.source = source
        self.on_reading = on_reading
        self.refresh_s = refresh_s
        self.reading: ClockReading | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        fixed = fixed_reading(self.source)
        if fixed is not None:
            self._hand(fixed)
            return
        self._task = asyncio.get_running_loop().create_task(self._run())

    def _hand(self, reading: ClockReading) -> None:
        self.reading = reading
        self.on_reading(reading)

    async def _run(self) -> None:
        while True:
            try:
                reading = await read_clock(self.source)
            except Exception as exc:  # noqa: BLE001 - a reading gone wrong is no bound, never a crash
                reading = ClockReading(self.source, None, f"reading the clock bound failed: "
                                       f"{exc!r}", time.monotonic())
            self._hand(reading)
            await asyncio.sleep(self.refresh_s)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
