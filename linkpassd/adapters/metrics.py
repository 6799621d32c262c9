"""Prometheus metrics: counters fed by the daemon's events, state read at scrape time.

Two kinds of numbers, two ways in:

* What *happened* (verdict changes, reroutes by cause, drains, resyncs, failed
  reconciles, conflicts, reloads, reconcile latency, kernel writes) is counted
  as it happens: the daemon calls `on_event` for every `core.events.Event` and
  `on_reconcile` after every pass, on its loop. Metrics are fed from the same
  event stream as the logs and the control API, so they never disagree.
* What *is* (verdicts, phases, BFD and probe state, loss, RTT, optics, error
  counter totals, loop lag, drains) is a `MetricsSnapshot` taken when
  Prometheus scrapes. The HTTP server runs on its own thread (prometheus_client's
  threaded server); it never reads the daemon's structures itself. It asks the
  event loop to take the snapshot (`call_soon_threadsafe`) and waits at most
  `snapshot_timeout_s`: a snapshot is then consistent (taken between two loop
  steps) and races nothing. A loop that does not answer in time is itself the
  news: the scrape still serves the counters, with `linkpass_snapshot_ok 0` and
  `linkpass_snapshot_timeouts_total` counting it, and the late request is
  dropped unrun when the loop gets to it.

Names and units follow Prometheus conventions (docs/metrics.md lists every
metric): `linkpass_` prefix, base units (seconds, volts, amperes, ratios 0..1),
`_total` counters. Optical power stays in dBm, the unit the module, its
thresholds and every optics datasheet use.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from linkpassd.adapters import metrics_http
from linkpassd.core.events import Event, EventKind, reason_class
from linkpassd.core.model import AgentLinkStatus, CounterSample, ResponderCounters

log = structlog.get_logger("linkpassd.metrics")

SNAPSHOT_TIMEOUT_S = 2.0  # a scrape waits this long for the event loop
RECONCILE_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                       2.5, 5.0, 10.0)
VERDICTS = ("UP", "DEGRADED", "DOWN")
PHASES = ("UP", "DEGRADED", "DOWN", "FAILING", "RECOVERING")
BFD_STATES = ("AdminDown", "Down", "Init", "Up")
PROBE_STATES = ("NEVER_UP", "UP", "DEGRADED", "SUSPECT", "DOWN")
NO_PATH = "none"  # a rail table with no route


# --------------------------------------------------------------------------
# What a scrape reads: plain values, taken on the event loop
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class PortMetrics:
    port: str
    rail: str
    verdict: str  # UP, DEGRADED, DOWN
    phase: str  # the health machine's phase: a verdict, FAILING or RECOVERING
    carrier: bool
    since: float  # unix time of the last verdict change
    drained: bool = False
    drain_until: float | None = None  # unix time; None: until undrained (or not drained)
    carrier_ups: int | None = None  # the kernel's carrier up/down counts (flaps)
    carrier_downs: int | None = None


@dataclass(frozen=True)
class RailMetrics:
    rail: str
    port: str
    active: str  # the rail whose path the table uses; "" for none
    candidates: tuple[str, ...]  # the rail itself, then its backups


@dataclass(frozen=True)
class GroupMetrics:
    group: str
    members: int
    min_paths: int


@dataclass(frozen=True)
class BfdMetrics:
    session: str
    port: str
    rail: str
    peer: str
    state: str  # AdminDown, Down, Init, Up
    ups: int = 0
    downs: int = 0
    detection_time_s: float | None = None


@dataclass(frozen=True)
class ProbeMetrics:
    path: str  # "port:source->peer"
    port: str
    rail: str
    peer: str
    state: str  # NEVER_UP, UP, DEGRADED, SUSPECT, DOWN
    loss_ratio: float | None = None  # over the loss window; None: no steady probe judged yet
    last_rtt_s: float | None = None
    sent: int = 0
    received: int = 0  # on time
    lost: int = 0
    late: int = 0
    rtt_buckets: tuple[float, ...] = ()  # upper bounds, +Inf implied
    rtt_counts: tuple[int, ...] = ()  # replies per bucket (not cumulative), +Inf last
    rtt_sum_s: float = 0.0
    # The detection contract (core.probe): the tolerance, the longest silence
    # that ended by itself (its margin is the difference), the longest the
    # peer's responder held a request, and suspicions raised.
    tolerance_s: float | None = None
    longest_silence_s: float = 0.0
    peer_held_max_s: float = 0.0
    silences: int = 0
    # One-way delays (core.oneway): medians towards the peer and back, and
    # their error bound; None while not reported (no clock bound at either end).
    one_way_towards_s: float | None = None
    one_way_back_s: float | None = None
    one_way_bound_s: float | None = None


@dataclass(frozen=True)
class OpticValue:
    port: str
    rail: str
    quantity: str  # temperature_c, voltage_v, tx_bias_ma, tx_power_dbm, rx_power_dbm
    value: float
    lane: int | None = None  # None: a module-wide quantity
    level: str = ""  # "" for a reading; high_alarm, high_warn, low_warn, low_alarm for a threshold


@dataclass(frozen=True)
class PortCounters:
    port: str
    rail: str
    sample: CounterSample


@dataclass(frozen=True)
class LoopLagMetrics:
    recent_max_s: float  # worst lag over the meter's window (30 s)
    max_s: float  # worst since start
    stalls: int
    measurements: int


@dataclass(frozen=True)
class MetricsSnapshot:
    version: str = ""
    boot_id: str = ""
    started_at: float = 0.0
    ports: tuple[PortMetrics, ...] = ()
    rails: tuple[RailMetrics, ...] = ()
    groups: tuple[GroupMetrics, ...] = ()
    bfd: tuple[BfdMetrics, ...] = ()
    probes: tuple[ProbeMetrics, ...] = ()
    optics: tuple[OpticValue, ...] = ()
    optics_unreadable: tuple[tuple[str, str, bool], ...] = ()  # (port, rail, unreadable)
    optic_flags: tuple[tuple[str, str, str], ...] = ()  # (port, rail, flag) raised by the module
    counters: tuple[PortCounters, ...] = ()
    loop_lag: LoopLagMetrics | None = None
    reconciles: int = 0
    last_reconcile_at: float = 0.0
    problems: tuple[tuple[str, int], ...] = ()  # (kind, how many now)
    responder: ResponderCounters | None = None
    last_event_seq: int = 0
    agent: AgentLinkStatus | None = None  # None: standalone (no [aggregator])
    last_ack_age_s: float | None = None  # seconds since the last ack at the snapshot; None: never


# --------------------------------------------------------------------------
# Causes
# --------------------------------------------------------------------------

# --------------------------------------------------------------------------
# The endpoint
# --------------------------------------------------------------------------


def parse_listen(listen: str) -> tuple[str, int]:
    """"IP:PORT" or "[IPv6]:PORT" -> (ip, port); port 0 picks a free one.
    ValueError naming the bad input otherwise (a name is not resolved)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"metrics listen address {listen!r} is not IP:PORT "
                         "(e.g. 127.0.0.1:9469 or [::1]:9469)")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        raise ValueError(f"metrics listen address {listen!r}: {bare!r} is not an IP address") \
            from None
    if ip.version == 6 and not host.startswith("["):
        raise ValueError(f"metrics listen address {listen!r}: put an IPv6 address in brackets, "
                         f"e.g. [{bare}]:{port}")
    return str(ip), int(port)


class Metrics:
    """The daemon's metrics. `snapshot()` gives the state gauges; it is run on
    `loop` when one is given (the daemon's), directly otherwise (tests).
    `registry`: where the metrics live (a private one by default, with the
    process collector: CPU, memory, file descriptors)."""

    def __init__(self, snapshot: Callable[[], MetricsSnapshot],
                 loop: asyncio.AbstractEventLoop | None = None,
                 registry: CollectorRegistry | None = None,
                 snapshot_timeout_s: float = SNAPSHOT_TIMEOUT_S):
        self.snapshot = snapshot
        self.loop = loop
        self.snapshot_timeout_s = snapshot_timeout_s
        if registry is None:
            registry = CollectorRegistry()
            ProcessCollector(registry=registry)
        self.registry = registry
        self._server = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # the scrape bookkeeping below: HTTP threads run in parallel
        self.snapshot_timeouts = 0
        self.snapshot_errors = 0
        self._last_wait_s: float | None = None
        self._last_error = ""
        self._port_cause: dict[str, str] = {}  # port -> class of its latest verdict, drain...

        def counter(name: str, doc: str, labels: Iterable[str] = ()) -> Counter:
            return Counter(name, doc, tuple(labels), registry=registry)

        self.events = counter("linkpass_events_total", "Events recorded, by kind and severity.",
                              ("kind", "severity"))
        self.verdict_changes = counter(
            "linkpass_verdict_changes_total", "Port verdict changes, by the verdict changed to.",
            ("port", "rail", "to"))
        self.reroutes = counter(
            "linkpass_reroutes_total", "Rail tables moved to another path, by the cause: the "
            "signal behind the verdict of the rail's port (carrier, flap, bfd, echo, optics, "
            "counters, drain, undrain, recovered, carried, other, unknown).", ("rail", "cause"))
        self.group_changes = counter("linkpass_group_changes_total",
                                     "Multipath group membership changes.", ("group",))
        self.drains = counter("linkpass_drains_total", "Ports drained by an operator.", ("port",))
        self.undrains = counter("linkpass_undrains_total",
                                "Drains ended, by how (undrain, expired).", ("port", "how"))
        self.resyncs = counter("linkpass_resyncs_total",
                               "Full re-reads of kernel state after the link event stream overran.")
        self.reconcile_failures = counter("linkpass_reconcile_failures_total",
                                          "Reconcile passes that failed as a whole.")
        self.conflicts = counter("linkpass_conflicts_total",
                                 "Foreign objects found in owned ranges or in the way of a write.")
        self.reloads = counter("linkpass_reloads_total",
                               "Configuration reloads, by result (accepted, refused).", ("result",))
        for result in ("accepted", "refused"):
            self.reloads.labels(result)
        self.announce_changes = counter(
            "linkpass_announce_changes_total", "Changes of where a rail address is announced "
            "([announce]), by the rail owning it and the change (announced, detoured, "
            "detour_moved, settling, restored, withdrawn).", ("rail", "change"))
        self.announce_frr_ok = Gauge(
            "linkpass_announce_frr_ok", "1 while FRR runs and imports the announcement table, "
            "0 while something is missing (the status's problems say what), by announcement "
            "table; absent until read.", ("table",), registry=registry)
        self.fence_actions = counter(
            "linkpass_fence_actions_total", "[fence]: what linkpassd did to a port (fence: taken "
            "down; test: brought up for a test; refence: down again after a failed test; "
            "unfence: proved by its own probes; release: brought up without proof, by an "
            "operator's lift or because no other rail was healthy).", ("port", "action"))
        self.fence_held_back = counter(
            "linkpass_fence_held_back_total", "[fence]: fences due but held back (the last "
            "healthy rail, the host cap, no leaf grant); the event says which.", ("port",))
        self.fence_holding = Gauge(
            "linkpass_fence_holding", "[fence]: 1 while linkpassd holds the port fenced (down, "
            "or up for a test with the routes away), 0 otherwise; absent before its first fence "
            "event.", ("port",), registry=registry)
        self.reconcile_seconds = Histogram(
            "linkpass_reconcile_duration_seconds", "Time of one reconcile pass (decide, plan, "
            "kernel writes).", buckets=RECONCILE_BUCKETS_S, registry=registry)
        self.kernel_writes = counter("linkpass_kernel_writes_total",
                                     "Netlink writes (routes, rules, nexthops) the kernel accepted.")
        registry.register(_SnapshotCollector(self))

    # ---- fed by the daemon, on its loop ------------------------------------------

    def on_event(self, event: Event) -> None:
        """Count one event. Never raises: metrics must not break the daemon."""
        try:
            self._count(event)
        except Exception as exc:  # noqa: BLE001 - see above
            log.error("metrics_event_failed", kind=str(event.kind), seq=event.seq, error=repr(exc))

    def _count(self, event: Event) -> None:
        kind = event.kind
        self.events.labels(str(kind), str(event.severity)).inc()
        if kind is EventKind.VERDICT:
            self._port_cause[event.port] = reason_class(event.field("reason") or event.message)
            if event.field("previous") == "none":
                return  # a port's first verdict (at start, or new in a reload) is no change
            to = (event.field("verdict") or event.field("to")).upper().removeprefix("VERDICT.")
            self.verdict_changes.labels(event.port, event.rail, to or "unknown").inc()
        elif kind is EventKind.RAIL_PATH:
            # The first decision after a start is no reroute: it has no previous path.
            if event.field("previous", "unknown") != "unknown":
                cause = event.field("cause")
                cause = reason_class(cause) if cause else self._port_cause.get(event.port, "unknown")
                self.reroutes.labels(event.rail, cause).inc()
        elif kind is EventKind.GROUP_MEMBERS:
            self.group_changes.labels(event.field("group") or event.rail or "unknown").inc()
        elif kind is EventKind.DRAIN:
            self.drains.labels(event.port).inc()
            self._port_cause[event.port] = "drain"
        elif kind is EventKind.UNDRAIN:
            self.undrains.labels(event.port, event.field("how") or "undrain").inc()
            self._port_cause[event.port] = "undrain"
        elif kind is EventKind.RESYNC:
            self.resyncs.inc()
        elif kind is EventKind.RECONCILE_FAILED:
            self.reconcile_failures.inc()
        elif kind is EventKind.CONFLICT:
            self.conflicts.inc()
        elif kind is EventKind.RELOAD:
            self.reloads.labels("accepted").inc()
        elif kind is EventKind.RELOAD_REFUSED:
            self.reloads.labels("refused").inc()
        elif kind is EventKind.ANNOUNCE:
            if event.field("frr"):
                self.announce_frr_ok.labels(event.field("table") or "unknown").set(
                    1 if event.field("frr") == "ok" else 0)
            elif event.field("change"):
                self.announce_changes.labels(event.rail, event.field("change")).inc()
        elif kind is EventKind.FENCE:
            action = event.field("action")
            if action == "held":
                self.fence_held_back.labels(event.port).inc()
            elif action and action != "none":
                self.fence_actions.labels(event.port, action).inc()
            state = event.field("state")
            if state:
                self.fence_holding.labels(event.port).set(1 if state in ("FENCED", "TESTING") else 0)

    def on_reconcile(self, duration_s: float, writes: int) -> None:
        """One reconcile pass took `duration_s` and made `writes` kernel writes."""
        if math.isfinite(duration_s) and duration_s >= 0:
            self.reconcile_seconds.observe(duration_s)
        if writes > 0:
            self.kernel_writes.inc(writes)

    # ---- the HTTP endpoint ---------------------------------------------------

    def serve(self, listen: str) -> tuple[str, int]:
        """Serve /metrics on `listen` ("IP:PORT", "[::1]:9469"; port 0: any
        free one) from a thread; returns the address bound. OSError naming
        the address when it cannot be bound (taken, not local)."""
        if self._server is not None:
            raise RuntimeError("metrics are already served")
        host, port = parse_listen(listen)
        try:
            server, thread = metrics_http.serve(host, port, self.registry)
        except OSError as exc:
            raise OSError(exc.errno, f"metrics: cannot listen on {listen}: "
                                     f"{exc.strerror or exc}") from exc
        self._server, self._thread = server, thread
        bound = server.server_address
        return bound[0], bound[1]

    def close(self) -> None:
        """Stop serving (waits up to half a second for the server's poll)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(2.0)
            self._thread = None

    # ---- the snapshot, from an HTTP thread ---------------------------------------

    def take_snapshot(self) -> MetricsSnapshot | None:
        """The daemon's state now, from the loop; None when the loop did not
        answer in time or the snapshot failed (each is counted)."""
        if self.loop is None:
            try:
                snap = self.snapshot()
            except Exception as exc:  # noqa: BLE001 - a scrape must never take the daemon down
                self._failed(exc)
                return None
            with self._lock:
                self._last_wait_s = 0.0
            return snap
        asked = time.monotonic()
        future: concurrent.futures.Future = concurrent.futures.Future()

        def on_loop() -> None:
            if not future.set_running_or_notify_cancel():
                return  # the scrape gave up: do no work for nobody
            waited = time.monotonic() - asked
            try:
                future.set_result((self.snapshot(), waited))
            except Exception as exc:  # noqa: BLE001 - handed to the scrape
                future.set_exception(exc)

        try:
            self.loop.call_soon_threadsafe(on_loop)
            snap, waited = future.result(self.snapshot_timeout_s)
        except (concurrent.futures.TimeoutError, RuntimeError) as exc:
            # RuntimeError: the loop is closed (the daemon is stopping).
            future.cancel()
            with self._lock:
                self.snapshot_timeouts += 1
                first = self.snapshot_timeouts == 1
            if first:
                log.warning("metrics_snapshot_timeout", timeout_s=self.snapshot_timeout_s,
                            error=repr(exc) if isinstance(exc, RuntimeError) else "",
                            note="the event loop did not answer; counters served without state")
            return None
        except Exception as exc:  # noqa: BLE001 - raised by snapshot() on the loop
            self._failed(exc)
            return None
        with self._lock:
            self._last_wait_s = waited
        return snap

    def _failed(self, exc: Exception) -> None:
        with self._lock:
            self.snapshot_errors += 1
            changed, self._last_error = repr(exc) != self._last_error, repr(exc)
        if changed:
            log.error("metrics_snapshot_failed", error=repr(exc))


class _SnapshotCollector(Collector):
    """The state gauges of one snapshot per scrape, and how taking it went."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # names vary with the snapshot; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        snap = m.take_snapshot()
        state: list[Metric] = []
        if snap is not None:
            try:
                state = list(render(snap))
            except Exception as exc:  # noqa: BLE001 - a bad value must not fail the scrape
                m._failed(exc)
                snap = None
        with m._lock:
            timeouts, errors, wait = m.snapshot_timeouts, m.snapshot_errors, m._last_wait_s
        yield _gauge("linkpass_snapshot_ok", "1 when this scrape got the daemon's state from its "
                     "event loop, 0 when the loop did not answer in time or the snapshot failed.",
                     [((), 1 if snap is not None else 0)])
        yield _counter("linkpass_snapshot_timeouts_total", "Scrapes the event loop did not "
                       "answer in time (served without state).", [((), timeouts)])
        yield _counter("linkpass_snapshot_errors_total", "Scrapes whose snapshot failed.",
                       [((), errors)])
        if wait is not None:
            yield _gauge("linkpass_snapshot_wait_seconds", "How long the latest answered scrape "
                         "waited for the event loop: its responsiveness right then.",
                         [((), wait)])
        yield from state


def _family(cls, name: str, doc: str, labels: tuple[str, ...],
            samples: Iterable[tuple[tuple[str, ...], float]]) -> Metric:
    family = cls(name, doc, labels=list(labels))
    for values, value in samples:
        # Checked here, inside the snapshot's try: the exposition would fail the whole scrape.
        family.add_metric([str(x) for x in values], float(value))
    return family


def _gauge(name: str, doc: str, samples, labels: tuple[str, ...] = ()) -> Metric:
    return _family(GaugeMetricFamily, name, doc, labels, samples)


def _counter(name: str, doc: str, samples, labels: tuple[str, ...] = ()) -> Metric:
    return _family(CounterMetricFamily, name, doc, labels, samples)


def histogram(name: str, doc: str, labels: tuple[str, ...],
              rows: Iterable[tuple[tuple[str, ...], tuple[float, ...], tuple[int, ...], float]]
              ) -> Metric:
    """A histogram family from per-bucket (not cumulative) counts, +Inf last."""
    family = HistogramMetricFamily(name, doc, labels=list(labels))
    for values, bounds, counts, total in rows:
        cumulative, running = [], 0
        for bound, count in zip(bounds + (math.inf,), counts):
            running += count
            cumulative.append(("+Inf" if bound == math.inf else repr(float(bound)), running))
        family.add_metric(list(values), cumulative, sum_value=total)
    return family


# --------------------------------------------------------------------------
# Rendering a snapshot
# --------------------------------------------------------------------------

PORT = ("port", "rail")
PROBE = ("path", "port", "rail", "peer")
BFD = ("session", "port", "rail", "peer")

# quantity -> (metric name stem, unit suffix, factor to the base unit)
OPTIC_QUANTITIES = {
    "temperature_c": ("temperature", "celsius", 1.0),
    "voltage_v": ("supply_voltage", "volts", 1.0),
    "tx_bias_ma": ("tx_bias", "amperes", 1e-3),
    "tx_power_dbm": ("tx_power", "dbm", 1.0),
    "rx_power_dbm": ("rx_power", "dbm", 1.0),
}
LANE_QUANTITIES = frozenset({"tx_bias_ma", "tx_power_dbm", "rx_power_dbm"})
OPTIC_DOCS = {
    "temperature_c": "Module temperature",
    "voltage_v": "Module supply voltage",
    "tx_bias_ma": "Laser bias current, per lane",
    "tx_power_dbm": "Transmitted optical power in dBm, per lane",
    "rx_power_dbm": "Received optical power in dBm, per lane",
}
# CounterSample field -> (metric, its `kind` label or None)
ERROR_COUNTERS = {
    "rx_crc_errors": ("linkpass_port_errors_total", "crc"),
    "symbol_errors": ("linkpass_port_errors_total", "symbol"),
    "length_errors": ("linkpass_port_errors_total", "length"),
    "rx_missed": ("linkpass_port_errors_total", "rx_missed"),
    "fec_corrected": ("linkpass_port_fec_corrected_blocks_total", None),
    "fec_uncorrectable": ("linkpass_port_fec_uncorrectable_blocks_total", None),
    "link_down_events": ("linkpass_port_link_down_events_total", None),
}
COUNTER_DOCS = {
    "linkpass_port_errors_total": "Receive errors as the driver counts them (totals from the "
                                  "latest reading), by kind: crc, symbol, length, rx_missed.",
    "linkpass_port_fec_corrected_blocks_total": "FEC blocks corrected (pre-FEC errors).",
    "linkpass_port_fec_uncorrectable_blocks_total": "FEC blocks that could not be corrected.",
    "linkpass_port_link_down_events_total": "Link down events the driver counted.",
}


def _state_set(name: str, doc: str, labels: tuple[str, ...], state_label: str,
               states: tuple[str, ...], rows: Iterable[tuple[tuple[str, ...], str]]) -> Metric:
    """One series per possible state, 1 for the current one (StateSet style),
    so `== 1` selects and a change is a value change, not a new series."""
    family = GaugeMetricFamily(name, doc, labels=list(labels) + [state_label])
    for values, current in rows:
        for state in states + ((current,) if current not in states else ()):
            family.add_metric(list(values) + [state], 1 if state == current else 0)
    return family


def render(snap: MetricsSnapshot) -> Iterator[Metric]:
    """Every state metric of one snapshot (docs/metrics.md has the list)."""
    yield _gauge("linkpass_daemon_info", "The running daemon: version and boot id (1).",
                 [((snap.version, snap.boot_id), 1)], ("version", "boot_id"))
    yield _gauge("linkpass_daemon_start_time_seconds", "When this daemon started (unix time).",
                 [((), snap.started_at)])
    yield _counter("linkpass_reconciles_total", "Reconcile passes completed.",
                   [((), snap.reconciles)])
    yield _gauge("linkpass_last_reconcile_timestamp_seconds", "When the last reconcile pass "
                 "completed (unix time; 0: none yet).", [((), snap.last_reconcile_at)])
    yield _gauge("linkpass_event_last_sequence", "Sequence number of this boot's latest event.",
                 [((), snap.last_event_seq)])
    yield _gauge("linkpass_problems", "What the daemon cannot do right now, by kind (refused, "
                 "conflict, foreign, bfd, state).", [((k,), n) for k, n in snap.problems],
                 ("kind",))

    ports = snap.ports
    yield _state_set("linkpass_port_verdict", "Port verdict: 1 for the current one.", PORT,
                     "verdict", VERDICTS, [((p.port, p.rail), p.verdict) for p in ports])
    yield _state_set("linkpass_port_phase", "Port health phase: 1 for the current one "
                     "(FAILING and RECOVERING are on their way to another verdict).", PORT,
                     "phase", PHASES, [((p.port, p.rail), p.phase) for p in ports])
    yield _gauge("linkpass_port_carrier", "1 when the port has carrier (admin up, lower up).",
                 [((p.port, p.rail), int(p.carrier)) for p in ports], PORT)
    yield _gauge("linkpass_port_verdict_change_timestamp_seconds",
                 "When the port's verdict last changed (unix time).",
                 [((p.port, p.rail), p.since) for p in ports], PORT)
    yield _gauge("linkpass_port_drained", "1 while an operator has the port drained.",
                 [((p.port, p.rail), int(p.drained)) for p in ports], PORT)
    yield _gauge("linkpass_ports_drained", "Ports drained now.",
                 [((), sum(p.drained for p in ports))])
    yield _gauge("linkpass_port_drain_expiry_timestamp_seconds", "When a timed drain ends "
                 "(unix time).", [((p.port, p.rail), p.drain_until) for p in ports
                                  if p.drained and p.drain_until is not None], PORT)
    yield _counter("linkpass_port_carrier_changes_total", "Carrier changes the kernel counted, "
                   "by direction (up, down): flaps.",
                   [((p.port, p.rail, d), n) for p in ports
                    for d, n in (("up", p.carrier_ups), ("down", p.carrier_downs)) if n is not None],
                   PORT + ("direction",))

    yield _rail_paths(snap.rails)
    yield _gauge("linkpass_rail_failed_over", "1 while a rail's table does not use its own "
                 "port's path.", [((r.rail, r.port), int(r.active != r.rail)) for r in snap.rails],
                 ("rail", "port"))
    yield _gauge("linkpass_group_members", "Rails in a multipath group now.",
                 [((g.group,), g.members) for g in snap.groups], ("group",))
    yield _gauge("linkpass_group_min_paths", "A group's configured capacity floor.",
                 [((g.group,), g.min_paths) for g in snap.groups], ("group",))

    yield from _agent(snap)
    yield from _bfd(snap.bfd)
    yield from _probes(snap)
    yield from _optics(snap)
    yield from _counters(snap.counters)
    lag = snap.loop_lag
    if lag is not None:
        yield _gauge("linkpass_event_loop_lag_seconds", "Worst event-loop lag over the last "
                     "30 s (how late timers ran).", [((), lag.recent_max_s)])
        yield _gauge("linkpass_event_loop_lag_max_seconds", "Worst event-loop lag since start.",
                     [((), lag.max_s)])
        yield _counter("linkpass_event_loop_stalls_total", "Timer runs late by more than the "
                       "stall tolerance (1 ms).", [((), lag.stalls)])


def _agent(snap: MetricsSnapshot) -> Iterator[Metric]:
    """The link to linkpass-aggregator (none for a standalone daemon)."""
    a = snap.agent
    if a is None:
        return
    yield _gauge("linkpass_agent_info", "The aggregator link: the host_id this host reports as "
                 "and the address in use or tried next (1).", [((a.host_id, a.address), 1)],
                 ("host_id", "address"))
    yield _gauge("linkpass_agent_connected", "1 while a stream to the aggregator is open and "
                 "welcomed.", [((), int(a.connected))])
    yield _gauge("linkpass_agent_refused", "1 while the aggregator (or the TLS handshake) refuses "
                 "this host: it does not report until its certificate or host_id is fixed.",
                 [((), int(a.refused))])
    yield _gauge("linkpass_agent_spool_events", "Events in the spool not acknowledged yet.",
                 [((), a.spool_events)])
    yield _gauge("linkpass_agent_spool_bytes", "Size of the spool on disk.",
                 [((), a.spool_bytes)])
    yield _counter("linkpass_agent_events_sent_total", "Events sent to the aggregator (again "
                   "on a new stream).", [((), a.events_sent)])
    yield _counter("linkpass_agent_events_acked_total", "Events the aggregator acknowledged.",
                   [((), a.events_acked)])
    yield _counter("linkpass_agent_events_dropped_total", "Events lost before the aggregator "
                   "got them (spool bound, hand-off full).", [((), a.events_dropped)])
    yield _gauge("linkpass_agent_last_ack_timestamp_seconds", "When the aggregator last "
                 "acknowledged events (unix time; 0: never since the agent started).",
                 [((), a.last_ack_at)])
    if snap.last_ack_age_s is not None:
        yield _gauge("linkpass_agent_last_ack_age_seconds", "Seconds since the aggregator last "
                     "acknowledged events (absent: never since the agent started).",
                     [((), snap.last_ack_age_s)])


def _rail_paths(rails: tuple[RailMetrics, ...]) -> Metric:
    family = GaugeMetricFamily("linkpass_rail_path", "The rail whose path a rail's table uses "
                               f"now (path=\"{NO_PATH}\": no route): 1 for the current one.",
                               labels=["rail", "port", "path"])
    for r in rails:
        current = r.active or NO_PATH
        for path in dict.fromkeys(r.candidates + (NO_PATH, current)):
            family.add_metric([r.rail, r.port, path], 1 if path == current else 0)
    return family


def _bfd(sessions: tuple[BfdMetrics, ...]) -> Iterator[Metric]:
    rows = [((s.session, s.port, s.rail, s.peer), s) for s in sessions]
    yield _state_set("linkpass_bfd_session_state", "BFD session state (RFC 5880): 1 for the "
                     "current one.", BFD, "state", BFD_STATES, [(k, s.state) for k, s in rows])
    yield _counter("linkpass_bfd_session_ups_total", "Times a BFD session came Up.",
                   [(k, s.ups) for k, s in rows], BFD)
    yield _counter("linkpass_bfd_session_downs_total", "Times a BFD session went down from Up.",
                   [(k, s.downs) for k, s in rows], BFD)
    yield _gauge("linkpass_bfd_detection_time_seconds", "Negotiated detection time.",
                 [(k, s.detection_time_s) for k, s in rows if s.detection_time_s is not None], BFD)


def _probes(snap: MetricsSnapshot) -> Iterator[Metric]:
    rows = [((p.path, p.port, p.rail, p.peer), p) for p in snap.probes]
    yield _state_set("linkpass_probe_path_state", "Echo probe path state: 1 for the current "
                     "one.", PROBE, "state", PROBE_STATES, [(k, p.state) for k, p in rows])
    yield _gauge("linkpass_probe_loss_ratio", "Share of steady probes lost over the loss window "
                 "(0..1).", [(k, p.loss_ratio) for k, p in rows if p.loss_ratio is not None], PROBE)
    yield _gauge("linkpass_probe_last_rtt_seconds", "Round trip of the latest reply.",
                 [(k, p.last_rtt_s) for k, p in rows if p.last_rtt_s is not None], PROBE)
    yield _gauge("linkpass_probe_tolerance_seconds", "The path's tolerance: no silence, delay "
                 "or pause shorter than this fails it over.",
                 [(k, p.tolerance_s) for k, p in rows if p.tolerance_s is not None], PROBE)
    yield _gauge("linkpass_probe_longest_silence_seconds", "The longest silence of the path "
                 "that ended with a reply (the tolerance minus it is the margin).",
                 [(k, p.longest_silence_s) for k, p in rows], PROBE)
    yield _gauge("linkpass_probe_peer_held_max_seconds", "The longest time the peer's "
                 "responder said it held one of our requests.",
                 [(k, p.peer_held_max_s) for k, p in rows], PROBE)
    yield _gauge("linkpass_probe_one_way_delay_seconds", "One-way delay of the path "
                 "(direction: towards the peer, back from it), the median of its recent "
                 "replies, within linkpass_probe_one_way_bound_seconds; absent when not "
                 "reported (no clock bound at either end: round trips only).",
                 [(k + (way,), value) for k, p in rows
                  for way, value in (("towards", p.one_way_towards_s), ("back", p.one_way_back_s))
                  if value is not None], PROBE + ("direction",))
    yield _gauge("linkpass_probe_one_way_bound_seconds", "Error bound (+-) of the path's "
                 "one-way delays: this host's clock bound plus the peer's.",
                 [(k, p.one_way_bound_s) for k, p in rows if p.one_way_bound_s is not None],
                 PROBE)
    yield _counter("linkpass_probe_silences_total", "Probes unanswered for the reply wait "
                   "(each starts confirmation probes; most end with a reply).",
                   [(k, p.silences) for k, p in rows], PROBE)
    for name, doc, attr in (
            ("linkpass_probes_sent_total", "Echo probes sent.", "sent"),
            ("linkpass_probe_replies_total", "Replies received.", "received"),
            ("linkpass_probes_lost_total", "Steady probes judged lost (no reply within the "
             "tolerance, path up).", "lost"),
            ("linkpass_probe_late_replies_total", "Replies later than the tolerance, or to a "
             "probe already given up.", "late")):
        yield _counter(name, doc, [(k, getattr(p, attr)) for k, p in rows], PROBE)
    yield histogram("linkpass_probe_rtt_seconds", "Round trip of every reply to our probes "
                    "(kernel timestamps, the peer's holding time taken out).", PROBE,
                    [(k, p.rtt_buckets, p.rtt_counts, p.rtt_sum_s) for k, p in rows
                     if p.rtt_counts and len(p.rtt_counts) == len(p.rtt_buckets) + 1])
    r = snap.responder
    if r is not None:
        yield _counter("linkpass_echo_responder_datagrams_total", "Datagrams the echo responder "
                       "received, by what it did (answered, refused_address, refused_source, "
                       "rate_limited, malformed).",
                       [((k,), v) for k, v in vars(r).items()], ("result",))


def _optics(snap: MetricsSnapshot) -> Iterator[Metric]:
    """A family per quantity and unit; lane quantities carry a `lane` label,
    thresholds (one set per module) a `level` label."""
    families: dict[str, Metric] = {}
    for v in snap.optics:
        known = OPTIC_QUANTITIES.get(v.quantity)
        if known is None or not math.isfinite(v.value):
            continue
        stem, unit, factor = known
        per_lane = v.quantity in LANE_QUANTITIES and not v.level
        if per_lane and v.lane is None:
            continue
        if v.level:
            name = f"linkpass_optic_{stem}_threshold_{unit}"
            doc = f"{OPTIC_DOCS[v.quantity]}: the module's own alarm and warning levels"
            labels, values = PORT + ("level",), (v.port, v.rail, v.level)
        else:
            name, doc = f"linkpass_optic_{stem}_{unit}", OPTIC_DOCS[v.quantity]
            labels = PORT + (("lane",) if per_lane else ())
            values = (v.port, v.rail) + ((str(v.lane),) if per_lane else ())
        family = families.get(name)
        if family is None:
            family = families[name] = GaugeMetricFamily(name, doc + ".", labels=list(labels))
        family.add_metric(list(values), v.value * factor)
    yield from families.values()
    yield _gauge("linkpass_optic_unreadable", "1 when the module's diagnostics could not be read "
                 "or decoded at the latest attempt.",
                 [((port, rail), int(bad)) for port, rail, bad in snap.optics_unreadable], PORT)
    yield _gauge("linkpass_optic_flag", "Alarm and warning flags the module raises now "
                 "(e.g. rx_power_low_alarm[2], tx_fault[0]).",
                 [((port, rail, flag), 1) for port, rail, flag in snap.optic_flags],
                 PORT + ("flag",))


def _counters(counters: tuple[PortCounters, ...]) -> Iterator[Metric]:
    rows: dict[str, list] = {name: [] for name in COUNTER_DOCS}
    for c in counters:
        for attr, (name, kind) in ERROR_COUNTERS.items():
            value = getattr(c.sample, attr)
            if value is not None:
                rows[name].append(((c.port, c.rail) + ((kind,) if kind else ()), value))
    for name, doc in COUNTER_DOCS.items():
        labels = PORT + (("kind",) if name == "linkpass_port_errors_total" else ())
        yield _counter(name, doc, rows[name], labels)
