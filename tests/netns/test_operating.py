"""Operating a live linkpassd against the real kernel:

  * a port going DOWN shows in health.json, the WatchHealth stream and
    `linkpassctl nccl-env` within one second;
  * `linkpassctl drain` moves a kernel-path flow off the port with zero loss,
    and the drain survives a daemon restart (the rail's route never returns to
    the drained port meanwhile: watched with labs.routewatch);
  * an unprivileged caller can read but not drain;
  * `linkpassctl events --follow` sees a cable pull's verdict and path events
    in order, with no gap in sequence numbers.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import pytest

from labs.daemonproc import DaemonProcess, rail_config_toml
from labs.netnslib import wait_for_sync
from labs.traffic.nsrun import REPO, run_traffic
from linkpassd._proto.linkpass.v1 import control_pb2 as pb
from linkpassd._proto.linkpass.v1 import control_pb2_grpc as pb_grpc

pytestmark = pytest.mark.netns

NH0, NH1 = 1_000_100, 1_000_101
RAIL0_TABLE = 10100
LEAF_DST = "198.18.200.1"  # on the leaf's loopback: reached through either rail
NOBODY = 65534  # uid nobody, gid nogroup on Debian
DEADLINE_S = 15.0


def ctl(sock: str, *args: str, user: int | None = None, timeout: float = 20) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "linkpassd.ctl.main", "--socket", sock, *args]
    if user is not None:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.fixture
def run_dir():
    """A run directory that uid nobody can traverse (pytest's tmp_path is 0700)."""
    path = tempfile.mkdtemp(prefix="lp-ops-", dir="/tmp")
    os.chmod(path, 0o755)
    try:
        yield Path(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def ops(lab, run_dir):
    """Start (and restart) linkpassd with its socket readable by group nogroup."""
    sock = str(run_dir / "ctl.sock")
    cfg = run_dir / "linkpassd.toml"
    cfg.write_text(rail_config_toml(sock, str(run_dir), lab.rails, tick_interval_s=0.1,
                                    daemon_extra='control_group = "nogroup"'))
    procs: list[DaemonProcess] = []

    def start() -> DaemonProcess:
        proc = DaemonProcess(lab.host.name, cfg, sock, run_dir / f"linkpassd{len(procs)}.log")
        procs.append(proc.start())
        proc.wait_ready()
        return proc

    start.sock = sock
    start.health = run_dir / "health.json"
    try:
        yield start
    finally:
        for proc in procs:
            proc.stop()


def usable(health_file: Path) -> dict[str, bool]:
    try:
        doc = json.loads(health_file.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return {p["port"]: p["usable"] for p in doc["ports"]}


class HealthWatcher:
    """WatchHealth in a thread: (arrival time, message) of every document."""

    def __init__(self, sock: str):
        self.seen: list[tuple[float, pb.WatchHealthResponse]] = []
        self.channel = grpc.insecure_channel(f"unix:{sock}")
        self.call = pb_grpc.ControlServiceStub(self.channel).WatchHealth(pb.WatchHealthRequest())
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for message in self.call:
                self.seen.append((time.monotonic(), message))
        except grpc.RpcError:
            pass  # cancelled at close

    def first(self, pred) -> float | None:
        return next((t for t, m in list(self.seen) if pred(m)), None)

    def close(self) -> None:
        self.call.cancel()
        self.thread.join(5)
        self.channel.close()


def port_usable(message: pb.WatchHealthResponse, port: str) -> bool | None:
    return next((p.usable for p in message.ports if p.port == port), None)


def test_a_port_going_down_shows_in_health_json_watchhealth_and_nccl_env_within_a_second(lab, ops):
    ops()
    rail1 = lab.rails[1]
    wait_for_sync(lambda: usable(ops.health) == {"lprail0": True, "lprail1": True}, DEADLINE_S,
                  "both ports usable in health.json")
    watcher = HealthWatcher(ops.sock)
    try:
        wait_for_sync(lambda: watcher.first(lambda m: port_usable(m, "lprail1")), DEADLINE_S,
                      "WatchHealth's first document")
        before = ctl(ops.sock, "nccl-env", "--file", str(ops.health))
        assert before.returncode == 0, before.stderr
        assert "NCCL_SOCKET_IFNAME==lprail0,lprail1" in before.stdout

        cut_at = time.monotonic()
        lab.cut(rail1)
        wait_for_sync(lambda: usable(ops.health).get("lprail1") is False, DEADLINE_S,
                      "lprail1 unusable in health.json")
        file_at = time.monotonic()
        streamed = wait_for_sync(lambda: watcher.first(lambda m: port_usable(m, "lprail1") is False),
                                 DEADLINE_S, "WatchHealth saying lprail1 is unusable")
        print(f"cut -> health.json {file_at - cut_at:.3f}s, WatchHealth {streamed - cut_at:.3f}s")
        assert file_at - cut_at < 1.0, f"health.json changed {file_at - cut_at:.3f}s after the cut"
        assert streamed - cut_at < 1.0, f"WatchHealth changed {streamed - cut_at:.3f}s after the cut"
        time.sleep(max(0.0, cut_at + 1.0 - time.monotonic()))  # what a launcher sees 1 s later
        after = ctl(ops.sock, "nccl-env", "--file", str(ops.health))
        assert after.returncode == 0, after.stderr
        assert "NCCL_SOCKET_IFNAME==lprail0\n" in after.stdout, after.stdout
    finally:
        watcher.close()


def route_watch(lab, src: str, dst: str, duration: float) -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", "netns", "exec", lab.host.name, sys.executable, "-m", "labs.routewatch",
         "--dst", dst, "--src", src, "--duration", str(duration)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_drain_moves_a_kernel_path_flow_with_zero_loss_and_survives_a_restart(lab, ops, tmp_path):
    lab.leaf.ip("addr", "add", f"{LEAF_DST}/32", "dev", "lo")
    for conf in ("all", "lpleaf0", "lpleaf1"):  # the flow arrives on either rail
        subprocess.run(["ip", "netns", "exec", lab.leaf.name, "sysctl", "-qw",
                        f"net.ipv4.conf.{conf}.rp_filter=0"], check=True, timeout=10)
    daemon = ops()
    rail0 = lab.rails[0]
    assert lab.host.route_nhid(RAIL0_TABLE) == NH0

    drained: list[subprocess.CompletedProcess] = []
    run = run_traffic(tmp_path, rx_ns=lab.leaf.name, tx_ns=lab.host.name, mode="kernel-path", dst=LEAF_DST,
                      src=rail0.address, rate=1000, duration=3.0,
                      faults=[(1.0, "drain", lambda: drained.append(
                          ctl(ops.sock, "drain", rail0.port, "--reason", "optic swap, ticket 42")))])
    assert drained[0].returncode == 0, drained[0].stderr
    assert lab.host.route_nhid(RAIL0_TABLE) == NH1  # drain returned after the route moved
    assert run.rx["lost"] == 0, run.rx
    assert run.tx["sent"] > 2500

    watch = route_watch(lab, rail0.address, LEAF_DST, duration=60)
    try:
        daemon.stop()
        again = ops()
        st = again.status()
        port0 = next(p for p in st["ports"] if p["port"] == rail0.port)
        assert port0["verdict"] == "VERDICT_DEGRADED" and port0["drain"]["reason"] == \
            "optic swap, ticket 42"
        assert lab.host.route_nhid(RAIL0_TABLE) == NH1
    finally:
        watch.send_signal(signal.SIGTERM)
        out, err = watch.communicate(timeout=10)
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert lines and lines[0]["event"] == "ready" and lines[0]["oif"] == "lprail1", (out, err)
    assert [e for e in lines if e["event"] == "change"] == [], "the route moved during the restart"

    undrained = ctl(ops.sock, "undrain", rail0.port)
    assert undrained.returncode == 0, undrained.stderr
    wait_for_sync(lambda: lab.host.route_nhid(RAIL0_TABLE) == NH0, DEADLINE_S, "undrain")


def test_an_unprivileged_caller_can_read_but_not_drain(lab, ops):
    ops()
    status = ctl(ops.sock, "status", "-o", "json", user=NOBODY)
    assert status.returncode == 0, status.stderr
    assert {p["port"] for p in json.loads(status.stdout)["ports"]} == {"lprail0", "lprail1"}
    refused = ctl(ops.sock, "drain", "lprail0", "--reason", "not mine to drain", user=NOBODY)
    assert refused.returncode == 4, (refused.returncode, refused.stderr)
    assert "root" in refused.stderr and "uid 65534" in refused.stderr
    assert lab.host.route_nhid(RAIL0_TABLE) == NH0
    st = json.loads(ctl(ops.sock, "status", "-o", "json").stdout)
    assert all(not p.get("drain") for p in st["ports"])


def test_events_follow_sees_a_cable_pull_in_order_with_no_gap(lab, ops):
    daemon = ops()
    last = int(daemon.status()["last_event_seq"])
    follow = subprocess.Popen(
        [sys.executable, "-m", "linkpassd.ctl.main", "--socket", ops.sock, "events", "--follow",
         "--after", str(last), "-o", "json"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    events: list[dict] = []
    pending = b""
    try:
        lab.cut(lab.rails[1])
        deadline = time.monotonic() + DEADLINE_S
        while not any(e["kind"] == "EVENT_KIND_RAIL_PATH" and e["rail"] == "rail1" for e in events):
            left = deadline - time.monotonic()
            assert left > 0, f"no rail1 path event in {events}"
            ready, _, _ = select.select([follow.stdout], [], [], left)  # bounded: never block
            if not ready:
                continue
            chunk = os.read(follow.stdout.fileno(), 65536)
            assert chunk, f"events --follow ended: {follow.stderr.read()!r}"
            pending += chunk
            *lines, pending = pending.split(b"\n")
            events += [json.loads(line)["event"] for line in lines if line.strip()]
    finally:
        follow.send_signal(signal.SIGINT)
        try:
            follow.wait(10)
        except subprocess.TimeoutExpired:
            follow.kill()
            follow.wait(5)
    seqs = [int(e["seq"]) for e in events]
    assert seqs == list(range(last + 1, last + 1 + len(seqs))), seqs
    kinds = [(e["kind"], e["port"]) for e in events]
    verdict = kinds.index(("EVENT_KIND_VERDICT", "lprail1"))
    path = kinds.index(("EVENT_KIND_RAIL_PATH", "lprail1"))
    assert verdict < path
    assert events[verdict]["fields"]["verdict"] == "DOWN"
    assert len({e["boot_id"] for e in events}) == 1
