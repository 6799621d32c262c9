"""The load process of labs/bench/aggregator: many simulated agents in one process.

    python -m labs.bench.agg_load --target 127.0.0.1:PORT --hosts 4096 --seconds 30

Each simulated host opens its own AgentService.Connect stream (spread over a
few HTTP/2 connections, as many hosts behind one NAT would not, but as this
one process must), says Hello, sends its Inventory (8 rails) and a PortReport,
then a Heartbeat every `--heartbeat-s` (each host at its own phase). Halfway
through, an incident: `--incident-fraction` of the hosts each send a burst of
`--burst` events within one second, as a leaf going down makes every host
under it fail over at once. Background: every host sends one event per
`--event-every-s`.

Event-to-stored latency is measured per event: from the moment its batch is
written to the stream to the EventAck that covers its seq (the aggregator
acks only once the event is durable). One JSON line goes to stdout at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import random
import resource
import sys
import time
import uuid

import grpc

from linkpassd._proto.linkpass.v1 import control_pb2, fleet_pb2, fleet_pb2_grpc

RAILS = 8
HOSTS_PER_CHANNEL = 64


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Host:
    """One simulated agent: its stream, its events in flight, its latencies."""

    def __init__(self, index: int, stats: "Stats"):  # noqa: D107
        self.host_id = f"lp-sim-{index:05d}"
        self.boot_id = uuid.uuid4().hex
        self.index = index
        self.seq = 0
        self.sent_at: dict[int, float] = {}  # seq -> when its batch was written
        self.stats = stats
        self.queue: asyncio.Queue = asyncio.Queue()
        self.resent_at: dict[int, float] = {}  # seq -> first send, for events sent again

    def inventory(self) -> fleet_pb2.Inventory:
        third = (self.index // 250) % 250
        return fleet_pb2.Inventory(rails=[
            fleet_pb2.RailInventory(rail=f"rail{r}", port=f"eth{r}", gpus=1,
                                    address=f"198.{18 + r % 2}.{third}.{self.index % 250 + 1}/24",
                                    gateway=f"198.{18 + r % 2}.{third}.254",
                                    leaf=f"leaf{r}-{self.index // 32}")
            for r in range(RAILS)])

    def report(self) -> fleet_pb2.PortReport:
        return fleet_pb2.PortReport(
            ports=[control_pb2.PortState(port=f"eth{r}", verdict=control_pb2.VERDICT_UP,
                                         carrier=True, phase="UP") for r in range(RAILS)],
            rail_paths={f"rail{r}": f"rail{r}" for r in range(RAILS)})

    def events(self, count: int) -> fleet_pb2.ConnectRequest:
        now = time.time()
        batch = []
        for _ in range(count):
            self.seq += 1
            rail = self.seq % RAILS
            event = control_pb2.Event(
                boot_id=self.boot_id, seq=self.seq, monotonic_s=time.monotonic(),
                kind=control_pb2.EVENT_KIND_RAIL_PATH, severity=control_pb2.SEVERITY_WARNING,
                name="rail_path", port=f"eth{rail}", rail=f"rail{rail}",
                message=f"rail{rail} table via rail{(rail + 1) % RAILS}",
                fields={"path": f"rail{(rail + 1) % RAILS}", "previous": f"rail{rail}",
                        "cause": "blackhole"})
            event.time.FromNanoseconds(int(now * 1e9))
            batch.append(event)
        return fleet_pb2.ConnectRequest(events=fleet_pb2.EventBatch(boot_id=self.boot_id,
                                                                    events=batch))

    async def requests(self):
        yield fleet_pb2.ConnectRequest(hello=fleet_pb2.Hello(host_id=self.host_id,
                                                             boot_id=self.boot_id,
                                                             version="bench"))
        while True:
            item = await self.queue.get()
            if item is None:
                return
            if item.WhichOneof("body") == "events":
                stamp = time.monotonic()
                for event in item.events.events:
                    self.sent_at[event.seq] = self.resent_at.pop(event.seq, stamp)
                self.stats.events_sent += len(item.events.events)
            yield item

    async def run(self, stub, welcomed: asyncio.Event, rng: random.Random) -> None:
        """Stream until cancelled; like a real agent, a failed stream is
        opened again after a jittered backoff, and what was sent and not acked
        is sent again (the aggregator stores it once). Each failure is counted."""
        attempt = 0
        while True:
            call = stub.Connect(self.requests())
            try:
                async for reply in call:
                    kind = reply.WhichOneof("body")
                    if kind == "welcome":
                        attempt = 0
                        if not welcomed.is_set():
                            self.stats.welcomed += 1
                            welcomed.set()
                        else:  # a reconnect: what it holds is acked; the rest again
                            self.queue.put_nowait(fleet_pb2.ConnectRequest(inventory=self.inventory()))
                            self.resend()
                    elif kind == "ack":
                        now = time.monotonic()
                        for seq in [s for s in self.sent_at if s <= reply.ack.seq]:
                            self.stats.latencies.append(now - self.sent_at.pop(seq))
                        self.stats.events_acked_acks += 1
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.CANCELLED:
                    return
                self.stats.errors[exc.code().name] = self.stats.errors.get(exc.code().name, 0) + 1
                if len(self.stats.error_samples) < 20:
                    self.stats.error_samples.append(
                        f"{self.host_id}: {exc.code().name} {exc.details()}")
            attempt += 1
            self.stats.reconnects += 1
            await asyncio.sleep(rng.uniform(0, min(5.0, 0.25 * 2 ** attempt)))

    def resend(self) -> None:
        """The events sent on a stream that failed, again (their latency still
        counts from the first send)."""
        pending = sorted(self.sent_at)
        if not pending:
            return
        first_sent = dict(self.sent_at)
        self.seq, top = pending[0] - 1, self.seq
        batch = self.events(len(pending))
        self.seq = top
        self.queue.put_nowait(batch)
        self.resent_at = first_sent


class Stats:
    def __init__(self) -> None:
        self.welcomed = 0
        self.events_sent = 0
        self.events_acked_acks = 0
        self.heartbeats = 0
        self.latencies: list[float] = []
        self.errors: dict[str, int] = {}
        self.reconnects = 0
        self.error_samples: list[str] = []


async def drive(args) -> dict:
    stats = Stats()
    rng = random.Random(args.seed)
    hosts = [Host(args.first + i, stats) for i in range(args.hosts)]
    channels = [grpc.aio.insecure_channel(args.target, options=[
        ("grpc.max_send_message_length", 4 << 20),
        ("grpc.http2.max_pings_without_data", 0),
        # Each channel its own connection, as each real host has its own: by
        # default channels with the same target share one (the global
        # subchannel pool), and a few thousand streams on one HTTP/2
        # connection fail in the client with INTERNAL.
        ("grpc.use_local_subchannel_pool", 1)])
        for _ in range((args.hosts + HOSTS_PER_CHANNEL - 1) // HOSTS_PER_CHANNEL)]
    stubs = [fleet_pb2_grpc.AgentServiceStub(ch) for ch in channels]
    welcomed = [asyncio.Event() for _ in hosts]
    tasks = [asyncio.create_task(h.run(stubs[i // HOSTS_PER_CHANNEL], welcomed[i],
                                       random.Random(args.seed * 100_003 + i)))
             for i, h in enumerate(hosts)]
    started = time.monotonic()
    # Connect: every host's Hello, then its inventory and first report.
    async def first_contact(host: Host, ready: asyncio.Event) -> None:
        await ready.wait()
        host.queue.put_nowait(fleet_pb2.ConnectRequest(inventory=host.inventory()))
        host.queue.put_nowait(fleet_pb2.ConnectRequest(ports=host.report()))

    contacts = [asyncio.create_task(first_contact(h, r)) for h, r in zip(hosts, welcomed)]
    await asyncio.wait(contacts, timeout=args.connect_timeout_s)
    for contact in contacts:
        contact.cancel()
    connected_s = time.monotonic() - started
    connected = stats.welcomed
    stats.latencies.clear()

    # Steady state with heartbeats, background events, and one incident: one
    # heap of due times, so the load process's own cost is per message, not per host.
    now = time.monotonic()
    due = [(now + rng.uniform(0, args.heartbeat_s), 0, i) for i in range(len(hosts))]
    due += [(now + rng.uniform(0, args.event_every_s), 1, i) for i in range(len(hosts))]
    heapq.heapify(due)
    t0 = now
    incident_at = t0 + args.seconds / 2
    incident_hosts = rng.sample(hosts, int(len(hosts) * args.incident_fraction))
    incident_done = False
    incident_latencies_from = None
    lag_max = 0.0
    while (now := time.monotonic()) < t0 + args.seconds:
        while due and due[0][0] <= now:
            at, what, i = heapq.heappop(due)
            host = hosts[i]
            if what == 0:
                beat = fleet_pb2.Heartbeat()
                beat.time.GetCurrentTime()
                host.queue.put_nowait(fleet_pb2.ConnectRequest(heartbeat=beat))
                stats.heartbeats += 1
                heapq.heappush(due, (at + args.heartbeat_s, 0, i))
            else:
                host.queue.put_nowait(host.events(1))
                heapq.heappush(due, (at + args.event_every_s, 1, i))
        if not incident_done and now >= incident_at:
            incident_done = True
            incident_latencies_from = len(stats.latencies)
            for k, host in enumerate(incident_hosts):
                # the bursts spread over one second, each in batches of 5 events
                asyncio.get_running_loop().call_later(
                    k / max(1, len(incident_hosts)),
                    lambda h=host: [h.queue.put_nowait(h.events(5)) for _ in range(args.burst // 5)])
        tick = time.monotonic()
        await asyncio.sleep(0.01)
        lag_max = max(lag_max, time.monotonic() - tick - 0.01)
    # Let the last acks arrive (bounded).
    drain_deadline = time.monotonic() + args.drain_s
    while any(h.sent_at for h in hosts) and time.monotonic() < drain_deadline:
        await asyncio.sleep(0.05)
    unacked = sum(len(h.sent_at) for h in hosts)
    for host in hosts:
        host.queue.put_nowait(None)
    for ch in channels:
        await ch.close()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    incident = stats.latencies[incident_latencies_from or 0:]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "hosts": args.hosts, "connected": connected, "connect_s": round(connected_s, 2),
        "seconds": args.seconds, "heartbeat_s": args.heartbeat_s,
        "heartbeats_sent": stats.heartbeats, "events_sent": stats.events_sent,
        "events_acked": len(stats.latencies), "events_unacked": unacked,
        "incident_hosts": len(incident_hosts), "burst": args.burst,
        "p50_s": percentile(stats.latencies, 0.50), "p99_s": percentile(stats.latencies, 0.99),
        "max_s": max(stats.latencies, default=None),
        "incident_p99_s": percentile(incident, 0.99),
        "errors": stats.errors, "error_samples": stats.error_samples[:5],
        "reconnects": stats.reconnects,
        # every latency, ms with 0.1 ms resolution: the bench merges several load processes
        "latencies_ms": [round(v * 1e3, 1) for v in stats.latencies],
        "incident_latencies_ms": [round(v * 1e3, 1) for v in incident],
        "load_cpu_s": usage.ru_utime + usage.ru_stime, "load_loop_lag_max_s": round(lag_max, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="aggregator HOST:PORT (insecure)")
    parser.add_argument("--hosts", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--heartbeat-s", type=float, default=5.0)
    parser.add_argument("--event-every-s", type=float, default=60.0)
    parser.add_argument("--incident-fraction", type=float, default=0.25)
    parser.add_argument("--burst", type=int, default=20)
    parser.add_argument("--connect-timeout-s", type=float, default=120.0)
    parser.add_argument("--drain-s", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--first", type=int, default=0,
                        help="index of this process's first host (several load processes)")
    args = parser.parse_args(argv)
    if not 0 <= args.first <= 65536:
        parser.error(f"--first must be 0..65536, got {args.first}")
    if not 1 <= args.hosts <= 65536:
        parser.error(f"--hosts must be 1..65536, got {args.hosts}")
    if not 1 <= args.seconds <= 600:
        parser.error(f"--seconds must be 1..600, got {args.seconds}")
    if not 0 <= args.incident_fraction <= 1 or args.burst % 5 or args.burst < 0:
        parser.error("--incident-fraction must be 0..1 and --burst a multiple of 5")
    host, _, port = args.target.rpartition(":")
    if host not in ("127.0.0.1", "localhost", "[::1]") or not port.isdigit():
        parser.error(f"--target must be a loopback HOST:PORT (bench traffic stays local), "
                     f"got {args.target!r}")
    print(json.dumps(asyncio.run(drive(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
