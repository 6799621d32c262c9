"""Wire format of the nexthop messages, checked byte by byte (no kernel)."""

import struct

from hypothesis import given
from hypothesis import strategies as st
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from linkpassd.adapters import nhmsg as nh


def encode(msg, msg_type):
    msg["header"]["type"] = msg_type
    msg.encode()
    return bytes(msg.data)


def decode(cls, data):
    msg = cls(bytearray(data))
    msg.decode()
    return msg


def nlas(data, offset):
    """(type, payload) of each top-level attribute, parsed independently."""
    out = []
    while offset < len(data):
        length, kind = struct.unpack_from("HH", data, offset)
        out.append((kind, data[offset + 4 : offset + length]))
        offset += (length + 3) & ~3
    return out


def test_nhmsg_header_and_group_layout():
    msg = nh.nhmsg()
    msg["family"] = 0
    msg["protocol"] = 201
    msg["attrs"] = [("NHA_ID", 7), ("NHA_GROUP", [5, {"id": 6, "weight": 300}])]
    data = encode(msg, nh.RTM_NEWNEXTHOP)
    # nlmsghdr (16) + nhmsg (8): family, scope, protocol, resvd, flags
    assert struct.unpack_from("BBBBI", data, 16) == (0, 0, 201, 0, 0)
    attrs = nlas(data, 24)
    assert attrs[0] == (1, struct.pack("I", 7))
    # nexthop_grp {u32 id; u8 weight-1; u8 weight_high; u16 resvd}
    assert attrs[1] == (2, struct.pack("=IBBH", 5, 0, 0, 0) + struct.pack("=IBBH", 6, 0x2B, 1, 0))


def test_res_group_is_nested_and_round_trips():
    msg = nh.nhmsg()
    msg["attrs"] = [
        ("NHA_ID", 9),
        ("NHA_GROUP", [1, 2]),
        ("NHA_GROUP_TYPE", nh.NEXTHOP_GRP_TYPE_RES),
        ("NHA_RES_GROUP", {"attrs": [("NHA_RES_GROUP_BUCKETS", 64),
                                     ("NHA_RES_GROUP_IDLE_TIMER", nh.seconds_to_clock_t(3))]}),
    ]
    data = encode(msg, nh.RTM_NEWNEXTHOP)
    kinds = [kind for kind, _ in nlas(data, 24)]
    # the kernel validates nexthop attributes strictly: NLA_F_NESTED is required
    assert kinds == [1, 2, 3, 12 | 0x8000]

    back = decode(nh.nhmsg, data)
    assert back["event"] == "RTM_NEWNEXTHOP"
    assert nh.group_members(back.get("NHA_GROUP")) == (1, 2)
    assert back.get("NHA_GROUP_TYPE") == 1
    res = back.get("NHA_RES_GROUP")
    assert res.get("NHA_RES_GROUP_BUCKETS") == 64
    assert res.get("NHA_RES_GROUP_IDLE_TIMER") == 300  # USER_HZ ticks


@given(st.lists(st.tuples(st.integers(1, 2**32 - 1), st.integers(1, 0x10000)), max_size=16))
def test_group_members_and_weights_round_trip(members):
    msg = nh.nhmsg()
    msg["attrs"] = [("NHA_GROUP", [{"id": i, "weight": w} for i, w in members])]
    back = decode(nh.nhmsg, encode(msg, nh.RTM_NEWNEXTHOP))
    value = back.get("NHA_GROUP") or ()
    assert [(m["id"], m["weight"]) for m in value] == members


def test_rtmsg_nh_knows_rta_nh_id_even_after_stock_rtmsg_compiled():
    rtmsg().encode()  # compile pyroute2's own table first
    msg = nh.rtmsg_nh()
    msg["family"] = 2
    msg["attrs"] = [("RTA_TABLE", 10100), ("RTA_NH_ID", 1000150)]
    data = encode(msg, 24)
    assert [kind for kind, _ in nlas(data, 28)] == [15, 30]  # RTA_TABLE, RTA_NH_ID
    back = decode(nh.rtmsg_nh, data)
    assert back.get("RTA_NH_ID") == 1000150
    # and the stock class still works as before
    assert not rtmsg().valid_nla("RTA_NH_ID")


def test_clock_t_conversions():
    assert nh.seconds_to_clock_t(0) == 0
    assert nh.seconds_to_clock_t(120) == 12000
    assert nh.clock_t_to_seconds(350) == 3.5


def test_policy_covers_nexthop_and_route_types():
    assert {t: c.__name__ for t, c in nh.POLICY.items()} == {
        104: "nhmsg", 105: "nhmsg", 106: "nhmsg",
        24: "rtmsg_nh", 25: "rtmsg_nh", 26: "rtmsg_nh",
    }
