"""Lab traffic without a network: blackout math, the RoCEv2 codec, the ACK timer, the CLIs."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labs.traffic import packets as P
from labs.traffic.addresses import AddressError, lab_address
from labs.traffic.analysis import PSN_MOD, Arrival, analyse, unwrap_psns
from labs.traffic.qp import AckTracker
from labs.traffic.receiver import ReceiverConfig, Responder

SRC, DST = "198.18.0.1", "198.18.1.2"
RX_QP, TX_QP = 0x12, 0x11


def stream(psns, *, t0=100.0, dt=0.001, times=None):
    """Arrivals for ``psns``, one every ``dt`` unless ``times`` is given."""
    times = times if times is not None else [t0 + i * dt for i in range(len(psns))]
    return [Arrival(t, p % PSN_MOD, t_sent=t - 0.0001) for t, p in zip(times, psns, strict=True)]


# ------------------------------------------------------------------ analysis


def test_clean_stream_has_no_loss_and_a_blackout_of_one_interval():
    a = analyse(stream(range(1000)), first_psn=0, sent=1000)
    assert (a.lost, a.reordered, a.duplicates, a.unique, a.received) == (0, 0, 0, 1000, 1000)
    assert a.blackout.gap_s == pytest.approx(0.001)
    assert a.sent_source == "sender"


def test_gap_in_the_middle_is_the_blackout_with_the_psns_either_side():
    psns = [*range(0, 100), *range(200, 300)]
    times = [100 + i * 0.001 for i in range(100)] + [100.2 + i * 0.001 for i in range(100)]
    a = analyse(stream(psns, times=times), first_psn=0, sent=300)
    b = a.blackout
    assert (b.psn_before, b.psn_after, b.edge) == (99, 200, None)
    assert b.gap_s == pytest.approx(0.2 - 0.099)
    assert (b.start_t, b.end_t) == (pytest.approx(100.099), pytest.approx(100.2))
    assert a.lost == 100
    assert a.top_gaps[0] == b


def test_gap_at_the_start_needs_the_window_to_be_seen():
    arrivals = stream(range(50, 100), t0=100.05)  # PSNs 0..49 (sent from t=100.0) never arrived
    seen = analyse(arrivals, first_psn=0, sent=100, window=(100.0, 100.099))
    assert seen.blackout.edge == "start"
    assert (seen.blackout.psn_before, seen.blackout.psn_after) == (None, 50)
    assert seen.blackout.gap_s == pytest.approx(0.05)
    assert seen.lost == 50
    blind = analyse(arrivals)  # no sender information: neither the gap nor the loss is visible
    assert blind.lost == 0 and blind.sent_source == "inferred"
    assert blind.blackout.gap_s == pytest.approx(0.001)
    assert analyse(arrivals, first_psn=0).lost == 50  # a known first PSN exposes the loss


def test_gap_at_the_end():
    arrivals = stream(range(70))  # 70..99 lost; the sender's last send was at 100.099
    a = analyse(arrivals, first_psn=0, sent=100, window=(100.0, 100.099))
    assert a.blackout.edge == "end"
    assert (a.blackout.psn_before, a.blackout.psn_after) == (69, None)
    assert a.blackout.gap_s == pytest.approx(0.099 - 0.069)
    assert a.lost == 30


def test_reordering_is_counted_once_per_late_packet():
    a = analyse(stream([0, 1, 3, 2, 4, 6, 5, 7]), first_psn=0, sent=8)
    assert (a.reordered, a.lost, a.duplicates) == (2, 0, 0)


def test_duplicates_are_not_loss_and_not_reordering():
    a = analyse(stream([0, 1, 1, 2, 2, 2, 3]), first_psn=0, sent=4)
    assert (a.duplicates, a.reordered, a.lost, a.unique, a.received) == (3, 0, 0, 4, 7)


def test_zero_arrivals():
    empty = analyse([])
    assert (empty.blackout, empty.lost, empty.sent, empty.timeline) == (None, 0, None, ())
    told = analyse([], first_psn=0, sent=100, window=(5.0, 6.0))
    assert told.lost == 100
    assert told.blackout.gap_s == pytest.approx(1.0) and told.blackout.edge == "window"
    assert sum(told.timeline) == 0


def test_single_arrival_has_no_gap_without_a_window():
    assert analyse(stream([0])).blackout is None


def test_psn_wraps_around_2_to_the_24():
    first = PSN_MOD - 5
    a = analyse(stream([first + i for i in range(10)]), first_psn=first, sent=10)
    assert (a.lost, a.reordered, a.unexpected) == (0, 0, 0)
    assert unwrap_psns([PSN_MOD - 1, 0, 1], PSN_MOD - 1) == [PSN_MOD - 1, PSN_MOD, PSN_MOD + 1]


def test_packets_outside_the_senders_range_are_unexpected_not_received_loss():
    a = analyse(stream([0, 1, 2, 50]), first_psn=0, sent=3)
    assert (a.lost, a.unexpected) == (0, 1)


def test_timeline_counts_per_bin():
    # 2000 pkt/s for one second, each mid-interval so none sits on a bin edge.
    arrivals = stream(range(2000), times=[100 + (i + 0.5) * 0.0005 for i in range(2000)])
    a = analyse(arrivals, bin_s=0.1, window=(100.0, 100.9999))
    assert a.timeline_t0 == 100.0
    assert list(a.timeline) == [200] * 10
    assert (
        analyse(arrivals, bin_s=0.1).timeline_t0 == arrivals[0].t
    )  # no window: from the first arrival


def test_latency_summary_uses_send_times():
    a = analyse([Arrival(1.0 + i, i, t_sent=1.0 + i - 0.002) for i in range(5)])
    assert a.latency_s["min"] == pytest.approx(0.002) and a.latency_s["max"] == pytest.approx(0.002)


def test_report_dict_is_json_shaped():
    d = analyse(stream(range(3)), first_psn=0, sent=4, window=(100.0, 100.003)).to_dict()
    assert d["lost"] == 1 and d["blackout"]["edge"] in (None, "start", "end")
    assert set(d["timeline"]) == {"t0", "bin_s", "counts"}


# ------------------------------------------------------------------ packets


def data_payload(seq=0):
    return P.encode_data_payload(0xC0FFEE, 123_456_789 + seq)


def scapy_bytes(**kw):
    from scapy.compat import raw

    return raw(P.scapy_packet(SRC, DST, **kw))


def test_scapy_built_data_packet_parses_back():
    wire = scapy_bytes(dqpn=RX_QP, psn=4242, ackreq=True, rest=data_payload())
    p = P.parse_ipv4(wire)
    assert isinstance(p, P.RocePacket)
    assert (p.src, p.dst, p.dport, p.opcode, p.dqpn, p.psn, p.ackreq) == (
        SRC,
        DST,
        4791,
        4,
        RX_QP,
        4242,
        True,
    )
    d = P.decode_data_payload(p.payload)
    assert d.session == 0xC0FFEE and d.t_send == pytest.approx(0.123456789)


def test_ack_and_closing_packet_parse_back():
    ack = P.parse_ipv4(
        scapy_bytes(opcode=P.OP_RC_ACK, dqpn=TX_QP, psn=7, rest=bytes([0x1F, 0, 1, 2]))
    )
    assert (ack.opcode, ack.syndrome, ack.msn, ack.psn) == (P.OP_RC_ACK, 0x1F, 0x102, 7)
    fin_rest = (1234).to_bytes(4, "big") + P.encode_fin_payload(5, 1_000_000_000, 3_000_000_000, 17)
    fin = P.parse_ipv4(
        scapy_bytes(opcode=P.OP_RC_SEND_ONLY_IMM, dqpn=RX_QP, psn=1251, rest=fin_rest)
    )
    f = P.decode_fin_payload(fin.payload)
    assert fin.imm == 1234 and (f.session, f.t_first, f.t_last, f.first_psn) == (5, 1.0, 3.0, 17)


@settings(max_examples=60, deadline=None)
@given(psn=st.integers(0, P.PSN_MASK), ackreq=st.booleans(), seq=st.integers(0, 2**32))
def test_fast_flow_bytes_equal_scapy(psn, ackreq, seq):
    """RoceFlow patches a scapy template; the result must be what scapy builds."""
    flow = _flow()
    rest = data_payload(seq)
    assert flow.packet(psn, ackreq, rest) == scapy_bytes(
        dqpn=RX_QP, psn=psn, ackreq=ackreq, rest=rest
    )


_FLOW = []


def _flow():
    if not _FLOW:
        _FLOW.append(
            P.RoceFlow(
                SRC,
                DST,
                opcode=P.OP_RC_SEND_ONLY,
                dqpn=RX_QP,
                rest_len=P.DATA_PAYLOAD_LEN,
                src_mac="02:00:00:00:00:01",
                dst_mac="02:00:00:00:00:02",
            )
        )
    return _FLOW[0]


def test_frame_has_ethernet_in_front():
    from scapy.layers.l2 import Ether

    frame = _flow().frame(9, True, data_payload())
    eth = Ether(frame)
    assert (eth.src, eth.dst, eth.type) == ("02:00:00:00:00:01", "02:00:00:00:00:02", 0x0800)
    assert P.parse_ipv4(frame[P.ETH_HDR :]).psn == 9


def test_icrc_matches_scapy_and_is_little_endian_crc32():
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import IP

    wire = scapy_bytes(dqpn=RX_QP, psn=1, rest=data_payload())
    pkt = IP(wire)
    assert pkt[BTH].compute_icrc(None) == wire[-4:]  # scapy's own computation
    masked = bytearray(b"\xff" * 8 + wire[:-4])
    for off in (
        8 + 1,
        8 + 8,
        8 + 10,
        8 + 11,
        8 + 26,
        8 + 27,
        8 + 32,
    ):  # TOS TTL csum csum udp-csum x2 BTH-resv
        masked[off] = 0xFF
    assert wire[-4:] == struct.pack("<I", zlib.crc32(bytes(masked)))


@pytest.mark.parametrize(
    "offset, mask",
    [
        (4, 1),
        (5, 1),
        (6, 0x40),
        (12, 1),
        (19, 1),
        (20, 1),
        (28, 1),
        (29, 0x40),
        (30, 1),
        (33, 1),
        (36, 0x80),
        (39, 1),
        (40, 1),
        (55, 1),
        (-4, 1),
        (-1, 0x80),
    ],
)
def test_a_corrupted_covered_byte_fails_the_icrc(offset, mask):
    """IP ID and DF, addresses, ports, BTH, payload and the ICRC itself are all covered."""
    wire = bytearray(scapy_bytes(dqpn=RX_QP, psn=1, rest=data_payload()))
    wire[offset] ^= mask
    assert P.parse_ipv4(bytes(wire)) == P.Invalid("bad_icrc")


@pytest.mark.parametrize("field", ["ttl", "tos", "ip_checksum", "udp_checksum", "fecn"])
def test_fields_a_router_may_rewrite_are_masked(field):
    wire = bytearray(scapy_bytes(dqpn=RX_QP, psn=1, rest=data_payload()))
    offset = {"ttl": 8, "tos": 1, "ip_checksum": 10, "udp_checksum": 26, "fecn": 32}[field]
    wire[offset] ^= 0x80
    assert isinstance(P.parse_ipv4(bytes(wire)), P.RocePacket)


def test_not_bth_short_and_foreign_datagrams():
    def udp(payload, dport=4791):
        from scapy.compat import raw
        from scapy.layers.inet import IP, UDP
        from scapy.packet import Raw

        return raw(IP(src=SRC, dst=DST) / UDP(sport=1, dport=dport) / Raw(payload))

    assert P.parse_ipv4(udp(b"hello")) == P.Invalid("short")
    assert P.parse_ipv4(udp(b"\xff" + bytes(19))) == P.Invalid("not_bth")  # opcode 0xff
    assert P.parse_ipv4(udp(b"\x04\x03" + bytes(18))) == P.Invalid("not_bth")  # header version 3
    assert P.parse_ipv4(udp(bytes(20), dport=53)) is None  # not to the RoCE port: not ours
    assert P.parse_ipv4(b"") is None


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=120))
def test_random_bytes_never_raise(buf):
    assert P.parse_ipv4(buf) is None or isinstance(P.parse_ipv4(buf), (P.Invalid, P.RocePacket))


_VALID = None


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 59), st.integers(0, 255)), max_size=6), st.integers(0, 60))
def test_mutated_packets_never_raise_and_pass_only_if_masked(edits, cut):
    global _VALID
    if _VALID is None:
        _VALID = scapy_bytes(dqpn=RX_QP, psn=77, rest=data_payload())
    wire = bytearray(_VALID)
    for off, val in edits:
        wire[off] = val
    result = P.parse_ipv4(bytes(wire[: len(wire) - cut]))
    assert result is None or isinstance(result, (P.Invalid, P.RocePacket))
    if isinstance(result, P.RocePacket):  # only a change the ICRC masks may go unnoticed
        changed = {i for i in range(len(_VALID)) if wire[i] != _VALID[i]}
        assert cut == 0 and changed <= {1, 8, 10, 11, 26, 27, 32}


# ------------------------------------------------------------------ the receiver's logic


def responder(acks):
    return Responder(ReceiverConfig(bind=DST), lambda dst, data: acks.append((dst, data)))


def test_responder_records_data_and_acks_what_asks():
    acks = []
    r = responder(acks)
    r.handle(_flow().packet(5, True, data_payload()), 1.0)
    r.handle(_flow().packet(6, False, data_payload()), 1.001)
    assert [a.psn for a in r.arrivals] == [5, 6]
    assert r.sources == {SRC: {"count": 2, "first_t": 1.0, "last_t": 1.001}}
    assert len(acks) == 1 and acks[0][0] == SRC
    # The ACK as the kernel will send it: IP/UDP from the receiver's address.
    _, udp_payload = acks[0]
    ip_udp = P.RoceFlow(DST, SRC, opcode=P.OP_RC_ACK, dqpn=TX_QP, rest_len=4, sport=4791).packet(
        0, False, bytes(4)
    )[:28]
    ack = P.parse_ipv4(ip_udp + udp_payload)
    assert (ack.opcode, ack.dqpn, ack.psn, ack.syndrome) == (
        P.OP_RC_ACK,
        TX_QP,
        5,
        P.AETH_ACK_NO_CREDIT,
    )


def test_responder_counts_invalid_packets_and_never_acks_them():
    acks = []
    r = responder(acks)
    good = _flow().packet(1, True, data_payload())
    bad_icrc = good[:-1] + bytes([good[-1] ^ 1])
    wrong_qp = P.RoceFlow(SRC, DST, opcode=P.OP_RC_SEND_ONLY, dqpn=0x99, rest_len=16).packet(
        1, True, data_payload()
    )
    foreign = P.RoceFlow("10.1.2.3", DST, opcode=P.OP_RC_SEND_ONLY, dqpn=RX_QP, rest_len=16).packet(
        1, True, data_payload()
    )
    junk_payload = _flow().packet(2, True, b"X" * 16)
    for buf in (bad_icrc, wrong_qp, foreign, junk_payload, b"\x45garbage"):
        r.handle(buf, 1.0)
    assert dict(r.invalid) == {"bad_icrc": 1, "wrong_qp": 1, "foreign_source": 1, "bad_payload": 1}
    assert acks == [] and r.arrivals == []


def test_responder_locks_onto_one_sender_session_and_reads_the_closing_packet():
    r = responder([])
    r.handle(_flow().packet(0, False, P.encode_data_payload(1, 10)), 1.0)
    r.handle(_flow().packet(1, False, P.encode_data_payload(2, 10)), 1.1)  # a second sender
    fin = P.RoceFlow(SRC, DST, opcode=P.OP_RC_SEND_ONLY_IMM, dqpn=RX_QP, rest_len=32)
    r.handle(
        fin.packet(2, False, (2).to_bytes(4, "big") + P.encode_fin_payload(1, 10**9, 2 * 10**9, 0)),
        1.2,
    )
    rep = r.report()
    assert rep["invalid"]["other_session"] == 1
    assert rep["sender"]["sent"] == 2 and rep["lost"] == 1 and rep["sent_source"] == "sender"


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=100))
def test_responder_survives_random_bytes(buf):
    r = responder([])
    r.handle(buf, 0.0)
    r.handle(b"\x45\x00" + buf, 0.0)
    assert r.arrivals == []


# ------------------------------------------------------------------ ACK timer


def test_ack_timer_gives_up_after_retry_count_expiries():
    # Binary-exact times (1/16 s) so the boundary is exact, not a float accident.
    t = AckTracker(ack_timeout=0.0625, retry_count=3, first_psn=0)
    t.sent(0, 10.0)
    assert not t.exhausted(10.1874)
    assert t.timeouts == 2
    assert t.exhausted(10.1875)  # 3 x 0.0625 s without progress
    assert t.timeouts == 3


def test_ack_progress_restarts_the_timer_and_stale_acks_do_not():
    t = AckTracker(ack_timeout=0.0625, retry_count=3, first_psn=100)
    for i in range(10):
        t.sent(100 + i, 10.0 + i * 0.01)
    assert t.ack(104, 10.125) and not t.ack(103, 10.13)
    assert t.stale_acks == 1 and t.outstanding == 5
    assert not t.exhausted(10.125 + 0.1874) and t.exhausted(10.125 + 0.1875)


def test_ack_timer_idle_when_nothing_outstanding_and_wraps():
    t = AckTracker(ack_timeout=0.05, retry_count=1, first_psn=PSN_MOD - 1)
    t.sent(PSN_MOD - 1, 1.0)
    t.sent(PSN_MOD, 1.001)
    assert t.ack(0, 1.002)  # PSN 0 after the wrap acknowledges extended PSN 2^24
    assert t.outstanding == 0 and not t.exhausted(100.0)


# ------------------------------------------------------------------ guards and CLIs


@pytest.mark.parametrize("addr", ["198.18.0.1", "198.19.255.254", "127.0.0.1", "127.9.9.9"])
def test_lab_addresses_are_accepted(addr):
    assert lab_address(addr) == addr


@pytest.mark.parametrize(
    "addr", ["198.17.255.255", "198.20.0.1", "10.0.0.1", "8.8.8.8", "fd00::1", "nope"]
)
def test_other_addresses_are_refused(addr):
    with pytest.raises(AddressError):
        lab_address(addr)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--mode", "kernel-path", "--src", "198.18.0.1", "--dst", "10.0.0.1"], "outside the lab"),
        (["--mode", "kernel-path", "--src", "192.0.2.1", "--dst", "198.18.0.2"], "--src 192.0.2.1"),
        (["--mode", "kernel-path", "--dst", "198.18.0.2"], "--src is required"),
        (
            ["--mode", "qp-pinned", "--src", "198.18.0.1", "--dst", "198.18.0.2"],
            "only for kernel-path",
        ),
        (["--mode", "qp-pinned", "--dst", "198.18.0.2", "--duration", "601"], "--duration"),
        (["--mode", "qp-pinned", "--dst", "198.18.0.2", "--rate", "0"], "--rate"),
        (["--mode", "qp-pinned", "--dst", "198.18.0.2", "--retry-count", "0"], "--retry-count"),
        (["--mode", "sideways", "--dst", "198.18.0.2"], "--mode"),
    ],
)
def test_sender_bad_arguments_are_one_line_and_exit_2(argv, needle, capsys):
    from labs.traffic import sender

    with pytest.raises(SystemExit) as e:
        raise SystemExit(sender.main(argv))
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--bind", "10.0.0.1"], "outside the lab"),
        (["--bind", "198.18.0.1", "--duration", "0"], "--duration"),
        (["--bind", "198.18.0.1", "--qp", "0"], "--qp"),
        ([], "--bind"),
    ],
)
def test_receiver_bad_arguments_are_one_line_and_exit_2(argv, needle, capsys):
    from labs.traffic import receiver

    with pytest.raises(SystemExit) as e:
        raise SystemExit(receiver.main(argv))
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle in err and err.count("\n") == 1


def test_configs_round_trip_through_their_command_lines():
    """``command()`` is how lab code starts the tools in a namespace or Mininet host."""
    from labs.traffic import receiver, sender

    tx = sender.SenderConfig(
        mode="qp-pinned",
        dst=DST,
        rate=750.0,
        duration=2.5,
        first_psn=9,
        ack_timeout=0.02,
        retry_count=5,
        dst_qp=0x99,
    )
    kp = sender.SenderConfig(mode="kernel-path", src=SRC, dst=DST, sport=0)
    rx = receiver.ReceiverConfig(bind=DST, duration=4.0, qp=0x99, exit_on_fin=False, linger=0.0)
    for cfg, mod in ((tx, sender), (kp, sender), (rx, receiver)):
        argv = cfg.command("r.json")
        assert argv[1:3] == ["-m", mod.__name__]
        assert mod.parse_argv(argv[3:]) == (cfg, "r.json")
