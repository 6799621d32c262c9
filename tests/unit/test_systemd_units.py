"""`systemd-analyze verify` on the shipped unit files.

verify fails when an ExecStart= binary does not exist, and in a checkout
/usr/bin/linkpassd is not installed. So we verify a temporary copy whose
ExecStart points at an executable that exists, with the unit's own file name.
Everything else in the unit (directives, capability names, syscall sets,
dependencies) is verified as shipped; only the program path is not, and
test_exec_start_is_the_documented_path pins that separately.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

UNIT_DIR = Path(__file__).resolve().parents[2] / "systemd"
UNITS = {
    "linkpassd.service": "/usr/bin/linkpassd --config /etc/linkpass/linkpassd.toml",
    "linkpass-aggregator.service": "/usr/bin/linkpass-aggregator --config /etc/linkpass/aggregator.toml",
}


def exec_start(text: str) -> str:
    return next(line.split("=", 1)[1] for line in text.splitlines() if line.startswith("ExecStart="))


@pytest.mark.parametrize("unit", sorted(UNITS))
def test_exec_start_is_the_documented_path(unit: str) -> None:
    assert exec_start((UNIT_DIR / unit).read_text()).startswith(UNITS[unit])


def test_linkpassd_unit_essentials() -> None:
    lines = set((UNIT_DIR / "linkpassd.service").read_text().splitlines())
    for expected in (
        "Type=notify",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "Restart=on-failure",
        "RuntimeDirectory=linkpass",
        "RuntimeDirectoryPreserve=yes",
        "CapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_RAW",
        "AmbientCapabilities=CAP_NET_ADMIN CAP_NET_RAW",
        "StateDirectory=linkpass",
        "SupplementaryGroups=linkpass",
        "LimitRTPRIO=1",  # the responder's SCHED_FIFO 1 without CAP_SYS_NICE
    ):
        assert expected in lines
    # netlink must stay reachable whatever else is hardened
    families = next(line for line in lines if line.startswith("RestrictAddressFamilies="))
    assert "AF_NETLINK" in families.split("=", 1)[1].split()
    assert not any(line.startswith(("PrivateNetwork=", "IPAddressDeny=")) for line in lines)


def setting(unit: str, key: str) -> str:
    lines = (UNIT_DIR / unit).read_text().splitlines()
    values = [line.split("=", 1)[1] for line in lines if line.startswith(f"{key}=")]
    assert len(values) == 1, f"{unit}: expected one {key}=, found {values}"
    return values[0]


def test_the_responder_may_take_the_real_time_priority_the_unit_allows() -> None:
    """LimitRTPRIO= lets the echo responder (linkpassd/responder.py) ask for
    SCHED_FIFO at that priority without CAP_SYS_NICE; RestrictRealtime=yes
    would refuse it anyway (its system call filter denies every real-time
    policy, whatever the limit), leaving the responder at normal priority."""
    from linkpassd import responder

    unit = "linkpassd.service"
    assert int(setting(unit, "LimitRTPRIO")) == responder.RT_PRIORITY
    assert setting(unit, "RestrictRealtime").lower() not in ("yes", "true", "1", "on")


def test_linkpassd_starts_without_the_certificate_check() -> None:
    """No ExecStartPre: --check-config's host_id check (exit 3) must never keep a
    host from being protected; a bad config still stops the start (exit 2,
    below), with the key named."""
    text = (UNIT_DIR / "linkpassd.service").read_text()
    assert not any(line.startswith("ExecStartPre=") for line in text.splitlines())


def test_a_bad_config_exit_status_is_not_restarted(tmp_path: Path) -> None:
    """The status RestartPreventExitStatus= names is the one linkpassd really
    exits with on a bad config (a crash, exit 1, is still restarted)."""
    from linkpassd.daemon import cli as daemon

    bad = tmp_path / "linkpassd.toml"
    bad.write_text("[daemon]\nno_such_key = 1\n")
    status = daemon.main(["--config", str(bad)])
    assert status != 0 and str(status) in setting("linkpassd.service",
                                                  "RestartPreventExitStatus").split()
    assert "1" not in setting("linkpassd.service", "RestartPreventExitStatus").split()


def test_aggregator_unit_checks_its_config_and_does_not_restart_on_a_bad_one(tmp_path: Path) -> None:
    """Type=notify with a watchdog; ExecStartPre checks the file ExecStart
    serves; the exit status of a bad config at start is the one
    RestartPreventExitStatus= names (a crash, 1, is still restarted)."""
    from linkpassd.aggregator import main as aggregator

    unit = "linkpass-aggregator.service"
    assert setting(unit, "Type") == "notify" and setting(unit, "NotifyAccess") == "main"
    assert setting(unit, "WatchdogSec").endswith("s")
    pre = setting(unit, "ExecStartPre").split()
    start = setting(unit, "ExecStart").split()
    assert pre[0] == start[0] and "--check-config" in pre
    assert pre[pre.index("--config") + 1] == start[start.index("--config") + 1]
    bad = tmp_path / "aggregator.toml"
    bad.write_text("[aggregator]\nno_such_key = 1\n")
    status = aggregator.main(["--config", str(bad)])
    assert status != 0 and str(status) in setting(unit, "RestartPreventExitStatus").split()
    assert "1" not in setting(unit, "RestartPreventExitStatus").split()
    assert setting(unit, "DynamicUser") == "yes" and setting(unit, "CapabilityBoundingSet") == ""


def test_the_daemon_writes_only_where_the_unit_lets_it() -> None:
    """ProtectSystem=strict leaves writable only the unit's StateDirectory=
    and RuntimeDirectory=: the config's defaults for every directory the
    daemon writes (state, run, the control socket) lie in them, and the
    daemon is a member of the control socket's default group, which it gives
    the socket without CAP_CHOWN (tests/netns/test_hardened_unit.py runs it)."""
    from linkpassd.config.schema import DAEMON

    unit = "linkpassd.service"
    assert setting(unit, "ProtectSystem") == "strict"
    default = {o.key: o.default for o in DAEMON.options}
    assert default["state_dir"] == f"/var/lib/{setting(unit, 'StateDirectory')}"
    run_dir = f"/run/{setting(unit, 'RuntimeDirectory')}"
    assert default["run_dir"] == run_dir
    assert default["control_socket"].startswith(run_dir + "/")
    assert default["control_group"] in setting(unit, "SupplementaryGroups").split()
    assert "CAP_CHOWN" not in setting(unit, "CapabilityBoundingSet").split()


def test_without_the_group_the_socket_error_names_the_fix(tmp_path: Path) -> None:
    """Without CAP_CHOWN (the unit's bounding set) and without membership of
    the control group, binding the socket fails with one message naming the
    group and SupplementaryGroups=, not a PermissionError traceback."""
    import os
    import sys

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv")
    code = ("import sys; from pathlib import Path\n"
            "from linkpassd.adapters.control_server import ControlSocketError, _bind_public_socket\n"
            "try:\n"
            f"    _bind_public_socket(Path({str(tmp_path / 's.sock')!r}), 'daemon', 1)\n"
            "except ControlSocketError as exc:\n"
            "    print(exc); sys.exit(3)\n")
    proc = subprocess.run(["setpriv", "--bounding-set=-all,+net_admin,+net_raw", "--clear-groups",
                           sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "group 'daemon'" in proc.stdout and "SupplementaryGroups=daemon" in proc.stdout, proc.stdout


def test_fd_limits_fit_the_fleet() -> None:
    """The default soft limit (1,024) stops an aggregator near 1,000 hosts:
    the units set their own, the aggregator's with room for 2 connections
    per host of a 2,048-host fleet and more."""
    daemon = int(setting("linkpassd.service", "LimitNOFILE"))
    aggregator = int(setting("linkpass-aggregator.service", "LimitNOFILE"))
    assert daemon >= 4096
    assert aggregator >= 4 * 2 * 2048


def test_watchdog_interval_leaves_room_for_the_reconcile_loop() -> None:
    """Pings go out only after reconcile progress (a Tick every tick_interval_s)
    at half the interval: the interval must cover several ticks."""
    from linkpassd.core.model import Timers

    value = setting("linkpassd.service", "WatchdogSec")
    assert value.endswith("s") and value[:-1].isdigit(), value
    assert int(value[:-1]) >= 8 * Timers().tick_interval_s
    assert setting("linkpassd.service", "NotifyAccess") == "main"  # pings come from the daemon


@pytest.mark.parametrize("unit", sorted(UNITS))
def test_systemd_analyze_verify(unit: str, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    stand_in = shutil.which("true")
    assert stand_in, "need an existing executable to stand in for the uninstalled binary"
    text = (UNIT_DIR / unit).read_text()
    program = exec_start(text).split()[0]
    copy = tmp_path / unit
    # ExecStartPre= runs the same (uninstalled) program: stand in for it too.
    copy.write_text(text.replace(f"ExecStart={program}", f"ExecStart={stand_in}")
                    .replace(f"ExecStartPre={program}", f"ExecStartPre={stand_in}"))
    proc = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, timeout=120)
    # verify also reports problems in unrelated units installed on this host;
    # only lines about our unit count.
    ours = [line for line in (proc.stdout + proc.stderr).splitlines() if unit in line]
    assert proc.returncode == 0 and not ours, proc.stdout + proc.stderr
