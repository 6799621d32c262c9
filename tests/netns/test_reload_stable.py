"""Reloads are make-before-break: numbers belong to names (core.alloc).

A real linkpassd in a lab namespace with three rails, started on two of them
with a resilient group over both; the kernel is read with `ip -j` (an
independent witness), the daemon's writes from its `kernel_write` log lines.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from labs.daemonproc import DaemonProcess, rail_config_toml
from labs.netnslib import HostLab, wait_for_sync

pytestmark = pytest.mark.netns

FABRIC = "198.18.128.0/17"
PROTO = 201


@pytest.fixture
def lab3(netns_factory) -> HostLab:
    return HostLab.build(netns_factory, n_rails=3)


class Host:
    """The config file, the daemons started on it (stopped at teardown)."""

    def __init__(self, lab: HostLab, tmp_path: Path) -> None:
        self.lab, self.tmp = lab, tmp_path
        self.cfg = tmp_path / "linkpassd.toml"
        self.sock = str(tmp_path / "ctl.sock")
        self.started: list[DaemonProcess] = []

    def write(self, n_rails: int, buckets: int = 8) -> None:
        self.cfg.write_text(rail_config_toml(self.sock, str(self.tmp), self.lab.rails[:n_rails],
                                             rise=2, hold_down_s=1.0, buckets=buckets,
                                             multipath=FABRIC, multipath_rails=[0, 1]))

    def start(self) -> DaemonProcess:
        proc = DaemonProcess(self.lab.host.name, self.cfg, self.sock,
                             self.tmp / f"linkpassd{len(self.started)}.log")
        self.started.append(proc.start())
        proc.wait_ready()
        return proc

    def stop_all(self) -> None:
        for proc in self.started:
            proc.stop()


@pytest.fixture
def host(lab3, tmp_path):
    h = Host(lab3, tmp_path)
    try:
        yield h
    finally:
        h.stop_all()


def kernel(lab: HostLab) -> dict:
    """Our objects as the kernel lists them: nexthops (with each group's
    bucket -> nexthop map), rules and routes."""
    ns = lab.host
    nexthops = {nh["id"]: nh for nh in ns.ipj("nexthop", "show")
                if str(nh.get("protocol")) == str(PROTO)}
    buckets = {}
    for nh_id, nh in nexthops.items():
        if "group" in nh:
            buckets[nh_id] = {b["bucket"]["index"]: b["bucket"]["nhid"]
                              for b in ns.ipj("nexthop", "bucket", "show", "id", str(nh_id))}
    rules = {r["priority"]: r for r in ns.ipj("-4", "rule", "show")
             if str(r.get("protocol")) == str(PROTO)}
    routes = {(r["table"], r["dst"]): r for r in ns.ipj("-4", "route", "show", "table", "all")
              if str(r.get("protocol")) == str(PROTO)}
    return {"nexthops": nexthops, "buckets": buckets, "rules": rules, "routes": routes}


def writes_after(proc: DaemonProcess, marker: str) -> list[str]:
    """The `detail` of every kernel_write logged after the last `marker` event."""
    lines = proc.log().splitlines()
    start = max((i for i, line in enumerate(lines) if re.search(rf" event={marker}(?: |$)", line)),
                default=-1)
    assert start >= 0, f"no {marker} in the log:\n{proc.log()}"
    return [f"{_field(line, 'op')} {_field(line, 'detail')}" for line in lines[start + 1:]
            if " event=kernel_write " in line]


def _field(line: str, key: str) -> str:
    match = re.search(rf"\b{key}=(?:'([^']*)'|\"([^\"]*)\"|(\S+))", line)
    assert match, f"no {key} in {line!r}"
    return next(g for g in match.groups() if g is not None)


def fabric_group(lab: HostLab) -> int | None:
    return next((r.get("nhid") for r in lab.host.ipj("route", "show", "table", "all")
                 if r.get("dst") == FABRIC), None)


def settle(proc: DaemonProcess, seconds: float = 1.0) -> int:
    """Watch the daemon through several ticks (0.1 s each); its write count then."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)
    return int(proc.status()["netlink_writes"])


def test_a_reload_that_adds_a_rail_writes_only_the_new_rails_objects(host, lab3):
    host.write(n_rails=2)
    first = host.start()
    settle(first)
    before = kernel(lab3)
    (gid,) = before["buckets"]
    assert len(before["buckets"][gid]) == 8

    host.write(n_rails=3)
    writes_before = int(first.status()["netlink_writes"])
    first.proc.send_signal(signal.SIGHUP)
    wait_for_sync(lambda: any(r["name"] == "rail2" and r["active_rail"] == "rail2"
                              for r in (first.status() or {}).get("rails", [])),
                  10.0, "rail2 in use after the reload")
    wait_for_sync(lambda: any(r.get("src") == lab3.rails[2].address and "dport" not in r
                              for r in kernel(lab3)["rules"].values()), 10.0, "rail2's rule")
    settle(first)
    after = kernel(lab3)

    # The group keeps its id, its members and every bucket's nexthop.
    assert fabric_group(lab3) == gid
    assert after["nexthops"][gid] == before["nexthops"][gid]
    assert after["buckets"][gid] == before["buckets"][gid]
    # Every existing rule keeps its priority (and everything else about it).
    for prio, rule in before["rules"].items():
        assert after["rules"].get(prio) == rule, f"rule {prio} changed"
    for key, route in before["routes"].items():
        assert after["routes"].get(key) == route, f"route {key} changed"
    # Nothing was written for what did not change: only rail2's nexthop,
    # route and rules (roce + source).
    rail2_nh = next(i for i, nh in after["nexthops"].items() if nh.get("dev") == "lprail2")
    (new_route,) = set(after["routes"]) - set(before["routes"])
    assert after["routes"][new_route]["nhid"] == rail2_nh
    new_table = new_route[0]
    written = writes_after(first, "reload_requested")
    assert len(written) == 4, written
    assert all(f"id={rail2_nh}," in w or f"table={new_table}," in w for w in written), written
    assert int(first.status()["netlink_writes"]) - writes_before == 4

    # A restart with the same config writes nothing (allocation.json kept it),
    # and neither does one that must derive the allocation from the kernel,
    # the file being gone (an upgraded host) or corrupt (reported).
    state = host.tmp / "state" / "allocation.json"
    assert state.exists()
    for damage in ("none", "missing", "corrupt"):
        host.started[-1].stop()
        if damage == "missing":
            state.unlink()
        elif damage == "corrupt":
            state.write_text('{"version": 1, "rail_nexthops": {"rail0": "x"}')
        again = host.start()
        assert settle(again) == 0, again.log()
        assert kernel(lab3) == after
        assert ("allocation file unusable" in again.log()) == (damage == "corrupt")
        assert json.loads(state.read_text())["rail_nexthops"]["rail2"] == rail2_nh


def test_a_reload_that_resizes_the_group_moves_the_route_to_a_fresh_group(host, lab3):
    """Make-before-break: the new group exists before the route moves onto
    it, and the old group is deleted only after that. A poller also reads the
    route all through the reload; it samples (a gap shorter than one `ip`
    call could slip between two reads), so the log order is the proof."""
    host.write(n_rails=2, buckets=8)
    proc = host.start()
    settle(proc)
    old = fabric_group(lab3)
    assert old is not None

    samples: list[int | None] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            out = subprocess.run(["ip", "-n", lab3.host.name, "-4", "route", "show", FABRIC,
                                  "table", "all"], capture_output=True, text=True, timeout=10)
            samples.append(1 if "nhid" in out.stdout else None)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        time.sleep(0.2)  # the poller reads before the reload too
        host.write(n_rails=2, buckets=16)
        proc.proc.send_signal(signal.SIGHUP)
        wait_for_sync(lambda: fabric_group(lab3) not in (None, old), 10.0, "the route on a new group")
        new = fabric_group(lab3)
        wait_for_sync(lambda: old not in kernel(lab3)["nexthops"], 10.0, "the old group deleted")
        time.sleep(0.2)
    finally:
        stop.set()
        poller.join(15)

    now = kernel(lab3)
    assert len(now["buckets"][new]) == 16
    written = writes_after(proc, "reload_requested")
    create = written.index(next(w for w in written if w.startswith("create NexthopGroup")
                                and f"id={new}," in w))
    move = written.index(next(w for w in written if w.startswith("replace Route")
                              and f"nhid={new}," in w))
    delete = written.index(next(w for w in written if w.startswith("delete NexthopGroup")
                                and f"id={old}," in w))
    assert create < move < delete, written
    assert not any(w.startswith("delete Route") or w.startswith("create Route") for w in written)
    assert len(samples) > 10 and all(samples), f"route missing in {samples.count(None)} reads"
