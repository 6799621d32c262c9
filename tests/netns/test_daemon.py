"""The real linkpassd process against the real kernel, in namespaces.

The kernel's state is read with `ip -j` (an independent witness), the daemon's
with `linkpassctl -o json`.
"""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from labs.daemonproc import DaemonProcess, rail_config_toml
from labs.netnslib import wait_for_sync

pytestmark = pytest.mark.netns

NH0, NH1, GROUP = 1_000_100, 1_000_101, 1_000_102
RAIL0_TABLE, RAIL1_TABLE, FABRIC_TABLE = 10100, 10101, 10102
PROTO = 201


@pytest.fixture
def daemon(lab, tmp_path):
    """Factory: start linkpassd in the lab's host namespace; stopped at teardown."""
    started: list[DaemonProcess] = []

    def start(hold_down_s: float = 1.0, rise: int = 2) -> DaemonProcess:
        cfg = tmp_path / "linkpassd.toml"
        sock = str(tmp_path / "ctl.sock")
        cfg.write_text(rail_config_toml(sock, str(tmp_path), lab.rails, rise=rise,
                                        hold_down_s=hold_down_s, tick_interval_s=0.1))
        proc = DaemonProcess(lab.host.name, cfg, sock, tmp_path / f"linkpassd{len(started)}.log")
        started.append(proc.start())
        return proc

    yield start
    for proc in started:
        proc.stop()


def route_nhid(lab, table: int, dst: str = "default"):
    for route in lab.host.ipj("route", "show", "table", str(table)):
        if route["dst"] == dst:
            return route.get("nhid")
    return None


def group_members(lab) -> list[int]:
    out = lab.host.ipj("nexthop", "show", "id", str(GROUP)) if _has_nexthop(lab, GROUP) else []
    return sorted(m["id"] for m in out[0]["group"]) if out else []


def _has_nexthop(lab, nh_id: int) -> bool:
    return any(nh["id"] == nh_id for nh in lab.host.ipj("nexthop", "show"))


def rail(status: dict, name: str) -> dict:
    return next(r for r in status["rails"] if r["name"] == name)


def test_carrier_loss_moves_rail_table_and_group_then_fails_back_after_hold_down(lab, daemon):
    proc = daemon(hold_down_s=2.0)
    st = proc.wait_ready()
    assert rail(st, "rail0")["active_rail"] == "rail0"
    assert route_nhid(lab, RAIL0_TABLE) == NH0 and route_nhid(lab, RAIL1_TABLE) == NH1
    assert group_members(lab) == [NH0, NH1]
    assert route_nhid(lab, FABRIC_TABLE, "198.18.128.0/17") == GROUP

    lab.cut(lab.rails[0])
    wait_for_sync(lambda: route_nhid(lab, RAIL0_TABLE) == NH1, 3.0, "rail0 table on rail1")
    assert group_members(lab) == [NH1]
    st = proc.status()
    assert rail(st, "rail0")["active_rail"] == "rail1"
    port0 = next(p for p in st["ports"] if p["port"] == lab.rails[0].port)
    assert port0["verdict"] == "VERDICT_DOWN" and "no carrier" in " ".join(port0["evidence"])

    lab.restore(lab.rails[0])
    wait_for_sync(lambda: lab.host.has_carrier(lab.rails[0].port), 3.0, "carrier back")
    returned = time.monotonic()
    # The nexthop is re-created at once (make-before-break), traffic stays on
    # the backup through the hold-down.
    wait_for_sync(lambda: _has_nexthop(lab, NH0), 1.5, "rail0 nexthop re-created")
    time.sleep(max(0.0, returned + 1.0 - time.monotonic()))
    assert route_nhid(lab, RAIL0_TABLE) == NH1, "failed back before the hold-down"
    wait_for_sync(lambda: route_nhid(lab, RAIL0_TABLE) == NH0, 5.0, "fail-back to rail0")
    assert time.monotonic() - returned >= 2.0
    assert group_members(lab) == [NH0, NH1]
    assert proc.status()["last_error"] == ""


FOREIGN_SETUP = [
    # a nexthop and group outside our id range, and one inside it with another protocol
    ("nexthop", "add", "id", "7", "via", "198.18.1.1", "dev", "lprail1", "proto", "static"),
    ("nexthop", "add", "id", "8", "group", "7", "proto", "static"),
    ("nexthop", "add", "id", "1000150", "via", "198.18.1.1", "dev", "lprail1", "proto", "static"),
    # routes: main table; our table range with another protocol
    ("route", "add", "198.18.200.0/24", "via", "198.18.1.1", "dev", "lprail1"),
    ("route", "add", "198.18.201.0/24", "nhid", "8", "table", "10100", "proto", "static"),
    # rules: outside our priority range, and inside it with another protocol
    ("rule", "add", "prio", "500", "to", "198.18.202.0/24", "lookup", "300"),
    ("rule", "add", "prio", "10150", "from", "198.18.9.9", "lookup", "301", "proto", "static"),
]


def foreign_state(lab) -> dict:
    """Every routing object not tagged with our protocol, as the kernel lists it."""
    def strip(objs):
        return sorted((o for o in objs if o.get("protocol") != str(PROTO)
                       and o.get("protocol") != PROTO), key=repr)
    # IPv4: linkpassd writes only IPv4, and IPv6 link-local routes come and go
    # with address DAD whatever anyone does.
    return {
        "nexthops": strip(lab.host.ipj("nexthop", "show")),
        "routes": strip(lab.host.ipj("-4", "route", "show", "table", "all")),
        "rules": strip(lab.host.ipj("-4", "rule", "show")),
    }


def test_foreign_routes_rules_and_nexthops_survive_a_full_daemon_run(lab, daemon):
    for cmd in FOREIGN_SETUP:
        lab.host.ip(*cmd)
    before = foreign_state(lab)
    assert len(before["nexthops"]) == 3 and any(r["priority"] == 10150 for r in before["rules"])

    proc = daemon(hold_down_s=0.5, rise=1)
    proc.wait_ready()
    lab.cut(lab.rails[0])
    wait_for_sync(lambda: route_nhid(lab, RAIL0_TABLE) == NH1, 3.0, "failover")
    lab.restore(lab.rails[0])
    wait_for_sync(lambda: route_nhid(lab, RAIL0_TABLE) == NH0, 5.0, "fail-back")
    assert proc.stop() == 0

    assert foreign_state(lab) == before


def ip_monitor(lab) -> subprocess.Popen:
    # IPv4 only: linkpassd writes only IPv4, and IPv6 link-local addresses
    # finishing DAD add kernel routes of their own at any time.
    return subprocess.Popen(["ip", "-4", "-n", lab.host.name, "monitor", "route", "rule", "nexthop"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL], ids=["stop", "crash"])
def test_restart_over_unchanged_state_performs_zero_netlink_writes(lab, daemon, stop_signal):
    first = daemon()
    st = first.wait_ready()
    assert int(st["netlink_writes"]) >= 8  # 2 nexthops, group, 3 routes, rules...
    owned_before = lab.host.ipj("route", "show", "table", str(RAIL0_TABLE))
    first.stop(stop_signal)
    # fail-static: what the daemon installed is still there after it is gone
    assert lab.host.ipj("route", "show", "table", str(RAIL0_TABLE)) == owned_before
    assert group_members(lab) == [NH0, NH1]

    monitor = ip_monitor(lab)
    try:
        time.sleep(0.3)
        second = daemon()
        st = second.wait_ready()
        time.sleep(1.0)  # several ticks: nothing may be written later either
        st = second.status()
    finally:
        monitor.send_signal(signal.SIGTERM)
        seen, _ = monitor.communicate(timeout=5)
    assert int(st["reconciles"]) >= 1
    assert int(st["netlink_writes"]) == 0
    assert seen.strip() == "", f"kernel saw routing changes on restart:\n{seen}"


def test_a_bad_config_on_reload_is_rejected_and_the_running_one_kept(lab, daemon, tmp_path):
    proc = daemon()
    proc.wait_ready()
    cfg = tmp_path / "linkpassd.toml"
    good = cfg.read_text()
    cfg.write_text(good.replace("[[rail]]", "[[rail]]\nmtu = 9000", 1))
    proc.proc.send_signal(signal.SIGHUP)
    wait_for_sync(lambda: "reload rejected" in (proc.status() or {}).get("last_error", ""),
                  5.0, "reload to be rejected")
    st = proc.status()
    assert "rail[0].mtu" in st["last_error"]
    assert [r["active_rail"] for r in st["rails"]] == ["rail0", "rail1"]
    assert route_nhid(lab, RAIL0_TABLE) == NH0
    assert proc.proc.poll() is None


def test_restart_repairs_exactly_what_changed_while_it_was_down(lab, daemon):
    """The counterpart of the zero-writes test: the same witness sees a write."""
    first = daemon()
    first.wait_ready()
    first.stop()
    lab.host.ip("rule", "del", "prio", "10101")  # rail0's source rule, deleted by someone
    monitor = ip_monitor(lab)
    try:
        time.sleep(0.3)
        second = daemon()
        second.wait_ready()
        time.sleep(0.5)
        st = second.status()
    finally:
        monitor.send_signal(signal.SIGTERM)
        seen, _ = monitor.communicate(timeout=5)
    assert int(st["netlink_writes"]) == 1
    assert [line for line in seen.splitlines() if line.strip()] == [
        "10101:\tfrom 198.18.0.2 lookup 10100 proto 201"]


def test_reload_switches_the_sensor_backend(lab, daemon, tmp_path):
    """ethtool (veth has no module: optics unreadable) -> sim files, by SIGHUP."""
    from labs.simsensor import SimSensor

    proc = daemon()
    proc.wait_ready()
    port0 = lab.rails[0].port

    def optics(status):
        for ps in (status or {}).get("sensors", []):
            if ps["port"] == port0:
                return next((a for a in ps["assessments"] if a["signal"] == "optics"), {})
        return {}

    wait_for_sync(lambda: "not supported" in optics(proc.status()).get("detail", ""), 10.0,
                  "ethtool's verdict on veth optics")
    sim_dir = tmp_path / "simfiles"
    for rail in lab.rails:
        SimSensor(sim_dir / f"{rail.port}.json", rail.port).write_healthy()
    cfg = tmp_path / "linkpassd.toml"
    cfg.write_text(cfg.read_text() + f'[sensors]\nbackend = "sim"\nsim_dir = "{sim_dir}"\n'
                   "optics_interval_s = 0.2\ncounters_interval_s = 0.2\n")
    proc.proc.send_signal(signal.SIGHUP)
    wait_for_sync(lambda: optics(proc.status()).get("status") == "ok", 10.0,
                  "optics read from the simulated files")
    st = proc.status()
    assert st["last_error"] == ""
    assert "sensor_replaced" in proc.log()
    assert [r["active_rail"] for r in st["rails"]] == ["rail0", "rail1"]
