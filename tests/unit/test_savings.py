"""aggregator.savings: which events are facts of the accounting, when a
failover counts as absorbed (both directions) or outgoing only, the GPUs
behind it, and the per-day summary (every day of the range, zeros included)."""

import random
from types import SimpleNamespace

import pytest

from linkpassd._proto.linkpass.v1 import fleet_pb2
from linkpassd.aggregator.savings import (
    INCOMING_WITHIN_S,
    Fact,
    FactRow,
    count_days,
    day_of,
    fact,
    failover,
    gpu_hours,
    gpus_for,
    judge_boot,
    summarize,
)
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
def test_a_failover_is_a_move_to_another_rail_not_caused_by_a_drain(kind, rail, fields, expected):
    assert failover(kind, rail, fields) is expected
    assert fact(kind, rail, fields) is (Fact.FAILOVER if expected else None)


DETOUR = {"address": "198.18.1.1", "change": "detoured", "via": "rail1", "role": "detour", "previous": "rail0"}


@pytest.mark.parametrize("rail, fields, expected", [
    ("rail0", DETOUR, Fact.DETOURED),
    ("rail0", {**DETOUR, "previous": "none"}, Fact.DETOURED),  # from nowhere: still moved onto a healthy rail
    ("rail0", {**DETOUR, "change": "restored", "via": "rail0", "role": "owner"}, None),  # the way back
    ("rail0", {**DETOUR, "change": "announced", "via": "rail0", "role": "owner"}, None),
    ("rail0", {**DETOUR, "change": "withdrawn", "via": "none", "role": "none"}, None),  # announced nowhere
    ("rail0", {**DETOUR, "change": "detour_moved", "via": "rail2"}, None),  # a move between backups
    ("rail0", {**DETOUR, "via": "rail0"}, None),  # "detoured" onto its own rail: not a detour
    ("rail0", {**DETOUR, "via": "none"}, None),
    ("rail0", {**DETOUR, "via": ""}, None),
    ("", DETOUR, None),  # no rail: nothing to pair it with
    ("", {"frr": "ok", "table": "250", "problems": "none"}, Fact.FRR_OK),
    ("", {"frr": "missing", "table": "250", "problems": "FRR not running: bgpd"}, Fact.FRR_MISSING),
    ("", {"frr": "gone", "problems": "?"}, Fact.FRR_MISSING),  # a word this aggregator does not know
])
def test_announce_events_give_address_moves_and_frr_reports(rail, fields, expected):
    assert fact("announce", rail, fields) is expected
    assert fact("verdict", rail, fields) is None  # another kind with the same fields


T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC


def row(seq: int, what: Fact, wall: float, rail: str = "rail0", boot: str = "b1", gpus: int = 0) -> FactRow:
    return FactRow(host_id="h1", boot_id=boot, seq=seq, wall=T0 + wall, rail=rail, fact=str(what),
                   gpus=gpus, day=day_of(T0 + wall) if what == Fact.FAILOVER else "")


def counts(facts, since=T0, until=T0 + 86400):
    return [(t.day, t.failures_absorbed, t.gpus, t.failures_outgoing_only) for t in count_days(facts, since, until)]


def test_a_failover_without_an_address_move_is_outgoing_only():
    # the old rule counted this one as absorbed: the host's traffic moved, traffic to rail0 did not
    assert counts([row(5, Fact.FAILOVER, 10, gpus=8)]) == [("2026-01-01", 0, 0, 1)]


@pytest.mark.parametrize("move_seq, move_wall", [
    (6, 10.002),  # the announce step runs after the routes, in the same pass
    (4, 9.998),  # the address moved first (the route write was retried on the next pass)
    (6, 10 + INCOMING_WITHIN_S),  # at the edge of the window
    (4, 10 - INCOMING_WITHIN_S),
])
def test_a_failover_with_its_address_moved_through_a_healthy_rail_is_absorbed(move_seq, move_wall):
    facts = [row(5, Fact.FAILOVER, 10, gpus=8), row(move_seq, Fact.DETOURED, move_wall)]
    assert counts(facts) == [("2026-01-01", 1, 8, 0)]
    (outcome,) = judge_boot(facts)
    assert outcome.absorbed and outcome.incoming == facts[1]


def test_the_facts_of_one_boot_may_arrive_in_any_order():
    facts = [row(1, Fact.FRR_OK, 0), row(5, Fact.FAILOVER, 10, gpus=2), row(6, Fact.DETOURED, 10.01),
             row(9, Fact.FAILOVER, 50, rail="rail1", gpus=4), row(20, Fact.FAILOVER, 90, gpus=2),
             row(21, Fact.DETOURED, 90.01)]
    expected = counts(facts)
    assert expected == [("2026-01-01", 2, 4, 1)]
    for seed in range(20):
        shuffled = facts[:]
        random.Random(seed).shuffle(shuffled)
        assert counts(shuffled) == expected


@pytest.mark.parametrize("move", [
    row(6, Fact.DETOURED, 10 + INCOMING_WITHIN_S + 0.01),  # too late
    row(4, Fact.DETOURED, 10 - INCOMING_WITHIN_S - 0.01),  # too early
    row(6, Fact.DETOURED, 10.01, rail="rail1"),  # another rail's address
    row(6, Fact.DETOURED, 10.01, boot="b2"),  # another boot of the daemon
])
def test_an_address_move_that_is_not_this_failovers_does_not_count(move):
    assert counts([row(5, Fact.FAILOVER, 10), move]) == [("2026-01-01", 0, 0, 1)]


def test_a_rail_that_flaps_needs_an_address_move_for_each_failover():
    facts = [row(5, Fact.FAILOVER, 10), row(6, Fact.DETOURED, 10.01),
             row(8, Fact.FAILOVER, 12)]  # back and failed again 2 s later; its move was not made
    outcomes = judge_boot(facts)
    assert [o.absorbed for o in outcomes] == [True, False]
    assert counts(facts) == [("2026-01-01", 1, 0, 1)]


@pytest.mark.parametrize("frr, absorbed", [
    ([], True),  # FRR never reported missing: the daemon reports only problems and recoveries
    ([row(2, Fact.FRR_MISSING, 1)], False),  # stopped before the fault, still stopped
    ([row(2, Fact.FRR_MISSING, 1), row(3, Fact.FRR_OK, 2)], True),  # stopped and back before the fault
    ([row(7, Fact.FRR_MISSING, 11)], False),  # reported 1 s after the move (FRR stopped during the fault)
    ([row(7, Fact.FRR_MISSING, 10.01 + INCOMING_WITHIN_S + 1)], True),  # long after: the move had worked
    ([row(2, Fact.FRR_MISSING, 1), row(7, Fact.FRR_OK, 11)], False),  # back only after the move
])
def test_frr_must_be_announcing_when_the_address_moves(frr, absorbed):
    facts = [row(5, Fact.FAILOVER, 10, gpus=3), row(6, Fact.DETOURED, 10.01), *frr]
    (outcome,) = judge_boot(facts)
    assert outcome.absorbed is absorbed
    assert counts(facts) == [("2026-01-01", 1, 3, 0) if absorbed else ("2026-01-01", 0, 0, 1)]


def test_only_failovers_in_the_range_count_and_days_are_the_failovers():
    facts = [row(1, Fact.FAILOVER, -3600), row(2, Fact.DETOURED, -3599.99),  # the day before
             row(3, Fact.FAILOVER, 86399.999), row(4, Fact.DETOURED, 86400.001),  # its move is past midnight
             row(5, Fact.FAILOVER, 86400 + 5)]  # the next day
    assert counts(facts) == [("2026-01-01", 1, 0, 0)]
    assert counts(facts, T0 - 86400, T0 + 2 * 86400) == [
        ("2025-12-31", 1, 0, 0), ("2026-01-01", 1, 0, 0), ("2026-01-02", 0, 0, 1)]


def test_a_failover_outside_the_range_still_takes_its_own_address_move():
    # rail0 failed at 23:59:58 (move taken), back, and failed again at 00:00:01 without a move
    facts = [row(1, Fact.FAILOVER, -2), row(2, Fact.DETOURED, -1.99), row(4, Fact.FAILOVER, 1)]
    assert counts(facts) == [("2026-01-01", 0, 0, 1)]


def test_rows_of_an_unknown_fact_are_ignored():
    facts = [row(5, Fact.FAILOVER, 10), FactRow("h1", "b1", 6, T0 + 10.01, "rail0", "fenced")]
    assert counts(facts) == [("2026-01-01", 0, 0, 1)]


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
    totals = [DayTotal("2026-02-27", 2, 16, 3), DayTotal("2026-03-01", 1, 1),
              DayTotal("2026-02-20", 9, 9, 9)]  # before the range: ignored
    assert summarize(totals, 30, days=4, today="2026-03-01") == [
        ("2026-02-26", 0, 0.0, 0),
        ("2026-02-27", 2, 8.0, 3),
        ("2026-02-28", 0, 0.0, 0),  # across the month end (not a leap year)
        ("2026-03-01", 1, 0.5, 0),
    ]


def test_summary_adds_up_totals_of_the_same_day():
    totals = [DayTotal("2026-01-01", 1, 2, 1), DayTotal("2026-01-01", 3, 4, 2)]
    assert summarize(totals, 60, days=1, today="2026-01-01") == [("2026-01-01", 4, 6.0, 3)]


def test_outgoing_only_failures_save_no_gpu_hours():
    assert summarize([DayTotal("2026-01-01", 0, 0, 5)], 30, days=1, today="2026-01-01") == [
        ("2026-01-01", 0, 0.0, 5)]


def test_summary_refuses_bad_arguments_naming_them():
    with pytest.raises(ValueError, match="days must be 1 or more, not 0"):
        summarize([], 30, days=0, today="2026-01-01")
    with pytest.raises(ValueError, match="'yesterday'"):
        summarize([], 30, days=1, today="yesterday")
