"""The load process of labs/bench/aggregator: many simulated agents in one process.

    python -m labs.bench.agg_load --targets 127.0.0.1:PORT[,127.0.0.1:PORT2] --hosts 4096 --seconds 30

What each simulated host does is what linkpassd's agent (linkpassd/agent/
client.py) does on its stream, with the daemon behind it replaced by a
script:

- its own TCP connection (its own channel: as each real host has; by default
  grpc channels to one target share one connection, and an aggregator that
  serves 64 hosts per HTTP/2 connection has less work per message than one
  that serves each host on its own), with the agent's channel options
  (agent.client.channel_options: a keepalive ping every 10 s, no retries);
- its first connect at a moment uniform in [0, `--connect-spread-s`], and
  after a failed stream the agent's backoff (agent.client.backoff_s);
- with several targets (aggregator replicas) host i starts at target
  i mod n, as a load balancer or spread address lists would place it, and
  when a stream fails it moves to the next target, as the agent does;
- Hello, then Inventory (8 rails) and a PortReport (8 ports, 24 probe paths);
- a Heartbeat every `--heartbeat-s` (each host at its own phase), with the
  spool's counts as the agent sends them;
- background: one event per host every `--event-every-s`;
- halfway through, a fabric incident: `--incident-fraction` of the hosts,
  spread over one second, each emit `--burst` events (rail failover: in
  passes of 5, each sent as its own batch at once: more messages than an
  agent that finds all 20 in its spool would send, never fewer) and a
  PortReport with a port DOWN, as the agent sends one at once when a pass
  changed a verdict.

Several load processes run together (the bench starts them): each connects
its hosts, prints a `{"phase": "connected", ...}` line and, with `--sync`,
waits for "go <unix time>" on stdin, so every process's steady phase and
incident start at the same moment, the incident being one fleet-wide second
and not one second per process.

Event-to-stored latency is measured per event: from the moment its batch is
handed to the stream to the EventAck that covers its seq (the aggregator acks
only once the event is durable). A failed stream is opened again after a
backoff, and what was sent and not acked is sent again; its latency
still counts from the first send. One JSON line goes to stdout at the end.

The process's own cost is reported (CPU seconds during the connect phase and
during the measured phase, and how late its event loop ran a 10 ms timer:
a load process that falls behind would make the aggregator look slower than
it is).
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
from linkpassd.agent.client import backoff_s, channel_options

RAILS = 8
PEERS_PER_RAIL = 3
EVENTS_PER_PASS = 5


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Host:
    """One simulated agent: its stream, its events in flight, its latencies."""

    def __init__(self, index: int, stats: "Stats", targets: int):
        self.host_id = f"lp-sim-{index:05d}"
        self.boot_id = uuid.uuid4().hex
        self.index = index
        self.target = index % targets  # where a load balancer would put it
        self.seq = 0
        self.sent_at: dict[int, float] = {}  # seq -> when its batch was handed to the stream
        self.stats = stats
        self.queue: asyncio.Queue = asyncio.Queue()
        self.resent_at: dict[int, float] = {}  # seq -> first send, for events sent again
        self.down_rail: int | None = None  # the rail the incident took down

    def inventory(self) -> fleet_pb2.Inventory:
        third = (self.index // 250) % 250
        return fleet_pb2.Inventory(rails=[
            fleet_pb2.RailInventory(rail=f"rail{r}", port=f"eth{r}", gpus=1,
                                    address=f"198.{18 + r % 2}.{third}.{self.index % 250 + 1}/24",
                                    gateway=f"198.{18 + r % 2}.{third}.254",
                                    leaf=f"leaf{r}-{self.index // 32}")
            for r in range(RAILS)])

    def report(self) -> fleet_pb2.PortReport:
        """What the agent sends: every port, every probe path, each rail's path."""
        down = self.down_rail
        ports = [control_pb2.PortState(
            port=f"eth{r}", verdict=control_pb2.VERDICT_DOWN if r == down else control_pb2.VERDICT_UP,
            carrier=True, phase="DOWN" if r == down else "UP", since=1.7e9,
            evidence=["probe loss 100 % over 3 of 3 peers"] if r == down else [])
            for r in range(RAILS)]
        paths = [fleet_pb2.PathState(port=f"eth{r}", peer=f"198.{18 + r % 2}.{p}.{p + 7}",
                                     state="down" if r == down else "up",
                                     loss=1.0 if r == down else 0.0, rtt_p50_us=0 if r == down else 14)
                 for r in range(RAILS) for p in range(PEERS_PER_RAIL)]
        rail_paths = {f"rail{r}": f"rail{(r + 1) % RAILS}" if r == down else f"rail{r}"
                      for r in range(RAILS)}
        report = fleet_pb2.PortReport(ports=ports, paths=paths, rail_paths=rail_paths)
        report.time.GetCurrentTime()
        return report

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

    def heartbeat(self) -> fleet_pb2.ConnectRequest:
        beat = fleet_pb2.Heartbeat(spool_pending=len(self.sent_at))
        beat.time.GetCurrentTime()
        return fleet_pb2.ConnectRequest(heartbeat=beat)

    def incident(self, burst: int) -> None:
        """A rail fails over: its events in passes, then the changed report."""
        self.down_rail = self.index % RAILS
        for _ in range(burst // EVENTS_PER_PASS):
            self.queue.put_nowait(self.events(EVENTS_PER_PASS))
        self.queue.put_nowait(fleet_pb2.ConnectRequest(ports=self.report()))

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
            self.stats.messages += 1
            yield item

    async def run(self, stubs: list, welcomed: asyncio.Event, rng: random.Random, spread_s: float) -> None:
        """Stream until cancelled: first connect at a moment uniform in
        [0, spread_s] (a fleet's daemons start at different moments; a whole
        fleet's connections in one instant overflow the listen backlog, see
        docs/aggregator.md), and like a real agent, a failed stream is opened
        again (on the next target) after the agent's own backoff
        (linkpassd.agent.client.backoff_s: full jitter, 0.5 s doubling to
        30 s), and what was sent and not acked is sent again (the aggregator
        stores it once). Each failure is counted."""
        attempt = 0
        await asyncio.sleep(rng.uniform(0, spread_s))  # hosts come up at different moments
        while True:
            call = stubs[self.target].Connect(self.requests())
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
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.CANCELLED:
                    return
                self.stats.errors[exc.code().name] = self.stats.errors.get(exc.code().name, 0) + 1
                if len(self.stats.error_samples) < 20:
                    self.stats.error_samples.append(
                        f"{self.host_id}: {exc.code().name} {exc.details()}")
            self.stats.reconnects += 1
            self.target = (self.target + 1) % len(stubs)
            await asyncio.sleep(backoff_s(attempt // len(stubs), rng))
            attempt += 1

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
        self.messages = 0  # ConnectRequests handed to the streams (every kind)
        self.events_sent = 0
        self.heartbeats = 0
        self.reports = 0
        self.latencies: list[float] = []
        self.errors: dict[str, int] = {}
        self.reconnects = 0
        self.error_samples: list[str] = []


async def wait_go(args) -> float:
    """The monotonic time the measured phase starts: now, or (--sync) the
    unix time the bench says on stdin ("go <unix time>")."""
    if not args.sync:
        return time.monotonic()
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    word, _, at = line.strip().partition(" ")
    if word != "go":
        raise SystemExit(f"agg_load: expected 'go <unix time>' on stdin, got {line.strip()!r}")
    return time.monotonic() + max(0.0, float(at) - time.time())


async def drive(args) -> dict:
    stats = Stats()
    rng = random.Random(args.seed)
    targets = args.targets.split(",")
    hosts = [Host(args.first + i, stats, len(targets)) for i in range(args.hosts)]
    # The agent's own channel options (keepalive every 10 s, no retries), and
    # each channel its own connection, as each real host has its own: by
    # default channels with the same target share one (the global subchannel pool).
    options = channel_options() + [("grpc.use_local_subchannel_pool", 1)]
    channels: list[grpc.aio.Channel] = []
    host_stubs = []
    per_channel = args.hosts_per_channel
    for i, _host in enumerate(hosts):
        if i % per_channel == 0:  # a channel per target for this group of hosts
            group = [grpc.aio.insecure_channel(t, options=options) for t in targets]
            channels += group
            stubs = [fleet_pb2_grpc.AgentServiceStub(ch) for ch in group]
        host_stubs.append(stubs)
    welcomed = [asyncio.Event() for _ in hosts]
    tasks = [asyncio.create_task(h.run(host_stubs[i], welcomed[i],
                                       random.Random(args.seed * 100_003 + i), args.connect_spread_s))
             for i, h in enumerate(hosts)]
    started = time.monotonic()

    async def first_contact(host: Host, ready: asyncio.Event) -> None:
        await ready.wait()
        host.queue.put_nowait(fleet_pb2.ConnectRequest(inventory=host.inventory()))
        host.queue.put_nowait(fleet_pb2.ConnectRequest(ports=host.report()))

    contacts = [asyncio.create_task(first_contact(h, r)) for h, r in zip(hosts, welcomed)]
    await asyncio.wait(contacts, timeout=args.connect_timeout_s)
    for contact in contacts:
        contact.cancel()
    connect_s = time.monotonic() - started
    connected = stats.welcomed
    connect_cpu = cpu_s()
    print(json.dumps({"phase": "connected", "connected": connected, "connect_s": round(connect_s, 2)}),
          flush=True)
    t0 = await wait_go(args)
    await asyncio.sleep(max(0.0, t0 - time.monotonic()))
    stats.latencies.clear()
    events_before, messages_before, cpu_before = stats.events_sent, stats.messages, cpu_s()

    # Steady state with heartbeats, background events, and one incident: one
    # heap of due times, so the load process's own cost is per message, not per host.
    now = time.monotonic()
    due = [(now + rng.uniform(0, args.heartbeat_s), 0, i) for i in range(len(hosts))]
    due += [(now + rng.uniform(0, args.event_every_s), 1, i) for i in range(len(hosts))]
    heapq.heapify(due)
    incident_at = t0 + args.seconds / 2
    incident_hosts = rng.sample(hosts, int(len(hosts) * args.incident_fraction))
    incident_done = False
    incident_from = 0
    lags: list[float] = []
    loop = asyncio.get_running_loop()
    while (now := time.monotonic()) < t0 + args.seconds:
        while due and due[0][0] <= now:
            at, what, i = heapq.heappop(due)
            host = hosts[i]
            if what == 0:
                host.queue.put_nowait(host.heartbeat())
                stats.heartbeats += 1
                heapq.heappush(due, (at + args.heartbeat_s, 0, i))
            else:
                host.queue.put_nowait(host.events(1))
                heapq.heappush(due, (at + args.event_every_s, 1, i))
        if not incident_done and now >= incident_at:
            incident_done = True
            incident_from = len(stats.latencies)
            for k, host in enumerate(incident_hosts):  # spread over one second
                loop.call_later(k / max(1, len(incident_hosts)), host.incident, args.burst)
            stats.reports += len(incident_hosts)
        tick = time.monotonic()
        await asyncio.sleep(0.01)
        lags.append(max(0.0, time.monotonic() - tick - 0.01))
    measured_cpu = cpu_s() - cpu_before
    measured_s = time.monotonic() - t0
    messages = stats.messages - messages_before
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
    incident = stats.latencies[incident_from:]
    return {
        "hosts": args.hosts, "connected": connected, "connect_s": round(connect_s, 2),
        "seconds": args.seconds, "heartbeat_s": args.heartbeat_s,
        "heartbeats_sent": stats.heartbeats, "events_sent": stats.events_sent - events_before,
        "messages_sent": messages,
        "events_acked": len(stats.latencies), "events_unacked": unacked,
        "incident_hosts": len(incident_hosts), "incident_reports": stats.reports,
        "burst": args.burst,
        "p50_s": percentile(stats.latencies, 0.50), "p99_s": percentile(stats.latencies, 0.99),
        "max_s": max(stats.latencies, default=None),
        "incident_p99_s": percentile(incident, 0.99),
        "errors": stats.errors, "error_samples": stats.error_samples[:5],
        "reconnects": stats.reconnects,
        # every latency, ms with 0.1 ms resolution: the bench merges several load processes
        "latencies_ms": [round(v * 1e3, 1) for v in stats.latencies],
        "incident_latencies_ms": [round(v * 1e3, 1) for v in incident],
        "load_cpu_s": cpu_s(), "load_connect_cpu_s": connect_cpu,
        "load_measured_cpu_s": measured_cpu, "measured_s": measured_s,
        "load_loop_lag_p99_s": percentile(lags, 0.99),
        "load_loop_lag_max_s": round(max(lags, default=0.0), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", required=True,
                        help="aggregator HOST:PORT (insecure, loopback), comma-separated for replicas")
    parser.add_argument("--hosts", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--heartbeat-s", type=float, default=5.0)
    parser.add_argument("--event-every-s", type=float, default=60.0)
    parser.add_argument("--incident-fraction", type=float, default=0.25)
    parser.add_argument("--burst", type=int, default=20)
    parser.add_argument("--connect-timeout-s", type=float, default=120.0)
    parser.add_argument("--connect-spread-s", type=float, default=0.0,
                        help="each host first connects at a moment uniform in [0, this]")
    parser.add_argument("--drain-s", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hosts-per-channel", type=int, default=1,
                        help="hosts sharing one connection (1: each its own, as real hosts)")
    parser.add_argument("--sync", action="store_true",
                        help="after connecting, wait for 'go <unix time>' on stdin")
    parser.add_argument("--first", type=int, default=0,
                        help="index of this process's first host (several load processes)")
    args = parser.parse_args(argv)
    if not 0 <= args.first <= 65536:
        parser.error(f"--first must be 0..65536, got {args.first}")
    if not 1 <= args.hosts <= 65536:
        parser.error(f"--hosts must be 1..65536, got {args.hosts}")
    if not 1 <= args.hosts_per_channel <= 1024:
        parser.error(f"--hosts-per-channel must be 1..1024, got {args.hosts_per_channel}")
    if not 0 <= args.connect_spread_s <= 300:
        parser.error(f"--connect-spread-s must be 0..300, got {args.connect_spread_s}")
    if not 1 <= args.seconds <= 600:
        parser.error(f"--seconds must be 1..600, got {args.seconds}")
    if not 0 <= args.incident_fraction <= 1 or args.burst % EVENTS_PER_PASS or args.burst < 0:
        parser.error(f"--incident-fraction must be 0..1 and --burst a multiple of {EVENTS_PER_PASS}")
    for target in args.targets.split(","):
        host, _, port = target.rpartition(":")
        if host not in ("127.0.0.1", "localhost", "[::1]") or not port.isdigit():
            parser.error(f"--targets must be loopback HOST:PORTs (bench traffic stays local), "
                         f"got {target!r}")
    print(json.dumps(asyncio.run(drive(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
