"""Verdicts carried across a restart: what the daemon must not forget.

Fail-static keeps the kernel's routes when linkpassd stops; this keeps the
reasons. A port that was not trusted when the daemon stopped (a silent
blackhole its link state cannot show) must start as not trusted, and be
proven healthy by the signals that condemned it, never trusted again merely
because the daemon forgot. Two sources say so:

  * the verdict file the daemon writes on every verdict change (the state
    directory), with the signals behind each bad verdict;
  * the kernel itself at adoption: a rail table found routed through another
    rail's nexthop was failed over, whatever the file says (or when there is
    no file, e.g. the first start after an upgrade).

Pure: encoding and decoding are functions of values, and decoding treats the
file as outside input (it names what is wrong, never raises anything else).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from linkpassd.core.model import Config, KernelState, Verdict

FORMAT = 1


@dataclass(frozen=True)
class Carried:
    """A port's verdict from before, and the signals that must refute it."""

    verdict: Verdict
    reason: str
    awaiting: tuple[str, ...]


class CarriedError(ValueError):
    """The verdict file is not one we wrote; the message says what is wrong."""


def encode(verdicts: Mapping[str, tuple[Verdict, str, tuple[str, ...]]], written_at: float) -> dict[str, Any]:
    """The verdict file's content: per port its verdict, reason and the
    signals behind a bad one; `written_at` is unix time."""
    return {
        "format": FORMAT,
        "written_at": written_at,
        "ports": {port: {"verdict": str(v), "reason": reason, "signals": list(signals)}
                  for port, (v, reason, signals) in sorted(verdicts.items())},
    }


def decode(doc: Mapping[str, Any], now_wall: float) -> dict[str, Carried]:
    """Ports that were not UP, as Carried (reason says when it was written)."""
    if doc.get("format") != FORMAT:
        raise CarriedError(f"format {doc.get('format')!r}, expected {FORMAT}")
    written = doc.get("written_at")
    if not isinstance(written, (int, float)) or isinstance(written, bool):
        raise CarriedError("written_at is not a number")
    ports = doc.get("ports")
    if not isinstance(ports, dict):
        raise CarriedError("ports is not an object")
    age = max(0.0, now_wall - written)
    out: dict[str, Carried] = {}
    for port, entry in ports.items():
        if not isinstance(entry, dict):
            raise CarriedError(f"ports.{port} is not an object")
        try:
            verdict = Verdict(entry.get("verdict", ""))  # no verdict: ValueError, as a wrong one
        except ValueError:
            raise CarriedError(f"ports.{port}.verdict {entry.get('verdict')!r} is not a verdict") from None
        signals = entry.get("signals", [])
        if not isinstance(signals, list) or not all(isinstance(s, str) for s in signals):
            raise CarriedError(f"ports.{port}.signals is not a list of names")
        reason = entry.get("reason", "")
        if not isinstance(reason, str):
            raise CarriedError(f"ports.{port}.reason is not text")
        if verdict is Verdict.UP:
            continue
        out[port] = Carried(verdict, f"{verdict} before restart ({_age(age)} ago): {reason}",
                            tuple(signals))
    return out


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def failed_over(config: Config, kernel: KernelState) -> dict[str, str]:
    """Rail ports whose table the kernel routes through another rail's
    nexthop: they were failed over when the last daemon stopped. Port ->
    description for the reason."""
    port_of_nexthop = {nh.id: nh.port for nh in kernel.nexthops}
    out: dict[str, str] = {}
    for rail in config.rails:
        for route in sorted(kernel.routes):
            if route.table != rail.table:
                continue
            via = port_of_nexthop.get(route.nhid)
            if via is not None and via != rail.port:
                out[rail.port] = (f"found failed over at start: table {rail.table} "
                                  f"routes {route.dst} through {via}")
                break
    return out


def probe_signals(config: Config, port: str, echo_signal: str) -> tuple[str, ...]:
    """The path probes a port has: what can prove it healthy after adoption."""
    names = []
    for rail in config.rails:
        if rail.port != port:
            continue
        if rail.bfd:
            names.append(f"bfd:{rail.gateway}")
        if config.probes.enabled and rail.probe_peers:
            names.append(echo_signal)
    return tuple(names)
