"""BFD (RFC 5880, single hop per RFC 5881): control packet codec and session state machine.

Asynchronous mode only: no authentication, no Echo function, no Demand mode of
our own. Switches in GPU fabrics run BFD toward hosts, so every rule here is the
RFC's, section by section, and the names follow the RFC's state variables
(bfd.SessionState -> `state`, bfd.RemoteMinRxInterval -> `remote_min_rx_us` ...).

Pure: no sockets, no clocks, no randomness source. `now` is monotonic seconds
passed in by the caller; intervals are integer microseconds as on the wire.
The periodic-transmission jitter (RFC 5880 6.8.7) is drawn from a small
deterministic generator whose seed the adapter injects, so a session is a plain
value and any run can be replayed exactly.

A `Session` is immutable. `receive`, `tick`, `admin_down`, `admin_up` and
`set_timers` return the next session and the actions to perform, in order:
`Send` (put this packet on the wire now), `StateChange` (old, new, diag) and
`Discarded` (why a packet the codec accepted was ignored by the session).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, replace

VERSION = 1
HEADER_LEN = 24  # the mandatory section; 26 is the minimum with the A bit set
SLOW_TX_US = 1_000_000  # 6.8.3: DesiredMinTxInterval while the session is not Up
# How long a session can take from Down to Up, as when the link under it
# comes back: three-way (Down, Init, Up) at the slow-start rate, one packet a
# second from each end. Until then its Down is no word on the path.
BRING_UP_S = 2 * SLOW_TX_US / 1e6
MAX_INTERVAL_US = 0xFFFFFFFF
_HEADER = struct.Struct("!BBBBIIIII")
_MASK64 = (1 << 64) - 1


class State(enum.IntEnum):
    ADMIN_DOWN = 0
    DOWN = 1
    INIT = 2
    UP = 3

    def __str__(self) -> str:
        return ("AdminDown", "Down", "Init", "Up")[self.value]


class Diag(enum.IntEnum):
    """Diagnostic codes (RFC 5880 4.1). Unknown received codes stay plain ints."""

    NONE = 0
    CONTROL_DETECTION_TIME_EXPIRED = 1
    ECHO_FUNCTION_FAILED = 2
    NEIGHBOR_SIGNALED_SESSION_DOWN = 3
    FORWARDING_PLANE_RESET = 4
    PATH_DOWN = 5
    CONCATENATED_PATH_DOWN = 6
    ADMINISTRATIVELY_DOWN = 7
    REVERSE_CONCATENATED_PATH_DOWN = 8


def diag_of(value: int) -> Diag | int:
    try:
        return Diag(value)
    except ValueError:
        return value


def diag_name(value: int) -> str:
    d = diag_of(value)
    return d.name.lower() if isinstance(d, Diag) else f"diag{value}"


# --------------------------------------------------------------------------
# Codec
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ControlPacket:
    """The mandatory section of a BFD Control packet (RFC 5880 4.1).

    `length` is what goes in the Length field; encode() appends zero bytes
    when it is larger than 24, so tests can build any wire image."""

    my_discr: int
    your_discr: int = 0
    state: State = State.DOWN
    diag: int = Diag.NONE
    detect_mult: int = 3
    desired_min_tx_us: int = SLOW_TX_US
    required_min_rx_us: int = SLOW_TX_US
    required_min_echo_rx_us: int = 0
    poll: bool = False
    final: bool = False
    cpi: bool = False  # C: control plane independent
    auth: bool = False  # A
    demand: bool = False  # D
    multipoint: bool = False  # M
    version: int = VERSION
    length: int = HEADER_LEN


_FLAG_BITS = (("poll", 0x20), ("final", 0x10), ("cpi", 0x08), ("auth", 0x04),
              ("demand", 0x02), ("multipoint", 0x01))
_RANGES = (("version", 7), ("diag", 31), ("detect_mult", 255), ("length", 255),
           ("my_discr", 0xFFFFFFFF), ("your_discr", 0xFFFFFFFF),
           ("desired_min_tx_us", 0xFFFFFFFF), ("required_min_rx_us", 0xFFFFFFFF),
           ("required_min_echo_rx_us", 0xFFFFFFFF))


def encode(pkt: ControlPacket) -> bytes:
    """Wire image of `pkt`. Encodes whatever it is given (tests build invalid
    packets with it); only values that do not fit their field are refused."""
    for name, top in _RANGES:
        value = getattr(pkt, name)
        if not 0 <= value <= top:
            raise ValueError(f"{name}={value} does not fit its field (0..{top})")
    flags = 0
    for name, bit in _FLAG_BITS:
        if getattr(pkt, name):
            flags |= bit
    head = _HEADER.pack((pkt.version << 5) | int(pkt.diag), (int(pkt.state) << 6) | flags,
                        pkt.detect_mult, pkt.length, pkt.my_discr, pkt.your_discr,
                        pkt.desired_min_tx_us, pkt.required_min_rx_us,
                        pkt.required_min_echo_rx_us)
    return head + bytes(max(0, pkt.length - HEADER_LEN))


class Reason(enum.StrEnum):
    """Why a datagram is not a usable control packet (RFC 5880 6.8.6, in order)."""

    TRUNCATED = "truncated"  # shorter than the mandatory section
    VERSION = "version"
    LENGTH_TOO_SHORT = "length_too_short"
    LENGTH_EXCEEDS_DATAGRAM = "length_exceeds_datagram"
    DETECT_MULT_ZERO = "detect_mult_zero"
    MULTIPOINT = "multipoint"
    MY_DISCR_ZERO = "my_discriminator_zero"
    YOUR_DISCR_ZERO = "your_discriminator_zero"  # only valid in Down/AdminDown
    AUTH_NOT_CONFIGURED = "auth_not_configured"


@dataclass(frozen=True)
class Invalid:
    reason: Reason
    detail: str = ""


def decode(data: bytes | bytearray | memoryview) -> ControlPacket | Invalid:
    """Parse and apply the stateless reception checks of 6.8.6. Never raises:
    what arrives on port 3784 is untrusted input. Authentication is never
    configured here, so a set A bit is a discard (6.8.6)."""
    try:
        size = len(data)
        if size < HEADER_LEN:
            return Invalid(Reason.TRUNCATED, f"{size} bytes")
        (b0, b1, mult, length, my_discr, your_discr, tx, rx,
         echo) = _HEADER.unpack_from(data, 0)
    except (TypeError, struct.error) as exc:  # not bytes-like at all
        return Invalid(Reason.TRUNCATED, type(exc).__name__)
    version = b0 >> 5
    if version != VERSION:
        return Invalid(Reason.VERSION, f"version {version}")
    auth = bool(b1 & 0x04)
    minimum = 26 if auth else HEADER_LEN
    if length < minimum:
        return Invalid(Reason.LENGTH_TOO_SHORT, f"length {length} < {minimum}")
    if length > size:
        return Invalid(Reason.LENGTH_EXCEEDS_DATAGRAM, f"length {length} > datagram {size}")
    if mult == 0:
        return Invalid(Reason.DETECT_MULT_ZERO)
    if b1 & 0x01:
        return Invalid(Reason.MULTIPOINT)
    if my_discr == 0:
        return Invalid(Reason.MY_DISCR_ZERO)
    state = State(b1 >> 6)
    if your_discr == 0 and state not in (State.DOWN, State.ADMIN_DOWN):
        return Invalid(Reason.YOUR_DISCR_ZERO, f"state {state}")
    if auth:
        return Invalid(Reason.AUTH_NOT_CONFIGURED)
    return ControlPacket(
        my_discr=my_discr, your_discr=your_discr, state=state, diag=diag_of(b0 & 0x1F),
        detect_mult=mult, desired_min_tx_us=tx, required_min_rx_us=rx,
        required_min_echo_rx_us=echo, poll=bool(b1 & 0x20), final=bool(b1 & 0x10),
        cpi=bool(b1 & 0x08), auth=False, demand=bool(b1 & 0x02), multipoint=False,
        version=version, length=length)


# --------------------------------------------------------------------------
# Session
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionConfig:
    """What the operator asks for. While the session is not Up the advertised
    Desired Min TX is raised to at least 1 s (6.8.3 slow start)."""

    desired_min_tx_us: int = 300_000
    required_min_rx_us: int = 300_000
    detect_mult: int = 3
    passive: bool = False  # 6.1: wait for the remote to speak first

    def __post_init__(self) -> None:
        if not 1 <= self.desired_min_tx_us <= MAX_INTERVAL_US:
            raise ValueError(f"desired_min_tx_us must be 1..{MAX_INTERVAL_US}")
        if not 0 <= self.required_min_rx_us <= MAX_INTERVAL_US:  # 0: send me nothing
            raise ValueError(f"required_min_rx_us must be 0..{MAX_INTERVAL_US}")
        if not 1 <= self.detect_mult <= 255:
            raise ValueError("detect_mult must be 1..255")


@dataclass(frozen=True)
class Send:
    packet: ControlPacket
    why: str  # periodic | state | final | admin


@dataclass(frozen=True)
class StateChange:
    old: State
    new: State
    diag: int
    at: float
    remote_state: State  # AdminDown here means "peer shut it", not a path failure (RFC 5882)
    ever_up: bool


@dataclass(frozen=True)
class Discarded:
    reason: str


Action = Send | StateChange | Discarded


def jitter_factor(u: float, detect_mult: int) -> float:
    """6.8.7: each periodic interval is reduced by 0-25 %; with a detect
    multiplier of 1 it must lie within 75-90 % so a single late packet cannot
    expire the remote's detection time. `u` is uniform in [0, 1)."""
    u = min(max(u, 0.0), 1.0)
    return 0.75 + (0.15 if detect_mult == 1 else 0.25) * u


def _splitmix64(state: int) -> tuple[int, float]:
    """One step of splitmix64: (next state, uniform float in [0, 1))."""
    state = (state + 0x9E3779B97F4A7C15) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return state, (z >> 11) / float(1 << 53)


@dataclass(frozen=True)
class Session:
    """One BFD session: the RFC 5880 6.8.1 state variables plus our timers.

    Advertised timer values (what goes on the wire) and the values used for our
    own transmit interval and detection time differ only while a Poll Sequence
    is outstanding in Up state (6.8.3): a slower transmit rate, or a faster
    receive rate, takes effect only once the remote has answered with Final."""

    local_discr: int
    config: SessionConfig
    state: State = State.DOWN
    remote_state: State = State.DOWN
    remote_discr: int = 0
    local_diag: int = Diag.NONE
    remote_min_rx_us: int = 1  # 6.8.1 initial value
    remote_desired_tx_us: int = 0  # 0: nothing received yet
    remote_detect_mult: int = 0
    remote_demand: bool = False
    desired_min_tx_us: int = SLOW_TX_US  # advertised
    required_min_rx_us: int = SLOW_TX_US  # advertised
    confirmed_tx_us: int = SLOW_TX_US  # last values the remote answered Final to
    confirmed_rx_us: int = SLOW_TX_US
    poll: tuple[int, int] | None = None  # (tx, rx) being polled for
    last_rx: float | None = None
    last_tx: float | None = None
    next_tx: float = 0.0
    tx_interval_us: int = 0  # the interval next_tx was computed with
    rng: int = 0
    ever_up: bool = False
    since: float = 0.0  # when `state` was entered
    up_count: int = 0
    down_count: int = 0  # Up -> anything

    # ---- construction ------------------------------------------------------

    @classmethod
    def create(cls, local_discr: int, config: SessionConfig, now: float, seed: int = 0) -> Session:
        """A new session in Down state. An active session sends its first
        packet at once (`tick(now)`), then at the slow-start rate."""
        if not 1 <= local_discr <= 0xFFFFFFFF:
            raise ValueError("local discriminator must be a non-zero 32-bit value")
        tx = max(config.desired_min_tx_us, SLOW_TX_US)
        return cls(local_discr=local_discr, config=config, desired_min_tx_us=tx,
                   required_min_rx_us=config.required_min_rx_us, confirmed_tx_us=tx,
                   confirmed_rx_us=config.required_min_rx_us, next_tx=now, since=now,
                   rng=seed & _MASK64)

    # ---- derived timers ----------------------------------------------------

    @property
    def effective_tx_us(self) -> int:
        """Our DesiredMinTx as used for our own transmit interval: while Up an
        increase waits for the Poll Sequence to end (6.8.3)."""
        if self.state is State.UP:
            return min(self.desired_min_tx_us, self.confirmed_tx_us)
        return self.desired_min_tx_us

    @property
    def effective_rx_us(self) -> int:
        """Our RequiredMinRx as used for the detection time: while Up a
        reduction waits for the Poll Sequence to end (6.8.3)."""
        if self.state is State.UP:
            return max(self.required_min_rx_us, self.confirmed_rx_us)
        return self.required_min_rx_us

    @property
    def transmit_interval_us(self) -> int:
        """6.8.2/6.8.7: the larger of our DesiredMinTx and the remote's RequiredMinRx."""
        return max(self.effective_tx_us, self.remote_min_rx_us)

    @property
    def detection_time_us(self) -> int | None:
        """6.8.4: remote Detect Mult x max(our RequiredMinRx, remote DesiredMinTx);
        None until a packet from the remote has told us its timers."""
        if not self.remote_detect_mult:
            return None
        return self.remote_detect_mult * max(self.effective_rx_us, self.remote_desired_tx_us)

    @property
    def detect_deadline(self) -> float | None:
        """When silence from the remote expires the session (Init/Up) or makes us
        forget its discriminator (any state, 6.8.1 bfd.RemoteDiscr)."""
        detect = self.detection_time_us
        if self.last_rx is None or detect is None:
            return None
        return self.last_rx + detect / 1e6

    @property
    def may_send(self) -> bool:
        """6.8.7: a passive session stays silent until the remote has spoken."""
        return not (self.config.passive and self.remote_discr == 0)

    @property
    def periodic_tx_enabled(self) -> bool:
        """6.8.7: no periodic packets when the remote asked for none (RequiredMinRx 0),
        when passive and the remote has not spoken, or when the remote runs
        Demand mode with both ends Up."""
        if self.remote_min_rx_us == 0 or not self.may_send:
            return False
        if self.remote_demand and self.state is State.UP and self.remote_state is State.UP:
            return False
        return True

    def next_deadline(self) -> float | None:
        """The earliest `now` at which tick() has something to do."""
        times = [t for t in (self.next_tx if self.periodic_tx_enabled else None,
                             self.detect_deadline) if t is not None]
        return min(times) if times else None

    # ---- events ------------------------------------------------------------

    def receive(self, pkt: ControlPacket, now: float) -> tuple[Session, list[Action]]:
        """A packet that decode() accepted and the adapter demultiplexed to this
        session (6.8.6 from "If the Your Discriminator field is nonzero")."""
        if pkt.your_discr and pkt.your_discr != self.local_discr:
            return self, [Discarded("your_discriminator_mismatch")]
        s = replace(self, remote_discr=pkt.my_discr, remote_state=pkt.state,
                    remote_demand=pkt.demand, remote_min_rx_us=pkt.required_min_rx_us,
                    remote_desired_tx_us=pkt.desired_min_tx_us,
                    remote_detect_mult=pkt.detect_mult)
        if s.poll is not None and pkt.final:
            tx, rx = s.poll
            s = replace(s, poll=None, confirmed_tx_us=tx, confirmed_rx_us=rx)
            s = s._poll_if_changed()
        if s.state is State.ADMIN_DOWN:
            return s, [Discarded("admin_down")]
        s = replace(s, last_rx=now)
        old = s.state
        new, diag = _transition(old, pkt.state)
        actions: list[Action] = []
        if new is not old:
            s, change = s._enter(new, diag if diag is not None else s.local_diag, now)
            actions.append(change)
        if pkt.poll:  # 6.8.7: answer a Poll at once, whatever the timers or state
            s, send = s._send(now, "final", final=True)
            actions.append(send)
        elif new is not old:
            s, send = s._send(now, "state")
            actions.append(send)
        else:
            s = s._reschedule_if_interval_changed(now)
        return s, actions

    def tick(self, now: float) -> tuple[Session, list[Action]]:
        """Run what is due at `now`: detection expiry, then periodic transmission."""
        s = self
        actions: list[Action] = []
        deadline = s.detect_deadline
        if deadline is not None and now >= deadline:
            if s.state in (State.INIT, State.UP):
                s, change = s._enter(State.DOWN, Diag.CONTROL_DETECTION_TIME_EXPIRED, now)
                actions.append(change)
            # 6.8.1/6.8.18: a detection time of silence forgets the remote.
            s = replace(s, remote_discr=0, remote_state=State.DOWN, remote_min_rx_us=1,
                        remote_demand=False, last_rx=None)
            if actions and s.may_send:
                s, send = s._send(now, "state")
                actions.append(send)
        if s.periodic_tx_enabled and now >= s.next_tx:
            s, send = s._send(now, "admin" if s.state is State.ADMIN_DOWN else "periodic")
            actions.append(send)
        return s, actions

    def admin_down(self, now: float, diag: int = Diag.ADMINISTRATIVELY_DOWN
                   ) -> tuple[Session, list[Action]]:
        """6.8.16: hold the session down. Packets keep going out (AdminDown) so
        the remote learns it was administrative, not a path failure."""
        if self.state is State.ADMIN_DOWN:
            return self, []
        s, change = self._enter(State.ADMIN_DOWN, diag, now)
        s = replace(s, poll=None)  # received packets are discarded: no Final can end it
        if not s.may_send:
            return s, [change]
        s, send = s._send(now, "admin")
        return s, [change, send]

    def admin_up(self, now: float) -> tuple[Session, list[Action]]:
        """6.8.16: leave AdminDown for Down; the handshake starts again."""
        if self.state is not State.ADMIN_DOWN:
            return self, []
        s, change = self._enter(State.DOWN, Diag.NONE, now)
        if not s.may_send:
            return s, [change]
        s, send = s._send(now, "state")
        return s, [change, send]

    def set_timers(self, config: SessionConfig, now: float) -> tuple[Session, list[Action]]:
        """Change the configured timers; a Poll Sequence tells the remote (6.8.3)."""
        s = replace(self, config=config)._apply_slow_start()
        return s._reschedule_if_interval_changed(now), []

    # ---- internals ---------------------------------------------------------

    def _enter(self, new: State, diag: int, now: float) -> tuple[Session, StateChange]:
        old = self.state
        if new is State.UP:
            diag = Diag.NONE  # the diagnostic explains the last time it was not Up
        s = replace(self, state=new, local_diag=diag, since=now,
                    ever_up=self.ever_up or new is State.UP,
                    up_count=self.up_count + (new is State.UP),
                    down_count=self.down_count + (old is State.UP))
        s = s._apply_slow_start()
        return s, StateChange(old, new, int(diag), now, self.remote_state, s.ever_up)

    def _apply_slow_start(self) -> Session:
        """Advertise the configured timers only while Up (6.8.3) and start a Poll
        Sequence when the advertised values change."""
        tx = self.config.desired_min_tx_us
        if self.state is not State.UP:
            tx = max(tx, SLOW_TX_US)
        s = replace(self, desired_min_tx_us=tx, required_min_rx_us=self.config.required_min_rx_us)
        if (tx, s.required_min_rx_us) != (self.desired_min_tx_us, self.required_min_rx_us):
            s = s._poll_if_changed()
        return s

    def _poll_if_changed(self) -> Session:
        """Start a Poll Sequence for the advertised values unless one is already
        out (it is restarted for the newer values when its Final arrives) or
        the remote already confirmed them. Never in AdminDown: nothing received
        there is processed, so no Final could end it."""
        wanted = (self.desired_min_tx_us, self.required_min_rx_us)
        if self.poll is not None or self.state is State.ADMIN_DOWN:
            return self
        if wanted == (self.confirmed_tx_us, self.confirmed_rx_us):
            return self
        return replace(self, poll=wanted)

    def _packet(self, final: bool) -> ControlPacket:
        return ControlPacket(
            my_discr=self.local_discr, your_discr=self.remote_discr, state=self.state,
            diag=self.local_diag, detect_mult=self.config.detect_mult,
            desired_min_tx_us=self.desired_min_tx_us, required_min_rx_us=self.required_min_rx_us,
            required_min_echo_rx_us=0,  # no Echo function
            poll=self.poll is not None and not final,  # P and F are never both set
            final=final)

    def _send(self, now: float, why: str, final: bool = False) -> tuple[Session, Send]:
        """Emit a packet and schedule the next periodic one a jittered
        interval after it: any packet we send restarts the period."""
        interval = self.transmit_interval_us
        rng, u = _splitmix64(self.rng)
        delay = interval * jitter_factor(u, self.config.detect_mult) / 1e6
        s = replace(self, last_tx=now, next_tx=now + delay, tx_interval_us=interval, rng=rng)
        return s, Send(self._packet(final), why)

    def _reschedule_if_interval_changed(self, now: float) -> Session:
        """6.8.3: a changed transmit interval is honoured at once, measured from
        the last packet sent (never sooner than the new interval allows)."""
        interval = self.transmit_interval_us
        if interval == self.tx_interval_us or self.last_tx is None:
            return self
        rng, u = _splitmix64(self.rng)
        delay = interval * jitter_factor(u, self.config.detect_mult) / 1e6
        return replace(self, next_tx=self.last_tx + delay, tx_interval_us=interval, rng=rng)


# 6.8.6 state transitions on reception: (local state, received state) -> (new state, diag or None).
# AdminDown locally never gets here (the packet is discarded first).
TRANSITIONS: dict[tuple[State, State], tuple[State, Diag | None]] = {
    (State.DOWN, State.ADMIN_DOWN): (State.DOWN, None),
    (State.DOWN, State.DOWN): (State.INIT, None),
    (State.DOWN, State.INIT): (State.UP, None),
    (State.DOWN, State.UP): (State.DOWN, None),  # the remote must time out first
    (State.INIT, State.ADMIN_DOWN): (State.DOWN, Diag.NEIGHBOR_SIGNALED_SESSION_DOWN),
    (State.INIT, State.DOWN): (State.INIT, None),
    (State.INIT, State.INIT): (State.UP, None),
    (State.INIT, State.UP): (State.UP, None),
    (State.UP, State.ADMIN_DOWN): (State.DOWN, Diag.NEIGHBOR_SIGNALED_SESSION_DOWN),
    (State.UP, State.DOWN): (State.DOWN, Diag.NEIGHBOR_SIGNALED_SESSION_DOWN),
    (State.UP, State.INIT): (State.UP, None),
    (State.UP, State.UP): (State.UP, None),
}


def _transition(local: State, received: State) -> tuple[State, Diag | None]:
    return TRANSITIONS[(local, received)]
