"""What a module says about itself, end to end: raw EEPROM pages in a sim file,
the production decoders, the optics judgement, health, policy and the kernel.

Each test runs the real linkpassd with the `sim` sensor backend reading
module memory built byte by byte (labs.simsensor.CmisModule; format in
labs/simsensor.md), so nothing between the bytes and the route is
stubbed. The kernel's routes are read with `ip -j`, the daemon's view with
`linkpassctl`.

Where a test shows that something does *not* happen (a port with blank
thresholds is not drained), the other rail is the witness: its module is
made to flag RX LOS after the first port's change was seen, both ports are
read in the same sensor pass, so by the time the witness's port has
confirmed its degradation the first port has had as many readings.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from labs.daemonproc import DaemonProcess, assessment, rail_config_toml
from labs.netnslib import wait_for_sync
from labs.simsensor import CmisModule, SimSensor

pytestmark = pytest.mark.netns

NH0, NH1 = 1_000_100, 1_000_101
RAIL0_TABLE, RAIL1_TABLE = 10100, 10101
DEADLINE_S = 15.0  # generous: confirmation needs 3 readings 0.2 s apart, on a busy machine


@pytest.fixture
def optics_lab(lab, tmp_path):
    """linkpassd reading every port's module from raw EEPROM sim files, each
    port starting with a healthy module; yields (daemon, {port: SimSensor})."""
    sim_dir = tmp_path / "sim"
    writers = {r.port: SimSensor(sim_dir / f"{r.port}.json", r.port) for r in lab.rails}
    for port, writer in writers.items():
        writer.write_eeprom(CmisModule(serial=f"SIM-{port}").pages())
    sensors = (f'[sensors]\nbackend = "sim"\nsim_dir = "{sim_dir}"\n'
               "optics_interval_s = 0.2\ncounters_interval_s = 0.2\n")
    cfg = tmp_path / "linkpassd.toml"
    sock = str(tmp_path / "ctl.sock")
    cfg.write_text(rail_config_toml(sock, str(tmp_path), lab.rails, rise=2, hold_down_s=1.0,
                                    tick_interval_s=0.1, extra=sensors))
    with DaemonProcess(lab.host.name, cfg, sock, tmp_path / "linkpassd.log") as daemon:
        daemon.wait_ready()
        for port in writers:
            wait_for_sync(lambda p=port: optics(daemon, p).get("status") == "ok", DEADLINE_S,
                          f"{port}: healthy module decoded and judged ok")
        assert lab.host.route_nhid(RAIL0_TABLE) == NH0
        assert lab.host.route_nhid(RAIL1_TABLE) == NH1
        yield daemon, writers


def optics(daemon: DaemonProcess, port: str) -> dict:
    return assessment(daemon.status(), port, "optics")


def port_state(daemon: DaemonProcess, port: str) -> dict:
    return next(p for p in (daemon.status() or {}).get("ports", []) if p["port"] == port)


def ctl(daemon: DaemonProcess, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "linkpassd.ctl.main", "--socket",
                           daemon.socket_path, "--timeout", "5", *args],
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def drained(lab, daemon: DaemonProcess, port: str, table: int, backup_nh: int, what: str) -> dict:
    """Wait until `port` is DEGRADED and its rail table routes via the backup."""
    wait_for_sync(lambda: lab.host.route_nhid(table) == backup_nh, DEADLINE_S,
                  f"{what}: rail table {table} moved to the backup")
    state = port_state(daemon, port)
    assert state["verdict"] == "VERDICT_DEGRADED", state
    return state


@pytest.mark.parametrize("module, flags", [
    (CmisModule(rx_power_low_alarm_lanes=(1,)), "rx_power_low_alarm[1]"),
    (CmisModule(rx_los_lanes=(1,), rx_power_low_alarm_lanes=(1,)), "rx_los[1], rx_power_low_alarm[1]"),
    (CmisModule(module_fault=True), "module_fault"),
], ids=["rx-power-low-alarm-flag", "rx-los-and-low-alarm-flags", "module-fault"])
def test_a_module_flagging_a_fault_drains_its_port_though_its_readings_are_fine(
        lab, optics_lab, module, flags):
    daemon, writers = optics_lab
    port0 = lab.rails[0].port
    assert all(-2.0 < dbm < -1.0 for dbm in module.rx_dbm)  # nothing in the values
    writers[port0].write_eeprom(module.pages())
    state = drained(lab, daemon, port0, RAIL0_TABLE, NH1, flags)
    assert f"optics: module flags {flags}" in " ".join(state["evidence"])
    a = optics(daemon, port0)
    assert a["status"] == "degraded" and flags in a["detail"]
    assert lab.host.route_nhid(RAIL1_TABLE) == NH1  # the other rail is untouched
    assert f"module flags {flags}" in ctl(daemon, "explain", port0)

    writers[port0].write_eeprom(CmisModule().pages())  # the module recovers: traffic returns
    wait_for_sync(lambda: lab.host.route_nhid(RAIL0_TABLE) == NH0, DEADLINE_S, "fail-back")


def witness_drains(lab, daemon, writers) -> None:
    """Rail 1's module flags RX LOS; returns once rail 1 is drained (see module docstring)."""
    port1 = lab.rails[1].port
    writers[port1].write_eeprom(CmisModule(rx_los_lanes=(0,)).pages())
    drained(lab, daemon, port1, RAIL1_TABLE, NH0, "witness rail1 RX LOS")


def test_a_blank_threshold_page_is_thresholds_unreadable_and_drains_nothing(lab, optics_lab):
    """All-0xFF page 02h decodes to RX levels of 8.16 dBm: judged as levels,
    every healthy -1.5 dBm lane would be "below the low alarm"."""
    daemon, writers = optics_lab
    port0 = lab.rails[0].port
    writers[port0].write_eeprom(CmisModule(threshold_fill=0xFF).pages())
    wait_for_sync(lambda: optics(daemon, port0).get("status") == "thresholds unreadable",
                  DEADLINE_S, "blank thresholds reported as unreadable")
    witness_drains(lab, daemon, writers)

    assert lab.host.route_nhid(RAIL0_TABLE) == NH0
    state = port_state(daemon, port0)
    assert state["verdict"] == "VERDICT_UP", state
    a = optics(daemon, port0)
    assert a["status"] == "thresholds unreadable" and "rx_power_dbm" in a["detail"]
    assert "below" not in a["detail"]
    assert "thresholds unreadable" in ctl(daemon, "explain", port0)
    links = ctl(daemon, "links")
    assert "thresholds unreadable" in links
    optics_row = next(line for line in links.splitlines()
                      if line.startswith(port0) and "LINKPASS-SIM" in line)
    assert "unreadable" in optics_row and "!" not in optics_row  # no marks against blank levels


def test_a_blank_threshold_page_does_not_hide_the_module_flags(lab, optics_lab):
    daemon, writers = optics_lab
    port0 = lab.rails[0].port
    writers[port0].write_eeprom(CmisModule(threshold_fill=0xFF, rx_los_lanes=(2,)).pages())
    state = drained(lab, daemon, port0, RAIL0_TABLE, NH1, "RX LOS behind blank thresholds")
    evidence = " ".join(state["evidence"])
    assert "module flags rx_los[2]" in evidence and "thresholds unreadable" in evidence


def test_a_passive_module_has_no_monitors_and_its_port_stays_up(lab, optics_lab):
    daemon, writers = optics_lab
    port0 = lab.rails[0].port
    writers[port0].write_eeprom(CmisModule(flat=True).pages())
    wait_for_sync(lambda: optics(daemon, port0).get("status") == "no monitors (passive)",
                  DEADLINE_S, "flat-memory module reported as passive")
    witness_drains(lab, daemon, writers)

    assert lab.host.route_nhid(RAIL0_TABLE) == NH0
    assert port_state(daemon, port0)["verdict"] == "VERDICT_UP"
    a = optics(daemon, port0)
    assert "severity" not in a or a["severity"] in (None, "VERDICT_UNSPECIFIED"), a  # no opinion
    assert "optics: no monitors (passive)" in ctl(daemon, "explain", port0)
