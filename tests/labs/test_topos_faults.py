"""The lab fabric and its faults, against the real kernel (root, Mininet).

One dualrail lab (mechanism ``none``: static routes, nothing fails over) is
shared by the fault tests; each test checks one fault's observable effect
through an independent witness (ip -j link, sysfs counters, /proc/net/snmp,
nft counters, ARP), clears it, and the autouse fixture then proves the lab is
whole again. Every wait is bounded; nothing retries to hide a failure.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from labs.faults import (
    CablePull,
    Flap,
    HostPortLoss,
    Miswire,
    OneWayLoss,
    OpticDegradation,
    RandomLoss,
    SilentBlackhole,
)
from labs.faults.nft import TABLE
from labs.netnslib import wait_for_sync
from labs.simsensor import THRESHOLDS
from labs.topos.dualrail import dualrail
from labs.topos.lab import (
    Lab,
    LabLeakError,
    lab_named_netns,
    processes_in_netns,
    root_lab_interfaces,
)
from labs.topos.plan import HOST_SPACE, LAB_NAME_RE, FabricPlan, LabError, linkpassd_toml
from labs.topos.railopt import railopt, start_linkpassd
from labs.traffic.receiver import ReceiverConfig
from labs.traffic.sender import SenderConfig
from linkpassd.config import parse_config

pytestmark = pytest.mark.lab

H1, H2 = "lph1", "lph2"


def needs_root() -> None:
    if os.geteuid() != 0 or shutil.which("mnexec") is None:
        pytest.skip("needs root and mnexec (apt-get install mininet)")


wait_until = wait_for_sync


def ping_rail(lab: Lab, src: str, dst: str, rail: int, **kw):
    """Ping dst's rail address from src's rail address (source-bound)."""
    return lab.ping(src, lab.rail(dst, rail).address, src_addr=lab.rail(src, rail).address, **kw)


def icmp_counter(lab: Lab, node: str, field: str) -> int:
    """Icmp InEchos/InEchoReps of the node's own netns (/proc/net/snmp)."""
    lines = [line.split() for line in lab.run(node, ["cat", "/proc/net/snmp"]).stdout.splitlines()
             if line.startswith("Icmp:")]
    header, values = lines[0], lines[1]
    return int(values[header.index(field)])


# ---- pure: the plan and the linkpassd configs (no root needed) ----------------------


@pytest.mark.parametrize("shape", [(2, 2, 1), (4, 2, 2), (127, 4, 3), (8, 8, 4)])
def test_plan_names_addresses_and_macs_are_valid_and_unique(shape):
    plan = FabricPlan(*shape)
    fabric = ipaddress.ip_network("198.18.0.0/15")
    ports, addrs, macs = [], [], []
    for host in plan.hosts:
        for rail in host.rails:
            iface = ipaddress.ip_interface(rail.interface)
            assert iface.network.prefixlen == 31 and iface.ip in fabric
            assert ipaddress.ip_address(rail.gateway) in iface.network
            assert ipaddress.ip_address(rail.address) in ipaddress.ip_network(HOST_SPACE)
            ports += [rail.port, rail.leaf_port]
            addrs += [rail.address, rail.gateway]
            macs += [rail.mac, rail.leaf_mac]
    for up in plan.uplinks:
        ports += [up.leaf_port, up.spine_port]
        addrs += [up.leaf_address, up.spine_address]
        macs += [up.leaf_mac, up.spine_mac]
        assert ipaddress.ip_address(up.leaf_address) in fabric
    assert all(len(p) <= 15 and LAB_NAME_RE.match(p) for p in ports)
    assert len(set(ports)) == len(ports) and len(set(addrs)) == len(addrs)
    assert len(set(macs)) == len(macs)
    for name in plan.node_names:  # renders for every mechanism
        for mech in ("none", "kernel", "linkpassd"):
            plan.setup(name, mech)


@pytest.mark.parametrize("shape", [(2, 2, 1), (4, 2, 2), (3, 4, 1)])
def test_linkpassd_configs_parse_and_back_up_every_rail(shape):
    plan = FabricPlan(*shape)
    for host in plan.hosts:
        text = linkpassd_toml(host, control_socket=f"/tmp/lplab-x/{host.name}/linkpassd.sock",
                              run_dir=f"/tmp/lplab-x/{host.name}/run",
                              timers={"rise": 2, "hold_down_s": 1.0})
        config = parse_config(text, source=host.name)
        assert [r.port for r in config.rails] == [r.port for r in host.rails]
        for rail in config.rails:
            assert list(rail.backups) == [r.name for r in host.rails if r.name != rail.name]
            assert list(rail.destinations) == [HOST_SPACE]
        (group,) = config.multipath
        assert group.destination == HOST_SPACE and len(group.rails) == plan.n_rails


def test_faults_refuse_hosts_and_rails_that_do_not_exist():
    lab = dualrail()  # not started: targets are checked against the plan
    with pytest.raises(LabError, match="lph9.*hosts: lph1, lph2"):
        CablePull(lab, "lph9", 0)
    with pytest.raises(LabError, match="no rail 5"):
        SilentBlackhole(lab, H1, 5)
    with pytest.raises(LabError, match="no rail 7"):
        Miswire(lab, H1, 0, 7)
    with pytest.raises(LabError, match="two different rails"):
        Miswire(lab, H1, 1, 1)
    with pytest.raises(LabError, match="percent"):
        RandomLoss(lab, H1, 0, 150)
    with pytest.raises(LabError, match="direction"):
        OneWayLoss(lab, H1, 0, direction="sideways")
    with pytest.raises(LabError, match="times"):
        Flap(lab, H1, 0, times=0)
    with pytest.raises(LabError, match="mechanism"):
        dualrail("magic")


# ---- the shared lab -------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab():
    needs_root()
    lab = dualrail("none")
    lab.start()
    inodes = lab.netns_inodes
    try:
        yield lab
    finally:
        lab.close()  # raises LabLeakError on any leak
    assert not root_lab_interfaces() and not lab_named_netns()
    assert not processes_in_netns(inodes)


@pytest.fixture(autouse=True)
def whole_again(request):
    """After each fault test: every pair reaches every rail, no fault table."""
    yield
    if "lab" not in request.fixturenames:
        return
    lab = request.getfixturevalue("lab")
    rows = lab.reachability(wait_s=1.0)
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    for leaf in lab.leaves:
        assert not [t for t in lab.nft_tables(leaf) if t[1].startswith("lp_")]


@pytest.mark.timeout(30)
def test_every_host_pair_reaches_each_other_on_every_rail(lab):
    rows = lab.reachability(count=2, wait_s=1.0)
    assert len(rows) == 2 * 2 and all(r["ok"] for r in rows), rows
    # static host routing as the `none` mechanism promises
    rules = lab.run(H1, "ip rule").stdout
    assert "from 198.18.0.3 lookup 1000" in rules and "from 198.18.1.3 lookup 1001" in rules
    assert "198.18.0.0/15 via 198.18.0.2 dev lph1-eth0" in lab.run(H1, "ip route").stdout
    assert lab.run(H1, "sysctl -n net.ipv4.ip_forward").stdout.strip() == "0"
    assert lab.run("lpl0", "sysctl -n net.ipv4.conf.all.ignore_routes_with_linkdown").stdout.strip() == "1"


@pytest.mark.timeout(30)
def test_cable_pull_drops_carrier_on_the_host_and_clear_restores_it(lab):
    port = lab.rail(H1, 0).port
    fault = CablePull(lab, H1, 0)
    t0 = fault.inject()
    try:
        wait_until(lambda: not lab.carrier(H1, port), 2.0, "carrier loss on the host port")
        assert "NO-CARRIER" in lab.link(H1, port)["flags"]
        assert lab.carrier(H1, lab.rail(H1, 1).port)  # the other rail is untouched
        assert not ping_rail(lab, H2, H1, 0, count=2, interval_s=0.05, wait_s=0.3).received
    finally:
        t1 = fault.clear()
    assert t0 < t1 <= time.monotonic()
    assert fault.clear() == t1  # idempotent
    wait_until(lambda: lab.carrier(H1, port), 2.0, "carrier back")


@pytest.mark.timeout(30)
def test_silent_blackhole_keeps_carrier_and_drops_both_ways(lab):
    assert ping_rail(lab, H1, H2, 0).ok  # fresh neighbour entries
    fault = SilentBlackhole(lab, H1, 0)
    fault.inject()
    try:
        assert (("netdev", TABLE) in lab.nft_tables("lpl0"))
        assert lab.carrier(H1, lab.rail(H1, 0).port)
        assert ping_rail(lab, H2, H1, 0, count=3, interval_s=0.05, wait_s=0.3).received == 0
        assert ping_rail(lab, H1, H2, 0, count=3, interval_s=0.05, wait_s=0.3).received == 0
        assert ping_rail(lab, H1, H2, 1).ok  # rail 1 is fine
        counts = fault.counts()
        assert counts["host_to_leaf"]["dropped"] >= 3 and counts["leaf_to_host"]["dropped"] >= 3
    finally:
        fault.clear()
    assert fault.clear() == fault.cleared_at
    assert fault.counts()["host_to_leaf"]["dropped"] >= 3  # kept after clear
    assert ("netdev", TABLE) not in lab.nft_tables("lpl0")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("direction", ["host_to_leaf", "leaf_to_host"])
def test_one_way_loss_is_one_way(lab, direction):
    """Echo requests cross the good direction and are counted by the
    receiver's kernel; the replies die in the bad one."""
    assert ping_rail(lab, H1, H2, 0).ok and ping_rail(lab, H2, H1, 0).ok  # fresh ARP
    fault = OneWayLoss(lab, H1, 0, direction=direction)
    n = 5
    if direction == "host_to_leaf":
        pinger, target = H2, H1  # requests leaf->lph1 arrive, lph1's replies die
    else:
        pinger, target = H1, H2  # lph1's requests arrive at lph2, replies to lph1 die
    before = icmp_counter(lab, target, "InEchos")
    fault.inject()
    try:
        res = ping_rail(lab, pinger, target, 0, count=n, interval_s=0.05, wait_s=0.3)
        arrived = icmp_counter(lab, target, "InEchos") - before
        counts = fault.counts()[direction]
    finally:
        fault.clear()
    assert res.received == 0
    assert arrived == n
    assert counts["dropped"] >= n and counts["seen"] >= n


@pytest.mark.timeout(30)
def test_random_loss_drops_about_the_asked_share(lab):
    assert ping_rail(lab, H1, H2, 0).ok
    fault = RandomLoss(lab, H1, 0, percent=30)
    fault.inject()
    try:
        res = ping_rail(lab, H1, H2, 0, count=200, interval_s=0.005, wait_s=0.5)
        counts = fault.counts()
    finally:
        fault.clear()
    for direction, c in counts.items():
        assert c["seen"] >= 100, counts
        assert 0.15 <= c["dropped"] / c["seen"] <= 0.45, (direction, counts)
    # a round trip crosses the link twice: 1 - 0.7^2 = 51 % expected
    assert 0.30 <= res.loss <= 0.72, res


@pytest.mark.timeout(30)
def test_host_port_loss_host_to_leaf_loses_what_the_host_sends_without_telling_it(lab):
    """At the host's own port, host to leaf: the requests die on the way
    out (the peer's kernel counts fewer), yet ping was refused none of them
    (a drop in the host's egress hook is refused to the sender, which ping
    retries: it would see no loss at all, labs/faults/nft.py)."""
    assert ping_rail(lab, H1, H2, 0).ok and ping_rail(lab, H2, H1, 0).ok  # fresh ARP
    fault = HostPortLoss(lab, H1, 0, percent=30, directions=("host_to_leaf",))
    n = 200
    before = icmp_counter(lab, H2, "InEchos")
    fault.inject()
    try:
        res = ping_rail(lab, H1, H2, 0, count=n, interval_s=0.005, wait_s=0.5)
        arrived = icmp_counter(lab, H2, "InEchos") - before
        counts = fault.counts()["host_to_leaf"]
    finally:
        fault.clear()
    assert res.sent == n, res
    assert res.received == arrived, (res, arrived)  # the replies' direction is untouched
    assert 0.15 <= 1 - arrived / n <= 0.45, (arrived, counts)
    assert counts["dropped"] >= n - arrived and counts["seen"] >= n, counts


@pytest.mark.timeout(30)
def test_flap_counts_carrier_losses_and_ends_up(lab):
    port = lab.rail(H1, 1).port
    before = lab.carrier_down_count(H1, port)
    fault = Flap(lab, H1, 1, times=3, within_s=0.9)
    t0 = fault.inject()
    try:
        fault.wait()
    finally:
        fault.clear()
    assert lab.carrier_down_count(H1, port) - before == 3
    assert [kind for _, kind in fault.events] == ["down", "up"] * 3
    stamps = [t for t, _ in fault.events]
    assert stamps == sorted(stamps) and stamps[0] == t0
    assert 0.6 <= stamps[-1] - t0 <= 2.0  # last up at ~0.75 s
    assert fault.cleared_at == stamps[-1]
    wait_until(lambda: lab.carrier(H1, port), 2.0, "carrier back after flapping")


@pytest.mark.timeout(30)
def test_flap_cleared_early_stops_and_leaves_the_link_up(lab):
    port = lab.rail(H1, 1).port
    fault = Flap(lab, H1, 1, times=5, within_s=5.0)
    fault.inject()
    fault.clear()
    assert len(fault.events) < 10 and fault.events[-1][1] == "up"
    wait_until(lambda: lab.carrier(H1, port), 2.0, "carrier back after an early clear")


@pytest.mark.timeout(30)
def test_miswire_connects_each_port_to_the_other_leaf(lab):
    a, b = lab.rail(H1, 0), lab.rail(H1, 1)
    assert lab.who_has(H1, a.port, a.gateway) == a.leaf_mac
    assert lab.who_has(H1, a.port, b.gateway, timeout_s=0.3) is None
    fault = Miswire(lab, H1, 0, 1)
    fault.inject()
    try:
        seen = fault.verify()  # rail-0 port now answers with leaf 1's MAC and vice versa
        assert seen[a.port][b.gateway] == b.leaf_mac and seen[b.port][a.gateway] == a.leaf_mac
        assert lab.carrier(H1, a.port) and lab.carrier(H1, b.port)  # carrier says all is well
        assert ping_rail(lab, H2, H1, 0, count=2, interval_s=0.05, wait_s=0.3).received == 0
    finally:
        fault.clear()
    assert lab.who_has(H1, a.port, a.gateway) == a.leaf_mac
    assert lab.who_has(H1, b.port, b.gateway) == b.leaf_mac
    assert lab.link("lpl0", a.leaf_port)["address"] == a.leaf_mac


@pytest.mark.timeout(30)
def test_optic_degradation_ramps_rx_power_past_the_alarm(lab):
    port = lab.rail(H1, 0).port
    path = lab.sim_path(H1, port)
    healthy = json.loads(path.read_text())
    assert healthy["schema"] == "linkpass.simsensor/1" and healthy["port"] == port
    fault = OpticDegradation(lab, H1, 0, end_dbm=-14.0, duration_s=0.5, step_s=0.02)
    t0 = fault.inject()
    readings = []
    try:
        deadline = time.monotonic() + 3.0
        while fault._thread.is_alive() and time.monotonic() < deadline:
            readings.append(json.loads(path.read_text()))  # never half a file
        fault.wait()
        final = json.loads(path.read_text())
    finally:
        fault.clear()
    alarm = THRESHOLDS["rx_power_dbm"]["low_alarm"]
    assert all(x <= alarm for x in final["rx_power_dbm"])
    assert final["thresholds"]["rx_power_dbm"]["low_alarm"] == alarm
    assert fault.crossed_alarm_at is not None and fault.crossed_alarm_at > t0
    assert final["counters"]["fec_corrected"] > 0 and final["counters"]["fec_uncorrectable"] > 0
    powers = [r["rx_power_dbm"][0] for r in readings]
    assert powers == sorted(powers, reverse=True) and len(set(powers)) > 3
    assert [r["written_at"] for r in readings] == sorted(r["written_at"] for r in readings)
    after = json.loads(path.read_text())
    assert after["rx_power_dbm"] == healthy["rx_power_dbm"]
    assert after["counters"]["fec_corrected"] == final["counters"]["fec_corrected"]  # never reset
    assert after["sequence"] > final["sequence"]


# ---- other mechanisms, teardown ----------------------------------------------------------


@pytest.mark.timeout(60)
def test_kernel_mechanism_survives_a_cable_pull_through_the_fabric_detour():
    """Both directions of a rail-0 flow keep working when lph1's rail-0 cable
    is pulled: lph1 falls back to rail 1 by metric, and the fabric delivers
    replies for lph1's rail-0 address over its rail-1 port (the detour)."""
    needs_root()
    # urgent: no dependence on linkwatch's pacing of non-urgent carrier events
    with dualrail("kernel", carrier_events="urgent") as lab:
        assert all(r["ok"] for r in lab.reachability())
        with CablePull(lab, H1, 0):
            wait_until(lambda: not lab.carrier(H1, lab.rail(H1, 0).port), 2.0, "carrier loss")
            assert ping_rail(lab, H2, H1, 0, count=3, interval_s=0.05, wait_s=1.0).ok
            assert ping_rail(lab, H1, H2, 0, count=3, interval_s=0.05, wait_s=1.0).ok
        assert all(r["ok"] for r in lab.reachability())


@pytest.mark.timeout(90)
def test_linkpassd_mechanism_reaches_every_pair_with_the_generated_configs():
    needs_root()
    with railopt(3, 2, 2, "linkpassd") as lab:
        for host in lab.hosts:
            parse_config(lab.config_path(host).read_text())
            assert lab.run(host, "ip rule").stdout.count("lookup") == 3  # local, main, default
        for host in lab.hosts:
            start_linkpassd(lab, host.name)
        rows = lab.reachability(wait_s=1.0)
        assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]


@pytest.mark.timeout(120)
def test_a_blackhole_on_one_port_loses_nothing_between_the_other_hosts_of_its_leaf():
    """The fleet lab injects a silent blackhole on the victim's leaf port (nft
    chains, then an interface-group change) while every host probes every
    other: the injection must not touch the leaf's other ports. 1000 packets/s
    from lph2 to lph3 through rail 0's leaf lose nothing across the
    injection and the clear, while the same flow from the victim lph1 loses
    the fault's share (the control: the fault was in)."""
    needs_root()
    with railopt(3, 2, 2, "none") as lab:
        victim, a, b = (h.name for h in lab.hosts)
        flows = {"bystander": (a, b), "victim": (victim, b)}
        work = lab.host_dir(a)
        procs = []

        def launch(host: str, argv: list[str], log: str) -> None:
            with open(work / log, "wb") as out:
                procs.append(lab.popen(host, argv, stdout=out, stderr=subprocess.STDOUT))
        for k, (_src, dst) in enumerate(flows.values()):
            port = 4791 + k
            rx = ReceiverConfig(bind=lab.rail(dst, 0).address, port=port, duration=20).validated()
            launch(dst, rx.command(str(work / f"rx{k}.json")), f"rx{k}.log")
        for k in range(len(flows)):
            wait_until(lambda k=k: "ready" in (work / f"rx{k}.log").read_text(), 15.0,
                       f"receiver {k} ready")
        for k, (src, dst) in enumerate(flows.values()):
            tx = SenderConfig(mode="kernel-path", src=lab.rail(src, 0).address,
                              dst=lab.rail(dst, 0).address, port=4791 + k, rate=1000,
                              duration=5.0).validated()
            launch(src, tx.command(str(work / f"tx{k}.json")), f"tx{k}.log")
        for k in range(len(flows)):
            wait_until(lambda k=k: "sending t0=" in (work / f"tx{k}.log").read_text(), 15.0,
                       f"sender {k} sending")
        time.sleep(1.0)  # traffic flowing on both before the fault: the start is no event
        with SilentBlackhole(lab, victim, 0):
            time.sleep(1.5)
        for proc in procs:
            assert proc.wait(30) == 0, proc.args
        reports = {name: json.loads((work / f"rx{k}.json").read_text())
                   for k, name in enumerate(flows)}
        bystander, control = reports["bystander"], reports["victim"]
        assert bystander["sent"] > 4000 and bystander["lost"] == 0, bystander["top_gaps"]
        assert control["lost"] > 1000, control["top_gaps"]


@pytest.mark.timeout(60)
def test_teardown_detects_a_process_it_did_not_start(tmp_path):
    needs_root()
    pidfile = tmp_path / "pid"
    lab = dualrail()
    lab.start()
    inodes = lab.netns_inodes
    leaked_pid = None
    try:
        # started behind the lab's back, in its own session: Mininet's SIGHUP misses it
        lab.run(H1, ["setsid", "-f", "sh", "-c",
                     f"echo $$ > {pidfile}; exec sleep 30 </dev/null >/dev/null 2>&1"])
        leaked_pid = int(wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(),
                                    2.0, "pid file"))
        with pytest.raises(LabLeakError, match=f"pid {leaked_pid}"):
            lab.close()
    finally:
        if leaked_pid is not None:
            os.kill(leaked_pid, signal.SIGKILL)  # ours, by PID
        lab.close()
    wait_until(lambda: not processes_in_netns(inodes), 3.0, "the namespace to empty")
    assert not root_lab_interfaces() and not lab_named_netns()
    assert lab.workdir is not None and not Path(lab.workdir).exists()
