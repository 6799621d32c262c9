"""`linkpassctl fleet ...` (ctl/fleet.py): rendering from crafted protos,
argument errors, and exit codes against a small grpc.aio FleetService
implemented here (a test double: the real aggregator has its own tests)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner
from google.protobuf import timestamp_pb2

from linkpassd._proto.linkpass.v1 import control_pb2 as cpb
from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd._proto.linkpass.v1 import fleet_pb2_grpc as pb_grpc
from linkpassd.ctl.fleet import render_fleet_events, render_grid, render_summary
from linkpassd.ctl.main import cli
from linkpassd.exitcodes import ExitCode

REPO = Path(__file__).resolve().parents[2]
SERVED_AT = 1_800_000_000


def ts(unix: float) -> timestamp_pb2.Timestamp:
    t = timestamp_pb2.Timestamp()
    t.FromNanoseconds(int(unix * 1e9))
    return t


def host(host_id: str, verdicts: list[int], *, connected: bool = True, drained: tuple[int, ...] = (),
         rail_paths: dict[str, str] | None = None, evidence: dict[int, str] | None = None) -> pb.HostView:
    rails = [pb.RailInventory(rail=f"rail{i}", port=f"eth{i + 1}") for i in range(len(verdicts))]
    ports = []
    for i, verdict in enumerate(verdicts):
        state = cpb.PortState(port=f"eth{i + 1}", verdict=verdict,
                              evidence=[(evidence or {}).get(i, "")] if (evidence or {}).get(i) else [])
        if i in drained:
            state.drain.CopyFrom(cpb.DrainInfo(reason="optic swap", by="alice"))
        ports.append(state)
    return pb.HostView(host_id=host_id, connected=connected, last_seen=ts(SERVED_AT - 300), rails=rails,
                       report=pb.PortReport(ports=ports, rail_paths=rail_paths or {}))


UP, DEG, DOWN, UNJUDGED = cpb.VERDICT_UP, cpb.VERDICT_DEGRADED, cpb.VERDICT_DOWN, cpb.VERDICT_UNSPECIFIED


def fleet_resp() -> pb.ListHostsResponse:
    return pb.ListHostsResponse(served_at=ts(SERVED_AT), hosts=[
        host("gpu-node-10", [UP, UP, UP, UP]),
        host("gpu-node-2", [UP, DOWN, UP, UP], rail_paths={"rail1": "rail0"}, evidence={1: "carrier lost"}),
        host("gpu-node-3", [UP, DEG, UNJUDGED, UP], connected=False, drained=(1,)),
    ])


def fleet_event(i: int, host_id: str = "gpu-node-2") -> pb.FleetEvent:
    return pb.FleetEvent(host_id=host_id, id=i, stored_at=ts(SERVED_AT), event=cpb.Event(
        boot_id="b1", seq=i, time=ts(SERVED_AT - 10 + i), kind=cpb.EVENT_KIND_RAIL_PATH,
        severity=cpb.SEVERITY_WARNING, port="eth2", rail="rail1", message=f"rail1 now through rail0 ({i})"))


# --------------------------------------------------------------------------
# rendering (pure)
# --------------------------------------------------------------------------


def test_grid_has_a_symbol_per_cell_in_natural_order() -> None:
    out = render_grid(fleet_resp())
    lines = out.splitlines()
    assert lines[0].split() == ["HOST", "CONNECTED", "rail0", "rail1", "rail2", "rail3"]
    assert lines[1].split() == ["gpu-node-2", "yes", "up", "DOWN*", "up", "up"]
    assert lines[2].split() == ["gpu-node-3", "no,", "5m00s", "up", "DRN", "-", "up"]
    assert lines[3].split() == ["gpu-node-10", "yes", "up", "up", "up", "up"]
    assert "legend:" in out and "DRN drained" in out and "* after a symbol" in out
    # What needs a look, with the evidence; then the counts.
    assert any(line.split()[:5] == ["gpu-node-2", "rail1", "eth2", "DOWN", "rail0"] and "carrier lost" in line
               for line in lines)
    assert any(line.split()[:5] == ["gpu-node-3", "rail1", "eth2", "DEGRADED", "drained"] for line in lines)
    assert lines[-1] == "3 hosts (2 connected), 12 ports: 9 up, 1 degraded, 1 down, 1 drained, 1 no report"


def test_grid_of_eight_rails_fits_80_columns() -> None:
    resp = pb.ListHostsResponse(served_at=ts(SERVED_AT),
                                hosts=[host(f"gpu-{i:04d}.dc1", [UP] * 8) for i in range(3)])
    table_lines = render_grid(resp).split("\n\n")[0].splitlines()
    assert max(len(line) for line in table_lines) <= 80, table_lines
    assert max(len(line) for line in render_grid(resp).splitlines()) <= 100


def test_empty_fleet_and_no_events_say_so() -> None:
    assert render_grid(pb.ListHostsResponse()) == "no hosts have reported to the aggregator yet"
    assert render_fleet_events([]) == "no events"


def test_events_lead_with_their_host(monkeypatch) -> None:
    import time
    monkeypatch.setenv("TZ", "EST5")  # local time with its offset (a POSIX TZ: no tzdata needed)
    time.tzset()
    try:
        out = render_fleet_events([fleet_event(1), fleet_event(2, "h9")]).splitlines()
    finally:
        monkeypatch.undo()
        time.tzset()
    assert out[0].startswith("gpu-node-2  2027-01-15T02:59:51.000-05:00") and "#1" in out[0] and "rail_path" in out[0]
    assert out[1].startswith("h9          2027-01-15") and "rail1 now through rail0 (2)" in out[1]


def test_summary_per_day_with_total_and_cost() -> None:
    resp = pb.GetSummaryResponse(
        days=[pb.DaySummary(day="2027-01-15", failures_absorbed=3, gpu_hours_saved=12.0, failures_outgoing_only=2),
              pb.DaySummary(day="2027-01-14", failures_absorbed=1, gpu_hours_saved=4.0)],
        restart_cost_s=1800, hosts=3, hosts_connected=2, ports_by_verdict={"UP": 10, "DOWN": 1})
    lines = render_summary(resp).splitlines()
    assert lines[0].split() == ["DAY", "(UTC)", "FAILURES", "ABSORBED", "OUTGOING", "ONLY", "GPU-HOURS", "SAVED"]
    assert [line.split() for line in lines[1:4]] == [["2027-01-14", "1", "0", "4.0"],
                                                     ["2027-01-15", "3", "2", "12.0"],
                                                     ["total", "4", "2", "16.0"]]
    text = render_summary(resp)
    assert "restart cost 30 min" in text
    assert "both directions recovered" in text and "outgoing only:" in text
    assert lines[-1] == "hosts 3 (2 connected); ports now: 1 DOWN, 10 UP"


# --------------------------------------------------------------------------
# against a FleetService test double
# --------------------------------------------------------------------------


class FakeAggregator(pb_grpc.FleetServiceServicer):
    """Answers from canned protos, records requests, refuses as told."""

    def __init__(self) -> None:
        self.requests: list[object] = []
        self.abort: tuple[grpc.StatusCode, str] | None = None
        self.hang = False
        self.release: asyncio.Event | None = None
        self.watch_events = [fleet_event(i) for i in range(1, 4)]

    async def _maybe_fail(self, request, context) -> None:
        self.requests.append(request)
        if self.hang:
            assert self.release is not None
            await asyncio.wait_for(self.release.wait(), 30)  # bounded; released at teardown
        if self.abort:
            await context.abort(*self.abort)

    async def ListHosts(self, request, context):  # gRPC's name
        await self._maybe_fail(request, context)
        return fleet_resp()

    async def ListFleetEvents(self, request, context):
        await self._maybe_fail(request, context)
        return pb.ListFleetEventsResponse(events=[fleet_event(i) for i in range(request.after_id + 1, 6)])

    async def WatchFleetEvents(self, request, context):
        await self._maybe_fail(request, context)
        for e in self.watch_events:
            yield pb.WatchFleetEventsResponse(event=e)

    async def FleetDrain(self, request, context):
        await self._maybe_fail(request, context)
        if request.host_id != "gpu-node-2":
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown host {request.host_id!r}")
        return pb.FleetDrainResponse(message=f"{request.port} drained")

    async def FleetUndrain(self, request, context):
        await self._maybe_fail(request, context)
        return pb.FleetUndrainResponse(message=f"{request.port} undrained")

    async def GetSummary(self, request, context):
        await self._maybe_fail(request, context)
        return pb.GetSummaryResponse(days=[pb.DaySummary(day="2027-01-15", failures_absorbed=2, gpu_hours_saved=8)],
                                     restart_cost_s=1800)


class ServerThread:
    """A grpc.aio server on its own event loop in a thread, so the CLI's
    blocking calls can run in the test's thread."""

    def __init__(self, fake: FakeAggregator, credentials: grpc.ServerCredentials | None = None) -> None:
        self.fake = fake
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server: grpc.aio.Server | None = None
        self.port = self._run(self._start(credentials))

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _start(self, credentials: grpc.ServerCredentials | None) -> int:
        self.fake.release = asyncio.Event()
        self.server = grpc.aio.server()
        pb_grpc.add_FleetServiceServicer_to_server(self.fake, self.server)
        port = (self.server.add_secure_port("127.0.0.1:0", credentials) if credentials
                else self.server.add_insecure_port("127.0.0.1:0"))
        await self.server.start()
        return port

    async def _stop(self) -> None:
        assert self.fake.release is not None and self.server is not None
        self.fake.release.set()
        await self.server.stop(grace=None)

    def stop(self) -> None:
        try:
            self._run(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@pytest.fixture
def agg() -> Iterator[tuple[FakeAggregator, str]]:
    fake = FakeAggregator()
    server = ServerThread(fake)
    try:
        yield fake, f"127.0.0.1:{server.port}"
    finally:
        server.stop()


def run(*args: str, env: dict[str, str] | None = None):
    result = CliRunner().invoke(cli, list(args), env={"LINKPASS_AGGREGATOR": None, "LINKPASS_CA": None,
                                                      "LINKPASS_CERT": None, "LINKPASS_KEY": None, **(env or {})})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def fleet_cmd(address: str, *args: str, env: dict[str, str] | None = None):
    return run("fleet", "--aggregator", address, "--insecure", *args, env=env)


def test_fleet_grid_and_json(agg) -> None:
    fake, address = agg
    result = fleet_cmd(address)
    assert result.exit_code == ExitCode.OK, result.stderr
    assert result.stdout.splitlines()[1].split() == ["gpu-node-2", "yes", "up", "DOWN*", "up", "up"]
    result = fleet_cmd(address, "-o", "json")
    doc = json.loads(result.stdout)
    assert list(doc) == ["hosts", "served_at"]
    assert [h["host_id"] for h in doc["hosts"]] == ["gpu-node-10", "gpu-node-2", "gpu-node-3"]


def test_the_aggregator_comes_from_the_environment(agg) -> None:
    _, address = agg
    result = run("fleet", "--insecure", env={"LINKPASS_AGGREGATOR": address})
    assert result.exit_code == ExitCode.OK, result.stderr


def test_events_pass_their_filters_and_show_the_host(agg) -> None:
    fake, address = agg
    result = fleet_cmd(address, "events", "--host", "gpu-node-2", "--port", "eth2", "--kind", "RAIL_PATH",
                       "--after", "2", "--limit", "7")
    assert result.exit_code == ExitCode.OK, result.stderr
    req = fake.requests[-1]
    assert (req.host_id, req.port, req.kind, req.after_id, req.limit) == (
        "gpu-node-2", "eth2", cpb.EVENT_KIND_RAIL_PATH, 2, 7)
    assert [line.split()[0] for line in result.stdout.splitlines()] == ["gpu-node-2"] * 3
    result = fleet_cmd(address, "events", "--since", "1h", "-o", "json")
    assert result.exit_code == ExitCode.OK
    assert fake.requests[-1].HasField("since")
    assert [e["id"] for e in json.loads(result.stdout)["events"]] == ["1", "2", "3", "4", "5"]


def test_follow_prints_as_events_come_and_says_when_the_stream_ends(agg) -> None:
    fake, address = agg
    result = fleet_cmd(address, "events", "--follow", "--limit", "2")
    assert result.exit_code == ExitCode.OK, result.stderr
    assert len(result.stdout.splitlines()) == 2
    result = fleet_cmd(address, "events", "-f", "-o", "json", "--kind", "verdict")
    assert result.exit_code == ExitCode.UNREACHABLE
    assert [json.loads(line)["id"] for line in result.stdout.splitlines()] == ["1", "2", "3"]
    assert "ended the event stream" in result.stderr
    assert fake.requests[-1].kind == cpb.EVENT_KIND_VERDICT and fake.requests[-1].after_id == 0


@pytest.mark.parametrize("args, words", [
    (["events", "--kind", "bogus"], ["'--kind'", "bogus"]),
    (["events", "--since", "2x"], ["'--since'", "2x"]),
    (["events", "--since", "1h", "--follow"], ["--since does not go with --follow"]),
    (["drain", "gpu-node-2", "eth2"], ["--reason"]),
    (["drain", "gpu-node-2", "eth2", "--reason", "  "], ["'--reason'", "empty"]),
    (["drain", "gpu-node-2", "eth2", "--reason", "x", "--for", "soon"], ["'--for'", "soon"]),
    (["summary", "--days", "0"], ["'--days'", "0"]),
])
def test_bad_arguments_exit_2_naming_them(agg, args, words) -> None:
    fake, address = agg
    result = fleet_cmd(address, *args)
    assert result.exit_code == ExitCode.USAGE, (result.stdout, result.stderr)
    for word in words:
        assert word in result.stderr, result.stderr
    assert fake.requests == []  # refused before asking the aggregator


@pytest.mark.parametrize("args, words", [
    (["fleet"], ["no aggregator", "LINKPASS_AGGREGATOR"]),
    (["fleet", "--aggregator", "agg.example"], ["'agg.example' is not HOST:PORT"]),
    (["fleet", "--aggregator", "agg:99999", "--insecure"], ["'agg:99999'"]),
    (["fleet", "--aggregator", "agg:7443"], ["--ca (or LINKPASS_CA)", "--insecure"]),
    (["fleet", "--aggregator", "agg:7443", "--insecure", "--ca", "x.pem"], ["--insecure and --ca"]),
    (["fleet", "--aggregator", "agg:7443", "--ca", "/nonexistent/ca.pem", "--cert", "c", "--key", "k"],
     ["--ca file /nonexistent/ca.pem does not exist"]),
])
def test_bad_connection_options_exit_2_naming_them(args, words) -> None:
    result = run(*args)
    assert result.exit_code == ExitCode.USAGE, (result.stdout, result.stderr)
    for word in words:
        assert word in result.stderr, result.stderr


def test_help_of_a_subcommand_needs_no_aggregator() -> None:
    result = run("fleet", "events", "--help")
    assert result.exit_code == ExitCode.OK and "--follow" in result.stdout


def test_drain_and_undrain_send_what_was_asked(agg) -> None:
    fake, address = agg
    result = fleet_cmd(address, "drain", "gpu-node-2", "eth2", "--reason", "optic swap", "--for", "30m")
    assert result.exit_code == ExitCode.OK, result.stderr
    req = fake.requests[-1]
    assert (req.host_id, req.port, req.reason, req.duration_s) == ("gpu-node-2", "eth2", "optic swap", 1800.0)
    assert result.stdout.strip() == "gpu-node-2 eth2: eth2 drained"
    result = fleet_cmd(address, "undrain", "gpu-node-2", "eth2", "-o", "json")
    assert json.loads(result.stdout) == {"message": "eth2 undrained"}


@pytest.mark.parametrize("status, code", [
    (grpc.StatusCode.PERMISSION_DENIED, ExitCode.REFUSED),
    (grpc.StatusCode.UNAUTHENTICATED, ExitCode.REFUSED),
    (grpc.StatusCode.NOT_FOUND, ExitCode.NOT_FOUND),
    (grpc.StatusCode.INVALID_ARGUMENT, ExitCode.USAGE),
    (grpc.StatusCode.INTERNAL, ExitCode.FAILURE),
])
def test_refusals_map_to_exit_codes_with_the_aggregators_words(agg, status, code) -> None:
    fake, address = agg
    fake.abort = (status, "fleet drain needs an operator certificate; this one names host h1")
    result = fleet_cmd(address, "drain", "gpu-node-2", "eth2", "--reason", "x")
    assert result.exit_code == code, result.stderr
    assert "needs an operator certificate" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_an_unknown_host_is_not_found_by_name(agg) -> None:
    _, address = agg
    result = fleet_cmd(address, "drain", "gpu-node-404", "eth2", "--reason", "x")
    assert result.exit_code == ExitCode.NOT_FOUND and "gpu-node-404" in result.stderr


def test_an_aggregator_that_does_not_answer_is_unreachable(agg) -> None:
    fake, address = agg
    fake.hang = True
    result = run("--timeout", "0.5", "fleet", "--aggregator", address, "--insecure", "summary")
    assert result.exit_code == ExitCode.UNREACHABLE
    assert f"linkpass-aggregator at {address} did not answer in time" in result.stderr


def test_no_aggregator_listening_is_unreachable_through_the_real_cli() -> None:
    """In its own process: one line on stderr, no traceback, exit 3."""
    fake = FakeAggregator()
    server = ServerThread(fake)
    address = f"127.0.0.1:{server.port}"
    server.stop()  # nothing listens there now
    proc = subprocess.run([sys.executable, "-m", "linkpassd.ctl.main", "fleet", "--aggregator", address,
                           "--insecure", "summary"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == ExitCode.UNREACHABLE, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert f"not reachable at {address}" in proc.stderr


# --------------------------------------------------------------------------
# mutual TLS
# --------------------------------------------------------------------------


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d: Path, name: str) -> None:
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
            "-subj", f"/CN={name}", "-keyout", f"{name}-key.pem", "-out", f"{name}.pem", cwd=d)


def make_leaf(d: Path, ca: str, name: str, san: str) -> None:
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={name}",
            "-keyout", f"{name}-key.pem", "-out", f"{name}.csr", cwd=d)
    (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}-key.pem",
            "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca")
    make_ca(d, "other-ca")
    make_leaf(d, "ca", "server", "IP:127.0.0.1,DNS:agg.test")
    make_leaf(d, "ca", "alice", "URI:linkpass://operator/alice")
    make_leaf(d, "other-ca", "mallory", "URI:linkpass://operator/mallory")
    return d


@pytest.fixture
def tls_agg(pki: Path) -> Iterator[tuple[FakeAggregator, str]]:
    creds = grpc.ssl_server_credentials([((pki / "server-key.pem").read_bytes(), (pki / "server.pem").read_bytes())],
                                        root_certificates=(pki / "ca.pem").read_bytes(), require_client_auth=True)
    fake = FakeAggregator()
    server = ServerThread(fake, creds)
    try:
        yield fake, f"127.0.0.1:{server.port}"
    finally:
        server.stop()


def test_mutual_tls_with_a_trusted_certificate_works(pki, tls_agg) -> None:
    _, address = tls_agg
    result = run("fleet", "--aggregator", address, "summary",
                 env={"LINKPASS_CA": str(pki / "ca.pem"), "LINKPASS_CERT": str(pki / "alice.pem"),
                      "LINKPASS_KEY": str(pki / "alice-key.pem")})
    assert result.exit_code == ExitCode.OK, result.stderr
    assert "2027-01-15" in result.stdout


def test_an_untrusted_client_certificate_is_refused(pki, tls_agg) -> None:
    _, address = tls_agg
    result = run("fleet", "--aggregator", address, "--ca", str(pki / "ca.pem"), "--cert", str(pki / "mallory.pem"),
                 "--key", str(pki / "mallory-key.pem"), "summary")
    assert result.exit_code == ExitCode.REFUSED, result.stderr
    assert "TLS handshake" in result.stderr and "mallory.pem" in result.stderr


def test_plaintext_to_a_tls_aggregator_hints_at_tls(tls_agg) -> None:
    _, address = tls_agg
    result = run("fleet", "--aggregator", address, "--insecure", "summary")
    assert result.exit_code == ExitCode.UNREACHABLE, result.stderr
    assert "does it require TLS?" in result.stderr


def test_an_aggregator_certificate_from_another_ca_is_refused(pki, tls_agg) -> None:
    _, address = tls_agg
    result = run("fleet", "--aggregator", address, "--ca", str(pki / "other-ca.pem"), "--cert",
                 str(pki / "alice.pem"), "--key", str(pki / "alice-key.pem"), "summary")
    assert result.exit_code == ExitCode.REFUSED, result.stderr
    assert "TLS handshake" in result.stderr and address in result.stderr


@pytest.mark.parametrize("args", [["-o", "json", "summary"], ["summary", "-o", "json"],
                                  ["-o", "table", "summary", "-o", "json"]])
def test_json_output_from_the_group_or_the_command(agg, args) -> None:
    _, address = agg
    result = run("fleet", "--aggregator", address, "--insecure", *args)
    assert result.exit_code == ExitCode.OK, result.stderr
    doc = json.loads(result.stdout)
    assert "days" in doc or "restartCostS" in doc, doc


def test_the_command_own_output_wins_over_the_group(agg) -> None:
    _, address = agg
    result = run("fleet", "--aggregator", address, "--insecure", "-o", "json", "summary", "-o", "table")
    assert result.exit_code == ExitCode.OK, result.stderr
    assert "2027-01-15" in result.stdout and not result.stdout.lstrip().startswith("{")


def test_a_server_name_the_aggregator_certificate_does_not_carry_is_refused(pki, tls_agg) -> None:
    """--server-name names who we expect; a certificate for another name is a
    refusal of trust (4), not an aggregator that is away (3)."""
    _, address = tls_agg
    result = run("fleet", "--aggregator", address, "--server-name", "not-agg.test", "--ca", str(pki / "ca.pem"),
                 "--cert", str(pki / "alice.pem"), "--key", str(pki / "alice-key.pem"), "summary")
    assert result.exit_code == ExitCode.REFUSED, result.stderr
    assert "not-agg.test" in result.stderr, result.stderr
    ok = run("fleet", "--aggregator", address, "--server-name", "agg.test", "--ca", str(pki / "ca.pem"),
             "--cert", str(pki / "alice.pem"), "--key", str(pki / "alice-key.pem"), "summary")
    assert ok.exit_code == ExitCode.OK, ok.stderr
