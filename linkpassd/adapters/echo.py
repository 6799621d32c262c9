"""UDP echo between linkpassd peers: a responder in every daemon, a prober per path.

The judgement lives in core.probe; this module only moves datagrams and time.

Port: UDP 4793 by default (configurable). The neighbours are taken, and a
probe must never be mistaken for them by a switch, NIC or capture filter:
3784/3785/4784 are BFD control/echo/multihop, 6784 BFD-on-LAG, 7784 S-BFD,
4789 VXLAN, 4790 VXLAN-GPE (so not 4790), 4791 RoCEv2, 4792 Unified Bus. 4793 was
unassigned in the IANA registry copy we checked (Wireshark 4.0's), sits next to
the RoCE ports an operator already opens in fabric ACLs, and lies below the
Linux ephemeral range (32768-60999), so no client socket can hold it.

Wire format, network byte order, 40 bytes, the same both ways:

    magic "LPEC" | version u8 (1) | kind u8 (1 request, 2 reply) | reserved u16
    seq u32 | sent_ns u64 (prober's clock, echoed) | prober_id u64 (echoed)
    responder_id u64 (0 in requests) | held_us u32 (0 in requests)

`held_us` is how long the responder's host held the request (kernel receive
to reply), so a late reply caused by a stalled peer daemon is not blamed on
the path. A reply is never larger than its request (no amplification), there
is at most one per request, and a responder never answers a reply (no loops
between responders). Anything else is dropped and counted, never raised.

The responder is not an open reflector (core.admission): it answers only
requests sent to a rail address, from a source in the fabric prefixes or a
configured peer, within a per-source rate. Refused datagrams are dropped
before they are parsed.

Every path of a rail (one per peer) shares the rail's one socket
(adapters.echorail), bound to the rail's interface (SO_BINDTODEVICE) and
address, so a probe takes that rail whatever the routing tables say; a reply
is matched to its path by its source address. The probes of a rail due in
one wake-up leave in one sendmmsg, its replies are read in one recvmmsg
(adapters.mmsg), and an ICMP port unreachable (the peer host is up, its
daemon is not) still reaches its own path, through the socket's error queue
(IP_RECVERR). The responder answers from the address the request was sent
to, out of the interface it came in on (IP_PKTINFO), so the reply tests the
same physical path back; it too reads and answers in batches.

Time: probers use the event loop's monotonic clock; the service's one timer
is a timerfd (adapters.timerfd) with a quarter-millisecond grain, since
asyncio's timers fire up to a millisecond late and a confirmation is a
chain of wake-ups. Replies carry the kernel's receive time (SO_TIMESTAMPNS),
so a busy loop does not make them late, and the daemon's loop-lag meter
(adapters.looplag, shared with BFD) says how late the loop runs; both feed
the core, which refuses to count a miss that a stall of ours could explain.

Confirmation (core.probe): a steady probe unanswered for 3 ms raises a
suspicion, whose burst's first probe leaves at once; after the burst's last
probe, another path to the same peer daemon (by the responder id its replies
carry, core.peerwatch; another rail first) is probed; with ordering evidence
on (`order_margin_ms` > 0, off by default: it misreads one rail's queueing
as loss), once the peer has answered that one, the burst's probes still
unanswered a margin later are lost. Otherwise the timeouts decide.

Cost per probe is constant, whatever the number of paths (issue 11). What
made it grow faster than the paths, and what replaced it:
- a stall was told to every path, each re-sorting its own list: now one
  stall log (core.stalls) that a path consults when it judges a probe;
- an asyncio timer per path, re-created at every send and reply: now one
  timer for the service (adapters.wakeups), paths due in the same grain run
  in one wake-up, at most 32 per wake-up, so a backlog is worked off in
  slices with carrier and BFD events in between;
- all paths probing in the same instant (and re-aligned by any stall): the
  service spreads them over one interval and each keeps its phase; with 16
  paths or more, those due within one send slot (a tenth of the interval, at
  most 5 ms) leave together at its start, each keeping its own cadence
  (core.schedule.send_slot);
- a suspicion poking every live path, every reply pushed to every suspect:
  now a few witnesses (other rails first) and two numbers per reply;
- a rail blackhole making each of the rail's paths confirm on its own: now
  at most two paths of a rail confirm at once, and a rail silent on every
  path takes all its live paths DOWN (core.railwatch);
- a connected socket per path (an epoll event, a callback and two receives
  per reply, a send per probe): one socket per rail, batched both ways;
- a frozen prober record copied several times per probe (with its
  200-outcome window): the core's prober now changes in place.
What is left, and why the 10 %-of-a-core target at 256 paths is not met,
is in the README ("Measured", probe_scale).

Why UDP to a responder and not ICMP echo answered by the peer's kernel: the
kernel would answer at no userspace cost on the far side (the responder costs
~25 us of CPU per request, measured), and its receive timestamps are the same
SO_TIMESTAMPNS ones (per packet, whatever the protocol). But UDP keeps what
the judgement and the fabric need: a UDP 5-tuple, so a probe hashes across
ECMP as a RoCEv2 flow (UDP 4791) does, where ICMP has no ports to hash on and
is often rate-limited or filtered by fabric ACLs; the admission policy (no
open reflector); `held_us`, so a stalled peer is not blamed on the path; and
`peer_heard`, which says which way a one-way fault runs. Hence UDP; ICMP stays a possible fallback towards
hosts without linkpassd.

IPv4 only for now.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import random
import socket
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from linkpassd.adapters.echorail import Outbox, RailSocket
from linkpassd.adapters.echoresponder import (  # noqa: F401 - re-exported: callers use echo
    _ANCILLARY, _HANDOFF_S, _RECV_BYTES, ECHO_PORT, IP_PKTINFO, KIND_REPLY, KIND_REQUEST, MAGIC,
    PACKET, SCM_TIMESTAMPNS, SO_TIMESTAMPNS, VERSION, EchoPacket, EchoResponder, HeardCallback,
    ResponderTally, _cmsgs, _random_id, _udp_socket, parse)
from linkpassd.adapters.looplag import LoopLag
from linkpassd.adapters.wakeups import SharedTimer
from linkpassd.core.admission import ResponderPolicy
from linkpassd.core.model import Assessment, ResponderCounters
from linkpassd.core.peerwatch import PeerWatch
from linkpassd.core.probe import PathState, ProbeConfig, Prober, Send
from linkpassd.core.railwatch import RailWatch
from linkpassd.core.schedule import send_slot

_MAX_KERNEL_DELAY_S = 1.0  # beyond this a receive timestamp is a clock step, not a delay
_RETRY_S = 1.0  # reopen a rail's socket this long after it failed (port or address missing)
_WITNESS_POKES = 4  # live paths that probe at once when another starts confirming a loss
_MSG_TRUNC = int(socket.MSG_TRUNC)  # a plain int: the enum's & costs more than the rest of a check
# Upper bounds of the probe RTT histogram (seconds; +Inf is implied), for metrics:
# each reply costs one bisect and one integer increment (see docs/metrics.md).
RTT_BUCKETS_S = (50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 4e-3, 8e-3, 16e-3, 32e-3, 64e-3,
                 0.128, 0.256, 0.512, 1.024)


# --------------------------------------------------------------------------
# Prober
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbePath:
    """Probe `peer` from `source` on interface `port` (a rail's port and address)."""

    port: str
    source: str
    peer: str

    def __post_init__(self) -> None:
        for addr in (self.source, self.peer):
            if ipaddress.ip_address(addr).version != 4:
                raise ValueError(f"echo probes are IPv4 only for now, got {addr}")

    def __str__(self) -> str:
        return f"{self.port}:{self.source}->{self.peer}"


ChangeCallback = Callable[["EchoProber", Assessment], None]


class EchoProber:
    """One path: sends what the core asks, feeds back what comes in and how late
    the loop ran. `on_change` hears every change of the path's verdict.

    `rail`: the socket of the path's rail, shared with the rail's other paths
    (adapters.echorail); a prober without one has its own. `timer`: the
    service's one timer for all its paths (adapters.wakeups); a prober
    without one makes its own. `read_first(now)`: reads every socket the
    judgement depends on, before a deadline is judged (default: its rail's).
    `lag`: the loop-lag meter, whose one stall log every path consults when
    it judges a probe. `others_heard`: the last time another path of the
    service received a reply (for a suspect's confirmation, core.probe:
    Prober.witnessed), read when it is needed rather than pushed at every reply."""

    def __init__(self, path: ProbePath, config: ProbeConfig | None = None, *,
                 echo_port: int = ECHO_PORT, tos: int = 0, netns: str | None = None,
                 lag: LoopLag | None = None, on_change: ChangeCallback | None = None,
                 prober_id: int | None = None,
                 on_reply_heard: Callable[["EchoProber", float, float, int], None] | None = None,
                 timer: SharedTimer | None = None,
                 others_heard: Callable[["EchoProber"], float | None] | None = None,
                 on_lost: Callable[["EchoProber", float], None] | None = None,
                 rail: RailSocket | None = None,
                 read_first: Callable[[float], None] | None = None):
        self.path = path
        self.peer4 = socket.inet_aton(path.peer)
        self.state = Prober(path.peer, config or ProbeConfig())
        self.echo_port = echo_port
        self.tos = tos
        self.netns = netns
        self.lag = lag
        self._stall_log = lag.stall_log if lag is not None else None
        self.on_change = on_change
        # (prober, kernel receive time, our send time, responder id): any reply of ours
        self.on_reply_heard = on_reply_heard
        self.on_burst_sent: Callable[["EchoProber"], None] | None = None  # the last probe of one
        self.prober_id = prober_id or _random_id()
        self.icmp_errors = 0  # ICMP errors other than port unreachable (e.g. no ARP answer)
        self.rtt_counts = [0] * (len(RTT_BUCKETS_S) + 1)  # replies per RTT bucket, last: +Inf
        self.rtt_sum_s = 0.0
        self.others_heard = others_heard
        self.on_lost = on_lost  # (prober, send time): a probe of ours was judged lost
        self.send_slot_s = 0.0  # the steady probe goes at the start of its slot (core.probe: poll)
        self._lost_seen: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._owns_rail = rail is None
        if rail is None:
            rail = RailSocket(path.port, path.source, echo_port, tos, netns,
                              on_readable=self._readable)
        self.rail: RailSocket | None = rail
        rail.attach(self)
        self.read_first = read_first if read_first is not None else self._read_rail
        self._owns_timer = timer is None
        self.timer = timer if timer is not None else SharedTimer(lag, batch=rail.outbox)
        self._reported: tuple | None = None

    # ---- lifecycle ----------------------------------------------------------

    def start(self, first_at: float | None = None) -> None:
        """Probe, the first time at `first_at` (loop time; default now). That
        sets the path's phase, which it keeps (core.probe: poll), even when
        the loop runs late for the first one: the service spreads its paths'
        probes over one interval this way."""
        self._loop = asyncio.get_running_loop()
        if self.rail is not None and self.rail.sock is None and self._owns_rail:
            self.rail.open(self._loop)
        if first_at is not None and self.state.next_send is None:
            self.state.next_send = first_at
        self._schedule()

    def close(self) -> None:
        self.timer.discard(self)
        if self._owns_timer:
            self.timer.close()
        if self.rail is not None:
            self.rail.detach(self)
            if self._owns_rail:
                self.rail.close()
            self.rail = None

    # ---- what the daemon reads -------------------------------------------------

    @property
    def sock(self) -> socket.socket | None:
        """The rail's socket, while it is open."""
        return self.rail.sock if self.rail is not None else None

    @property
    def socket_error(self) -> str:
        """Why the rail's socket cannot be opened, while it cannot."""
        return self.rail.error if self.rail is not None else ""

    @property
    def counters(self):
        return self.state.counters

    def assessment(self) -> Assessment:
        a = self.state.assessment()
        if self.socket_error:
            return Assessment(a.signal, a.severity, a.status,
                              f"{a.detail}; cannot probe: {self.socket_error}", a.confirmed)
        return a

    def peer_heard(self, at: float | None = None) -> None:
        """The peer's own probes reached our responder on this path (at `at`,
        monotonic time, which is the loop's clock; default now)."""
        self.state.peer_heard(self._loop.time() if at is None else at)

    # ---- the loop's callbacks ------------------------------------------------

    def _current_lag(self, now: float) -> float:
        return self.lag.current(now) if self.lag is not None else 0.0

    def _own_lag(self, now: float, lag: float) -> float:
        """A stall of `lag` up to `now`, seen by this path: with a meter it
        goes into the meter's one stall log (the loop's stall is every
        path's; once there, each path finds it when it judges), and the
        core is told 0; without one it is this path's own."""
        if self.lag is None:
            return lag
        if lag >= self.lag.tolerance_s:
            self.lag.stall_log.add(now - lag, now)
        return 0.0

    def due(self, now: float, lag: float) -> None:
        """The timer's call: a send is due or a deadline passed (`lag`: how late
        the loop woke, already recorded in the meter by the timer)."""
        now = self._loop.time()  # not the wake-up's: a probe is stamped when it leaves
        rail = self.rail
        if rail is not None and rail.sock is None and (
                rail.opened_at is None or now - rail.opened_at >= _RETRY_S):
            rail.open(self._loop)
        overdue = self._current_lag(now)  # a stall still going on: not in the meter yet
        # Replies already here are read before any deadline is judged (only
        # then: a wake-up that only sends has nothing to read first).
        if self.state.deadline_passed(now):
            self.read_first(now)
        state = self.state
        if self.others_heard is not None and state.state is PathState.SUSPECT:
            state.witnessed(state.others_live, self.others_heard(self))
        # With a meter, the timer's lag is in its stall log (consulted by poll); without, ours.
        host = self._stall_log
        own = self._own_lag(now, overdue) if host is not None else max(lag, overdue)
        _, sends = state.poll(now, own, host, self.send_slot_s)
        for send in sends:
            self._send(send, now)
        if (self.on_burst_sent is not None and sends and sends[-1].burst and not state.burst_due
                and state.state is PathState.SUSPECT):
            self.on_burst_sent(self)  # its confirmation's last probe is out
        self._after()

    def _read_rail(self, now: float) -> None:
        if self.rail is not None:
            self._handle(self.rail.drain(now, time.time(), self._current_lag(now)))

    def _readable(self, rail: RailSocket) -> None:
        """The loop's reader callback, for a prober with its own rail socket."""
        now = self._loop.time()
        with rail.outbox:
            self._handle(rail.drain(now, time.time(), self._current_lag(now), readable=True))

    @staticmethod
    def _handle(touched: list["EchoProber"]) -> None:
        for prober in touched:
            prober._after()

    def reply(self, fields: tuple, rx: float | None, now: float, wall: float,
              lag: float) -> None:
        """A datagram from our peer's echo port, unpacked (PACKET), with the
        kernel's receive time `rx` (unix time) if known: the hot path of
        every reply (the rail checked its size and source)."""
        magic, version, kind, _r, seq, sent_ns, prober_id, responder_id, held_us = fields
        if magic != MAGIC or version != VERSION or kind != KIND_REPLY:
            self.state.count_malformed()
            return
        if prober_id != self.prober_id:  # e.g. answers to a previous daemon
            self.state.count_stray()
            return
        waited = 0.0 if rx is None else min(max(0.0, wall - rx), _MAX_KERNEL_DELAY_S)
        sent_at, held = sent_ns * 1e-9, held_us * 1e-6
        received = now - waited
        # The path's round trip: kernel receive time - our send time - what the peer held it.
        rtt = received - sent_at - held
        if rtt < 0.0:
            rtt = 0.0
        self.rtt_counts[bisect_left(RTT_BUCKETS_S, rtt)] += 1
        self.rtt_sum_s += rtt
        # The reply sat in our socket for `waited`: this path's own stall (the
        # timer's lateness, by contrast, is the host's and is in the meter's log).
        self.state.on_reply(seq, received, now, lag if lag > waited else waited, sent_at, held,
                            self._stall_log)
        if self.on_reply_heard is not None:
            self.on_reply_heard(self, received, sent_at, responder_id)

    def _received(self, data: bytes, ancdata, flags: int, now: float, wall: float,
                  lag: float) -> None:
        """One datagram as recvmsg gives it (data, ancillary data, flags)."""
        if flags & _MSG_TRUNC or len(data) != PACKET.size:
            self.state.count_malformed()
            return
        rx, _ = _cmsgs(ancdata)
        self.reply(PACKET.unpack(data), rx, now, wall, lag)

    def icmp_error(self, err: int | None, now: float) -> None:
        """An ICMP error for a probe of ours (the rail's error queue): port
        unreachable means the peer host is up and its daemon is not."""
        if err == errno.ECONNREFUSED:
            self.state.on_refused(now)
        else:
            self.icmp_errors += 1

    def send_failed(self, seq: int, at: float, err: int) -> None:
        """The kernel refused to send probe `seq` (stamped `at`): no evidence either way."""
        self.state.on_send_error(seq, at)

    def poke(self, witness: bool = True) -> None:
        """Send a probe now: a witness's, or a steady one (see Prober.poke)."""
        now = self._loop.time()
        _, send = self.state.poke(now, witness)
        self._send(send, now)
        self._schedule()

    def _send(self, send: Send, now: float) -> None:
        rail = self.rail
        if rail is None or rail.sock is None:
            self.state.on_send_error(send.seq, now)
            return
        rail.queue(self, send.seq, now)

    def start_burst(self) -> None:
        """Confirm the held suspicion now (its rail's turn: core.railwatch):
        its first probe goes at once (a timer wake-up later would cost up to
        two milliseconds: the timer's grain and epoll's), the others on time."""
        now = self._loop.time()
        state = self.state.start_burst(now)
        if self.rail is not None and self.rail.sock is not None:
            _, sends = state.poll(now, 0.0, self._stall_log, self.send_slot_s)
            for send in sends:
                self._send(send, now)
        self._schedule()

    def _after(self) -> None:
        state = self.state
        lost_at = state.lost_sent_at
        if lost_at is not None and lost_at != self._lost_seen:
            self._lost_seen = lost_at
            if self.on_lost is not None:
                self.on_lost(self, lost_at)
        # What the verdict depends on; the assessment (text) is built only on a change.
        key = (state.state, state.degraded, bool(self.socket_error))
        if key != self._reported:
            self._reported = key
            if self.on_change is not None:
                self.on_change(self, self.assessment())
        self._schedule()

    after_change = _after

    def _schedule(self) -> None:
        rail = self.rail
        if rail is None:  # closed
            return
        now = self._loop.time()
        when = self.state.next_wakeup(self.send_slot_s)
        if when < now:
            when = now
        if rail.sock is None and rail.error:
            when = max(when, now + _RETRY_S)
        self.timer.set(self, when)


# --------------------------------------------------------------------------
# What the daemon runs
# --------------------------------------------------------------------------


@dataclass
class EchoService:
    """One responder, one prober per path, as one task.

    `on_change(path, assessment)` is called on every verdict change (and once
    for each path `set_paths` removes); the daemon turns it into a queue event.
    The responder tells each prober when the peer's own probes reach us,
    which says which way a one-way fault runs.

    `lag`: the daemon's loop-lag meter, shared with BFD (adapters.looplag);
    the service sets its heartbeat to `lag_period_s` while it runs. Without
    one the service has its own. `responder_policy`: what the responder
    answers (core.admission); by default, on the paths' source addresses and
    only to their peers."""

    paths: Iterable[ProbePath]
    config: ProbeConfig = field(default_factory=ProbeConfig)
    echo_port: int = ECHO_PORT
    listen: str = "0.0.0.0"
    tos: int = 0
    respond: bool = True
    lag_period_s: float | None = 0.025  # the loop-lag heartbeat (see adapters.looplag)
    netns: str | None = None
    on_change: Callable[[ProbePath, Assessment], None] | None = None
    lag: LoopLag | None = None
    responder_policy: ResponderPolicy | None = None

    def __post_init__(self) -> None:
        self.paths = tuple(dict.fromkeys(self.paths))
        self._owns_lag = self.lag is None
        if self.lag is None:
            self.lag = LoopLag(period_s=self.lag_period_s, tolerance_s=self.config.lag_tolerance_s)
        # One loop timer for every path; the probes its runs queue leave
        # together, one sendmmsg per rail, when the wake-up ends.
        self.outbox = Outbox()
        self.timer = SharedTimer(self.lag, batch=self.outbox)
        self.sockets: dict[tuple[str, str], RailSocket] = {}  # (port, source): the rail's socket
        self._read_at = -1  # the timer wake-up at which every rail was last read
        self._loop: asyncio.AbstractEventLoop | None = None
        self._prober_id = _random_id()
        self.probers: dict[ProbePath, EchoProber] = {p: self._prober(p) for p in self.paths}
        self._by_addresses = {(p.source, p.peer): pr for p, pr in self.probers.items()}
        policy = self.responder_policy or ResponderPolicy.build(
            {p.source for p in self.paths}, peers={p.peer for p in self.paths})
        self.responder = (EchoResponder(self.echo_port, self.listen, self.netns, policy=policy,
                                        on_heard=self._heard) if self.respond else None)
        self.responder_error = ""
        self._retry: asyncio.TimerHandle | None = None
        # Witness bookkeeping, O(1) per reply: the live paths (UP or SUSPECT)
        # by port, and the two latest replies from different paths (so any
        # path can be told the latest reply of another).
        self._live: dict[str, set[EchoProber]] = {}
        self.rails = RailWatch()  # one confirmation per rail at a time, and rail verdicts
        self.peers = PeerWatch()  # which paths each peer daemon answers (ordering evidence)
        self._assessed: dict[ProbePath, Assessment] = {}  # as of each path's last change
        self._latest: tuple[float, EchoProber | None] = (float("-inf"), None)
        self._second: float = float("-inf")
        self._started = False

    def _prober(self, path: ProbePath) -> EchoProber:
        key = (path.port, path.source)
        rail = self.sockets.get(key)
        if rail is None:
            rail = self.sockets[key] = RailSocket(path.port, path.source, self.echo_port,
                                                  self.tos, self.netns, self.outbox,
                                                  on_readable=self._readable)
        prober = EchoProber(path, self.config, echo_port=self.echo_port, tos=self.tos,
                            netns=self.netns, lag=self.lag, prober_id=self._prober_id,
                            on_change=self._changed, on_reply_heard=self._reply_heard,
                            timer=self.timer, others_heard=self._others_heard,
                            on_lost=self._lost, rail=rail, read_first=self._read_all)
        prober.state.coordinated = True  # bursts by the rail's turn
        prober.on_burst_sent = self._burst_sent
        return prober

    def _set_send_slot(self) -> None:
        slot = send_slot(self.config.interval_s, len(self.probers))
        for prober in self.probers.values():
            prober.send_slot_s = slot

    def _readable(self, rail: RailSocket) -> None:
        """A rail's socket has replies (or an ICMP error): read them all."""
        now = self._loop.time()
        # What the replies make us send (witness probes) leaves together, and
        # the timer is re-armed once for all the paths they moved.
        with self.outbox, self.timer.held():
            for prober in rail.drain(now, time.time(), self.lag.current(now), readable=True):
                prober.after_change()

    def _read_all(self, now: float) -> None:
        """Before a wake-up judges a deadline: every rail's replies so far
        (a suspect's witnesses are on other rails), once per wake-up."""
        if self._read_at == self.timer.wakeups:
            return
        self._read_at = self.timer.wakeups
        wall, lag = time.time(), self.lag.current(now)
        for rail in list(self.sockets.values()):
            for prober in rail.drain(now, wall, lag):
                prober.after_change()

    def start(self) -> None:
        if self._owns_lag or not self.lag.started:
            self.lag.start()
        if not self._owns_lag:
            self.lag.heartbeat(self.lag_period_s)
        self._started = True
        self._start_responder()
        # Spread the paths' probes evenly over one interval, and they stay
        # spread (each keeps its own cadence): N paths cost N/interval small
        # wake-ups' worth of work, never N probes (and N replies, and N
        # answers at the peer) in one lump that stalls the loop.
        probers = list(self.probers.values())
        loop = self._loop = asyncio.get_running_loop()
        for rail in self.sockets.values():  # sockets first: opening them takes time
            rail.open(loop)
        self._set_send_slot()
        start, spacing = loop.time(), self.config.interval_s / max(1, len(probers))
        for i, prober in enumerate(probers):
            prober.start(start + i * spacing)

    def close(self) -> None:
        for prober in self.probers.values():
            prober.close()
        self.outbox.close()
        for rail in self.sockets.values():
            rail.close()
        self.timer.close()
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self.responder is not None:
            self.responder.close()
        if self._owns_lag:
            self.lag.close()
        elif self._started:
            self.lag.heartbeat(None)  # the meter stays: BFD still records into it
        self._started = False

    def set_paths(self, paths: Iterable[ProbePath]) -> None:
        """Probe exactly `paths` from now on: new ones start (never up), gone
        ones stop, and those that stay keep everything they know (verdict,
        loss window, rise count, counters). For a reload whose peers changed;
        a change of timers, port or TOS needs a new service."""
        wanted = tuple(dict.fromkeys(paths))
        for path in [p for p in self.probers if p not in wanted]:
            prober = self.probers.pop(path)
            rail = prober.rail
            prober.close()
            if rail is not None and not rail.by_peer:  # the rail's last path
                rail.close()
                del self.sockets[(path.port, path.source)]
            self._assessed.pop(path, None)
            self._live.get(path.port, set()).discard(prober)
            self.peers.forget(prober)
            for other in self.rails.forget(path.port, prober):
                self._begin_burst(other)
            if self.on_change is not None:
                self.on_change(path, prober.assessment())  # the owner re-reads that port
        added = [p for p in wanted if p not in self.probers]
        for path in added:
            self.probers[path] = self._prober(path)
        self._set_send_slot()
        if self._started:
            for rail in self.sockets.values():
                rail.open(self._loop)
            for path in added:  # at a random phase: the others keep theirs
                self.probers[path].start(self._loop.time()
                                         + random.random() * self.config.interval_s)
        self.paths = wanted
        self._by_addresses = {(p.source, p.peer): pr for p, pr in self.probers.items()}

    def set_responder_policy(self, policy: ResponderPolicy) -> None:
        """Answer by `policy` from now on (rail addresses, prefixes, peers or rates changed)."""
        self.responder_policy = policy
        if self.responder is not None:
            self.responder.set_policy(policy)

    def _start_responder(self) -> None:
        """A port we cannot bind (taken) must not stop the daemon from
        probing and routing: say why, and try again."""
        self._retry = None
        if self.responder is None:
            return
        try:
            self.responder.start()
            self.responder_error = ""
        except OSError as exc:
            self.responder_error = f"echo responder on {self.listen}:{self.echo_port}: {exc}"
            self._retry = asyncio.get_running_loop().call_later(_RETRY_S, self._start_responder)

    async def run(self) -> None:
        """Probe until cancelled."""
        self.start()
        try:
            await asyncio.Event().wait()
        finally:
            self.close()

    def batching(self) -> dict[str, int]:
        """Timer wake-ups, and the rails' system calls and datagrams (how well
        probes share wake-ups and calls; logged when the daemon stops)."""
        out = {"timer_wakeups": self.timer.wakeups, "timer_runs": self.timer.runs}
        for name in ("send_calls", "sent", "recv_calls", "received", "foreign"):
            out[name] = sum(getattr(rail, name) for rail in self.sockets.values())
        return out

    def responder_counters(self) -> ResponderCounters | None:
        """The responder's counters as the daemon reports them (None: no responder)."""
        if self.responder is None:
            return None
        c = self.responder.counters
        return ResponderCounters(answered=c.answered, refused_address=c.refused_address,
                                 refused_source=c.refused_source, rate_limited=c.rate_limited,
                                 malformed=c.malformed + c.ignored)

    def assessments(self, port: str | None = None) -> tuple[Assessment, ...]:
        """Each path's assessment as of its last verdict change, or of the
        last news from the peer's own probes (which way a one-way fault
        runs). Built once per such change: the daemon reads a rail's paths at
        every change of any of them, and rebuilding them all each time was
        O(paths) per change, O(paths²) for a rail blackhole."""
        out = []
        for path, prober in self.probers.items():
            if port is not None and path.port != port:
                continue
            known = self._assessed.get(path)
            if known is None:
                known = self._assessed[path] = prober.assessment()
            out.append(known)
        return tuple(out)

    def _changed(self, prober: EchoProber, assessment: Assessment) -> None:
        """Each path's other paths are its witnesses. When one starts
        confirming a loss, it is told whether any other path is live, and a
        few live witnesses (`_WITNESS_POKES`, other rails first) probe at
        once, so its confirmation can tell a dead path from a silent host
        (core.probe: Prober.witnessed); with many paths, their steady probes'
        replies witness too. A few, not all: a rail blackhole makes every
        path of the rail suspect within one interval, and each poking every
        other path was O(paths^2) probes. Replies elsewhere are not pushed to
        the suspects: a suspect reads the latest (`_others_heard`) when it
        judges, so a reply costs O(1) whatever the number of paths."""
        state, port = prober.state.state, prober.path.port
        live = self._live.setdefault(port, set())
        if state in (PathState.UP, PathState.SUSPECT):
            live.add(prober)
        else:
            live.discard(prober)
        was_bursting = self.rails.bursting(port, prober)
        if state is PathState.SUSPECT:
            others_live = any(ps for p, ps in self._live.items()
                              if ps and (p != port or len(ps) > 1))
            prober.state.witnessed(others_live, self._others_heard(prober))
        self._assessed[prober.path] = assessment
        if self.on_change is not None:
            self.on_change(prober.path, assessment)
        # The rail's turn (core.railwatch), once the change is reported: what
        # follows may change this path again, or others of its rail.
        if state is PathState.SUSPECT:
            if prober.state.burst_held and self.rails.suspect(port, prober):
                self._begin_burst(prober)
            return
        self.peers.confirming(prober, False)
        for other in self.rails.settled(port, prober):
            self._begin_burst(other)
        if state is PathState.DOWN and was_bursting:  # DOWN by its own confirmation
            self.rails.burst_lost(port, prober.state.suspect_since)
            self._judge_rail(port, poke=True)

    def _begin_burst(self, prober: EchoProber) -> None:
        """`prober` confirms its suspicion now, and a few witnesses probe at once."""
        if prober.state.state is not PathState.SUSPECT or not prober.state.burst_held:
            return
        prober.start_burst()
        self.peers.confirming(prober, True)
        for other in self._witnesses(prober):
            other.poke()

    def _burst_sent(self, prober: EchoProber) -> None:
        """`prober`'s last confirmation probe is out: a probe now, on another
        path to the same peer daemon (another rail first), is answered after
        them unless they were lost (core.peerwatch), so the confirmation
        ends a round trip and a margin from now, not a timeout."""
        other = self.peers.witness(prober, lambda p: p.path.port, self._can_witness)
        if other is not None:
            other.poke()

    @staticmethod
    def _can_witness(prober: EchoProber) -> bool:
        return prober.state.state is PathState.UP and prober.sock is not None

    def _lost(self, prober: EchoProber, sent_at: float) -> None:
        port = prober.path.port
        self.rails.lost(port, prober, sent_at)
        if self.rails.silent(port):
            self._judge_rail(port)

    def _judge_rail(self, port: str, poke: bool = False) -> None:
        """Take every live path of `port` DOWN if its rail is dead (core.railwatch);
        if it may be but some live paths have not lost a probe in its silence
        yet, and `poke`, probe those now rather than wait for their turn."""
        live = self._live.get(port) or set()
        if not self.rails.dead(port, live):
            if poke:
                # On a rail too small for a verdict the probe is a steady one
                # (its loss raises suspicion): each path confirms on its own.
                witness = self.rails.judges(live)
                for other in self.rails.unconfirmed(port, live):
                    if other.state.state is PathState.UP and other.sock is not None:
                        other.poke(witness)
            return
        victims = list(live)
        self.rails.concluded(port)
        now = self._loop.time() if self._loop is not None else victims[0]._loop.time()
        why = (f"no reply on any path of {port} since a path of it lost a probe and its "
               f"confirmation, and {self.rails.evidence} or more of its "
               f"{len(victims)} live paths lost probes too: the rail, not the peers")
        for other in victims:
            other.state.rail_down(now, why)
        for other in victims:
            other._after()

    def _witnesses(self, suspect: EchoProber) -> list[EchoProber]:
        """Up to `_WITNESS_POKES` UP paths other than `suspect`, those on other ports first."""
        chosen: list[EchoProber] = []
        ports = sorted(self._live, key=lambda port: port == suspect.path.port)
        for port in ports:
            for other in self._live[port]:
                if (other is not suspect and other.state.state is PathState.UP
                        and other.sock is not None):
                    chosen.append(other)
                    if len(chosen) >= _WITNESS_POKES:
                        return chosen
        return chosen

    def _reply_heard(self, prober: EchoProber, received_at: float, sent_at: float,
                     responder_id: int) -> None:
        self.rails.heard(prober.path.port, received_at)
        for other in self.peers.answered(prober, responder_id):
            # The same peer daemon answered a probe of ours sent at `sent_at`.
            other.state.peer_answered(sent_at, received_at)
            other._schedule()
        latest, latest_by = self._latest
        if prober is latest_by:
            self._latest = (max(latest, received_at), prober)
        elif received_at >= latest:
            self._second, self._latest = latest, (received_at, prober)
        else:
            self._second = max(self._second, received_at)

    def _others_heard(self, prober: EchoProber) -> float | None:
        """The latest reply any path but `prober` received (None: none yet)."""
        latest, latest_by = self._latest
        at = self._second if prober is latest_by else latest
        return None if at == float("-inf") else at

    def _heard(self, heard: dict[tuple[str, str], float]) -> None:
        """The responder's batch: which peers' probes reached which of our addresses, when."""
        for pair, at in heard.items():
            prober = self._by_addresses.get(pair)
            if prober is not None and prober.sock is not None:
                prober.peer_heard(at)
                # The detail says which way a one-way fault runs: rebuild it.
                self._assessed.pop(prober.path, None)
