"""Prometheus metrics: events become counters, a snapshot becomes state gauges,
served over HTTP, linted by promtool; a stuck event loop still gets a scrape."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from corefixtures import rails_config
from linkpassd import metrics_snapshot
from linkpassd.adapters.metrics import BfdMetrics, LoopLagMetrics, Metrics, MetricsSnapshot, ProbeMetrics, parse_listen
from linkpassd.core.events import EventKind, EventLog, Severity, reason_class
from linkpassd.core.model import (
    AgentLinkStatus,
    CounterSample,
    DaemonStatus,
    Drain,
    GroupStatus,
    LinkSample,
    ModuleIdentity,
    OpticsReading,
    PortSensors,
    PortState,
    Problem,
    RailStatus,
    ResponderCounters,
    Thresholds,
    Verdict,
)
from linkpassd.core.probe import RTT_BUCKETS_S
from linkpassd.daemon.loop import Daemon

RAIL_OF = {"eth0": "rail0", "eth1": "rail1"}
CANDIDATES = {"rail0": ("rail0", "rail1"), "rail1": ("rail1", "rail0")}
DEADLINE_S = 10.0


def realistic_status() -> DaemonStatus:
    """eth0 failed over (no carrier), eth1 UP but drained for 1 h, optics on eth1."""
    reading = OpticsReading(
        identity=ModuleIdentity(spec="CMIS", form_factor="QSFP-DD", vendor="LAB", part="P",
                                serial="S"),
        temperature_c=41.5, voltage_v=3.29, tx_bias_ma=(6.5, 6.6), tx_power_dbm=(1.0, 0.9),
        rx_power_dbm=(-2.5, None),
        thresholds=(("rx_power_dbm", Thresholds(2.0, 1.0, -10.0, -12.0)),
                    ("tx_power_dbm", Thresholds(4.0, 3.0, -6.0, -8.0)),
                    ("temperature_c", Thresholds(75.0, 70.0, 0.0, -5.0))),
        flags=frozenset({"rx_power_low_warn[1]"}))
    drain = Drain(port="eth1", reason="swap optic", by="root (uid 0)", at=1000.0, until=4600.0)
    return DaemonStatus(
        hostname="h", version="0.9.0", config_source="/etc/linkpass/linkpassd.toml",
        started_at=900.0,
        ports=(PortState("eth0", Verdict.DOWN, False, "DOWN", 1010.0, ("no carrier",)),
               PortState("eth1", Verdict.DEGRADED, True, "RECOVERING", 1000.0, (), drain)),
        links=(LinkSample("eth0", True, 2, True, False, "DOWN", 3, 4),
               LinkSample("eth1", True, 3, True, True, "UP", 1, 0)),
        rails=(RailStatus("rail0", "eth0", "198.18.0.1", 10100, "rail1", "eth1"),
               RailStatus("rail1", "eth1", "198.18.1.1", 10101, "rail1", "eth1")),
        groups=(GroupStatus("fabric", "198.19.0.0/16", 10150, ("rail1",), 1),),
        reconciles=12, netlink_writes=9, last_reconcile_at=1011.0,
        sensors=(PortSensors("eth0", optics_unreadable="no module",
                             counters=CounterSample("eth0", rx_crc_errors=17, symbol_errors=2,
                                                    fec_corrected=1234, fec_uncorrectable=5)),
                 PortSensors("eth1", optics=reading, counters=CounterSample("eth1"))),
        problems=(Problem("refused", "route x", "EEXIST", 1000.0),
                  Problem("refused", "route y", "EEXIST", 1000.0)),
        responder=ResponderCounters(answered=40, refused_source=3),
        boot_id="b00t", last_event_seq=7,
        aggregator=AgentLinkStatus(host_id="h", address="agg.example:7443", refused=True,
                                   last_status="PERMISSION_DENIED", last_error="names another host",
                                   last_failure_at=1009.0, last_ack_at=950.0, spool_events=42,
                                   spool_bytes=8192, events_sent=60, events_acked=18,
                                   events_dropped=1))


def realistic_snapshot() -> MetricsSnapshot:
    counts = (0, 0, 3, 5, 1) + (0,) * (len(RTT_BUCKETS_S) - 4)
    probes = (ProbeMetrics(path="eth1:198.18.1.1->198.18.9.9", port="eth1", rail="rail1",
                           peer="198.18.9.9", state="UP", loss_ratio=0.05, last_rtt_s=0.0003,
                           sent=200, received=190, lost=10, late=0, rtt_buckets=RTT_BUCKETS_S,
                           rtt_counts=counts, rtt_sum_s=0.0031),)
    bfd = (BfdMetrics("bfd:198.18.0.254", "eth0", "rail0", "198.18.0.254", "Down", ups=1,
                      downs=1, detection_time_s=0.9),)
    return metrics_snapshot.from_status(realistic_status(), RAIL_OF, CANDIDATES, bfd=bfd,
                                        probes=probes,
                                        loop_lag=LoopLagMetrics(0.004, 0.02, 3, 5000),
                                        now=1012.0)


def cable_pull_events():
    log = EventLog("b00t")
    ev = lambda kind, name, **kw: log.append(kind, name, wall=1000.0, mono=5.0, **kw)  # noqa: E731
    return [
        ev(EventKind.RAIL_PATH, "rail_path", rail="rail0", port="eth0", path="rail0",
           previous="unknown"),  # the first decision: no reroute
        ev(EventKind.VERDICT, "port_verdict", port="eth1", rail="rail1", verdict="UP",
           previous="none", reason="healthy at start"),  # a first verdict: no change
        ev(EventKind.VERDICT, "port_verdict", port="eth0", rail="rail0", verdict="DOWN",
           previous="UP", reason="no carrier (operstate DOWN)"),
        ev(EventKind.RAIL_PATH, "rail_path", rail="rail0", port="eth0", path="rail1",
           previous="rail0"),
        ev(EventKind.GROUP_MEMBERS, "group_members", group="fabric", members="rail1"),
        ev(EventKind.DRAIN, "drain", port="eth1", rail="rail1", reason="swap optic"),
        ev(EventKind.RAIL_PATH, "rail_path", rail="rail1", port="eth1", path="rail0",
           previous="rail1"),
        ev(EventKind.RAIL_PATH, "rail_path", rail="rail1", port="eth1", path="rail1",
           previous="rail0", cause="echo: all 1 peers unreachable"),
        ev(EventKind.RESYNC, "resync", severity=Severity.WARNING),
        ev(EventKind.RECONCILE_FAILED, "reconcile_failed", severity=Severity.ERROR),
        ev(EventKind.RELOAD_REFUSED, "reload_rejected", severity=Severity.ERROR),
        ev(EventKind.CONFLICT, "foreign_object", severity=Severity.WARNING),
        ev(EventKind.UNDRAIN, "port_undrained", port="eth1", rail="rail1", how="expired"),
    ]


def scrape(address: tuple[str, int]) -> str:
    host, port = address
    host = f"[{host}]" if ":" in host else host
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=DEADLINE_S) as resp:
        assert resp.status == 200
        return resp.read().decode()


def values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def v(vals, name, **labels) -> float:
    return vals[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def served():
    started = []

    def serve(metrics: Metrics, listen: str = "127.0.0.1:0") -> tuple[str, int]:
        address = metrics.serve(listen)
        started.append(metrics)
        return address

    yield serve
    for metrics in started:
        metrics.close()


def test_a_realistic_snapshot_and_events_are_served_with_the_values_they_hold(served):
    metrics = Metrics(realistic_snapshot)
    for event in cable_pull_events():
        metrics.on_event(event)
    metrics.on_reconcile(0.004, 3)
    metrics.on_reconcile(0.2, 0)
    vals = values(scrape(served(metrics)))

    assert v(vals, "linkpass_snapshot_ok") == 1
    # the aggregator link (issue 28: the daemon exported no agent or spool metrics)
    assert v(vals, "linkpass_agent_info", host_id="h", address="agg.example:7443") == 1
    assert v(vals, "linkpass_agent_connected") == 0 and v(vals, "linkpass_agent_refused") == 1
    assert v(vals, "linkpass_agent_spool_events") == 42 and v(vals, "linkpass_agent_spool_bytes") == 8192
    assert v(vals, "linkpass_agent_events_sent_total") == 60
    assert v(vals, "linkpass_agent_events_acked_total") == 18
    assert v(vals, "linkpass_agent_events_dropped_total") == 1
    assert v(vals, "linkpass_agent_last_ack_timestamp_seconds") == 950.0
    assert v(vals, "linkpass_agent_last_ack_age_seconds") == 62.0
    assert v(vals, "linkpass_verdict_changes_total", port="eth0", rail="rail0", to="DOWN") == 1
    assert sum(val for (name, _), val in vals.items()
               if name == "linkpass_verdict_changes_total") == 1
    assert v(vals, "linkpass_reroutes_total", rail="rail0", cause="carrier") == 1
    assert v(vals, "linkpass_reroutes_total", rail="rail1", cause="drain") == 1
    assert v(vals, "linkpass_reroutes_total", rail="rail1", cause="echo") == 1
    assert sum(val for (name, _), val in vals.items() if name == "linkpass_reroutes_total") == 3
    assert v(vals, "linkpass_group_changes_total", group="fabric") == 1
    assert v(vals, "linkpass_drains_total", port="eth1") == 1
    assert v(vals, "linkpass_undrains_total", port="eth1", how="expired") == 1
    assert v(vals, "linkpass_resyncs_total") == 1
    assert v(vals, "linkpass_reconcile_failures_total") == 1
    assert v(vals, "linkpass_conflicts_total") == 1
    assert v(vals, "linkpass_reloads_total", result="refused") == 1
    assert v(vals, "linkpass_reloads_total", result="accepted") == 0
    assert v(vals, "linkpass_events_total", kind="rail_path", severity="info") == 4
    assert v(vals, "linkpass_events_total", kind="verdict", severity="info") == 2
    assert v(vals, "linkpass_kernel_writes_total") == 3
    assert v(vals, "linkpass_reconcile_duration_seconds_count") == 2
    assert v(vals, "linkpass_reconcile_duration_seconds_bucket", le="0.005") == 1

    assert v(vals, "linkpass_port_verdict", port="eth0", rail="rail0", verdict="DOWN") == 1
    assert v(vals, "linkpass_port_verdict", port="eth0", rail="rail0", verdict="UP") == 0
    assert v(vals, "linkpass_port_phase", port="eth1", rail="rail1", phase="RECOVERING") == 1
    assert v(vals, "linkpass_port_carrier", port="eth0", rail="rail0") == 0
    assert v(vals, "linkpass_port_drained", port="eth1", rail="rail1") == 1
    assert v(vals, "linkpass_ports_drained") == 1
    assert v(vals, "linkpass_port_drain_expiry_timestamp_seconds", port="eth1", rail="rail1") == 4600
    assert v(vals, "linkpass_port_carrier_changes_total", port="eth0", rail="rail0",
             direction="down") == 4
    assert v(vals, "linkpass_rail_path", rail="rail0", port="eth0", path="rail1") == 1
    assert v(vals, "linkpass_rail_path", rail="rail0", port="eth0", path="rail0") == 0
    assert v(vals, "linkpass_rail_failed_over", rail="rail0", port="eth0") == 1
    assert v(vals, "linkpass_rail_failed_over", rail="rail1", port="eth1") == 0
    assert v(vals, "linkpass_group_members", group="fabric") == 1
    assert v(vals, "linkpass_problems", kind="refused") == 2

    bfd = dict(session="bfd:198.18.0.254", port="eth0", rail="rail0", peer="198.18.0.254")
    assert v(vals, "linkpass_bfd_session_state", state="Down", **bfd) == 1
    assert v(vals, "linkpass_bfd_session_state", state="Up", **bfd) == 0
    assert v(vals, "linkpass_bfd_detection_time_seconds", **bfd) == 0.9

    path = dict(path="eth1:198.18.1.1->198.18.9.9", port="eth1", rail="rail1", peer="198.18.9.9")
    assert v(vals, "linkpass_probe_path_state", state="UP", **path) == 1
    assert v(vals, "linkpass_probe_loss_ratio", **path) == 0.05
    assert v(vals, "linkpass_probes_lost_total", **path) == 10
    assert v(vals, "linkpass_probe_rtt_seconds_bucket", le="0.0002", **path) == 3
    assert v(vals, "linkpass_probe_rtt_seconds_bucket", le="0.001", **path) == 9
    assert v(vals, "linkpass_probe_rtt_seconds_bucket", le="+Inf", **path) == 9
    assert v(vals, "linkpass_probe_rtt_seconds_count", **path) == 9
    assert v(vals, "linkpass_echo_responder_datagrams_total", result="refused_source") == 3

    assert v(vals, "linkpass_optic_rx_power_dbm", port="eth1", rail="rail1", lane="0") == -2.5
    assert ("linkpass_optic_rx_power_dbm",
            (("lane", "1"), ("port", "eth1"), ("rail", "rail1"))) not in vals  # not reported
    assert v(vals, "linkpass_optic_rx_power_threshold_dbm", port="eth1", rail="rail1",
             level="low_alarm") == -12.0
    assert v(vals, "linkpass_optic_tx_bias_amperes", port="eth1", rail="rail1",
             lane="1") == pytest.approx(0.0066)
    assert v(vals, "linkpass_optic_temperature_celsius", port="eth1", rail="rail1") == 41.5
    assert v(vals, "linkpass_optic_unreadable", port="eth0", rail="rail0") == 1
    assert v(vals, "linkpass_optic_flag", port="eth1", rail="rail1", flag="rx_power_low_warn[1]") == 1
    assert v(vals, "linkpass_port_errors_total", port="eth0", rail="rail0", kind="crc") == 17
    assert v(vals, "linkpass_port_fec_uncorrectable_blocks_total", port="eth0", rail="rail0") == 5
    assert v(vals, "linkpass_event_loop_lag_seconds") == 0.004
    assert v(vals, "linkpass_event_loop_stalls_total") == 3
    assert v(vals, "linkpass_daemon_info", version="0.9.0", boot_id="b00t") == 1
    assert ("process_cpu_seconds_total", ()) in vals


def test_promtool_finds_nothing_to_lint_in_the_exposition(served):
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: scripts/bootstrap.sh installs Debian's prometheus package"
    metrics = Metrics(realistic_snapshot)
    for event in cable_pull_events():
        metrics.on_event(event)
    metrics.on_reconcile(0.004, 3)
    text = scrape(served(metrics))
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=30)
    assert lint.returncode == 0 and not (lint.stdout + lint.stderr).strip(), \
        lint.stdout + lint.stderr


class StuckLoop:
    """An event loop on its own thread that can be held busy (a stand-in for a
    daemon loop stuck in a long computation)."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.release = threading.Event()

    def hold(self) -> None:
        held = threading.Event()

        def busy():
            held.set()
            self.release.wait(DEADLINE_S)

        self.loop.call_soon_threadsafe(busy)
        assert held.wait(DEADLINE_S)

    def settle(self) -> None:
        """Until every callback queued so far has run (FIFO)."""
        done = threading.Event()
        self.loop.call_soon_threadsafe(done.set)
        assert done.wait(DEADLINE_S)

    def close(self) -> None:
        self.release.set()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(DEADLINE_S)
        self.loop.close()


@pytest.fixture
def stuck_loop():
    loop = StuckLoop()
    try:
        yield loop
    finally:
        loop.close()


def test_the_snapshot_is_taken_on_the_event_loop_thread(served, stuck_loop):
    threads = []

    def snapshot():
        threads.append(threading.get_ident())
        return realistic_snapshot()

    metrics = Metrics(snapshot, loop=stuck_loop.loop)
    vals = values(scrape(served(metrics)))
    assert v(vals, "linkpass_snapshot_ok") == 1
    assert threads == [stuck_loop.thread.ident]
    assert v(vals, "linkpass_snapshot_wait_seconds") >= 0


def test_a_stuck_loop_still_gets_a_scrape_with_the_counters_and_the_timeout_counted(
        served, stuck_loop):
    calls = []

    def snapshot():
        calls.append(1)
        return realistic_snapshot()

    metrics = Metrics(snapshot, loop=stuck_loop.loop, snapshot_timeout_s=0.3)
    metrics.on_event(cable_pull_events()[2])
    address = served(metrics)
    stuck_loop.hold()
    started = time.monotonic()
    vals = values(scrape(address))
    assert time.monotonic() - started < DEADLINE_S
    assert v(vals, "linkpass_snapshot_ok") == 0
    assert v(vals, "linkpass_snapshot_timeouts_total") == 1
    assert v(vals, "linkpass_verdict_changes_total", port="eth0", rail="rail0", to="DOWN") == 1
    assert not any(name == "linkpass_port_verdict" for name, _ in vals)  # no state without the loop

    stuck_loop.release.set()
    stuck_loop.settle()
    assert calls == []  # the abandoned request did no work when the loop got to it
    vals = values(scrape(address))
    assert v(vals, "linkpass_snapshot_ok") == 1 and calls == [1]
    assert v(vals, "linkpass_snapshot_timeouts_total") == 1


def test_a_snapshot_that_fails_is_counted_and_the_scrape_still_answers(served):
    def broken():
        raise KeyError("eth9")

    metrics = Metrics(broken)
    vals = values(scrape(served(metrics)))
    assert v(vals, "linkpass_snapshot_ok") == 0
    assert v(vals, "linkpass_snapshot_errors_total") == 1


def test_a_bad_value_in_the_snapshot_fails_only_the_state_part(served):
    bad = MetricsSnapshot(ports=(), problems=(("refused", "many"),))  # type: ignore[arg-type]
    metrics = Metrics(lambda: bad)
    vals = values(scrape(served(metrics)))
    assert v(vals, "linkpass_snapshot_ok") == 0 and v(vals, "linkpass_snapshot_errors_total") == 1


def test_an_address_in_use_is_an_oserror_naming_it(served):
    first = Metrics(MetricsSnapshot)
    host, port = served(first)
    with pytest.raises(OSError, match=f"127.0.0.1:{port}"):
        Metrics(MetricsSnapshot).serve(f"127.0.0.1:{port}")


@pytest.mark.parametrize("listen", ["localhost:9469", "127.0.0.1", "127.0.0.1:70000",
                                    "::1:9469", "127.0.0.1:-1", ""])
def test_a_bad_listen_address_is_refused_naming_it(listen):
    with pytest.raises(ValueError, match="metrics listen address"):
        parse_listen(listen)


def test_ipv6_listen_addresses_take_brackets(served):
    assert parse_listen("[::1]:9469") == ("::1", 9469)
    try:
        host, port = served(Metrics(MetricsSnapshot), "[::1]:0")
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    assert host == "::1" and port > 0
    assert "linkpass_snapshot_ok 1.0" in scrape((host, port))


@pytest.mark.parametrize("reason, cause", [
    ("no carrier (operstate DOWN)", "carrier"), ("interface missing", "carrier"),
    ("no such port: the interface does not exist", "carrier"),
    ("bfd:198.18.0.254: session Down (control detection time expired)", "bfd"),
    ("echo: all 2 peers unreachable: a, b", "echo"), ("optics: rx power -14 dBm", "optics"),
    ("counters: 40 CRC errors/s", "counters"), ("flaps: suppressed", "flap"), ("flap", "flap"),
    ("drained by root (uid 0): swap", "drain"), ("link healthy", "recovered"),
    ("awaiting proof from echo: x", "carried"), ("something new", "other")])
def test_verdict_reasons_map_to_reroute_causes(reason, cause):
    assert reason_class(reason) == cause


def test_on_event_never_raises_on_an_odd_event():
    metrics = Metrics(MetricsSnapshot)
    log = EventLog("b")
    metrics.on_event(log.append(EventKind.VERDICT, "port_verdict", wall=1.0, mono=1.0))
    metrics.on_reconcile(float("nan"), -1)
    vals = values(_exposition(metrics))
    assert v(vals, "linkpass_verdict_changes_total", port="", rail="", to="unknown") == 1
    assert v(vals, "linkpass_reconcile_duration_seconds_count") == 0


def _exposition(metrics: Metrics) -> str:
    from prometheus_client import generate_latest
    return generate_latest(metrics.registry).decode()


def test_take_reads_a_daemon_with_the_names_it_really_has():
    daemon = Daemon(rails_config(2))
    for i, carrier in ((0, True), (1, False)):
        daemon.observe(LinkSample(f"eth{i}", True, 2 + i, True, carrier, "UP" if carrier else
                                   "DOWN"), 1.0)
    snap = metrics_snapshot.take(daemon)
    assert {(p.port, p.rail, p.verdict) for p in snap.ports} == {("eth0", "rail0", "UP"),
                                                                 ("eth1", "rail1", "DOWN")}
    assert snap.loop_lag is not None and snap.bfd == () and snap.probes == ()
    vals = values(_exposition(Metrics(lambda: snap)))
    assert v(vals, "linkpass_port_verdict", port="eth1", rail="rail1", verdict="DOWN") == 1
    assert snap.agent is None  # standalone: no agent metrics
    assert not any(name.startswith("linkpass_agent_") for name, _ in vals)


REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


def _served_names() -> set[str]:
    metrics = Metrics(realistic_snapshot)
    for event in cable_pull_events():
        metrics.on_event(event)
    text = _exposition(metrics)
    return {line.split()[2] for line in text.splitlines()
            if line.startswith("# TYPE linkpass_") and not line.split()[2].endswith("_created")}


def test_docs_list_every_metric_served():
    doc = (REPO / "docs" / "metrics.md").read_text()
    documented = set(__import__("re").findall(r"`(linkpass_[a-z_]+)`", doc))
    served = _served_names()
    # Optic thresholds are documented as one pattern row.
    missing = {n for n in served - documented if "_threshold_" not in n}
    assert not missing, f"served but not in docs/metrics.md: {sorted(missing)}"


def test_the_dashboard_asks_only_for_metrics_that_are_served_and_its_queries_parse(tmp_path):
    import json
    import re
    dashboard = json.loads((REPO / "docs" / "grafana" / "linkpass-fleet.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    served = _served_names()
    suffixes = ("_bucket", "_count", "_sum")
    asked = {re.sub(r"(_bucket|_count|_sum)$", "", n) if n.endswith(suffixes) else n
             for e in exprs for n in re.findall(r"\blinkpass_[a-z_]+", e)}
    assert asked - served == set()
    assert {v["name"] for v in dashboard["templating"]["list"]} >= {"datasource", "host", "port"}
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: scripts/bootstrap.sh installs Debian's prometheus package"
    rules = ["groups:", "- name: dashboard", "  rules:"]
    for i, e in enumerate(e for e in exprs if not e.startswith("label_values")):
        e = (e.replace("$host", ".*").replace("$port", ".*").replace("$__rate_interval", "1m")
             .replace("$__range", "1h"))
        rules += [f"  - record: dashboard:q{i}", f"    expr: {json.dumps(e)}"]
    path = tmp_path / "rules.yml"
    path.write_text("\n".join(rules) + "\n")
    check = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                           text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
