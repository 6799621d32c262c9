"""Issue 30, item 9, on the host: a control-socket parent that is a regular
file passed `--check-config` and then killed linkpassd with a traceback (a
restart loop under systemd)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from linkpassd.adapters.control_server import ControlSocketError, _prepare_socket_path
from linkpassd.config import check_config_main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "linkpassd.toml"


def _config(tmp_path: Path, socket_path: Path) -> Path:
    text = re.sub(r'(?m)^control_socket = .*$', f'control_socket = "{socket_path}"', EXAMPLE.read_text())
    path = tmp_path / "linkpassd.toml"
    path.write_text(text)
    return path


def test_check_config_refuses_a_socket_parent_that_is_a_regular_file(tmp_path: Path, capsys) -> None:
    (tmp_path / "run").write_text("not a directory\n")
    assert check_config_main(_config(tmp_path, tmp_path / "run" / "linkpass" / "linkpassd.sock")) == 1
    err = capsys.readouterr().err
    assert "control_socket" in err and f"{tmp_path / 'run'} is not a directory (it is a regular file)" in err


def test_check_config_refuses_a_socket_path_that_is_not_a_socket(tmp_path: Path, capsys) -> None:
    (tmp_path / "linkpassd.sock").write_text("")
    assert check_config_main(_config(tmp_path, tmp_path / "linkpassd.sock")) == 1
    assert "exists and is not a socket" in capsys.readouterr().err


def test_check_config_accepts_a_socket_dir_still_to_be_made(tmp_path: Path, capsys) -> None:
    assert check_config_main(_config(tmp_path, tmp_path / "not" / "yet" / "linkpassd.sock")) == 0
    assert capsys.readouterr().out.startswith("OK:")


def test_starting_with_a_file_for_a_parent_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "run").write_text("")
    with pytest.raises(ControlSocketError, match="cannot make the control socket .*Not a directory"):
        _prepare_socket_path(tmp_path / "run" / "linkpassd.sock")


def _hold_udp_port() -> tuple:
    """Another process (as any local user could) holding a UDP port on loopback."""
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-c",
                             "import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM);"
                             "s.bind(('127.0.0.1', 0)); print(s.getsockname()[1], flush=True); sys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    return proc, port


def test_a_foreign_process_on_the_echo_port_is_a_status_problem() -> None:
    """Item 9: an unprivileged process that bound UDP 4793 first received the
    probes, and `status` showed no problem."""
    import socket
    import types

    from linkpassd import config as configmod
    from linkpassd.adapters import udpholders
    from linkpassd.daemon.loop import Daemon

    proc, port = _hold_udp_port()
    try:
        daemon = Daemon(configmod.load_config(EXAMPLE), str(EXAMPLE))
        daemon.probes.echo_spec = types.SimpleNamespace(port=port)
        daemon.started_wall = daemon.started_mono = 0.0
        problems = [p for p in daemon.report.problems() if p.kind == "echo_port"]
        assert len(problems) == 1 and f"127.0.0.1:{port}" in problems[0].detail
        assert f"UDP port {port}" in problems[0].what
        own = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # our own socket is not foreign
        try:
            own.bind(("127.0.0.1", 0))
            assert udpholders.holders(own.getsockname()[1]) and not udpholders.foreign(own.getsockname()[1])
        finally:
            own.close()
    finally:
        proc.stdin.close()
        proc.wait(10)
    assert [p for p in daemon.report.problems() if p.kind == "echo_port"] == []  # gone when the port is let go
