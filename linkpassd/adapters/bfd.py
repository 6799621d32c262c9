"""BFD over UDP (RFC 5881 single hop): sockets and timers around linkpassd.core.bfd.

Per rail endpoint (interface + local address) one receive socket on port 3784,
bound to the device (SO_BINDTODEVICE) so a packet that arrived on another rail
can never feed this rail's session. Per session one transmit socket bound to a
source port from 49152-65535 (RFC 5881 4: one port for the life of the
session) and connected to the peer's port 3784.

GTSM (RFC 5881 5): every packet leaves with TTL 255 and every packet received
must carry TTL 255, read per datagram from IP_RECVTTL ancillary data. The check
is done here rather than with IP_MINTTL so that rejected packets are counted.

Timers come from the core's `next_deadline()`. A timer is only re-armed when
the deadline moves *earlier*; when it fires for a deadline that has since moved
later, the session simply ticks with nothing due and the timer is re-armed, so
a packet every 10 ms costs no cancel/re-arm churn.

A stalled process must not read as a dead path (RESEARCH 4: FRR and Cisco
false flaps under CPU starvation). Two defences:
  * before a session ticks, its receive socket is drained, so packets that
    arrived while the loop was stalled count before the detection time is
    judged;
  * every timer records how late it fired (event-loop scheduling lag), and a
    receive callback reads the lag off any timer already overdue. Each state
    change is reported with the lag of the callback that saw it and the worst
    lag over the preceding detection time, so the probe core can tell "the
    path went silent" from "we were not running" -- including a Down the peer
    signals because *our* stall made it time out.

Malformed input never raises: everything dropped is counted by reason.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import errno
import ipaddress
import os
import random
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from linkpassd.adapters.looplag import LoopLag
from linkpassd.core.bfd import (
    SLOW_TX_US,
    Discarded,
    Invalid,
    Send,
    Session,
    SessionConfig,
    State,
    StateChange,
    decode,
    diag_name,
    encode,
)

BFD_PORT = 3784
SRC_PORT_MIN, SRC_PORT_MAX = 49152, 65535
GTSM_TTL = 255
IP_RECVTTL = getattr(socket, "IP_RECVTTL", 12)  # Linux include/uapi/linux/in.h
SO_BINDTODEVICE = getattr(socket, "SO_BINDTODEVICE", 25)
IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)
CLONE_NEWNET = 0x40000000
RECV_BUFSIZE = 512  # a control packet is 24 bytes, 52 with the largest auth section
_TTL_CMSG = socket.CMSG_SPACE(struct.calcsize("i"))

log = structlog.get_logger("linkpassd.bfd")


# --------------------------------------------------------------------------
# Values handed out
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class PeerSpec:
    """One single-hop session: our address on `ifname` toward the neighbour's."""

    ifname: str
    local: str
    peer: str
    config: SessionConfig = SessionConfig()
    name: str = ""  # e.g. the rail; defaults to "<ifname>:<peer>"

    @property
    def key(self) -> str:
        return self.name or f"{self.ifname}:{self.peer}"


@dataclass(frozen=True)
class BfdEvent:
    """A session changed state. `ever_up` False on a Down means "never
    established", not "went down" (FRR #4133). `lag_s` is how late the
    callback that saw the change ran; `max_lag_s` the worst scheduling lag
    over the detection time (plus one 1 s slow-start interval) before it:
    when that is a large part of `detection_time_s`, the silence may have
    been ours, or the peer's Down a consequence of it."""

    name: str
    spec: PeerSpec
    change: StateChange
    detection_time_s: float | None
    since_last_rx_s: float | None
    lag_s: float
    max_lag_s: float
    recheck: bool = False  # a Down reported again on request (BfdAgent.recheck)

    @property
    def old(self) -> State:
        return self.change.old

    @property
    def new(self) -> State:
        return self.change.new

    @property
    def diag(self) -> int:
        return self.change.diag

    @property
    def ever_up(self) -> bool:
        return self.change.ever_up


# --------------------------------------------------------------------------
# Sockets
# --------------------------------------------------------------------------


_libc = None


def stall_window(detection_s: float | None) -> float:
    """How far back a loop stall can explain a Down (and how long a recheck
    waits): one detection time (3 s, the slow-start one, before the
    remote's timers are known) plus the one 1 s slow-start interval a peer
    that timed us out may take to say so."""
    return (detection_s or 3.0) + SLOW_TX_US / 1e6


def _setns(path: str) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def in_netns(netns: str | None, make: Callable[[], socket.socket]) -> socket.socket:
    """Create a socket inside a named network namespace. A socket keeps the
    namespace it was created in, so a short-lived thread enters the namespace
    (setns affects only the calling thread), builds it and exits; the rest of
    the process never changes namespace."""
    if netns is None:
        return make()
    box: dict[str, object] = {}

    def target() -> None:
        try:
            _setns(f"/run/netns/{netns}")
            box["sock"] = make()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box["exc"] = exc

    thread = threading.Thread(target=target, name=f"netns-{netns}", daemon=True)
    thread.start()
    thread.join()
    if "exc" in box:
        raise box["exc"]  # type: ignore[misc]
    return box["sock"]  # type: ignore[return-value]


def _base_socket(ifname: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, ifname.encode())
    except BaseException:
        sock.close()
        raise
    return sock


def open_rx_socket(ifname: str, local: str) -> socket.socket:
    """IP_FREEBIND: the rail's address may not be configured yet when the
    daemon starts; the socket receives once it is."""
    sock = _base_socket(ifname)
    try:
        sock.setsockopt(socket.IPPROTO_IP, IP_RECVTTL, 1)
        sock.setsockopt(socket.IPPROTO_IP, IP_FREEBIND, 1)
        sock.bind((local, BFD_PORT))
    except BaseException:
        sock.close()
        raise
    return sock


def open_tx_socket(ifname: str, local: str, peer: str, rng: random.Random,
                   attempts: int = 64) -> socket.socket:
    """Bound to a random free source port in 49152-65535, TTL 255, connected
    to the peer's 3784 (so it never receives the peer's packets, which go to
    the receive socket)."""
    last: OSError | None = None
    for _ in range(attempts):
        sock = _base_socket(ifname)
        try:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, GTSM_TTL)
            sock.bind((local, rng.randint(SRC_PORT_MIN, SRC_PORT_MAX)))
            sock.connect((peer, BFD_PORT))
            return sock
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE:
                raise
            last = exc
    raise OSError(errno.EADDRINUSE, f"no free BFD source port after {attempts} tries") from last


def received_ttl(ancdata) -> int | None:
    for level, kind, data in ancdata:
        if level == socket.IPPROTO_IP and kind == socket.IP_TTL and len(data) >= 4:
            return struct.unpack("i", data[:4])[0]
    return None


# --------------------------------------------------------------------------
# The agent
# --------------------------------------------------------------------------


class _Endpoint:
    def __init__(self, ifname: str, local: str, sock: socket.socket):
        self.ifname = ifname
        self.local = local
        self.sock = sock
        self.by_peer: dict[str, _Run] = {}


class _Run:
    def __init__(self, spec: PeerSpec, session: Session, endpoint: _Endpoint,
                 tx: socket.socket | None):
        self.spec = spec
        self.session = session
        self.endpoint = endpoint
        self.tx = tx
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at: float | None = None


class BfdAgent:
    """Runs BFD sessions on the current event loop.

    `emit` is called synchronously with each BfdEvent and must not block (e.g.
    `queue.put_nowait`). `lag` is the loop-lag meter shared with the echo
    probes (the daemon's one, adapters.looplag): every timer's lateness is
    recorded there, and a state change carries the worst lag the meter saw
    over the detection time. `on_lag(now, lag)`, if given, sees every lag
    this agent measures. `netns` names a namespace to open sockets in (labs
    and tests); the daemon itself runs inside the host's namespace. `run()`
    waits until cancelled and re-raises anything that failed inside a socket
    or timer callback, so a TaskGroup ends the daemon as it would for a task.
    """

    def __init__(self, emit: Callable[[BfdEvent], None] | None = None, *,
                 netns: str | None = None, rng: random.Random | None = None,
                 on_lag: Callable[[float, float], None] | None = None,
                 loop: asyncio.AbstractEventLoop | None = None, lag: LoopLag | None = None):
        self.emit = emit or (lambda event: None)
        self.on_lag = on_lag
        self.netns = netns
        self.rng = rng or random.SystemRandom()
        self._loop = loop
        self.runs: dict[str, _Run] = {}
        self.endpoints: dict[tuple[str, str], _Endpoint] = {}
        self.by_discr: dict[int, _Run] = {}
        self.drops: collections.Counter[str] = collections.Counter()
        self.counters: collections.Counter[str] = collections.Counter()
        self.lag = lag if lag is not None else LoopLag()
        self._failure: asyncio.Future | None = None

    # ---- lifecycle ---------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def now(self) -> float:
        return self.loop.time()

    async def __aenter__(self) -> BfdAgent:
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()

    async def run(self) -> None:
        self._failure = self._failure or self.loop.create_future()
        try:
            await self._failure
        finally:
            self.close()

    def close(self, admin_down: bool = True) -> None:
        """Remove every session. AdminDown by default: a peer that sees AdminDown
        must not treat it as a path failure (RFC 5882 3.2); silence would look
        like one after a detection time."""
        for name in list(self.runs):
            self.remove(name, admin_down=admin_down)

    # ---- sessions ----------------------------------------------------------

    def add(self, spec: PeerSpec) -> str:
        """Open (or share) the endpoint, open the transmit socket, and start
        the session in Down; its first packet goes out at once."""
        for address in (spec.local, spec.peer):
            ipaddress.IPv4Address(address)  # single hop over IPv4 (198.18/15 in the labs)
        name = spec.key
        if name in self.runs:
            raise ValueError(f"BFD session {name} already exists")
        ep_key = (spec.ifname, spec.local)
        endpoint = self.endpoints.get(ep_key)
        if endpoint is not None and spec.peer in endpoint.by_peer:
            raise ValueError(f"a BFD session to {spec.peer} on {spec.ifname} already exists")
        created = endpoint is None
        if created:
            sock = in_netns(self.netns, lambda: open_rx_socket(spec.ifname, spec.local))
            endpoint = _Endpoint(spec.ifname, spec.local, sock)
            self.endpoints[ep_key] = endpoint
            self.loop.add_reader(sock.fileno(), self._on_readable, endpoint)
        try:
            tx = in_netns(self.netns, lambda: open_tx_socket(spec.ifname, spec.local,
                                                             spec.peer, self.rng))
        except BaseException:
            if created:
                self._close_endpoint(endpoint)
            raise
        discr = self._new_discriminator()
        session = Session.create(discr, spec.config, self.now(), seed=self.rng.getrandbits(64))
        run = _Run(spec, session, endpoint, tx)
        self.runs[name] = run
        self.by_discr[discr] = run
        endpoint.by_peer[spec.peer] = run
        log.info("bfd_session_added", session=name, port=spec.ifname, local=spec.local,
                 peer=spec.peer, discriminator=discr,
                 source_port=tx.getsockname()[1])
        self._act(run, *session.tick(self.now()))
        return name

    def remove(self, name: str, admin_down: bool = True) -> None:
        """Stop a session; with `admin_down` one AdminDown packet tells the
        peer this is administrative, not a path failure (RFC 5882 3.2)."""
        run = self.runs.pop(name, None)
        if run is None:
            return
        if admin_down and run.session.state is not State.ADMIN_DOWN:
            run.session, actions = run.session.admin_down(self.now())
            for action in actions:
                if isinstance(action, Send):
                    self._send(run, action)
        if run.timer is not None:
            run.timer.cancel()
        if run.tx is not None:
            run.tx.close()
            run.tx = None
        self.by_discr.pop(run.session.local_discr, None)
        endpoint = run.endpoint
        endpoint.by_peer.pop(run.spec.peer, None)
        if not endpoint.by_peer:
            self._close_endpoint(endpoint)

    def session(self, name: str) -> Session:
        return self.runs[name].session

    def admin_down(self, name: str) -> None:
        run = self.runs[name]
        self._act(run, *run.session.admin_down(self.now()))

    def admin_up(self, name: str) -> None:
        run = self.runs[name]
        self._act(run, *run.session.admin_up(self.now()))

    def recheck(self, name: str, detection_s: float | None) -> None:
        """Report a session's Down again one window from now (its detection
        time plus one 1 s slow-start interval), with the loop lag seen over
        that window, if it is still the same Down and nothing has been heard
        from the peer since. For a Down set aside because our own event loop
        was late: a healthy peer that timed us out is heard again within the
        window and the session comes back up; a dead path stays silent, and
        the report made while the loop kept time is the one to believe."""
        run = self.runs.get(name)
        if run is None or run.session.state is not State.DOWN:
            return
        window = stall_window(detection_s)
        self.loop.call_later(window, self._recheck, run, run.session.since, detection_s, window)

    def _recheck(self, run: _Run, since: float, detection_s: float | None, window: float) -> None:
        try:
            s = run.session
            if self.runs.get(run.spec.key) is not run or s.state is not State.DOWN \
                    or s.since != since:
                return  # gone, or changed since: that change was reported
            if s.last_rx is not None:  # the peer talks: the handshake is under way
                self.recheck(run.spec.key, detection_s)
                return
            now = self.now()
            self.emit(BfdEvent(
                name=run.spec.key, spec=run.spec,
                change=StateChange(State.DOWN, State.DOWN, s.local_diag, now, s.remote_state,
                                   s.ever_up),
                detection_time_s=detection_s, since_last_rx_s=None, lag_s=0.0,
                max_lag_s=self.lag.worst_since(now - window), recheck=True))
        except Exception as exc:  # noqa: BLE001 - surfaced through run()
            self._fail(exc)

    def set_timers(self, name: str, config: SessionConfig) -> None:
        run = self.runs[name]
        self._act(run, *run.session.set_timers(config, self.now()))

    def status(self) -> list[dict]:
        """Per session, for the control API and metrics."""
        out = []
        for name, run in self.runs.items():
            s = run.session
            detect = s.detection_time_us
            out.append({
                "name": name, "port": run.spec.ifname, "local": run.spec.local,
                "peer": run.spec.peer, "state": str(s.state), "remote_state": str(s.remote_state),
                "diag": diag_name(s.local_diag), "ever_up": s.ever_up, "up_count": s.up_count,
                "down_count": s.down_count, "local_discriminator": s.local_discr,
                "remote_discriminator": s.remote_discr,
                "transmit_interval_ms": s.transmit_interval_us / 1000,
                "detection_time_ms": detect / 1000 if detect is not None else None,
                "source_port": run.tx.getsockname()[1] if run.tx else None,
            })
        return out

    # ---- internals ---------------------------------------------------------

    def _new_discriminator(self) -> int:
        while True:
            discr = self.rng.getrandbits(32)
            if discr and discr not in self.by_discr:
                return discr

    def _close_endpoint(self, endpoint: _Endpoint) -> None:
        self.endpoints.pop((endpoint.ifname, endpoint.local), None)
        try:
            self.loop.remove_reader(endpoint.sock.fileno())
        finally:
            endpoint.sock.close()

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = self.loop.create_future()
        if not self._failure.done():
            self._failure.set_exception(exc)

    def _on_readable(self, endpoint: _Endpoint) -> None:
        """A reader has no deadline of its own, so the loop's lateness is read
        off the sessions' timers: one already overdue says how long the loop
        did not run. After a stall the reader runs before the overdue timer
        (asyncio handles I/O first), so without this a peer's Down caused by
        our own stall would be reported with no lag at all."""
        try:
            now = self.now()
            overdue = [now - r.timer_at for r in endpoint.by_peer.values()
                       if r.timer_at is not None and r.timer_at < now]
            lag = max(overdue, default=0.0)
            if lag:
                self._record_lag(lag, now)
            self._drain(endpoint, lag)
        except Exception as exc:  # noqa: BLE001 - surfaced through run()
            self._fail(exc)

    def _drain(self, endpoint: _Endpoint, lag: float = 0.0, limit: int = 256) -> None:
        """Read what the socket holds (bounded, so a flood cannot starve the loop)."""
        sock = endpoint.sock
        for _ in range(limit):
            if sock.fileno() < 0:
                return
            try:
                data, ancdata, flags, addr = sock.recvmsg(RECV_BUFSIZE, _TTL_CMSG)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. ICMP errors queued on the socket
                self.counters[f"rx_error_{errno.errorcode.get(exc.errno, exc.errno)}"] += 1
                continue
            self._datagram(endpoint, data, ancdata, flags, addr, self.now(), lag)

    def _record_lag(self, lag: float, now: float) -> None:
        self.lag.record(now, lag)
        if self.on_lag is not None:
            self.on_lag(now, lag)

    def _drop(self, reason: str) -> None:
        self.drops[reason] += 1

    def _datagram(self, endpoint: _Endpoint, data: bytes, ancdata, flags: int, addr,
                  now: float, lag: float = 0.0) -> None:
        """One received datagram: GTSM, decode, demultiplex, then the session."""
        self.counters["rx_datagrams"] += 1
        if flags & socket.MSG_TRUNC:
            return self._drop("oversize")
        ttl = received_ttl(ancdata)
        if ttl is None:
            return self._drop("no_ttl")
        if ttl != GTSM_TTL:
            return self._drop("ttl")
        pkt = decode(data)
        if isinstance(pkt, Invalid):
            return self._drop(str(pkt.reason))
        src = addr[0] if addr else ""
        if pkt.your_discr:
            run = self.by_discr.get(pkt.your_discr)
            if run is None:
                return self._drop("unknown_discriminator")
            if run.endpoint is not endpoint or run.spec.peer != src:
                return self._drop("wrong_source")
        else:  # RFC 5881 3: select by source address and interface
            run = endpoint.by_peer.get(src)
            if run is None:
                return self._drop("no_session_for_source")
        self.counters["rx_packets"] += 1
        self._act(run, *run.session.receive(pkt, now), lag=lag, now=now)

    def _act(self, run: _Run, session: Session, actions, lag: float = 0.0,
             now: float | None = None) -> None:
        """Perform the core's actions in order, then re-arm the timer."""
        before, run.session = run.session, session
        now = self.now() if now is None else now
        for action in actions:
            if isinstance(action, Send):
                self._send(run, action)
            elif isinstance(action, StateChange):
                self._report(run, before, action, lag, now)
            elif isinstance(action, Discarded):
                self._drop(action.reason)
        self._arm(run)

    def _send(self, run: _Run, action: Send) -> None:
        if run.tx is None:
            return
        try:
            run.tx.send(encode(action.packet))
            self.counters["tx_packets"] += 1
        except OSError as exc:
            # A stale BFD packet is worthless: drop rather than queue (ENOBUFS,
            # EAGAIN) and count; ECONNREFUSED reports an earlier ICMP.
            self.counters[f"tx_error_{errno.errorcode.get(exc.errno, exc.errno)}"] += 1

    def _report(self, run: _Run, before: Session, change: StateChange, lag: float,
                now: float) -> None:
        """Timers are taken from the session as it was before the change: a
        detection expiry has already made the session forget the remote's."""
        detect_us = before.detection_time_us
        detect_s = detect_us / 1e6 if detect_us else None
        window = stall_window(detect_s)
        event = BfdEvent(
            name=run.spec.key, spec=run.spec, change=change, detection_time_s=detect_s,
            since_last_rx_s=(now - before.last_rx) if before.last_rx is not None else None,
            lag_s=lag, max_lag_s=max(lag, self.lag.worst_since(now - window - lag)))
        log.info("bfd_state", session=event.name, port=run.spec.ifname, peer=run.spec.peer,
                 old=str(change.old), new=str(change.new), diag=diag_name(change.diag),
                 remote_state=str(change.remote_state), ever_up=change.ever_up,
                 lag_ms=round(lag * 1000, 3), max_lag_ms=round(event.max_lag_s * 1000, 3),
                 detection_ms=round(detect_s * 1000, 3) if detect_s else None)
        self.emit(event)

    def _arm(self, run: _Run) -> None:
        deadline = run.session.next_deadline()
        if deadline is None:
            if run.timer is not None:
                run.timer.cancel()
            run.timer, run.timer_at = None, None
            return
        if run.timer is not None and run.timer_at is not None and run.timer_at <= deadline:
            return  # fires early; it re-arms for the later deadline then
        if run.timer is not None:
            run.timer.cancel()
        run.timer_at = deadline
        run.timer = self.loop.call_at(deadline, self._on_timer, run, deadline)

    def _on_timer(self, run: _Run, scheduled: float) -> None:
        try:
            run.timer, run.timer_at = None, None
            if self.runs.get(run.spec.key) is not run:
                return
            now = self.now()
            lag = max(0.0, now - scheduled)
            self._record_lag(lag, now)
            self._drain(run.endpoint, lag)  # what arrived while we were late counts first
            now = self.now()
            session, actions = run.session.tick(now)
            self._act(run, session, actions, lag=lag, now=now)
        except Exception as exc:  # noqa: BLE001 - surfaced through run()
            self._fail(exc)

