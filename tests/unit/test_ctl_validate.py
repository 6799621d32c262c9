"""`linkpassctl validate` (ctl/validate.py): the plan checked before anything
runs, the request it sends, the progress bar on stderr, the report on stdout
and the exit codes, against a FleetService test double that streams
progress and a crafted report (the real aggregator: test_agg_validation.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd._proto.linkpass.v1 import fleet_pb2_grpc as pb_grpc
from linkpassd.ctl.main import cli
from linkpassd.exitcodes import ExitCode
from test_ctl_fleet import ServerThread

PLAN = """
[[port]]
host = "gpu-001"
port = "eth0"
switch = "leaf-r0-a"
switch_port = "Ethernet1"
rail = "rail0"
speed_mbps = 400000

[[port]]
host = "gpu-002"
port = "eth0"
switch = "leaf-r0-a"
switch_port = "Ethernet2"
rail = "rail0"

[[port]]
host = "gpu-001"
port = "eth1"
switch = "leaf-r1-a"
switch_port = "Ethernet1"
rail = "rail1"
"""

MISWIRE = pb.Finding(kind="miswire", component="gpu-001 eth0 <-> leaf-r0-a Ethernet2", hosts=["gpu-001"],
                     ports=["eth0"], rail="rail0", evidence=["LLDP: leaf-r0-a Ethernet2, plan: Ethernet1"],
                     confidence=0.9, fix="move gpu-001 eth0 to leaf-r0-a Ethernet1")


class FakeValidate(pb_grpc.FleetServiceServicer):
    """Streams one progress message per host, then `report`; or refuses as told."""

    def __init__(self) -> None:
        self.requests: list[pb.ValidateRequest] = []
        self.findings: list[pb.Finding] = []
        self.abort: tuple[grpc.StatusCode, str] | None = None
        self.send_report = True
        self.release = None  # ServerThread's

    async def Validate(self, request, context):  # gRPC's name
        self.requests.append(request)
        if self.abort:
            await context.abort(*self.abort)
        hosts = sorted({p.host for p in request.plan if not request.hosts or p.host in request.hosts})
        yield pb.ValidateResponse(progress=pb.ValidateProgress(hosts_done=0, hosts_total=len(hosts)))
        for i, host in enumerate(hosts, start=1):
            yield pb.ValidateResponse(progress=pb.ValidateProgress(hosts_done=i, hosts_total=len(hosts),
                                                                   last_host=host))
        if self.send_report:
            report = pb.ValidationReport(run_id="val-test", loss_resolution=0.003, findings=self.findings,
                                         hosts=[pb.HostValidationResult(host_id=h, status="ok") for h in hosts])
            report.started.FromSeconds(1_800_000_000)
            report.finished.FromSeconds(1_800_000_035)
            yield pb.ValidateResponse(report=report)


@pytest.fixture
def agg() -> Iterator[tuple[FakeValidate, str]]:
    fake = FakeValidate()
    server = ServerThread(fake)  # type: ignore[arg-type] - it needs only .release
    try:
        yield fake, f"127.0.0.1:{server.port}"
    finally:
        server.stop()


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "cabling.toml"
    path.write_text(PLAN)
    return path


def validate(address: str, *args: str):
    result = CliRunner().invoke(cli, ["validate", "--aggregator", address, "--insecure", *args],
                                env={"LINKPASS_AGGREGATOR": None, "LINKPASS_CA": None, "LINKPASS_CERT": None,
                                     "LINKPASS_KEY": None})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_a_clean_report_exits_0_after_sending_the_plan_and_selection(agg, plan_file: Path) -> None:
    fake, address = agg
    result = validate(address, "--plan", str(plan_file), "--hosts", "gpu-001,gpu-002", "--rails", "rail0",
                      "--duration", "20")
    assert result.exit_code == ExitCode.OK, result.stderr
    (request,) = fake.requests
    assert [(p.host, p.port, p.switch_name, p.switch_port, p.rail, p.speed_mbps) for p in request.plan] == [
        ("gpu-001", "eth0", "leaf-r0-a", "Ethernet1", "rail0", 400000),
        ("gpu-002", "eth0", "leaf-r0-a", "Ethernet2", "rail0", 0),
        ("gpu-001", "eth1", "leaf-r1-a", "Ethernet1", "rail1", 0)]
    assert (list(request.hosts), list(request.rails), request.duration_s) == (["gpu-001", "gpu-002"], ["rail0"], 20)
    assert "validating" in result.stderr  # the progress bar, on stderr
    assert "validating" not in result.stdout
    assert "no finding" in result.stdout and "val-test" in result.stdout


def test_findings_exit_8_with_the_report_on_stdout_as_text_or_json(agg, plan_file: Path) -> None:
    fake, address = agg
    fake.findings = [MISWIRE]
    result = validate(address, "--plan", str(plan_file))
    assert result.exit_code == ExitCode.FINDINGS == 8, result.stderr
    assert "miswire" in result.stdout and "move gpu-001 eth0 to leaf-r0-a Ethernet1" in result.stdout
    assert fake.requests[-1].duration_s == 0  # the aggregator's default
    result = validate(address, "--plan", str(plan_file), "-o", "json")
    assert result.exit_code == ExitCode.FINDINGS
    doc = json.loads(result.stdout)
    assert doc["run_id"] == "val-test" and [f["kind"] for f in doc["findings"]] == ["miswire"]


def test_png_heatmap_is_written_where_asked(agg, plan_file: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    _, address = agg
    png = tmp_path / "heat.png"
    result = validate(address, "--plan", str(plan_file), "--png", str(png))
    assert result.exit_code == ExitCode.OK, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, words", [
    ([], ["--plan"]),
    (["--plan", "/nonexistent/cabling.toml"], ["/nonexistent/cabling.toml"]),
    (["--plan", "PLAN", "--hosts", "gpu-009"], ["'--hosts'", "gpu-009"]),
    (["--plan", "PLAN", "--hosts", "gpu-001,,gpu-002"], ["'--hosts'", "empty name"]),
    (["--plan", "PLAN", "--rails", "rail7"], ["'--rails'", "rail7", "rail0, rail1"]),
    (["--plan", "PLAN", "--duration", "0"], ["'--duration'"]),
    (["--plan", "PLAN", "--duration", "soon"], ["'--duration'", "soon"]),
    (["--plan", "BADPLAN"], ["port entry 2", "already planned in entry 1"]),
])
def test_bad_arguments_and_plans_exit_2_naming_them_before_asking(agg, plan_file: Path, args, words) -> None:
    fake, address = agg
    bad = plan_file.parent / "bad.toml"
    first_entry = "[[port]]" + PLAN.split("[[port]]")[1]
    bad.write_text(first_entry * 2)  # the same host port planned twice
    args = [str(plan_file) if a == "PLAN" else str(bad) if a == "BADPLAN" else a for a in args]
    result = validate(address, *args)
    assert result.exit_code == ExitCode.USAGE, (result.stdout, result.stderr)
    for word in words:
        assert word in result.stderr, result.stderr
    assert fake.requests == []


@pytest.mark.parametrize("status, code, words", [
    (grpc.StatusCode.PERMISSION_DENIED, ExitCode.REFUSED, ["needs an operator certificate"]),
    (grpc.StatusCode.ABORTED, ExitCode.FAILURE, ["ABORTED", "val-123 (by bob) is running"]),
    (grpc.StatusCode.INVALID_ARGUMENT, ExitCode.USAGE, ["needs an operator certificate"]),
])
def test_refusals_map_to_exit_codes_with_the_aggregators_words(agg, plan_file: Path, status, code, words) -> None:
    fake, address = agg
    fake.abort = (status, "validation val-123 (by bob) is running" if status == grpc.StatusCode.ABORTED
                  else "Validate needs an operator certificate")
    result = validate(address, "--plan", str(plan_file))
    assert result.exit_code == code, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


def test_a_stream_that_ends_without_a_report_is_unreachable(agg, plan_file: Path) -> None:
    fake, address = agg
    fake.send_report = False
    result = validate(address, "--plan", str(plan_file))
    assert result.exit_code == ExitCode.UNREACHABLE
    assert "without a report" in result.stderr


def test_no_aggregator_listening_is_unreachable(plan_file: Path) -> None:
    import socket
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = validate(f"127.0.0.1:{port}", "--plan", str(plan_file))
    assert result.exit_code == ExitCode.UNREACHABLE, result.stderr


def test_help_names_the_findings_exit_code_and_needs_no_aggregator() -> None:
    result = CliRunner().invoke(cli, ["validate", "--help"], env={"LINKPASS_AGGREGATOR": None})
    assert result.exit_code == 0
    assert "8 the report has findings" in " ".join(result.stdout.split())
    for option in ("--plan", "--hosts", "--rails", "--duration", "--png", "--aggregator", "--insecure", "--ca"):
        assert option in result.stdout


def test_end_to_end_through_a_real_aggregator_with_fake_agents(plan_file: Path, tmp_path: Path) -> None:
    """The CLI's request passes the real aggregator's checks, and a planned
    host that is not connected makes the run exit 8 (it was not proven)."""
    import asyncio
    import contextlib
    import threading

    from agg_tls import insecure_settings, serving
    from test_agg_validation import connect_agents

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    stack = contextlib.AsyncExitStack()

    async def start() -> int:
        server = await stack.enter_async_context(serving(insecure_settings(tmp_path / "fleet.db")))
        ch = await stack.enter_async_context(grpc.aio.insecure_channel(f"127.0.0.1:{server.port}"))
        agents = await connect_agents(server, ch, {"gpu-001": "answer"}, rails=("rail0", "rail1"))
        stack.callback(lambda: [a.stop() for a in agents.values()])
        return server.port

    def call(coro):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(60)

    try:
        port = call(start())
        result = validate(f"127.0.0.1:{port}", "--plan", str(plan_file), "--duration", "1", "-o", "json")
        assert result.exit_code == ExitCode.FINDINGS, result.stderr
        # The aggregator runs in this process: its log lines share the captured stdout.
        lines = result.stdout.splitlines()
        doc = json.loads("\n".join(lines[lines.index("{"):lines.index("}") + 1]))
        assert {h["host_id"]: h["status"] for h in doc["hosts"]} == {"gpu-001": "ok", "gpu-002": "not connected"}
        assert [f["kind"] for f in doc["findings"]] == ["no_result"]
        result = validate(f"127.0.0.1:{port}", "--plan", str(plan_file), "--hosts", "gpu-001", "--duration", "1")
        assert result.exit_code == ExitCode.OK, (result.stdout, result.stderr)
        assert "no finding" in result.stdout
    finally:
        call(stack.aclose())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
