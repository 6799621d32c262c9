"""This host's clock error bound from chrony and ptp4l (adapters.clocksync):
canned outputs, garbage, missing programs and hangs; never an exception."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from linkpassd.adapters import clocksync
from linkpassd.adapters.clocksync import ClockWatch, parse_chrony, parse_pmc, read_clock
from linkpassd.core.oneway import DRIFT_PPM, NOT_CONFIGURED, SHARED

# chronyc -c tracking, synchronised: offset 4 us, root delay 300 us, root dispersion 50 us.
CHRONY_OK = ("C0A80001,ntp1.example.net,2,1764892800.123456789,-0.000004000,0.000002100,"
             "0.000003500,-12.345,0.002,0.030,0.000300000,0.000050000,64.2,Normal\n")
CHRONY_UNSYNC = ("00000000,,0,0.000000000,0.000000000,0.000000000,0.000000000,0.000,0.000,"
                 "0.000,1.000000000,1.000000000,0.0,Not synchronised\n")
PMC_OK = """sending: GET TIME_STATUS_NP
\t90e2ba.fffe.1a2b3c-1 seq 0 RESPONSE MANAGEMENT TIME_STATUS_NP
\t\tmaster_offset              -23
\t\tingress_time               1764892800123456789
\t\tcumulativeScaledRateOffset +0.000000000
\t\tscaledLastGmPhaseChange    0
\t\tgmTimeBaseIndicator        0
\t\tlastGmPhaseChange          0x0000'0000000000000000.0000
\t\tgmPresent                  true
\t\tgmIdentity                 001122.fffe.334455
"""


def test_chrony_bound_is_offset_plus_dispersion_plus_half_the_root_delay():
    r = parse_chrony(CHRONY_OK, read_at=7.0)
    assert r.source == "chrony" and r.reason == ""
    assert r.bound_ns == 4_000 + 50_000 + 150_000
    assert r.read_at == 7.0 and r.drift_ppm == pytest.approx(DRIFT_PPM + 0.030)


def test_chrony_not_synchronised_is_no_bound():
    r = parse_chrony(CHRONY_UNSYNC, read_at=0.0)
    assert r.bound_ns is None and "not synchronised" in r.reason


@pytest.mark.parametrize("output, why", [
    ("", "printed nothing"),
    ("506 Cannot talk to daemon\n", "printed 1 fields, not 14"),
    (CHRONY_OK.replace("-0.000004000", "fast"), "not a number"),
    (CHRONY_OK.replace("0.000050000", "nan"), "not a number"),
    (CHRONY_OK.replace("0.000300000", "-0.1"), "negative root delay"),
    ("\x00\xff,,,", "printed 4 fields"),
])
def test_garbage_from_chronyc_gives_a_reason_not_an_exception(output, why):
    r = parse_chrony(output, read_at=0.0)
    assert r.bound_ns is None and why in r.reason, r.reason


def test_ptp4l_bound_is_the_master_offset():
    r = parse_pmc(PMC_OK, read_at=3.0)
    assert (r.source, r.bound_ns, r.reason) == ("ptp4l", 23, "")


@pytest.mark.parametrize("output, why", [
    ("sending: GET TIME_STATUS_NP\n", "no ptp4l answered pmc"),
    (PMC_OK.replace("gmPresent                  true", "gmPresent                  false"),
     "no grandmaster (gmPresent false)"),
    (PMC_OK.replace("master_offset              -23", "master_offset              lots"),
     "no integer master_offset ('lots')"),
    (PMC_OK.replace("\t\tmaster_offset              -23\n", ""), "no integer master_offset"),
    ("RESPONSE TIME_STATUS_NP\n\x00 \x01\n", "gmPresent missing"),
])
def test_garbage_from_pmc_gives_a_reason_not_an_exception(output, why):
    r = parse_pmc(output, read_at=0.0)
    assert r.bound_ns is None and why in r.reason, r.reason


def test_fixed_sources_need_no_reading():
    assert asyncio.run(read_clock("shared")) is SHARED
    assert asyncio.run(read_clock("none")) is NOT_CONFIGURED


@pytest.mark.skipif(bool(shutil.which("chronyc") or shutil.which("pmc")),
                    reason="this host has chronyc or pmc")
def test_auto_on_a_host_without_chrony_or_ptp4l_says_so():
    r = asyncio.run(read_clock("auto"))
    assert r.bound_ns is None
    assert r.reason.startswith("this host's clock reports no synchronisation (no chronyd "
                               "answered `chronyc -c tracking` (no chronyc on this host); "
                               "no ptp4l answered pmc (no pmc on this host))"), r.reason


def test_a_command_that_hangs_is_killed_and_named():
    status, out, why = asyncio.run(clocksync.run_command(("sleep", "5"), timeout_s=0.2))
    assert status is None and why == "sleep did not answer within 0.2 s"


def test_a_failing_command_is_no_bound(monkeypatch):
    monkeypatch.setattr(clocksync, "CHRONY", ("sh", "-c", "echo '506 Cannot talk' >&2; exit 1"))
    r = asyncio.run(clocksync.read_chrony())
    assert r.bound_ns is None
    assert r.reason == "no chronyd answered `chronyc -c tracking` (sh exited with 1: 506 Cannot talk)"


def test_the_watch_reads_again_and_hands_every_reading_over(monkeypatch):
    monkeypatch.setattr(clocksync, "CHRONY", ("printf", CHRONY_OK))
    got = []

    async def main():
        watch = ClockWatch("chrony", got.append, refresh_s=0.05)
        watch.start()
        await asyncio.sleep(0.4)
        watch.close()

    asyncio.run(main())
    assert len(got) >= 3 and {r.bound_ns for r in got} == {204_000}
