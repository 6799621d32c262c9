"""validate.schedule: a run's rates from its probe plan. Within the
per-host probe budget at any size, a burst long enough for the target loss
resolution on the least probed port (bounded by the window), and the
resolution it promises is the localiser's own detectable_loss."""

from __future__ import annotations

import math

import pytest

from linkpassd.validate.localize import detectable_loss, probes_for
from linkpassd.validate.plan import CablingPlan, PlannedPort
from linkpassd.validate.probeplan import ProbePlan
from linkpassd.validate.schedule import (
    BURST_PPS,
    HOST_BUDGET_PPS,
    MAX_BURST_SHARE,
    MIN_BURST_S,
    RATE_PPS,
    loads,
    schedule,
)


def plan(hosts: int, rails: int, per_leaf: int) -> ProbePlan:
    return ProbePlan.from_plan(CablingPlan(tuple(
        PlannedPort(f"h{h:04d}", f"eth{r}", f"leaf-r{r}-{h // per_leaf}", f"Ethernet{h % per_leaf + 1}",
                    f"rail{r}", 400_000) for r in range(rails) for h in range(hosts))))


def test_a_small_lab_probes_at_the_full_rates_and_its_burst_is_bounded_by_the_window():
    probes = plan(6, 2, 2)
    s = schedule(probes, 8.0)
    assert (s.rate_pps, s.burst_pps) == (RATE_PPS, BURST_PPS)
    host_load, port_load = loads(probes)
    assert (s.host_load, s.port_load) == (host_load, port_load) and 0 < port_load <= host_load
    # 0.1 % on a port of 3 pairs needs ~4.2 s of 500/s: more than 40 % of 8 s
    assert s.burst_s == pytest.approx(MAX_BURST_SHARE * 8.0)
    assert s.resolution == detectable_loss(math.floor(BURST_PPS * s.burst_s) * port_load)
    assert s.resolution < 0.01  # a 1 % lossy link shows within one run


def test_a_long_window_gets_the_burst_the_target_resolution_needs_and_no_more():
    probes = plan(6, 2, 2)
    s = schedule(probes, 60.0)
    needed = probes_for(0.001)
    assert MIN_BURST_S <= s.burst_s < MAX_BURST_SHARE * 60.0
    assert s.resolution <= 0.001
    assert s.port_load * BURST_PPS * (s.burst_s - 0.1) < needed  # rounded up to 0.1 s only


def test_at_scale_the_busiest_host_stays_within_its_probe_budget():
    probes = plan(512, 8, 32)
    s = schedule(probes, 30.0)
    assert s.host_load > 200  # ~17 pairs sent and ~17 answered per rail
    assert s.burst_pps < BURST_PPS and s.busiest_host_pps <= HOST_BUDGET_PPS * (1 + 1e-9)
    assert s.resolution <= 0.001 and s.burst_s <= MAX_BURST_SHARE * 30.0


def test_probes_for_is_the_inverse_of_detectable_loss():
    for loss in (0.1, 0.01, 0.003, 0.001):
        n = probes_for(loss)
        assert detectable_loss(n) <= loss < detectable_loss(n - 1)
    with pytest.raises(ValueError, match="loss must be in"):
        probes_for(0.0)
    with pytest.raises(ValueError, match="duration_s"):
        schedule(plan(2, 1, 2), 0.0)
