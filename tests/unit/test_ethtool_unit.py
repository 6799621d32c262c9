"""The ethtool sensor without a kernel: wire numbers against the UAPI headers,
replies built byte by byte, and the module rate limiter on an injected clock."""

from __future__ import annotations

import asyncio
import errno
import pathlib
import re
import struct
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from structlog.testing import capture_logs

from linkpassd.adapters import ethtool as et
from linkpassd.adapters import ethtool_msgs as msgs
from linkpassd.adapters.ethtool import (
    LOWER_PAGE0,
    EthtoolSensor,
    build_counter_sample,
    check_page_ref,
    ext_state_name,
    ext_substate_name,
)
from linkpassd.adapters.optics import PageRef
from linkpassd.adapters.sensor import Sensor
from linkpassd.core.model import CounterSample, ModuleIdentity, OpticsReading, Unreadable

NESTED = 0x8000
GENL_HEADER = 20  # nlmsghdr (16) + genlmsghdr (4)


# ----------------------------------------------------------------------
# byte-level helpers, independent of pyroute2
# ----------------------------------------------------------------------


def attr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def nest(kind: int, *children: bytes) -> bytes:
    return attr(kind | NESTED, b"".join(children))


def u8(kind, v):
    return attr(kind, struct.pack("B", v))


def u32(kind, v):
    return attr(kind, struct.pack("I", v))


def u64(kind, v):
    return attr(kind, struct.pack("Q", v))


def genl_reply(msg_class, cmd: int, *attrs: bytes):
    body = struct.pack("BBH", cmd, 1, 0) + b"".join(attrs)
    data = bytearray(struct.pack("IHHII", 16 + len(body), 0x15, 0, 1, 0) + body)
    msg = msg_class(data)
    msg.decode()
    return msg


def nlas(data: bytes, offset: int) -> list[tuple[int, bytes]]:
    out = []
    while offset < len(data):
        length, kind = struct.unpack_from("HH", data, offset)
        out.append((kind, bytes(data[offset + 4: offset + length])))
        offset += (length + 3) & ~3
    return out


HEADER = nest(1, attr(2, b"lprail0\0"))  # ETHTOOL_A_*_HEADER {DEV_NAME}


# ----------------------------------------------------------------------
# numbers: checked against the installed UAPI headers where they have them
# ----------------------------------------------------------------------

UAPI = pathlib.Path("/usr/include/linux")


def uapi_enums(path: pathlib.Path) -> dict[str, int]:
    """NAME -> value for every enumerator in a header (simple C enums only)."""
    text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
    values: dict[str, int] = {}
    for body in re.findall(r"enum\s*\w*\s*\{(.*?)\}", text, flags=re.S):
        nxt = 0
        for item in (i.strip() for i in body.split(",")):
            m = re.fullmatch(r"(\w+)(?:\s*=\s*(.+))?", item)
            if not m:
                continue
            name, expr = m.groups()
            if expr is not None:
                expr = expr.strip()
                if re.fullmatch(r"\(?\s*1\s*<<\s*(\d+)\s*\)?", expr):
                    nxt = 1 << int(re.search(r"<<\s*(\d+)", expr).group(1))
                elif re.fullmatch(r"-?\d+|0x[0-9a-fA-F]+", expr):
                    nxt = int(expr, 0)
                elif expr in values:
                    nxt = values[expr]
                elif re.fullmatch(r"\(?\s*(\w+)\s*-\s*1\s*\)?", expr):
                    base = re.search(r"(\w+)", expr).group(1)
                    nxt = values.get(base, 0) - 1
                else:
                    continue
            values[name] = nxt
            nxt += 1
    return values


@pytest.fixture(scope="module")
def headers():
    path = UAPI / "ethtool_netlink.h"
    if not path.exists():
        pytest.skip("no kernel UAPI headers installed (linux-libc-dev)")
    values = uapi_enums(path)
    values.update(uapi_enums(UAPI / "ethtool.h"))
    generated = UAPI / "ethtool_netlink_generated.h"
    if generated.exists():
        values.update(uapi_enums(generated))
    return values


MESSAGE_CLASSES = [et.linkstate_msg, et.stats_msg, et.stats_msg.stats_grp, et.fec_msg,
                   et.fec_msg.fec_stats, et.module_eeprom_msg, msgs.ethtool_header, msgs.ethtool_bitset]


def test_attribute_numbers_match_the_uapi_headers(headers):
    checked = 0
    for cls in MESSAGE_CLASSES:
        for number, name, _ in cls.nla_map:
            if name in headers and not name.endswith("_UNSPEC"):
                assert headers[name] == number, (cls.__name__, name)
                checked += 1
    assert checked >= 30


def test_command_flag_and_stat_numbers_match_the_uapi_headers(headers):
    for name in ("ETHTOOL_MSG_LINKSTATE_GET", "ETHTOOL_MSG_FEC_GET",
                 "ETHTOOL_MSG_MODULE_EEPROM_GET", "ETHTOOL_MSG_STATS_GET",
                 "ETHTOOL_STATS_ETH_PHY", "ETHTOOL_STATS_ETH_MAC",
                 "ETHTOOL_A_STATS_ETH_PHY_5_SYM_ERR", "ETHTOOL_A_STATS_ETH_MAC_6_FCS_ERR"):
        assert getattr(et, name) == headers[name], name
    assert et.ETHTOOL_FLAG_STATS == 4 and et.ETHTOOL_FLAG_COMPACT_BITSETS == 1
    assert headers["__ETHTOOL_STATS_CNT"] >= et.ETHTOOL_STATS_CNT


def test_link_ext_state_names_match_the_uapi_headers(headers):
    for number, name in enumerate(msgs.LINK_EXT_STATES):
        assert headers[f"ETHTOOL_LINK_EXT_STATE_{name}"] == number
    for names in msgs.LINK_EXT_SUBSTATES.values():
        for number, name in enumerate(names, start=1):
            assert headers[f"ETHTOOL_LINK_EXT_SUBSTATE_{name}"] == number


def test_attributes_newer_than_debian_headers_follow_their_predecessors():
    """EXT_DOWN_CNT (Linux 6.4+) follows EXT_SUBSTATE; STATS_SRC (6.7+) follows
    STATS_GRP: the order in 6.18's ethtool_netlink_generated.h."""
    numbers = {name: n for n, name, _ in et.linkstate_msg.nla_map}
    assert numbers["ETHTOOL_A_LINKSTATE_EXT_DOWN_CNT"] == numbers["ETHTOOL_A_LINKSTATE_EXT_SUBSTATE"] + 1 == 7
    numbers = {name: n for n, name, _ in et.stats_msg.nla_map}
    assert numbers["ETHTOOL_A_STATS_SRC"] == numbers["ETHTOOL_A_STATS_GRP"] + 1 == 5


# ----------------------------------------------------------------------
# requests on the wire
# ----------------------------------------------------------------------


def encode(msg_class, cmd, attrs):
    msg = msg_class()
    msg["cmd"] = cmd
    msg["version"] = 1
    msg["attrs"] = attrs
    msg["header"]["type"] = 0x15
    msg.encode()
    return bytes(msg.data)


def test_linkstate_request_asks_for_stats_in_a_nested_header():
    data = encode(et.linkstate_msg, et.ETHTOOL_MSG_LINKSTATE_GET, [
        ("ETHTOOL_A_LINKSTATE_HEADER", {"attrs": [("ETHTOOL_A_HEADER_DEV_NAME", "lprail0"),
                                                  ("ETHTOOL_A_HEADER_FLAGS", et.ETHTOOL_FLAG_STATS)]})])
    assert struct.unpack_from("BB", data, 16) == (6, 1)
    ((kind, header),) = nlas(data, GENL_HEADER)
    assert kind == 1 | NESTED
    assert nlas(header, 0) == [(2, b"lprail0\0"), (3, struct.pack("I", 4))]


def test_stats_request_names_the_phy_and_mac_groups_as_a_compact_bitset():
    data = encode(et.stats_msg, et.ETHTOOL_MSG_STATS_GET, [
        ("ETHTOOL_A_STATS_HEADER", {"attrs": [("ETHTOOL_A_HEADER_DEV_NAME", "lprail0")]}),
        ("ETHTOOL_A_STATS_GROUPS", {"attrs": [("ETHTOOL_A_BITSET_NOMASK", True),
                                              ("ETHTOOL_A_BITSET_SIZE", 4),
                                              ("ETHTOOL_A_BITSET_VALUE", 0b11)]})])
    (_, (kind, groups)) = nlas(data, GENL_HEADER)
    assert kind == 3 | NESTED
    assert nlas(groups, 0) == [(1, b""), (2, struct.pack("I", 4)), (4, struct.pack("I", 3))]


def test_module_eeprom_request_layout():
    data = encode(et.module_eeprom_msg, et.ETHTOOL_MSG_MODULE_EEPROM_GET, [
        ("ETHTOOL_A_MODULE_EEPROM_HEADER", {"attrs": [("ETHTOOL_A_HEADER_DEV_NAME", "lprail0")]}),
        ("ETHTOOL_A_MODULE_EEPROM_OFFSET", 128), ("ETHTOOL_A_MODULE_EEPROM_LENGTH", 128),
        ("ETHTOOL_A_MODULE_EEPROM_PAGE", 0x11), ("ETHTOOL_A_MODULE_EEPROM_BANK", 1),
        ("ETHTOOL_A_MODULE_EEPROM_I2C_ADDRESS", 0x50)])
    assert [(k, v) for k, v in nlas(data, GENL_HEADER)][1:] == [
        (2, struct.pack("I", 128)), (3, struct.pack("I", 128)), (4, b"\x11"), (5, b"\x01"), (6, b"\x50")]


# ----------------------------------------------------------------------
# replies -> CounterSample
# ----------------------------------------------------------------------


def test_ext_state_substate_and_down_count_are_named():
    msg = genl_reply(et.linkstate_msg, 6, HEADER, u8(2, 0), u8(5, 1), u8(6, 1), u32(7, 42))
    sample = build_counter_sample("lprail0", linkstate=msg)
    assert (sample.ext_state, sample.ext_substate, sample.link_down_events) == (
        "LINK_TRAINING_FAILURE", "LT_KR_FRAME_LOCK_NOT_ACQUIRED", 42)


def test_no_cable_has_no_substate_and_link_up_has_no_state():
    sample = build_counter_sample("p", linkstate=genl_reply(et.linkstate_msg, 6, HEADER, u8(2, 0), u8(5, 4)))
    assert (sample.ext_state, sample.ext_substate) == ("NO_CABLE", None)
    sample = build_counter_sample("p", linkstate=genl_reply(et.linkstate_msg, 6, HEADER, u8(2, 1)))
    assert sample == CounterSample(port="p")  # veth: LINK only


def test_unknown_states_from_a_newer_kernel_get_stable_names():
    assert ext_state_name(11) == "UNKNOWN_11"
    assert ext_substate_name(4, 1) == "UNKNOWN_1"  # NO_CABLE has no substates
    assert ext_substate_name(10, 1) == "MODULE_CMIS_NOT_READY"
    assert ext_substate_name(0, 99) == "UNKNOWN_99"


def test_standard_stats_pick_symbol_and_fcs_errors_by_group_and_id():

    def stat(kind: int, value: int) -> bytes:  # one counter per GRP_STAT
        return nest(4, u64(kind, value))

    msg = genl_reply(
        et.stats_msg, 33, nest(2, attr(2, b"lprail0\0")), u32(5, 0),
        nest(4, u32(2, et.ETHTOOL_STATS_ETH_PHY), u32(3, 17), stat(0, 123)),
        # eth-mac id 0 (FramesTransmittedOK) must not be taken for symbol errors
        nest(4, u32(2, et.ETHTOOL_STATS_ETH_MAC), u32(3, 18), stat(0, 999), stat(4, 2**64 - 1)),
    )
    link = stats64_link(rx_crc_errors=7, rx_length_errors=3, rx_missed_errors=2)
    sample = build_counter_sample("p", stats=msg, link=link)
    assert sample.symbol_errors == 123
    assert sample.rx_crc_errors == 2**64 - 1  # the driver's IEEE counter wins, absurd or not
    assert (sample.length_errors, sample.rx_missed) == (3, 2)


def test_empty_stats_groups_leave_rtnetlink_counters_alone():
    msg = genl_reply(et.stats_msg, 33, nest(4, u32(2, 0), u32(3, 17)), nest(4, u32(2, 1), u32(3, 18)))
    sample = build_counter_sample("p", stats=msg, link=stats64_link(rx_crc_errors=7))
    assert (sample.symbol_errors, sample.rx_crc_errors) == (None, 7)


def test_fec_totals_are_the_first_array_element():
    msg = genl_reply(et.fec_msg, 30, HEADER, u8(3, 0), u32(4, 1),
                     nest(5, attr(2, struct.pack("QQQ", 10, 4, 6)), attr(3, b"")))
    sample = build_counter_sample("p", fec=msg)
    assert (sample.fec_corrected, sample.fec_uncorrectable) == (10, None)
    without_stats = genl_reply(et.fec_msg, 30, HEADER, u8(3, 0))
    assert build_counter_sample("p", fec=without_stats).fec_corrected is None


def test_truncated_attributes_become_none_not_exceptions():
    msg = genl_reply(et.linkstate_msg, 6, HEADER, attr(7, b"\x01\x02"), attr(5, b""))
    sample = build_counter_sample("p", linkstate=msg)
    assert (sample.link_down_events, sample.ext_state) == (None, None)
    msg = genl_reply(et.stats_msg, 33, nest(4, u32(2, 0), nest(4, attr(0, b"\x01"))), attr(4, b"xx"))
    assert build_counter_sample("p", stats=msg).symbol_errors is None


@given(st.binary(max_size=200))
def test_garbage_attribute_chains_never_raise(blob):
    for cls, cmd, kind in ((et.linkstate_msg, 6, "linkstate"), (et.stats_msg, 33, "stats"),
                           (et.fec_msg, 30, "fec")):
        try:
            msg = genl_reply(cls, cmd, blob)
        except Exception:  # noqa: BLE001 - the reply parser turns these into _ReadFailed
            continue
        assert isinstance(build_counter_sample("p", **{kind: msg}), CounterSample)


def stats64_link(**values):
    names = [n for n, _ in ifinfmsg.ifstats64.fields]
    blob = struct.pack(f"{len(names)}Q", *(values.get(n, 0) for n in names))
    data = bytearray(struct.pack("IHHII", 0, 16, 0, 1, 0) + struct.pack("BBHiII", 0, 0, 0, 3, 0, 0)
                     + attr(23, blob))  # IFLA_STATS64
    struct.pack_into("I", data, 0, len(data))
    msg = ifinfmsg(data)
    msg.decode()
    return msg


# ----------------------------------------------------------------------
# page references
# ----------------------------------------------------------------------


@dataclass(frozen=True)
class Partial:
    """A reference with an explicit length (optics.PageRef reads 128 bytes)."""

    offset: int
    length: int
    page: int = 0
    bank: int = 0
    i2c: int = 0x50


@pytest.mark.parametrize("ref, problem", [
    (PageRef.lower(), None),
    (PageRef.upper(0x11, bank=1), None),
    (PageRef.lower(0x51), None),
    (Partial(offset=96, length=10, i2c=0x51), None),
    (Partial(offset=0, length=0), "length 0"),
    (Partial(offset=0, length=129), "length 129"),
    (Partial(offset=200, length=100), "outside"),
    (Partial(offset=100, length=40), "crosses the half-page boundary"),
    (Partial(offset=0, length=16, page=3), "lower half is page 0"),
    (PageRef(0x50, 0, 3, 0), "lower half is page 0"),
    (PageRef.upper(256), "out of range"),
    (PageRef(0x80, 0, 0, 0), "out of range"),
    ("page 0", "not a page reference"),
])
def test_page_refs_the_kernel_would_refuse_are_named(ref, problem):
    found = check_page_ref(ref)
    assert found is None if problem is None else problem in found


# ----------------------------------------------------------------------
# module reads: rate limit, one reader per module, decoding
# ----------------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


class FakeModuleSensor(EthtoolSensor):
    """EthtoolSensor whose genl request is answered from ``pages`` (or an
    error), and which records how many module reads were in flight."""

    def __init__(self, pages=None, error=None, **kw):
        self.fake_clock = FakeClock()
        super().__init__(clock=self.fake_clock, sleep=self.fake_clock.sleep, **kw)
        self.pages = pages if pages is not None else {}
        self.error = error
        self.in_flight: dict[str, int] = {}
        self.max_in_flight: dict[str, int] = {}
        self.max_total = 0
        self.read_log: list[tuple[str, int, int]] = []

    async def _request(self, msg_class, cmd, port, flags=0, attrs=()):
        assert cmd == et.ETHTOOL_MSG_MODULE_EEPROM_GET
        self.in_flight[port] = self.in_flight.get(port, 0) + 1
        self.max_in_flight[port] = max(self.max_in_flight.get(port, 0), self.in_flight[port])
        self.max_total = max(self.max_total, sum(self.in_flight.values()))
        try:
            await asyncio.sleep(0)  # let any competing reader in
            await asyncio.sleep(0)
            if self.error is not None:
                raise self.error
            a = dict(attrs)
            ref = PageRef(a["ETHTOOL_A_MODULE_EEPROM_I2C_ADDRESS"], a["ETHTOOL_A_MODULE_EEPROM_BANK"],
                          a["ETHTOOL_A_MODULE_EEPROM_PAGE"], a["ETHTOOL_A_MODULE_EEPROM_OFFSET"])
            self.read_log.append((port, ref))
            data = self.pages[ref][: a["ETHTOOL_A_MODULE_EEPROM_LENGTH"]]
            return [genl_reply(et.module_eeprom_msg, 32, HEADER, attr(7, data))]
        finally:
            self.in_flight[port] -= 1


UPPER_11 = PageRef.upper(0x11)
PAGES = {LOWER_PAGE0: bytes([0x18]) + bytes(127), UPPER_11: bytes(range(128))}


class FakeDecoder:
    """optics's three functions, recording what they were given."""

    def __init__(self):
        self.decoded = []

    def identify(self, lower):
        return "CMIS" if lower[0] == 0x18 else Unreadable("identifier 0x00: no module?")

    def pages_needed(self, spec, lower):
        return [LOWER_PAGE0, UPPER_11]

    def decode(self, pages):
        self.decoded.append(dict(pages))
        return OpticsReading(identity=ModuleIdentity(spec="CMIS", form_factor="QSFP-DD", vendor="V",
                                                     part="P", serial="S"),
                             temperature_c=float(len(pages)))


def test_satisfies_the_sensor_protocol():
    assert isinstance(EthtoolSensor(), Sensor)


def test_optics_reads_page0_then_the_pages_the_decoder_asks_for():
    decoder = FakeDecoder()
    sensor = FakeModuleSensor(PAGES, decoder=decoder)
    reading = asyncio.run(sensor.optics("lprail0"))
    assert isinstance(reading, OpticsReading) and reading.temperature_c == 2.0
    assert sensor.read_log == [("lprail0", LOWER_PAGE0), ("lprail0", UPPER_11)]  # page 0 once
    assert decoder.decoded == [PAGES]


def test_a_second_read_inside_the_interval_is_the_cached_answer_with_its_age():
    sensor = FakeModuleSensor(PAGES, decoder=FakeDecoder(), min_module_interval_s=1.0)
    clock = sensor.fake_clock

    async def scenario():
        first = await sensor.optics_timed("lprail0")
        clock.now += 0.4
        second = await sensor.optics_timed("lprail0")
        clock.now += 0.6
        third = await sensor.optics_timed("lprail0")
        return first, second, third

    first, second, third = asyncio.run(scenario())
    assert (first.cached, first.age_s, first.read_at) == (False, 0.0, 1000.0)
    assert second.cached and second.value is first.value
    assert second.age_s == pytest.approx(0.4) and second.read_at == 1000.0
    assert not third.cached and third.read_at == pytest.approx(1001.0)
    assert sensor.module_reads == 4 and clock.slept == []


def test_a_different_read_inside_the_interval_waits_for_it():
    sensor = FakeModuleSensor(PAGES, min_module_interval_s=1.0)
    clock = sensor.fake_clock

    async def scenario():
        await sensor.module_pages("lprail0", [LOWER_PAGE0])
        clock.now += 0.25
        return await sensor.module_pages_timed("lprail0", [UPPER_11])

    timed = asyncio.run(scenario())
    assert clock.slept == [pytest.approx(0.75)]
    assert not timed.cached and timed.value == {UPPER_11: PAGES[UPPER_11]}


def test_one_reader_per_module_but_ports_read_in_parallel():
    sensor = FakeModuleSensor(PAGES, decoder=FakeDecoder(), min_module_interval_s=0.0)

    async def scenario():
        return await asyncio.gather(*(sensor.optics(port) for port in ["a", "a", "a", "b", "b"]))

    results = asyncio.run(scenario())
    assert all(isinstance(r, OpticsReading) for r in results)
    assert sensor.max_in_flight == {"a": 1, "b": 1}
    assert sensor.max_total == 2


def test_concurrent_callers_inside_the_interval_share_one_read():
    sensor = FakeModuleSensor(PAGES, decoder=FakeDecoder(), min_module_interval_s=1.0)

    async def scenario():
        return await asyncio.gather(*(sensor.optics_timed("a") for _ in range(5)))

    results = asyncio.run(scenario())
    assert [r.cached for r in results].count(False) == 1
    assert sensor.module_reads == 2  # page 0 and page 0x11, once


@pytest.mark.parametrize("error, words", [
    (et._Unsupported("Operation not supported (EOPNOTSUPP)"), "module EEPROM not supported"),
    (et._ReadFailed("Remote I/O error (EREMOTEIO)"), "Remote I/O error"),
])
def test_failed_module_reads_are_unreadable_and_cached(error, words):
    sensor = FakeModuleSensor(error=error, decoder=FakeDecoder())

    async def scenario():
        return await sensor.optics("lprail0"), await sensor.optics("lprail0")

    first, second = asyncio.run(scenario())
    assert isinstance(first, Unreadable) and words in first.reason and "lprail0" in first.reason
    assert second is first and sensor.module_reads == 1  # a struggling module is not hammered


def test_short_reads_and_bad_refs_are_unreadable():
    short = {LOWER_PAGE0: bytes(100)}
    reading = asyncio.run(FakeModuleSensor(short, decoder=FakeDecoder()).optics("p"))
    assert isinstance(reading, Unreadable) and "short read, 100 of 128 bytes" in reading.reason
    sensor = FakeModuleSensor(PAGES)
    bad = asyncio.run(sensor.module_pages("p", [Partial(offset=100, length=40)]))
    assert isinstance(bad, Unreadable) and "half-page" in bad.reason and sensor.module_reads == 0


class BrokenDecoder(FakeDecoder):
    def pages_needed(self, spec, lower):
        raise IndexError("page 0 too short")


class WrongDecoder(FakeDecoder):
    def decode(self, pages):
        return {"temperature": 40}


@pytest.mark.parametrize("decoder, words", [
    (BrokenDecoder(), "module decoder failed: IndexError: page 0 too short"),
    (WrongDecoder(), "module decoder returned dict"),
])
def test_a_decoder_bug_is_unreadable_not_a_crash(decoder, words):
    reading = asyncio.run(FakeModuleSensor(PAGES, decoder=decoder).optics("p"))
    assert isinstance(reading, Unreadable) and words in reading.reason


def test_decoder_verdicts_are_unreadable_with_the_port_named():
    empty = {LOWER_PAGE0: bytes(128)}
    reading = asyncio.run(FakeModuleSensor(empty, decoder=FakeDecoder()).optics("p"))
    assert reading == Unreadable("p: identifier 0x00: no module?")


def test_optics_with_the_real_decoders_on_a_qsfp_dd_dump():
    """The page dance against linkpassd.adapters.optics itself, on the
    decoder tests' hand-built CMIS 5.0 dump."""
    from tests.unit.test_optics_decoders import built, qsfp_dd

    pages = built(qsfp_dd())
    sensor = FakeModuleSensor(pages)
    reading = asyncio.run(sensor.optics("lprail0"))
    assert isinstance(reading, OpticsReading), reading
    assert reading.identity.spec == "CMIS" and reading.identity.form_factor == "QSFP-DD"
    assert {ref for _, ref in sensor.read_log} == set(pages)
    assert [ref for _, ref in sensor.read_log][0] == LOWER_PAGE0


# ----------------------------------------------------------------------
# counters(): each request may fail on its own
# ----------------------------------------------------------------------


class FakeCounterSensor(EthtoolSensor):
    def __init__(self, answers):
        super().__init__()
        self.answers = answers

    async def _request(self, msg_class, cmd, port, flags=0, attrs=()):
        answer = self.answers[cmd]
        if isinstance(answer, Exception):
            raise answer
        return [answer]

    async def _link(self, port):
        answer = self.answers["link"]
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_counters_merge_what_worked_and_warn_once_about_what_failed():
    sensor = FakeCounterSensor({
        "link": stats64_link(rx_crc_errors=5, rx_missed_errors=1),
        et.ETHTOOL_MSG_LINKSTATE_GET: et._ReadFailed("Device or resource busy (EBUSY)"),
        et.ETHTOOL_MSG_STATS_GET: et._Unsupported("Operation not supported (EOPNOTSUPP)"),
        et.ETHTOOL_MSG_FEC_GET: genl_reply(et.fec_msg, 30, HEADER, nest(5, attr(2, struct.pack("Q", 9)))),
    })
    with capture_logs() as logs:
        first = asyncio.run(sensor.counters("lprail0"))
        second = asyncio.run(sensor.counters("lprail0"))
    assert first == second == CounterSample(port="lprail0", rx_crc_errors=5, length_errors=0,
                                            rx_missed=1, fec_corrected=9)
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1  # once, not per tick; EOPNOTSUPP is not a warning
    assert warnings[0]["port"] == "lprail0" and warnings[0]["request"] == "LINKSTATE_GET"
    assert "EBUSY" in warnings[0]["reason"]


def test_kernel_messages_name_the_errno_the_kernel_way():
    assert et._kernel_message(NetlinkError(errno.EOPNOTSUPP)) == "Operation not supported (EOPNOTSUPP)"
    assert et._kernel_message(NetlinkError(errno.ENODEV, "no device matches name")) == (
        "no device matches name (ENODEV)")


def test_exact_integers_round_trip_and_refuse_other_sizes():
    data = encode(et.linkstate_msg, et.ETHTOOL_MSG_LINKSTATE_GET, [
        ("ETHTOOL_A_LINKSTATE_EXT_STATE", 9), ("ETHTOOL_A_LINKSTATE_EXT_DOWN_CNT", 2**32 - 1)])
    assert nlas(data, GENL_HEADER) == [(5, b"\x09"), (7, struct.pack("I", 2**32 - 1))]
    back = et.linkstate_msg(bytearray(data))
    back.decode()
    assert build_counter_sample("p", linkstate=back) == CounterSample(
        port="p", ext_state="OVERHEAT", link_down_events=2**32 - 1)
    wide = genl_reply(et.linkstate_msg, 6, attr(7, struct.pack("Q", 5)))  # u64 where u32 belongs
    assert build_counter_sample("p", linkstate=wide).link_down_events is None
