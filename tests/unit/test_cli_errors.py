"""Bad input at the process boundary: the real binaries print one line that
names the file and the key, exit non-zero, and never show a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

GOOD_RAIL = '[[rail]]\nname = "rail0"\nport = "eth0"\naddress = "198.18.0.1/24"\ngateway = "198.18.0.254"\n'

# (config text, the key path the error must name)
MALFORMED = [
    ("[daemon]\nlog_levle = 'info'\n" + GOOD_RAIL, "daemon.log_levle"),
    ("[daemon]\nlog_level = 'loud'\n" + GOOD_RAIL, "daemon.log_level"),
    ("[ownership]\nroute_protocol = 2\n" + GOOD_RAIL, "ownership.route_protocol"),
    ("[ownership]\ntable_min = 200\ntable_max = 100\n" + GOOD_RAIL, "ownership.table_min"),
    ("[timers]\nrise = 0\n" + GOOD_RAIL, "timers.rise"),
    ("[timers]\nhold_down_s = 'long'\n" + GOOD_RAIL, "timers.hold_down_s"),
    ("[routing]\nroce_rules = 1\n" + GOOD_RAIL, "routing.roce_rules"),
    (GOOD_RAIL.replace("198.18.0.254", "198.18.0.300"), "rail[0].gateway"),
    (GOOD_RAIL.replace("198.18.0.254", "198.18.7.1"), "rail[0].gateway"),
    (GOOD_RAIL.replace("/24", ""), "rail[0].address"),
    (GOOD_RAIL + 'backups = ["rail9"]\n', "rail[0].backups[0]"),
    (GOOD_RAIL + "table = 5\n", "rail[0].table"),
    (GOOD_RAIL + GOOD_RAIL.replace('"eth0"', '"eth1"').replace("0.1/", "0.2/"), "rail[1].name"),
    (GOOD_RAIL + '[[multipath]]\nname = "f"\ndestination = "198.19.0.0/16"\nrails = []\n',
     "multipath[0].rails"),
    (GOOD_RAIL + '[[multipath]]\nname = "f"\ndestination = "198.19.0.0/33"\nrails = ["rail0"]\n',
     "multipath[0].destination"),
    ("[bogus]\nx = 1\n" + GOOD_RAIL, "bogus"),
    ('[sensors]\nbackend = "snmp"\n' + GOOD_RAIL, "sensors.backend"),
    ("[health]\nflap_reuse = 3000\n" + GOOD_RAIL, "health.flap_reuse"),
]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("text,key", MALFORMED, ids=[k for _, k in MALFORMED])
@pytest.mark.parametrize("mode", ["--check-config", "--config"])
def test_malformed_config_gives_one_line_naming_file_and_key(tmp_path, text, key, mode):
    path = tmp_path / "linkpassd.toml"
    path.write_text(text)
    proc = run("linkpassd.daemon", mode, str(path))
    assert proc.returncode != 0
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert str(path) in lines[0] and f"{key}:" in lines[0]
    assert "Traceback" not in proc.stderr


def test_the_malformed_configs_are_distinct_failures():
    assert len({key for _, key in MALFORMED}) >= 10


@pytest.mark.parametrize("target", ["/nonexistent/linkpassd.toml", "/"])
def test_unreadable_config_path_is_one_line(target):
    proc = run("linkpassd.daemon", "--check-config", target)
    assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1
    assert target in proc.stderr and "Traceback" not in proc.stderr


def test_linkpassctl_without_a_daemon_is_one_line(tmp_path):
    proc = run("linkpassd.ctl.main", "--socket", str(tmp_path / "none.sock"), "status")
    assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


def test_aggregator_without_its_config_names_the_file():
    proc = run("linkpassd.aggregator.main", "--config", "/nonexistent/aggregator.toml")
    assert proc.returncode == 2 and "/nonexistent/aggregator.toml: cannot read" in proc.stderr
