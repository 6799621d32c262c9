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

Buckets a spoofed flood cannot drain for a known peer (issue 30). The
source address of a UDP request is not proof of who sent it: a flood that
claims a peer's rail address must not use up that peer's rate and starve its
real probes (the peer would fail a healthy rail over). So a source's rate is
kept per prober: every request carries its prober's 64-bit random id, and
each source has up to `ids_per_source` id slots, each its own bucket
(`rate_pps`, `burst`). A spoofer who does not know the real prober's id (it
cannot see it without being on the path, where it could drop the probes
anyway) drains only buckets of its own:

* a slot, once held, is kept until its id has been silent for `idle_s`: a
  real prober probes every few tens of milliseconds, so no flood, whatever
  the ids it uses, can take its slot or its tokens;
* an id is given a slot only when it is seen a second time (ids seen in the
  last second or so are remembered, a bounded set): a real prober repeats
  its id in every probe, a flood of random ids never repeats one, so it
  cannot fill the free slots ahead of a prober that (re)starts during it;
* a slot whose bucket refused a request lately (its id sends faster than
  the rate: no real prober does) may be taken by a new repeating id, which
  inherits its tokens (no fresh burst to win by churning ids);
* until its id has a slot, a request shares its source's bucket for unknown
  ids, and every source's unknown ids share one global bucket: answering a
  first request is a courtesy, the prober's next probe gets the slot.

What is left: an attacker who keeps `ids_per_source` ids of its own in a
peer's slots, each below the rate, before that peer's prober (re)starts,
makes the new prober share the unknown-id buckets until one of those slots
falls idle or is drained. Replies towards one source stay bounded by
(`ids_per_source` + 1) x the rate.

Memory is bounded: at most `max_sources` sources. The least recently used
source is evicted once it has been silent for `idle_s` (its buckets have
refilled by then: fresh ones say the same). Until one is, new sources share
one overflow bucket, so a spoofed-source flood from inside the fabric
neither grows the table nor multiplies the replies. (Evicting a source as
soon as it refilled would hand every spoofed source a fresh burst.) Real
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
IDLE_S = 5.0  # a source (or a prober id) silent this long may lose its bucket to a new one
DEFAULT_IDS_PER_SOURCE = 4  # prober ids with a bucket of their own, per source
DRAINED_S = 1.0  # a slot that refused a request this recently may go to a new id
SEEN_WINDOW_S = 1.0  # ids without a slot are remembered this long (two generations)...
SEEN_CAP = 32768  # ...or, in a flood of new ids, this many per generation
_NEVER = float("-inf")


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
              peers: Iterable[str] = (), *, rate_pps: float = DEFAULT_RATE_PPS, burst: int = DEFAULT_BURST,
              max_sources: int = DEFAULT_MAX_SOURCES) -> "ResponderPolicy":
        return cls(None if local_addresses is None else frozenset(local_addresses),
                   tuple(fabric_prefixes), frozenset(peers), rate_pps, burst, max_sources)

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


class _Source:
    """One source's buckets: `ids` (prober id -> [tokens, last request,
    last refusal]) and `unknown`, shared by its ids without a slot."""

    __slots__ = ("ids", "unknown", "at")

    def __init__(self, burst: float, now: float):
        self.ids: dict[int, list[float]] = {}
        self.unknown = [burst, now, _NEVER]
        self.at = now  # its last request, any id


class SourceLimiter:
    """Token buckets per (source, prober id), at most `ids_per_source` ids
    and `max_sources` sources, plus a bucket per source and one global
    bucket for ids without a slot, and one shared overflow bucket for
    sources beyond the table (see the module docstring)."""

    def __init__(self, rate_pps: float = DEFAULT_RATE_PPS, burst: int = DEFAULT_BURST,
                 max_sources: int = DEFAULT_MAX_SOURCES, idle_s: float = IDLE_S,
                 ids_per_source: int = DEFAULT_IDS_PER_SOURCE):
        if ids_per_source < 1:
            raise ValueError(f"ids_per_source must be >= 1, not {ids_per_source}")
        self.rate = float(rate_pps)
        self.burst = float(burst)
        self.max_sources = max_sources
        self.ids_per_source = ids_per_source
        self.idle_s = max(idle_s, burst / rate_pps)  # idle long enough to have refilled
        self._sources: OrderedDict[int, _Source] = OrderedDict()
        self._overflow = [self.burst, 0.0, _NEVER]
        self._unknown = [self.burst, 0.0, _NEVER]  # every source's ids without a slot
        # Ids without a slot seen lately (source << 64 | id): two generations.
        self._seen: set[int] = set()
        self._seen_before: set[int] = set()
        self._seen_since = 0.0
        self.evictions = 0  # sources evicted for a new one
        self.overflowed = 0  # requests that used the shared overflow bucket
        self.unslotted = 0  # requests whose id had no slot (the unknown-id buckets)
        self.taken_over = 0  # slots given to a new id because theirs sent too fast

    def __len__(self) -> int:
        return len(self._sources)

    def allow(self, source: int, prober_id: int, now: float) -> bool:
        """Take one token for `prober_id` from `source` at `now`; False when it has none."""
        sources = self._sources
        entry = sources.get(source)
        if entry is None:
            if len(sources) >= self.max_sources and not self._evict_idle(now):
                self.overflowed += 1
                return self._take(self._overflow, now)
            entry = sources[source] = _Source(self.burst, now)
        else:
            sources.move_to_end(source)
        entry.at = now
        bucket = entry.ids.get(prober_id)
        if bucket is None:
            bucket = self._slot(entry, source, prober_id, now)
            if bucket is None:
                self.unslotted += 1
                return self._take(entry.unknown, now) and self._take(self._unknown, now)
        return self._take(bucket, now)

    def slots(self, source: int) -> frozenset[int]:
        """The prober ids that hold a slot of `source` (for tests and status)."""
        entry = self._sources.get(source)
        return frozenset(entry.ids) if entry is not None else frozenset()

    def _slot(self, entry: _Source, source: int, prober_id: int, now: float) -> list[float] | None:
        """A slot for an id seen before (None: first sighting, or no slot to give)."""
        key = source << 64 | prober_id
        repeat = key in self._seen or key in self._seen_before
        if now - self._seen_since >= SEEN_WINDOW_S or len(self._seen) >= SEEN_CAP:
            self._seen_before, self._seen, self._seen_since = self._seen, set(), now
        self._seen.add(key)
        if not repeat:
            return None
        self._seen.discard(key)
        self._seen_before.discard(key)
        ids = entry.ids
        if len(ids) >= self.ids_per_source:
            drained = None
            for other, b in ids.items():
                if now - b[1] >= self.idle_s:  # silent: refilled, a fresh bucket says the same
                    del ids[other]
                    break
                if drained is None and now - b[2] < DRAINED_S:
                    drained = other
            else:
                if drained is None:
                    return None
                b = ids.pop(drained)
                self.taken_over += 1
                bucket = ids[prober_id] = [min(self.burst, b[0] + (now - b[1]) * self.rate),
                                           now, _NEVER]
                return bucket
        bucket = ids[prober_id] = [self.burst, now, _NEVER]
        return bucket

    def _take(self, bucket: list[float], now: float) -> bool:
        tokens = min(self.burst, bucket[0] + max(0.0, now - bucket[1]) * self.rate)
        bucket[1] = now
        if tokens < 1.0:
            bucket[0] = tokens
            bucket[2] = now
            return False
        bucket[0] = tokens - 1.0
        return True

    def _evict_idle(self, now: float) -> bool:
        """Drop the least recently used source if it has been silent for `idle_s`."""
        source, entry = next(iter(self._sources.items()))
        if now - entry.at < self.idle_s:
            return False
        del self._sources[source]
        self.evictions += 1
        return True
