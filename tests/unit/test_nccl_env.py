"""`linkpassctl nccl-env` through the real CLI, on health files written here."""

import json
import os
import re
import subprocess
import time
from dataclasses import replace

import pytest
from click.testing import CliRunner

from linkpassd.adapters.healthfile import HealthFile, own_pid_namespace
from linkpassd.core import drain as drains
from linkpassd.core import healthdoc
from linkpassd.core.model import Drain, PortState, Verdict
from linkpassd.ctl import main as ctl
from linkpassd.exitcodes import ExitCode
from tests.unit.corefixtures import ports, rails_config

RDMA = {"eth0": ("mlx5_0", 1), "eth1": ("mlx5_1", 1), "eth2": ("mlx5_3", 1)}


def write_doc(path, states=None, rdma=RDMA, written_at=None, valid_s=300.0, pid=None, n=3, pid_ns=None):
    """A document as a daemon in our PID namespace (unless `pid_ns`) writes it."""
    config = rails_config(n)
    doc = healthdoc.build("gpu17", "boot-1", 3, time.time() if written_at is None else written_at,
                          valid_s, os.getpid() if pid is None else pid, config.rails,
                          ports(config) if states is None else states, rdma,
                          pid_ns=own_pid_namespace() if pid_ns is None else pid_ns)
    HealthFile(str(path)).write(doc)
    return doc


def run(*args, env=None):
    return CliRunner().invoke(ctl.cli, ["nccl-env", *args], env=env)


def down(name, reason="carrier lost"):
    return PortState(name, Verdict.DOWN, False, "DOWN", since=1.0, evidence=(reason,))


def test_prints_exact_match_lists_of_the_usable_ports(tmp_path):
    path = tmp_path / "health.json"
    config = rails_config(3)
    write_doc(path, states=ports(config, eth1=down("eth1")))
    result = run("--file", str(path))
    assert result.exit_code == 0, result.output
    assert result.stdout == "NCCL_IB_HCA==mlx5_0:1,mlx5_3:1\nNCCL_SOCKET_IFNAME==eth0,eth2\n"
    assert result.stderr == ""


def test_a_drained_port_is_left_out(tmp_path):
    path = tmp_path / "health.json"
    config = rails_config(3)
    states = drains.apply(ports(config), {"eth0": Drain("eth0", "optic swap", "root (uid 0)", 1.0)})
    write_doc(path, states=states)
    assert run("--file", str(path)).stdout == ("NCCL_IB_HCA==mlx5_1:1,mlx5_3:1\n"
                                               "NCCL_SOCKET_IFNAME==eth1,eth2\n")


def test_export_format_survives_a_real_shell_eval(tmp_path):
    path = tmp_path / "health.json"
    config = rails_config(2)
    odd = "eth$(touch x)'1"  # not a real netdev name; the quoting must hold anyway
    states = {"eth0": ports(config)["eth0"], odd: PortState(odd, Verdict.UP, True, "UP", 1.0)}
    rails = (config.rails[0], replace(config.rails[1], port=odd))
    doc = healthdoc.build("gpu17", "b", 1, time.time(), 300.0, os.getpid(), rails, states, RDMA)
    HealthFile(str(path)).write(doc)
    result = run("--file", str(path), "--format", "export")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("export NCCL_IB_HCA==mlx5_0:1\nexport NCCL_SOCKET_IFNAME=")
    shell = subprocess.run(["bash", "-c", 'eval "$1"; printf "%s|%s" "$NCCL_IB_HCA" "$NCCL_SOCKET_IFNAME"',
                            "-", result.stdout], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert shell.stdout == f"=mlx5_0:1|=eth0,{odd}"
    assert not (tmp_path / "x").exists()


def test_json_format_names_the_document(tmp_path):
    path = tmp_path / "health.json"
    doc = write_doc(path)
    result = run("--file", str(path), "--format", "json")
    assert json.loads(result.stdout) == {
        "env": {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1,mlx5_3:1", "NCCL_SOCKET_IFNAME": "=eth0,eth1,eth2"},
        "hostname": "gpu17", "boot_id": "boot-1", "generation": 3, "written_at": doc.written_at}


def test_the_file_can_be_named_by_environment(tmp_path):
    path = tmp_path / "elsewhere.json"
    write_doc(path)
    result = run(env={"LINKPASS_HEALTH_FILE": str(path)})
    assert result.exit_code == 0 and "NCCL_SOCKET_IFNAME==eth0,eth1,eth2" in result.stdout


def test_no_usable_port_exits_no_usable_with_nothing_on_stdout(tmp_path):
    path = tmp_path / "health.json"
    config = rails_config(2)
    write_doc(path, states=ports(config, eth0=down("eth0"), eth1=down("eth1", "probe loss 40%")), n=2)
    result = run("--file", str(path))
    assert result.exit_code == ExitCode.NO_USABLE == 7
    assert result.stdout == ""
    assert result.stderr == ("linkpassctl: nccl-env: no usable port on gpu17: eth0 DOWN (carrier lost); "
                             "eth1 DOWN (probe loss 40%)\n")


def test_a_file_past_valid_until_is_refused_as_stale(tmp_path):
    path = tmp_path / "health.json"
    write_doc(path, written_at=time.time() - 100, valid_s=5.0)
    result = run("--file", str(path))
    assert result.exit_code == ExitCode.STALE == 6
    assert result.stdout == ""
    assert result.stderr.startswith(f"linkpassctl: nccl-env: {path}: not rewritten for ")
    assert result.stderr.count("\n") == 1


def test_a_file_of_a_dead_daemon_is_stale_at_once_unless_the_pid_cannot_be_checked(tmp_path):
    path = tmp_path / "health.json"
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=30)
    write_doc(path, pid=gone.pid)
    result = run("--file", str(path))
    assert result.exit_code == ExitCode.STALE
    assert f"pid {gone.pid}, which is no longer running" in result.stderr
    # In another PID namespace the pid means nothing: only valid_until applies.
    assert run("--file", str(path), "--no-pid-check").exit_code == 0


def test_own_pid_namespace_is_the_inode_of_proc_self_ns_pid(tmp_path):
    assert own_pid_namespace() == os.stat("/proc/self/ns/pid").st_ino > 0
    assert own_pid_namespace(str(tmp_path / "no-proc")) == 0


@pytest.mark.parametrize("daemon_ns", [1, 0], ids=["another-namespace", "namespace-unknown"])
def test_a_daemon_in_another_or_unknown_pid_namespace_is_not_called_gone_by_its_pid(tmp_path, daemon_ns):
    """In a container, the daemon's pid may name no process here (or another
    one): the pid check is skipped, valid_until still decides."""
    path = tmp_path / "health.json"
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=30)
    write_doc(path, pid=gone.pid, pid_ns=daemon_ns)
    result = run("--file", str(path))
    assert result.exit_code == 0, result.output
    assert result.stdout == "NCCL_IB_HCA==mlx5_0:1,mlx5_1:1,mlx5_3:1\nNCCL_SOCKET_IFNAME==eth0,eth1,eth2\n"
    write_doc(path, pid=gone.pid, pid_ns=daemon_ns, written_at=time.time() - 100, valid_s=5.0)
    assert run("--file", str(path)).exit_code == ExitCode.STALE


def test_a_file_marked_stopped_is_refused(tmp_path):
    path = tmp_path / "health.json"
    hf = HealthFile(str(path))
    hf.mark_stopped(write_doc(path))
    result = run("--file", str(path))
    assert result.exit_code == ExitCode.STALE and "linkpassd stopped at" in result.stderr
    # issue 28: a date with its zone, never raw unix seconds
    assert re.search(r"stopped at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d;", result.stderr), result.stderr
    assert "unix time" not in result.stderr


@pytest.mark.parametrize("content, named", [
    (None, "no such file"),
    (b"not json", "not JSON"),
    (b'{"format": 1, "hostname": "h"}', "ports: missing"),
])
def test_a_missing_or_unreadable_file_exits_stale_naming_why(tmp_path, content, named):
    path = tmp_path / "health.json"
    if content is not None:
        path.write_bytes(content)
    result = run("--file", str(path))
    assert result.exit_code == ExitCode.STALE
    assert result.stdout == ""
    assert str(path) in result.stderr and named in result.stderr and result.stderr.count("\n") == 1


def test_a_bad_format_option_is_a_usage_error(tmp_path):
    assert run("--format", "yaml").exit_code == ExitCode.USAGE


# ---------------------------------------------------------------- --port-failover (NCCL 2.29.7+)

RDMA4 = {f"eth{i}": (f"mlx5_{i}", 1) for i in range(4)}


def test_port_failover_adds_the_switch_and_merges_only_usable_ports(tmp_path):
    path = tmp_path / "health.json"
    config = rails_config(4)
    write_doc(path, states=ports(config, eth2=down("eth2")), rdma=RDMA4, n=4)
    result = run("--file", str(path), "--port-failover", "2.29.7")
    assert result.exit_code == 0, result.output
    assert result.stdout == ("NCCL_IB_HCA==mlx5_0:1,mlx5_1:1,mlx5_3:1\n"
                             "NCCL_SOCKET_IFNAME==eth0,eth1,eth3\n"
                             "NCCL_IB_RESILIENCY_PORT_FAILOVER=1\n"
                             "NCCL_NET_FORCE_MERGE=mlx5_0:1,mlx5_1:1\n")
    # eth2 is down: its partner cannot fail over, and the launcher's log says so
    assert result.stderr == ("linkpassctl: nccl-env: note: no failover for mlx5_3:1: no other usable "
                             "port in its merge group (groups of 2 in rail order)\n")


def test_port_failover_export_with_two_groups_survives_a_real_shell_eval(tmp_path):
    path = tmp_path / "health.json"
    write_doc(path, rdma=RDMA4, n=4)
    result = run("--file", str(path), "--port-failover", "2.30.3+cuda12.9", "--format", "export")
    assert result.exit_code == 0, result.output
    shell = subprocess.run(["bash", "-c", 'eval "$1"; printf "%s|%s" "$NCCL_IB_RESILIENCY_PORT_FAILOVER" '
                            '"$NCCL_NET_FORCE_MERGE"', "-", result.stdout],
                           capture_output=True, text=True, timeout=30)
    assert shell.stdout == "1|mlx5_0:1,mlx5_1:1;mlx5_2:1,mlx5_3:1"


def test_port_failover_merge_size_and_json(tmp_path):
    path = tmp_path / "health.json"
    write_doc(path, rdma=RDMA4, n=4)
    result = run("--file", str(path), "--port-failover", "v2.29.7-1", "--merge-size", "4",
                 "--format", "json")
    assert result.exit_code == 0, result.output
    env = json.loads(result.stdout)["env"]
    assert env["NCCL_NET_FORCE_MERGE"] == "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert env["NCCL_IB_RESILIENCY_PORT_FAILOVER"] == "1"


def test_the_help_says_what_nccls_port_failover_waits_for_and_what_it_cannot_do():
    result = run("--help")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())  # click wraps the help to the terminal's width
    assert "NCCL_IB_RESILIENCY_PORT_FAILOVER=1" in text and "2.29.7 or later" in text
    assert "only on its completion error (for a port that silently stops delivering: after the IB retry timer)" in text
    assert "one failed port per merged NIC" in text


@pytest.mark.parametrize("version", ["2.29.6", "2.28.9-1", "2.18.3+cuda12.2"])
def test_port_failover_for_an_nccl_before_2_29_7_is_refused_naming_the_version(tmp_path, version):
    path = tmp_path / "health.json"
    write_doc(path)
    result = run("--file", str(path), "--port-failover", version)
    assert result.exit_code == ExitCode.USAGE
    assert result.stdout == ""
    shown = version.split("-")[0].split("+")[0]
    assert f"NCCL {shown} has no port failover" in result.stderr and "2.29.7" in result.stderr


@pytest.mark.parametrize("version", ["2.29", "latest", "2.29.7.1", ""])
def test_a_malformed_nccl_version_is_a_usage_error_naming_it(tmp_path, version):
    path = tmp_path / "health.json"
    write_doc(path)
    result = run("--file", str(path), "--port-failover", version)
    assert result.exit_code == ExitCode.USAGE
    assert result.stdout == ""
    assert f"{version!r} is not an NCCL version" in result.stderr


@pytest.mark.parametrize("args", [["--merge-size", "2"], ["--port-failover", "2.29.7", "--merge-size", "5"],
                                  ["--port-failover", "2.29.7", "--merge-size", "1"]])
def test_a_merge_size_alone_or_out_of_range_is_a_usage_error(tmp_path, args):
    path = tmp_path / "health.json"
    write_doc(path)
    result = run("--file", str(path), *args)
    assert result.exit_code == ExitCode.USAGE and result.stdout == ""
    assert "--merge-size" in result.stderr


def test_port_failover_does_not_change_the_refusal_of_a_host_without_usable_ports(tmp_path):
    path = tmp_path / "health.json"
    config = rails_config(2)
    write_doc(path, states=ports(config, eth0=down("eth0"), eth1=down("eth1")), n=2)
    result = run("--file", str(path), "--port-failover", "2.29.7")
    assert result.exit_code == ExitCode.NO_USABLE and result.stdout == ""
