"""A live linkpassd's /metrics, scraped from inside its namespace: promtool
finds nothing to lint, and a cable pull shows as a verdict change, a reroute
caused by carrier and the port's DOWN state."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from labs.daemonproc import DaemonProcess, rail_config_toml
from labs.echopeer import NETNS_PEER as ECHO_PEER
from labs.echopeer import EchoPeerProcess

pytestmark = pytest.mark.netns

# The lab's namespace is new for each test, so nothing else listens in it.
METRICS_PORT = 9469
FABRIC = "198.18.0.0/16"  # sources the daemon's echo responder answers
DEADLINE_S = 15.0
_SCRAPE = ("import sys, urllib.request; "
           "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())")


def scrape(netns: str) -> str | None:
    """The exposition, fetched from inside `netns`; None while nothing answers."""
    proc = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", _SCRAPE,
                           f"http://127.0.0.1:{METRICS_PORT}/metrics"],
                          capture_output=True, text=True, timeout=20)
    return proc.stdout if proc.returncode == 0 else None


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(vals, name: str, **labels) -> float | None:
    return vals.get((name, frozenset(labels.items())))


def scrape_until(netns: str, what: str, ready) -> dict:
    """Scrape until `ready(samples)` holds, for at most DEADLINE_S."""
    deadline, last = time.monotonic() + DEADLINE_S, None
    while time.monotonic() < deadline:
        text = scrape(netns)
        if text is not None:
            last = samples(text)
            if ready(last):
                return last
        time.sleep(0.1)
    shown = sorted((n, dict(labels), v) for (n, labels), v in (last or {}).items()
                   if n.startswith("linkpass_"))
    raise AssertionError(f"metrics never showed {what} within {DEADLINE_S}s; last scrape: {shown}")


@pytest.fixture
def run_dir():
    """A short run directory: the control socket's path must fit a Unix socket name."""
    path = tempfile.mkdtemp(prefix="lp-met-", dir="/tmp")
    try:
        yield Path(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def metrics_daemon(lab, run_dir):
    """Factory: linkpassd with metrics on, `probes`: echo-probing ECHO_PEER from both rails."""
    lab.host.ip("link", "set", "lo", "up")
    cfg = run_dir / "linkpassd.toml"
    sock = str(run_dir / "ctl.sock")
    with contextlib.ExitStack() as stack:
        def start(probes: bool = False) -> DaemonProcess:
            extra = f'[metrics]\nlisten = "127.0.0.1:{METRICS_PORT}"\n'
            if probes:
                extra += f'[probes]\nenabled = true\nfabric_prefixes = ["{FABRIC}"]\n'
            cfg.write_text(rail_config_toml(sock, str(run_dir), lab.rails, rise=2,
                                            hold_down_s=1.0, extra=extra,
                                            probe_peers=[[ECHO_PEER], [ECHO_PEER]] if probes else ()))
            daemon = stack.enter_context(
                DaemonProcess(lab.host.name, cfg, sock, run_dir / "linkpassd.log"))
            daemon.wait_ready()
            return daemon
        yield start


def promtool_check(text: str) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: scripts/bootstrap.sh installs Debian's prometheus package"
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=30)
    assert lint.returncode == 0 and not (lint.stdout + lint.stderr).strip(), \
        lint.stdout + lint.stderr


def test_a_live_daemons_metrics_pass_promtool_and_show_a_cable_pull(lab, metrics_daemon):
    metrics_daemon()
    port0, port1 = lab.rails[0].port, lab.rails[1].port
    up = scrape_until(lab.host.name, "both ports UP", lambda v: all(
        value(v, "linkpass_port_verdict", port=p, rail=r, verdict="UP") == 1
        for p, r in ((port0, "rail0"), (port1, "rail1"))))
    assert value(up, "linkpass_snapshot_ok") == 1
    assert value(up, "linkpass_rail_failed_over", rail="rail0", port=port0) == 0
    assert value(up, "linkpass_verdict_changes_total", port=port0, rail="rail0", to="DOWN") is None

    text = scrape(lab.host.name)
    assert text is not None
    promtool_check(text)

    try:
        lab.cut(lab.rails[0])
        pulled = scrape_until(lab.host.name, f"{port0} DOWN and rail0 rerouted", lambda v: (
            value(v, "linkpass_verdict_changes_total", port=port0, rail="rail0", to="DOWN") == 1
            and value(v, "linkpass_reroutes_total", rail="rail0", cause="carrier") == 1))
    finally:
        lab.restore(lab.rails[0])
    assert value(pulled, "linkpass_port_verdict", port=port0, rail="rail0", verdict="DOWN") == 1
    assert value(pulled, "linkpass_port_carrier", port=port0, rail="rail0") == 0
    assert value(pulled, "linkpass_rail_path", rail="rail0", port=port0, path="rail1") == 1
    assert value(pulled, "linkpass_kernel_writes_total") > 0
    assert value(pulled, "linkpass_reconcile_duration_seconds_count") >= 1
    # Only the pulled port changed verdict.
    assert [dict(labels) for (n, labels), v in pulled.items()
            if n == "linkpass_verdict_changes_total" and v] == \
        [{"port": port0, "rail": "rail0", "to": "DOWN"}]


def test_probe_paths_show_their_state_loss_and_rtt_histogram(lab, metrics_daemon):
    lab.leaf.ip("link", "set", "lo", "up")  # this kernel has no dummy links
    lab.leaf.ip("addr", "add", f"{ECHO_PEER}/32", "dev", "lo")
    paths = [dict(path=f"{r.port}:{r.address}->{ECHO_PEER}", port=r.port, rail=f"rail{r.index}",
                  peer=ECHO_PEER) for r in lab.rails]
    with EchoPeerProcess(lab.leaf.name, duration=60):
        metrics_daemon(probes=True)
        vals = scrape_until(lab.host.name, "both paths UP with 20 replies each", lambda v: all(
            value(v, "linkpass_probe_path_state", state="UP", **p) == 1
            and (value(v, "linkpass_probe_rtt_seconds_count", **p) or 0) >= 20 for p in paths))
        text = scrape(lab.host.name)
    for p in paths:
        count = value(vals, "linkpass_probe_rtt_seconds_count", **p)
        assert value(vals, "linkpass_probe_rtt_seconds_bucket", le="+Inf", **p) == count
        mean = value(vals, "linkpass_probe_rtt_seconds_sum", **p) / count
        assert 0 < mean < 0.1, f"mean RTT {mean}s on a veth lab"
        assert value(vals, "linkpass_probe_replies_total", **p) >= 20
        assert value(vals, "linkpass_probe_loss_ratio", **p) == 0.0
        assert value(vals, "linkpass_probe_last_rtt_seconds", **p) < 0.1
    assert text is not None
    promtool_check(text)
