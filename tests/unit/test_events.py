"""core.events: sequence numbers without gaps, a bounded buffer, and readers
told exactly how many events they missed."""

import pytest

from linkpassd.core.events import EventKind, EventLog, Severity


def filled(n: int, capacity: int = 8) -> EventLog:
    log = EventLog(boot_id="b1", capacity=capacity)
    for i in range(n):
        log.append(EventKind.VERDICT, "port_verdict", wall=100.0 + i, mono=5.0 + i, port=f"eth{i}")
    return log


def test_sequence_numbers_count_from_one_without_gaps_and_carry_the_boot_id():
    log = filled(5)
    events, missed = log.after(0)
    assert [e.seq for e in events] == [1, 2, 3, 4, 5] and missed == 0
    assert {e.boot_id for e in events} == {"b1"} and log.last_seq == 5


def test_a_reader_behind_the_buffer_is_told_how_many_it_missed():
    log = filled(20, capacity=8)  # holds 13..20
    assert log.first_seq == 13
    events, missed = log.after(4)  # saw 1..4; 5..12 are gone
    assert missed == 8 and [e.seq for e in events] == list(range(13, 21))
    events, missed = log.after(12)
    assert missed == 0 and events[0].seq == 13


def test_after_the_newest_there_is_nothing_and_nothing_missed():
    log = filled(3)
    assert log.after(3) == ([], 0)
    assert log.after(7) == ([], 0)  # a reader ahead (another boot's numbers) misses nothing here


def test_limit_returns_the_oldest_first():
    events, _ = filled(6).after(2, limit=2)
    assert [e.seq for e in events] == [3, 4]


def test_fields_keep_their_order_and_become_text():
    log = EventLog(capacity=4)
    e = log.append(EventKind.RAIL_PATH, "rail_path", wall=1.0, mono=2.0, severity=Severity.WARNING,
                   table=10100, members=["a", "b"], ratio=0.25)
    assert e.fields == (("table", "10100"), ("members", "a,b"), ("ratio", "0.25"))
    assert e.field("members") == "a,b" and e.field("absent", "-") == "-"
    assert len(log.boot_id) == 32 and EventLog().boot_id != log.boot_id


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        EventLog(capacity=0)
    with pytest.raises(ValueError):
        filled(1).after(-1)
    with pytest.raises(ValueError):
        EventLog().append("no-such-kind", "x", wall=0.0, mono=0.0)
