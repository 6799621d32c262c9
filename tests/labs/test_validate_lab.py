"""Fleet validation in the railopt lab: each fault found and localised in one
run, and a healthy lab gives no finding.

railopt with 6 hosts x 2 rails, 3 leaves per rail (2 hosts under each) and 2
spines: the rail-optimised shape where same-rail traffic between leaves
crosses a spine, the leaves and spines hashing ECMP on the 5-tuple. lldpd in
every switch (labs/lldp.py), linkpassd on every host reporting to a lab
aggregator, and the cabling plan the lab was built with
(labs/topos/cabling.py). The probe plan then has every pair under a leaf
and two pairs per leaf pair across the spines, each pair's probes spread
over 8 UDP source ports (flows).

Each test injects one fault, runs `linkpassctl validate` as an operator
would (through the aggregator, on every host at once), reads its JSON
report and exit code, and clears the fault. Each starts from a verified
healthy state: every host connected with every port UP, no fault table
left in any switch, and every host pair answering a ping on every rail.
"""

from __future__ import annotations

import json
import time

import pytest
from validationlab import needs_lab, wait_healthy

from labs import validation
from labs.faults import Miswire, RandomLoss
from labs.faults.blackhole import LeafPortBlackhole, SpineLinkBlackhole
from labs.faults.optics import OpticDegradation
from labs.validation import findings, summary

pytestmark = pytest.mark.lab

HOSTS, RAILS, SPINES, LEAVES_PER_RAIL = 6, 2, 2, 3
DURATION_S = 8.0  # each host's window (LLDP from lldpd every second, probes, counters)
RUN_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def vlab():
    needs_lab()
    with validation.validation_lab(HOSTS, RAILS, SPINES, leaves_per_rail=LEAVES_PER_RAIL) as lab:
        yield lab


def validate(lab) -> tuple[int, dict]:
    run = validation.validate(lab, DURATION_S, RUN_TIMEOUT_S)
    return run.code, run.report


def test_a_healthy_lab_gives_no_finding(vlab):
    wait_healthy(vlab)
    code, report = validate(vlab)
    assert code == 0 and findings(report) == [], summary(report)
    assert len(report["hosts"]) == HOSTS and all(h["status"] == "ok" for h in report["hosts"])
    # every pair under a leaf, two per leaf pair across the spines, each over 8 flows
    pairs = [p for h in report["hosts"] for p in h["validation"].get("pairs", [])]
    assert len(pairs) == RAILS * (3 * 1 + 3 * 2), len(pairs)
    assert all(p["flows"] == 8 and "flows_silent" not in p for p in pairs)


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
    (found,) = findings(report)  # the sim module only: traffic is fine, nothing else to find
    assert found["kind"] == "optic" and host.rail(1).port in json.dumps(found), summary(report)


def test_a_blackholing_leaf_port_is_localised_to_that_host_port(vlab):
    host = vlab.hosts[0]
    report = run_with(vlab, LeafPortBlackhole(vlab, host.name, 0))
    assert [f["kind"] for f in findings(report)] == ["blackhole"], summary(report)
    (found,) = findings(report)
    assert found["hosts"] == [host.name] and found["rail"] == "rail0"
    assert f"{host.name}:{host.rail(0).port}" in found["ports"] and \
        f"{host.rail(0).leaf}:{host.rail(0).leaf_port}" in found["ports"], found


def test_a_one_percent_lossy_link_is_found_by_the_burst(vlab):
    host = vlab.hosts[3]
    report = run_with(vlab, RandomLoss(vlab, host.name, 1, percent=1))
    assert [f["kind"] for f in findings(report)] == ["lossy_link"], summary(report)
    (found,) = findings(report)
    assert found["hosts"] == [host.name] and found["rail"] == "rail1", summary(report)
    assert f"{host.name}:{host.rail(1).port}" in found["ports"]
    assert report.get("loss_resolution", 1) <= 0.01


def test_a_blackholing_spine_link_is_localised_to_that_leaf_s_spine_links(vlab):
    # lpl0 (rail 0, lph1 and lph2) <-> lps0: with 5-tuple ECMP only the flows
    # hashed onto that link die, both ways; the other leaf pairs never touch it
    leaf = vlab.plan.leaves_of_rail(0)[0]
    report = run_with(vlab, SpineLinkBlackhole(vlab, leaf, 0))
    assert {f["kind"] for f in findings(report)} == {"spine_path"}, summary(report)
    (found,) = findings(report)
    assert found["component"] == f"{leaf} (rail0): one of its spine links", summary(report)
    assert found["ports"] == [leaf] and found["rail"] == "rail0"
    under = [h.name for h in vlab.hosts if h.rail(0).leaf == leaf]
    assert found["hosts"] == under
    evidence = "\n".join(found["evidence"])
    assert "flows (UDP source ports)" in evidence and "ECMP hashes each flow onto one spine" in evidence, evidence
    assert "to 2 other leaves fail" in evidence
