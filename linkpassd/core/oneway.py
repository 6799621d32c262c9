"""One-way delay of a path, where both hosts' clocks say how far off they may be.

A round trip needs one clock; a one-way delay needs two, and is only as good
as the two agree. So linkpassd reports one-way delays only with an error
bound: each host's clock synchronisation (chrony, ptp4l) says how far its
clock may be from true time, and a delay measured between two clocks is
within the sum of the two bounds. Without a bound on either side it reports
round trips only, and says why.

The samples (core.wire has the fields): our request carries our wall-clock
send time; the peer's responder answers with `forward` = its wall-clock
receive time minus that, and its own bound. The way back is then the round
trip (which already leaves out how long the peer held the request) minus
`forward`:

    forward = peer_rx - our_tx        (towards the peer)
    back    = our_rx - peer_tx = round trip - forward
    bound   = our bound + the peer's bound

A path keeps the last `WINDOW` samples (two small rings of integers, one
append each per reply) and reports their medians, computed only when read.
A median below -bound means a clock is further off than it says: refused,
named as such, never reported as a negative delay; one within the bound
below zero is reported as 0.

Our own bound comes from a reading (`ClockReading`) the daemon refreshes off
the hot path; between readings it grows by `DRIFT_PPM` of its age (a clock
free-running from its last correction), and a reading older than `STALE_S`
counts as none. Pure: samples, readings and `now` in; numbers and words out.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from linkpassd.core.model import OneWayDelay
from linkpassd.core.wire import FORWARD_LIMIT

CLOCK_SOURCES = ("auto", "chrony", "ptp4l", "none", "shared")
WINDOW = 64  # replies whose medians are reported
DRIFT_PPM = 1.0  # how fast a bound grows with its reading's age (chrony's default maxclockerror)
STALE_S = 30.0  # a reading older than this is no reading (the refresher has stopped answering)


@dataclass(frozen=True)
class ClockReading:
    """What this host's clock synchronisation said, as of `read_at`
    (monotonic seconds; None: a constant, e.g. "shared"): its error bound
    in ns, or None and why not."""

    source: str  # "chrony", "ptp4l", "shared", "none"
    bound_ns: int | None
    reason: str = ""  # why there is no bound ("" when there is)
    read_at: float | None = None
    drift_ppm: float = DRIFT_PPM  # growth of the bound per second of age, in ppm

    def bound_at(self, now: float) -> int | None:
        """The bound as of `now` (grown with age), None when there is none or
        the reading is stale (`why_not` says which)."""
        if self.bound_ns is None:
            return None
        if self.read_at is None:
            return self.bound_ns
        age = now - self.read_at
        if age > STALE_S:
            return None
        return self.bound_ns + round(max(0.0, age) * self.drift_ppm * 1e3)

    def why_not(self, now: float) -> str:
        """Why `bound_at(now)` is None ("" when it is not)."""
        if self.bound_ns is None:
            return self.reason or f"{self.source} reports no error bound"
        if self.read_at is not None and now - self.read_at > STALE_S:
            return (f"this host's clock bound ({self.source}) was last read "
                    f"{now - self.read_at:.0f} s ago, more than {STALE_S:g} s")
        return ""


NOT_CONFIGURED = ClockReading("none", None, "this host's clock is not used for one-way delay "
                              "([probes] clock = \"none\")")
SHARED = ClockReading("shared", 0)


def fixed_reading(source: str) -> ClockReading | None:
    """The reading of a source that needs no reading ("none", "shared");
    None for those that must be read (chrony, ptp4l, auto)."""
    if source == "shared":
        return SHARED
    if source == "none":
        return NOT_CONFIGURED
    return None


def median(values: deque[int]) -> int:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) // 2


@dataclass(slots=True)
class OneWay:
    """One path's one-way samples: fed every reply (`add` when it carries
    one-way fields, `plain` when it does not), read by `report`."""

    forward: deque[int] = field(default_factory=lambda: deque(maxlen=WINDOW))  # ns
    back: deque[int] = field(default_factory=lambda: deque(maxlen=WINDOW))  # ns
    peer_bound_ns: int | None = None  # the latest marked reply's; None: unsynchronised
    marked: int = 0  # replies with one-way fields
    plain: int = 0  # replies without (a responder from before them)

    def add(self, forward_ns: int, round_trip_ns: int, peer_bound_ns: int | None) -> None:
        """A reply with one-way fields: the peer's `forward_ns`, our round
        trip (without the peer's hold) and the peer's bound."""
        self.marked += 1
        self.peer_bound_ns = peer_bound_ns
        if peer_bound_ns is None:  # measured against a clock that says nothing: not kept
            if self.forward:
                self.forward.clear()
                self.back.clear()
            return
        self.forward.append(forward_ns)
        self.back.append(round_trip_ns - forward_ns)

    def copy(self) -> "OneWay":
        return OneWay(deque(self.forward, maxlen=WINDOW), deque(self.back, maxlen=WINDOW),
                      self.peer_bound_ns, self.marked, self.plain)

    def report(self, own: ClockReading, now: float) -> OneWayDelay:
        """The path's one-way delays with their bound as of `now`, or why not."""
        return judge(self.forward, self.back, own, now, self.peer_bound_ns, self.marked,
                     self.plain)


def _us(ns: int) -> str:
    return f"{ns / 1e3:.0f} us"


def judge(forward: deque[int], back: deque[int], own: ClockReading, now: float,
          peer_bound_ns: int | None, marked: int, plain: int) -> OneWayDelay:
    """One-way delays from the samples (module docstring), or the refusal."""
    n = len(forward)
    own_bound = own.bound_at(now)
    if own_bound is None:
        return OneWayDelay(refused=own.why_not(now), samples=n)
    if not marked:
        if plain:
            return OneWayDelay(refused="the peer's responder sends no timestamps (one from "
                                       "before one-way delay): round trip only")
        return OneWayDelay(refused="no reply yet")
    if peer_bound_ns is None:
        return OneWayDelay(refused="the peer's clock is not synchronised (its responder "
                                   "reports no error bound)")
    if not n:
        return OneWayDelay(refused="no reply with timestamps yet")
    bound = own_bound + peer_bound_ns
    if own.source == "shared" and own_bound == 0 and peer_bound_ns == 0:
        clocks = "shared"
    else:
        clocks = f"{own.source} ±{_us(own_bound)} here, ±{_us(peer_bound_ns)} at the peer"
    towards, away = median(forward), median(back)
    if abs(towards) >= FORWARD_LIMIT:
        return OneWayDelay(refused="the two clocks are more than 2.1 s apart, whatever they "
                                   f"say of themselves ({clocks})", samples=n)
    if towards < -bound or away < -bound:
        return OneWayDelay(refused=f"the clocks disagree by more than their bounds: towards "
                                   f"{_us(towards)}, back {_us(away)}, ±{_us(bound)} "
                                   f"({clocks}); a clock is further off than it says",
                           samples=n)
    return OneWayDelay(towards_s=max(0, towards) * 1e-9, back_s=max(0, away) * 1e-9,
                       bound_s=bound * 1e-9, clocks=clocks, samples=n)


def describe(delay: OneWayDelay | None, peer: str) -> str:
    """The operator's words: "one-way delay towards 198.18.1.7 41 us, back
    38 us, ±0 us (clocks: shared)" or "one-way delay not reported: why"."""
    if delay is None:
        return "one-way delay not reported: not measured on this path"
    if delay.refused or delay.towards_s is None or delay.back_s is None \
            or delay.bound_s is None:
        return f"one-way delay not reported: {delay.refused or 'no samples'}"
    return (f"one-way delay towards {peer} {delay.towards_s * 1e6:.0f} us, back "
            f"{delay.back_s * 1e6:.0f} us, ±{delay.bound_s * 1e6:.0f} us "
            f"(clocks: {delay.clocks})")
