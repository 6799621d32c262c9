"""LLDP in the railopt lab, the cabling plan it was built with, and the
faults fleet validation must find (issue 13), against the real kernel.

One railopt lab (2 hosts x 2 rails, 1 spine, mechanism ``none``) runs a real
lldpd in every node (switches and hosts) at a 1 s transmit interval. Each
test checks what it claims through an independent witness: lldpcli in the
host's namespace, a scapy decode of a frame on the wire, ping from the rail
addresses, nft counters, /proc. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import tomllib

import pytest

from labs.faults import (
    LeafPortBlackhole,
    Miswire,
    OpticDegradation,
    RandomLoss,
    SilentBlackhole,
    SpineLinkBlackhole,
)
from labs.faults.nft import TABLE
from labs.lldp import lldp_options, parse_neighbours
from labs.simsensor import THRESHOLDS
from labs.topos.cabling import (
    VETH_SPEED_MBPS,
    cabling_entries,
    expected_lldp,
    lldp_after_miswire,
    swapped_plan,
    write_cabling,
)
from labs.topos.lab import Lab, processes_in_netns, root_lab_interfaces
from labs.topos.plan import FabricPlan, LabError
from labs.topos.railopt import railopt

pytestmark = pytest.mark.lab

H1, H2 = "lph1", "lph2"
LLDP_SETTLE_S = 20.0  # TTL is 4 s at a 1 s interval; generous for a busy 2-core VM


def needs_lab_tools() -> None:
    if os.geteuid() != 0 or shutil.which("mnexec") is None or shutil.which("lldpd") is None:
        pytest.skip("needs root, mnexec and lldpd (scripts/bootstrap.sh)")


def host_view(lab: Lab) -> dict[tuple[str, str], tuple[str, str]]:
    """LLDP neighbours of every host port, read with lldpcli in each host."""
    return {(h.name, port): seen for h in lab.hosts
            for port, seen in lab.lldp_neighbours(h.name).items()}


def wait_view(lab: Lab, want: dict, view=host_view) -> float:
    """Until ``view(lab)`` (default: every host port's LLDP neighbour) is
    ``want`` (polled at 5 Hz: each read is a process per node); the last view
    in the failure. Returns the seconds it took."""
    started = time.monotonic()
    while (seen := view(lab)) != want:
        if time.monotonic() - started > LLDP_SETTLE_S:
            raise AssertionError(f"after {LLDP_SETTLE_S:g}s LLDP shows {seen}, want {want}")
        time.sleep(0.2)
    return time.monotonic() - started


def ping_rail(lab: Lab, src: str, dst: str, src_rail: int, dst_rail: int | None = None, **kw):
    dst_rail = src_rail if dst_rail is None else dst_rail
    return lab.ping(src, lab.rail(dst, dst_rail).address,
                    src_addr=lab.rail(src, src_rail).address, **kw)


def lldpd_pids(lab: Lab) -> list[int]:
    """Every lldpd process the lab started: each monitor (the PID popen
    returned) and the children it forked."""
    roots = {s.proc.pid for s in lab.lldp.speakers.values()}
    pids = set(roots)
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid in roots:
                pids.add(int(entry.name))
    return sorted(pids)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ---- pure: options, parsing, the cabling file (no root) ------------------------------


def test_lldp_options_are_checked():
    assert lldp_options(False) is None and lldp_options(None) is None
    assert lldp_options(True) == {"hosts": False, "tx_interval_s": 1, "tx_hold": 4}
    assert lldp_options({"hosts": True})["hosts"] is True
    with pytest.raises(LabError, match="unknown lldp option.*colour"):
        lldp_options({"colour": "red"})
    with pytest.raises(LabError, match="tx_interval_s must be an integer"):
        lldp_options({"tx_interval_s": 0})
    with pytest.raises(LabError, match="lldp must be a bool or a dict"):
        lldp_options("yes")


def test_parse_neighbours_reads_lldpcli_json0_and_refuses_other_shapes():
    doc = {"lldp": [{"interface": [
        {"name": "lph1-eth0", "age": "0 day, 00:00:07",
         "chassis": [{"name": [{"value": "lpl0"}]}],
         "port": [{"id": [{"type": "ifname", "value": "lpl0-eth0"}]}]},
        {"name": "lph1-eth0", "age": "0 day, 00:01:02",
         "chassis": [{"name": [{"value": "lpl1"}]}],
         "port": [{"id": [{"type": "ifname", "value": "lpl1-eth0"}]}]}]}]}
    assert parse_neighbours(doc) == {"lph1-eth0": [("lpl0", "lpl0-eth0", 7.0),
                                                   ("lpl1", "lpl1-eth0", 62.0)]}
    assert parse_neighbours({"lldp": [{}]}) == {}
    with pytest.raises(LabError, match="unexpected lldpcli json0"):
        parse_neighbours({"lldp": [{"interface": [{"name": "x", "chassis": {}}]}]})


def test_cabling_file_is_the_lab_plan_and_a_swap_changes_exactly_two_entries(tmp_path):
    plan = FabricPlan(3, 2, 1)
    path = write_cabling(plan, tmp_path / "cabling.toml")
    ports = tomllib.loads(path.read_text())["port"]
    assert len(ports) == 6
    assert ports[0] == {"host": "lph1", "port": "lph1-eth0", "switch": "lpl0",
                        "switch_port": "lpl0-eth0", "rail": "rail0", "speed_mbps": 10000}
    assert ports[5] == {"host": "lph3", "port": "lph3-eth1", "switch": "lpl1",
                        "switch_port": "lpl1-eth2", "rail": "rail1", "speed_mbps": 10000}
    entries = cabling_entries(plan)
    wrong = swapped_plan(entries, "lph2", "lph2-eth0", "lph2-eth1")
    changed = [(a, b) for a, b in zip(entries, wrong) if a != b]
    assert [(b.port, b.switch, b.switch_port, b.rail) for _, b in changed] == [
        ("lph2-eth0", "lpl1", "lpl1-eth1", "rail1"), ("lph2-eth1", "lpl0", "lpl0-eth1", "rail0")]
    with pytest.raises(LabError, match="no entry for"):
        swapped_plan(entries, "lph9", "lph9-eth0", "lph9-eth1")
    # a miswire as LLDP sees it is the swapped plan, read back to front
    assert lldp_after_miswire(plan, "lph2", 0, 1) == expected_lldp(wrong)


# ---- the lab --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab():
    needs_lab_tools()
    lab = railopt(2, 2, 1, "none", lldp={"hosts": True})
    lab.start()
    try:
        yield lab
    finally:
        lab.close()  # raises LabLeakError on any leak


@pytest.mark.timeout(60)
def test_every_host_port_sees_its_planned_leaf_port_in_lldpd_and_on_the_wire(lab):
    want = expected_lldp(cabling_entries(lab.plan))
    wait_view(lab, want)
    # the switches see the hosts and each other by the same names (the
    # build waits for that; the wait here only bounds a regression)
    took = wait_view(lab, {"lpl0-eth0": (H1, "lph1-eth0"), "lpl0-eth1": (H2, "lph2-eth0"),
                           "lpl0-eth2": ("lps0", "lps0-eth0")},
                     view=lambda lab: lab.lldp_neighbours("lpl0"))
    assert took < LLDP_SETTLE_S
    # one frame decoded by scapy on the wire, as a host without lldpd reads it
    assert lab.sniff_lldp(H1, "lph1-eth1", timeout_s=10.0) == ("lpl1", "lpl1-eth0")
    # the speed the cabling file states is what a lab veth reports
    speed = lab.run(H1, ["ethtool", "lph1-eth0"]).stdout
    assert re.search(rf"Speed: {VETH_SPEED_MBPS}Mb/s", speed), speed


@pytest.mark.timeout(30)
def test_lldpd_runs_only_in_lab_namespaces_on_lab_ports(lab):
    root_ns = os.stat("/proc/self/ns/net").st_ino
    nodes = lab.netns_inodes
    pids = lldpd_pids(lab)
    assert len(pids) >= 2 * len(lab.plan.node_names)  # a monitor and a worker per node
    for pid in pids:
        ino = os.stat(f"/proc/{pid}/ns/net").st_ino
        assert ino != root_ns and ino in nodes, (pid, ino)
    for node, speaker in lab.lldp.speakers.items():
        assert nodes[os.stat(f"/proc/{speaker.proc.pid}/ns/net").st_ino] == node
        doc = json.loads(lab.lldp.cli(node, "show", "interfaces").stdout)
        names = {i["name"] for i in doc["lldp"][0]["interface"]}
        assert names == set(speaker.ports), (node, names)


@pytest.mark.timeout(90)
def test_miswire_shows_as_the_swap_in_lldp_and_clears(lab):
    want = expected_lldp(cabling_entries(lab.plan))
    wait_view(lab, want)
    fault = Miswire(lab, H1, 0, 1)
    fault.inject()
    try:
        wait_view(lab, lldp_after_miswire(lab.plan, H1, 0, 1))
        assert lab.sniff_lldp(H1, "lph1-eth0", timeout_s=10.0) == ("lpl1", "lpl1-eth0")
    finally:
        fault.clear()
    wait_view(lab, want)


@pytest.mark.timeout(60)
def test_leaf_port_blackhole_drops_that_port_only_lets_lldp_through_and_clears(lab):
    assert ping_rail(lab, H1, H2, 0).ok  # fresh neighbour entries
    fault = LeafPortBlackhole(lab, H1, 0)
    fault.inject()
    try:
        assert not ping_rail(lab, H1, H2, 0, count=3, interval_s=0.1, wait_s=0.5).received
        assert not ping_rail(lab, H2, H1, 0, count=3, interval_s=0.1, wait_s=0.5).received
        assert ping_rail(lab, H1, H2, 1).ok and ping_rail(lab, H2, H1, 1).ok  # other rail
        counts = fault.counts()
        assert counts["host_to_leaf"]["dropped"] >= 3 and counts["leaf_to_host"]["dropped"] >= 3
        assert lab.sniff_lldp(H1, "lph1-eth0", timeout_s=10.0) == ("lpl0", "lpl0-eth0")
    finally:
        fault.clear()
    assert TABLE not in [name for _, name in lab.nft_tables("lpl0")]
    assert ping_rail(lab, H1, H2, 0, count=3, interval_s=0.1).ok


@pytest.mark.timeout(60)
def test_silent_blackhole_drops_lldp_too(lab):
    """The contrast that makes LeafPortBlackhole a separate finding."""
    fault = SilentBlackhole(lab, H1, 0)
    fault.inject()
    try:
        assert lab.sniff_lldp(H1, "lph1-eth0", timeout_s=3.0) is None
    finally:
        fault.clear()
    assert lab.sniff_lldp(H1, "lph1-eth0", timeout_s=10.0) == ("lpl0", "lpl0-eth0")


@pytest.mark.timeout(60)
def test_spine_link_blackhole_drops_what_crosses_that_link_and_clears(lab):
    assert ping_rail(lab, H1, H2, 0, 1).ok  # rail 0 -> rail 1 crosses lpl0 <-> lps0
    fault = SpineLinkBlackhole(lab, "lpl0", 0)
    assert fault.description == "spine-link-blackhole on lpl0 lpl0-eth2 <-> lps0 lps0-eth0"
    fault.inject()
    try:
        assert not ping_rail(lab, H1, H2, 0, 1, count=3, interval_s=0.1, wait_s=0.5).received
        assert not ping_rail(lab, H2, H1, 1, 0, count=3, interval_s=0.1, wait_s=0.5).received
        assert ping_rail(lab, H1, H2, 0).ok and ping_rail(lab, H1, H2, 1).ok  # same-rail: no spine
        counts = fault.counts()  # ingress = spine -> leaf, egress = leaf -> spine
        assert counts["leaf_to_host"]["dropped"] >= 3 and counts["host_to_leaf"]["dropped"] >= 3
    finally:
        fault.clear()
    assert TABLE not in [name for _, name in lab.nft_tables("lpl0")]
    assert ping_rail(lab, H1, H2, 0, 1, count=3, interval_s=0.1).ok
    with pytest.raises(LabError, match="no link 'lpl0' <-> 'lps7'"):
        SpineLinkBlackhole(lab, 0, 7)


@pytest.mark.timeout(60)
def test_random_loss_of_one_percent_loses_a_few_pings_and_clears(lab):
    fault = RandomLoss(lab, H1, 0, percent=1)
    fault.inject()
    try:
        res = ping_rail(lab, H1, H2, 0, count=1000, interval_s=0.002, wait_s=1.0)
        counts = fault.counts()
    finally:
        fault.clear()
    # ~2 % expected (1 % each way); P(no loss in 1000) ~ e^-20
    assert 0 < res.sent - res.received < 80, res
    assert counts["host_to_leaf"]["dropped"] + counts["leaf_to_host"]["dropped"] > 0
    assert ping_rail(lab, H1, H2, 0, count=20, interval_s=0.01).ok


@pytest.mark.timeout(30)
def test_dead_optic_sim_passes_the_low_alarm_and_clears(lab):
    fault = OpticDegradation(lab, H1, 1, duration_s=0.5, step_s=0.05)
    fault.inject()
    try:
        fault.wait()
        doc = json.loads(lab.sim_path(H1, "lph1-eth1").read_text())
        assert max(doc["rx_power_dbm"]) < THRESHOLDS["rx_power_dbm"]["low_alarm"]
    finally:
        fault.clear()
    doc = json.loads(lab.sim_path(H1, "lph1-eth1").read_text())
    assert min(doc["rx_power_dbm"]) > THRESHOLDS["rx_power_dbm"]["low_warning"]


@pytest.mark.timeout(60)
def test_teardown_stops_every_lldpd_and_leaves_nothing_in_the_root_namespace():
    needs_lab_tools()
    lab = railopt(2, 2, 1, "none", lldp=True)  # switches only
    lab.start()
    try:
        assert set(lab.lldp.speakers) == {"lpl0", "lpl1", "lps0"}
        with pytest.raises(LabError, match="no lldpd in 'lph1'"):
            lab.lldp_neighbours(H1)
        pids = lldpd_pids(lab)
        inodes = lab.netns_inodes
        assert len(pids) >= 6 and all(alive(pid) for pid in pids)
    finally:
        lab.close()
    assert not [pid for pid in pids if alive(pid)]
    assert not processes_in_netns(inodes)
    assert not root_lab_interfaces()
    assert not lab.workdir.exists()  # sockets, PID files, logs: all in the lab's own workdir
