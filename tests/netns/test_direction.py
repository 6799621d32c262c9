"""Which way a path loses packets, against the real kernel and the real
responder (issue 31): a responder in the leaf namespace keeps receipts, a
path prober in the host reads them, and nftables in the leaf drops a share
of the requests arriving or of the replies leaving. The prober must class
the losses as the leaf's own counters saw them, and name the direction.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from labs.netnslib import run
from linkpassd.adapters.echo import EchoService, ProbePath
from linkpassd.adapters.echoresponder import ECHO_PORT, EchoResponder
from linkpassd.core.admission import ResponderPolicy
from linkpassd.core.probe import ProbeConfig

pytestmark = pytest.mark.netns

CONFIG = ProbeConfig(interval_s=0.010)
TABLE = f"lp_dir{os.getpid()}"
LAB_POLICY = ResponderPolicy.build(None, ["198.18.0.0/15"])
PERCENT = 10
RUN_S = 3.0


async def nft(ns, script: str, check: bool = True) -> str:
    proc = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", ns.name, "nft", "-f", "-", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(script.encode()), 10)
    assert proc.returncode == 0 or not check, err.decode()
    return out.decode()


def drop_share(direction: str, port: str) -> str:
    """Drop PERCENT % of the echo requests arriving at the leaf on `port`,
    or of the replies leaving it there."""
    hook, match = {"requests": ("input", f'iifname "{port}" udp dport {ECHO_PORT}'),
                   "replies": ("output", f'oifname "{port}" udp sport {ECHO_PORT}')}[direction]
    return (f"add table inet {TABLE}\n"
            f"add chain inet {TABLE} c {{ type filter hook {hook} priority 0; policy accept; }}\n"
            f"add rule inet {TABLE} c {match} numgen random mod 100 < {PERCENT} counter drop\n")


async def dropped(ns) -> int:
    proc = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", ns.name, "nft", "-j", "list", "table", "inet", TABLE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 10)
    assert proc.returncode == 0, err.decode()
    for item in json.loads(out)["nftables"]:
        for expr in item.get("rule", {}).get("expr", ()):
            if "counter" in expr:
                return expr["counter"]["packets"]
    raise AssertionError("no counter in the drop rule")


async def probe_through(lab, direction: str, receipts: bool = True):
    """Probe the leaf from rail 0 for RUN_S with `direction` losing PERCENT %;
    the path's prober, its assessment, and what nft dropped."""
    rail = lab.rails[0]
    responder = EchoResponder(netns=lab.leaf.name, policy=LAB_POLICY)
    if not receipts:  # a responder from before receipts: the field stays 0
        responder._receipt = lambda key: 0
    service = EchoService([ProbePath(rail.port, rail.address, rail.gateway)], CONFIG,
                          respond=False, netns=lab.host.name)
    try:
        await nft(lab.leaf, drop_share(direction, rail.peer))
        responder.start()
        service.start()
        await asyncio.sleep(RUN_S)
        service.close()  # nothing more sent: the counts below stay put
        (prober,) = service.probers.values()
        return prober.state, prober.assessment(), await dropped(lab.leaf)
    finally:
        service.close()
        responder.close()
        await nft(lab.leaf, f"delete table inet {TABLE}\n", check=False)


@pytest.mark.parametrize("direction, words", [
    ("requests", "loss towards {peer}, replies fine"),
    ("replies", "replies lost from {peer}, requests reach it")])
def test_one_way_loss_is_classed_as_the_leaf_dropped_it(lab, direction, words):
    state, assessment, drops = run(probe_through(lab, direction), timeout=30)
    r = state.receipts
    # Probes after the last reply are not classed yet: at most a few.
    classed = r.requests_lost if direction == "requests" else r.replies_lost
    other = r.replies_lost if direction == "requests" else r.requests_lost
    assert drops >= 10, drops
    assert drops - 3 <= classed <= drops and other == 0, (drops, r)
    assert r.resyncs == 0 and not r.round_trip_only
    assert assessment.direction == direction
    assert words.format(peer=lab.rails[0].gateway) in assessment.detail, assessment.detail


def test_a_responder_without_receipts_is_round_trip_only_and_says_so(lab):
    state, assessment, drops = run(probe_through(lab, "requests", receipts=False), timeout=30)
    assert drops >= 10
    assert state.receipts.round_trip_only and state.receipts.requests_lost == 0
    assert assessment.direction == "unknown"
    assert "keeps no receipts (round trip only)" in assessment.detail, assessment.detail
