"""The ethtool sensor against the real kernel, on veth, with the ethtool CLI and
``ip -s -s`` as independent witnesses.

What veth offers (Linux 6.18): ETHTOOL_A_LINKSTATE_LINK only (no extended
state, no link-down count: no get_link_ext_state/get_link_ext_stats), empty
eth-phy/eth-mac standard stats groups, no FEC (EOPNOTSUPP), no module EEPROM
(EOPNOTSUPP), and rtnetlink stats64 that exist but never count CRC, length
or missed errors.
"""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest

from labs.netnslib import run, wait_for_sync
from linkpassd.adapters.ethtool import LOWER_PAGE0, EthtoolSensor
from linkpassd.core.model import CounterSample, Unreadable

pytestmark = pytest.mark.netns

TIMEOUT_S = 10


def ethtool(ns, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns.name, "ethtool", *args],
                          capture_output=True, text=True, timeout=TIMEOUT_S)


def link_detected(ns, port: str) -> str:
    """ethtool's "Link detected: ..." value, e.g. "yes", "no", "no (No cable)":
    ethtool puts the extended state in parentheses when the kernel gives one."""
    out = ethtool(ns, port).stdout
    (line,) = [line for line in out.splitlines() if "Link detected:" in line]
    return line.split("Link detected:", 1)[1].strip()


def standard_groups(ns, port: str) -> dict:
    proc = ethtool(ns, "--json", "-S", port, "--all-groups")
    assert proc.returncode == 0, proc.stderr
    (doc,) = json.loads(proc.stdout)
    return doc


def rx_stats(ns, port: str) -> dict:
    (link,) = ns.ipj("-s", "-s", "link", "show", "dev", port)
    return link["stats64"]["rx"]


def carrier_down_count(ns, port: str) -> int:
    out = subprocess.run(["ip", "netns", "exec", ns.name, "cat",
                          f"/sys/class/net/{port}/carrier_down_count"],
                         capture_output=True, text=True, check=True, timeout=TIMEOUT_S)
    return int(out.stdout)


def assert_matches_witnesses(ns, port: str, sample: CounterSample) -> None:
    rx = rx_stats(ns, port)
    assert (sample.rx_crc_errors, sample.length_errors, sample.rx_missed) == (
        rx["crc_errors"], rx["length_errors"], rx["missed_errors"])
    groups = standard_groups(ns, port)
    assert sample.symbol_errors == groups["eth-phy"].get("SymbolErrorDuringCarrier")
    fec = ethtool(ns, "-I", "--show-fec", port)
    if fec.returncode != 0:
        assert "Operation not supported" in fec.stderr
        assert (sample.fec_corrected, sample.fec_uncorrectable) == (None, None)
    detected = link_detected(ns, port)
    if "(" in detected:  # the driver explains the state; we must have it too
        assert sample.ext_state is not None
    else:
        assert (sample.ext_state, sample.ext_substate) == (None, None)


def test_veth_counters_unsupported_fields_are_none_and_the_rest_match_the_witnesses(lab):
    rail = lab.rails[0]

    async def scenario():
        async with EthtoolSensor(lab.host.name) as sensor:
            return await sensor.counters(rail.port)

    sample = run(scenario(), timeout=TIMEOUT_S)
    assert sample == CounterSample(port=rail.port, rx_crc_errors=0, length_errors=0, rx_missed=0)
    assert link_detected(lab.host, rail.port) == "yes"
    assert standard_groups(lab.host, rail.port)["eth-phy"] == {}
    assert standard_groups(lab.host, rail.port)["eth-mac"] == {}
    assert_matches_witnesses(lab.host, rail.port, sample)


def test_veth_link_down_has_no_extended_state_or_down_count(lab):
    """Carrier loss is counted by the kernel (carrier_down_count, which the
    link monitor uses), but veth has no ethtool link-down counter or
    extended state: those stay None, as ethtool itself shows."""
    rail = lab.rails[0]
    downs_before = carrier_down_count(lab.host, rail.port)
    lab.cut(rail)
    wait_for_sync(lambda: not lab.host.has_carrier(rail.port), 3.0, "carrier loss")

    async def scenario():
        async with EthtoolSensor(lab.host.name) as sensor:
            return await sensor.counters(rail.port)

    try:
        sample = run(scenario(), timeout=TIMEOUT_S)
        assert link_detected(lab.host, rail.port) == "no"
        assert carrier_down_count(lab.host, rail.port) == downs_before + 1
        assert (sample.ext_state, sample.ext_substate, sample.link_down_events) == (None, None, None)
        assert_matches_witnesses(lab.host, rail.port, sample)
    finally:
        lab.restore(rail)


def test_missing_port_gives_an_empty_sample_and_unreadable_optics(lab):
    async def scenario():
        async with EthtoolSensor(lab.host.name) as sensor:
            return await sensor.counters("lpnosuch0"), await sensor.optics("lpnosuch0")

    sample, optics = run(scenario(), timeout=TIMEOUT_S)
    assert sample == CounterSample(port="lpnosuch0")
    assert isinstance(optics, Unreadable) and "ENODEV" in optics.reason


def test_veth_module_eeprom_is_not_supported_not_an_exception(lab):
    rail = lab.rails[0]
    witness = ethtool(lab.host, "-m", rail.port)
    assert witness.returncode != 0 and "Operation not supported" in witness.stderr

    async def scenario():
        async with EthtoolSensor(lab.host.name, min_module_interval_s=1.0) as sensor:
            pages = await sensor.module_pages(rail.port, [LOWER_PAGE0])
            first = await sensor.optics_timed(rail.port)
            again = await sensor.optics_timed(rail.port)
            return pages, first, again, sensor.module_reads

    pages, first, again, reads = run(scenario(), timeout=TIMEOUT_S)
    for answer in (pages, first.value):
        assert isinstance(answer, Unreadable)
        assert "not supported" in answer.reason and rail.port in answer.reason
    # the optics read waited out the interval after the page read; the
    # repeat inside the interval is answered from the cache
    assert not first.cached and again.cached and again.value == first.value
    assert reads == 2


def test_concurrent_reads_on_one_sensor_share_its_sockets(lab):
    """Counters of several ports polled at once, as the daemon does, over one
    genl and one rtnl socket: every answer is complete and for its port."""
    ports = [rail.port for rail in lab.rails]

    async def scenario():
        async with EthtoolSensor(lab.host.name, min_module_interval_s=0.0) as sensor:
            jobs = [sensor.counters(p) for p in ports * 10] + [sensor.optics(p) for p in ports]
            return await asyncio.gather(*jobs)

    answers = run(scenario(), timeout=TIMEOUT_S)
    samples, optics = answers[: len(ports) * 10], answers[len(ports) * 10:]
    assert [s.port for s in samples] == ports * 10
    assert all(s.rx_crc_errors == 0 and s.fec_corrected is None for s in samples)
    assert all(isinstance(o, Unreadable) and "not supported" in o.reason for o in optics)
