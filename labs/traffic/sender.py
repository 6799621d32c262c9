"""RoCEv2 lab sender, in the two ways RoCE traffic can be bound to a path.

    python -m labs.traffic.sender --mode kernel-path --src 198.18.0.1 --dst 198.18.1.2 \
        --duration 5 --report tx.json
    python -m labs.traffic.sender --mode qp-pinned --dst 198.18.1.2 --duration 5 --report tx.json

kernel-path: a UDP socket bound to ``--src``; the kernel routes every packet,
as it does for Soft-RoCE (rxe) and TCP, so a route change moves the flow at
once. The ICRC is computed over the IP/UDP headers the kernel will write (the
socket forces DF, so the kernel's IP ID is 0; TTL, TOS and checksums are
masked by the ICRC anyway).

qp-pinned: like a hardware queue pair. At connect it resolves the route with
no source (interface, next hop, preferred source) and the next hop's MAC, then
writes whole Ethernet frames to that interface through AF_PACKET: route
changes do not move it. It requests an ACK on every packet; when the ACK
timer expires ``--retry-count`` times in a row it "reconnects": re-resolves
the route (possibly another interface and source) and carries on with the
next PSN. While it cannot resolve a path it sends nothing and retries every
``--ack-timeout``; a real QP would go to the error state and leave the retry
to the application (NCCL, a launcher), which is what this loop stands for.

``--hold``: connect, print "sender: armed" and wait for a line "go" on stdin
before the clock starts, so several senders launched together (each taking
its own time to import and connect) start their schedules within a
millisecond of each other, and a trial's timeline holds for all of them.

Both pace packets on a CLOCK_MONOTONIC schedule (slot k at t0 + k/rate, no
sleep drift), stop by themselves, end with a few closing packets
(SEND_ONLY_WITH_IMMEDIATE carrying the number of PSNs used) so the receiver
can count tail loss, and write one JSON report.
"""

from __future__ import annotations

import errno
import math
import os
import select
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

from labs.traffic import _cli
from labs.traffic._sockets import drain, port_holder, raw_udp_socket, udp_socket_df
from labs.traffic.addresses import AddressError, is_lab_address, lab_address
from labs.traffic.packets import (
    DATA_PAYLOAD_LEN,
    FIN_PAYLOAD_LEN,
    IMM_LEN,
    OP_RC_ACK,
    OP_RC_SEND_ONLY,
    OP_RC_SEND_ONLY_IMM,
    PSN_MASK,
    ROCE_PORT,
    Invalid,
    RoceFlow,
    encode_data_payload,
    encode_fin_payload,
    parse_ipv4,
)
from labs.traffic.qp import AckTracker, Path, PathRefused, ResolveError, resolve_path

PROG = "sender"
MODES = ("kernel-path", "qp-pinned")
MAX_BURST = 16  # a late loop sends at most this many due packets at once, then skips slots
WAKE_S = 0.05
FIN_GAP_S = 0.01
MAX_ACK_TIMEOUT_S = 10.0
MAX_RETRY_COUNT = 7  # IBA's 3-bit retry_cnt
HOLD_MAX_S = 60.0  # --hold: a sender never released gives up by itself


@dataclass(frozen=True)
class SenderConfig:
    mode: str
    dst: str
    src: str | None = None  # kernel-path only
    rate: float = _cli.DEFAULT_RATE
    duration: float = _cli.DEFAULT_DURATION_S
    port: int = ROCE_PORT
    sport: int = _cli.DEFAULT_SPORT  # fixed: RoCEv2 carries flow entropy here; 0 = ephemeral
    qp: int = _cli.DEFAULT_SENDER_QP
    dst_qp: int = _cli.DEFAULT_RECEIVER_QP
    first_psn: int = 0
    ack_timeout: float = 0.05
    retry_count: int = 3
    fin_copies: int = 3
    hold: bool = False

    def validated(self) -> SenderConfig:
        """Raise AddressError/UsageError with a one-line message."""
        if self.mode not in MODES:
            raise _cli.UsageError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        lab_address(self.dst, "--dst")
        if self.mode == "kernel-path":
            if self.src is None:
                raise _cli.UsageError("--src is required with --mode kernel-path")
            lab_address(self.src, "--src")
        elif self.src is not None:
            raise _cli.UsageError(
                "--src is only for kernel-path; qp-pinned takes its source from the route"
            )
        if not 0 < self.rate <= _cli.MAX_RATE:
            raise _cli.UsageError(
                f"--rate must be in (0, {_cli.MAX_RATE:g}] packets/s, got {self.rate:g}"
            )
        _cli.check_duration(self.duration)
        if self.rate * self.duration < 1:
            raise _cli.UsageError("--rate x --duration is less than one packet")
        _cli.check_port(self.port, "--port")
        if not 0 <= self.sport < 65536:
            raise _cli.UsageError(f"--sport must be 0..65535, got {self.sport}")
        _cli.check_qp(self.qp, "--qp")
        _cli.check_qp(self.dst_qp, "--dst-qp")
        if not 0 <= self.first_psn <= PSN_MASK:
            raise _cli.UsageError(f"--first-psn must be a 24-bit PSN, got {self.first_psn}")
        if not 0 < self.ack_timeout <= MAX_ACK_TIMEOUT_S:
            raise _cli.UsageError(
                f"--ack-timeout must be in (0, {MAX_ACK_TIMEOUT_S:g}] s, got {self.ack_timeout:g}"
            )
        if not 1 <= self.retry_count <= MAX_RETRY_COUNT:
            raise _cli.UsageError(
                f"--retry-count must be 1..{MAX_RETRY_COUNT}, got {self.retry_count}"
            )
        if not 0 <= self.fin_copies <= 10:
            raise _cli.UsageError(f"--fin-copies must be 0..10, got {self.fin_copies}")
        return self

    def command(self, report: str, python: str = sys.executable) -> list[str]:
        """The argv that runs this sender, e.g. for ``ip netns exec`` or a Mininet host."""
        argv = [
            python,
            "-m",
            "labs.traffic.sender",
            "--mode",
            self.mode,
            "--dst",
            self.dst,
            "--rate",
            repr(self.rate),
            "--duration",
            repr(self.duration),
            "--report",
            report,
            "--port",
            str(self.port),
            "--sport",
            str(self.sport),
            "--qp",
            hex(self.qp),
            "--dst-qp",
            hex(self.dst_qp),
            "--first-psn",
            str(self.first_psn),
            "--ack-timeout",
            repr(self.ack_timeout),
            "--retry-count",
            str(self.retry_count),
            "--fin-copies",
            str(self.fin_copies),
        ]
        if self.hold:
            argv.append("--hold")
        return argv if self.src is None else [*argv, "--src", self.src]


def _psn_or_none(ext: int | None) -> int | None:
    return None if ext is None else ext & PSN_MASK


def _errname(e: OSError) -> str:
    return errno.errorcode.get(e.errno or 0, str(e.errno))


class KernelPath:
    """Per-packet kernel routing: sendto() on a UDP socket bound to the source."""

    def __init__(self, cfg: SenderConfig):
        self.cfg = cfg
        _check_kernel_route(cfg.dst, cfg.src)
        self.sock = udp_socket_df((cfg.src, cfg.sport))
        try:
            sport = self.sock.getsockname()[1]
            self.data = RoceFlow(
                cfg.src,
                cfg.dst,
                opcode=OP_RC_SEND_ONLY,
                dqpn=cfg.dst_qp,
                rest_len=DATA_PAYLOAD_LEN,
                sport=sport,
                dport=cfg.port,
            )
            self.fin = RoceFlow(
                cfg.src,
                cfg.dst,
                opcode=OP_RC_SEND_ONLY_IMM,
                dqpn=cfg.dst_qp,
                rest_len=IMM_LEN + FIN_PAYLOAD_LEN,
                sport=sport,
                dport=cfg.port,
            )
        except BaseException:
            self.sock.close()
            raise
        self.sport = sport

    def connected(self) -> bool:
        return True

    def send(self, flow: RoceFlow, psn: int, ackreq: bool, rest: bytes) -> None:
        # Never block: a flow stuck behind an unresolved neighbour fills the
        # socket's send buffer, and a blocked sender would stop the clock the
        # schedule runs on. A full buffer is a packet lost (EAGAIN, counted).
        self.sock.sendto(
            flow.udp_payload(psn, ackreq, rest), socket.MSG_DONTWAIT, (self.cfg.dst, self.cfg.port)
        )

    def sent(self, ext_psn: int, now: float) -> None:
        pass

    def wait(self, timeout: float) -> bool:
        if timeout > 0:
            time.sleep(timeout)
        return False

    def report(self) -> dict:
        return {"sport": self.sport}

    def close(self) -> None:
        self.sock.close()


def _check_kernel_route(dst: str, src: str | None) -> None:
    """Refuse to start if the kernel would send this flow through a non-lab gateway."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    with IPRoute() as ipr:
        try:
            routes = list(ipr.route("get", dst=dst, src=src))
        except NetlinkError:
            return  # no route now: sendto() will fail and be counted; routes may appear
    for r in routes:
        gw = r.get("gateway")
        if gw is not None and not is_lab_address(gw):
            raise PathRefused(f"route to {dst} goes via {gw}, outside the lab")


class QpPinned:
    """A queue pair's path: resolved at connect, re-resolved only on reconnect."""

    def __init__(self, cfg: SenderConfig, resolve: Callable[..., Path] = resolve_path):
        self.cfg = cfg
        self.resolve = resolve
        self.sport = cfg.sport or _cli.DEFAULT_SPORT
        self.tracker = AckTracker(cfg.ack_timeout, cfg.retry_count, cfg.first_psn)
        self.path: Path | None = None
        self.pkt: socket.socket | None = None
        self.data: RoceFlow | None = None
        self.fin: RoceFlow | None = None
        self.connects: list[dict] = []
        self.reconnects: list[dict] = []
        self.connect_failures: Counter[str] = Counter()
        self.ack_invalid: Counter[str] = Counter()
        self.next_attempt = -math.inf
        self.pending: dict | None = None  # the reconnect in progress
        self.disconnected_s = 0.0
        self._down_since: float | None = None
        self.acks = raw_udp_socket()
        self.hold: socket.socket | None = None
        try:
            self.hold = port_holder(("0.0.0.0", cfg.port))
        except OSError:
            # The port is taken (a receiver in this namespace): it already keeps
            # ICMP port-unreachable away, and the raw socket still sees ACKs.
            self.hold = None

    def connected(self) -> bool:
        return self.path is not None

    def _connect(self, now: float) -> None:
        self.next_attempt = now + self.cfg.ack_timeout  # retry at the ACK-timeout pace
        if self._down_since is None:
            self._down_since = now
        if self.pending is not None:
            self.pending["attempts"] += 1
        try:
            path = self.resolve(self.cfg.dst, neigh_timeout=self.cfg.ack_timeout)
        except ResolveError as e:
            self.connect_failures[str(e)] += 1
            return
        pkt = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)  # protocol 0: send only
        try:
            pkt.bind((path.ifname, 0))
            kw = dict(
                dqpn=self.cfg.dst_qp,
                sport=self.sport,
                dport=self.cfg.port,
                src_mac=path.src_mac,
                dst_mac=path.dst_mac,
            )
            data = RoceFlow(
                path.src, self.cfg.dst, opcode=OP_RC_SEND_ONLY, rest_len=DATA_PAYLOAD_LEN, **kw
            )
            fin = RoceFlow(
                path.src,
                self.cfg.dst,
                opcode=OP_RC_SEND_ONLY_IMM,
                rest_len=IMM_LEN + FIN_PAYLOAD_LEN,
                **kw,
            )
        except BaseException:
            pkt.close()
            raise
        done = time.monotonic()
        self.path, self.pkt, self.data, self.fin = path, pkt, data, fin
        self.tracker.abandon()
        if self._down_since is not None and (self.connects or self.pending):
            self.disconnected_s += done - self._down_since
        self._down_since = None
        if self.pending is None:
            self.connects.append({"t": done, "path": path.to_dict()})
        else:
            self.reconnects.append(
                {
                    **self.pending,
                    "t": done,
                    "new": path.to_dict(),
                    "moved": path != Path(**self.pending["old"]),
                }
            )
            self.pending = None

    def _disconnect(self, now: float, reason: str) -> None:
        assert self.path is not None and self.pkt is not None
        self.pending = {
            "t_detect": now,
            "reason": reason,
            "old": self.path.to_dict(),
            "last_acked_psn": _psn_or_none(self.tracker.last_acked),
            "last_ack_t": self.tracker.last_ack_t,
            "outstanding": self.tracker.outstanding,
            "attempts": 0,
        }
        self.pkt.close()
        self.path = self.pkt = self.data = self.fin = None
        self._down_since = now
        self.next_attempt = now  # try at once: the route may already point elsewhere

    def send(self, flow: RoceFlow, psn: int, ackreq: bool, rest: bytes) -> None:
        assert self.pkt is not None
        self.pkt.send(flow.frame(psn, ackreq, rest), socket.MSG_DONTWAIT)

    def sent(self, ext_psn: int, now: float) -> None:
        self.tracker.sent(ext_psn, now)

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` taking ACKs, running the retry timer and,
        while disconnected, retrying resolution at the ACK-timeout pace.
        True if it (re)connected, which may have taken a while."""
        if self.path is None:
            timeout = min(timeout, self.next_attempt - time.monotonic())
        socks = [self.acks] if self.hold is None else [self.acks, self.hold]
        r, _, _ = select.select(socks, [], [], max(0.0, timeout))
        now = time.monotonic()
        if self.acks in r:
            for buf in drain(self.acks):
                self._on_datagram(buf, now)
        if self.hold is not None and self.hold in r:
            for _ in drain(self.hold):
                pass  # ACKs are read whole on the raw socket
        if self.path is not None and self.tracker.exhausted(now):
            self._disconnect(now, "ack-timeout")
        if self.path is None and now >= self.next_attempt:
            self._connect(now)
            return self.path is not None
        return False

    def _on_datagram(self, buf: bytes, now: float) -> None:
        p = parse_ipv4(buf, self.cfg.port)
        if p is None:
            return
        if isinstance(p, Invalid):
            self.ack_invalid[p.reason] += 1
            return
        if p.opcode != OP_RC_ACK or p.dqpn != self.cfg.qp:
            return  # not an ACK for us (e.g. our own frames looping back on lo)
        self.tracker.ack(p.psn, now)

    def report(self) -> dict:
        t = self.tracker
        return {
            "sport": self.sport,
            "ack_timeout": self.cfg.ack_timeout,
            "retry_count": self.cfg.retry_count,
            "retry_budget_s": self.cfg.ack_timeout * self.cfg.retry_count,
            "connects": self.connects,
            "reconnects": self.reconnects,
            "reconnecting": self.pending,
            "path": self.path.to_dict() if self.path else None,
            "connect_failures": dict(self.connect_failures),
            "acks_received": t.acks,
            "stale_acks": t.stale_acks,
            "last_acked_psn": _psn_or_none(t.last_acked),
            "last_ack_t": t.last_ack_t,
            "ack_timeouts": t.timeouts,
            "ack_invalid": dict(self.ack_invalid),
            "disconnected_s": self.disconnected_s,
        }

    def close(self) -> None:
        for s in (self.pkt, self.acks, self.hold):
            if s is not None:
                s.close()


def run_sender(
    cfg: SenderConfig,
    *,
    stop: Callable[[], bool] | None = None,
    on_start: Callable[[float], None] | None = None,
    release: Callable[[], None] | None = None,
) -> dict:
    """Send for ``cfg.duration`` seconds and return the report.

    kernel-path needs only a bindable lab source address; qp-pinned needs
    CAP_NET_RAW (AF_PACKET and a raw socket for ACKs). ``on_start`` gets the
    schedule's t0 (CLOCK_MONOTONIC), so a fault can be timed against it.
    ``release`` is called once connected, before the clock starts, and
    returns when the schedule may begin (it raises to give up).
    """
    cfg = cfg.validated()
    path = KernelPath(cfg) if cfg.mode == "kernel-path" else QpPinned(cfg)
    session = int.from_bytes(os.urandom(4), "big")
    errors: Counter[str] = Counter()
    used = ok = late_skipped = down_skipped = fin_sent = 0
    t_first_ns = t_last_ns = None
    stopped_by = "duration"
    total_slots = math.floor(cfg.duration * cfg.rate)
    try:
        path.wait(0)  # qp-pinned: connect before the clock starts (first packet on time)
        if release is not None:
            release()
        t0 = time.monotonic()
        t_end = t0 + cfg.duration
        if on_start is not None:
            on_start(t0)
        k = 0  # next slot to fill
        while k < total_slots:
            if stop is not None and stop():
                stopped_by = "stop"
                break
            now = time.monotonic()
            due = min(total_slots, math.floor((now - t0) * cfg.rate) + 1)
            if due > k:
                if not path.connected():
                    down_skipped += due - k
                    k = due
                else:
                    if due - k > MAX_BURST:
                        late_skipped += due - k - MAX_BURST
                        k = due - MAX_BURST
                    while k < due:
                        psn = (cfg.first_psn + used) & PSN_MASK
                        t_ns = time.monotonic_ns()
                        try:
                            path.send(
                                path.data,
                                psn,
                                cfg.mode == "qp-pinned",
                                encode_data_payload(session, t_ns),
                            )
                            ok += 1
                        except OSError as e:
                            errors[_errname(e)] += 1
                        path.sent(cfg.first_psn + used, t_ns / 1e9)
                        if t_first_ns is None:
                            t_first_ns = t_ns
                        t_last_ns = t_ns
                        used += 1
                        k += 1
            if now >= t_end:  # the slots due by the end were filled just above
                break
            next_t = min(t0 + k / cfg.rate, t_end)
            if path.wait(min(next_t - time.monotonic(), WAKE_S)):
                # Reconnected: the slots that passed while resolving were never sendable.
                now_due = min(total_slots, math.floor((time.monotonic() - t0) * cfg.rate))
                if now_due > k:
                    down_skipped += now_due - k
                    k = now_due
        if cfg.fin_copies and t_first_ns is not None:
            fin_psn = (cfg.first_psn + used) & PSN_MASK
            rest = used.to_bytes(4, "big") + encode_fin_payload(
                session, t_first_ns, t_last_ns, cfg.first_psn
            )
            for i in range(cfg.fin_copies):
                if path.connected():
                    try:
                        path.send(path.fin, fin_psn, False, rest)
                        fin_sent += 1
                    except OSError as e:
                        errors["fin:" + _errname(e)] += 1
                if i + 1 < cfg.fin_copies:
                    path.wait(FIN_GAP_S)
        ended = time.monotonic()
        mode_report = path.report()
    finally:
        path.close()
    return {
        "tool": "linkpass-traffic-sender",
        "schema": 1,
        "mode": cfg.mode,
        "config": asdict(cfg),
        "session": session,
        "started_at": t0,
        "ended_at": ended,
        "stopped_by": stopped_by,
        "first_psn": cfg.first_psn,
        "next_psn": (cfg.first_psn + used) & PSN_MASK,
        "attempted": used,
        "sent": ok,
        "send_errors": dict(errors),
        "t_first_send": t_first_ns / 1e9 if t_first_ns is not None else None,
        "t_last_send": t_last_ns / 1e9 if t_last_ns is not None else None,
        "late_slots_skipped": late_skipped,
        "disconnected_slots_skipped": down_skipped,
        "fin_sent": fin_sent,
        cfg.mode.replace("-", "_"): mode_report,
    }


def build_parser() -> _cli.OneLineParser:
    p = _cli.OneLineParser(prog="python -m labs.traffic.sender", description=__doc__.split("\n")[0])
    p.add_argument(
        "--mode",
        required=True,
        choices=MODES,
        help="kernel-path (routed per packet) or qp-pinned (path fixed at connect)",
    )
    p.add_argument("--dst", required=True, help="receiver's lab address")
    p.add_argument("--src", help="source address to bind (kernel-path only)")
    p.add_argument(
        "--rate",
        type=_cli.positive_float,
        default=_cli.DEFAULT_RATE,
        help="packets per second (default 2000)",
    )
    p.add_argument(
        "--duration",
        type=_cli.positive_float,
        default=_cli.DEFAULT_DURATION_S,
        help=f"seconds to send (default {_cli.DEFAULT_DURATION_S:g}, max {_cli.MAX_DURATION_S:g})",
    )
    p.add_argument("--report", default="-", help="JSON report path ('-' for stdout, the default)")
    p.add_argument(
        "--port", type=_cli.int_auto, default=ROCE_PORT, help="UDP destination port (default 4791)"
    )
    p.add_argument(
        "--sport",
        type=_cli.int_auto,
        default=_cli.DEFAULT_SPORT,
        help="UDP source port (default 49152; 0 = any)",
    )
    p.add_argument(
        "--qp",
        type=_cli.int_auto,
        default=_cli.DEFAULT_SENDER_QP,
        help="our QP number, expected on ACKs (default 0x11)",
    )
    p.add_argument(
        "--dst-qp",
        type=_cli.int_auto,
        default=_cli.DEFAULT_RECEIVER_QP,
        help="receiver's QP number (default 0x12)",
    )
    p.add_argument(
        "--first-psn", type=_cli.int_auto, default=0, help="PSN of the first packet (default 0)"
    )
    p.add_argument(
        "--ack-timeout",
        type=_cli.positive_float,
        default=0.05,
        help="qp-pinned: seconds per ACK timer attempt (default 0.05)",
    )
    p.add_argument(
        "--retry-count",
        type=_cli.int_auto,
        default=3,
        help="qp-pinned: expiries before reconnecting (default 3)",
    )
    p.add_argument(
        "--fin-copies",
        type=_cli.int_auto,
        default=3,
        help="closing packets telling the receiver the count (default 3)",
    )
    p.add_argument(
        "--hold",
        action="store_true",
        help=f"once connected, print 'armed' and start only on a line 'go' on stdin "
        f"(gives up after {HOLD_MAX_S:g} s)",
    )
    return p


def parse_argv(argv: list[str] | None) -> tuple[SenderConfig, str]:
    """CLI arguments to (config, report path); argparse exits 2 on syntax errors."""
    args = vars(build_parser().parse_args(argv))
    report = args.pop("report")
    return SenderConfig(**args), report


def main(argv: list[str] | None = None) -> int:
    cfg, report_path = parse_argv(argv)
    try:
        cfg = cfg.validated()
    except (AddressError, _cli.UsageError) as e:
        return _cli.fail(PROG, str(e), _cli.EXIT_USAGE)
    flag = _cli.StopFlag.installed()

    def started(t0: float) -> None:
        sys.stderr.write(
            f"{PROG}: sending t0={t0:.6f} mode={cfg.mode} "
            f"rate={cfg.rate:g} duration={cfg.duration:g}\n"
        )
        sys.stderr.flush()

    try:
        report = run_sender(cfg, stop=lambda: flag.stop, on_start=started,
                            release=(lambda: wait_for_go(lambda: flag.stop)) if cfg.hold else None)
    except NotReleased as e:
        return _cli.fail(PROG, str(e), _cli.EXIT_RUNTIME)
    except PathRefused as e:
        return _cli.fail(PROG, f"{e}; refusing", _cli.EXIT_RUNTIME)
    except PermissionError as e:
        return _cli.fail(
            PROG, f"{e.strerror}: qp-pinned needs CAP_NET_RAW (run as root)", _cli.EXIT_RUNTIME
        )
    except OSError as e:
        return _cli.fail(
            PROG,
            f"{e.strerror or e} (source {cfg.src or 'from route'}, destination {cfg.dst})",
            _cli.EXIT_RUNTIME,
        )
    if status := _cli.save_report(PROG, report_path, report):
        return status
    problem = _nothing_sent(report)
    if problem:
        return _cli.fail(PROG, problem, _cli.EXIT_RUNTIME)
    return 0


class NotReleased(Exception):
    """--hold: the go line never came."""


def wait_for_go(stop: Callable[[], bool], stream=None, max_s: float = HOLD_MAX_S) -> None:
    """Say "armed" on stderr, then return on a line "go" from ``stream``
    (stdin); raise NotReleased on anything else, end of input, a stop
    signal, or after ``max_s``. Polls so that SIGTERM is honoured."""
    stream = sys.stdin if stream is None else stream
    sys.stderr.write(f"{PROG}: armed\n")
    sys.stderr.flush()
    deadline = time.monotonic() + max_s
    while not stop():
        left = deadline - time.monotonic()
        if left <= 0:
            raise NotReleased(f"--hold: no 'go' on stdin within {max_s:g} s; not sending")
        ready, _, _ = select.select([stream], [], [], min(left, 0.1))
        if ready:
            line = stream.readline()
            if line.strip() == "go":
                return
            what = "end of input" if not line else f"{line.strip()[:40]!r}"
            raise NotReleased(f"--hold: expected 'go' on stdin, got {what}; not sending")
    raise NotReleased("--hold: stopped before 'go'; not sending")


def _nothing_sent(report: dict) -> str | None:
    """A run that put no packet on the wire is a failure, even with a report."""
    if report["sent"] > 0 or report["stopped_by"] == "stop":
        return None
    if report["attempted"]:
        errs = ", ".join(f"{k} x{v}" for k, v in sorted(report["send_errors"].items()))
        return f"no packet could be sent ({errs})"
    qp = report.get("qp_pinned") or {}
    failures = qp.get("connect_failures") or {}
    last = max(failures, key=failures.get) if failures else "unknown reason"
    return f"never connected: {last}"


if __name__ == "__main__":
    sys.exit(main())
