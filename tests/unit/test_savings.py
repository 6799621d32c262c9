"""aggregator.savings: which events are absorbed failures, the GPUs behind them,
and the per-day summary (every day of the range, zeros included)."""

from types import SimpleNamespace

import pytest

from linkpassd._proto.linkpass.v1 import fleet_pb2
from linkpassd.aggregator.savings import absorbed, day_of, gpu_hours, gpus_for, summarize
from linkpassd.aggregator.store import DayTotal


@pytest.mark.parametrize("kind, rail, fields, expected", [
    ("rail_path", "rail0", {"path": "rail1", "cause": "carrier", "previous": "rail0"}, True),
    ("rail_path", "rail0", {"path": "rail1", "cause": "echo", "previous": "rail0"}, True),
    ("rail_path", "rail0", {"path": "rail1", "previous": "rail0"}, True),  # no cause: not a drain
    # a restart while failed over: counted when it happened, not again
    ("rail_path", "rail0", {"path": "rail1", "cause": "carried", "previous": "unknown"}, False),
    ("rail_path", "rail0", {"path": "rail1", "cause": "carrier"}, False),  # from nowhere known
    ("rail_path", "rail0", {"path": "rail2", "cause": "carrier", "previous": "rail1"}, False),
    ("rail_path", "rail0", {"path": "rail0", "cause": "recovered"}, False),  # the failback
    ("rail_path", "rail0", {"path": "none", "cause": "carrier"}, False),  # no path left: not absorbed
    ("rail_path", "rail0", {"path": "rail1", "cause": "drain"}, False),  # an operator's choice
    ("rail_path", "rail0", {"cause": "carrier"}, False),  # no path field at all
    ("rail_path", "rail0", {"path": "", "cause": "carrier"}, False),
    ("verdict", "rail0", {"path": "rail1", "cause": "carrier"}, False),  # another kind
    ("drain", "rail0", {"path": "rail1"}, False),
])
def test_absorbed_is_a_failover_to_another_rail_not_caused_by_a_drain(kind, rail, fields, expected):
    assert absorbed(kind, rail, fields) is expected


def test_gpus_come_from_the_inventory_and_default_to_one():
    inventory = fleet_pb2.Inventory(rails=[
        fleet_pb2.RailInventory(rail="rail0", port="eth1", gpus=8),
        fleet_pb2.RailInventory(rail="rail1", port="eth2"),  # gpus unset (0 in proto3)
    ])
    assert gpus_for(inventory.rails, "rail0") == 8
    assert gpus_for(inventory.rails, "rail1") == 1
    assert gpus_for(inventory.rails, "rail9") == 1  # a rail the inventory lacks
    assert gpus_for([], "rail0") == 1
    assert gpus_for([SimpleNamespace(rail="r", gpus=4)], "r") == 4  # anything with .rail and .gpus


def test_gpu_hours_are_gpus_times_restart_cost():
    assert gpu_hours(8, 30) == 4.0
    assert gpu_hours(1, 90) == 1.5
    assert gpu_hours(0, 30) == 0.0
    with pytest.raises(ValueError, match="gpus"):
        gpu_hours(-1, 30)
    with pytest.raises(ValueError, match="restart_cost_min"):
        gpu_hours(1, -5)


def test_days_are_utc():
    assert day_of(0) == "1970-01-01"
    assert day_of(1_767_225_599.9) == "2025-12-31"  # 23:59:59.9 UTC
    assert day_of(1_767_225_600) == "2026-01-01"  # midnight UTC, whatever the local zone


def test_summary_has_every_day_of_the_range_oldest_first_with_zeros():
    totals = [DayTotal("2026-02-27", 2, 16), DayTotal("2026-03-01", 1, 1),
              DayTotal("2026-02-20", 9, 9)]  # before the range: ignored
    assert summarize(totals, 30, days=4, today="2026-03-01") == [
        ("2026-02-26", 0, 0.0),
        ("2026-02-27", 2, 8.0),
        ("2026-02-28", 0, 0.0),  # across the month end (not a leap year)
        ("2026-03-01", 1, 0.5),
    ]


def test_summary_adds_up_totals_of_the_same_day():
    totals = [DayTotal("2026-01-01", 1, 2), DayTotal("2026-01-01", 3, 4)]
    assert summarize(totals, 60, days=1, today="2026-01-01") == [("2026-01-01", 4, 6.0)]


def test_summary_refuses_bad_arguments_naming_them():
    with pytest.raises(ValueError, match="days must be 1 or more, not 0"):
        summarize([], 30, days=0, today="2026-01-01")
    with pytest.raises(ValueError, match="'yesterday'"):
        summarize([], 30, days=1, today="yesterday")
