"""linkpassctl's exit codes, each class through the real CLI in its own
process: a script must be able to tell "daemon absent" from "bad argument"
from "refused" from "not found" (linkpassd/exitcodes.py has the table)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from linkpassd._proto.linkpass.v1 import control_pb2 as pb
from linkpassd._proto.linkpass.v1 import control_pb2_grpc as pb_grpc
from linkpassd.exitcodes import MEANINGS, ExitCode

REPO = Path(__file__).resolve().parents[2]


def ctl(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-m", "linkpassd.ctl.main", *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO)


def assert_exit(proc: subprocess.CompletedProcess, code: ExitCode, *words: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    if code not in (ExitCode.OK, ExitCode.USAGE):  # click's own usage text is several lines
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr


class FakeDaemon(pb_grpc.ControlServiceServicer):
    """Answers GetStatus and ExplainPort, or fails them as `abort` and `hang` say."""

    def __init__(self) -> None:
        self.abort: tuple[grpc.StatusCode, str] | None = None
        self.hang = False
        self.release = threading.Event()

    def GetStatus(self, request, context):  # gRPC's name
        if self.hang:
            self.release.wait(30)  # bounded; released at teardown
        if self.abort:
            context.abort(*self.abort)
        return pb.GetStatusResponse(status=pb.DaemonStatus(hostname="h1"))

    def ExplainPort(self, request, context):
        if self.abort:
            context.abort(*self.abort)
        return pb.ExplainPortResponse()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[FakeDaemon, str]]:
    path = str(tmp_path / "ctl.sock")
    fake = FakeDaemon()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_ControlServiceServicer_to_server(fake, server)
    server.add_insecure_port(f"unix:{path}")
    server.start()
    try:
        yield fake, path
    finally:
        fake.release.set()
        server.stop(grace=None).wait(10)


def test_ok_is_0(daemon) -> None:
    _, path = daemon
    proc = ctl("--socket", path, "status", "-o", "json")
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert '"hostname": "h1"' in proc.stdout


def test_no_socket_is_3(tmp_path: Path) -> None:
    assert_exit(ctl("--socket", str(tmp_path / "none.sock"), "status"), ExitCode.UNREACHABLE,
                "not running", "none.sock")


def test_a_file_that_is_not_a_socket_is_3(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("")
    assert_exit(ctl("--socket", str(plain), "status"), ExitCode.UNREACHABLE, "not a socket")


def test_nothing_listening_is_3(tmp_path: Path) -> None:
    """A socket file left behind by a daemon that is gone: connection refused."""
    path = str(tmp_path / "stale.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.close()
    assert_exit(ctl("--socket", path, "status"), ExitCode.UNREACHABLE, "nothing listens")


def test_deadline_is_3(daemon) -> None:
    fake, path = daemon
    fake.hang = True
    assert_exit(ctl("--socket", path, "--timeout", "0.5", "status"), ExitCode.UNREACHABLE,
                "did not answer within 0.5s")


def test_daemon_refusal_is_4_with_its_reason(daemon) -> None:
    fake, path = daemon
    fake.abort = (grpc.StatusCode.PERMISSION_DENIED, "drain needs root; you are alice (uid 1000)")
    assert_exit(ctl("--socket", path, "status"), ExitCode.REFUSED, "you are alice (uid 1000)")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to drop root's permission override")
def test_no_permission_on_the_socket_is_4(daemon) -> None:
    """Root without its capabilities is an ordinary user as far as file
    permissions go: a socket it cannot write to is refused, not absent."""
    _, path = daemon
    os.chown(path, 65534, 65534)
    os.chmod(path, 0o600)
    drop = ("setpriv", "--bounding-set", "-all", "--inh-caps", "-all")
    assert_exit(ctl("--socket", path, "status", prefix=drop), ExitCode.REFUSED, "permission denied")


def test_unknown_port_is_5(daemon) -> None:
    fake, path = daemon
    fake.abort = (grpc.StatusCode.NOT_FOUND, "no port eth9 in the config (ports: eth0, eth1)")
    assert_exit(ctl("--socket", path, "explain", "eth9"), ExitCode.NOT_FOUND, "no port eth9")


def test_daemon_rejecting_an_argument_is_2(daemon) -> None:
    fake, path = daemon
    fake.abort = (grpc.StatusCode.INVALID_ARGUMENT, "reason must not be empty")
    assert_exit(ctl("--socket", path, "explain", "eth0"), ExitCode.USAGE, "reason must not be empty")


def test_other_daemon_errors_are_1(daemon) -> None:
    fake, path = daemon
    fake.abort = (grpc.StatusCode.INTERNAL, "something broke")
    assert_exit(ctl("--socket", path, "status"), ExitCode.FAILURE, "INTERNAL", "something broke")


@pytest.mark.parametrize("args", [("status", "--output", "yaml"), ("no-such-command",),
                                  ("--timeout", "0", "status"), ("explain",)])
def test_usage_errors_are_2(tmp_path: Path, args: tuple[str, ...]) -> None:
    """Even without a daemon: the argument is checked first."""
    assert_exit(ctl("--socket", str(tmp_path / "none.sock"), *args), ExitCode.USAGE)


def test_help_lists_every_exit_code() -> None:
    proc = ctl("--help")
    assert proc.returncode == 0
    epilog = proc.stdout[proc.stdout.index("Exit codes:"):]
    for code in ExitCode:
        assert f"{int(code)}  {MEANINGS[code]}" in epilog, epilog


def test_operating_doc_documents_the_same_codes() -> None:
    doc = (REPO / "docs" / "operating.md").read_text()
    section = doc[doc.index("## Exit codes"):]
    section = section[:section.index("\n#")]
    for code in ExitCode:
        assert f"| {int(code)} |" in section, f"docs/operating.md's exit-code table lacks {int(code)}"
