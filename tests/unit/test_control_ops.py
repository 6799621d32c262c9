"""The control API's operations: events, drains, the health stream, and who
may call what (the credential proxy in front of gRPC).

The server runs on its own loop in a thread (test_control_api.running_server);
events and health documents are published on that loop, as the daemon does.
Authorisation is tested with real processes under other credentials
(setpriv), since the point is what the kernel reports about the caller.
"""

from __future__ import annotations

import asyncio
import grp
import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from linkpassd._proto.linkpass.v1 import control_pb2 as pb
from linkpassd._proto.linkpass.v1 import control_pb2_grpc as pb_grpc
from linkpassd.adapters import control_convert
from linkpassd.adapters.control_access import caller_from_peer
from linkpassd.adapters.control_server import ControlServer
from linkpassd.adapters.feeds import EventFeed, Latest
from linkpassd.core import drain as drains
from linkpassd.core.events import EventKind, EventLog, Severity
from linkpassd.core.healthdoc import HealthDoc, PortHealthRow
from linkpassd.core.model import DrainOutcome, PortState, Verdict
from linkpassd.ctl.render import render_explanation
from test_control_api import (
    WALL_NOW,
    realistic_status,
    run_ctl,
    running_server,
)

pytestmark = pytest.mark.usefixtures("local_zone")

DEADLINE_S = 30.0  # generous: other test runs share this 2-core machine
ADMIN_GROUP = "users"  # exists on Debian (gid 100); uid 65534 is not in it


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def on_loop(server: ControlServer, fn: Callable[[], object]) -> object:
    """Run `fn` on the server's loop (feeds are not thread-safe) and wait."""
    async def call() -> object:
        return fn()
    return asyncio.run_coroutine_threadsafe(call(), server.test_loop).result(DEADLINE_S)  # type: ignore[attr-defined]


def add_events(server: ControlServer, feed: EventFeed, n: int) -> None:
    def append() -> None:
        for _ in range(n):
            seq = feed.log.last_seq + 1
            feed.append(EventKind.VERDICT, "port_verdict", wall=WALL_NOW + seq, mono=1000.0 + seq,
                        severity=Severity.WARNING, port="eth1", rail="rail1",
                        message=f"eth1 is DOWN ({seq})", verdict="DOWN")
        feed.publish()
    on_loop(server, append)


class FakeDrains:
    """DrainControl over core.drain, as the daemon would use it."""

    def __init__(self) -> None:
        self.drains: dict[str, drains.Drain] = {}
        self.calls: list[tuple] = []

    def _state(self, port: str) -> PortState:
        state = PortState(port=port, verdict=Verdict.UP, carrier=True, phase="UP", since=WALL_NOW - 60,
                          evidence=("carrier up",))
        return drains.apply({port: state}, self.drains)[port]

    async def drain(self, port: str, reason: str, duration_s: float | None, by: str) -> DrainOutcome:
        self.calls.append(("drain", port, reason, duration_s, by))
        replaced = self.drains.get(port)
        self.drains[port] = drains.request(port, reason, by, WALL_NOW, duration_s, ("eth0", "eth1"))
        notes = (f"traffic stays on {port} in rail rail1's table 10101: no healthy alternative port",) \
            if len(self.drains) == 2 else ()
        return DrainOutcome(self._state(port), replaced, notes)

    async def undrain(self, port: str, by: str) -> PortState:
        self.calls.append(("undrain", port, by))
        if port not in self.drains:
            raise drains.NotDrained(f"port {port!r} is not drained")
        del self.drains[port]
        return self._state(port)


@pytest.fixture
def feed() -> EventFeed:
    return EventFeed(EventLog(boot_id="b00t", capacity=5))


@pytest.fixture
def fake_drains() -> FakeDrains:
    return FakeDrains()


@pytest.fixture
def ops_server(sock: Path, feed: EventFeed, fake_drains: FakeDrains) -> Iterator[ControlServer]:
    with running_server(sock, realistic_status, events=feed, drains=fake_drains, health=Latest(),
                        admin_group=ADMIN_GROUP) as server:
        yield server


def stub_call(sock: Path, fn: Callable[[pb_grpc.ControlServiceStub], object]) -> object:
    with grpc.insecure_channel(f"unix:{sock}") as channel:
        return fn(pb_grpc.ControlServiceStub(channel))


def rpc_error(sock: Path, fn: Callable[[pb_grpc.ControlServiceStub], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        stub_call(sock, fn)
    return err.value


def ctl_argv(sock: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "linkpassd.ctl.main", "--socket", str(sock), "--timeout", "20", *args]


def as_user(argv: list[str], *, groups: str | None = None) -> list[str]:
    """argv run as uid/gid 65534 (nobody), with only `groups` as supplementary groups."""
    creds = ["--groups", groups] if groups else ["--clear-groups"]
    return ["setpriv", "--reuid", "65534", "--regid", "65534", *creds, *argv]


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/tmp",
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


class LineReader:
    """A child's stdout, line by line, with a deadline (never a bare readline)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.buf = ""

    def line(self) -> str:
        deadline = time.monotonic() + DEADLINE_S
        while "\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line from {self.proc.args} within {DEADLINE_S}s")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 4096).decode()  # type: ignore[union-attr]
                if not chunk:
                    raise AssertionError(f"{self.proc.args} ended: {self.proc.wait(DEADLINE_S)}")
                self.buf += chunk
        line, self.buf = self.buf.split("\n", 1)
        return line


def popen(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()  # our own child, by its handle
        proc.wait(DEADLINE_S)


# --------------------------------------------------------------------------
# events
# --------------------------------------------------------------------------


def test_events_table_lists_in_order_with_after_and_limit(ops_server: ControlServer, feed: EventFeed,
                                                           sock: Path) -> None:
    add_events(ops_server, feed, 3)
    result = run_ctl(sock, "events")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    assert lines[0].split() == ["2027-01-15T09:00:01.000+01:00", "#1", "warning", "verdict", "eth1/rail1",
                                "eth1", "is", "DOWN", "(1)"]
    assert [line.split()[1] for line in lines] == ["#1", "#2", "#3"]
    result = run_ctl(sock, "events", "--after", "1", "--limit", "1")
    assert [line.split()[1] for line in result.stdout.splitlines()] == ["#2"]


def test_events_json_and_missed(ops_server: ControlServer, feed: EventFeed, sock: Path) -> None:
    add_events(ops_server, feed, 8)  # capacity 5: events 1-3 are gone
    result = run_ctl(sock, "events", "--after", "1", "-o", "json")
    data = json.loads(result.stdout)
    assert [e["seq"] for e in data["events"]] == ["4", "5", "6", "7", "8"]  # uint64: JSON strings
    assert data["missed"] == "2" and data["boot_id"] == "b00t" and data["last_seq"] == "8"
    event = data["events"][0]
    assert event["kind"] == "EVENT_KIND_VERDICT" and event["severity"] == "SEVERITY_WARNING"
    assert event["time"] == "2027-01-15T08:00:04Z" and event["fields"] == {"verdict": "DOWN"}
    table = run_ctl(sock, "events", "--after", "1")
    assert table.stderr == ("linkpassctl: warning: 2 events missed (linkpassd no longer holds them; "
                            "its buffer moved on)\n")
    assert len(table.stdout.splitlines()) == 5


def test_follow_prints_held_then_new_events_and_warns_of_missed(ops_server: ControlServer, feed: EventFeed,
                                                                 sock: Path) -> None:
    add_events(ops_server, feed, 8)
    proc = popen(ctl_argv(sock, "events", "--follow", "--after", "1", "--limit", "7", "-o", "json"))
    try:
        out = LineReader(proc)
        first = [json.loads(out.line()) for _ in range(5)]
        add_events(ops_server, feed, 2)  # arrive while the reader follows
        later = [json.loads(out.line()) for _ in range(2)]
        assert proc.wait(DEADLINE_S) == 0  # --limit 7 reached
    finally:
        stop(proc)
    assert [m["event"]["seq"] for m in first + later] == [str(n) for n in range(4, 11)]
    assert [m["missed"] for m in first + later] == ["2"] + ["0"] * 6
    assert "warning: 2 events missed" in proc.stderr.read()  # type: ignore[union-attr]


def test_follow_ends_with_ctrl_c_as_success(ops_server: ControlServer, feed: EventFeed, sock: Path) -> None:
    proc = popen(ctl_argv(sock, "events", "--follow"))
    try:
        out = LineReader(proc)
        # Follow starts after the newest event it saw; keep adding until one shows.
        deadline = time.monotonic() + DEADLINE_S
        while not select.select([proc.stdout], [], [], 0.2)[0]:
            assert time.monotonic() < deadline, "follow printed nothing"
            add_events(ops_server, feed, 1)
        assert "eth1 is DOWN" in out.line()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(DEADLINE_S) == 0
    finally:
        stop(proc)
    assert "Traceback" not in proc.stderr.read()  # type: ignore[union-attr]


def test_follow_ends_cleanly_when_the_server_stops(sock: Path, feed: EventFeed) -> None:
    with running_server(sock, realistic_status, events=feed) as server:
        add_events(server, feed, 1)
        proc = popen(ctl_argv(sock, "events", "--follow", "--after", "0"))
        try:
            assert "#1" in LineReader(proc).line()  # subscribed
            asyncio.run_coroutine_threadsafe(server.stop(5.0), server.test_loop).result(DEADLINE_S)
            assert proc.wait(DEADLINE_S) == 3  # ExitCode.UNREACHABLE: the daemon went away
        finally:
            stop(proc)
    assert proc.stderr.read() == "linkpassctl: linkpassd ended the event stream (it is stopping)\n"  # type: ignore[union-attr]


def test_watch_events_refuses_a_sequence_number_from_another_boot(ops_server: ControlServer, feed: EventFeed,
                                                                  sock: Path) -> None:
    add_events(ops_server, feed, 2)
    err = rpc_error(sock, lambda stub: list(stub.WatchEvents(pb.WatchEventsRequest(after_seq=99), timeout=20)))
    assert err.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "after_seq 99 is past this boot's newest event (2, boot b00t)" in err.details()


def test_a_boot_id_of_another_boot_is_refused_saying_to_start_again(ops_server: ControlServer,
                                                                    feed: EventFeed, sock: Path) -> None:
    """Sequence numbers restart with each boot: a reader resuming after a
    daemon restart must be told, not given the new boot's events as if
    they followed its old position."""
    add_events(ops_server, feed, 3)
    for call in (lambda s: s.ListEvents(pb.ListEventsRequest(after_seq=1, boot_id="old-boot"), timeout=20),
                 lambda s: list(s.WatchEvents(pb.WatchEventsRequest(after_seq=1, boot_id="old-boot"),
                                              timeout=20))):
        err = rpc_error(sock, call)
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert err.details() == ("boot_id 'old-boot' is not this daemon's boot ('b00t'): linkpassd restarted "
                                 "and that boot's events are gone; start again with after_seq 0")
    same = stub_call(sock, lambda s: s.ListEvents(pb.ListEventsRequest(after_seq=1, boot_id="b00t"), timeout=20))
    assert [e.seq for e in same.events] == [2, 3]  # type: ignore[attr-defined]
    unchecked = stub_call(sock, lambda s: s.ListEvents(pb.ListEventsRequest(after_seq=1), timeout=20))
    assert [e.seq for e in unchecked.events] == [2, 3]  # type: ignore[attr-defined]


def test_events_boot_id_option_with_and_without_follow(ops_server: ControlServer, feed: EventFeed,
                                                       sock: Path) -> None:
    add_events(ops_server, feed, 3)
    result = run_ctl(sock, "events", "--after", "1", "--boot-id", "b00t")
    assert result.exit_code == 0, result.output
    assert [line.split()[1] for line in result.stdout.splitlines()] == ["#2", "#3"]
    for follow in ([], ["--follow"]):
        refused = run_ctl(sock, "events", "--after", "1", "--boot-id", "old-boot", *follow)
        assert refused.exit_code == 1 and refused.stdout == ""
        assert "boot_id 'old-boot' is not this daemon's boot ('b00t')" in refused.stderr
        assert "start again with after_seq 0" in refused.stderr
    proc = popen(ctl_argv(sock, "events", "--follow", "--after", "1", "--boot-id", "b00t", "--limit", "2"))
    try:
        out = LineReader(proc)
        assert [out.line().split()[1] for _ in range(2)] == ["#2", "#3"]
        assert proc.wait(DEADLINE_S) == 0
    finally:
        stop(proc)


def test_without_providers_the_new_rpcs_are_unimplemented(sock: Path) -> None:
    with running_server(sock, realistic_status):
        for call in (lambda s: s.ListEvents(pb.ListEventsRequest(), timeout=20),
                     lambda s: list(s.WatchEvents(pb.WatchEventsRequest(), timeout=20)),
                     lambda s: list(s.WatchHealth(pb.WatchHealthRequest(), timeout=20)),
                     lambda s: s.Drain(pb.DrainRequest(port="eth1", reason="x"), timeout=20),
                     lambda s: s.Undrain(pb.UndrainRequest(port="eth1"), timeout=20)):
            assert rpc_error(sock, call).code() == grpc.StatusCode.UNIMPLEMENTED


# --------------------------------------------------------------------------
# drains
# --------------------------------------------------------------------------


def test_drain_and_undrain_as_root(ops_server: ControlServer, fake_drains: FakeDrains, sock: Path) -> None:
    result = run_ctl(sock, "drain", "eth1", "--reason", "optic swap INC-4711", "--for", "1h30m")
    assert result.exit_code == 0, result.output
    assert fake_drains.calls == [("drain", "eth1", "optic swap INC-4711", 5400.0, "root (uid 0)")]
    # (the in-process server's log line may come first on the captured stdout)
    assert result.stdout.splitlines()[-2:] == [
        "eth1 drained by root (uid 0) since 2027-01-15T09:00:00+01:00, until 2027-01-15T10:30:00+01:00: "
        "optic swap INC-4711",
        "verdict now DEGRADED (UP): drained by root (uid 0): optic swap INC-4711; carrier up"]
    undrained = run(ctl_argv(sock, "undrain", "eth1", "-o", "json"))  # a process: stdout is only its own
    assert undrained.returncode == 0, undrained.stderr
    state = json.loads(undrained.stdout)["state"]
    assert state["verdict"] == "VERDICT_UP" and state["drain"] is None
    assert fake_drains.calls[-1] == ("undrain", "eth1", "root (uid 0)")


def test_undrain_says_the_port_was_undrained(ops_server: ControlServer, fake_drains: FakeDrains,
                                            sock: Path) -> None:
    """Issue 28: a successful undrain printed "eth1 is not drained"."""
    assert run_ctl(sock, "drain", "eth1", "--reason", "optic swap").exit_code == 0
    result = run_ctl(sock, "undrain", "eth1")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-2:] == ["eth1 undrained", "verdict now UP (UP): carrier up"]
    again = run_ctl(sock, "undrain", "eth1")
    assert again.exit_code == 5 and "port 'eth1' is not drained" in again.stderr


def test_a_second_drain_shows_the_drain_it_replaced(ops_server: ControlServer, fake_drains: FakeDrains,
                                                   sock: Path) -> None:
    """Issue 28: a second drain silently replaced the first's --for."""
    assert run_ctl(sock, "drain", "eth1", "--reason", "optic swap", "--for", "30m").exit_code == 0
    result = run_ctl(sock, "drain", "eth1", "--reason", "optic swap, vendor late", "--for", "2h")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert ("eth1 drained by root (uid 0) since 2027-01-15T09:00:00+01:00, until 2027-01-15T11:00:00+01:00: "
            "optic swap, vendor late") in lines
    assert ("replaces the earlier drain by root (uid 0) since 2027-01-15T09:00:00+01:00, "
            "until 2027-01-15T09:30:00+01:00: optic swap") in lines
    doc = json.loads(run(ctl_argv(sock, "drain", "eth1", "--reason", "x", "-o", "json")).stdout)
    assert doc["replaced"]["reason"] == "optic swap, vendor late" and doc["notes"] == []


def test_a_drain_with_no_healthy_alternative_says_traffic_stays(ops_server: ControlServer,
                                                               fake_drains: FakeDrains, sock: Path) -> None:
    """Issue 28: a drain that cannot move traffic just said "drained"."""
    assert run_ctl(sock, "drain", "eth0", "--reason", "rack move").exit_code == 0
    result = run_ctl(sock, "drain", "eth1", "--reason", "rack move")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == (
        "traffic stays on eth1 in rail rail1's table 10101: no healthy alternative port")


def test_drain_errors_have_their_codes(ops_server: ControlServer, fake_drains: FakeDrains, sock: Path) -> None:
    def code(request: pb.DrainRequest | pb.UndrainRequest) -> tuple[grpc.StatusCode, str]:
        if isinstance(request, pb.DrainRequest):
            err = rpc_error(sock, lambda s: s.Drain(request, timeout=20))
        else:
            err = rpc_error(sock, lambda s: s.Undrain(request, timeout=20))
        return err.code(), err.details()

    assert code(pb.DrainRequest(port="eth9", reason="x")) == (
        grpc.StatusCode.NOT_FOUND, "port 'eth9' is not a rail's port; rail ports: eth0, eth1")
    assert code(pb.UndrainRequest(port="eth0")) == (grpc.StatusCode.NOT_FOUND, "port 'eth0' is not drained")
    assert code(pb.DrainRequest(port="eth1", reason="  ")) == (
        grpc.StatusCode.INVALID_ARGUMENT, "a drain needs a reason (--reason): the next person on call reads it")
    assert code(pb.DrainRequest(port="eth1", reason="x", duration_s=-5)) == (
        grpc.StatusCode.INVALID_ARGUMENT, "duration_s must be 0 (until undrained) or more, not -5.0")
    assert code(pb.DrainRequest(port="", reason="x")) == (grpc.StatusCode.INVALID_ARGUMENT, "no port given")
    assert fake_drains.drains == {}


def test_drain_with_a_bad_duration_is_a_usage_error(ops_server: ControlServer, fake_drains: FakeDrains,
                                                    sock: Path) -> None:
    result = run_ctl(sock, "drain", "eth1", "--reason", "x", "--for", "90")
    assert result.exit_code == 2
    assert "Invalid value for '--for': duration '90' is not understood" in result.stderr
    assert fake_drains.calls == []  # refused before asking the daemon


def test_status_links_and_explain_show_who_drained_why_and_until(sock: Path) -> None:
    status = realistic_status()  # eth1 drained by alice until WALL_NOW + 3000
    with running_server(sock, lambda: status):
        shown = run_ctl(sock, "status").stdout
        links = run_ctl(sock, "links").stdout
    row = "eth1     alice (uid 1000)  10m00s ago  2027-01-15T09:50:00+01:00 (in 50m00s)  optic swap, INC-4711"
    assert row in shown.splitlines()
    assert row in links.splitlines()
    eth1 = control_convert.port_state_to_proto(status.ports[1])
    explained = render_explanation(pb.ExplainPortResponse(port="eth1", state=eth1, served_at=WALL_NOW))
    assert ("drained   by alice (uid 1000) 10m00s ago, until 2027-01-15T09:50:00+01:00 (in 50m00s): "
            "optic swap, INC-4711") in explained.splitlines()


# --------------------------------------------------------------------------
# who may call what: the credential proxy
# --------------------------------------------------------------------------


def test_unprivileged_caller_reads_but_may_not_drain(ops_server: ControlServer, fake_drains: FakeDrains,
                                                     sock: Path) -> None:
    read = run(as_user(ctl_argv(sock, "status", "-o", "json")))
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout)["hostname"] == "gpu-node-017"
    refused = run(as_user(ctl_argv(sock, "drain", "eth1", "--reason", "try")))
    assert refused.returncode == 4  # ExitCode.REFUSED
    assert refused.stderr == ("linkpassctl: drain needs root or membership of group users (admin_group); "
                              "you are nobody (uid 65534)\n")
    refused = run(as_user(ctl_argv(sock, "undrain", "eth1")))
    assert refused.returncode == 4 and "undrain needs root" in refused.stderr
    assert fake_drains.calls == []


def test_member_of_the_admin_group_may_drain(ops_server: ControlServer, fake_drains: FakeDrains,
                                             sock: Path) -> None:
    """The supplementary group (SO_PEERGROUPS) is what makes it an admin."""
    gid = grp.getgrnam(ADMIN_GROUP).gr_gid
    result = run(as_user(ctl_argv(sock, "drain", "eth1", "--reason", "maintenance"), groups=str(gid)))
    assert result.returncode == 0, result.stderr
    assert fake_drains.calls == [("drain", "eth1", "maintenance", None, "nobody (uid 65534)")]


def test_a_member_of_more_than_256_groups_is_served_and_judged_on_all_of_them(
        ops_server: ControlServer, fake_drains: FakeDrains, sock: Path) -> None:
    """SO_PEERGROUPS answers ERANGE for more groups than fit in the 1024
    bytes Python's getsockopt allows; /proc/<pid>/status has them all."""
    admin = grp.getgrnam(ADMIN_GROUP).gr_gid
    many = ",".join(str(g) for g in [*range(20000, 20300), admin])
    read = run(as_user(ctl_argv(sock, "status", "-o", "json"), groups=many))
    assert read.returncode == 0, read.stderr
    result = run(as_user(ctl_argv(sock, "drain", "eth1", "--reason", "maintenance"), groups=many))
    assert result.returncode == 0, result.stderr
    assert fake_drains.calls == [("drain", "eth1", "maintenance", None, "nobody (uid 65534)")]


def test_without_admin_group_only_root_may_drain(sock: Path, fake_drains: FakeDrains) -> None:
    with running_server(sock, realistic_status, drains=fake_drains):
        refused = run(as_user(ctl_argv(sock, "drain", "eth1", "--reason", "try")))
    assert refused.returncode == 4
    assert refused.stderr == ("linkpassctl: admin_group is not set: only root may drain; "
                              "you are nobody (uid 65534)\n")


def test_a_caller_that_bypasses_the_proxy_is_read_only(ops_server: ControlServer, sock: Path) -> None:
    """Straight to the private gRPC socket (only root can reach it): the peer
    name says nothing, so nothing is allowed beyond reading."""
    err = rpc_error(ops_server.grpc_socket, lambda s: s.Drain(pb.DrainRequest(port="eth1", reason="x"), timeout=20))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert err.details().endswith("you are an unidentified caller")


def test_peer_names_parse_only_inside_the_private_dir() -> None:
    private = Path("/run/linkpass/linkpassd.private")
    caller = caller_from_peer("unix:/run/linkpass/linkpassd.private/c7-u1000-p4242-admin", private)
    assert caller is not None and (caller.uid, caller.pid, caller.admin) == (1000, 4242, True)
    read = caller_from_peer("unix:/run/linkpass/linkpassd.private/c8-u0-p1-read", private)
    assert read is not None and not read.admin
    for forged in ("unix:/tmp/linkpassd.private/c7-u0-p1-admin",
                   "unix:/run/linkpass/linkpassd.private/x/c7-u0-p1-admin",
                   "unix:/run/linkpass/linkpassd.private/c7-u0-p1-admin-x", "unix:", "ipv4:127.0.0.1:1", ""):
        assert caller_from_peer(forged, private) is None, forged


def test_sockets_modes_and_group(ops_server: ControlServer, sock: Path) -> None:
    st = os.stat(sock)
    assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == grp.getgrnam("nogroup").gr_gid
    private = os.stat(ops_server.private_dir)
    assert stat.S_IMODE(private.st_mode) == 0o700 and private.st_uid == os.geteuid()
    assert sorted(os.listdir(ops_server.private_dir)) == ["grpc.sock"]  # caller names are unlinked


def test_missing_control_group_makes_the_socket_root_only(sock: Path) -> None:
    with running_server(sock, realistic_status, group="lp-no-such-group"):
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        refused = run(as_user(ctl_argv(sock, "status")))
    assert refused.returncode == 4 and "permission denied" in refused.stderr


def test_connections_over_the_cap_are_closed(sock: Path) -> None:
    with running_server(sock, realistic_status, max_connections=1) as server:
        first = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        second = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            first.connect(str(sock))
            wait_for(lambda: server._proxy is not None and server._proxy.active == 1, "the first connection")
            second.connect(str(sock))
            second.settimeout(DEADLINE_S)
            assert second.recv(1) == b""  # closed at once, not queued
        finally:
            first.close()
            second.close()
        wait_for(lambda: server._proxy is not None and server._proxy.active == 0, "the relay to end")
        assert run_ctl(sock, "status").exit_code == 0  # room again


# Run as another uid: connect N times to the socket, wait (bounded) until
# EXPECT of those connections are closed by the proxy, print "closed K" and
# hold the rest open until stdin closes.  Data the server sends (HTTP/2
# settings) is read and dropped; only EOF counts as closed.
_HOLD_CONNECTIONS = """
import select, socket, sys, time
path, n, expect = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
socks = []
for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    socks.append(s)
open_ = list(socks)
deadline = time.monotonic() + float(sys.argv[4])
while len(socks) - len(open_) < expect and time.monotonic() < deadline:
    ready, _, _ = select.select(open_, [], [], max(0.0, deadline - time.monotonic()))
    for s in ready:
        if not s.recv(65536):
            open_.remove(s)
print("closed", len(socks) - len(open_), flush=True)
sys.stdin.read()
"""


def hold_connections(sock: Path, uid: int, n: int, expect_closed: int) -> subprocess.Popen[str]:
    argv = ["setpriv", "--reuid", str(uid), "--regid", "65534", "--clear-groups",
            sys.executable, "-c", _HOLD_CONNECTIONS, str(sock), str(n), str(expect_closed), str(DEADLINE_S / 2)]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd="/tmp")


def test_a_read_only_user_cannot_take_the_connections_root_and_admins_need(sock: Path) -> None:
    """Limits by caller: 8 connections per non-admin uid, and non-admins
    together at most max_connections - 8, so root and admin_group always
    find a free slot.  Before, 64 `events --follow` of one reader locked root
    out of drain."""
    holders: list[subprocess.Popen[str]] = []
    with running_server(sock, realistic_status, max_connections=24, admin_group=ADMIN_GROUP) as server:
        proxy = server._proxy
        assert proxy is not None
        try:
            for uid, n, closed, readers in ((65534, 9, 1, 8),  # the 9th of one uid: refused
                                            (65533, 8, 0, 16),  # another uid fills the read-only room
                                            (65532, 1, 1, 16)):  # a third finds none left
                holders.append(hold_connections(sock, uid, n, closed))
                assert LineReader(holders[-1]).line() == f"closed {closed}"
                wait_for(lambda readers=readers: proxy.readers == readers == proxy.active,
                         f"{readers} relayed connections")
            assert proxy.refused == 2
            assert run_ctl(sock, "status").exit_code == 0  # root
            admin = run(as_user(ctl_argv(sock, "status"), groups=str(grp.getgrnam(ADMIN_GROUP).gr_gid)))
            assert admin.returncode == 0, admin.stderr  # uid 65534 again, but in admin_group
            refused = run(as_user(ctl_argv(sock, "status")))
            assert refused.returncode != 0  # the same uid without it is over its limit
        finally:
            for proc in holders:
                stop(proc)
        wait_for(lambda: proxy.active == 0 and proxy.readers == 0, "the relays to end")
        assert run(as_user(ctl_argv(sock, "status"))).returncode == 0  # room again


# --------------------------------------------------------------------------
# health stream and reflection
# --------------------------------------------------------------------------


def health_doc(generation: int, verdict: Verdict) -> HealthDoc:
    return HealthDoc(hostname="gpu-node-017", boot_id="b00t", generation=generation, written_at=WALL_NOW,
                     valid_until=WALL_NOW + 10, pid=4242,
                     ports=(PortHealthRow("eth1", "rail1", "mlx5_1", 1, verdict, WALL_NOW - 5, "carrier lost",
                                          False),
                            PortHealthRow("eth2", "rail2", "", 0, None, 0.0, "not judged yet", False)))


def test_watch_health_sends_the_current_document_then_each_new_one(sock: Path) -> None:
    latest: Latest[HealthDoc] = Latest()
    with running_server(sock, realistic_status, health=latest) as server:
        on_loop(server, lambda: latest.publish(health_doc(1, Verdict.UP)))
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            stream = pb_grpc.ControlServiceStub(channel).WatchHealth(pb.WatchHealthRequest(), timeout=DEADLINE_S)
            first = next(stream)
            on_loop(server, lambda: latest.publish(health_doc(2, Verdict.DOWN)))
            second = next(stream)
            stream.cancel()
    assert (first.generation, first.ports[0].verdict, first.ports[0].usable) == (1, pb.VERDICT_UP, True)
    assert (second.generation, second.ports[0].verdict, second.ports[0].usable) == (2, pb.VERDICT_DOWN, False)
    assert first.ports[0].rdma_device == "mlx5_1" and first.valid_until.seconds == int(WALL_NOW + 10)
    assert not first.ports[1].HasField("since") and first.ports[1].verdict == pb.VERDICT_UNSPECIFIED


def test_server_reflection_lists_the_services(ops_server: ControlServer, sock: Path) -> None:
    with grpc.insecure_channel(f"unix:{sock}") as channel:
        services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
        file = ProtoReflectionDescriptorDatabase(channel).FindFileContainingSymbol("linkpass.v1.ControlService")
    assert {"linkpass.v1.ControlService", "grpc.health.v1.Health"} <= services
    assert file.name == "linkpass/v1/control.proto"


def test_a_socket_path_too_long_for_callers_names_beside_it_still_serves(sock: Path) -> None:
    """Any control_socket the config accepts must work: when
    `<stem>.private/<caller name>` would pass the 107-byte limit, the private
    directory goes to a fresh 0700 temporary directory instead."""
    deep = sock.parent / ("d" * 60) / "linkpassd.sock"
    assert len(str(deep)) < 107 < len(str(deep.with_name("linkpassd.private"))) + 40
    with running_server(deep, realistic_status) as srv:
        assert not str(srv.private_dir).startswith(str(deep.parent))
        assert stat.S_IMODE(os.stat(srv.private_dir).st_mode) == 0o700
        result = run_ctl(deep, "status", "-o", "json")
        assert result.exit_code == 0, result.output
        private = srv.private_dir
    assert not private.exists()  # removed at stop
