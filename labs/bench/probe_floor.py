"""The floor under linkpassd's echo cost: a bare prober with no judgement.

Runs in the scale lab's host namespace (labs/bench/scale_lab.py) against the
same peers and responder, at the same rate, with the same batching as the
echo engine (one socket per rail, one sendmmsg per rail and send slot, one
recvmmsg per wake-up, adapters.mmsg), and does per probe only what any
prober must: pack a request, and for a reply unpack it and find its path.
No verdicts, no timers per path, no bookkeeping. What it costs (utime and
stime of this process) is what the kernel's path both ways plus CPython's
per-datagram minimum cost on this machine: the echo engine cannot cost less.

    ip netns exec <host ns> python -m labs.bench.probe_floor PEERS INTERVAL_MS SECONDS REPEATS

Prints one JSON line per window: probes/s, replies/s, user and system % of
one core, µs per probe.
"""

from __future__ import annotations

import asyncio
import json
import resource
import socket
import sys
import time

from labs.bench.scale_lab import N_RAILS, echo_peer
from linkpassd.adapters.echoresponder import ECHO_PORT, KIND_REQUEST, MAGIC, PACKET, VERSION
from linkpassd.adapters.mmsg import PORT_ADDR, RecvBatch, SendBatch
from linkpassd.core.schedule import send_slot

SO_TIMESTAMPNS = 35


def main(peers: int, interval_ms: float, seconds: float, repeats: int) -> None:
    loop = asyncio.new_event_loop()
    interval = interval_ms / 1e3
    n = N_RAILS * peers
    slot = send_slot(interval, n) or 0.001
    slots_per_interval = max(1, round(interval / slot))
    rails = []
    got = [0]
    for r in range(N_RAILS):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, f"lprail{r}".encode())
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sock.bind((f"198.18.{r}.2", 0))
        sock.setblocking(False)
        peers4 = {socket.inet_aton(echo_peer(r, k)): k for k in range(peers)}
        batch = RecvBatch(64, 48, 64)
        fd = sock.fileno()

        def readable(fd=fd, batch=batch, peers4=peers4):
            while True:
                k = batch.recv(fd)
                for i in range(k):
                    _port, addr4 = PORT_ADDR.unpack_from(batch.names, i * 16 + 2)
                    if peers4.get(addr4) is not None:
                        PACKET.unpack_from(batch.payload, i * batch.slot)
                        got[0] += 1
                if k < 64:
                    return

        loop.add_reader(sock.fileno(), readable)
        rails.append((sock, SendBatch(64, PACKET.size), list(peers4)))
    # Path p goes in slot p mod slots_per_interval: spread as the engine spreads them.
    sent = [0]
    seq = [0]
    t0 = loop.time()

    def tick(k: int) -> None:
        now = loop.time()
        for sock, batch, addrs in rails:
            for j in range(k % slots_per_interval, len(addrs), slots_per_interval):
                i = batch.add(addrs[j], ECHO_PORT)
                seq[0] += 1
                PACKET.pack_into(batch.payload, i * PACKET.size, MAGIC, VERSION, KIND_REQUEST, 0,
                                 seq[0], round(now * 1e9), 7, 0, 0)
                sent[0] += 1
            if batch.count:
                batch.send(sock.fileno())
        loop.call_at(t0 + (k + 1) * slot, tick, k + 1)

    loop.call_soon(tick, 0)

    async def measure() -> None:
        await asyncio.sleep(2.0)
        for _ in range(repeats):
            r0, s0, g0, w0 = resource.getrusage(resource.RUSAGE_SELF), sent[0], got[0], time.monotonic()
            await asyncio.sleep(seconds)
            r1, dt = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - w0
            probes, replies = sent[0] - s0, got[0] - g0
            user, system = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
            print(json.dumps({"paths": n, "interval_ms": interval_ms, "slot_ms": slot * 1e3,
                              "probes_per_s": probes / dt, "replies_per_s": replies / dt,
                              "user_pct": 100 * user / dt, "sys_pct": 100 * system / dt,
                              "us_per_probe": 1e6 * (user + system) / max(1, probes),
                              "user_us_per_probe": 1e6 * user / max(1, probes),
                              "sys_us_per_probe": 1e6 * system / max(1, probes)}), flush=True)

    loop.run_until_complete(measure())
    for sock, _b, _a in rails:
        loop.remove_reader(sock.fileno())
        sock.close()
    loop.close()


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
