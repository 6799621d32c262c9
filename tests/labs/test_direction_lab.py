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
- one-way random loss on a leaf-spine link (SpineLinkLoss, rules in the
  leaf), each way: only the flows ECMP hashes onto that link lose, so the
  test asks the leaves' own routing (`ip route get` with the probe flow's
  5-tuple) which paths of the hosts under the leaf cross it that way, and
  checks that every path linkpassd's explain and events name with the
  direction (requests lost going up, replies lost coming down) is one of
  them; `linkpassctl validate` gives one lossy_link finding naming that
  leaf's spine links, the direction and the transmitter to check first;
- a silent blackhole (both ways, LLDP too) and a leaf-to-host-only fault:
  exactly one finding each, with consistent evidence (no "LLDP as
  planned", no separate LLDP finding, no "checks that did not run").
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
from validationlab import needs_lab, wait_healthy

from labs import validation
from labs.faults import HostPortLoss, OneWayLoss, RandomLoss, SilentBlackhole, SpineLinkLoss
from labs.validation import findings, summary
from linkpassd.core.wire import ECHO_PORT

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


def echo_events(lab, host: str, port: str, after: int = 0) -> list[dict]:
    events = ctl(lab, host, "events", *(("--after", str(after)) if after else ())).get("events", [])
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


# Which way a leaf-spine link loses, as each end of a crossing path sees it:
# the flows that cross the leaf's link to the spine going up (leaf to spine)
# are a prober's requests, coming down (spine to leaf) its replies.
SPINE_PATH_WORDS = {"leaf_to_spine": ("loss towards", "loss towards {peer}, replies fine"),
                    "spine_to_leaf": ("replies lost", "replies lost from {peer}, requests reach it")}
LAB_ADDRESS = r"198\.1[89]\.\d+\.\d+"
SPINE_FINDING_WAY = {"leaf_to_spine": "leaf to spine", "spine_to_leaf": "spine to leaf"}
SPINE_FIX = {"leaf_to_spine": "check the transmitters on {leaf}'s spine-facing ports first",
             "spine_to_leaf": "check the spines' transmitters towards {leaf} first"}


def prober_port(lab, host) -> int:
    """The UDP source port of linkpassd's probes on the host's rail 0 (its
    rail socket, bound to the rail's address; it sends out of the port with
    IP_UNICAST_IF, so `ss` shows no device)."""
    rail = host.rail(0)
    out = lab.run(host.name, ["ss", "-Hnua"]).stdout
    ports = {int(m.group(1)) for m in re.finditer(rf"\s{re.escape(rail.address)}(?:%\S+)?:(\d+)\s", out)}
    ports.discard(ECHO_PORT)
    assert len(ports) == 1, f"{host.name}: one probe socket on {rail.port} expected:\n{out}"
    return ports.pop()


def egress(lab, leaf: str, iif: str, src: str, dst: str, sport: int, dport: int) -> str:
    """The interface `leaf` forwards that UDP flow to, arriving on `iif`: the
    leaf's own FIB and 5-tuple multipath hash (fib_multipath_hash_policy=1)."""
    out = lab.run(leaf, ["ip", "-j", "route", "get", dst, "from", src, "iif", iif, "ipproto", "udp",
                         "sport", str(sport), "dport", str(dport)]).stdout
    return json.loads(out)[0]["dev"]


def crossing_paths(lab, leaf: str, direction: str) -> dict[int, list[tuple]]:
    """Per spine, the (host, peer) paths on rail 0 whose probes the fault
    would hit on `leaf`'s link to that spine: a host under `leaf` probing a
    peer under another leaf, its request flow going up through that link
    (leaf_to_spine), or the peer's reply flow coming down it (spine_to_leaf:
    the peer's leaf sends it to that spine). From the leaves' own routing."""
    uplinks = {u.spine_index: u for u in lab.plan.uplinks}
    out: dict[int, list[tuple]] = {}
    for host in (h for h in lab.hosts if h.rail(0).leaf == leaf):
        sport, src = prober_port(lab, host), host.rail(0)
        for peer in (h for h in lab.hosts if h.rail(0).leaf != leaf):
            dst = peer.rail(0)
            if direction == "leaf_to_spine":
                dev = egress(lab, leaf, src.leaf_port, src.address, dst.address, sport, ECHO_PORT)
                spines = [u.spine_index for u in lab.plan.uplinks if (u.leaf, u.leaf_port) == (leaf, dev)]
            else:
                dev = egress(lab, dst.leaf, dst.leaf_port, dst.address, src.address, ECHO_PORT, sport)
                spines = [u.spine_index for u in lab.plan.uplinks if (u.leaf, u.leaf_port) == (dst.leaf, dev)]
            for s in spines:
                out.setdefault(s, []).append((host, peer))
    assert set(out) <= set(uplinks), out
    return out


def last_event(lab, host) -> int:
    return int(ctl(lab, host.name, "events", "--limit", "1")["last_seq"])


def named_paths(lab, host, words: str, after: int) -> dict[str, str]:
    """{peer address: the path's words} for `host`'s rail-0 paths its echo_paths
    events after `after` have named degraded with `words` (a template on
    {peer}; a path that is not degraded names the way of any stray loss)."""
    named = {}
    for e in echo_events(lab, host.name, host.rail(0).port, after):
        for signal, detail in re.findall(r"probe:(\S+?)=('[^']*'|\"[^\"]*\")", e.get("fields", {}).get("paths", "")):
            if re.match(r"['\"]loss \d+% over the last", detail) and words.format(peer=signal) in detail:
                named[signal] = detail
    return named


def echo_lines(lab, hosts) -> dict[str, str]:
    """{host: the echo line of `linkpassctl explain` on its rail-0 port}."""
    lines = {}
    for h in hosts:
        evidence = ctl(lab, h.name, "explain", h.rail(0).port).get("state", {}).get("evidence", [])
        lines[h.name] = next((line for line in evidence if line.startswith("echo:")), "")
    return lines


def wait_paths_clean(lab, hosts) -> None:
    """Until no path of `hosts` is in trouble (an earlier test's fault leaves
    degraded paths for a window's length while the rail is already UP)."""
    deadline = time.monotonic() + NAMED_S
    while True:
        lines = echo_lines(lab, hosts)
        if not any(re.search(LAB_ADDRESS, line) for line in lines.values()):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"paths still in trouble after {NAMED_S:g} s: {lines}")
        time.sleep(1.0)


def wait_path_named(lab, hosts, phrase: str) -> dict[str, str]:
    """{host: its echo evidence line} once some of `hosts` name a degraded
    path with `phrase` in `linkpassctl explain` (their rail-0 port)."""
    deadline = time.monotonic() + NAMED_S
    while True:
        lines = echo_lines(lab, hosts)
        if any(phrase in line and re.search(LAB_ADDRESS, line) for line in lines.values()):
            return {host: line for host, line in lines.items() if phrase in line}
        if time.monotonic() > deadline:
            pytest.fail(f"no path of {[h.name for h in hosts]} named {phrase!r} in {NAMED_S:g} s: {lines}")
        time.sleep(1.0)


@pytest.mark.parametrize("direction", ["leaf_to_spine", "spine_to_leaf"])
def test_one_way_loss_on_a_leaf_spine_link_is_named_by_linkpassd_and_by_validate(dlab, direction):
    leaf = dlab.plan.leaves_of_rail(0)[0]
    wait_healthy(dlab)
    crossing = crossing_paths(dlab, leaf, direction)
    assert crossing, f"no rail-0 path of a host under {leaf} crosses its spine links {direction}"
    spine = max(crossing, key=lambda s: (len(crossing[s]), -s))  # the link most probed paths cross
    expected = {(h.name, p.rail(0).address) for h, p in crossing[spine]}
    phrase, words = SPINE_PATH_WORDS[direction]
    fault = SpineLinkLoss(dlab, leaf, spine, PERCENT, directions=(direction,))
    under = [h for h in dlab.hosts if h.rail(0).leaf == leaf]
    wait_paths_clean(dlab, under)
    after = {h.name: last_event(dlab, h) for h in under}
    fault.inject()
    try:
        explained = wait_path_named(dlab, under, phrase)
        named = {(h.name, peer): detail for h in under
                 for peer, detail in named_paths(dlab, h, words, after[h.name]).items()}
        run = validation.validate(dlab, DURATION_S, RUN_TIMEOUT_S)
        counts = fault.counts()
    finally:
        fault.clear()
    # linkpassd: every path its hosts' explain and events name that way is a
    # path the leaves' routing sends across that link that way
    for host, line in explained.items():
        peers = set(re.findall(LAB_ADDRESS, line))
        assert {(host, peer) for peer in peers} <= expected, (host, line, sorted(expected), counts)
    assert any(named.get((host, peer)) for host, line in explained.items()
               for peer in re.findall(LAB_ADDRESS, line)), (named, explained)
    assert set(named) <= expected, (sorted(named), sorted(expected))
    # validate: one finding naming the leaf's spine links and the direction
    assert run.code == validation.EXIT_FINDINGS, summary(run.report)
    found_all = findings(run.report)
    assert len(found_all) == 1, summary(run.report)  # one fault, one finding
    (found,) = found_all
    assert found["kind"] == "lossy_link", summary(run.report)
    assert (found["ports"], found["rail"]) == ([leaf], "rail0"), summary(run.report)
    assert found["hosts"] == [h.name for h in under], summary(run.report)
    assert found["component"].startswith(f"{leaf} (rail0): one of its spine links: random loss ~"), found
    assert found["component"].endswith(f"per round trip, {SPINE_FINDING_WAY[direction]}"), found
    assert found["fix"].startswith(SPINE_FIX[direction].format(leaf=leaf)), found
    assert any(line.startswith("per direction") for line in found["evidence"]), found
