"""Fleet validation in the railopt lab: each fault found and localised in one
run, and a healthy lab gives no finding.

Not here yet (issue 13 stays open): a blackholing spine link (in railopt every rail has one leaf, so no
same-rail probe crosses a spine: that needs cross-rail probes).

railopt with 4 hosts x 2 rails (a leaf per rail, 2 spines), lldpd in every
switch (labs/lldp.py), linkpassd on every host reporting to a lab
aggregator, and the cabling plan the lab was built with
(labs/topos/cabling.py). Each test injects one fault, runs `linkpassctl
validate` as an operator would (through the aggregator, on every host at
once), reads its JSON report and exit code, and clears the fault; the next
test starts only once every host reports every port UP again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from labs.faults import Miswire, RandomLoss
from labs.faults.blackhole import LeafPortBlackhole
from labs.faults.optics import OpticDegradation
from labs.scenario import LAB_TIMERS
from labs.topos.cabling import write_cabling
from labs.topos.railopt import railopt, start_linkpassd
from linkpassd._proto.linkpass.v1 import fleet_pb2, fleet_pb2_grpc

pytestmark = pytest.mark.lab

HOSTS, RAILS = 4, 2
DURATION_S = 8.0  # each host's window (LLDP from lldpd every second, probes, counters)
RUN_TIMEOUT_S = 120.0
HEALTHY_S = 60.0


def needs_lab() -> None:
    if os.geteuid() != 0 or shutil.which("mnexec") is None or shutil.which("lldpd") is None:
        pytest.skip("needs root, mnexec and lldpd (./scripts/bootstrap.sh installs them)")


@pytest.fixture(scope="module")
def vlab():
    needs_lab()
    with railopt(HOSTS, RAILS, 2, "linkpassd", linkpassd_timers=LAB_TIMERS,
                 probes={"interval_ms": 50}, aggregator=True, mesh=True, lldp=True) as lab:
        for host in lab.hosts:
            start_linkpassd(lab, host.name)
        lab.cabling_path = lab.workdir / "cabling.toml"
        write_cabling(lab.plan, lab.cabling_path)
        yield lab


def problems(lab) -> list[str]:
    """What keeps the lab from a clean start: every host connected to the
    aggregator and every port UP in its last report."""
    with lab.aggregator.channel() as channel:
        hosts = fleet_pb2_grpc.FleetServiceStub(channel).ListHosts(
            fleet_pb2.ListHostsRequest(), timeout=10).hosts
    seen = {h.host_id: h for h in hosts}
    found = []
    for host in lab.hosts:
        view = seen.get(host.name)
        if view is None or not view.connected:
            found.append(f"{host.name}: not connected")
            continue
        for port in view.report.ports:
            if port.verdict != 1:  # VERDICT_UP
                found.append(f"{host.name} {port.port}: verdict {port.verdict}")
        if len(view.report.ports) != RAILS:
            found.append(f"{host.name}: {len(view.report.ports)} ports reported")
    return found


def wait_healthy(lab) -> None:
    deadline = time.monotonic() + HEALTHY_S
    while found := problems(lab):
        if time.monotonic() > deadline:
            pytest.fail("lab not healthy before the run:\n  " + "\n  ".join(found))
        time.sleep(0.5)


def validate(lab) -> tuple[int, dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "linkpassd.ctl.main", "validate", "--aggregator",
         lab.aggregator.address, "--insecure", "--plan", str(lab.cabling_path),
         "--duration", str(DURATION_S), "-o", "json"],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode in (0, 8), f"validate failed ({proc.returncode}): {proc.stderr}"
    return proc.returncode, json.loads(proc.stdout)


def findings(report: dict) -> list[dict]:
    return report.get("findings", [])


def summary(report: dict) -> str:
    return "\n".join(f"{f.get('kind')}: {f.get('component')} ({f.get('confidence')})"
                     for f in findings(report)) or "no findings"


def test_a_healthy_lab_gives_no_finding(vlab):
    wait_healthy(vlab)
    code, report = validate(vlab)
    assert code == 0 and findings(report) == [], summary(report)
    assert len(report["hosts"]) == HOSTS and all(h["status"] == "ok" for h in report["hosts"])


def run_with(lab, fault, ready=None) -> dict:
    """One validation run with `fault` in place (`ready()`: the fault has
    reached its full effect, e.g. an optic past its alarm)."""
    wait_healthy(lab)
    fault.inject()
    try:
        deadline = time.monotonic() + 10
        while ready is not None and not ready():
            assert time.monotonic() < deadline, f"{fault.description}: not in effect in 10 s"
            time.sleep(0.05)
        code, report = validate(lab)
    finally:
        fault.clear()
    assert code == 8, summary(report)
    return report


def test_a_miswire_names_both_ports(vlab):
    host = vlab.hosts[1]
    report = run_with(vlab, Miswire(vlab, host.name, 0, 1))
    kinds = {f["kind"] for f in findings(report)}
    assert kinds == {"miswire"}, summary(report)
    text = json.dumps(findings(report))
    assert host.rail(0).port in text and host.rail(1).port in text


def test_a_dead_optic_is_named(vlab):
    host = vlab.hosts[2]
    # RX power far below the low alarm, as a dead optic's module reports it;
    # validated once the module is past its alarm (the ramp takes 0.5 s)
    fault = OpticDegradation(vlab, host.name, 1, end_dbm=-30.0, duration_s=0.5)
    report = run_with(vlab, fault, ready=lambda: fault.crossed_alarm_at is not None)
    first = findings(report)[0]
    assert first["kind"] == "optic" and host.rail(1).port in json.dumps(first), summary(report)


def test_a_blackholing_leaf_port_is_localised_to_that_host_port(vlab):
    host = vlab.hosts[0]
    report = run_with(vlab, LeafPortBlackhole(vlab, host.name, 0))
    first = findings(report)[0]
    assert first["kind"] == "blackhole", summary(report)
    assert host.name in first.get("hosts", []) and host.rail(0).port in json.dumps(first)


def test_a_one_percent_lossy_link_is_found_by_the_burst(vlab):
    host = vlab.hosts[3]
    report = run_with(vlab, RandomLoss(vlab, host.name, 1, percent=1))
    lossy = [f for f in findings(report) if f["kind"] == "lossy_link"]
    assert lossy and host.name in lossy[0].get("hosts", []), summary(report)
    assert report.get("loss_resolution", 1) <= 0.01
