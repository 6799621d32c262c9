"""The aggregator's Prometheus metrics, in a registry of its own.

Counted where things happen (the server's ingestion and stream paths), so a
scrape reads plain numbers and never touches the store. A registry of its own
keeps tests (several servers in one process) and the daemon's metrics apart.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from linkpassd.adapters import metrics_http
from linkpassd.config.checks import split_listen

WRITE_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
STAGE_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0)
GROUP_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
# Where an event's time to its ack goes (labs/bench/aggregator reads these):
# inbox: read from the stream -> its stream's worker takes it (the worker
#   was busy with the stream's earlier messages, or the loop with others);
# store_queue: a write call -> its group's statements start;
# store_begin, store_statements, store_commit: per group, the write lock
#   taken on the worker, the group's statements on the loop, COMMIT (fsync,
#   checkpoints) on the worker, each including the hop back to the loop;
# outbox: a response (an ack) queued -> written to its stream;
# loop_lag: how late the event loop ran a 50 ms timer (a busy loop delays all).
STAGES = ("inbox", "store_queue", "store_begin", "store_statements", "store_commit", "outbox",
          "loop_lag")
# What agents send, counted by kind (ConnectRequest's body): the bench divides
# the aggregator's CPU by these.
MESSAGE_KINDS = ("hello", "inventory", "ports", "events", "heartbeat", "command_result", "none")


class LoopHistogram(Collector):
    """A Prometheus histogram observed from the event loop's thread only.

    Why not prometheus_client's Histogram: its observe() takes a lock and
    walks the buckets for every value, and the ingestion path observes
    several stages per message (thousands a second). Here an observation is
    a bisect and two additions on plain lists, no lock: only the loop's
    thread observes, and a scrape (the HTTP thread) copies the lists, so at
    worst it misses the observation being made. The count exported is the
    sum of the buckets it copied, so +Inf always equals the count."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 buckets: Sequence[float], registry: CollectorRegistry | None = None) -> None:
        self._name = name
        self._doc = documentation
        self._bounds = tuple(float(b) for b in buckets)
        self._labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], LoopHistogram._Child] = {}
        if registry is not None:
            registry.register(self)

    class _Child:
        __slots__ = ("_bounds", "counts", "sum")

        def __init__(self, bounds: tuple[float, ...]) -> None:
            self._bounds = bounds
            self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
            self.sum = 0.0

        def observe(self, value: float) -> None:
            self.counts[bisect_left(self._bounds, value)] += 1
            self.sum += value

    def labels(self, *values: str) -> LoopHistogram._Child:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = LoopHistogram._Child(self._bounds)
        return child

    def observe(self, value: float) -> None:
        """Unlabelled histograms only."""
        self.labels().observe(value)

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)
        for values, child in list(self._children.items()):
            counts, total = list(child.counts), child.sum
            cumulative, buckets = 0, []
            for bound, count in zip(self._bounds + (float("inf"),), counts):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            family.add_metric(list(values), buckets, total)
        yield family


class LoopCounter(Collector):
    """A labelled Prometheus counter incremented from the event loop's thread
    only: a dict addition per increment (see LoopHistogram for why)."""

    def __init__(self, name: str, documentation: str, labelname: str,
                 registry: CollectorRegistry | None = None) -> None:
        self._name = name
        self._doc = documentation
        self._labelname = labelname
        self.counts: dict[str, int] = {}
        if registry is not None:
            registry.register(self)

    def inc(self, label: str, amount: int = 1) -> None:
        self.counts[label] = self.counts.get(label, 0) + amount

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self._name, self._doc, labels=[self._labelname])

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self._name, self._doc, labels=[self._labelname])
        for label, count in list(self.counts.items()):
            family.add_metric([label], count)
        yield family


class AggregatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        self.hosts_connected = Gauge("linkpass_aggregator_hosts_connected",
                                     "Hosts with an open agent stream now", registry=r)
        self.events_stored = Counter("linkpass_aggregator_events_stored_total",
                                     "Events stored (first time seen)", registry=r)
        self.events_duplicate = Counter("linkpass_aggregator_events_duplicate_total",
                                        "Events received again and ignored (resends)", registry=r)
        self.events_lost = Counter("linkpass_aggregator_events_lost_total",
                                   "Events hosts dropped or never sent (gaps in their seqs)", registry=r)
        self.store_write_seconds = LoopHistogram("linkpass_aggregator_store_write_seconds",
                                                 "Time to store one event batch durably",
                                                 buckets=WRITE_BUCKETS_S, registry=r)
        self.stream_errors = Counter("linkpass_aggregator_stream_errors_total",
                                     "Agent streams ended by the aggregator, by gRPC status code",
                                     ["code"], registry=r)
        self.watchers_dropped = Counter("linkpass_aggregator_watchers_dropped_total",
                                        "WatchFleetEvents callers dropped for reading too slowly",
                                        registry=r)
        self.stage_seconds = LoopHistogram("linkpass_aggregator_stage_seconds",
                                           "Time spent in each stage of the ingestion path (see metrics.STAGES)",
                                           ["stage"], buckets=STAGE_BUCKETS_S, registry=r)
        self._stages = {name: self.stage_seconds.labels(name) for name in STAGES}
        self.group_calls = LoopHistogram("linkpass_aggregator_store_group_calls",
                                         "Write calls committed together by one group commit",
                                         buckets=GROUP_BUCKETS, registry=r)
        self.messages = LoopCounter("linkpass_aggregator_messages_received",
                                    "Messages read from agent streams, by kind (ConnectRequest's body)",
                                    "kind", registry=r)
        self.plan_pending = Gauge("linkpass_aggregator_mesh_plan_pending",
                                  "1 while a change waits for its probe-mesh plan (or it is being made)",
                                  registry=r)
        self.plans = Counter("linkpass_aggregator_mesh_plans_total",
                             "Probe-mesh plans computed", registry=r)

    def stage(self, name: str, seconds: float) -> None:
        """One observation of `name` (one of STAGES)."""
        self._stages[name].observe(seconds)

    def serve(self, listen: str):
        """Start the HTTP endpoint (adapters/metrics_http: a thread, bounded
        connections and timeouts); returns (server, thread) for shutdown."""
        host, port = split_listen(listen)
        return metrics_http.serve(host, port, self.registry)
