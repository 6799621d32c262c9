"""The agent's on-disk spool: bounded (the oldest go, reported as a gap),
trimmed by acknowledgements, read back after a restart, and never broken by
a torn or corrupt record. Files only under tmp_path."""

from __future__ import annotations

import os

from linkpassd.agent.spool import HEADER, Cursor, Gap, Spool, SpoolWriter
from linkpassd.core.events import EventKind, EventLog


def events(n: int, boot: str = "boot-a", start: int = 0):
    log = EventLog(boot_id=boot, capacity=n + start + 1)
    out = [log.append(EventKind.SIGNAL, "e", wall=1.8e9 + i, mono=float(i), message=f"event {i}")
           for i in range(1, n + start + 1)]
    return out[start:]


def drain(spool: Spool, sent=None, sent_gaps=None, max_events=500):
    """Every batch the spool would send on one stream, as (boot, seqs, gap)."""
    cursor, sent, sent_gaps, out = Cursor(), sent or {}, sent_gaps or set(), []
    while (batch := spool.next_batch(cursor, sent, sent_gaps, max_events=max_events)) is not None:
        out.append((batch.boot_id, [e.seq for e in batch.events], batch.gap))
        cursor = batch.end
        if batch.events:
            sent[batch.boot_id] = batch.last_seq
        if batch.gap is not None:
            sent_gaps.add(batch.gap)
    return out


def opened(path, max_events=1000, segment_records=10) -> Spool:
    spool = Spool(str(path), max_events, segment_records=segment_records, fsync=False)
    spool.open()
    return spool


def test_events_come_back_in_order_in_batches_of_one_boot(tmp_path):
    spool = opened(tmp_path)
    spool.append(events(25))
    batches = drain(spool, max_events=10)
    assert [len(seqs) for _, seqs, _ in batches] == [10, 10, 5]
    assert [s for _, seqs, _ in batches for s in seqs] == list(range(1, 26))
    assert spool.pending == 25


def test_past_the_bound_the_oldest_are_dropped_and_reported_as_one_gap(tmp_path):
    spool = opened(tmp_path, max_events=100, segment_records=10)
    spool.append(events(135))
    assert spool.total <= 100 and spool.dropped == 40
    assert spool.gaps == [Gap("boot-a", 1, 40)]
    (boot, seqs, gap), *rest = drain(spool)
    assert gap == Gap("boot-a", 1, 40) and seqs[0] == 41
    assert [s for _, ss, _ in [(boot, seqs, gap), *rest] for s in ss] == list(range(41, 136))


def test_an_ack_trims_whole_segments_and_settles_gaps(tmp_path):
    spool = opened(tmp_path, max_events=100, segment_records=10)
    spool.append(events(120))  # 1..20 dropped: gap

    def files() -> list[str]:
        return sorted(f for f in os.listdir(tmp_path) if f.endswith(".seg"))

    before = files()
    spool.ack("boot-a", 45)  # segments 21-30 and 31-40 done; 41-50 half done
    assert len(files()) == len(before) - 2 and spool.gaps == []
    assert spool.pending == 75
    assert drain(spool)[0][1][0] == 46  # acked ones are never sent again
    spool.ack("boot-a", 120)
    assert files() == [] and spool.pending == 0


def test_a_restart_reads_back_what_was_not_acked_with_previous_boots(tmp_path):
    spool = opened(tmp_path)
    spool.append(events(30, boot="boot-old"))
    spool.ack("boot-old", 12)
    spool.close()
    again = opened(tmp_path)  # the acks were the old process's; Welcome says them again
    again.append(events(5, boot="boot-new"))
    batches = drain(again)
    assert [(b, s[0], s[-1]) for b, s, _ in batches] == [("boot-old", 11, 30), ("boot-new", 1, 5)]
    again.ack("boot-old", 30)  # what the aggregator's Welcome says it holds
    assert [(b, s[0]) for b, s, _ in drain(again)] == [("boot-new", 1)]


def test_a_torn_tail_is_dropped_and_counted(tmp_path):
    spool = opened(tmp_path)
    spool.append(events(7))
    spool.close()
    (seg,) = [tmp_path / f for f in os.listdir(tmp_path) if f.endswith(".seg")]
    data = seg.read_bytes()
    seg.write_bytes(data[:-5])  # the last record cut by a crash
    again = opened(tmp_path)
    assert again.torn == 1 and again.corrupt == 0
    assert [s for _, ss, _ in drain(again) for s in ss] == list(range(1, 7))
    again.append(events(2, start=7))  # 8, 9 go to a new segment, after the torn one
    assert [s for _, ss, _ in drain(again) for s in ss] == [1, 2, 3, 4, 5, 6, 8, 9]


def test_a_corrupt_record_is_skipped_and_counted_the_rest_is_read(tmp_path):
    spool = opened(tmp_path)
    spool.append(events(5))
    spool.close()
    (seg,) = [tmp_path / f for f in os.listdir(tmp_path) if f.endswith(".seg")]
    data = bytearray(seg.read_bytes())
    length, _crc = HEADER.unpack_from(data, 0)
    second = HEADER.size + length
    data[second + HEADER.size + 3] ^= 0xFF  # a flipped bit in record 2's payload
    seg.write_bytes(bytes(data))
    again = opened(tmp_path)
    assert again.corrupt == 1 and again.torn == 0
    assert [s for _, ss, _ in drain(again) for s in ss] == [1, 3, 4, 5]


def test_garbage_files_never_raise(tmp_path):
    (tmp_path / "0000000000000001.seg").write_bytes(os.urandom(3000))
    (tmp_path / "gaps.json").write_text("{not json")
    spool = opened(tmp_path)
    spool.append(events(3))
    assert [s for _, ss, _ in drain(spool) for s in ss] == [1, 2, 3]


def test_a_full_hand_off_drops_and_records_a_gap_that_precedes_the_rest(tmp_path):
    spool = opened(tmp_path)
    writer = SpoolWriter(spool, capacity=5)
    batch = events(12)
    writer.offer(batch[:8])  # 6..8 find the hand-off full
    assert writer.dropped == 3 and writer.gaps == [Gap("boot-a", 6, 8)]
    spool.append(*writer._take())
    writer.offer(batch[8:])
    spool.append(*writer._take())
    batches = drain(spool)
    assert [(seqs, gap) for _, seqs, gap in batches] == [
        ([1, 2, 3, 4, 5], None), ([9, 10, 11, 12], Gap("boot-a", 6, 8))]
    spool.ack("boot-a", 12)
    assert spool.gaps == []


def test_gaps_survive_a_restart_until_acked(tmp_path):
    spool = opened(tmp_path, max_events=100)
    spool.append(events(115))
    spool.close()
    again = opened(tmp_path, max_events=100)
    assert again.gaps == [Gap("boot-a", 1, 20)]
    assert drain(again)[0][2] == Gap("boot-a", 1, 20)


def test_a_gap_no_event_follows_is_sent_alone_and_settled(tmp_path):
    spool = opened(tmp_path)
    spool.append(events(3, boot="old"), gaps=[Gap("old", 4, 6)])
    assert [(b, s, g) for b, s, g in drain(spool)] == [("old", [1, 2, 3], None),
                                                      ("old", [], Gap("old", 4, 6))]
    spool.settle_gap(Gap("old", 4, 6))
    assert spool.gaps == [] and len(drain(spool)) == 1
