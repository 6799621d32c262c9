"""linkpassd keeps its reasons and keeps protecting, against the real kernel:

  * a restart or a reload during a silent blackhole keeps the rail's traffic
    on its backup until its own probes prove the path healthy (carrier is up
    all along, so a daemon that forgot would trust it at once);
  * a BFD rail whose port is missing at start is reported and retried, and
    the daemon protects every other rail meanwhile;
  * a foreign nexthop squatting on one of our ids is named as a conflict and
    does not delay another rail's failover.

Ids and tables are read from the daemon and the kernel, never assumed."""

from __future__ import annotations

import os
import signal
import time

import pytest

from labs.daemonproc import DaemonProcess, assessment, rail_config_toml
from labs.echopeer import EchoPeerProcess
from labs.netnslib import HostLab, wait_for_sync

pytestmark = pytest.mark.netns

QUIET_S = 4.0  # well past rise x interval + hold-down (1 s) of the test configs


def table_of(status: dict, rail: str) -> int:
    return next(r["table"] for r in status["rails"] if r["name"] == rail)


def nexthop_of(host, port: str) -> int:
    return next(n["id"] for n in host.ipj("nexthop", "show") if n.get("dev") == port)


def port_state(status: dict, port: str) -> dict:
    return next(p for p in status["ports"] if p["port"] == port)


def blackhole(lab, rail, table: str) -> None:
    lab.leaf.nft(f"table inet {table} {{\n"
                 f'  chain in {{ type filter hook input priority 0; iifname "{rail.peer}" drop; }}\n'
                 f'  chain out {{ type filter hook output priority 0; oifname "{rail.peer}" drop; }}\n'
                 "}\n")


def unblackhole(lab, table: str) -> None:
    """Remove the blackhole, whether or not it was put in place (declaring
    the table first makes the delete safe in one nft transaction)."""
    lab.leaf.nft(f"table inet {table} {{}}\ndelete table inet {table}\n")


def failed_over_by_blackhole(lab, probed, nft_table: str) -> tuple[int, int, int]:
    """Echo up on rail0, then rail0 blackholed until its table is on its
    backup: (rail0's table, its own nexthop, the backup's nexthop)."""
    rail0 = lab.rails[0]
    table0 = table_of(probed.status(), "rail0")
    wait_for_sync(lambda: assessment(probed.status(), rail0.port, "echo").get("status") == "ok",
                  5.0, "echo up on rail0")
    own, backup = nexthop_of(lab.host, rail0.port), nexthop_of(lab.host, lab.rails[1].port)
    blackhole(lab, rail0, nft_table)
    wait_for_sync(lambda: lab.host.route_nhid(table0) == backup, 5.0, "rail0 on its backup")
    return table0, own, backup


def stays(pred, seconds: float, what: str) -> None:
    """`pred` holds at every look for `seconds` (a negative claim needs a window)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert pred(), what
        time.sleep(0.05)


@pytest.mark.parametrize("memory", ["verdict-file", "kernel-only"])
def test_a_restart_during_a_silent_blackhole_keeps_the_rail_on_its_backup(lab, echo_daemon, tmp_path,
                                                                          memory):
    rail0 = lab.rails[0]
    nft_table = f"lp_rsthole{os.getpid()}"
    with EchoPeerProcess(lab.leaf.name, duration=90):
        probed = echo_daemon()
        try:
            table0, own, backup = failed_over_by_blackhole(lab, probed, nft_table)
            probed.stop()
            if memory == "kernel-only":  # no verdict file: only the kernel remembers
                os.unlink(tmp_path / "state" / "verdicts.json")
            again = echo_daemon()
            eth0 = port_state(again.status(), rail0.port)
            assert eth0["verdict"] != "VERDICT_UP", eth0
            reason = " ".join(eth0["evidence"])
            assert ("before restart" if memory == "verdict-file" else "found failed over") in reason
            stays(lambda: lab.host.route_nhid(table0) == backup, QUIET_S,
                  "rail0 went back onto the blackholed path after the restart")
        finally:
            unblackhole(lab, nft_table)
        # its own probes prove it: then, and only then, it returns
        wait_for_sync(lambda: lab.host.route_nhid(table0) == own, 15.0, "rail0 back on its path")
        assert port_state(again.status(), rail0.port)["verdict"] == "VERDICT_UP"


def test_a_reload_that_restarts_the_probes_keeps_a_blackholed_rail_on_its_backup(lab, echo_daemon):
    rail0 = lab.rails[0]
    nft_table = f"lp_rldhole{os.getpid()}"
    with EchoPeerProcess(lab.leaf.name, duration=90):
        probed = echo_daemon()
        try:
            table0, own, backup = failed_over_by_blackhole(lab, probed, nft_table)
            # new probe timers: the echo service starts anew, its paths never up
            text = probed.config_path.read_text()
            assert "interval_ms = 50" in text
            probed.config_path.write_text(text.replace("interval_ms = 50", "interval_ms = 40"))
            os.kill(probed.proc.pid, signal.SIGHUP)
            wait_for_sync(lambda: "reloaded" in probed.log(), 5.0, "reload done")
            stays(lambda: lab.host.route_nhid(table0) == backup, QUIET_S,
                  "rail0 went back onto the blackholed path after the reload")
            eth0 = port_state(probed.status(), rail0.port)
            assert eth0["verdict"] == "VERDICT_DOWN", eth0
        finally:
            unblackhole(lab, nft_table)
        wait_for_sync(lambda: lab.host.route_nhid(table0) == own, 15.0, "rail0 back on its path")


def start_daemon(lab: HostLab, tmp_path, **kwargs) -> DaemonProcess:
    sock = str(tmp_path / "ctl.sock")
    cfg = tmp_path / "linkpassd.toml"
    cfg.write_text(rail_config_toml(sock, str(tmp_path), lab.rails, **kwargs))
    return DaemonProcess(lab.host.name, cfg, sock, tmp_path / "linkpassd.log")


def test_a_bfd_port_missing_at_start_is_reported_retried_and_the_rest_protected(netns_factory,
                                                                                tmp_path):
    lab = HostLab.build(netns_factory, n_rails=2)
    rail0, rail1 = lab.rails
    hidden = f"lpgone{os.getpid() % 100000}"
    lab.host.ip("link", "set", rail1.port, "down")
    lab.host.ip("link", "set", rail1.port, "name", hidden)  # the NIC "fell off the bus"
    with start_daemon(lab, tmp_path, bfd=True) as daemon:
        st = daemon.wait_ready()
        problems = [p for p in st.get("problems", []) if p["kind"] == "bfd"]
        assert problems and rail1.port in problems[0]["what"], st.get("problems")
        table0, table1 = table_of(st, "rail0"), table_of(st, "rail1")
        nh0 = nexthop_of(lab.host, rail0.port)
        assert lab.host.route_nhid(table0) == nh0
        assert lab.host.route_nhid(table1) == nh0  # rail1's traffic protected on rail0
        # the NIC comes back: the session starts on the next retry
        lab.host.ip("link", "set", hidden, "name", rail1.port)
        lab.host.ip("link", "set", rail1.port, "up")
        wait_for_sync(lambda: not [p for p in daemon.status().get("problems", [])
                                   if p["kind"] == "bfd"], 10.0, "BFD session started after retry")
        assert "bfd_session_started" in daemon.log()


def test_a_foreign_nexthop_on_our_id_does_not_delay_another_rails_failover(netns_factory, tmp_path):
    lab = HostLab.build(netns_factory, n_rails=3)
    rail0, rail1, rail2 = lab.rails
    with start_daemon(lab, tmp_path) as daemon:
        st = daemon.wait_ready()
        squatted = nexthop_of(lab.host, rail2.port)
        nh0 = nexthop_of(lab.host, rail0.port)
        table1 = table_of(st, "rail1")
    # While linkpassd is stopped another tool takes rail2's nexthop id.
    lab.host.ip("nexthop", "del", "id", str(squatted))
    lab.host.ip("nexthop", "add", "id", str(squatted), "via", rail2.gateway, "dev", rail2.port,
                "proto", "static")
    with start_daemon(lab, tmp_path) as daemon:
        st = daemon.wait_ready()
        conflicts = [p for p in st.get("problems", []) if p["kind"] in ("conflict", "refused")]
        assert conflicts and str(squatted) in conflicts[0]["what"], st.get("problems")
        assert conflicts[0]["since"] > 0
        cut = time.monotonic()
        lab.cut(rail1)
        wait_for_sync(lambda: lab.host.route_nhid(table1) == nh0, 5.0, "rail1 failed over to rail0")
        moved = time.monotonic() - cut
        # A carrier failover takes ~5 ms here (labs/bench/carrier_failover); the
        # bound is generous for a busy machine, and far below a stalled loop.
        assert moved < 1.0, moved
        assert "write_refused" in daemon.log()
        # untouched: the foreign nexthop is still the other tool's
        (nh,) = [n for n in lab.host.ipj("nexthop", "show") if n["id"] == squatted]
        assert nh["protocol"] == "static"
