"""The blackhole split bench's pure parts: a blackout cut at the chain's
first probe and at its probe a tolerance later, and the summary."""

from __future__ import annotations

import pytest

from labs.bench.blackhole_split import PARTS, split, summarise

T = 0.030  # tolerance, s


def grid(first: float, spacing: float = 0.00375, n: int = 9) -> list[float]:
    return [first + k * spacing for k in range(n)]


def test_the_parts_are_cut_at_the_first_probe_and_the_one_a_tolerance_later():
    sends = [9.995, *grid(10.004)]  # a steady probe before the injection, then the chain
    s = split(sends, injected_at=10.0, moved_at=10.040, restored_at=10.0415, tolerance_s=T)
    assert s.met_ms == pytest.approx(4.0)
    assert s.chain_ms == pytest.approx(30.0)
    assert s.reaction_ms == pytest.approx(6.0)
    assert s.after_ms == pytest.approx(1.5)
    assert s.probes == 9
    assert s.longest_gap_ms == pytest.approx(3.75)


def test_a_late_grid_point_is_the_chains_end_and_a_point_a_hair_early_still_counts():
    late = [10.001, 10.010, 10.0325]  # the loop ran 1.5 ms late for the last point
    late_split = split(late, 10.0, 10.040, 10.041, T)
    assert late_split.chain_ms == pytest.approx(31.5)
    assert late_split.longest_gap_ms == pytest.approx(22.5)
    early = [10.001, 10.031 - 5e-5]  # float noise below the grid point
    assert split(early, 10.0, 10.040, 10.041, T).chain_ms == pytest.approx(30.0 - 0.05)


def test_a_capture_without_a_chain_before_the_move_is_refused_by_name():
    with pytest.raises(ValueError, match="no probe was sent after the injection"):
        split([9.99], 10.0, 10.040, 10.041, T)
    with pytest.raises(ValueError, match="no probe a tolerance"):
        split([10.001, 10.020], 10.0, 10.040, 10.041, T)
    with pytest.raises(ValueError, match="before the move"):  # the chain ended after the move
        split(grid(10.020), 10.0, 10.040, 10.041, T)


def test_the_summary_takes_medians_over_the_trials_that_split():
    rows = [{"mechanism": "linkpassd-10", "blackout_ms": b,
             "split": {"met_ms": m, "chain_ms": 30.0, "reaction_ms": 5.0, "after_ms": 1.0}}
            for m, b in ((1.0, 38.0), (5.0, 42.0), (9.0, 46.0))]
    rows.append({"mechanism": "linkpassd-10", "blackout_ms": 44.0, "error": "lph1 did not move"})
    cell = summarise(rows)["linkpassd-10"]
    assert (cell["trials"], cell["split"]) == (4, 3)
    assert cell["met"] == {"median_ms": 5.0, "min_ms": 1.0, "max_ms": 9.0}
    assert cell["blackout"]["median_ms"] == 42.0
    assert set(PARTS) <= set(cell)
