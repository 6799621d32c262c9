"""The per-leaf fence cap end to end: two hosts (each its own namespace pair)
whose rail 0 sits behind the same leaf by config (`leaf = "L0"`), a real
linkpass-aggregator (Unix socket, insecure: lab only, [fence] leaf_cap 1 by
default) and a real linkpassd on each host with [fence] on and its default
require_leaf_grant = true. Both rails 0 are blackholed at once, as by a
failing leaf: both ask, the aggregator grants one, and exactly one port goes
down; the other is held back and says why."""

from __future__ import annotations

import contextlib
import os
import time

import pytest

from labs.aggproc import AggregatorProc
from labs.daemonproc import DaemonProcess, assessment, rail_config_toml
from labs.echopeer import NETNS_PEER as ECHO_PEER
from labs.echopeer import EchoPeerProcess
from labs.netnslib import HostLab, wait_for_sync

pytestmark = pytest.mark.netns

FABRIC = "198.18.0.0/16"
FENCE_AFTER_S = 1.0


def config(lab: HostLab, tmp, host_id: str, aggregator: str) -> str:
    sock = str(tmp / "ctl.sock")
    extra = (f"[probes]\nenabled = true\ninterval_ms = 50\nfabric_prefixes = [\"{FABRIC}\"]\n"
             f"[fence]\nenabled = true\nfence_after_s = {FENCE_AFTER_S}\n"
             "backoff_initial_s = 60.0\nbackoff_max_s = 120.0\n"
             "min_echo_peers = 1\n"  # the rail's one echo peer is the leaf itself
             f"[aggregator]\naddress = \"{aggregator}\"\nhost_id = \"{host_id}\"\ninsecure = true\n")
    text = rail_config_toml(sock, str(tmp), lab.rails, rise=2, hold_down_s=1.0, extra=extra,
                            probe_peers=[[ECHO_PEER], [ECHO_PEER]])
    for i in range(len(lab.rails)):  # rail i behind leaf Li, on both hosts
        text = text.replace(f'name = "rail{i}"\n', f'name = "rail{i}"\nleaf = "L{i}"\n', 1)
    return text


def admin_up(lab: HostLab, port: str) -> bool:
    (link,) = lab.host.ipj("link", "show", "dev", port)
    return "UP" in link["flags"]


def test_a_blackholed_leaf_fences_no_more_than_the_leaf_cap(netns_factory, tmp_path):
    labs = {"ha": HostLab.build(netns_factory, 2), "hb": HostLab.build(netns_factory, 2)}
    table = f"lp_leafhole{os.getpid()}"
    with contextlib.ExitStack() as stack:
        agg = AggregatorProc(tmp_path / "agg", web=False).start()
        stack.callback(agg.stop)
        daemons = {}
        for host, lab in labs.items():
            lab.leaf.ip("link", "set", "lo", "up")
            lab.leaf.ip("addr", "add", f"{ECHO_PEER}/32", "dev", "lo")
            stack.enter_context(EchoPeerProcess(lab.leaf.name, duration=90))
            tmp = tmp_path / host
            tmp.mkdir()
            (tmp / "linkpassd.toml").write_text(config(lab, tmp, host, agg.address))
            daemons[host] = stack.enter_context(DaemonProcess(
                lab.host.name, tmp / "linkpassd.toml", str(tmp / "ctl.sock"), tmp / "linkpassd.log"))
            daemons[host].wait_ready()
        for host, lab in labs.items():
            wait_for_sync(lambda d=daemons[host], p=lab.rails[0].port:
                          assessment(d.status(), p, "echo").get("status") == "ok", 10.0, "echo up")
            wait_for_sync(lambda d=daemons[host]: (d.status() or {}).get("aggregator", {})
                          .get("connected"), 15.0, f"{host} connected to the aggregator")
        port = labs["ha"].rails[0].port  # lprail0 in each host namespace
        for lab in labs.values():
            peer = lab.rails[0].peer
            lab.leaf.nft(f"table inet {table} {{\n"
                         f'  chain in {{ type filter hook input priority 0; iifname "{peer}" drop; }}\n'
                         f'  chain out {{ type filter hook output priority 0; oifname "{peer}" drop; }}\n'
                         "}\n")
            stack.callback(lab.leaf.nft, f"delete table inet {table}\n")
        wait_for_sync(lambda: any(not admin_up(lab, port) for lab in labs.values()),
                      FENCE_AFTER_S + 10.0, "one rail 0 fenced")
        end = time.monotonic() + FENCE_AFTER_S + 8.0
        while time.monotonic() < end:
            down = [h for h, lab in labs.items() if not admin_up(lab, port)]
            assert len(down) == 1, down  # never both: the leaf's cap is 1
            time.sleep(0.05)
        (fenced,) = [h for h, lab in labs.items() if not admin_up(lab, port)]
        other = "hb" if fenced == "ha" else "ha"
        assert "asked the aggregator" in daemons[other].log()
        assert "event=fence_fence" in daemons[fenced].log()
        assert "event=fence_fence" not in daemons[other].log()
        # both hosts' rail 0 traffic is on rail 1 all the same
        for lab in labs.values():
            assert lab.host.route_nhid(10100) == 1_000_101
