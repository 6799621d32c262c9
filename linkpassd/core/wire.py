"""The echo datagram: the one definition of its wire format.

Every speaker of it imports it from here: the daemon's path probers
(adapters.echo, adapters.echorail, through adapters.mmsg's batches), the
responder (adapters.echoresponder, run by linkpassd.responder) and the
validation prober (adapters.valprober). Pure: no sockets, no clock.

Network byte order, 40 bytes, the same both ways:

    magic "LPEC" | version u8 (1) | kind u8 (1 request, 2 reply) | receipt u16
    seq u32 | sent_ns u64 (prober's clock, echoed) | prober_id u64 (echoed)
    responder_id u64 (0 in requests) | held_us u32 (0 in requests)

`receipt` (a reply's; 0 in requests) says which way the path loses packets
without synchronised clocks: its top bit set means "present", and its low
15 bits are how many requests from this prober's socket (its source address
and port, our address, its prober id) the responder has answered so far,
this one included, modulo 2^15. Between two replies the prober then knows
how many of the requests it sent in between reached the responder, so each
probe lost in between is a request lost (on the way to the responder) or a
reply lost (on the way back): core.direction does that sum. A responder
from before receipts sends 0 there (the field was reserved, always 0): its
probers can tell round-trip loss only, and say so. Probers from before
receipts ignore the field. The version stays 1: nothing else changed.

One-way delay (core.oneway), in the same 40 bytes both ways (so a reply is
still never larger than its request). A request's `responder_id` field,
always 0 before, carries the prober's wall-clock send time (ns since the
epoch, CLOCK_REALTIME); not 0, it asks for one-way delay. A responder that
knows how is told so by it and answers with the top four bits of `held_us`
set to ONE_WAY_MARK (the low 28 are the hold, up to 268 s) and, in the
reply's `responder_id` field, `forward_ns` (i32, high half: its wall-clock
receive time minus that send time) and its clock's error bound (u32 ns, low
half; UNSYNCHRONISED when it has none). The prober has the rest: back =
round trip - forward (the round trip already leaves out the hold). Older
responders ignore the request's field and answer as before (no mark: round
trip only); older probers never set it, so never see the mark.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

ECHO_PORT = 4793
MAGIC = b"LPEC"
VERSION = 1
KIND_REQUEST = 1
KIND_REPLY = 2
PACKET = struct.Struct("!4sBBHIQQQI")  # see the module docstring
SIZE = PACKET.size  # 40

RECEIPT_PRESENT = 0x8000  # top bit of the receipt field: the responder counts
RECEIPT_MODULO = 0x8000  # the count's range: 15 bits

ONE_WAY_MARK = 0xA0000000  # top four bits of a reply's held_us: one-way fields follow
MARK_BITS = 0xF0000000
HELD_BITS = 0x0FFFFFFF  # the hold (us) under the mark
UNSYNCHRONISED = 0xFFFFFFFF  # the bound of a responder whose clock has none
BOUND_MAX = UNSYNCHRONISED - 1  # a larger bound is sent as this (4.29 s)
FORWARD_LIMIT = 2**31 - 1  # |forward_ns| at or beyond it: saturated (clocks 2.1 s apart)


def receipt_field(answered: int) -> int:
    """The receipt field for a responder that has answered `answered`
    requests from one prober socket (this one included)."""
    return RECEIPT_PRESENT | (answered % RECEIPT_MODULO)


def receipt_count(field_value: int) -> int | None:
    """The responder's count (modulo 2^15) from a reply's receipt field;
    None when the responder does not keep receipts (an older one)."""
    if field_value & RECEIPT_PRESENT:
        return field_value & (RECEIPT_MODULO - 1)
    return None


def one_way_field(forward_ns: int, bound_ns: int | None) -> int:
    """A reply's `responder_id` field for forward delay `forward_ns` and the
    responder's clock bound `bound_ns` (None: unsynchronised); saturating."""
    forward = max(-FORWARD_LIMIT, min(FORWARD_LIMIT, forward_ns))
    bound = UNSYNCHRONISED if bound_ns is None else max(0, min(BOUND_MAX, bound_ns))
    return ((forward & 0xFFFFFFFF) << 32) | bound


def one_way_values(field_value: int) -> tuple[int, int | None]:
    """(forward_ns, bound_ns or None when unsynchronised) from a marked reply's field."""
    forward = field_value >> 32
    if forward >= 2**31:
        forward -= 2**32
    bound = field_value & 0xFFFFFFFF
    return forward, (None if bound == UNSYNCHRONISED else bound)


@dataclass(frozen=True)
class EchoPacket:
    kind: int
    seq: int
    sent_ns: int
    prober_id: int
    responder_id: int = 0
    held_us: int = 0
    receipt: int = 0  # the raw field (receipt_count reads it); 0 in requests

    def encode(self) -> bytes:
        return PACKET.pack(MAGIC, VERSION, self.kind, self.receipt, self.seq, self.sent_ns,
                           self.prober_id, self.responder_id, self.held_us)

    @property
    def received(self) -> int | None:
        """The responder's receipt count (module docstring), None if it keeps none."""
        return receipt_count(self.receipt)


def parse(data: bytes, truncated: bool = False) -> tuple[EchoPacket | None, str]:
    """A packet, or None and why not. Never raises on any input."""
    if truncated or len(data) > PACKET.size:
        return None, "too long"
    if len(data) < PACKET.size:
        return None, "too short"
    magic, version, kind, receipt, seq, sent_ns, prober_id, responder_id, held_us = \
        PACKET.unpack(data)
    if magic != MAGIC:
        return None, "bad magic"
    if version != VERSION:
        return None, f"version {version}"
    if kind not in (KIND_REQUEST, KIND_REPLY):
        return None, f"kind {kind}"
    return EchoPacket(kind, seq, sent_ns, prober_id, responder_id, held_us, receipt), ""
