"""[announce] against real FRR: linkpassd's announcement table, imported by the
host's zebra and announced by its bgpd, learnt by a leaf running FRR bgpd.

host namespace: lprail0 198.18.0.2, lprail1 198.18.1.2; FRR (zebra + bgpd)
with the config linkpassd.announce_frr writes. leaf namespace: FRR bgpd with
one eBGP session per rail (198.18.0.1, 198.18.1.1), accepting the two /32s.

Shows: with both rails trusted each address is learnt over its own rail only;
when linkpassd's verdict takes rail0 (a gray failure: carrier up, both BGP
sessions Established) the leaf learns 198.18.0.2 through rail1 and no longer
through rail0; restored, back over rail0; with rail0 blackholed at the leaf
(its session cannot carry the withdrawal) the leaf still forwards through
rail1, the stale own-rail path being unusable there; an address the host does not hold
is refused and never reaches the table; FRR stopped: the table is still
written and the adapter names what is missing.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from labs.daemonproc import DaemonProcess, assessment, rail_config_toml
from labs.echopeer import NETNS_PEER as ECHO_PEER
from labs.echopeer import EchoPeerProcess
from labs.frr import BgpNeighbor, BgpSpeaker, FrrBfd
from labs.netnslib import HostLab, run, wait_for_sync
from linkpassd.adapters.announce import Announcer
from linkpassd.announce_frr import bgpd_config, zebra_config
from linkpassd.config import parse_config
from linkpassd.core import announce, policy
from linkpassd.core.announce import Announcement, Role
from linkpassd.core.model import PortState, Verdict

pytestmark = pytest.mark.netns

HOST_ASN, LEAF_ASN = 65101, 65001
OWNER_MED = 100  # [announce] owner_med's default; a detour goes out with MED 0
LEARN_TIMEOUT_S = 15.0  # BGP sessions and updates on a 2-core VM running two FRRs
FABRIC = "198.18.0.0/16"  # sources the daemon's echo responder answers


def host_config(lab: HostLab, frr_run_dir: str = "/var/run/frr"):
    rails = "".join(
        f'[[rail]]\nname = "rail{r.index}"\nport = "{r.port}"\naddress = "{r.address}/24"\n'
        f'gateway = "{r.gateway}"\nbackups = ["rail{1 - r.index}"]\n' for r in lab.rails)
    return parse_config(
        f'[daemon]\ncontrol_socket = "/tmp/lp-unused.sock"\n'
        f'[announce]\nenabled = true\nlocal_asn = {HOST_ASN}\npeer_asn = {LEAF_ASN}\n'
        f'frr_run_dir = "{frr_run_dir}"\n' + rails)


def states(cfg, **verdicts: Verdict) -> dict[str, PortState]:
    return {r.port: PortState(r.port, verdicts.get(r.port, Verdict.UP), True, "x", 0.0)
            for r in cfg.rails}


def learnt(leaf: FrrBfd, prefix: str) -> dict[str, int]:
    """The leaf's BGP paths for `prefix`: peer address -> MED."""
    out = leaf.try_read(lambda: json.loads(leaf.vtysh(f"show bgp ipv4 unicast {prefix} json")))
    return {p["peer"]["peerId"]: p.get("metric", 0) for p in (out or {}).get("paths", [])}


def valid(leaf: FrrBfd, prefix: str) -> dict[str, bool]:
    """The leaf's BGP paths for `prefix`: peer address -> usable."""
    out = leaf.try_read(lambda: json.loads(leaf.vtysh(f"show bgp ipv4 unicast {prefix} json")))
    return {p["peer"]["peerId"]: bool(p.get("valid")) for p in (out or {}).get("paths", [])}


def fib_via(lab: HostLab, address: str) -> list[str]:
    """The leaf kernel's BGP route to `address`: its gateways."""
    routes = [r for r in lab.leaf.ipj("route", "show", "proto", "bgp") if r.get("dst") == address]
    return sorted(nh.get("gateway") for r in routes
                  for nh in (r.get("nexthops") or [r]) if nh.get("gateway"))


def wait(pred, what: str, timeout: float = LEARN_TIMEOUT_S):
    return wait_for_sync(pred, timeout, what)


def test_rail_addresses_follow_linkpassd_through_frr(netns_factory):
    lab = HostLab.build(netns_factory, n_rails=2)
    r0, r1 = lab.rails
    cfg = host_config(lab)
    host_frr = FrrBfd(lab.host.name, [], zebra_conf=zebra_config(cfg),
                      bgpd_conf="frr defaults traditional\nhostname lp-host\n!\n" + bgpd_config(cfg))
    leaf_frr = FrrBfd(lab.leaf.name, [], bgp=BgpSpeaker(
        asn=LEAF_ASN, router_id=r0.gateway,
        neighbors=tuple(BgpNeighbor(r.address, HOST_ASN, r.gateway) for r in lab.rails),
        accept=tuple(f"{r.address}/32" for r in lab.rails)))
    report: dict = {}
    try:
        leaf_frr.start()
        host_frr.start()
        cfg = replace(cfg, announce=replace(cfg.announce, frr_run_dir=str(host_frr.run_dir)))
        wait(lambda: set(leaf_frr.bgp_states().values()) == {"Established"}, "both sessions up",
             30.0)
        run(scenario(lab, cfg, host_frr, leaf_frr, report), timeout=120)
    except BaseException:
        print(host_frr.logs())
        print(leaf_frr.logs())
        raise
    finally:
        for frr in (host_frr, leaf_frr):
            try:
                frr.stop()
            finally:
                frr.cleanup()
    print("announce via FRR:", report)


async def scenario(lab, cfg, host_frr, leaf_frr, report) -> None:
    r0, r1 = lab.rails
    a0, a1 = r0.address, r1.address
    ipr = lab.host.iproute()
    async with ipr:
        ann = Announcer(ipr, cfg.announce, cfg.announce.frr_run_dir)

        def decide(**verdicts):
            return announce.plan(cfg, cfg.announce, policy.decide(cfg, states(cfg, **verdicts)).rails)

        async def until(pred, what, timeout=LEARN_TIMEOUT_S):
            return await asyncio.to_thread(wait, pred, what, timeout)

        # 1. Both rails trusted: each address over its own rail, MED 0.
        healthy = decide()
        result = await ann.apply(cfg, healthy)
        assert result.refused == [] and result.errors == []
        assert sorted(result.added) == [(a0, 1000), (a1, 1001)]
        t0 = time.monotonic()
        await until(lambda: learnt(leaf_frr, f"{a0}/32") == {a0: OWNER_MED}
                    and learnt(leaf_frr, f"{a1}/32") == {a1: OWNER_MED}, "own-rail announcements")
        report["learnt_s"] = round(time.monotonic() - t0, 3)
        # zebra never installs a /32 through itself: over its own rail the
        # leaf's connected route carries the address (a spine would use the /32).
        assert fib_via(lab, a0) == [] and fib_via(lab, a1) == []
        state = await ann.frr_state(healthy)
        assert state.ok, state.problems

        # 2. linkpassd distrusts rail0 (gray: carrier and both sessions stay up).
        failed = decide(lprail0=Verdict.DEGRADED)
        assert failed[a0].via == "rail1" and failed[a0].role is Role.DETOUR
        t_fail = time.monotonic()
        result = await ann.apply(cfg, failed)
        assert result.added == [(a0, 1001)] and result.removed == [(a0, 1000)]
        await until(lambda: learnt(leaf_frr, f"{a0}/32") == {a1: 0}, "rail0's address via rail1")
        report["detour_learnt_s"] = round(time.monotonic() - t_fail, 3)
        await until(lambda: fib_via(lab, a0) == [a1], "leaf FIB via rail1")
        report["detour_fib_s"] = round(time.monotonic() - t_fail, 3)
        assert learnt(leaf_frr, f"{a1}/32") == {a1: OWNER_MED}
        assert set(leaf_frr.bgp_states().values()) == {"Established"}

        # 3. Trusted again: back over rail0 only.
        t_back = time.monotonic()
        await ann.apply(cfg, healthy)
        await until(lambda: learnt(leaf_frr, f"{a0}/32") == {a0: OWNER_MED}, "back over rail0")
        await until(lambda: fib_via(lab, a0) == [], "leaf FIB back on the connected route")
        report["restored_s"] = round(time.monotonic() - t_back, 3)
        assert await ann.observe() == {a0: {1000}, a1: {1001}}

        # 3b. A blackhole on rail0 (the leaf drops everything on its rail0 port):
        # rail0's BGP session cannot carry the withdrawal and stays Established
        # until its hold timer, yet the leaf forwards to 198.18.0.2 via rail1:
        # the stale own-rail path is held but invalid here (its next hop is the
        # address itself), so the detour is the only usable path.
        hole = f"lp_announce_hole{os.getpid()}"
        lab.leaf.nft(f"""
table inet {hole} {{
  chain in {{ type filter hook input priority 0; iifname "{r0.peer}" drop; }}
  chain out {{ type filter hook output priority 0; oifname "{r0.peer}" drop; }}
}}""")
        try:
            t_hole = time.monotonic()
            await ann.apply(cfg, failed)
            await until(lambda: fib_via(lab, a0) == [a1], "leaf FIB via rail1 despite the stale path")
            report["blackhole_detour_fib_s"] = round(time.monotonic() - t_hole, 3)
            assert learnt(leaf_frr, f"{a0}/32") == {a0: OWNER_MED, a1: 0}  # rail0's path is stale
            assert valid(leaf_frr, f"{a0}/32") == {a0: False, a1: True}
            assert leaf_frr.bgp_states()[a0] == "Established"
        finally:
            lab.leaf.nft(f"delete table inet {hole}\n")
        await ann.apply(cfg, healthy)
        await until(lambda: learnt(leaf_frr, f"{a0}/32") == {a0: OWNER_MED}, "healed")
        await until(lambda: fib_via(lab, a0) == [], "leaf FIB back on the connected route")

        # 4. Never an address the host does not hold, even a configured-looking one.
        bogus = dict(healthy)
        bogus["198.18.9.9"] = Announcement("198.18.9.9", "rail0", "rail0", Role.OWNER, 1000)
        result = await ann.apply(cfg, bogus)
        assert result.refused == ["198.18.9.9"] and result.added == []
        assert "198.18.9.9" not in await ann.observe()

        # 5. FRR stopped: the table is still written, and what is missing is named.
        await asyncio.to_thread(host_frr.stop, 10.0, ("bgpd", "zebra"))
        state = await ann.frr_state(healthy)
        assert state.missing_daemons == ("zebra", "bgpd")
        assert any("FRR not running" in p for p in state.problems)
        result = await ann.apply(cfg, failed)
        assert result.errors == [] and (a0, 1001) in result.added
        assert await ann.observe() == {a0: {1001}, a1: {1001}}

        # 6. An address the host stops holding is withdrawn from the table (and
        # refused), though it is configured.
        lab.host.ip("addr", "del", f"{a1}/24", "dev", r1.port)
        result = await ann.apply(cfg, failed)
        assert result.refused == [a1] and result.removed == [(a1, 1001)]
        assert await ann.observe() == {a0: {1001}}


def test_frr_that_does_not_import_the_table_is_named(netns_factory):
    """FRR running but misconfigured (no `ip import-table`): the adapter says
    which addresses zebra has not imported, and nothing else."""
    lab = HostLab.build(netns_factory, n_rails=2)
    cfg = host_config(lab)
    host_frr = FrrBfd(lab.host.name, [], bgpd_conf="frr defaults traditional\nhostname lp-host\n!\n"
                      + bgpd_config(cfg))  # zebra without the import
    try:
        host_frr.start()
        cfg = replace(cfg, announce=replace(cfg.announce, frr_run_dir=str(host_frr.run_dir)))

        async def check():
            ipr = lab.host.iproute()
            async with ipr:
                ann = Announcer(ipr, cfg.announce, cfg.announce.frr_run_dir)
                want = announce.plan(cfg, cfg.announce,
                                     policy.decide(cfg, states(cfg)).rails)
                await ann.apply(cfg, want)
                await asyncio.sleep(1.0)  # what zebra would have imported by now
                return await ann.frr_state(want)

        state = run(check(), timeout=30)
        assert state.missing_daemons == ()
        assert state.not_imported == tuple(sorted(r.address for r in lab.rails))
        assert state.problems == ("not imported by zebra (ip import-table): "
                                  "198.18.0.2, 198.18.1.2",)
    finally:
        try:
            host_frr.stop()
        finally:
            host_frr.cleanup()


# --------------------------------------------------------------------------
# The daemon: linkpassd drives the announcements from its own verdicts.
# --------------------------------------------------------------------------

NH0, NH1 = 1_000_100, 1_000_101
RAIL0_TABLE = 10100
PROBES = ('[probes]\nenabled = true\ninterval_ms = 50\n'
          f'fabric_prefixes = ["{FABRIC}"]\n')


def daemon_toml(lab, sock: str, run_dir: str, frr_run_dir: str) -> str:
    announce_section = (f'[announce]\nenabled = true\nlocal_asn = {HOST_ASN}\n'
                        f'peer_asn = {LEAF_ASN}\nfrr_run_dir = "{frr_run_dir}"\n')
    return rail_config_toml(sock, run_dir, lab.rails, rise=2, hold_down_s=1.0,
                            extra=PROBES + announce_section,
                            probe_peers=[[ECHO_PEER], [ECHO_PEER]])


def ctl_events(sock: str) -> list[dict]:
    """`linkpassctl events -o json` of the running daemon (this boot)."""
    proc = subprocess.run([sys.executable, "-m", "linkpassd.ctl.main", "--socket", sock,
                           "events", "-o", "json"], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout).get("events", [])


def problems(status: dict | None) -> list[str]:
    return [f"{p.get('what')}: {p.get('detail')}" for p in (status or {}).get("problems", [])]


def test_linkpassd_moves_the_announcement_on_an_echo_verdict(lab, tmp_path):
    """Replies lost on rail0 (one-way, UDP echo only): the leaf's BGP session
    over rail0 is unaffected and sees nothing; linkpassd's echo verdict moves
    rail0's table to rail1 and 198.18.0.2's announcement with it. A restart
    of linkpassd withdraws nothing; FRR stopped is reported and outgoing
    failover goes on."""
    r0, r1 = lab.rails
    a0, a1 = r0.address, r1.address
    lab.leaf.ip("link", "set", "lo", "up")
    lab.leaf.ip("addr", "add", f"{ECHO_PEER}/32", "dev", "lo")
    sock, cfg_path = str(tmp_path / "ctl.sock"), tmp_path / "linkpassd.toml"
    snippet_cfg = parse_config(daemon_toml(lab, sock, str(tmp_path), "/var/run/frr"))
    host_frr = FrrBfd(lab.host.name, [], zebra_conf=zebra_config(snippet_cfg),
                      bgpd_conf="frr defaults traditional\nhostname lp-host\n!\n"
                      + bgpd_config(snippet_cfg))
    leaf_frr = FrrBfd(lab.leaf.name, [], bgp=BgpSpeaker(
        asn=LEAF_ASN, router_id=r0.gateway,
        neighbors=tuple(BgpNeighbor(r.address, HOST_ASN, r.gateway) for r in lab.rails),
        accept=tuple(f"{r.address}/32" for r in lab.rails)))
    hole = f"lp_announce_replies{os.getpid()}"
    replies_lost = (f"table inet {hole} {{\n  chain out {{ type filter hook output priority 0; "
                    f'oifname "{r0.peer}" udp sport 4793 drop; }}\n}}\n')
    report: dict = {}
    daemon = None
    try:
        leaf_frr.start()
        host_frr.start()
        cfg_path.write_text(daemon_toml(lab, sock, str(tmp_path), str(host_frr.run_dir)))
        wait(lambda: set(leaf_frr.bgp_states().values()) == {"Established"}, "sessions up", 30.0)
        with EchoPeerProcess(lab.leaf.name, duration=120):
            daemon = DaemonProcess(lab.host.name, cfg_path, sock, tmp_path / "linkpassd.log")
            daemon.start()
            daemon.wait_ready()
            wait(lambda: learnt(leaf_frr, f"{a0}/32") == {a0: OWNER_MED}
                 and learnt(leaf_frr, f"{a1}/32") == {a1: OWNER_MED}, "own-rail announcements")
            wait(lambda: assessment(daemon.status(), r0.port, "echo").get("status") == "ok",
                 "echo up on rail0", 10.0)

            # 1. Gray failure only linkpassd sees.
            lab.leaf.nft(replies_lost)
            cut = time.monotonic()
            wait(lambda: fib_via(lab, a0) == [a1], "leaf forwards rail0's address via rail1")
            report["fault_to_leaf_fib_s"] = round(time.monotonic() - cut, 3)
            assert lab.host.route_nhid(RAIL0_TABLE) == NH1
            assert learnt(leaf_frr, f"{a0}/32") == {a1: 0}  # withdrawn over rail0's session
            assert leaf_frr.bgp_states()[a0] == "Established"  # which is fine all along

            # 2. A restart withdraws nothing: sample the leaf throughout.
            samples = []
            daemon.stop()
            assert set(lab.host.ipj("route", "show", "table", "250")[i]["dst"]
                       for i in range(2)) == {a0, a1}
            daemon.start()
            deadline = time.monotonic() + 20.0
            while time.monotonic() < deadline:
                samples.append(learnt(leaf_frr, f"{a0}/32"))
                st = daemon.status()
                if st and int(st.get("reconciles", 0)) >= 1 and len(samples) > 20:
                    break
            for _ in range(10):  # and a while after the first decisions
                samples.append(learnt(leaf_frr, f"{a0}/32"))
                time.sleep(0.1)
            report["restart_samples"] = len(samples)
            assert all(s == {a1: 0} for s in samples), samples
            assert lab.host.route_nhid(RAIL0_TABLE) == NH1  # the verdict was carried over

            # 3. Healed: back over rail0 after the hold-down.
            lab.leaf.nft(f"delete table inet {hole}\n")
            healed = time.monotonic()
            wait(lambda: learnt(leaf_frr, f"{a0}/32") == {a0: OWNER_MED}, "back over rail0")
            report["heal_to_own_rail_s"] = round(time.monotonic() - healed, 3)
            assert time.monotonic() - healed >= 1.0  # hold-down_s
            assert lab.host.route_nhid(RAIL0_TABLE) == NH0

            # 4. FRR stopped: reported; outgoing failover and the table go on.
            host_frr.stop(10.0, ("bgpd", "zebra"))
            wait(lambda: any("FRR not running" in p for p in problems(daemon.status())),
                 "FRR reported missing", 15.0)
            lab.leaf.nft(replies_lost)
            wait(lambda: lab.host.route_nhid(RAIL0_TABLE) == NH1, "rail0 table on rail1", 5.0)
            wait(lambda: {r["dst"]: r.get("metric") for r in
                          lab.host.ipj("route", "show", "table", "250")}.get(a0) == 1001,
                 "announcement table still written", 5.0)
            assert daemon.proc.poll() is None
            lab.leaf.nft(f"delete table inet {hole}\n")
            events = [e for e in ctl_events(sock) if e.get("kind") == "EVENT_KIND_ANNOUNCE"]
            fields = [e.get("fields", {}) for e in events]
            # This boot: first the carried-over detour (previous unknown), then step 4's.
            detours = [f for f in fields if f.get("change") == "detoured"]
            assert [(f["address"], f["via"], f["previous"]) for f in detours] == \
                [(a0, "rail1", "unknown"), (a0, "rail1", "rail0")], fields
            assert any(f.get("change") == "restored" and f["via"] == "rail0" for f in fields)
            missing = next(f for f in fields if f.get("frr") == "missing")
            assert "FRR not running: zebra, bgpd" in missing["problems"], missing
    except BaseException:
        print(host_frr.logs())
        print(leaf_frr.logs())
        if daemon is not None:
            print(daemon.log()[-6000:])
        raise
    finally:
        if daemon is not None:
            daemon.stop()
        lab.leaf.nft(f"table inet {hole} {{}}\ndelete table inet {hole}\n")
        for frr in (host_frr, leaf_frr):
            try:
                frr.stop()
            finally:
                frr.cleanup()
    print("announce via linkpassd:", report)
