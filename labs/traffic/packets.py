"""RoCEv2 on the wire: IPv4 / UDP dport 4791 / BTH [/ AETH | ImmDt] / payload / ICRC.

scapy's contrib RoCE layer is the reference: ``scapy_packet`` builds a whole
packet with it and scapy computes the ICRC. Building every packet that way
costs ~3 ms, which caps a sender near 300 pkt/s, so ``RoceFlow`` builds one
template per flow with scapy and per packet only patches the PSN word and the
payload, continuing a CRC32 whose masked-header prefix was computed once. At
construction it checks its own ICRC against scapy's, and the unit tests prove
the bytes equal scapy's for arbitrary PSNs and payloads.

ICRC (IBA Annex A17, RoCEv2): CRC32 over 8 bytes of 0xff (the absent LRH),
the IP header with TOS, TTL and header checksum set to all ones, the UDP header
with its checksum set to all ones, the BTH with its FECN/BECN/reserved byte
set to all ones, and the rest of the packet; stored least-significant byte
first. Everything a router may rewrite is masked, everything else (addresses,
lengths, IP ID and flags, ports) is covered.

The parser never raises: anything it cannot read comes back as ``Invalid``
with a reason, because a measuring receiver must survive whatever arrives.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

ROCE_PORT = 4791

# BTH opcodes used here (IBA 9.2): RC transport is 0b000 in the top bits.
OP_RC_SEND_ONLY = 0x04
OP_RC_SEND_ONLY_IMM = 0x05
OP_RC_ACK = 0x11
OP_CNP = 0x81

# Every opcode IBA defines for RC/UC/RD/UD, plus CNP: anything else is not BTH.
KNOWN_OPCODES = frozenset(
    [*range(0x00, 0x15), *range(0x20, 0x2C), *range(0x40, 0x55), 0x64, 0x65, OP_CNP]
)
_IMM_OPCODES = frozenset({0x03, 0x05, 0x23, 0x25, 0x43, 0x45, 0x65})
_AETH_OPCODES = frozenset({0x11, 0x51})

IPV4_HDR = 20
UDP_HDR = 8
BTH_LEN = 12
AETH_LEN = 4
IMM_LEN = 4
ICRC_LEN = 4
ETH_HDR = 14
PSN_MASK = 0xFFFFFF

# AETH syndrome for a plain ACK: 0b0 00 11111 (ACK, credits not tracked).
AETH_ACK_NO_CREDIT = 0x1F

# Our payloads: a magic so stray datagrams to 4791 are told apart, the
# sender's session id, and CLOCK_MONOTONIC send time(s) in nanoseconds.
MAGIC = b"LPT1"
DATA_FMT = struct.Struct("!4sIQ")  # magic, session, t_send_ns
FIN_FMT = struct.Struct("!4sIQQI")  # magic, session, t_first_ns, t_last_ns, first_psn
DATA_PAYLOAD_LEN = DATA_FMT.size  # 16: a multiple of 4, so BTH padcount stays 0
FIN_PAYLOAD_LEN = FIN_FMT.size  # 28

_PSEUDO_LRH = b"\xff" * 8


def _masked_ip(ip_header: bytes) -> bytes:
    m = bytearray(ip_header)
    m[1] = 0xFF  # TOS (DSCP/ECN)
    m[8] = 0xFF  # TTL
    m[10:12] = b"\xff\xff"  # header checksum
    return bytes(m)


def _masked_udp(udp_header: bytes) -> bytes:
    return udp_header[:6] + b"\xff\xff"


def _masked_bth8(bth: bytes) -> bytes:
    """First 8 BTH bytes with the FECN/BECN/reserved byte forced to ones."""
    return bth[:4] + b"\xff" + bth[5:8]


def icrc_state(ip_header: bytes, udp_header: bytes, bth8: bytes) -> int:
    """CRC32 running value after the masked headers and the first 8 BTH bytes."""
    return zlib.crc32(
        _PSEUDO_LRH + _masked_ip(ip_header) + _masked_udp(udp_header) + _masked_bth8(bth8)
    )


def compute_icrc(ip_header: bytes, udp_header: bytes, ib_without_icrc: bytes) -> bytes:
    """The 4 ICRC bytes for BTH..payload carried in the given IP and UDP headers."""
    crc = zlib.crc32(ib_without_icrc[8:], icrc_state(ip_header, udp_header, ib_without_icrc[:8]))
    return struct.pack("<I", crc)


def encode_data_payload(session: int, t_send_ns: int) -> bytes:
    return DATA_FMT.pack(MAGIC, session & 0xFFFFFFFF, t_send_ns & 0xFFFFFFFFFFFFFFFF)


def encode_fin_payload(session: int, t_first_ns: int, t_last_ns: int, first_psn: int) -> bytes:
    return FIN_FMT.pack(MAGIC, session & 0xFFFFFFFF, t_first_ns, t_last_ns, first_psn & PSN_MASK)


@dataclass(frozen=True)
class DataPayload:
    session: int
    t_send: float  # CLOCK_MONOTONIC seconds


@dataclass(frozen=True)
class FinPayload:
    session: int
    t_first: float
    t_last: float
    first_psn: int


def decode_data_payload(payload: bytes) -> DataPayload | None:
    if len(payload) != DATA_FMT.size:
        return None
    magic, session, t_ns = DATA_FMT.unpack(payload)
    return DataPayload(session, t_ns / 1e9) if magic == MAGIC else None


def decode_fin_payload(payload: bytes) -> FinPayload | None:
    if len(payload) != FIN_FMT.size:
        return None
    magic, session, t_first, t_last, first_psn = FIN_FMT.unpack(payload)
    return FinPayload(session, t_first / 1e9, t_last / 1e9, first_psn) if magic == MAGIC else None


# ---------------------------------------------------------------- scapy side


def scapy_packet(
    src: str,
    dst: str,
    *,
    opcode: int = OP_RC_SEND_ONLY,
    dqpn: int,
    psn: int,
    ackreq: bool = False,
    rest: bytes = b"",
    sport: int = 49152,
    dport: int = ROCE_PORT,
    ip_id: int = 0,
    df: bool = True,
    ttl: int = 64,
    tos: int = 0,
    udp_chksum: int | None = 0,
):
    """IP/UDP/BTH[/AETH]/payload/ICRC built by scapy's contrib RoCE layer.

    ``rest`` is everything after the BTH: AETH(4) for an ACK, ImmDt(4) +
    payload for SEND with immediate, else the payload. The defaults (ID 0, DF,
    UDP checksum 0) are what the lab puts on the wire; see ``RoceFlow``.
    """
    from scapy.contrib.roce import AETH, BTH
    from scapy.layers.inet import IP, UDP
    from scapy.packet import Raw

    bth = BTH(opcode=opcode, dqpn=dqpn, psn=psn & PSN_MASK, ackreq=int(ackreq))
    if opcode in _AETH_OPCODES and len(rest) >= AETH_LEN:
        syndrome, msn_hi, msn_lo = struct.unpack("!BBH", rest[:AETH_LEN])
        body = bth / AETH(syndrome=syndrome, msn=(msn_hi << 16) | msn_lo)
        if rest[AETH_LEN:]:
            body = body / Raw(rest[AETH_LEN:])
    else:
        body = bth / Raw(rest) if rest else bth
    udp = (
        UDP(sport=sport, dport=dport)
        if udp_chksum is None
        else UDP(sport=sport, dport=dport, chksum=udp_chksum)
    )
    return IP(src=src, dst=dst, id=ip_id, flags="DF" if df else 0, ttl=ttl, tos=tos) / udp / body


def scapy_frame(src_mac: str, dst_mac: str, ip_packet):
    from scapy.layers.l2 import Ether

    return Ether(src=src_mac, dst=dst_mac, type=0x0800) / ip_packet


class RoceFlow:
    """Fast builder for one flow: fixed addresses, ports, opcode, QP and length.

    The template (Ethernet if MACs are given, IPv4, UDP, BTH) comes from
    scapy; ``packet``/``udp_payload``/``frame`` patch PSN, AckReq and the bytes
    after the BTH and finish the ICRC from a precomputed CRC32 state.
    """

    def __init__(
        self,
        src: str,
        dst: str,
        *,
        opcode: int,
        dqpn: int,
        rest_len: int,
        sport: int = 49152,
        dport: int = ROCE_PORT,
        src_mac: str | None = None,
        dst_mac: str | None = None,
    ):
        from scapy.compat import raw

        self.src, self.dst, self.opcode, self.dqpn = src, dst, opcode, dqpn
        self.sport, self.dport, self.rest_len = sport, dport, rest_len
        ref = scapy_packet(
            src,
            dst,
            opcode=opcode,
            dqpn=dqpn,
            psn=0,
            rest=bytes(rest_len),
            sport=sport,
            dport=dport,
        )
        wire = raw(ref)
        ihl = (wire[0] & 0x0F) * 4
        self._ip_udp = wire[: ihl + UDP_HDR]
        bth8 = wire[ihl + UDP_HDR : ihl + UDP_HDR + 8]
        self._bth8 = bth8
        self._state = icrc_state(wire[:ihl], wire[ihl : ihl + UDP_HDR], bth8)
        self._eth = b""
        if src_mac is not None and dst_mac is not None:
            self._eth = raw(scapy_frame(src_mac, dst_mac, ref))[:ETH_HDR]
        # Self-check against scapy's own ICRC: a drift here would make every
        # packet we send invalid, so fail loudly at construction instead.
        if self.udp_payload(0, False, bytes(rest_len)) != wire[ihl + UDP_HDR :]:
            raise AssertionError("RoceFlow template ICRC differs from scapy's")

    def udp_payload(self, psn: int, ackreq: bool, rest: bytes) -> bytes:
        """BTH..ICRC: what a UDP socket sends (the kernel adds IP and UDP)."""
        if len(rest) != self.rest_len:
            raise ValueError(f"rest must be {self.rest_len} bytes, got {len(rest)}")
        tail = ((0x80000000 if ackreq else 0) | (psn & PSN_MASK)).to_bytes(4, "big") + rest
        return self._bth8 + tail + struct.pack("<I", zlib.crc32(tail, self._state))

    def packet(self, psn: int, ackreq: bool, rest: bytes) -> bytes:
        """The whole IPv4 packet."""
        return self._ip_udp + self.udp_payload(psn, ackreq, rest)

    def frame(self, psn: int, ackreq: bool, rest: bytes) -> bytes:
        """The whole Ethernet frame (needs MACs at construction)."""
        if not self._eth:
            raise ValueError("flow was built without MAC addresses")
        return self._eth + self.packet(psn, ackreq, rest)


# ---------------------------------------------------------------- parser


@dataclass(frozen=True)
class Invalid:
    """A datagram to the RoCE port that is not a packet we accept."""

    reason: str  # short, not_bth, bad_icrc, malformed


@dataclass(frozen=True)
class RocePacket:
    src: str
    dst: str
    sport: int
    dport: int
    ip_id: int
    opcode: int
    dqpn: int
    psn: int
    ackreq: bool
    syndrome: int | None  # AETH, on ACKs
    msn: int | None
    imm: int | None  # ImmDt, on *_WITH_IMMEDIATE
    payload: bytes  # after extension headers, pad bytes removed


def _ip4(b: bytes) -> str:
    return f"{b[0]}.{b[1]}.{b[2]}.{b[3]}"


def parse_ipv4(buf: bytes, port: int = ROCE_PORT) -> RocePacket | Invalid | None:
    """Parse an IPv4 datagram; ``None`` when it is not UDP to ``port`` at all."""
    try:
        return _parse_ipv4(bytes(buf), port)
    except Exception:  # noqa: BLE001 - a receiver counts what it cannot read, it never dies on it
        return Invalid("malformed")


def _parse_ipv4(buf: bytes, port: int) -> RocePacket | Invalid | None:
    if len(buf) < IPV4_HDR or buf[0] >> 4 != 4:
        return None
    ihl = (buf[0] & 0x0F) * 4
    total = int.from_bytes(buf[2:4], "big")
    if ihl < IPV4_HDR or total < ihl + UDP_HDR or total > len(buf) or buf[9] != 17:
        return None
    if int.from_bytes(buf[6:8], "big") & 0x3FFF:  # a fragment: not ours to judge
        return None
    udp = buf[ihl : ihl + UDP_HDR]
    dport = int.from_bytes(udp[2:4], "big")
    if dport != port:
        return None
    udp_len = int.from_bytes(udp[4:6], "big")
    if udp_len < UDP_HDR or ihl + udp_len > total:
        return Invalid("malformed")
    ib = buf[ihl + UDP_HDR : ihl + udp_len]
    if len(ib) < BTH_LEN + ICRC_LEN:
        return Invalid("short")
    opcode = ib[0]
    if opcode not in KNOWN_OPCODES or ib[1] & 0x0F != 0:  # transport header version 0
        return Invalid("not_bth")
    if compute_icrc(buf[:ihl], udp, ib[:-ICRC_LEN]) != ib[-ICRC_LEN:]:
        return Invalid("bad_icrc")
    padcount = (ib[1] >> 4) & 0x03
    dqpn = int.from_bytes(ib[5:8], "big")
    word = int.from_bytes(ib[8:12], "big")
    body = ib[BTH_LEN:-ICRC_LEN]
    syndrome = msn = imm = None
    if opcode in _AETH_OPCODES:
        if len(body) < AETH_LEN:
            return Invalid("short")
        syndrome, msn = body[0], int.from_bytes(body[1:4], "big")
        body = body[AETH_LEN:]
    elif opcode in _IMM_OPCODES:
        if len(body) < IMM_LEN:
            return Invalid("short")
        imm, body = int.from_bytes(body[:IMM_LEN], "big"), body[IMM_LEN:]
    if padcount > len(body):
        return Invalid("malformed")
    if padcount:
        body = body[:-padcount]
    return RocePacket(
        src=_ip4(buf[12:16]),
        dst=_ip4(buf[16:20]),
        sport=int.from_bytes(udp[0:2], "big"),
        dport=dport,
        ip_id=int.from_bytes(buf[4:6], "big"),
        opcode=opcode,
        dqpn=dqpn,
        psn=word & PSN_MASK,
        ackreq=bool(word >> 31),
        syndrome=syndrome,
        msn=msn,
        imm=imm,
        payload=body,
    )
