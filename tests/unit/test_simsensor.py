"""The lab sensor backend: files from the labs' own writer round-trip into the
core's value types; anything else is Unreadable with a reason, never raised."""

from __future__ import annotations

import asyncio
import json
import math
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labs.faults.optics import _fec_per_step
from labs.simsensor import HEALTHY, LANES, THRESHOLDS, CmisModule, SimSensor
from linkpassd.adapters import optics as decoders
from linkpassd.adapters.sensor import Sensor
from linkpassd.adapters.simsensor import MAX_FILE_BYTES, SimulatedSensor
from linkpassd.core.model import CounterSample, ModuleIdentity, OpticsReading, Thresholds, Unreadable

PORT = "lph1-eth0"


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def reader(tmp_path):
    return SimulatedSensor.for_run_dir(tmp_path)


@pytest.fixture
def writer(tmp_path):
    return SimSensor(tmp_path / "sim" / f"{PORT}.json", PORT)


def write_raw(reader, text: str | bytes, port: str = PORT) -> None:
    path = reader.path(port)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())


def valid_doc() -> dict:
    return SimSensor("/nonexistent/never-written.json", PORT).document()


# ----------------------------------------------------------------------
# round trip through the labs' writer
# ----------------------------------------------------------------------


def test_healthy_file_from_the_lab_writer_round_trips(reader, writer):
    writer.write_healthy()
    reading = run(reader.optics(PORT))
    assert isinstance(reading, OpticsReading)
    assert reading.identity == ModuleIdentity(spec="CMIS", form_factor="QSFP-DD",
                                              vendor="LINKPASS-SIM", part="", serial="",
                                              spec_revision="5.0")
    assert reading.temperature_c == HEALTHY["temperature_c"]
    assert reading.voltage_v == HEALTHY["voltage_v"]
    assert reading.tx_bias_ma == tuple(HEALTHY["tx_bias_ma"])
    assert reading.tx_power_dbm == tuple(HEALTHY["tx_power_dbm"])
    assert reading.rx_power_dbm == tuple(HEALTHY["rx_power_dbm"]) and len(reading.rx_power_dbm) == LANES
    for quantity, levels in THRESHOLDS.items():
        assert reading.threshold(quantity) == Thresholds(
            high_alarm=levels["high_alarm"], high_warn=levels["high_warning"],
            low_warn=levels["low_warning"], low_alarm=levels["low_alarm"])
    assert reading.flags == frozenset()
    assert run(reader.counters(PORT)) == CounterSample(
        port=PORT, rx_crc_errors=0, fec_corrected=0, fec_uncorrectable=0, link_down_events=0)


def test_a_degraded_lane_and_grown_counters_arrive_as_written(reader, writer):
    """What OpticDegradation does per step, without a lab: lane 2 past the low
    alarm, counters grown by the writer's own error model."""
    dbm = -12.3
    corrected, uncorrectable, crc = _fec_per_step(dbm)
    writer.reading["rx_power_dbm"][2] = dbm
    writer.counters["fec_corrected"] += corrected
    writer.counters["fec_uncorrectable"] += uncorrectable
    writer.counters["rx_crc_errors"] += crc
    writer.counters["link_down_count"] += 2
    writer.write()
    reading = run(reader.optics(PORT))
    assert reading.rx_power_dbm[2] == dbm < reading.threshold("rx_power_dbm").low_alarm
    assert reading.rx_power_dbm[0] == HEALTHY["rx_power_dbm"][0]
    sample = run(reader.counters(PORT))
    assert (sample.fec_corrected, sample.fec_uncorrectable, sample.rx_crc_errors,
            sample.link_down_events) == (corrected, uncorrectable, crc, 2)
    assert corrected > 0 and uncorrectable > 0
    # what the simulation does not model stays "not supported"
    assert (sample.symbol_errors, sample.length_errors, sample.rx_missed,
            sample.ext_state, sample.ext_substate) == (None,) * 5


def test_reads_follow_each_write_and_never_see_a_torn_file(reader, writer):
    """The writer renames a temp file over the reading; a reader racing it
    sees the previous or the next reading, never half of one."""
    writer.write_healthy()
    stop = threading.Event()

    def keep_writing():
        n = 0
        while not stop.is_set() and n < 2000:
            writer.reading["rx_power_dbm"][0] = -1.5 - (n % 100) / 10
            writer.counters["fec_corrected"] += 1
            writer.write()
            n += 1

    thread = threading.Thread(target=keep_writing, daemon=True)
    thread.start()
    seen = []
    try:
        for _ in range(300):
            reading = run(reader.optics(PORT))
            sample = run(reader.counters(PORT))
            assert isinstance(reading, OpticsReading), reading
            assert sample.fec_corrected is not None
            seen.append(sample.fec_corrected)
    finally:
        stop.set()
        thread.join(10)
    assert seen == sorted(seen) and seen[-1] > seen[0]


def test_satisfies_the_sensor_protocol(reader, tmp_path):
    assert isinstance(reader, Sensor)
    assert reader.sim_dir == SimulatedSensor(tmp_path / "sim").sim_dir == tmp_path / "sim"
    reader.close()


# ----------------------------------------------------------------------
# missing and bad files
# ----------------------------------------------------------------------


def test_missing_file_is_unreadable_for_optics_and_empty_counters(reader):
    reading = run(reader.optics(PORT))
    assert isinstance(reading, Unreadable)
    assert "no simulated sensor file" in reading.reason and PORT in reading.reason
    assert run(reader.counters(PORT)) == CounterSample(port=PORT)


def mutate(**changes):
    doc = valid_doc()
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        target = doc
        for key in parents:
            target = target[key]
        if value is DELETE:
            del target[leaf]
        else:
            target[leaf] = value
    return json.dumps(doc)


DELETE = object()

BAD_OPTICS = {
    "not json": ("{schema: nope", "not valid JSON"),
    "empty": ("", "not valid JSON"),
    "truncated": (json.dumps(valid_doc(), indent=1)[:300], "not valid JSON"),
    "not utf-8": (b'{"schema": "\xff\xfe"}', "not UTF-8"),
    "array": ("[1, 2, 3]", "holds an array, not an object"),
    "NaN": (mutate(temperature_c=math.nan), "non-finite number NaN"),
    "Infinity": (mutate(rx_power_dbm=[-1.0, math.inf, -1.0, -1.0]), "non-finite number Infinity"),
    "other schema": (mutate(schema="linkpass.simsensor/2"), "schema"),
    "other port": (mutate(port="lph2-eth0"), "for port 'lph2-eth0'"),
    "string temperature": (mutate(temperature_c="42"), "temperature_c is a string, not a number"),
    "bool voltage": (mutate(voltage_v=True), "voltage_v is a boolean, not a number"),
    "missing voltage": (mutate(voltage_v=DELETE), "voltage_v is null"),
    "lane count": (mutate(tx_bias_ma=[7.5, 7.5]), "tx_bias_ma has 2 lanes, module.lanes says 4"),
    "lanes not an int": (mutate(module__lanes=4.0), "module.lanes is a fraction, not an integer"),
    "string lane": (mutate(rx_power_dbm=[-1.5, "low", -1.5, -1.5]), "rx_power_dbm[1] is a string"),
    "module missing": (mutate(module=DELETE), "module is null, not an object"),
    "vendor number": (mutate(module__vendor=7), "module.vendor is an integer, not a string"),
    "thresholds list": (mutate(thresholds=[]), "thresholds is an array"),
    "threshold string": (mutate(thresholds__rx_power_dbm__low_alarm="-11"),
                         "thresholds.rx_power_dbm.low_alarm is a string"),
    "thresholds reversed": (mutate(thresholds__rx_power_dbm__low_alarm=5.0), "out of order"),
    "huge number": (mutate(temperature_c=10**400), "too large"),
    "written_at text": (mutate(written_at="now"), "written_at is a string"),
    "sequence float": (mutate(sequence=1.5), "sequence is a fraction"),
}


@pytest.mark.parametrize("case", sorted(BAD_OPTICS))
def test_bad_file_is_unreadable_with_the_reason(reader, case):
    text, why = BAD_OPTICS[case]
    write_raw(reader, text)
    reading = run(reader.optics(PORT))
    assert isinstance(reading, Unreadable), reading
    assert why in reading.reason and PORT in reading.reason


BAD_COUNTERS = {
    "counters list": mutate(counters=[0, 0]),
    "counter float": mutate(counters__fec_corrected=1.5),
    "counter string": mutate(counters__rx_crc_errors="12"),
    "counter bool": mutate(counters__link_down_count=False),
    "NaN counter": mutate(counters__fec_uncorrectable=math.nan),
    "not json": "{",
    "other schema": mutate(schema="x"),
}


@pytest.mark.parametrize("case", sorted(BAD_COUNTERS))
def test_bad_counters_give_an_empty_sample_not_an_exception(reader, case):
    write_raw(reader, BAD_COUNTERS[case])
    assert run(reader.counters(PORT)) == CounterSample(port=PORT)


def test_absurd_counters_are_passed_on_as_read(reader):
    write_raw(reader, mutate(counters__fec_corrected=-5, counters__rx_crc_errors=2**70))
    sample = run(reader.counters(PORT))
    assert sample.fec_corrected == -5 and sample.rx_crc_errors == 2**70


def test_counters_left_out_are_not_supported_and_optics_still_read(reader):
    write_raw(reader, mutate(counters__link_down_count=DELETE, thresholds=DELETE))
    sample = run(reader.counters(PORT))
    assert sample.link_down_events is None and sample.fec_corrected == 0
    reading = run(reader.optics(PORT))
    assert isinstance(reading, OpticsReading) and reading.thresholds == ()


def test_a_lane_the_module_does_not_report_is_none(reader):
    write_raw(reader, mutate(tx_power_dbm=[-0.5, None, -0.5, -0.5]))
    assert run(reader.optics(PORT)).tx_power_dbm == (-0.5, None, -0.5, -0.5)


def test_oversized_file_is_unreadable(reader):
    write_raw(reader, " " * (MAX_FILE_BYTES + 1))
    reading = run(reader.optics(PORT))
    assert isinstance(reading, Unreadable) and "exceeds" in reading.reason


@pytest.mark.parametrize("port", ["", "../etc/passwd", ".hidden", "a/b"])
def test_port_names_cannot_leave_the_sim_directory(reader, port):
    reading = run(reader.optics(port))
    assert isinstance(reading, Unreadable) and "not an interface name" in reading.reason
    assert run(reader.counters(port)) == CounterSample(port=port)


def test_unreadable_directory_entry_is_unreadable(reader):
    reader.path(PORT).mkdir(parents=True)  # a directory where the file should be
    reading = run(reader.optics(PORT))
    assert isinstance(reading, Unreadable) and "cannot read" in reading.reason


# ----------------------------------------------------------------------
# property: no document makes the reader raise
# ----------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=25,
)

FIELDS = ["schema", "port", "written_at", "sequence", "module", "temperature_c", "voltage_v",
          "tx_bias_ma", "tx_power_dbm", "rx_power_dbm", "thresholds", "counters"]


def check_answers(reader):
    reading = run(reader.optics(PORT))
    sample = run(reader.counters(PORT))
    assert isinstance(reading, (OpticsReading, Unreadable))
    assert isinstance(sample, CounterSample) and sample.port == PORT
    if isinstance(reading, OpticsReading):
        numbers = [reading.temperature_c, reading.voltage_v, *reading.tx_bias_ma,
                   *reading.tx_power_dbm, *reading.rx_power_dbm]
        assert all(v is None or math.isfinite(v) for v in numbers)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=json_values)
def test_random_json_documents_never_raise(reader, doc):
    write_raw(reader, json.dumps(doc))
    check_answers(reader)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), value=json_values, nested=st.booleans())
def test_a_valid_document_with_one_field_replaced_never_raises(reader, field, value, nested):
    doc = valid_doc()
    if nested and isinstance(doc[field], dict) and doc[field]:
        doc[field][sorted(doc[field])[0]] = value
    else:
        doc[field] = value
    write_raw(reader, json.dumps(doc))
    check_answers(reader)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_random_bytes_never_raise(reader, data):
    write_raw(reader, data)
    check_answers(reader)


# ----------------------------------------------------------------------
# raw module EEPROM pages, through the production decoders
# ----------------------------------------------------------------------


def eeprom_doc(pages=None, **extra) -> dict:
    writer = SimSensor("/nonexistent/never-written.json", PORT)
    writer.eeprom = CmisModule().pages() if pages is None else pages
    return {**writer.document(), **extra}


@pytest.mark.parametrize("module", [
    CmisModule(), CmisModule(rx_los_lanes=(1,), rx_power_low_alarm_lanes=(1,)),
    CmisModule(module_fault=True), CmisModule(threshold_fill=0xFF), CmisModule(flat=True)],
    ids=["healthy", "rx-los", "module-fault", "blank-thresholds", "flat"])
def test_eeprom_pages_from_the_lab_writer_decode_as_the_real_decoder_does(reader, writer, module):
    writer.write_eeprom(module.pages())
    reading = run(reader.optics(PORT))
    assert isinstance(reading, OpticsReading), reading
    assert reading == decoders.decode(module.pages())
    assert run(reader.counters(PORT)).fec_corrected == 0  # counters carry on beside the pages


def test_eeprom_flags_and_levels_arrive_as_the_module_set_them(reader, writer):
    writer.write_eeprom(CmisModule(rx_los_lanes=(1,), rx_power_low_alarm_lanes=(1,)).pages())
    reading = run(reader.optics(PORT))
    assert reading.flags == {"rx_los[1]", "rx_power_low_alarm[1]"}
    assert reading.identity.spec == "CMIS" and reading.identity.vendor == "LINKPASS-SIM"
    assert reading.rx_power_dbm == pytest.approx((HEALTHY["rx_power_dbm"][0],) * LANES, abs=0.01)
    assert reading.threshold("rx_power_dbm").low_alarm == pytest.approx(
        THRESHOLDS["rx_power_dbm"]["low_alarm"], abs=0.01)
    writer.write_eeprom(CmisModule(module_fault=True, flat=True).pages())
    assert run(reader.optics(PORT)).flags == {"module_fault"}
    writer.write_healthy()  # back to decoded values
    assert run(reader.optics(PORT)).thresholds != ()


def _entries(**change) -> list:
    entries = eeprom_doc()["eeprom"]
    entries[0] = {**entries[0], **change}
    return entries


BAD_EEPROM = {
    "not a list": ({"eeprom": {"page": 0}}, "eeprom is an object, not an array of pages"),
    "empty": ({"eeprom": []}, "eeprom is an empty array: no pages"),
    "entry not object": ({"eeprom": ["00"]}, "eeprom[0] is a string, not an object"),
    "unknown key": ({"eeprom": _entries(data="00")}, "eeprom[0] has unknown key 'data'"),
    "bad i2c": ({"eeprom": _entries(i2c=82)}, "eeprom[0].i2c 82 is not 80"),
    "bad offset": ({"eeprom": _entries(offset=64)}, "eeprom[0].offset 64 is not 0"),
    "page range": ({"eeprom": _entries(page=256)}, "eeprom[0]: bank 0 / page 256 not in 0..255"),
    "page missing": ({"eeprom": _entries(page=None)}, "eeprom[0].page is null, not an integer"),
    "not hex": ({"eeprom": _entries(hex="zz" * 128)}, "eeprom[0].hex is not hexadecimal"),
    "short page": ({"eeprom": _entries(hex="18" * 64)}, "eeprom[0].hex holds 64 bytes, a page is 128"),
    "repeated": ({"eeprom": eeprom_doc()["eeprom"][:1] * 2}, "eeprom[1] repeats lower memory"),
    "missing page": ({"eeprom": [e for e in eeprom_doc()["eeprom"] if e["page"] != 0x11]},
                     "module EEPROM: missing required page: upper page 11h"),
    "both kinds": ({"module": valid_doc()["module"]}, "eeprom and decoded field 'module' both given"),
}


@pytest.mark.parametrize("case", sorted(BAD_EEPROM))
def test_bad_eeprom_pages_are_unreadable_with_the_reason(reader, case):
    change, why = BAD_EEPROM[case]
    write_raw(reader, json.dumps(eeprom_doc(**change)))
    reading = run(reader.optics(PORT))
    assert isinstance(reading, Unreadable), reading
    assert why in reading.reason and PORT in reading.reason


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(index=st.integers(0, 4), key=st.sampled_from(["i2c", "bank", "page", "offset", "hex"]),
       value=json_values)
def test_an_eeprom_entry_with_one_field_replaced_never_raises(reader, index, key, value):
    doc = eeprom_doc()
    doc["eeprom"][index][key] = value
    write_raw(reader, json.dumps(doc))
    check_answers(reader)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(index=st.integers(0, 4), data=st.binary(min_size=128, max_size=128))
def test_an_eeprom_page_of_random_bytes_never_raises(reader, index, data):
    doc = eeprom_doc()
    doc["eeprom"][index]["hex"] = data.hex()
    write_raw(reader, json.dumps(doc))
    check_answers(reader)
