"""The traffic tools between two namespaces: clean runs, a link flap, and a route change.

Everything here is named ``lp-tr<pid>…`` / ``lptr<pid>…``, uses 198.18.0.0/15,
is deleted by name in ``finally``, and every process is stopped by PID with a
timeout. Faults are timed against the sender's own t0 (it prints it), on the
CLOCK_MONOTONIC that all namespaces share with the reports.
"""

from __future__ import annotations

import json
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from labs.traffic import nsrun
from labs.traffic.nsrun import Run

pytestmark = pytest.mark.lab

PID = os.getpid()
NS_A, NS_B = f"lp-tr{PID}a", f"lp-tr{PID}b"
CMD_TIMEOUT = 10


@pytest.fixture(autouse=True)
def _root_only():
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces")


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=CMD_TIMEOUT)


def mac(ns: str, dev: str) -> str:
    out = subprocess.run(
        ["ip", "-j", "-n", ns, "link", "show", dev],
        check=True,
        capture_output=True,
        text=True,
        timeout=CMD_TIMEOUT,
    ).stdout
    return json.loads(out)[0]["address"]


@contextmanager
def namespaces(*links: tuple[str, str, str, str]):
    """NS_A and NS_B joined by veth pairs ``(dev_a, addr_a/len, dev_b, addr_b/len)``."""
    made: list[str] = []
    try:
        for ns in (NS_A, NS_B):
            ip("netns", "add", ns)
            made.append(ns)
            ip("-n", ns, "link", "set", "lo", "up")
        # Strict reverse-path filtering would drop a kernel-path flow whose
        # source belongs to the other rail; these namespaces model hosts that route.
        for ns in (NS_A, NS_B):
            subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "sysctl",
                    "-qw",
                    "net.ipv4.conf.all.rp_filter=0",
                    "net.ipv4.conf.default.rp_filter=0",
                ],
                check=True,
                timeout=CMD_TIMEOUT,
            )
        for dev_a, addr_a, dev_b, addr_b in links:
            assert len(dev_a) <= 15 and len(dev_b) <= 15 and dev_a.startswith("lp")
            ip(
                "link",
                "add",
                dev_a,
                "netns",
                NS_A,
                "type",
                "veth",
                "peer",
                "name",
                dev_b,
                "netns",
                NS_B,
            )
            ip("-n", NS_A, "addr", "add", addr_a, "dev", dev_a)
            ip("-n", NS_B, "addr", "add", addr_b, "dev", dev_b)
            ip("-n", NS_A, "link", "set", dev_a, "up")
            ip("-n", NS_B, "link", "set", dev_b, "up")
            # A static neighbour on the sender's side survives carrier loss, so
            # ARP re-resolution (1 s retransmit after a flap) does not add to
            # the blackout being measured.
            ip(
                "-n",
                NS_A,
                "neigh",
                "replace",
                addr_b.split("/")[0],
                "lladdr",
                mac(NS_B, dev_b),
                "dev",
                dev_a,
                "nud",
                "permanent",
            )
        yield
    finally:
        for ns in reversed(made):  # deleting a namespace deletes its veth ends
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=CMD_TIMEOUT)


def run_traffic(tmp_path: Path, **kwargs) -> Run:
    """Receiver in NS_B, sender in NS_A (see labs.traffic.nsrun)."""
    return nsrun.run_traffic(tmp_path, rx_ns=NS_B, tx_ns=NS_A, **kwargs)


# ---------------------------------------------------------------- one link

A1, B1 = "198.18.10.1", "198.18.10.2"
DEV_A, DEV_B = f"lptr{PID}a", f"lptr{PID}b"


@pytest.fixture
def one_link():
    with namespaces((DEV_A, f"{A1}/24", DEV_B, f"{B1}/24")):
        yield


@pytest.mark.parametrize("mode", ["kernel-path", "qp-pinned"])
def test_clean_run_has_no_loss_and_no_blackout(one_link, tmp_path, mode):
    r = run_traffic(
        tmp_path, mode=mode, dst=B1, src=A1 if mode == "kernel-path" else None, rate=500, duration=2
    )
    rx, tx = r.rx, r.tx
    assert tx["attempted"] == tx["sent"] == 1000 and tx["send_errors"] == {}
    assert (
        rx["sender"]["sent"] == 1000 and rx["sent_source"] == "sender"
    )  # the closing packet arrived
    assert (rx["received"], rx["lost"], rx["duplicates"], rx["reordered"]) == (1000, 0, 0, 0)
    assert rx["invalid"]["total"] == 0  # every ICRC right, kernel-built headers included
    assert rx["blackout"]["gap_s"] < 0.1, rx["blackout"]
    assert list(rx["sources"]) == [A1]
    if mode == "qp-pinned":
        qp = tx["qp_pinned"]
        assert qp["reconnects"] == [] and qp["path"]["ifname"] == DEV_A and qp["path"]["src"] == A1
        assert qp["acks_received"] >= 990 and qp["ack_invalid"] == {}
        assert rx["acks_sent"] == 1000
    else:
        assert rx["acks_sent"] == 0


FLAP_AT, FLAP_S = 0.8, 0.5


def flap_far_end():
    """Admin-down the receiver's end: the sender's end loses carrier (LAB.md's fault)."""
    return [
        (FLAP_AT, "down", lambda: ip("-n", NS_B, "link", "set", DEV_B, "down")),
        (FLAP_AT + FLAP_S, "up_cmd", lambda: None),
        (FLAP_AT + FLAP_S, "up", lambda: ip("-n", NS_B, "link", "set", DEV_B, "up")),
    ]


def test_link_down_blackout_is_as_long_as_the_fault_for_kernel_path(one_link, tmp_path):
    r = run_traffic(
        tmp_path, mode="kernel-path", dst=B1, src=A1, rate=1000, duration=2.5, faults=flap_far_end()
    )
    b = r.rx["blackout"]
    down, up = r.marks["down"], r.marks["up_cmd"]
    assert 0.6 * FLAP_S <= b["gap_s"] <= FLAP_S + 0.5, b
    assert b["start_t"] <= down + 0.01 and b["end_t"] >= up - 0.01, (b, r.marks)
    assert b["edge"] is None
    assert r.rx["lost"] > 0.5 * FLAP_S * 1000
    assert r.rx["invalid"]["total"] == 0


def test_link_down_makes_a_qp_pinned_flow_reconnect(one_link, tmp_path):
    r = run_traffic(
        tmp_path, mode="qp-pinned", dst=B1, src=None, rate=1000, duration=2.5, faults=flap_far_end()
    )
    qp = r.tx["qp_pinned"]
    assert qp["reconnects"], qp
    first = qp["reconnects"][0]
    down = r.marks["down"]
    assert first["reason"] == "ack-timeout"
    # Detection is the retry budget (3 x 50 ms) after the last ACK, never before the fault.
    assert down - 0.05 <= first["t_detect"] <= r.marks["up"] + 1.0, (first, r.marks)
    assert (
        first["old"]["ifname"] == DEV_A and first["new"]["ifname"] == DEV_A
    )  # one link: nowhere else to go
    b = r.rx["blackout"]
    assert b["gap_s"] >= 0.6 * FLAP_S and b["start_t"] <= down + 0.01 and b["edge"] is None
    assert r.rx["invalid"]["total"] == 0


# ---------------------------------------------------------------- two rails

R0A, R0B, R1A, R1B, SERVICE = (
    "198.18.20.1",
    "198.18.20.2",
    "198.18.21.1",
    "198.18.21.2",
    "198.18.22.2",
)
RAIL0_A, RAIL0_B, RAIL1_A, RAIL1_B = (f"lptr{PID}{s}" for s in ("r0a", "r0b", "r1a", "r1b"))
MOVE_AT, KILL_AT = 0.7, 1.4


@pytest.fixture
def two_rails():
    with namespaces(
        (RAIL0_A, f"{R0A}/24", RAIL0_B, f"{R0B}/24"), (RAIL1_A, f"{R1A}/24", RAIL1_B, f"{R1B}/24")
    ):
        ip("-n", NS_B, "addr", "add", f"{SERVICE}/32", "dev", "lo")
        ip("-n", NS_A, "route", "add", f"{SERVICE}/32", "via", R0B)
        yield


def route_change_then_rail_death():
    return [
        (MOVE_AT, "moved", lambda: ip("-n", NS_A, "route", "replace", f"{SERVICE}/32", "via", R1B)),
        (KILL_AT, "killed", lambda: ip("-n", NS_B, "link", "set", RAIL0_B, "down")),
    ]


def test_route_change_moves_a_kernel_path_flow_at_once(two_rails, tmp_path):
    r = run_traffic(
        tmp_path,
        mode="kernel-path",
        dst=SERVICE,
        src=R0A,
        rate=1000,
        duration=2.5,
        faults=route_change_then_rail_death(),
    )
    # It was already on rail 1 when rail 0 died: nothing lost, no blackout.
    assert r.rx["lost"] == 0 and r.rx["blackout"]["gap_s"] < 0.1, r.rx["blackout"]
    assert list(r.rx["sources"]) == [R0A]  # the bound source travels with it


def test_route_change_does_not_move_a_qp_pinned_flow_until_it_reconnects(two_rails, tmp_path):
    r = run_traffic(
        tmp_path,
        mode="qp-pinned",
        dst=SERVICE,
        src=None,
        rate=1000,
        duration=2.5,
        faults=route_change_then_rail_death(),
    )
    moved, killed = r.marks["moved"], r.marks["killed"]
    sources = r.rx["sources"]
    # Still on rail 0 (its connect-time path) long after the route moved...
    assert sources[R0A]["last_t"] > moved + 0.5 * (killed - moved), (sources, r.marks)
    # ...and on rail 1, with rail 1's source address, only after rail 0 died and it reconnected.
    assert sources[R1A]["first_t"] > killed, (sources, r.marks)
    recon = r.tx["qp_pinned"]["reconnects"]
    assert recon and recon[0]["t_detect"] > killed and recon[0]["moved"]
    assert (recon[0]["old"]["ifname"], recon[0]["new"]["ifname"]) == (RAIL0_A, RAIL1_A)
    assert (recon[0]["old"]["src"], recon[0]["new"]["src"]) == (R0A, R1A)
    # The blackout is the retry budget plus reconnecting: 0.15 s, not NCCL's seconds.
    b = r.rx["blackout"]
    assert 0.1 <= b["gap_s"] < 0.6 and b["start_t"] <= killed + 0.01, (b, r.marks)
