"""Grouped bars of medians with min-max whiskers: how the benchmarks plot cells."""

from __future__ import annotations

from collections.abc import Sequence


def median_bars(ax, groups: Sequence[str], series: Sequence[tuple[str, Sequence[dict | None]]]) -> None:
    """One group of bars per x label; `series` is (label, one summary cell per
    group, with median_ms/min_ms/max_ms, or None where it was not run)."""
    width = 0.8 / len(series)
    for i, (label, cells) in enumerate(series):
        med = [c["median_ms"] if c else 0 for c in cells]
        low = [c["median_ms"] - c["min_ms"] if c else 0 for c in cells]
        high = [c["max_ms"] - c["median_ms"] if c else 0 for c in cells]
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(groups))]
        ax.bar(xs, med, width, yerr=[low, high], capsize=3, label=label)
    ax.set_xticks(range(len(groups)), groups)
    ax.legend()
