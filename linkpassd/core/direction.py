"""Which way a path loses packets, from the responder's receipts: no clocks needed.

A reply carries the responder's receipt (core.wire): how many requests from
this prober socket it has answered so far, modulo 2^15. Take two replies,
to probes number `a` and `b` (b after a, in the prober's own numbering of the
probes it sent to that responder), carrying receipts `ca` and `cb`. Of the
`b - a` requests sent after `a` up to `b`, `cb - ca` reached the responder
and were answered; we got one of those replies (b's) back. So, of the
`b - a - 1` probes lost in between:

    requests lost = (b - a) - (cb - ca)      (towards the responder)
    replies lost  = (cb - ca) - 1            (on the way back)

A reply that then arrives late (a probe between a and b) was counted as a
reply lost and is taken back. Counts that do not add up (the responder
restarted or dropped its table, more than 2^15 probes in between) class
nothing: the probes stay unclassed and the next reply starts again. So
does a responder without receipts: round-trip loss only.

Nothing is classed while a path is wholly silent (no reply carries a
receipt then): the first reply after it classes the whole silence. Pure:
samples in, counts and words out.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from linkpassd.core.wire import RECEIPT_MODULO

# One direction is named when the other carries at most this share of the
# classed losses (a one-way fault still loses the odd packet the other way).
ONE_WAY_SHARE = 0.1
RECENT = 256  # classed losses the current direction is judged on


class Direction(enum.StrEnum):
    NONE = "none"  # nothing lost since receipts were seen
    REQUESTS = "requests"  # requests lost on the way to the responder
    REPLIES = "replies"  # replies lost on the way back
    BOTH = "both"
    UNKNOWN = "unknown"  # no receipts (a responder without them, or none yet)


def classify(a: int, count_a: int, b: int, count_b: int, unsent: int = 0,
             seq_modulo: int = 2**32) -> tuple[int, int] | None:
    """(requests lost, replies lost) between replies to probes `a` and `b`
    carrying receipts `count_a` and `count_b` (module docstring); `unsent`:
    probes numbered in between that never left (send errors). None when the
    numbers do not add up: nothing can be classed."""
    sent = (b - a) % seq_modulo - unsent
    reached = (count_b - count_a) % RECEIPT_MODULO
    if sent <= 0 or sent >= RECEIPT_MODULO or reached == 0 or reached > sent:
        return None
    return sent - reached, reached - 1


@dataclass(slots=True)
class Receipts:
    """One path's receipts (one prober socket to one responder): feed it
    every reply (`on_reply`) and every probe that could not be sent
    (`on_unsent`); it classes the probes lost in between."""

    seq_modulo: int = 2**32
    requests_lost: int = 0
    replies_lost: int = 0
    plain_replies: int = 0  # replies without a receipt (a responder that keeps none)
    receipted: int = 0  # replies with one
    resyncs: int = 0  # receipts that did not add up
    last_seq: int | None = None
    last_count: int = 0
    unsent: int = 0  # since the last receipt
    recent: deque[bool] = field(default_factory=lambda: deque(maxlen=RECENT))  # True: a request

    def on_unsent(self) -> None:
        self.unsent += 1

    def on_reply(self, seq: int, count: int | None) -> tuple[int, int]:
        """A reply to probe `seq` with receipt `count` (None: the responder
        keeps none). Returns what it classed: (requests lost, replies lost)."""
        if count is None:
            self.plain_replies += 1
            return 0, 0
        self.receipted += 1
        last = self.last_seq
        if last is not None and 0 < (last - seq) % self.seq_modulo < self.seq_modulo // 2:
            # A late reply to a probe before the last receipt: counted then as a reply
            # lost; it was not.
            if self.replies_lost > 0:
                self.replies_lost -= 1
                if False in self.recent:
                    self.recent.remove(False)
            return 0, -1
        classed = (0, 0) if last is None else classify(last, self.last_count, seq, count,
                                                      self.unsent, self.seq_modulo)
        self.last_seq, self.last_count, self.unsent = seq, count, 0
        if classed is None:
            self.resyncs += 1
            return 0, 0
        requests, replies = classed
        self.requests_lost += requests
        self.replies_lost += replies
        self.recent.extend([True] * min(requests, RECENT))
        self.recent.extend([False] * min(replies, RECENT))
        return classed

    def forget_direction(self) -> None:
        """The losses classed so far no longer say which way the path loses
        (it has been clean since): the next ones are judged on their own.
        The totals stay."""
        self.recent.clear()

    @property
    def round_trip_only(self) -> bool:
        """The responder answers without receipts (one from before them)."""
        return self.plain_replies > 0 and self.receipted == 0

    def direction(self) -> Direction:
        """Which way the recent classed losses went."""
        if not self.receipted:
            return Direction.UNKNOWN
        requests = sum(self.recent)
        return judge(requests, len(self.recent) - requests)

    def words(self, peer: str) -> str:
        """The direction in the operator's words, with the totals."""
        d = self.direction()
        if d is Direction.UNKNOWN and not self.round_trip_only:
            return "direction unknown: no reply with a receipt yet"
        return describe(d, peer, self.requests_lost, self.replies_lost)


def judge(requests_lost: int, replies_lost: int) -> Direction:
    """The direction of `requests_lost` and `replies_lost` (ONE_WAY_SHARE)."""
    total = requests_lost + replies_lost
    if total == 0:
        return Direction.NONE
    if replies_lost <= ONE_WAY_SHARE * total:
        return Direction.REQUESTS
    if requests_lost <= ONE_WAY_SHARE * total:
        return Direction.REPLIES
    return Direction.BOTH


def describe(direction: Direction, peer: str, requests_lost: int = 0,
             replies_lost: int = 0) -> str:
    """The operator's words for `direction` on the path to `peer`."""
    counts = f" ({requests_lost} requests, {replies_lost} replies)" \
        if requests_lost or replies_lost else ""
    if direction is Direction.REQUESTS:
        return f"loss towards {peer}, replies fine{counts}"
    if direction is Direction.REPLIES:
        return f"replies lost from {peer}, requests reach it{counts}"
    if direction is Direction.BOTH:
        return f"loss both ways to and from {peer}{counts}"
    if direction is Direction.NONE:
        return "no loss either way"
    return f"direction unknown: {peer}'s responder keeps no receipts (round trip only)"
