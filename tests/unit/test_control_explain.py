"""Sensors and explanations through the control API: model -> gRPC -> linkpassctl.

The fake daemon has three rails: eth0 with a QSFP-DD module whose lane 5
receives too little light, eth1 whose module cannot be read, and veth2, a
lab veth with no module and no error counters. The point throughout is that
"not reported" never turns into 0 on the way to the operator.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format

from linkpassd._proto.linkpass.v1 import control_pb2 as pb
from linkpassd._proto.linkpass.v1 import control_pb2_grpc as pb_grpc
from linkpassd.adapters import control_convert
from linkpassd.core.explain import Consequence, Explanation
from linkpassd.core.model import (
    Assessment,
    CounterSample,
    DaemonStatus,
    LinkSample,
    ModuleIdentity,
    OneWayDelay,
    OpticsReading,
    PortSensors,
    PortState,
    RailStatus,
    Thresholds,
    Verdict,
)
from linkpassd.ctl import main as ctl
from test_control_api import (
    WALL_NOW,
    assert_one_line_error,
    ctl_process,
    run_ctl,
    running_server,
    table_rows,
)

pytestmark = pytest.mark.usefixtures("local_zone")

RX_LEVELS = Thresholds(high_alarm=5.4, high_warn=3.4, low_warn=-8.4, low_alarm=-10.4)
QSFP_DD = OpticsReading(
    identity=ModuleIdentity(spec="CMIS", form_factor="QSFP-DD", vendor="FS", part="QDD-SR8-400G",
                            serial="G2230012345", revision="01", spec_revision="5.0"),
    temperature_c=41.3,
    voltage_v=3.27,
    tx_bias_ma=(7.1, 7.0, 7.2, 6.9, 7.0, 7.1, 7.0, 6.8),
    # lane 3's TX power monitor is not reported by this module
    tx_power_dbm=(0.6, 0.5, 0.7, None, 0.4, 0.6, 0.5, 0.6),
    rx_power_dbm=(-1.9, -2.0, -2.1, -1.8, -2.2, -11.2, -2.0, -1.9),
    thresholds=(
        ("temperature_c", Thresholds(high_alarm=75.0, high_warn=70.0, low_warn=-5.0, low_alarm=-10.0)),
        ("tx_bias_ma", Thresholds(high_alarm=13.0, high_warn=12.0)),  # no low levels given
        ("tx_power_dbm", Thresholds(high_alarm=4.0, high_warn=3.0, low_warn=-5.4, low_alarm=-7.4)),
        ("rx_power_dbm", RX_LEVELS),
    ),
    flags=frozenset({"rx_power_low_warn[5]", "rx_power_low_alarm[5]"}),
)

UNREADABLE = "eth1: module EEPROM page 0x11: Input/output error"


def sensors() -> tuple[PortSensors, ...]:
    return (
        PortSensors(
            port="eth0",
            optics=QSFP_DD,
            counters=CounterSample(port="eth0", rx_crc_errors=18, symbol_errors=0, length_errors=0, rx_missed=0,
                                   fec_corrected=903_114_221_870, fec_uncorrectable=0, link_down_events=1),
            assessments=(
                Assessment("counters", Verdict.UP, "ok", "CRC 0.0/s, FEC uncorrectable 0.0/s over 10s"),
                Assessment("optics", Verdict.DEGRADED, "degraded",
                           "lane 5 RX -11.20 dBm below low alarm -10.4; module flags rx_power_low_alarm[5]"),
                Assessment("flaps", Verdict.UP, "ok", "penalty 0"),
            ),
        ),
        PortSensors(
            port="eth1",
            optics_unreadable=UNREADABLE,
            # this driver counts CRC errors (none so far) but nothing else
            counters=CounterSample(port="eth1", rx_crc_errors=0),
            assessments=(
                Assessment("counters", None, "warming up", "one reading so far"),
                Assessment("optics", None, "unreadable", UNREADABLE),
            ),
        ),
        PortSensors(
            port="veth2",
            counters=CounterSample(port="veth2"),  # veth: no error counters at all
            assessments=(Assessment("counters", None, "unsupported", "driver reports no error counters"),),
        ),
    )


def status() -> DaemonStatus:
    def state(port: str, verdict: Verdict, phase: str, ago: float, *evidence: str) -> PortState:
        return PortState(port=port, verdict=verdict, carrier=True, phase=phase, since=WALL_NOW - ago,
                         evidence=evidence)

    return DaemonStatus(
        hostname="gpu-node-017", version="0.1.0", config_source="/etc/linkpass/linkpassd.toml",
        started_at=WALL_NOW - 7200,
        ports=(
            state("eth0", Verdict.DEGRADED, "DEGRADED", 95, "optics: lane 5 RX -11.20 dBm below low alarm -10.4",
                  "carrier up"),
            state("eth1", Verdict.UP, "UP", 3600, "carrier up"),
            state("veth2", Verdict.UP, "UP", 3600, "carrier up"),
        ),
        links=tuple(LinkSample(port=p, present=True, ifindex=i, admin_up=True, carrier=True, operstate="UP")
                    for i, p in enumerate(("eth0", "eth1", "veth2"), start=2)),
        rails=(
            RailStatus("rail0", "eth0", "198.18.0.1", 10100, "rail1", "eth1"),
            RailStatus("rail1", "eth1", "198.18.1.1", 10101, "rail1", "eth1"),
            RailStatus("rail2", "veth2", "198.18.2.1", 10102, "rail2", "veth2"),
        ),
        groups=(),
        reconciles=10, netlink_writes=4, last_reconcile_at=WALL_NOW - 1,
        sensors=sensors(),
    )


EXPLANATIONS = {
    "eth0": Explanation(
        port="eth0",
        rail="rail0",
        state=status().ports[0],
        consequences=(
            Consequence("rail-table", "rail0", 10100, "primary", False,
                        "table 10100 routes through rail1 (eth1) instead"),
            Consequence("rail-table", "rail2", 10102, "backup 1", False, "rail2's table 10102 uses rail2"),
            Consequence("group", "gpu-fabric", 10150, "member", True,
                        "kept in 10.200.0.0/16 despite DEGRADED: capacity floor min_paths=2, members rail0, rail1"),
        ),
        summary="eth0 (rail0) is DEGRADED (optics: lane 5 RX -11.20 dBm below low alarm -10.4); "
                "it still carries gpu-fabric.",
        paths=(
            Assessment("probe:198.18.0.1", Verdict.UP, "ok", "rtt 0.08 ms", direction="none",
                       one_way=OneWayDelay(41e-6, 38e-6, 0.0, "shared", samples=64)),
            Assessment("probe:198.18.0.5", Verdict.UP, "ok", "rtt 0.09 ms", direction="none",
                       one_way=OneWayDelay(refused="the peer's clock is not synchronised (its "
                                                   "responder reports no error bound)")),
        ),
    ),
}


def explain_provider(port: str) -> Explanation | None:
    return EXPLANATIONS.get(port)


@pytest.fixture
def server(sock: Path):
    with running_server(sock, status, explain_provider) as srv:
        yield srv


def sections(text: str) -> dict[str, list[list[str]]]:
    """linkpassctl links output by section title (the first, untitled, is "LINKS")."""
    out = {}
    for i, block in enumerate(text.strip().split("\n\n")):
        lines = block.splitlines()
        title = "LINKS" if i == 0 else lines.pop(0)
        out[title] = table_rows("\n".join(lines))
    return out


# --------------------------------------------------------------------------
# mapping: None is unset, 0 is 0
# --------------------------------------------------------------------------


def test_absent_counters_are_unset_and_zero_counters_are_set() -> None:
    msg = control_convert.counters_to_proto(CounterSample(port="eth1", rx_crc_errors=0))
    assert msg.HasField("rx_crc_errors") and msg.rx_crc_errors == 0
    for name in ("symbol_errors", "length_errors", "rx_missed", "fec_corrected", "fec_uncorrectable",
                 "link_down_events", "ext_state", "ext_substate"):
        assert not msg.HasField(name), name


def test_optics_lanes_and_levels_keep_absence() -> None:
    msg = control_convert.optics_to_proto(dataclasses.replace(QSFP_DD, temperature_c=None,
                                                             rx_power_dbm=(-2.0, None, math.nan, 0.0)))
    assert not msg.HasField("temperature_c")
    assert msg.HasField("voltage_v") and msg.voltage_v == 3.27
    kinds = [v.WhichOneof("kind") for v in msg.rx_power_dbm]
    assert kinds == ["number_value", "null_value", "null_value", "number_value"]  # NaN cannot go out as JSON
    assert msg.rx_power_dbm[3].number_value == 0.0
    bias = msg.thresholds["tx_bias_ma"]
    assert bias.HasField("high_alarm") and not bias.HasField("low_warn") and not bias.HasField("low_alarm")
    assert list(msg.flags) == ["rx_power_low_alarm[5]", "rx_power_low_warn[5]"]  # sorted


def test_no_opinion_is_an_unset_severity() -> None:
    none = control_convert.assessment_to_proto(Assessment("optics", None, "unreadable", "x"))
    assert not none.HasField("severity")
    up = control_convert.assessment_to_proto(Assessment("optics", Verdict.UP, "ok", "x", confirmed=False))
    assert up.HasField("severity") and up.severity == pb.VERDICT_UP and not up.confirmed


def test_missing_sub_messages_are_unset() -> None:
    msg = control_convert.port_sensors_to_proto(PortSensors(port="eth9"))
    assert not msg.HasField("optics") and not msg.HasField("counters")


# --------------------------------------------------------------------------
# linkpassctl links: optics, counters, signals
# --------------------------------------------------------------------------


def test_links_table_shows_optics_against_the_module_levels(server, sock: Path) -> None:
    result = run_ctl(sock, "links")
    assert result.exit_code == 0, result.output
    out = sections(result.stdout)
    assert [row[0] for row in out["LINKS"]] == ["PORT", "eth0", "eth1", "veth2"]  # the existing table stays
    optics = out["OPTICS"]
    assert optics[0] == ["PORT", "MODULE", "TEMP °C", "RX dBm", "RX LOW WARN/ALARM", "TX dBm", "BIAS mA", "FLAGS"]
    assert optics[1] == [
        "eth0",
        "FS QDD-SR8-400G",
        "41.3",
        "-1.9 -2.0 -2.1 -1.8 -2.2 -11.2!! -2.0 -1.9",  # lane 5 below the low alarm
        "-8.4/-10.4",
        "0.6 0.5 0.7 n/a 0.4 0.6 0.5 0.6",  # lane 3 not reported: not 0.0
        "7.1 7.0 7.2 6.9 7.0 7.1 7.0 6.8",
        "rx_power_low_alarm[5],rx_power_low_warn[5]",
    ]
    assert optics[2] == ["eth1", f"unreadable: {UNREADABLE}"]
    assert optics[3] == ["veth2", "no module data"]
    assert optics[4][0].startswith("! past the module's warning level, !! past its alarm level")


def test_links_table_shows_warning_marks_and_missing_levels(sock: Path) -> None:
    warm = dataclasses.replace(QSFP_DD, temperature_c=71.0, rx_power_dbm=(-9.0,) + (-2.0,) * 7,
                               thresholds=(("temperature_c", Thresholds(high_alarm=75.0, high_warn=70.0)),
                                           ("rx_power_dbm", Thresholds(low_alarm=-10.4))))
    st = dataclasses.replace(status(), sensors=(dataclasses.replace(sensors()[0], optics=warm),))
    with running_server(sock, lambda: st):
        result = run_ctl(sock, "links")
    assert result.exit_code == 0, result.output
    eth0 = sections(result.stdout)["OPTICS"][1]
    assert eth0[2] == "71.0!"  # above the high warning, below the alarm
    assert eth0[3].startswith("-9.0 -2.0")  # no warning level given: only the alarm counts
    assert eth0[4] == "n/a/-10.4"


def test_links_table_counters_tell_zero_from_not_supported(server, sock: Path) -> None:
    out = sections(run_ctl(sock, "links").stdout)["COUNTERS"]
    assert out[0] == ["PORT", "CRC", "SYMBOL", "LENGTH", "MISSED", "FEC CORR", "FEC UNCORR", "LINK DOWNS",
                      "LINK DOWN REASON"]
    assert out[1] == ["eth0", "18", "0", "0", "0", "903114221870", "0", "1", "-"]
    assert out[2] == ["eth1", "0", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a", "-"]
    assert out[3] == ["veth2", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a", "-"]


def test_links_table_signals(server, sock: Path) -> None:
    out = sections(run_ctl(sock, "links").stdout)["SIGNALS"]
    assert out == [
        ["PORT", "SIGNAL", "STATUS", "SEVERITY", "DETAIL"],
        ["eth0", "counters", "ok", "UP", "CRC 0.0/s, FEC uncorrectable 0.0/s over 10s"],
        ["eth0", "optics", "degraded", "DEGRADED",
         "lane 5 RX -11.20 dBm below low alarm -10.4; module flags rx_power_low_alarm[5]"],
        ["eth0", "flaps", "ok", "UP", "penalty 0"],
        ["eth1", "counters", "warming up", "-", "one reading so far"],
        ["eth1", "optics", "unreadable", "-", UNREADABLE],
        ["veth2", "counters", "unsupported", "-", "driver reports no error counters"],
    ]


def test_links_table_port_without_sensor_data(sock: Path) -> None:
    st = dataclasses.replace(status(), sensors=())
    with running_server(sock, lambda: st):
        result = run_ctl(sock, "links")
    assert result.exit_code == 0, result.output
    out = sections(result.stdout)
    assert out["OPTICS"][1:] == [["eth0", "no module data"], ["eth1", "no module data"],
                                 ["veth2", "no module data"]]
    assert out["COUNTERS"][1] == ["eth0", "no counter data"]
    assert out["SIGNALS"][1] == ["eth0", "no assessments"]


def test_unconfirmed_severity_is_marked(sock: Path) -> None:
    pending = Assessment("optics", Verdict.DEGRADED, "degraded", "lane 5 low (1 of 3 readings)", confirmed=False)
    st = dataclasses.replace(status(), sensors=(PortSensors(port="eth0", assessments=(pending,)),))
    with running_server(sock, lambda: st):
        out = sections(run_ctl(sock, "links").stdout)["SIGNALS"]
    assert out[1] == ["eth0", "optics", "degraded", "DEGRADED (unconfirmed)", "lane 5 low (1 of 3 readings)"]


# --------------------------------------------------------------------------
# JSON: fixed keys, null for "not reported", round trip
# --------------------------------------------------------------------------


def test_links_json_carries_sensors_with_null_for_not_reported(server, sock: Path) -> None:
    result = run_ctl(sock, "links", "-o", "json")
    assert result.exit_code == 0, result.output
    rows = {row["port"]: row for row in json.loads(result.stdout)["links"]}
    eth0 = rows["eth0"]["sensors"]
    optics = eth0["optics"]
    assert optics["identity"] == {"spec": "CMIS", "form_factor": "QSFP-DD", "vendor": "FS", "part": "QDD-SR8-400G",
                                  "serial": "G2230012345", "revision": "01", "spec_revision": "5.0"}
    assert optics["rx_power_dbm"] == [-1.9, -2.0, -2.1, -1.8, -2.2, -11.2, -2.0, -1.9]
    assert optics["tx_power_dbm"][3] is None
    assert optics["thresholds"]["rx_power_dbm"] == {"high_alarm": 5.4, "high_warn": 3.4, "low_warn": -8.4,
                                                    "low_alarm": -10.4}
    assert optics["thresholds"]["tx_bias_ma"] == {"high_alarm": 13.0, "high_warn": 12.0, "low_warn": None,
                                                  "low_alarm": None}
    assert list(optics["thresholds"]) == sorted(optics["thresholds"])
    assert optics["flags"] == ["rx_power_low_alarm[5]", "rx_power_low_warn[5]"]
    assert eth0["counters"]["fec_corrected"] == "903114221870"  # uint64: a JSON string
    assert eth0["assessments"][1] == {"signal": "optics", "severity": "VERDICT_DEGRADED", "status": "degraded",
                                      "detail": "lane 5 RX -11.20 dBm below low alarm -10.4; module flags "
                                                "rx_power_low_alarm[5]", "confirmed": True,
                                      "direction": "", "one_way": None, "witnesses": 0}
    eth1 = rows["eth1"]["sensors"]
    assert eth1["optics"] is None and eth1["optics_unreadable"] == UNREADABLE
    assert eth1["counters"]["rx_crc_errors"] == "0"  # zero errors ...
    assert eth1["counters"]["symbol_errors"] is None  # ... is not "no counter"
    assert eth1["assessments"][0]["severity"] is None
    veth = rows["veth2"]["sensors"]
    assert veth["counters"] == {"port": "veth2", "rx_crc_errors": None, "symbol_errors": None, "length_errors": None,
                                "rx_missed": None, "fec_corrected": None, "fec_uncorrectable": None,
                                "link_down_events": None, "ext_state": None, "ext_substate": None}


def test_sensor_json_keys_are_the_model_fields_in_order(server, sock: Path) -> None:
    data = json.loads(run_ctl(sock, "status", "-o", "json").stdout)
    eth0, eth1, veth = data["sensors"]
    assert list(eth0) == list(eth1) == list(veth) == [f.name for f in dataclasses.fields(PortSensors)]
    assert list(eth0["optics"]) == [f.name for f in dataclasses.fields(OpticsReading)]
    assert list(eth0["optics"]["identity"]) == [f.name for f in dataclasses.fields(ModuleIdentity)]
    assert list(eth0["optics"]["thresholds"]["tx_bias_ma"]) == [f.name for f in dataclasses.fields(Thresholds)]
    assert list(eth0["counters"]) == list(veth["counters"]) == [f.name for f in dataclasses.fields(CounterSample)]
    assert list(eth0["assessments"][0]) == list(eth1["assessments"][0]) == [
        f.name for f in dataclasses.fields(Assessment)]


def test_json_round_trips_with_absent_and_zero_apart(server, sock: Path) -> None:
    text = run_ctl(sock, "links", "-o", "json").stdout
    back = json_format.Parse(text, pb.ListLinksResponse())
    assert back == control_convert.links_to_proto(status(), served_at=WALL_NOW)
    eth1 = back.links[1].sensors
    assert eth1.counters.HasField("rx_crc_errors") and not eth1.counters.HasField("symbol_errors")
    assert not eth1.HasField("optics")
    lanes = back.links[0].sensors.optics.tx_power_dbm
    assert lanes[3].WhichOneof("kind") == "null_value"


# --------------------------------------------------------------------------
# linkpassctl explain
# --------------------------------------------------------------------------


def test_explain_readable(server, sock: Path) -> None:
    result = run_ctl(sock, "explain", "eth0")
    assert result.exit_code == 0, result.output
    summary, head, uses = result.stdout.rstrip("\n").split("\n\n")
    assert summary == EXPLANATIONS["eth0"].summary
    assert table_rows(head) == [
        ["verdict", "DEGRADED"],
        ["carrier", "yes"],
        ["phase", "DEGRADED"],
        ["since", "1m35s ago (2027-01-15T08:58:25+01:00)"],
        ["evidence", "optics: lane 5 RX -11.20 dBm below low alarm -10.4"],
        ["carrier up"],
        ["paths", "198.18.0.1: one-way delay towards 198.18.0.1 41 us, back 38 us, ±0 us "
                  "(clocks: shared)"],
        ["198.18.0.5: one-way delay not reported: the peer's clock is not synchronised (its "
         "responder reports no error bound)"],
    ]
    assert table_rows(uses) == [
        ["KIND", "NAME", "TABLE", "ROLE", "CARRIES PORT", "DETAIL"],
        ["rail-table", "rail0", "10100", "primary", "no", "table 10100 routes through rail1 (eth1) instead"],
        ["rail-table", "rail2", "10102", "backup 1", "no", "rail2's table 10102 uses rail2"],
        ["group", "gpu-fabric", "10150", "member", "yes",
         "kept in 10.200.0.0/16 despite DEGRADED: capacity floor min_paths=2, members rail0, rail1"],
    ]


def test_explain_json(server, sock: Path) -> None:
    result = run_ctl(sock, "explain", "eth0", "-o", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert list(data) == [f.name for f in dataclasses.fields(Explanation)] + ["served_at"]
    assert data["port"] == "eth0" and data["rail"] == "rail0"
    assert data["summary"] == EXPLANATIONS["eth0"].summary
    assert data["served_at"] == WALL_NOW
    assert data["state"] == {"port": "eth0", "verdict": "VERDICT_DEGRADED", "carrier": True, "phase": "DEGRADED",
                             "since": WALL_NOW - 95, "evidence": [
                                 "optics: lane 5 RX -11.20 dBm below low alarm -10.4", "carrier up"],
                             "drain": None, "hold_until": 0.0}
    assert data["consequences"][0] == {"kind": "rail-table", "name": "rail0", "table": 10100, "role": "primary",
                                       "carries_port": False,
                                       "detail": "table 10100 routes through rail1 (eth1) instead"}
    assert [list(c) for c in data["consequences"]] == [[f.name for f in dataclasses.fields(Consequence)]] * 3


def test_explain_unknown_port_is_one_line_naming_it(server, sock: Path) -> None:
    proc = ctl_process("--socket", str(sock), "explain", "eth9")
    assert_one_line_error(proc, "unknown port 'eth9'; configured rail ports: eth0, eth1, veth2")
    with grpc.insecure_channel(f"unix:{sock}") as channel:
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.ControlServiceStub(channel).ExplainPort(pb.ExplainPortRequest(port="eth9"), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_explain_before_the_first_decision(sock: Path) -> None:
    """The daemon has no rails to report yet (no decision), so it cannot list them."""
    st = dataclasses.replace(status(), rails=())
    with running_server(sock, lambda: st, lambda port: None):
        result = run_ctl(sock, "explain", "eth0")
    assert result.exit_code == 5  # ExitCode.NOT_FOUND
    assert result.stderr == "linkpassctl: unknown port 'eth0'; linkpassd reports no rails yet\n"


def test_explain_rail_port_not_judged_yet(sock: Path) -> None:
    with running_server(sock, status, lambda port: None):
        result = run_ctl(sock, "explain", "eth1")
    assert result.exit_code == 1
    assert result.stderr == ("linkpassctl: linkpassd answered FAILED_PRECONDITION: "
                             "port 'eth1' has not been judged yet; try again in a moment\n")


def test_explain_without_provider_is_unimplemented(sock: Path) -> None:
    with running_server(sock, status):
        result = run_ctl(sock, "explain", "eth0")
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            with pytest.raises(grpc.RpcError) as err:
                pb_grpc.ControlServiceStub(channel).ExplainPort(pb.ExplainPortRequest(port="eth0"), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert result.exit_code == 1
    assert result.stderr == ("linkpassctl: linkpassd answered UNIMPLEMENTED: "
                             "this linkpassd serves no port explanations\n")
    assert result.stdout == ""


def test_explain_empty_port_is_invalid(server, sock: Path) -> None:
    with grpc.insecure_channel(f"unix:{sock}") as channel:
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.ControlServiceStub(channel).ExplainPort(pb.ExplainPortRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_explain_provider_failure_is_internal(sock: Path) -> None:
    def broken(port: str) -> Explanation | None:
        raise KeyError("rail0")

    with running_server(sock, status, broken):
        result = run_ctl(sock, "explain", "eth0")
    assert result.exit_code == 1
    assert result.stderr == ("linkpassctl: linkpassd answered INTERNAL: "
                             "explanation of 'eth0' unavailable: 'rail0'\n")


def test_explain_needs_a_port() -> None:
    proc = ctl_process("explain")
    assert proc.returncode == 2 and "Missing argument 'PORT'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_to_json_renders_every_explanation_field() -> None:
    """Mirrors the model field by field (served_at is the server's addition)."""
    msg = control_convert.explanation_to_proto(EXPLANATIONS["eth0"], served_at=WALL_NOW)
    data = json.loads(ctl.to_json(msg))
    expected = dataclasses.asdict(EXPLANATIONS["eth0"])
    expected["state"]["verdict"] = "VERDICT_DEGRADED"
    expected["state"]["evidence"] = list(expected["state"]["evidence"])
    expected["consequences"] = [dict(c) for c in expected["consequences"]]
    expected["paths"] = [{**p, "severity": "VERDICT_UP"} for p in expected["paths"]]
    assert data == {**expected, "served_at": WALL_NOW}
