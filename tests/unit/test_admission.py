"""The echo responder's admission rules (core.admission): where, who, how often."""

from __future__ import annotations

import pytest

from linkpassd.core.admission import ResponderPolicy, SourceLimiter, ipv4_int


def test_sources_are_allowed_by_prefix_or_as_configured_peers():
    policy = ResponderPolicy.build({"198.18.0.1"}, ["198.18.0.0/16", "10.1.0.0/24"],
                                   peers={"198.19.3.3"})
    allowed = ["198.18.0.2", "198.18.255.255", "10.1.0.9", "198.19.3.3"]
    refused = ["198.19.0.1", "198.19.3.4", "10.1.1.0", "127.0.0.1", "0.0.0.0"]
    assert [policy.allows(ipv4_int(a)) for a in allowed] == [True] * 4
    assert [policy.allows(ipv4_int(a)) for a in refused] == [False] * 5


def test_without_prefixes_only_peers_are_answered():
    policy = ResponderPolicy.build({"198.18.0.1"}, (), peers={"198.18.9.9"})
    assert policy.allows(ipv4_int("198.18.9.9")) and not policy.allows(ipv4_int("198.18.9.8"))


def test_only_rail_addresses_are_answered_on_unless_any_is_asked_for():
    policy = ResponderPolicy.build({"198.18.0.1"}, ["198.18.0.0/16"])
    assert policy.answers_to(bytes([198, 18, 0, 1]))
    assert not policy.answers_to(bytes([127, 0, 0, 1])) and not policy.answers_to(b"")
    assert ResponderPolicy.build(None).answers_to(bytes([127, 0, 0, 1]))
    assert not ResponderPolicy().allows(ipv4_int("198.18.0.2"))  # the default answers nobody


ID = 0x1D  # a prober's id
A = ipv4_int("198.18.0.2")  # a peer's rail address


def test_a_prober_id_gets_its_own_bucket_on_its_second_request():
    limiter = SourceLimiter(rate_pps=100, burst=5)
    assert limiter.allow(A, ID, 0.0) and limiter.slots(A) == frozenset()  # first sighting
    assert limiter.allow(A, ID, 0.0) and limiter.slots(A) == {ID}
    assert limiter.unslotted == 1


def test_a_bucket_allows_its_burst_then_its_rate():
    limiter = SourceLimiter(rate_pps=100, burst=5)
    limiter.allow(A, ID, 0.0)  # the first request: the unknown-id buckets
    assert [limiter.allow(A, ID, 0.0) for _ in range(7)] == [True] * 5 + [False] * 2
    assert limiter.allow(A, ID, 0.011)  # 1.1 tokens back after 11 ms
    assert not limiter.allow(A, ID, 0.011)
    assert [limiter.allow(A, ID, 10.0) for _ in range(6)] == [True] * 5 + [False]  # capped at burst


def flood(limiter, start: float, seconds: float, pps: float, ids) -> int:
    """`pps` requests claiming source A, prober ids from `ids`; how many answered."""
    n, answered = int(seconds * pps), 0
    for i in range(n):
        answered += limiter.allow(A, next(ids), start + i / pps)
    return answered


def probes(limiter, start: float, seconds: float, interval: float) -> list[bool]:
    return [limiter.allow(A, ID, start + k * interval) for k in range(int(seconds / interval))]


def interleaved(limiter, start, seconds, pps, ids, interval=0.010) -> list[bool]:
    """A flood and the real prober (every `interval`) in time order: the prober's results."""
    real, step, k, i = [], 1 / pps, 0, 0
    while True:
        t_flood, t_real = start + i * step, start + k * interval
        if min(t_flood, t_real) >= start + seconds:
            return real
        if t_real <= t_flood:
            real.append(limiter.allow(A, ID, t_real))
            k += 1
        else:
            limiter.allow(A, next(ids), t_flood)
            i += 1


def random_ids(seed=7):
    import random
    rng = random.Random(seed)
    while True:
        yield rng.getrandbits(64)


def fixed_ids(*ids):
    while True:
        yield from ids


@pytest.mark.parametrize("ids", ["one spoofed id", "random ids", "both"])
def test_a_spoofed_flood_with_a_peers_address_does_not_starve_its_prober(ids):
    """40,000 requests a second claiming A's address (issue 30): the real
    prober, answered before the flood, keeps every answer through it."""
    limiter = SourceLimiter()  # the daemon's defaults: 5,000/s, burst 1,000
    assert all(probes(limiter, 0.0, 1.0, 0.010))
    gen = {"one spoofed id": fixed_ids(0x4C50), "random ids": random_ids(),
           "both": (x for pair in zip(fixed_ids(0x4C50, 0x4C51, 0x4C52, 0x4C53), random_ids())
                    for x in pair)}[ids]
    real = interleaved(limiter, 1.0, 2.0, 40_000, gen)
    assert len(real) == 200 and all(real), real.count(False)
    assert ID in limiter.slots(A)


def test_a_prober_that_starts_during_a_random_id_flood_gets_its_slot_on_its_second_probe():
    limiter = SourceLimiter()
    gen = random_ids()
    flood(limiter, 0.0, 1.0, 40_000, gen)
    real = interleaved(limiter, 1.0, 1.0, 40_000, gen)
    assert all(real[1:]), real.index(False, 1)  # the first may find the unknown-id bucket empty
    assert ID in limiter.slots(A)


def test_a_flooded_slot_may_go_to_a_new_prober_but_with_no_fresh_burst():
    """Four spoofed ids flooding hold every slot of A; the real prober (new,
    e.g. after a restart) takes a drained one on its second probe, and ids
    churning through slots win no more answers than the rate."""
    limiter = SourceLimiter(rate_pps=5000, burst=1000, ids_per_source=4)
    spoofed = fixed_ids(1, 2, 3, 4)
    answered = flood(limiter, 0.0, 1.0, 40_000, spoofed)
    assert limiter.slots(A) == {1, 2, 3, 4}
    # 4 slots: their bursts and 1 s of their rates, plus the unknown-id bucket.
    assert answered <= 4 * (1000 + 5000) + 1000 + 5000, answered
    real = interleaved(limiter, 1.0, 1.0, 40_000, spoofed)
    assert all(real[1:]) and ID in limiter.slots(A)
    assert limiter.taken_over >= 1
    churn = fixed_ids(*range(10, 30))  # 20 ids cycling through 3 slots
    answered = flood(limiter, 2.0, 1.0, 40_000, churn)
    assert answered <= 4 * 5000 + 5000 + 1000, answered


def test_replies_towards_one_source_stay_bounded_whatever_the_ids():
    limiter = SourceLimiter(rate_pps=1000, burst=100, ids_per_source=4)
    answered = flood(limiter, 0.0, 2.0, 40_000, random_ids())
    # Random ids never repeat: only the unknown-id buckets answer them.
    assert answered <= 100 + 2 * 1000 + 1, answered
    assert len(limiter.slots(A)) == 0


def test_the_unknown_id_bucket_is_global_across_sources():
    limiter = SourceLimiter(rate_pps=10, burst=2)
    answered = sum(limiter.allow(ipv4_int(f"198.18.0.{n}"), n, 0.0) for n in range(1, 9))
    assert answered == 2  # 8 sources' first requests, one global bucket of 2


def test_remembered_ids_are_bounded():
    from linkpassd.core import admission
    limiter = SourceLimiter()
    for i in range(3 * admission.SEEN_CAP):
        limiter.allow(A, i, 0.0)
    assert len(limiter._seen) <= admission.SEEN_CAP
    assert len(limiter._seen_before) <= admission.SEEN_CAP


def test_a_spoofed_source_flood_neither_grows_the_table_nor_multiplies_replies():
    """100,000 requests from 100,000 sources in one second: the table stays at
    its bound, and beyond the tracked sources all share one overflow bucket."""
    limiter = SourceLimiter(rate_pps=10, burst=2, max_sources=64)
    answered = sum(limiter.allow(0xC6120000 + i, ID, i * 1e-5) for i in range(100_000))
    assert len(limiter) == 64
    # The unknown-id bucket's burst and 1 s of its rate, plus the overflow bucket's.
    assert answered <= 2 + 10 + 1 + 2 + 10 + 1, answered
    assert limiter.overflowed == 100_000 - 64


def test_idle_sources_are_evicted_so_new_sources_get_their_own():
    limiter = SourceLimiter(rate_pps=10, burst=2, max_sources=2, idle_s=5.0)
    a, b, c = (ipv4_int(f"198.18.0.{n}") for n in (1, 2, 3))
    assert limiter.allow(a, ID, 0.0) and limiter.allow(b, ID, 1.0)
    assert limiter.allow(c, ID, 2.0) and limiter.overflowed == 1  # a refilled but not idle for 5 s
    assert limiter.allow(c, ID, 5.5) and limiter.evictions == 1  # a silent 5.5 s: evicted, c tracked
    assert len(limiter) == 2 and limiter.overflowed == 1


def test_an_idle_prober_id_gives_its_slot_to_a_new_one():
    limiter = SourceLimiter(rate_pps=10, burst=2, ids_per_source=1, idle_s=5.0)
    assert limiter.allow(A, 1, 0.0) and limiter.allow(A, 1, 0.1)
    assert limiter.slots(A) == {1}
    limiter.allow(A, 2, 1.0), limiter.allow(A, 2, 1.1)
    assert limiter.slots(A) == {1}  # 1 is neither idle nor drained: it keeps its slot
    limiter.allow(A, 2, 6.0), limiter.allow(A, 2, 6.1)
    assert limiter.slots(A) == {2}


@pytest.mark.parametrize("kw", [{"rate_pps": 0}, {"burst": 0}, {"max_sources": 0}])
def test_nonsense_limits_are_refused(kw):
    with pytest.raises(ValueError):
        ResponderPolicy(**kw)


def test_nonsense_ids_per_source_is_refused():
    with pytest.raises(ValueError, match="ids_per_source"):
        SourceLimiter(ids_per_source=0)
