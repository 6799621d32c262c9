"""linkpassd's entry point as an operator meets it: --help, the two forms of
--check-config (shared with linkpass-aggregator), the host_id against the
client certificate, and one daemon per run directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agg_tls import certs
from linkpassd.adapters.instancelock import InstanceLock
from linkpassd.aggregator import main as agg_main
from linkpassd.daemon import cli as daemon

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 60


def daemon_config(tmp_path: Path, aggregator: str = "") -> Path:
    """A one-rail config whose every path is under tmp_path."""
    path = tmp_path / "linkpassd.toml"
    path.write_text(f"""\
[daemon]
control_socket = "{tmp_path}/run/linkpassd.sock"
run_dir = "{tmp_path}/run"
state_dir = "{tmp_path}/state"
{aggregator}
[[rail]]
name = "rail0"
port = "lp-nonexist0"
address = "198.18.0.1/24"
gateway = "198.18.0.254"
""")
    return path


def aggregator_section(pki: Path, cert: str, host_id: str = "") -> str:
    return (f'[aggregator]\naddress = "127.0.0.1:7443"\nhost_id = "{host_id}"\n'
            f'ca = "{pki}/ca.pem"\ncert = "{pki}/{cert}.pem"\nkey = "{pki}/{cert}-key.pem"\n')


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pki") / "pki"
    certs("ca", str(d))
    certs("host", str(d), "gpu-node-017")
    certs("operator", str(d), "alice")
    return d


def run_linkpassd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "linkpassd.daemon", *args], capture_output=True,
                          text=True, timeout=DEADLINE_S, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_help_is_written_for_an_operator(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        daemon.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "asyncio" not in out and "pure core" not in out  # issue 28: was "the asyncio shell ..."
    assert "healthy links" in out and "linkpassctl" in out and "Exit status" in out


@pytest.mark.parametrize("form", [["--check-config", "{f}"], ["--config", "{f}", "--check-config"],
                                  ["--check-config", "{f}", "--config", "{f}"]])
def test_check_config_takes_both_forms(tmp_path: Path, capsys, form) -> None:
    path = daemon_config(tmp_path)
    assert daemon.main([a.format(f=path) for a in form]) == 0
    assert capsys.readouterr().out == f"OK: {path}: 1 rail, 0 multipath groups\n"


def test_check_config_refuses_two_different_files(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        daemon.main(["--config", "/etc/a.toml", "--check-config", "/etc/b.toml"])
    assert exit_.value.code == 2
    assert "name two files" in capsys.readouterr().err


def test_the_aggregator_takes_both_forms_too(tmp_path: Path, capsys) -> None:
    config = tmp_path / "aggregator.toml"
    config.write_text(f'[aggregator]\nlisten = "127.0.0.1:0"\ndatabase = "{tmp_path}/fleet.db"\n'
                      '[tls]\ninsecure = true\n')
    for argv in (["--check-config", str(config)], ["--config", str(config), "--check-config"]):
        assert agg_main.main(argv) == 0, capsys.readouterr().err
        assert capsys.readouterr().out.startswith("OK: ")


def test_check_config_accepts_a_certificate_naming_the_host_id(tmp_path: Path, pki: Path, capsys) -> None:
    path = daemon_config(tmp_path, aggregator_section(pki, "gpu-node-017", host_id="gpu-node-017"))
    assert daemon.main(["--check-config", str(path)]) == 0, capsys.readouterr().err


def test_check_config_names_host_id_and_certificate_when_they_differ(tmp_path: Path, pki: Path) -> None:
    """Issue 28: a host whose host_id the aggregator refuses passed --check-config."""
    path = daemon_config(tmp_path, aggregator_section(pki, "gpu-node-017", host_id="gpu-node-71"))
    result = run_linkpassd("--check-config", str(path))
    assert result.returncode == 3 and result.stdout == ""
    err = result.stderr
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "host_id 'gpu-node-71' (from [aggregator] host_id)" in err
    assert f"{pki}/gpu-node-017.pem" in err and "names host 'gpu-node-017'" in err
    assert 'set [aggregator] host_id = "gpu-node-017"' in err


def test_check_config_refuses_a_certificate_that_names_no_host(tmp_path: Path, pki: Path, capsys) -> None:
    path = daemon_config(tmp_path, aggregator_section(pki, "alice", host_id="gpu-node-017"))
    assert daemon.main(["--check-config", str(path)]) == 3
    err = capsys.readouterr().err
    assert "URI:linkpass://operator/alice" in err and "names no host" in err


def test_without_host_id_the_host_name_is_checked(tmp_path: Path, pki: Path, capsys) -> None:
    import socket
    path = daemon_config(tmp_path, aggregator_section(pki, "gpu-node-017"))
    expected = 0 if socket.gethostname() == "gpu-node-017" else 3
    assert daemon.main(["--check-config", str(path)]) == expected
    if expected:
        assert f"host_id '{socket.gethostname()}' (from this host's name" in capsys.readouterr().err


def test_a_second_daemon_exits_with_one_line_naming_the_first(tmp_path: Path) -> None:
    """Issue 28: a second linkpassd on the same config died with a traceback
    after starting probes. Now it stops before touching anything."""
    path = daemon_config(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from linkpassd.adapters.instancelock import InstanceLock; "
         f"InstanceLock({str(tmp_path / 'run')!r}).acquire(); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline() == "held\n"
        result = run_linkpassd("--config", str(path))
        assert result.returncode == 1, result.stderr
        assert result.stderr.splitlines() == [
            f"linkpassd: another linkpassd (pid {holder.pid}) is running with this run_dir: it holds "
            f"{tmp_path}/run/linkpassd.lock; stop it first, or give this one another run_dir"]
        assert sorted(os.listdir(tmp_path / "run")) == ["linkpassd.lock"]  # no socket, no health file
        assert not (tmp_path / "state").exists()
    finally:
        holder.kill()
        holder.wait(DEADLINE_S)


def test_the_lock_is_free_again_when_its_holder_is_gone(tmp_path: Path) -> None:
    first = InstanceLock(str(tmp_path / "run"))
    first.acquire()
    assert (tmp_path / "run" / "linkpassd.lock").read_text() == f"{os.getpid()}\n"
    with pytest.raises(Exception, match=f"pid {os.getpid()}"):
        InstanceLock(str(tmp_path / "run")).acquire()
    first.release()
    again = InstanceLock(str(tmp_path / "run"))
    again.acquire()  # a stale file blocks nothing
    again.release()
