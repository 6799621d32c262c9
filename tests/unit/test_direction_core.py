"""core.direction and core.wire's receipts: which way a path loses packets,
from simulated exchanges (a responder that counts, a path that drops)."""

import random
import time

import pytest

from linkpassd.core import wire
from linkpassd.core.direction import Direction, Receipts, classify, describe, judge


def simulate(n, request_loss, reply_loss, seed=1, receipts=True, start_seq=1,
             modulo=2**32, late_every=0):
    """Send n probes over a path dropping requests and replies at random;
    the responder counts what it answered (core.wire). Returns the Receipts
    and the true (requests lost, replies lost) up to the last reply."""
    rng = random.Random(seed)
    r = Receipts(seq_modulo=modulo)
    answered = 0
    true_req = true_rep = 0
    pending_req = pending_rep = 0
    held_back = []
    for k in range(n):
        seq = (start_seq + k) % modulo
        if rng.random() < request_loss:
            pending_req += 1
            continue
        answered += 1
        field = wire.receipt_field(answered) if receipts else 0
        if rng.random() < reply_loss:
            pending_rep += 1
            continue
        reply = wire.EchoPacket(wire.KIND_REPLY, seq, 0, 1, 2, 0, field).encode()
        packet, why = wire.parse(reply)
        assert why == ""
        if late_every and k % late_every == 0 and held_back == []:
            held_back.append(packet)  # delivered after the next one
            pending_rep += 1
            continue
        r.on_reply(packet.seq, packet.received)
        true_req += pending_req
        true_rep += pending_rep
        pending_req = pending_rep = 0
        for late in held_back:
            r.on_reply(late.seq, late.received)
            true_rep -= 1
        held_back.clear()
    return r, (true_req, true_rep)


def test_wire_format_is_one_40_byte_packet_and_receipt_round_trips():
    assert wire.PACKET.size == wire.SIZE == 40
    p = wire.EchoPacket(wire.KIND_REPLY, 7, 123, 42, 9, 5, wire.receipt_field(70000))
    back, why = wire.parse(p.encode())
    assert why == "" and back == p
    assert back.received == 70000 % 2**15
    # A request, and a reply from a responder without receipts: no count.
    assert wire.EchoPacket(wire.KIND_REQUEST, 1, 2, 3).received is None
    assert wire.receipt_count(0) is None
    assert wire.receipt_count(wire.receipt_field(0)) == 0


def test_the_adapters_speak_the_one_format():
    from linkpassd.adapters import echo, echorail, echoresponder, valprober
    for mod in (echo, echoresponder, echorail, valprober):
        shared = [n for n in ("PACKET", "EchoPacket", "parse") if hasattr(mod, n)]
        assert shared, mod.__name__
        for name in shared:
            assert getattr(mod, name) is getattr(wire, name), (mod.__name__, name)


@pytest.mark.parametrize("req,rep,want", [(0.05, 0.0, Direction.REQUESTS),
                                          (0.0, 0.05, Direction.REPLIES),
                                          (0.05, 0.05, Direction.BOTH),
                                          (0.0, 0.0, Direction.NONE)])
def test_random_loss_each_way_is_classed_exactly(req, rep, want):
    r, (true_req, true_rep) = simulate(5000, req, rep, seed=3)
    assert (r.requests_lost, r.replies_lost) == (true_req, true_rep)
    assert r.direction() is want


def test_words_name_the_peer_and_the_direction():
    r, _ = simulate(3000, 0.02, 0.0)
    assert r.words("198.18.1.7").startswith("loss towards 198.18.1.7, replies fine")
    r, _ = simulate(3000, 0.0, 0.02)
    assert r.words("198.18.1.7").startswith("replies lost from 198.18.1.7")


def test_a_responder_without_receipts_is_round_trip_only_and_says_so():
    r, _ = simulate(500, 0.05, 0.0, receipts=False)
    assert r.direction() is Direction.UNKNOWN and r.round_trip_only
    assert "keeps no receipts (round trip only)" in r.words("198.18.1.7")
    assert (r.requests_lost, r.replies_lost) == (0, 0)
    assert "no reply with a receipt yet" in Receipts().words("198.18.1.7")


def test_counts_wrap_and_sequence_numbers_wrap():
    # More than 2^15 answered requests, and sequence numbers crossing 2^16.
    r, truth = simulate(40000, 0.01, 0.01, seed=5, start_seq=2**16 - 100, modulo=2**16)
    assert (r.requests_lost, r.replies_lost) == truth and r.resyncs == 0


def test_a_late_reply_is_taken_back_from_the_replies_lost():
    r, truth = simulate(2000, 0.0, 0.0, late_every=97)
    assert (r.requests_lost, r.replies_lost) == truth == (0, 0)


def test_a_whole_silence_is_classed_by_the_first_reply_after_it():
    r = Receipts()
    r.on_reply(1, wire.receipt_count(wire.receipt_field(1)))
    # Probes 2..101 all lost on the way back: the responder answered them all.
    assert r.on_reply(102, 102) == (0, 100)
    assert r.direction() is Direction.REPLIES
    r = Receipts()
    r.on_reply(1, 1)
    assert r.on_reply(102, 2) == (100, 0)  # none of them reached it
    assert r.direction() is Direction.REQUESTS


def test_unsent_probes_are_not_requests_lost():
    r = Receipts()
    r.on_reply(1, 1)
    r.on_unsent()
    r.on_unsent()
    assert r.on_reply(4, 2) == (0, 0)


def test_counts_that_do_not_add_up_class_nothing():
    # The responder restarted: its count starts again.
    assert classify(100, 500, 105, 3) is None
    r = Receipts()
    r.on_reply(100, 500)
    assert r.on_reply(105, 3) == (0, 0) and r.resyncs == 1
    assert r.on_reply(110, 6) == (2, 2)  # and the next pair classes again


def test_judge_names_one_direction_despite_the_odd_loss_the_other_way():
    assert judge(95, 5) is Direction.REQUESTS
    assert judge(5, 95) is Direction.REPLIES
    assert judge(70, 30) is Direction.BOTH
    assert "both ways" in describe(Direction.BOTH, "p", 3, 4)


# ---------------------------------------------------------------- the responder keeps receipts


def _responder():
    from test_probe import RAIL_POLICY, responder
    return responder(RAIL_POLICY)[0]


def test_the_responder_counts_answers_per_prober_socket():
    from test_probe import pktinfo_cmsg, request
    r = _responder()
    on_rail = [pktinfo_cmsg(5, "198.18.0.1")]
    for _ in range(3):
        r._answer(request(), on_rail, 0, ("198.18.0.2", 40000))
    r._answer(request(), on_rail, 0, ("198.18.0.2", 40001))  # another socket (a flow)
    r._answer(request(), on_rail, 0, ("198.18.0.3", 40000))  # another prober host
    counts = [wire.parse(data)[0].received for data, _anc, _addr in r.sock.sent]
    assert counts == [1, 2, 3, 1, 1]
    # A request it does not answer (a reply, a refused source) is not counted.
    r._answer(wire.EchoPacket(wire.KIND_REPLY, 1, 0, 42).encode(), on_rail, 0,
              ("198.18.0.2", 40000))
    r._answer(request(), on_rail, 0, ("198.18.0.2", 40000))
    assert wire.parse(r.sock.sent[-1][0])[0].received == 4


def test_the_batched_responder_keeps_the_same_receipts():
    from linkpassd.adapters import mmsg
    from test_probe import _fill, request
    if not mmsg.available():
        pytest.skip("no sendmmsg/recvmmsg in this libc")
    r = _responder()
    got = mmsg.RecvBatch(8, 48, 64)
    replies = mmsg.SendBatch(8, wire.PACKET.size, pktinfo=True)
    for i in range(3):
        _fill(got, i, request(7 + i), ("198.18.0.2", 40000), (5, "198.18.0.1"))
        r._answer_slot(got, i, replies, time.monotonic())
    counts = [wire.parse(bytes(replies.payload[i * 40:(i + 1) * 40]))[0].received
              for i in range(3)]
    assert counts == [1, 2, 3]


# ---------------------------------------------------------------- the path prober names it


def _run_path(request_loss, reply_loss, n=3000, receipts=True, seed=7):
    """A Prober over a simulated path (probes every 50 ms, replies 100 µs
    later) dropping each way at random; returns it."""
    from linkpassd.core.probe import ProbeConfig, Prober
    rng = random.Random(seed)
    p = Prober("198.18.1.7", ProbeConfig(max_loss_ratio=0.01, clear_loss_ratio=0.005))
    answered, now = 0, 0.0
    for _ in range(n):
        _, sends = p.poll(now)
        for send in sends:
            if rng.random() < request_loss:
                continue
            answered += 1
            if rng.random() < reply_loss:
                continue
            p.on_reply(send.seq, now + 0.0001, now, 0.0, answered % 2**15 if receipts else None)
        now += 0.010
    p.poll(now)
    return p


def test_a_lossy_path_names_the_direction_in_its_verdict():
    towards = _run_path(0.05, 0.0).assessment()
    assert towards.severity is not None and towards.status == "degraded"
    assert towards.direction == "requests"
    assert "loss towards 198.18.1.7, replies fine" in towards.detail
    back = _run_path(0.0, 0.05).assessment()
    assert back.direction == "replies" and "replies lost from 198.18.1.7" in back.detail
    old = _run_path(0.05, 0.0, receipts=False).assessment()
    assert old.direction == "unknown" and "round trip only" in old.detail
    clean = _run_path(0.0, 0.0).assessment()
    assert clean.status == "ok" and clean.direction == "none"


def test_an_outage_is_classed_by_the_first_reply_after_it():
    from linkpassd.core.probe import PathState, ProbeConfig, Prober
    for dead, want in (("requests", "loss towards 198.18.1.7"),
                       ("replies", "replies lost from 198.18.1.7")):
        p = Prober("198.18.1.7", ProbeConfig())
        answered, now = 0, 0.0
        for step in range(2000):
            _, sends = p.poll(now)
            outage = 500 <= step < 700
            for send in sends:
                if outage and dead == "requests":
                    continue
                answered += 1
                if outage:
                    continue
                p.on_reply(send.seq, now + 0.0001, now, 0.0, answered % 2**15)
            if step == 650:
                a = p.assessment()
                assert p.state is PathState.DOWN and a.direction == "unknown"
                assert "which way is unknown while nothing comes back" in a.detail
            now += 0.002
        assert p.state is PathState.UP
        assert "after DOWN; the outage was " + want in p.reason, p.reason


def test_the_rail_verdict_names_the_direction_its_troubled_paths_share():
    from linkpassd.core.model import Assessment, Verdict
    from linkpassd.core.railverdict import rail_assessment

    def path(peer, verdict, direction):
        return Assessment(f"probe:{peer}", verdict, "degraded", "", direction=direction)
    rail = rail_assessment([path("198.18.1.7", Verdict.DEGRADED, "requests"),
                            path("198.18.1.8", Verdict.DEGRADED, "requests"),
                            path("198.18.1.9", Verdict.UP, "none")])
    assert rail.severity is Verdict.DEGRADED and rail.direction == "requests"
    assert "loss towards the peers, replies fine (our transmit direction)" in rail.detail
    rail = rail_assessment([path("198.18.1.7", Verdict.DOWN, "replies"),
                            path("198.18.1.8", Verdict.DOWN, "replies")])
    assert rail.severity is Verdict.DOWN and rail.direction == "replies"
    assert "our receive direction" in rail.detail
    rail = rail_assessment([path("198.18.1.7", Verdict.DOWN, "unknown"),
                            path("198.18.1.8", Verdict.DOWN, "unknown")])
    assert rail.direction == "unknown" and "which way is unknown" in rail.detail
    mixed = rail_assessment([path("198.18.1.7", Verdict.DEGRADED, "requests"),
                             path("198.18.1.8", Verdict.DEGRADED, "replies")])
    assert "which way differs by peer (lost: 198.18.1.7 requests, 198.18.1.8 replies)" \
        in mixed.detail


def test_a_few_troubled_peers_are_named_as_theirs_not_our_rail_s():
    from linkpassd.core.model import Assessment, Verdict
    from linkpassd.core.railverdict import rail_assessment
    rail = rail_assessment([
        Assessment("probe:198.18.1.7", Verdict.DEGRADED, "degraded", "", direction="replies"),
        Assessment("probe:198.18.1.8", Verdict.UP, "ok", "", direction="none"),
        Assessment("probe:198.18.1.9", Verdict.UP, "ok", "", direction="none")])
    assert rail.severity is Verdict.UP and rail.direction == "replies"
    assert "trouble only towards 198.18.1.7 (their side); replies lost from 198.18.1.7, " \
        "requests reach them" in rail.detail
    assert "our receive direction" not in rail.detail


def test_a_later_fault_is_named_by_its_own_direction_not_mixed_with_an_earlier_one():
    """Requests lost for a while (degraded, "requests"), then repaired long
    enough for the degradation to clear, then replies lost: when the path
    degrades again it says "replies", not "both ways" (the railopt lab's
    second spine-link fault on the same paths read "loss both ways" while
    only replies were lost: the first fault's losses were still counted)."""
    from linkpassd.core.probe import ProbeConfig, Prober
    rng = random.Random(3)
    p = Prober("198.18.1.7", ProbeConfig())  # the lab's loss window and ratios
    answered, now = 0, 0.0
    degraded = []  # (status, direction) when the path turns degraded, and at each phase's end
    for request_loss, reply_loss, n in ((0.3, 0.0, 3000), (0.0, 0.0, 3000), (0.0, 0.3, 3000)):
        was = p.degraded
        for _ in range(n):
            _, sends = p.poll(now)
            for send in sends:
                if rng.random() < request_loss:
                    continue
                answered += 1
                if rng.random() < reply_loss:
                    continue
                p.on_reply(send.seq, now + 0.0001, now, 0.0, answered % 2**15)
            if p.degraded and not was:
                degraded.append(p.assessment().direction)
            was = p.degraded
            now += 0.010
    assert degraded == ["requests", "replies"], degraded
