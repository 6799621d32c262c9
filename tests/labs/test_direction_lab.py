"""Which way a fault loses packets, named by linkpassd and by validation,
in the railopt lab (issue 31).

The lab of tests/labs/test_validate_lab.py (6 hosts x 2 rails, 3 leaves per
rail, 2 spines; linkpassd in every host probing its mesh peers, lldpd in
every switch, a lab aggregator). One fault at a time, injected with
nftables (labs/faults):

- one-way random loss at a leaf port (rules in the leaf) and at a host
  port (rules in the host), each way: the host's linkpassd names the
  direction in `linkpassctl explain` and in its echo_paths events (the
  responders' receipts), and `linkpassctl validate` gives one lossy_link
  finding naming the direction and the transmitter to check first. At the
  host port, host to leaf, the frames are diverted, not dropped: a drop in
  the host's own egress hook is refused to the sending socket (ENOBUFS),
  which a failing transmitter never does (labs/faults/nft.py HostPortLoss);
- a silent blackhole (both ways, LLDP too) and a leaf-to-host-only fault:
  exactly one finding each, with consistent evidence (no "LLDP as
  planned", no separate LLDP finding, no "checks that did not run").
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from validationlab import needs_lab, wait_healthy

from labs import validation
from labs.faults import HostPortLoss, OneWayLoss, RandomLoss, SilentBlackhole
from labs.validation import findings, summary

pytestmark = pytest.mark.lab

HOSTS, RAILS, SPINES, LEAVES_PER_RAIL = 6, 2, 2, 3
DURATION_S = 8.0
RUN_TIMEOUT_S = 120.0
PERCENT = 30  # one way: above the paths' 20 % DEGRADED threshold, below validation's fail_loss
NAMED_S = 60.0  # the path windows (200 probes at 50 ms) fill, the rail turns DEGRADED
RAIL_WORDS = {"host_to_leaf": "loss towards the peers, replies fine (our transmit direction)",
              "leaf_to_host": "replies lost on the way back, requests reach the peers "
                              "(our receive direction)"}
PATH_DIRECTION = {"host_to_leaf": "requests", "leaf_to_host": "replies"}
FINDING_WAY = {"host_to_leaf": "host to leaf", "leaf_to_host": "leaf to host"}
FIX = {"host_to_leaf": "check the transmitter on the host side first",
       "leaf_to_host": "check the transmitter on the leaf side first"}


@pytest.fixture(scope="module")
def dlab():
    needs_lab()
    with validation.validation_lab(HOSTS, RAILS, SPINES, leaves_per_rail=LEAVES_PER_RAIL) as lab:
        yield lab


def ctl(lab, host: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "linkpassd.ctl.main", "--socket",
                           lab.control_socket(host), "--timeout", "3", *args, "-o", "json"],
                          capture_output=True, text=True, timeout=15)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def wait_named(lab, host: str, port: str, words: str) -> dict:
    """`linkpassctl explain PORT` once its evidence says `words`."""
    deadline = time.monotonic() + NAMED_S
    while True:
        explained = ctl(lab, host, "explain", port)
        evidence = explained.get("state", {}).get("evidence", [])
        if any(words in line for line in evidence):
            return explained
        if time.monotonic() > deadline:
            pytest.fail(f"{host} {port}: not named {words!r} in {NAMED_S:g} s: {evidence}")
        time.sleep(1.0)


def echo_events(lab, host: str, port: str) -> list[dict]:
    events = ctl(lab, host, "events").get("events", [])
    return [e for e in events if e.get("name") == "echo_paths" and e.get("port") == port]


@pytest.mark.parametrize("where, direction", [("leaf", "host_to_leaf"), ("leaf", "leaf_to_host"),
                                              ("host", "host_to_leaf"), ("host", "leaf_to_host")])
def test_one_way_loss_at_a_port_is_named_by_linkpassd_and_by_validate(dlab, where, direction):
    host = dlab.hosts[1]
    port = host.rail(0).port
    kind = HostPortLoss if where == "host" else RandomLoss
    fault = kind(dlab, host.name, 0, PERCENT, directions=(direction,))
    wait_healthy(dlab)
    fault.inject()
    try:
        explained = wait_named(dlab, host.name, port, RAIL_WORDS[direction])
        events = echo_events(dlab, host.name, port)
        run = validation.validate(dlab, DURATION_S, RUN_TIMEOUT_S)
    finally:
        fault.clear()
    assert explained["state"]["verdict"] == "VERDICT_DEGRADED", explained
    assert any(e.get("fields", {}).get("direction") == PATH_DIRECTION[direction]
               and f"({PATH_DIRECTION[direction]})" in e.get("message", "") for e in events), \
        [(e.get("message"), e.get("fields", {}).get("detail")) for e in events]
    assert run.code == validation.EXIT_FINDINGS, summary(run.report)
    found_all = findings(run.report)
    assert len(found_all) == 1, summary(run.report)  # one fault, one finding
    (found,) = found_all
    assert found["kind"] == "lossy_link", summary(run.report)
    assert (found["hosts"], found["rail"]) == ([host.name], "rail0"), summary(run.report)
    assert found["component"].endswith(f"per round trip, {FINDING_WAY[direction]}"), found
    assert found["fix"].startswith(FIX[direction]), found
    assert any(line.startswith("per direction") for line in found["evidence"]), found


@pytest.mark.parametrize("make", [
    lambda lab, host: SilentBlackhole(lab, host, 0),
    lambda lab, host: OneWayLoss(lab, host, 0, direction="leaf_to_host")],
    ids=["silent-blackhole", "leaf-to-host-only"])
def test_a_fault_that_kills_the_leaf_to_host_direction_is_one_finding(dlab, make):
    host = dlab.hosts[4]
    fault = make(dlab, host.name)
    wait_healthy(dlab)
    fault.inject()
    try:
        run = validation.validate(dlab, DURATION_S, RUN_TIMEOUT_S)
    finally:
        fault.clear()
    assert run.code == validation.EXIT_FINDINGS, summary(run.report)
    (found,) = findings(run.report)
    assert found["kind"] == "blackhole", summary(run.report)
    assert (found["hosts"], found["rail"]) == ([host.name], "rail0"), summary(run.report)
    assert found["component"].endswith("drops all traffic, leaf to host at least"), found
    evidence = "\n".join(found["evidence"])
    assert "LLDP as planned" not in evidence and "no LLDP from" in evidence, evidence
    assert found["fix"].startswith(FIX["leaf_to_host"]), found
