"""RoCEv2 lab receiver: timestamps arrivals, answers ACK requests, reports blackout.

    python -m labs.traffic.receiver --bind 198.18.1.2 --duration 10 --report rx.json

It reads a raw IPv4 socket (the ICRC covers the IP header, which a UDP socket
hides) and holds the UDP port with an ordinary socket whose copies it
discards, so the kernel does not answer each packet with ICMP
port-unreachable. ACKs leave through that UDP socket to the packet's source
address: they follow this host's routing, as a responder's ACKs do. It stops
at ``--duration`` or shortly after the sender's closing packet, and writes
one JSON report.

Arrival times are CLOCK_MONOTONIC read as each queued batch is drained, not
kernel socket timestamps: those are CLOCK_REALTIME, which NTP may step, and
the point is to compare with other namespaces' monotonic timestamps.

Model: the responder acknowledges every packet that asks (BTH AckReq) with
that packet's PSN and never NAKs, because the lab sender never retransmits:
loss is what is being measured, not repaired.
"""

from __future__ import annotations

import errno
import select
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

from labs.traffic import _cli
from labs.traffic._sockets import drain, port_holder, raw_udp_socket
from labs.traffic.addresses import AddressError, is_lab_address, lab_address
from labs.traffic.analysis import DEFAULT_BIN_S, Arrival, analyse
from labs.traffic.packets import (
    AETH_ACK_NO_CREDIT,
    OP_RC_ACK,
    OP_RC_SEND_ONLY,
    OP_RC_SEND_ONLY_IMM,
    PSN_MASK,
    ROCE_PORT,
    Invalid,
    RoceFlow,
    decode_data_payload,
    decode_fin_payload,
    parse_ipv4,
)

PROG = "receiver"
WAKE_S = 0.1  # longest sleep, so a stop request is seen promptly


@dataclass(frozen=True)
class ReceiverConfig:
    bind: str
    port: int = ROCE_PORT
    duration: float = _cli.DEFAULT_DURATION_S
    qp: int = _cli.DEFAULT_RECEIVER_QP  # our QP: data must carry it as dest QP
    peer_qp: int = _cli.DEFAULT_SENDER_QP  # the sender's QP: our ACKs carry it
    bin_s: float = DEFAULT_BIN_S
    exit_on_fin: bool = True
    linger: float = 0.3  # keep listening this long after the sender's closing packet

    def validated(self) -> ReceiverConfig:
        """Raise AddressError/UsageError with a one-line message."""
        lab_address(self.bind, "--bind")
        _cli.check_port(self.port, "--port")
        _cli.check_duration(self.duration)
        _cli.check_qp(self.qp, "--qp")
        _cli.check_qp(self.peer_qp, "--peer-qp")
        if not 0 < self.bin_s <= 10:
            raise _cli.UsageError(f"--bin must be in (0, 10] seconds, got {self.bin_s:g}")
        if not 0 <= self.linger <= 10:
            raise _cli.UsageError(f"--linger must be in [0, 10] seconds, got {self.linger:g}")
        return self

    def command(self, report: str, python: str = sys.executable) -> list[str]:
        """The argv that runs this receiver, e.g. for ``ip netns exec`` or a Mininet host."""
        argv = [
            python,
            "-m",
            "labs.traffic.receiver",
            "--bind",
            self.bind,
            "--port",
            str(self.port),
            "--duration",
            repr(self.duration),
            "--report",
            report,
            "--qp",
            hex(self.qp),
            "--peer-qp",
            hex(self.peer_qp),
            "--bin",
            repr(self.bin_s),
            "--linger",
            repr(self.linger),
        ]
        return argv if self.exit_on_fin else [*argv, "--no-exit-on-fin"]


class Responder:
    """The receiver's per-packet logic, socket-free so tests can feed it bytes.

    ``send_ack(dst, udp_payload)`` is called for each ACK; it may raise
    OSError, which is counted.
    """

    def __init__(self, cfg: ReceiverConfig, send_ack: Callable[[str, bytes], None] | None = None):
        self.cfg = cfg
        self.send_ack = send_ack
        self.arrivals: list[Arrival] = []
        self.invalid: Counter[str] = Counter()
        self.ignored: Counter[str] = Counter()
        self.sources: dict[str, dict] = {}  # per IP source: count, first and last arrival
        self.ack_errors: Counter[str] = Counter()
        self.acks_sent = 0
        self.session: int | None = None
        self.fin = None  # (FinPayload, psns used, receive time)
        self.fin_copies = 0
        self._msn = 0
        self._ack_flows: dict[str, RoceFlow] = {}

    def warm_up(self) -> None:
        """Import scapy and build one template now, not when the first packet is waiting.

        The first import takes most of a second; paid mid-run it would show up
        as a fake blackout and a burst of late ACKs.
        """
        RoceFlow(self.cfg.bind, self.cfg.bind, opcode=OP_RC_ACK, dqpn=self.cfg.peer_qp, rest_len=4)

    def handle(self, buf: bytes, t: float) -> None:
        p = parse_ipv4(buf, self.cfg.port)
        if p is None:
            return  # not UDP to our port: not ours to count
        if isinstance(p, Invalid):
            self.invalid[p.reason] += 1
            return
        if p.opcode == OP_RC_ACK:
            self.ignored["ack"] += 1  # a responder gets no ACKs (on loopback it sees its own)
            return
        if p.dqpn != self.cfg.qp:
            self.invalid["wrong_qp"] += 1
            return
        if not is_lab_address(p.src):
            self.invalid["foreign_source"] += 1  # never ACK outside the lab
            return
        if p.opcode == OP_RC_SEND_ONLY:
            d = decode_data_payload(p.payload)
            if d is None:
                self.invalid["bad_payload"] += 1
                return
            if not self._same_session(d.session):
                return
            self.arrivals.append(Arrival(t, p.psn, d.t_send, p.src))
            seen = self.sources.get(p.src)
            if seen is None:
                self.sources[p.src] = {"count": 1, "first_t": t, "last_t": t}
            else:
                seen["count"] += 1
                seen["last_t"] = t
            self._msn = (self._msn + 1) & PSN_MASK
        elif p.opcode == OP_RC_SEND_ONLY_IMM:
            f = decode_fin_payload(p.payload)
            if f is None or p.imm is None:
                self.invalid["bad_payload"] += 1
                return
            if not self._same_session(f.session):
                return
            self.fin_copies += 1
            if self.fin is None:
                self.fin = (f, p.imm, t)
        else:
            self.invalid["unexpected_opcode"] += 1
            return
        if p.ackreq:
            self._ack(p.src, p.psn)

    def _same_session(self, session: int) -> bool:
        """Lock onto the first sender session; a stray second sender is counted, not mixed in."""
        if self.session is None:
            self.session = session
        if session != self.session:
            self.invalid["other_session"] += 1
            return False
        return True

    def _ack(self, dst: str, psn: int) -> None:
        if self.send_ack is None:
            return
        flow = self._ack_flows.get(dst)
        if flow is None:
            flow = RoceFlow(
                self.cfg.bind,
                dst,
                opcode=OP_RC_ACK,
                dqpn=self.cfg.peer_qp,
                rest_len=4,
                sport=self.cfg.port,
                dport=self.cfg.port,
            )
            self._ack_flows[dst] = flow
        aeth = bytes([AETH_ACK_NO_CREDIT]) + self._msn.to_bytes(3, "big")
        try:
            self.send_ack(dst, flow.udp_payload(psn, False, aeth))
            self.acks_sent += 1
        except OSError as e:
            self.ack_errors[_errname(e)] += 1

    def report(self) -> dict:
        sender = None
        if self.fin is not None:
            f, used, t = self.fin
            sender = {
                "sent": used,
                "first_psn": f.first_psn,
                "t_first_send": f.t_first,
                "t_last_send": f.t_last,
                "fin_received_at": t,
                "fin_copies": self.fin_copies,
            }
            a = analyse(
                self.arrivals,
                first_psn=f.first_psn,
                sent=used,
                window=(f.t_first, f.t_last),
                bin_s=self.cfg.bin_s,
            )
        else:
            a = analyse(self.arrivals, bin_s=self.cfg.bin_s)
        return {
            **a.to_dict(),
            "session": self.session,
            "sender": sender,
            "invalid": {"total": sum(self.invalid.values()), **dict(self.invalid)},
            "ignored": dict(self.ignored),
            "acks_sent": self.acks_sent,
            "ack_errors": dict(self.ack_errors),
            "sources": self.sources,
        }


def _errname(e: OSError) -> str:
    return errno.errorcode.get(e.errno or 0, str(e.errno))


def run_receiver(
    cfg: ReceiverConfig,
    *,
    on_ready: Callable[[], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> dict:
    """Receive until the duration ends (or the sender closes); return the report.

    Needs CAP_NET_RAW for the raw socket. ``stop`` is polled at least every
    ``WAKE_S`` so an embedding program can end the run early.
    """
    cfg = cfg.validated()
    raw = raw_udp_socket(cfg.bind)
    try:
        hold = port_holder((cfg.bind, cfg.port))
    except BaseException:
        raw.close()
        raise
    try:
        responder = Responder(cfg, lambda dst, data: hold.sendto(data, (dst, cfg.port)))
        responder.warm_up()
        started = time.monotonic()
        deadline = started + cfg.duration
        stopped_by = "duration"
        if on_ready is not None:
            on_ready()
        while True:
            now = time.monotonic()
            if stop is not None and stop():
                stopped_by = "stop"
                break
            end = deadline
            if cfg.exit_on_fin and responder.fin is not None:
                end = min(end, responder.fin[2] + cfg.linger)
            if now >= end:
                stopped_by = "duration" if end == deadline else "fin"
                break
            r, _, _ = select.select([raw, hold], [], [], min(end - now, WAKE_S))
            if raw in r:
                # Stamp the whole batch before handling any of it, so a slow
                # packet (the first from a new source builds an ACK template)
                # does not delay the timestamps of those queued behind it.
                batch = [(buf, time.monotonic()) for buf in drain(raw)]
                for buf, t in batch:
                    responder.handle(buf, t)
            if hold in r:
                for _ in drain(hold):
                    pass  # the same datagrams, already seen whole on the raw socket
        ended = time.monotonic()
    finally:
        raw.close()
        hold.close()
    return {
        "tool": "linkpass-traffic-receiver",
        "schema": 1,
        "config": asdict(cfg),
        "started_at": started,
        "ended_at": ended,
        "stopped_by": stopped_by,
        **responder.report(),
    }


def build_parser() -> _cli.OneLineParser:
    p = _cli.OneLineParser(
        prog="python -m labs.traffic.receiver", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--bind", required=True, help="lab address to receive on (198.18.0.0/15 or 127/8)"
    )
    p.add_argument("--port", type=_cli.int_auto, default=ROCE_PORT, help="UDP port (default 4791)")
    p.add_argument(
        "--duration",
        type=_cli.positive_float,
        default=_cli.DEFAULT_DURATION_S,
        help=f"stop after this many seconds (default {_cli.DEFAULT_DURATION_S:g}, "
        f"max {_cli.MAX_DURATION_S:g})",
    )
    p.add_argument("--report", default="-", help="JSON report path ('-' for stdout, the default)")
    p.add_argument(
        "--qp",
        type=_cli.int_auto,
        default=_cli.DEFAULT_RECEIVER_QP,
        help="our QP number (default 0x12)",
    )
    p.add_argument(
        "--peer-qp",
        type=_cli.int_auto,
        default=_cli.DEFAULT_SENDER_QP,
        help="the sender's QP number, put on ACKs (default 0x11)",
    )
    p.add_argument(
        "--bin",
        type=_cli.positive_float,
        default=DEFAULT_BIN_S,
        dest="bin_s",
        help="timeline bin width in seconds (default 0.1)",
    )
    p.add_argument(
        "--linger",
        type=float,
        default=0.3,
        help="seconds to keep listening after the sender's closing packet",
    )
    p.add_argument(
        "--no-exit-on-fin",
        dest="exit_on_fin",
        action="store_false",
        help="run the full duration even after the sender has closed",
    )
    return p


def parse_argv(argv: list[str] | None) -> tuple[ReceiverConfig, str]:
    """CLI arguments to (config, report path); argparse exits 2 on syntax errors."""
    args = vars(build_parser().parse_args(argv))
    report = args.pop("report")
    return ReceiverConfig(**args), report


def main(argv: list[str] | None = None) -> int:
    cfg, report_path = parse_argv(argv)
    try:
        cfg = cfg.validated()
    except (AddressError, _cli.UsageError) as e:
        return _cli.fail(PROG, str(e), _cli.EXIT_USAGE)
    flag = _cli.StopFlag.installed()

    def ready():
        sys.stderr.write(f"{PROG}: ready on {cfg.bind}:{cfg.port} qp={cfg.qp:#x}\n")
        sys.stderr.flush()

    try:
        report = run_receiver(cfg, on_ready=ready, stop=lambda: flag.stop)
    except PermissionError as e:
        return _cli.fail(
            PROG, f"{e.strerror}: the receiver needs CAP_NET_RAW (run as root)", _cli.EXIT_RUNTIME
        )
    except OSError as e:
        return _cli.fail(
            PROG, f"{e.strerror or e} (receiving on {cfg.bind}:{cfg.port})", _cli.EXIT_RUNTIME
        )
    if status := _cli.save_report(PROG, report_path, report):
        return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
