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
