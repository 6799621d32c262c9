"""Blackout, loss, reordering and duplicates from a list of arrivals. Pure.

Kept free of sockets and clocks so the numbers the labs publish can be checked
on synthetic arrival lists. Times are CLOCK_MONOTONIC seconds: every network
namespace shares that clock, so a fault injector's timestamp, the sender's
send time and the receiver's arrival time are directly comparable.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

PSN_BITS = 24
PSN_MOD = 1 << PSN_BITS
_HALF = PSN_MOD // 2
DEFAULT_BIN_S = 0.1
TOP_GAPS = 5


@dataclass(frozen=True)
class Arrival:
    """One valid data packet as the receiver saw it."""

    t: float  # receive time, CLOCK_MONOTONIC seconds
    psn: int  # 24-bit PSN as on the wire
    t_sent: float | None = None  # sender's CLOCK_MONOTONIC send time, from the payload
    src: str | None = None  # IP source: shows which path a qp-pinned flow used


@dataclass(frozen=True)
class Gap:
    """Silence between two arrivals; an open side (``None`` PSN) is a window edge."""

    gap_s: float
    start_t: float
    end_t: float
    psn_before: int | None
    psn_after: int | None

    @property
    def edge(self) -> str | None:
        if self.psn_before is None and self.psn_after is None:
            return "window"  # nothing arrived at all
        if self.psn_before is None:
            return "start"
        if self.psn_after is None:
            return "end"
        return None

    def to_dict(self) -> dict:
        return {**asdict(self), "edge": self.edge}


@dataclass(frozen=True)
class Analysis:
    sent: int | None  # PSNs the sender used; None when nothing can be inferred
    sent_source: str  # "sender" (told by the sender) or "inferred" (from the PSN range)
    received: int  # every valid arrival, duplicates included
    unique: int
    lost: int
    reordered: int  # arrivals older than one already seen (not duplicates)
    duplicates: int
    unexpected: int  # PSNs outside the range the sender said it used
    blackout: Gap | None  # the longest gap; None with fewer than two time points
    top_gaps: tuple[Gap, ...]
    timeline_t0: float | None
    timeline: tuple[int, ...]  # arrivals per bin from timeline_t0
    bin_s: float
    latency_s: dict | None = field(default=None)  # min/p50/p99/max one-way latency

    def to_dict(self) -> dict:
        return {
            "sent": self.sent,
            "sent_source": self.sent_source,
            "received": self.received,
            "unique": self.unique,
            "lost": self.lost,
            "reordered": self.reordered,
            "duplicates": self.duplicates,
            "unexpected": self.unexpected,
            "blackout": self.blackout.to_dict() if self.blackout else None,
            "top_gaps": [g.to_dict() for g in self.top_gaps],
            "timeline": {
                "t0": self.timeline_t0,
                "bin_s": self.bin_s,
                "counts": list(self.timeline),
            },
            "latency_s": self.latency_s,
        }


def unwrap_psns(psns: Iterable[int], first_psn: int | None = None) -> list[int]:
    """Extend 24-bit PSNs to integers, each taken nearest to the highest seen so far.

    Makes arithmetic work across the 2^24 wrap (about 2.3 h at 2000 pkt/s, but
    a sender may start anywhere). ``first_psn`` anchors the first value, so a
    packet that is older than the first one sent cannot masquerade as new.
    """
    out: list[int] = []
    ref = first_psn
    for psn in psns:
        psn %= PSN_MOD
        if ref is None:
            ext = psn
        else:
            delta = (psn - ref) % PSN_MOD
            if delta >= _HALF:
                delta -= PSN_MOD
            ext = ref + delta
        out.append(ext)
        if ref is None or ext > ref:
            ref = ext
    return out


def _percentile(sorted_vals: Sequence[float], q: float) -> float:
    """Nearest-rank percentile; enough for latency summaries."""
    idx = max(0, min(len(sorted_vals) - 1, math.ceil(q * len(sorted_vals)) - 1))
    return sorted_vals[idx]


def analyse(
    arrivals: Sequence[Arrival],
    *,
    first_psn: int | None = None,
    sent: int | None = None,
    window: tuple[float, float] | None = None,
    bin_s: float = DEFAULT_BIN_S,
) -> Analysis:
    """Summarise arrivals (in receive order).

    ``first_psn`` and ``sent`` come from the sender when it told us (the
    receiver learns them from the sender's closing packet); without them, loss
    is inferred from the PSN range seen, which cannot see loss at either end.
    ``window`` (sender's first and last send times) makes silence before the
    first arrival and after the last count as gaps too.
    """
    if bin_s <= 0:
        raise ValueError("bin_s must be positive")
    if sent is not None and sent < 0:
        raise ValueError("sent must be >= 0")
    ext = unwrap_psns((a.psn for a in arrivals), first_psn)

    seen: set[int] = set()
    highest: int | None = None
    duplicates = reordered = 0
    for p in ext:
        if p in seen:
            duplicates += 1
            continue
        if highest is not None and p < highest:
            reordered += 1
        seen.add(p)
        highest = p if highest is None else max(highest, p)

    unexpected = 0
    if sent is not None:
        lo = first_psn if first_psn is not None else (min(seen) if seen else 0)
        in_range = sum(1 for p in seen if lo <= p < lo + sent)
        unexpected = len(seen) - in_range
        expected, sent_source = sent, "sender"
        lost = sent - in_range
    elif seen:
        lo = first_psn if first_psn is not None else min(seen)
        expected = max(seen) - lo + 1
        sent_source = "inferred"
        in_range = sum(1 for p in seen if p >= lo)
        unexpected = len(seen) - in_range
        lost = expected - in_range
    else:
        expected, sent_source, lost = None, "inferred", 0

    gaps = _gaps(arrivals, window)
    gaps_sorted = sorted(gaps, key=lambda g: (-g.gap_s, g.start_t))
    blackout = gaps_sorted[0] if gaps_sorted else None

    t0, counts = _timeline(arrivals, window, bin_s)

    lat = sorted(a.t - a.t_sent for a in arrivals if a.t_sent is not None)
    latency = (
        {
            "min": lat[0],
            "p50": _percentile(lat, 0.5),
            "p99": _percentile(lat, 0.99),
            "max": lat[-1],
        }
        if lat
        else None
    )

    return Analysis(
        sent=expected,
        sent_source=sent_source,
        received=len(arrivals),
        unique=len(seen),
        lost=lost,
        reordered=reordered,
        duplicates=duplicates,
        unexpected=unexpected,
        blackout=blackout,
        top_gaps=tuple(gaps_sorted[:TOP_GAPS]),
        timeline_t0=t0,
        timeline=tuple(counts),
        bin_s=bin_s,
        latency_s=latency,
    )


def _gaps(arrivals: Sequence[Arrival], window: tuple[float, float] | None) -> list[Gap]:
    """Gaps between arrivals sorted by receive time, plus the window's edges."""
    order = sorted(arrivals, key=lambda a: a.t)  # stable: equal times keep receive order
    gaps = [Gap(b.t - a.t, a.t, b.t, a.psn, b.psn) for a, b in itertools.pairwise(order)]
    if window is not None:
        w0, w1 = window
        if not order:
            gaps.append(Gap(max(0.0, w1 - w0), w0, w1, None, None))
        else:
            first, last = order[0], order[-1]
            gaps.append(Gap(max(0.0, first.t - w0), w0, first.t, None, first.psn))
            gaps.append(Gap(max(0.0, w1 - last.t), last.t, w1, last.psn, None))
    return gaps


def _timeline(
    arrivals: Sequence[Arrival], window: tuple[float, float] | None, bin_s: float
) -> tuple[float | None, list[int]]:
    times = [a.t for a in arrivals]
    if window is not None:
        t0 = min([window[0], *times])
        t1 = max([window[1], *times])
    elif times:
        t0, t1 = min(times), max(times)
    else:
        return None, []
    n = max(1, math.floor((t1 - t0) / bin_s) + 1)
    counts = [0] * n
    for t in times:
        counts[min(n - 1, int((t - t0) / bin_s))] += 1
    return t0, counts
