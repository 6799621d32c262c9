"""core.drain: requests are checked, drains expire by the wall clock, a drained
port is DEGRADED for the policy (never better than its health), and the file
round-trips or is refused with a reason."""

import pytest

from linkpassd.core import drain
from linkpassd.core.model import Drain, PortState, Verdict

PORTS = ("eth0", "eth1")


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400),
                                           ("1h30m", 5400), ("500ms", 0.5), (" 2H ", 7200)])
def test_durations_with_units_are_understood(text, seconds):
    assert drain.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "30", "m", "5x", "-5m", "0s", "1h 30m", "1.5.2h"])
def test_durations_without_a_clear_unit_or_not_positive_are_refused(text):
    with pytest.raises(drain.DrainError):
        drain.parse_duration(text)


def test_a_request_needs_a_rail_port_and_a_reason():
    with pytest.raises(drain.UnknownPort, match="eth9.*eth0, eth1"):
        drain.request("eth9", "optic swap", "root (uid 0)", 10.0, None, PORTS)
    with pytest.raises(drain.DrainError, match="reason"):
        drain.request("eth0", "   ", "root (uid 0)", 10.0, None, PORTS)
    with pytest.raises(drain.DrainError, match="at most"):
        drain.request("eth0", "x" * 401, "root (uid 0)", 10.0, None, PORTS)
    with pytest.raises(drain.DrainError, match="more than zero"):
        drain.request("eth0", "swap", "root (uid 0)", 10.0, 0.0, PORTS)
    d = drain.request("eth0", "  optic\nswap ", "root (uid 0)", 10.0, 60.0, PORTS)
    assert d == Drain("eth0", "optic swap", "root (uid 0)", 10.0, 70.0)


def test_drains_expire_at_until_and_open_ended_ones_never():
    drains = {"eth0": Drain("eth0", "r", "root", 0.0, 100.0), "eth1": Drain("eth1", "r", "root", 0.0)}
    kept, gone = drain.active(drains, 99.9)
    assert set(kept) == {"eth0", "eth1"} and gone == []
    kept, gone = drain.active(drains, 100.0)
    assert set(kept) == {"eth1"} and [d.port for d in gone] == ["eth0"]


def state(port: str, verdict: Verdict) -> PortState:
    return PortState(port=port, verdict=verdict, carrier=verdict is not Verdict.DOWN, phase="X",
                     since=1.0, evidence=("healthy",))


def test_a_drained_port_is_degraded_but_never_better_than_its_health():
    d0 = Drain("eth0", "optic swap", "alice (uid 1000)", 5.0)
    d1 = Drain("eth1", "cable", "root (uid 0)", 5.0)
    states = {"eth0": state("eth0", Verdict.UP), "eth1": state("eth1", Verdict.DOWN),
              "eth2": state("eth2", Verdict.UP)}
    out = drain.apply(states, {"eth0": d0, "eth1": d1, "eth7": Drain("eth7", "r", "root", 1.0)})
    assert out["eth0"].verdict is Verdict.DEGRADED and out["eth0"].drain == d0
    assert out["eth0"].evidence[0] == "drained by alice (uid 1000): optic swap"
    assert out["eth1"].verdict is Verdict.DOWN and out["eth1"].drain == d1
    assert out["eth2"] == states["eth2"] and "eth7" not in out


def test_the_file_round_trips():
    drains = {"eth0": Drain("eth0", "optic swap", "root (uid 0)", 5.0, 65.0),
              "eth1": Drain("eth1", "cable", "alice (uid 1000)", 7.0)}
    assert drain.decode(drain.encode(drains)) == drains


@pytest.mark.parametrize("doc, why", [
    ([], "version"), ({"version": 2, "drains": []}, "version"),
    ({"version": 1, "drains": {}}, "list"),
    ({"version": 1, "drains": [{"port": "eth0"}]}, "drain 0"),
    ({"version": 1, "drains": [{"port": "eth0", "reason": "", "by": "x", "at": 1}]}, "non-empty"),
    ({"version": 1, "drains": [{"port": "eth0", "reason": "r", "by": "x", "at": "1"}]}, "number"),
    ({"version": 1, "drains": [{"port": "eth0", "reason": "r", "by": "x", "at": 1, "until": True}]},
     "until"),
])
def test_a_bad_file_is_refused_with_the_reason(doc, why):
    with pytest.raises(drain.DrainError, match=why):
        drain.decode(doc)


def test_durations_past_a_year_are_refused_everywhere():
    with pytest.raises(drain.DrainError, match="366 days"):
        drain.parse_duration("99999999d")
    with pytest.raises(drain.DrainError, match="366 days"):
        drain.request("eth0", "r", "root", 10.0, 1e12, PORTS)
    doc = drain.encode({"eth0": Drain("eth0", "r", "root", 10.0, 10.0 + 1e12)})
    with pytest.raises(drain.DrainError, match="366 days"):
        drain.decode(doc)


def test_a_drained_port_that_is_down_keeps_its_own_reason_first():
    d = Drain("eth1", "cable", "root (uid 0)", 5.0)
    out = drain.apply({"eth1": state("eth1", Verdict.DOWN)}, {"eth1": d})
    assert out["eth1"].evidence == ("healthy", d.describe()) and out["eth1"].drain == d
