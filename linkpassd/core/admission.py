"""Which echo requests the responder answers, and how often.

With probing on every daemon answers UDP echo requests. Answered blindly that
is an open reflector: anyone who can reach the host could bounce traffic off
it, at spoofed victims, through its management address. So a request is
answered only when

* it was sent to one of the rails' addresses (never loopback, never the
  management network): probes test rails, nothing else needs an answer;
* its source lies inside `fabric_prefixes` or is a configured probe peer;
* its source has tokens left in its bucket (`rate_pps`, `burst`).

Replies are never larger than requests and never more than one per request
(the adapter's rule), so the worst an allowed source can do is bounce its own
rate-limited traffic back at itself.

Memory is bounded: at most `max_sources` buckets. The least recently used
bucket is evicted once its source has been silent for `idle_s` (it has
refilled by then: a fresh bucket says the same). Until one is, new sources
share one overflow bucket, so a spoofed-source flood from inside the fabric
neither grows the table nor multiplies the replies: it gets at most the
tracked buckets' bursts plus the overflow bucket's rate. (Evicting a bucket
as soon as it refilled would hand every spoofed source a fresh burst.) Real
peers probe every few tens of milliseconds, so they stay tracked.

Pure: addresses are IPv4 integers, `now` is passed in. The limiter is a
mutable object on purpose: it runs once per datagram on the responder's
thread, where a new frozen value per packet would cost more than the check.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

DEFAULT_RATE_PPS = 5000.0
DEFAULT_BURST = 1000
DEFAULT_MAX_SOURCES = 4096
IDLE_S = 5.0  # a source silent this long may lose its bucket to a new one


def ipv4_int(address: str) -> int:
    return int(ipaddress.IPv4Address(address))


@dataclass(frozen=True)
class ResponderPolicy:
    """What the responder answers. `local_addresses` None: any local address
    (only for the labs' stand-alone peer, which stands in for a whole host);
    the daemon always passes its rail addresses."""

    local_addresses: frozenset[str] | None = frozenset()
    fabric_prefixes: tuple[str, ...] = ()
    peers: frozenset[str] = frozenset()
    rate_pps: float = DEFAULT_RATE_PPS
    burst: int = DEFAULT_BURST
    max_sources: int = DEFAULT_MAX_SOURCES
    _nets: tuple[tuple[int, int], ...] = field(init=False, repr=False, compare=False)
    _peers: frozenset[int] = field(init=False, repr=False, compare=False)
    _locals: frozenset[bytes] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.rate_pps > 0 or self.burst < 1 or self.max_sources < 1:
            raise ValueError("need rate_pps > 0, burst >= 1 and max_sources >= 1")
        nets = tuple(ipaddress.IPv4Network(p) for p in self.fabric_prefixes)
        object.__setattr__(self, "_nets", tuple((int(n.network_address), int(n.netmask))
                                                for n in nets))
        object.__setattr__(self, "_peers", frozenset(ipv4_int(p) for p in self.peers))
        object.__setattr__(self, "_locals", None if self.local_addresses is None else frozenset(
            ipaddress.IPv4Address(a).packed for a in self.local_addresses))

    @classmethod
    def build(cls, local_addresses: Iterable[str] | None, fabric_prefixes: Iterable[str] = (),
              peers: Iterable[str] = (), **limits) -> "ResponderPolicy":
        return cls(None if local_addresses is None else frozenset(local_addresses),
                   tuple(fabric_prefixes), frozenset(peers), **limits)

    def answers_to(self, packed_destination: bytes) -> bool:
        """Is this (network byte order) destination one we answer on?"""
        return self._locals is None or packed_destination in self._locals

    def allows(self, source: int) -> bool:
        """May this source (an IPv4 integer) be answered at all?"""
        if source in self._peers:
            return True
        for net, mask in self._nets:
            if source & mask == net:
                return True
        return False

    @property
    def limits(self) -> tuple[float, int, int]:
        return self.rate_pps, self.burst, self.max_sources


class SourceLimiter:
    """A token bucket per source address, at most `max_sources` of them,
    plus one shared overflow bucket (see the module docstring)."""

    def __init__(self, rate_pps: float = DEFAULT_RATE_PPS, burst: int = DEFAULT_BURST,
                 max_sources: int = DEFAULT_MAX_SOURCES, idle_s: float = IDLE_S):
        self.rate = float(rate_pps)
        self.burst = float(burst)
        self.max_sources = max_sources
        self.idle_s = max(idle_s, burst / rate_pps)  # idle long enough to have refilled
        self._buckets: OrderedDict[int, list[float]] = OrderedDict()  # source -> [tokens, at]
        self._overflow = [self.burst, 0.0]
        self.evictions = 0
        self.overflowed = 0  # requests that used the shared bucket

    def __len__(self) -> int:
        return len(self._buckets)

    def allow(self, source: int, now: float) -> bool:
        """Take one token for `source` at `now`; False when it has none."""
        buckets = self._buckets
        bucket = buckets.get(source)
        if bucket is None:
            if len(buckets) >= self.max_sources and not self._evict_idle(now):
                self.overflowed += 1
                return self._take(self._overflow, now)
            bucket = buckets[source] = [self.burst, now]
        else:
            buckets.move_to_end(source)
        return self._take(bucket, now)

    def _take(self, bucket: list[float], now: float) -> bool:
        tokens = min(self.burst, bucket[0] + max(0.0, now - bucket[1]) * self.rate)
        bucket[1] = now
        if tokens < 1.0:
            bucket[0] = tokens
            return False
        bucket[0] = tokens - 1.0
        return True

    def _evict_idle(self, now: float) -> bool:
        """Drop the least recently used bucket if its source has been silent for `idle_s`."""
        source, (_tokens, at) = next(iter(self._buckets.items()))
        if now - at < self.idle_s:
            return False
        del self._buckets[source]
        self.evictions += 1
        return True
