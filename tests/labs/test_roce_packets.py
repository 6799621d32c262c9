"""tshark, an independent dissector, reads the lab's packets as RoCEv2 with a correct ICRC.

Wireshark 4.0's InfiniBand dissector recognises BTH over UDP 4791 and shows
the ICRC (``infiniband.invariant.crc``) but does not verify it: there is no
ICRC preference (``tshark -G defaultprefs``), status field or expert info
(``tshark -G fields``). So the check is split: tshark says where every header
starts and ends and which bytes it takes as the ICRC, and this test recomputes
the ICRC from those dissected bytes with its own few lines of CRC32 (IBA
A17.3.3 masks), then compares. A deliberately corrupted ICRC, or a corrupted
payload under a good ICRC, must fail the comparison: the test can fail.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest

from labs.traffic import packets as P

pytestmark = pytest.mark.lab

TSHARK = shutil.which("tshark")
needs_tshark = pytest.mark.skipif(
    TSHARK is None, reason="tshark is not installed (apt-get install tshark)"
)
REPO = Path(__file__).resolve().parents[2]
SRC, DST = "198.18.0.1", "198.18.1.2"
MAC_A, MAC_B = "02:00:00:00:00:0a", "02:00:00:00:00:0b"


def tshark_json(pcap: Path) -> list[dict]:
    out = subprocess.run(
        [TSHARK, "-r", str(pcap), "-T", "json", "-x", "--no-duplicate-keys"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [f["_source"]["layers"] for f in json.loads(out)]


def raw_of(layers: dict, key: str) -> bytes:
    value = layers[f"{key}_raw"]
    if isinstance(value[0], list):  # --no-duplicate-keys: a list of occurrences
        value = value[0]
    return bytes.fromhex(value[0])


def icrc_verdict(layers: dict) -> tuple[bytes, bytes]:
    """(ICRC as tshark shows it, ICRC recomputed from the bytes tshark dissected)."""
    ip, udp, ib = raw_of(layers, "ip"), raw_of(layers, "udp"), raw_of(layers, "infiniband")
    shown = int(layers["infiniband"]["infiniband.invariant.crc"], 16).to_bytes(
        4, "big"
    )  # wire order
    assert ib[-4:] == shown, "tshark's ICRC field is the last 4 bytes of the IB layer"
    m_ip = bytearray(ip)
    m_ip[1], m_ip[8], m_ip[10:12] = 0xFF, 0xFF, b"\xff\xff"  # TOS, TTL, header checksum
    m_udp = udp[:6] + b"\xff\xff"  # UDP checksum
    m_bth = ib[:4] + b"\xff" + ib[5:12]  # FECN, BECN, reserved
    crc = zlib.crc32(b"\xff" * 8 + bytes(m_ip) + m_udp + m_bth + ib[12:-4])
    return shown, struct.pack("<I", crc)  # CRC32 transmitted least significant byte first


def bth(layers: dict) -> dict:
    t = layers["infiniband"]["infiniband.bth_tree"]
    return {
        "opcode": int(t["infiniband.bth.opcode"]),
        "destqp": int(t["infiniband.bth.destqp"], 16),
        "psn": int(t["infiniband.bth.psn"]),
        "ackreq": t["infiniband.bth.a"] in ("1", "True"),
    }


def write_pcap(path: Path, frames: list[bytes]) -> None:
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap

    wrpcap(str(path), [Ether(f) for f in frames])


@needs_tshark
def test_tshark_dissects_lab_packets_as_bth_over_udp_with_a_correct_icrc(tmp_path):
    from scapy.compat import raw

    data = P.RoceFlow(
        SRC,
        DST,
        opcode=P.OP_RC_SEND_ONLY,
        dqpn=0x12,
        rest_len=P.DATA_PAYLOAD_LEN,
        src_mac=MAC_A,
        dst_mac=MAC_B,
    )
    payload = P.encode_data_payload(0xABCDEF, 987_654_321)
    good = data.frame(4242, True, payload)
    ack = raw(
        P.scapy_frame(
            MAC_B,
            MAC_A,
            P.scapy_packet(
                DST,
                SRC,
                opcode=P.OP_RC_ACK,
                dqpn=0x11,
                psn=4242,
                rest=bytes([P.AETH_ACK_NO_CREDIT, 0, 0, 7]),
                sport=4791,
            ),
        )
    )
    fin = P.RoceFlow(
        SRC, DST, opcode=P.OP_RC_SEND_ONLY_IMM, dqpn=0x12, rest_len=32, src_mac=MAC_A, dst_mac=MAC_B
    )
    closing = fin.frame(
        4243, False, (4243).to_bytes(4, "big") + P.encode_fin_payload(0xABCDEF, 1, 2, 0)
    )
    bad_icrc = good[:-1] + bytes([good[-1] ^ 0x5A])
    bad_payload = (
        good[:-8] + bytes([good[-8] ^ 0x01]) + good[-7:]
    )  # payload hit, ICRC left as it was
    pcap = tmp_path / "roce.pcap"
    write_pcap(pcap, [good, ack, closing, bad_icrc, bad_payload])

    frames = tshark_json(pcap)
    assert len(frames) == 5
    for layers in frames:
        assert layers["frame"]["frame.protocols"].startswith("eth:ethertype:ip:udp:infiniband")
        assert layers["udp"]["udp.dstport"] == "4791"

    assert bth(frames[0]) == {
        "opcode": P.OP_RC_SEND_ONLY,
        "destqp": 0x12,
        "psn": 4242,
        "ackreq": True,
    }
    assert bth(frames[1])["opcode"] == P.OP_RC_ACK and bth(frames[1])["destqp"] == 0x11
    aeth = frames[1]["infiniband"]["infiniband.aeth_tree"]
    assert int(aeth["infiniband.aeth.msn"]) == 7
    assert bth(frames[2])["opcode"] == P.OP_RC_SEND_ONLY_IMM
    assert frames[2]["infiniband"]["infiniband.immdt_raw"][0] == f"{4243:08x}"  # ImmDt: PSNs used

    for layers in frames[:3]:
        shown, recomputed = icrc_verdict(layers)
        assert shown == recomputed, "a lab packet's ICRC must be correct"
    for layers in frames[3:]:
        shown, recomputed = icrc_verdict(layers)
        assert shown != recomputed, "a corrupted packet must be caught"
    # Our own parser agrees with the verdicts.
    assert [
        type(P.parse_ipv4(f[P.ETH_HDR :])).__name__
        for f in (good, ack, closing, bad_icrc, bad_payload)
    ] == ["RocePacket"] * 3 + ["Invalid"] * 2


CAPTURE = textwrap.dedent(
    """
    import socket, sys, time
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap
    from labs.traffic.sender import SenderConfig, run_sender
    cap = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    cap.bind(("lo", 0))
    cap.settimeout(0.5)
    hold = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    hold.bind(("127.0.0.1", 4791))  # no ICMP port-unreachable noise
    lo = "127.0.0.1"
    run_sender(SenderConfig(mode="kernel-path", src=lo, dst=lo, rate=200, duration=0.1))
    frames = []
    deadline = time.monotonic() + 2
    while len(frames) < 5 and time.monotonic() < deadline:
        try:
            buf, addr = cap.recvfrom(65535)
        except socket.timeout:
            break
        ipv4, to_roce = buf[12:14] == b"\\x08\\x00", buf[36:38] == b"\\x12\\xb7"
        if addr[2] == socket.PACKET_OUTGOING and ipv4 and to_roce:
            frames.append(Ether(buf))
    wrpcap(sys.argv[1], frames)
    print(len(frames))
    """
)


@needs_tshark
def test_kernel_built_headers_carry_a_correct_icrc(tmp_path):
    """kernel-path precomputes the ICRC over the headers the kernel writes (ID 0, DF)."""
    if os.geteuid() != 0:
        pytest.skip("needs root for a private network namespace")
    ns = f"lp-trp{os.getpid()}"
    pcap = tmp_path / "kernel.pcap"
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=10)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True, timeout=10)
        out = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", CAPTURE, str(pcap)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
    finally:
        subprocess.run(["ip", "netns", "del", ns], timeout=10)
    frames = tshark_json(pcap)
    assert len(frames) >= 3
    for layers in frames:
        assert (
            layers["ip"]["ip.id"] == "0x0000"
            and layers["ip"]["ip.flags_tree"]["ip.flags.df"] == "1"
        )
        assert bth(layers)["opcode"] == P.OP_RC_SEND_ONLY
        shown, recomputed = icrc_verdict(layers)
        assert shown == recomputed
