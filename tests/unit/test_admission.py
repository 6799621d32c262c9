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


def test_a_bucket_allows_its_burst_then_its_rate():
    limiter = SourceLimiter(rate_pps=100, burst=5)
    src = ipv4_int("198.18.0.2")
    assert [limiter.allow(src, 0.0) for _ in range(7)] == [True] * 5 + [False] * 2
    assert limiter.allow(src, 0.011)  # 1.1 tokens back after 11 ms
    assert not limiter.allow(src, 0.011)
    assert [limiter.allow(src, 10.0) for _ in range(6)] == [True] * 5 + [False]  # capped at burst


def test_a_spoofed_source_flood_neither_grows_the_table_nor_multiplies_replies():
    """100,000 requests from 100,000 sources in one second: the table stays at
    its bound, and beyond the tracked sources all share one overflow bucket."""
    limiter = SourceLimiter(rate_pps=10, burst=2, max_sources=64)
    answered = sum(limiter.allow(0xC6120000 + i, i * 1e-5) for i in range(100_000))
    assert len(limiter) == 64
    # 64 tracked sources x their burst, plus the overflow bucket's burst and 1 s of its rate.
    assert answered <= 64 * 2 + 2 + 10 + 1, answered
    assert limiter.overflowed == 100_000 - 64


def test_idle_buckets_are_evicted_so_new_sources_get_their_own():
    limiter = SourceLimiter(rate_pps=10, burst=2, max_sources=2, idle_s=5.0)
    a, b, c = (ipv4_int(f"198.18.0.{n}") for n in (1, 2, 3))
    assert limiter.allow(a, 0.0) and limiter.allow(b, 1.0)
    assert limiter.allow(c, 2.0) and limiter.overflowed == 1  # a refilled but not idle for 5 s
    assert limiter.allow(c, 5.5) and limiter.evictions == 1  # a silent 5.5 s: evicted, c tracked
    assert len(limiter) == 2 and limiter.overflowed == 1


@pytest.mark.parametrize("kw", [{"rate_pps": 0}, {"burst": 0}, {"max_sources": 0}])
def test_nonsense_limits_are_refused(kw):
    with pytest.raises(ValueError):
        ResponderPolicy(**kw)
