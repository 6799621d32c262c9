"""The local control API end to end: model -> gRPC over a Unix socket -> linkpassctl.

The server runs on its own event loop in a thread (as it would inside the
daemon) and linkpassctl is driven through click's CliRunner, or as a real
process where stderr and exit codes are the point.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import enum
import json
import os
import re
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner, Result
from grpc_health.v1 import health_pb2, health_pb2_grpc

from linkpassd._proto.linkpass.v1 import control_pb2 as pb
from linkpassd.adapters import control_convert
from linkpassd.adapters.control_server import ControlServer, ControlSocketError
from linkpassd.core.explain import Explanation
from linkpassd.core.model import (
    AgentLinkStatus,
    Assessment,
    CounterSample,
    DaemonStatus,
    Drain,
    GroupStatus,
    LinkSample,
    ModuleIdentity,
    OneWayDelay,
    OpticsReading,
    PortSensors,
    PortState,
    Problem,
    RailStatus,
    ResponderCounters,
    Thresholds,
    Verdict,
)
from linkpassd.ctl import main as ctl

WALL_NOW = 1_800_000_000.0  # unix time while serving


pytestmark = pytest.mark.usefixtures("local_zone")


def realistic_sensors() -> tuple[PortSensors, ...]:
    """eth0: a 4-lane QSFP28 with every reading, level and counter given
    (lane 2 reads low); eth1: the module cannot be read, the link is down."""
    return (
        PortSensors(
            port="eth0",
            optics=OpticsReading(
                identity=ModuleIdentity(spec="SFF-8636", form_factor="QSFP28", vendor="FS", part="QSFP28-SR4-100G",
                                        serial="F2031234567", revision="A", spec_revision="2.10"),
                temperature_c=38.5,
                voltage_v=3.29,
                tx_bias_ma=(6.6, 6.5, 6.7, 6.4),
                tx_power_dbm=(-0.8, -0.9, -0.7, -1.0),
                rx_power_dbm=(-1.6, -1.8, -9.2, -1.7),
                thresholds=(
                    ("temperature_c", Thresholds(high_alarm=75.0, high_warn=70.0, low_warn=-5.0, low_alarm=-10.0)),
                    ("voltage_v", Thresholds(high_alarm=3.63, high_warn=3.47, low_warn=3.13, low_alarm=2.97)),
                    ("tx_bias_ma", Thresholds(high_alarm=12.0, high_warn=11.0, low_warn=2.0, low_alarm=1.0)),
                    ("tx_power_dbm", Thresholds(high_alarm=5.0, high_warn=3.0, low_warn=-6.4, low_alarm=-8.4)),
                    ("rx_power_dbm", Thresholds(high_alarm=5.4, high_warn=3.4, low_warn=-8.4, low_alarm=-10.4)),
                ),
                flags=frozenset({"rx_power_low_warn[2]"}),
            ),
            counters=CounterSample(port="eth0", rx_crc_errors=1204, symbol_errors=3, length_errors=1, rx_missed=88,
                                   fec_corrected=2_147_483_651, fec_uncorrectable=7, link_down_events=2,
                                   ext_state="Link training failure", ext_substate="KR link partner did not set "
                                   "receiver ready"),
            assessments=(
                Assessment("counters", Verdict.UP, "ok", "CRC 0.2/s, symbol 0.0/s over 10s"),
                Assessment("optics", Verdict.DEGRADED, "degraded",
                           "lane 2 RX -9.20 dBm below low warning -8.4 (1 of 3 readings)", confirmed=False),
                Assessment("flaps", Verdict.UP, "ok", "penalty 12 (suppress at 2500)"),
                Assessment("probe", Verdict.DEGRADED, "degraded",
                           "2 of 3 peers degraded or down: 198.18.1.7, 198.18.1.8; loss towards "
                           "the peers, replies fine (our transmit direction)",
                           direction="requests"),
                Assessment("probe:198.18.1.7", Verdict.UP, "ok", "rtt 0.08 ms", direction="none",
                           one_way=OneWayDelay(41e-6, 38e-6, 3e-6, "chrony ±1 us here, ±2 us at "
                                               "the peer", samples=64)),
                Assessment("probe:198.18.1.8", Verdict.UP, "ok", "rtt 0.09 ms", direction="none",
                           one_way=OneWayDelay(refused="the peer's clock is not synchronised "
                                                       "(its responder reports no error bound)")),
            ),
        ),
        PortSensors(
            port="eth1",
            optics_unreadable="eth1: module EEPROM page 0x11: Input/output error",
            counters=CounterSample(port="eth1", rx_crc_errors=0, fec_uncorrectable=0, link_down_events=6,
                                   ext_state="No cable"),
            assessments=(Assessment("optics", None, "unreadable",
                                    "eth1: module EEPROM page 0x11: Input/output error"),),
        ),
    )


def realistic_status() -> DaemonStatus:
    """Two rails; eth1 lost carrier, so rail1's table fails over to rail0.

    Every field has a non-default value so a dropped field shows up in JSON.
    """
    return DaemonStatus(
        hostname="gpu-node-017",
        version="0.1.0",
        config_source="/etc/linkpass/linkpassd.toml",
        started_at=WALL_NOW - 3723,  # up 1h02m03s
        ports=(
            PortState(port="eth0", verdict=Verdict.UP, carrier=True, phase="UP", since=WALL_NOW - 3600,
                      evidence=("carrier up", "3/3 good samples")),
            PortState(port="eth1", verdict=Verdict.DOWN, carrier=False, phase="DOWN", since=WALL_NOW - 42,
                      evidence=("carrier lost", "operstate LOWERLAYERDOWN"),
                      drain=Drain(port="eth1", reason="optic swap, INC-4711", by="alice (uid 1000)",
                                  at=WALL_NOW - 600, until=WALL_NOW + 3000)),
        ),
        links=(
            LinkSample(port="eth0", present=True, ifindex=2, admin_up=True, carrier=True, operstate="UP",
                       carrier_up_count=3, carrier_down_count=2),
            LinkSample(port="eth1", present=True, ifindex=3, admin_up=True, carrier=False,
                       operstate="LOWERLAYERDOWN", carrier_up_count=5, carrier_down_count=6),
        ),
        rails=(
            RailStatus(name="rail0", port="eth0", address="198.18.0.1", table=10100,
                       active_rail="rail0", active_port="eth0"),
            RailStatus(name="rail1", port="eth1", address="198.18.1.1", table=10101,
                       active_rail="rail0", active_port="eth0"),
        ),
        groups=(
            GroupStatus(name="gpu-fabric", destination="10.200.0.0/16", table=10150,
                        members=("rail0",), min_paths=1),
        ),
        reconciles=4242,
        netlink_writes=17,
        last_reconcile_at=WALL_NOW - 2,
        last_error="netlink: RTM_NEWROUTE table 10101: Network is unreachable",
        last_error_at=WALL_NOW - 12,
        reconcile_failures=2,
        responder=ResponderCounters(answered=91234, refused_address=3, refused_source=150000,
                                    rate_limited=12, malformed=7),
        sensors=realistic_sensors(),
        problems=(Problem("conflict", "create nexthop 1000100 (eth0 via 198.18.0.254)",
                          "a foreign nexthop (protocol 4) holds id 1000100", WALL_NOW - 40, 3),),
        boot_id="5d0c8e7f1a2b4c3d9e8f7a6b5c4d3e2f",
        last_event_seq=42,
        aggregator=AgentLinkStatus(
            host_id="gpu-node-017", address="agg.example:7443", connected=False, refused=True,
            last_status="PERMISSION_DENIED",
            last_error="Hello says host 'gpu-node-017' but the certificate [CN=gpu-node-71] names no host",
            connected_at=WALL_NOW - 900, last_failure_at=WALL_NOW - 30, last_ack_at=WALL_NOW - 600,
            spool_events=120, spool_bytes=48_000, events_sent=300, events_acked=280, events_dropped=2),
    )


@contextlib.contextmanager
def running_server(socket_path: Path, provider: Callable[[], DaemonStatus],
                   explain_provider: Callable[[str], Explanation | None] | None = None,
                   **options: object) -> Iterator[ControlServer]:
    """A ControlServer on its own loop in a thread; `options` go to it
    (events, health, drains, group, admin_group ...).  The socket's group is
    nogroup unless given, so uid 65534 can reach it."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    options.setdefault("group", "nogroup")
    server = ControlServer(socket_path, provider, explain_provider, wall_clock=lambda: WALL_NOW,
                           **options)  # type: ignore[arg-type]
    server.test_loop = loop  # type: ignore[attr-defined] - for tests that act on the server's loop
    try:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture
def server(sock: Path) -> Iterator[ControlServer]:
    with running_server(sock, realistic_status) as srv:
        yield srv


def run_ctl(sock: Path, *args: str) -> Result:
    return CliRunner().invoke(ctl.cli, ["--socket", str(sock), "--timeout", "5", *args])


def table_rows(text: str) -> list[list[str]]:
    """Split aligned output into cells (cells are separated by 2+ spaces)."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.strip()]


# --------------------------------------------------------------------------
# server side
# --------------------------------------------------------------------------


def test_socket_is_0660_in_a_0755_dir_and_removed_on_stop(sock: Path) -> None:
    with running_server(sock, realistic_status) as server:
        st = os.stat(sock)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o660
        assert stat.S_IMODE(os.stat(sock.parent).st_mode) == 0o755
    assert not sock.exists()
    assert not server.private_dir.exists()  # the private gRPC socket and its dir go too


def test_stale_socket_is_replaced(sock: Path) -> None:
    sock.parent.mkdir(parents=True)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))
    stale.close()  # the file stays, nobody listens: what a crashed daemon leaves
    with running_server(sock, realistic_status):
        assert run_ctl(sock, "status").exit_code == 0


def test_refuses_to_remove_a_file_that_is_not_a_socket(sock: Path) -> None:
    sock.parent.mkdir(parents=True)
    sock.write_text("not a socket")
    with pytest.raises(ControlSocketError, match="not a socket"):
        with running_server(sock, realistic_status):
            pass
    assert sock.read_text() == "not a socket"


def test_refuses_to_steal_a_live_socket(sock: Path) -> None:
    with running_server(sock, realistic_status):
        with pytest.raises(ControlSocketError, match="in use"):
            with running_server(sock, realistic_status):
                pass
        assert run_ctl(sock, "status").exit_code == 0  # the first server still answers


def test_health_service_reports_serving(server: ControlServer, sock: Path) -> None:
    with grpc.insecure_channel(f"unix:{sock}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "linkpass.v1.ControlService"):
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_every_model_verdict_maps_to_a_proto_verdict() -> None:
    for verdict in Verdict:
        state = PortState(port="eth0", verdict=verdict, carrier=True, phase="X", since=0.0)
        assert control_convert.port_state_to_proto(state).verdict != pb.VERDICT_UNSPECIFIED


# --------------------------------------------------------------------------
# linkpassctl status
# --------------------------------------------------------------------------


def test_status_table(server: ControlServer, sock: Path) -> None:
    result = run_ctl(sock, "status")
    assert result.exit_code == 0, result.output
    out = result.stdout
    header = dict(row[:2] for row in table_rows(out.split("\n\n")[0]))
    assert header == {
        "host": "gpu-node-017",
        "version": "0.1.0",
        "uptime": "1h02m03s (since 2027-01-15T07:57:57+01:00)",
        "config": "/etc/linkpass/linkpassd.toml",
        "reconciles": "4242 (last 2.0s ago)",
        "netlink writes": "17",
        "last error": "netlink: RTM_NEWROUTE table 10101: Network is unreachable (12s ago)",
        "echo responder": "91234 answered; refused 3 (not a rail address), 150000 (source not "
                          "allowed); 12 rate-limited, 7 malformed",
        "aggregator": "REFUSED by agg.example:7443 as host gpu-node-017 (30s ago): PERMISSION_DENIED: Hello "
                      "says host 'gpu-node-017' but the certificate [CN=gpu-node-71] names no host; this host "
                      "does not report to the fleet until its certificate or host_id is fixed "
                      "(linkpassd --check-config compares them)",
        "spool": "120 events waiting (48000 bytes), 2 lost; 300 sent, 280 acknowledged since the agent started",
        "last ack": "2027-01-15T08:50:00+01:00 (10m00s ago)",
    }
    rows = table_rows(out)
    assert ["RAIL", "PORT", "VERDICT", "TABLE", "ACTIVE PATH"] in rows
    assert ["rail0", "eth0", "UP", "10100", "rail0 (primary)"] in rows
    assert ["rail1", "eth1", "DOWN", "10101", "rail0 (backup)"] in rows
    assert ["gpu-fabric", "10.200.0.0/16", "10150", "1", "rail0"] in rows
    # a conflict names what, since when, and why
    assert ["PROBLEM", "WHAT", "SINCE", "DETAIL"] in rows
    assert ["conflict", "create nexthop 1000100 (eth0 via 198.18.0.254)", "40s ago (3 attempts)",
            "a foreign nexthop (protocol 4) holds id 1000100"] in rows


def test_status_table_shows_no_path(sock: Path) -> None:
    status = realistic_status()
    rails = tuple(dataclasses.replace(r, active_rail=None, active_port=None) for r in status.rails)
    with running_server(sock, lambda: dataclasses.replace(status, rails=rails, groups=(), last_error="")):
        result = run_ctl(sock, "status")
    assert result.exit_code == 0, result.output
    rows = table_rows(result.stdout)
    assert ["rail1", "eth1", "DOWN", "10101", "NO PATH"] in rows
    assert ["last error", "-"] in rows
    assert "no multipath groups" in result.stdout


def test_status_json(server: ControlServer, sock: Path) -> None:
    result = run_ctl(sock, "status", "-o", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["hostname"] == "gpu-node-017"
    assert data["reconciles"] == "4242"  # uint64 is a string in proto3 JSON
    assert data["served_at"] == WALL_NOW
    rail1 = next(r for r in data["rails"] if r["name"] == "rail1")
    assert rail1 == {"name": "rail1", "port": "eth1", "address": "198.18.1.1", "table": 10101,
                     "active_rail": "rail0", "active_port": "eth0"}
    eth1 = next(p for p in data["ports"] if p["port"] == "eth1")
    assert eth1["verdict"] == "VERDICT_DOWN"
    assert eth1["evidence"] == ["carrier lost", "operstate LOWERLAYERDOWN"]


def test_json_keys_are_stable_at_zero_values(sock: Path) -> None:
    """Scripts index keys directly; zero values (no path, no error) must not drop them."""
    bare = DaemonStatus(hostname="h", version="v", config_source="c", started_at=0.0, ports=(), links=(),
                        rails=(RailStatus("rail0", "eth0", "198.18.0.1", 10100, None, None),),
                        groups=(), reconciles=0, netlink_writes=0, last_reconcile_at=0.0)
    with running_server(sock, lambda: bare):
        full = json.loads(run_ctl(sock, "status", "-o", "json").stdout)
        links = json.loads(run_ctl(sock, "links", "-o", "json").stdout)
    expected = json.loads(run_ctl_json_of(realistic_status()))
    assert full["rails"][0]["active_rail"] == ""
    assert full["last_error"] == ""
    # eth0 has neither sample nor verdict yet: both sub-objects still have every key.
    row = links["links"][0]
    assert row["link"]["present"] is False
    assert row["state"]["verdict"] == "VERDICT_UNSPECIFIED"
    # Same keys as the model, in the same (field-number) order whatever the values.
    assert list(row["link"]) == [f.name for f in dataclasses.fields(LinkSample)]
    assert list(row["state"]) == [f.name for f in dataclasses.fields(PortState)]
    assert list(full) == list(expected)


def run_ctl_json_of(status: DaemonStatus) -> str:
    return ctl.to_json(control_convert.status_to_proto(status, served_at=WALL_NOW))


# Model fields whose None the proto documents as "" (no path); every other
# None is an unset field, which linkpassctl prints as null.
NONE_AS_EMPTY_STRING = {(RailStatus, "active_rail"), (RailStatus, "active_port")}


def _rfc3339(unix: float) -> str:
    """A google.protobuf.Timestamp's JSON form (whole seconds here)."""
    assert unix == int(unix)
    return datetime.datetime.fromtimestamp(unix, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _expected_json(value: object) -> object:
    """The proto3 JSON form of a model value, by the rules control.proto documents."""
    if isinstance(value, Drain):  # DrainInfo: the port is the PortState's; times are Timestamps
        return {"reason": value.reason, "by": value.by, "since": _rfc3339(value.at),
                "until": None if value.until is None else _rfc3339(value.until)}
    if dataclasses.is_dataclass(value):
        out = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            out[f.name] = "" if v is None and (type(value), f.name) in NONE_AS_EMPTY_STRING else _expected_json(v)
        return out
    if isinstance(value, Verdict):
        return f"VERDICT_{value.value}"
    if isinstance(value, enum.Enum):
        raise AssertionError(f"no JSON rule for enum {type(value).__name__}")
    if isinstance(value, frozenset):  # a set goes out sorted
        return [_expected_json(v) for v in sorted(value)]
    if isinstance(value, tuple) and value and all(
        isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) for v in value
    ):  # (key, value) pairs are a map; a later pair wins
        return {k: _expected_json(v) for k, v in value}
    if isinstance(value, tuple):
        return [_expected_json(v) for v in value]
    return value  # None included: null


def _assert_contains(expected: object, actual: object, where: str) -> None:
    if isinstance(expected, dict):
        assert isinstance(actual, dict), where
        for key, value in expected.items():
            assert key in actual, f"{where}.{key} is missing from the JSON output"
            _assert_contains(value, actual[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), where
        for i, (e, a) in enumerate(zip(expected, actual)):
            _assert_contains(e, a, f"{where}[{i}]")
    elif isinstance(expected, int) and not isinstance(expected, bool) and isinstance(actual, str):
        assert actual == str(expected), where  # 64-bit ints are JSON strings
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def _dataclasses_in(value: object) -> Iterator[object]:
    if dataclasses.is_dataclass(value):
        yield value
        for f in dataclasses.fields(value):
            yield from _dataclasses_in(getattr(value, f.name))
    elif isinstance(value, (tuple, frozenset)):
        for v in value:
            yield from _dataclasses_in(v)


def _fields_never_given(value: object) -> set[str]:
    """Model fields that are None or empty everywhere in `value`: the walk
    below cannot notice the mapping dropping one of those."""
    seen: set[str] = set()
    given: set[str] = set()
    for obj in _dataclasses_in(value):
        for f in dataclasses.fields(obj):
            name = f"{type(obj).__name__}.{f.name}"
            seen.add(name)
            if getattr(obj, f.name) not in (None, (), frozenset(), ""):
                given.add(name)
    return seen - given


def test_every_daemon_status_field_reaches_json(server: ControlServer, sock: Path) -> None:
    """Walks the model, not a list: a field added to DaemonStatus (or its parts,
    down to PortSensors, OpticsReading, Thresholds, CounterSample, Assessment)
    but not carried by the proto and the mapping fails here."""
    status = realistic_status()
    assert not _fields_never_given(status), "give these a value in realistic_status()"
    assert {"PortSensors", "OpticsReading", "ModuleIdentity", "Thresholds", "CounterSample", "Assessment"} <= {
        type(v).__name__ for v in _dataclasses_in(status)}
    result = run_ctl(sock, "status", "-o", "json")
    assert result.exit_code == 0, result.output
    _assert_contains(_expected_json(status), json.loads(result.stdout), "status")


# --------------------------------------------------------------------------
# linkpassctl links
# --------------------------------------------------------------------------


def test_links_table(server: ControlServer, sock: Path) -> None:
    result = run_ctl(sock, "links")
    assert result.exit_code == 0, result.output
    rows = table_rows(result.stdout.split("\n\n")[0])  # sensor sections follow (test_control_explain.py)
    assert rows[0] == ["PORT", "RAIL", "PRESENT", "ADMIN", "CARRIER", "OPERSTATE", "UPS", "DOWNS",
                       "VERDICT", "PHASE", "SINCE", "EVIDENCE"]
    assert rows[1] == ["eth0", "rail0", "yes", "up", "yes", "UP", "3", "2", "UP", "UP", "1h00m00s ago",
                       "carrier up; 3/3 good samples"]
    assert rows[2] == ["eth1", "rail1", "yes", "up", "no", "LOWERLAYERDOWN", "5", "6", "DOWN", "DOWN",
                       "42s ago", "carrier lost; operstate LOWERLAYERDOWN"]
    assert len(rows) == 3


def test_links_json(server: ControlServer, sock: Path) -> None:
    result = run_ctl(sock, "links", "--output", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [row["port"] for row in data["links"]] == ["eth0", "eth1"]
    eth1 = data["links"][1]
    assert eth1["rails"] == ["rail1"]
    assert eth1["link"] == {"port": "eth1", "present": True, "ifindex": 3, "admin_up": True, "carrier": False,
                            "operstate": "LOWERLAYERDOWN", "carrier_up_count": 5, "carrier_down_count": 6}
    assert eth1["state"]["verdict"] == "VERDICT_DOWN"
    assert eth1["state"]["since"] == WALL_NOW - 42
    assert data["served_at"] == WALL_NOW


# --------------------------------------------------------------------------
# errors: one line on stderr, non-zero exit, no traceback
# --------------------------------------------------------------------------


def ctl_process(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "linkpassd.ctl.main", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def assert_one_line_error(proc: subprocess.CompletedProcess[str], contains: str) -> None:
    assert proc.returncode != 0
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("linkpassctl: ")
    assert contains in lines[0]
    assert "Traceback" not in proc.stderr


def test_no_socket(tmp_path: Path) -> None:
    missing = tmp_path / "nope.sock"
    proc = ctl_process("--socket", str(missing), "status")
    assert_one_line_error(proc, f"linkpassd is not running? no socket at {missing}")


def test_socket_from_environment(tmp_path: Path) -> None:
    missing = tmp_path / "env.sock"
    proc = ctl_process("links", "-o", "json", env={"LINKPASS_SOCKET": str(missing)})
    assert_one_line_error(proc, f"no socket at {missing}")


def test_stale_socket_nobody_listening(sock: Path) -> None:
    sock.parent.mkdir(parents=True)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))
    stale.close()
    proc = ctl_process("--socket", str(sock), "status")
    assert_one_line_error(proc, f"nothing listens on {sock}")


def test_daemon_not_answering(sock: Path) -> None:
    sock.parent.mkdir(parents=True)
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hung.bind(str(sock))
    hung.listen()  # connections queue up; nobody ever speaks HTTP/2
    try:
        proc = ctl_process("--socket", str(sock), "--timeout", "0.5", "links")
    finally:
        hung.close()
    assert_one_line_error(proc, f"linkpassd did not answer within 0.5s on {sock}")


def test_not_a_socket(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("")
    assert_one_line_error(ctl_process("--socket", str(path), "status"), "is not a socket")


def test_permission_denied(server: ControlServer, sock: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests run as root, for whom access() always succeeds; pretend we are not.
    monkeypatch.setattr(ctl.os, "access", lambda path, mode: False)
    result = run_ctl(sock, "status")
    assert result.exit_code == 4  # ExitCode.REFUSED
    assert result.stderr == f"linkpassctl: permission denied on {sock} (run as root or a member of its group)\n"
    assert result.stdout == ""


def test_provider_failure_is_reported_not_hidden(sock: Path) -> None:
    def broken() -> DaemonStatus:
        raise RuntimeError("state not ready")

    with running_server(sock, broken):
        result = run_ctl(sock, "status")
    assert result.exit_code == 1
    assert result.stderr == "linkpassctl: linkpassd answered INTERNAL: status unavailable: state not ready\n"


def test_aggregator_without_its_config_exits_2_with_one_line() -> None:
    proc = subprocess.run([sys.executable, "-c", "import sys; from linkpassd.aggregator.main import main; "
                           "sys.exit(main(['--config', '/nonexistent/aggregator.toml']))"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and "/nonexistent/aggregator.toml: cannot read" in proc.stderr
