"""The validation prober: a fixed number of UDP echo probes to each peer, counted.

Fleet validation (linkpassd.adapters.hostcheck) asks every host to probe its
planned peers on each rail. Unlike the daemon's path probers (adapters.echo),
which judge a path continuously, this one sends a known number of probes
in two phases and reports what came back:

- a low-rate phase (`rate_pps` per target for `low_s`): loss and RTT
  percentiles (p50/p99) of the path as traffic sees it;
- a burst phase (`burst_pps` per target for `burst_s`): many probes in a
  short time, so low-rate random loss shows (what N probes resolve:
  validate.localize.detectable_loss, the one place that computes it).

Each target's probes are spread over `flows` UDP source ports (one socket
each, taken in turn), and each flow is counted: a fabric that hashes ECMP
on the 5-tuple (RoCEv2 puts its entropy in the UDP source port) sends the
flows of one pair over different spines, so a dead spine link kills some of
a pair's flows and spares the others - the signature that tells it from a
dead port, which kills them all (validate.localize).

It speaks the daemon's echo wire format (core.wire) to the
responders every linkpassd runs (or labs/echopeer.py): nothing new to open
in fabric ACLs. Those responders answer only sources in their
`fabric_prefixes` or probe peers, at most `responder_rate_pps` (default
5,000) per source: a burst rate above that reads as loss.

`flows` sockets per rail, each bound to the rail's port (SO_BINDTODEVICE) and
address, so a probe takes that rail whatever the routing tables say; replies
are matched by prober id, the socket's sequence number and the peer's address. RTT is the
kernel's receive time (SO_TIMESTAMPNS) minus the send time minus what the
peer says it held the request (`held_us`), so a busy receiver does not
inflate it.

It runs on its own thread (`run_probes`): thousands of sends per second in
the daemon's event loop would delay the daemon's own probes and reconcile
loop; the thread releases the GIL in every send, receive and poll. The
thread stops by itself at the end of its phases plus a reply grace (bounded),
or within `_POLL_S` of being told to stop.
"""

from __future__ import annotations

import asyncio
import math
import select
import socket
import threading
import time
from dataclasses import dataclass, field

from linkpassd.adapters.echoresponder import _ANCILLARY, _RECV_BYTES, SO_TIMESTAMPNS, _cmsgs, _random_id, _udp_socket
from linkpassd.core.direction import Receipts
from linkpassd.core.wire import ECHO_PORT, KIND_REPLY, KIND_REQUEST, EchoPacket, parse

_POLL_S = 0.02  # longest wait between looks at the stop flag and the send schedule
_SENDS_PER_ROUND = 256  # then read replies before sending more
_READS_PER_ROUND = 512
_LATE_S = 0.5  # a phase's sends still owed this long after it ended are given up (counted)
_MAX_KERNEL_DELAY_S = 1.0
_RCVBUF = 1 << 20
# A peer whose neighbour entry does not resolve (ARP) holds our datagrams in
# its queue (up to net.ipv4.neigh.*.unres_qlen_bytes, ~200 KiB), charged to
# the sending socket: with the default send buffer (the same size) one dead
# neighbour would stop every probe of the rail with EAGAIN. A larger buffer
# keeps the other peers' probes going.
_SNDBUF = 4 << 20
SO_RCVBUFFORCE = 33
SO_SNDBUFFORCE = 32
LOW, BURST = 0, 1
FLOWS = 8  # source ports per rail: with 2 spines, a pair whose 8 flows all die
# by ECMP chance (a dead spine link) has odds (3/4)^8 = 10 %; over a leaf's
# few cross-leaf pairs, all of them ~1e-4 (that would read as dead uplinks)
MAX_FLOWS = 64


@dataclass(frozen=True)
class Target:
    """Probe `peer` (its host `peer_host`, for the report) from `source` on `port`."""

    rail: str
    port: str
    source: str
    peer: str
    peer_host: str = ""


@dataclass(frozen=True)
class Phases:
    rate_pps: float
    low_s: float
    burst_pps: float
    burst_s: float
    grace_s: float = 0.5  # after the last send, replies are awaited this long

    def count(self, phase: int) -> int:
        """Probes per target in a phase."""
        rate, span = (self.rate_pps, self.low_s) if phase == LOW else (self.burst_pps, self.burst_s)
        return max(0, math.floor(rate * span + 1e-9))

    @property
    def budget_s(self) -> float:
        return self.low_s + self.burst_s + self.grace_s + 2 * _LATE_S


@dataclass
class PairTally:
    target: Target
    sent: int = 0
    received: int = 0
    burst_sent: int = 0
    burst_received: int = 0
    rtts_s: list[float] = field(default_factory=list)  # low phase
    burst_rtts_s: list[float] = field(default_factory=list)
    duplicates: int = 0  # replies to a probe already answered (or given up)
    # Per source port (both phases): probes sent and replies received.
    flow_sent: list[int] = field(default_factory=list)
    flow_received: list[int] = field(default_factory=list)
    next_flow: int = 0
    # The responder's receipts per flow (core.direction): each flow numbers
    # its own probes to this target, and the responder counts per flow.
    flow_receipts: list[Receipts] = field(default_factory=list)
    flow_ordinal: list[int] = field(default_factory=list)

    @property
    def requests_lost(self) -> int:
        """Lost probes (both phases) classed as requests lost on the way to the peer."""
        return sum(r.requests_lost for r in self.flow_receipts)

    @property
    def replies_lost(self) -> int:
        """Lost probes classed as replies lost on the way back."""
        return sum(r.replies_lost for r in self.flow_receipts)

    @property
    def receipts(self) -> bool:
        """Whether the peer's responder returned receipts."""
        return any(r.receipted for r in self.flow_receipts)

    @property
    def flows(self) -> int:
        """Source ports that carried at least one probe."""
        return sum(n > 0 for n in self.flow_sent)

    @property
    def flows_silent(self) -> int:
        """Of those, the ones no reply came back on."""
        return sum(n > 0 and got == 0 for n, got in zip(self.flow_sent, self.flow_received))

    def rtt_us(self, quantile: float) -> int:
        """Nearest-rank percentile of the low phase's RTTs (the burst's when
        the low phase got none), in microseconds; 0 when nothing came back."""
        values = sorted(self.rtts_s or self.burst_rtts_s)
        if not values:
            return 0
        rank = max(1, math.ceil(quantile * len(values)))
        return min(2**32 - 1, round(values[rank - 1] * 1e6))


@dataclass
class _Flow:
    """One source port of a rail."""

    index: int
    sock: socket.socket
    pending: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # seq -> (tally, phase,
    # the probe's number among this flow's probes to that target: receipts count per target)
    seq: int = 0


@dataclass
class _Rail:
    port: str
    source: str
    flows: list[_Flow]
    tallies: list[int]  # indexes into the prober's tallies


class ValidationProber:
    """Blocking; `run` on a thread (see `run_probes`)."""

    def __init__(self, targets: list[Target], phases: Phases, *, echo_port: int = ECHO_PORT,
                 netns: str | None = None, flows: int = FLOWS) -> None:
        if not 1 <= flows <= MAX_FLOWS:
            raise ValueError(f"flows must be 1..{MAX_FLOWS}, not {flows!r}")
        self.targets = list(targets)
        self.phases = phases
        self.echo_port = echo_port
        self.netns = netns
        self.flows = flows
        self.prober_id = _random_id()
        self.tallies = [PairTally(t) for t in self.targets]
        self.problems: list[str] = []  # checks that did not run: pairs not probed at all
        self.notes: list[str] = []  # the check ran, weakened: fewer probes or flows than planned
        self.stray = 0  # replies not ours or from an address we did not probe
        self.unsent: dict[str, int] = {}  # why a due probe could not be sent -> how many
        self._rails: list[_Rail] = []

    # ------------------------------------------------------------ sockets

    def _open(self) -> None:
        groups: dict[tuple[str, str, str], list[int]] = {}
        for i, t in enumerate(self.targets):
            groups.setdefault((t.rail, t.port, t.source), []).append(i)
        for (rail, port, source), members in groups.items():
            flows: list[_Flow] = []
            why = ""
            for k in range(self.flows):
                sock, why = self._socket(port, source)
                if sock is None:
                    break
                flows.append(_Flow(k, sock))
            if not flows:
                self.problems.append(f"{rail}: cannot probe from {source} on {port}: {why}; "
                                     f"its {len(members)} pairs not probed")
                continue
            if len(flows) < self.flows:
                self.notes.append(f"{rail}: only {len(flows)} of {self.flows} source ports "
                                     f"open on {port}: {why}")
            for i in members:
                self.tallies[i].flow_sent = [0] * len(flows)
                self.tallies[i].flow_received = [0] * len(flows)
                self.tallies[i].flow_receipts = [Receipts() for _ in flows]
                self.tallies[i].flow_ordinal = [0] * len(flows)
            self._rails.append(_Rail(port, source, flows, members))

    def _socket(self, port: str, source: str) -> tuple[socket.socket | None, str]:
        """A probe socket on `port` from `source`, on a port of its own; or why not."""
        try:
            sock = _udp_socket(self.netns)
        except OSError as exc:
            return None, f"cannot open a probe socket: {exc}"
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, port.encode())
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            for force, plain, size in ((SO_RCVBUFFORCE, socket.SO_RCVBUF, _RCVBUF),
                                       (SO_SNDBUFFORCE, socket.SO_SNDBUF, _SNDBUF)):
                try:  # beyond net.core.[rw]mem_max needs CAP_NET_ADMIN (the daemon has it)
                    sock.setsockopt(socket.SOL_SOCKET, force, size)
                except PermissionError:
                    sock.setsockopt(socket.SOL_SOCKET, plain, size)
            sock.bind((source, 0))
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            return None, str(exc.strerror or exc)
        return sock, ""

    def _close(self) -> None:
        for rail in self._rails:
            for flow in rail.flows:
                flow.sock.close()
        self._rails = []

    # ------------------------------------------------------------ the run

    def run(self, stop: threading.Event) -> None:
        """Both phases, then the grace for late replies; returns early when
        `stop` is set. Results are in `tallies`, `problems` and `notes`."""
        try:
            self._open()
            if not self._rails:
                return
            poller = select.poll()
            by_fd = {}
            for rail in self._rails:
                for flow in rail.flows:
                    poller.register(flow.sock.fileno(), select.POLLIN)
                    by_fd[flow.sock.fileno()] = (rail, flow)
            start = time.monotonic()
            for phase, span in ((LOW, self.phases.low_s), (BURST, self.phases.burst_s)):
                if stop.is_set():
                    return
                start = self._phase(phase, start, span, poller, by_fd, stop)
            self._await_replies(start + self.phases.grace_s, poller, by_fd, stop)
        finally:
            self._close()
            for why, count in sorted(self.unsent.items()):
                self.notes.append(f"{count} probes could not be sent: {why} "
                                  "(not counted as sent)")

    def _phase(self, phase: int, start: float, span: float, poller, by_fd,
               stop: threading.Event) -> float:
        """Send this phase's probes, evenly spread: target i's k-th at
        start + (k + i/N) / rate. Returns when the next phase may start."""
        per_target = self.phases.count(phase)
        rate = self.phases.rate_pps if phase == LOW else self.phases.burst_pps
        if per_target == 0 or rate <= 0:
            return start + max(0.0, span)
        slots = [(rail, i) for rail in self._rails for i in rail.tallies]
        total = per_target * len(slots)
        period = 1.0 / (rate * len(slots))
        done = 0
        give_up = start + span + _LATE_S
        while done < total and not stop.is_set():
            now = time.monotonic()
            if now > give_up:
                break
            due = min(total, math.floor((now - start) / period) + 1)
            for j in range(done, min(due, done + _SENDS_PER_ROUND)):
                rail, i = slots[j % len(slots)]
                self._send(rail, i, phase)
            done = max(done, min(due, done + _SENDS_PER_ROUND))
            wait = 0.0 if done < due else min(_POLL_S, start + done * period - time.monotonic())
            self._read(poller, by_fd, max(0.0, wait))
        if done < total:
            self.notes.append(
                f"{'burst' if phase == BURST else 'low-rate'} phase: sent {done} of {total} "
                f"probes in {span:g} s (this host could not keep up; the rest were not sent "
                "and are not counted)")
        return max(start + span, time.monotonic())

    def _send(self, rail: _Rail, index: int, phase: int) -> None:
        tally = self.tallies[index]
        flow = rail.flows[tally.next_flow % len(rail.flows)]  # the target's flows in turn
        tally.next_flow += 1
        flow.seq = (flow.seq + 1) & 0xFFFFFFFF
        packet = EchoPacket(KIND_REQUEST, flow.seq, time.monotonic_ns(), self.prober_id).encode()
        try:
            flow.sock.sendto(packet, (tally.target.peer, self.echo_port))
        except OSError as exc:  # a full send buffer, no route, the port down: not sent
            why = f"{tally.target.rail} ({rail.port}): {exc.strerror or exc}"
            self.unsent[why] = self.unsent.get(why, 0) + 1
            return
        ordinal = tally.flow_ordinal[flow.index] = tally.flow_ordinal[flow.index] + 1
        flow.pending[flow.seq] = (index, phase, ordinal)
        tally.flow_sent[flow.index] += 1
        if phase == LOW:
            tally.sent += 1
        else:
            tally.burst_sent += 1

    def _await_replies(self, until: float, poller, by_fd, stop: threading.Event) -> None:
        while not stop.is_set() and any(f.pending for r in self._rails for f in r.flows):
            left = until - time.monotonic()
            if left <= 0:
                return
            self._read(poller, by_fd, min(_POLL_S, left))

    def _read(self, poller, by_fd, wait_s: float) -> None:
        try:
            ready = poller.poll(wait_s * 1000.0)
        except InterruptedError:
            return
        for fd, _events in ready:
            entry = by_fd.get(fd)
            if entry is not None:
                self._drain(*entry)

    def _drain(self, rail: _Rail, flow: _Flow) -> None:
        for _ in range(_READS_PER_ROUND):
            try:
                data, ancdata, flags, src = flow.sock.recvmsg(_RECV_BYTES, _ANCILLARY)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # an ICMP error for an earlier send
                continue
            now, wall = time.monotonic(), time.time()
            packet, _why = parse(data, bool(flags & socket.MSG_TRUNC))
            if packet is None or packet.kind != KIND_REPLY or packet.prober_id != self.prober_id:
                self.stray += 1
                continue
            entry = flow.pending.get(packet.seq)
            if entry is None:
                self._duplicate(rail, src)
                continue
            index, phase, ordinal = entry
            tally = self.tallies[index]
            if src[0] != tally.target.peer or src[1] != self.echo_port:
                self.stray += 1
                continue
            del flow.pending[packet.seq]
            tally.flow_received[flow.index] += 1
            tally.flow_receipts[flow.index].on_reply(ordinal, packet.received)
            rx, _ = _cmsgs(ancdata)
            waited = 0.0 if rx is None else min(max(0.0, wall - rx), _MAX_KERNEL_DELAY_S)
            rtt = max(0.0, now - waited - packet.sent_ns * 1e-9 - packet.held_us * 1e-6)
            if phase == LOW:
                tally.received += 1
                tally.rtts_s.append(rtt)
            else:
                tally.burst_received += 1
                tally.burst_rtts_s.append(rtt)

    def _duplicate(self, rail: _Rail, src) -> None:
        for index in rail.tallies:
            if self.tallies[index].target.peer == src[0]:
                self.tallies[index].duplicates += 1
                return
        self.stray += 1


async def run_probes(targets: list[Target], phases: Phases, *, echo_port: int = ECHO_PORT,
                     netns: str | None = None, flows: int = FLOWS) -> ValidationProber:
    """Run a ValidationProber on its own thread; the finished prober. If the
    caller is cancelled the thread is told to stop (it does within _POLL_S)."""
    prober = ValidationProber(targets, phases, echo_port=echo_port, netns=netns, flows=flows)
    if not targets:
        return prober
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[BaseException | None] = loop.create_future()
    stop = threading.Event()

    def settle(error: BaseException | None) -> None:
        if not finished.done():
            finished.set_result(error)

    def body() -> None:
        error: BaseException | None = None
        try:
            prober.run(stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            error = exc
        try:
            loop.call_soon_threadsafe(settle, error)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    thread = threading.Thread(target=body, name="validation-prober", daemon=True)
    thread.start()
    try:
        error = await finished
    except asyncio.CancelledError:
        stop.set()
        raise
    if error is not None:
        raise error
    return prober
