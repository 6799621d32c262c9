"""Kernel nexthop objects (RTM_*NEXTHOP) and RTA_NH_ID on pyroute2's marshalling.

pyroute2 0.9 knows neither ``struct nhmsg`` nor the route attributes after
RTA_EXPIRES, so a dump of nexthops comes back as opaque ``nlmsg`` and a route
that uses a nexthop object loses its ``nhid``.  This module declares the
missing message types the way pyroute2 declares its own (``fields`` plus an
``nla_map``) and registers them on a socket's marshal with
``register_policy()``, so requests, dump replies and multicast events
(RTNLGRP_NEXTHOP) all parse into ordinary pyroute2 messages.

Numbers are from the kernel UAPI: include/uapi/linux/nexthop.h and
include/uapi/linux/rtnetlink.h (checked against the 6.18 headers, which add
NHA_OP_FLAGS..NHA_HW_STATS_USED and ``weight_high`` in ``nexthop_grp``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping

from pyroute2.netlink import NLA_F_NESTED, nla, nla_string, nlmsg
from pyroute2.netlink.rtnl import RTM_DELROUTE, RTM_GETROUTE, RTM_NEWROUTE
from pyroute2.netlink.rtnl.rtmsg import rtmsg_base

# include/uapi/linux/rtnetlink.h
RTM_NEWNEXTHOP = 104
RTM_DELNEXTHOP = 105
RTM_GETNEXTHOP = 106
RTNLGRP_NEXTHOP = 32  # multicast group id, for add_membership()

# include/uapi/linux/nexthop.h
NEXTHOP_GRP_TYPE_MPATH = 0
NEXTHOP_GRP_TYPE_RES = 1

# Resilient-group timers travel as clock_t in USER_HZ units, whatever the
# kernel's CONFIG_HZ (jiffies_to_clock_t / clock_t_to_jiffies).
USER_HZ = 100

RTA_NH_ID = 30

_EVENTS = {
    RTM_NEWNEXTHOP: "RTM_NEWNEXTHOP",
    RTM_DELNEXTHOP: "RTM_DELNEXTHOP",
    RTM_GETNEXTHOP: "RTM_GETNEXTHOP",
}

_GRP_ENTRY = struct.Struct("=IBBH")  # struct nexthop_grp


def seconds_to_clock_t(seconds: float) -> int:
    return int(round(seconds * USER_HZ))


def clock_t_to_seconds(ticks: int) -> float:
    return ticks / USER_HZ


class nhmsg(nlmsg):
    """struct nhmsg and the NHA_* attributes.

    Decoded group members are dicts ``{"id": int, "weight": int}`` with the
    real weight (the wire carries weight-1, split over ``weight`` and, since
    Linux 6.12, ``weight_high``).  To encode, pass ``NHA_GROUP`` a list of
    ids or of such dicts.  ``NHA_RES_GROUP`` is nested and carries raw
    clock_t values; see ``seconds_to_clock_t``.
    """

    __slots__ = ()
    prefix = "NHA_"

    fields = (
        ("family", "B"),
        ("scope", "B"),  # filled in by the kernel; must be 0 in requests
        ("protocol", "B"),
        ("resvd", "B"),
        ("flags", "I"),  # RTNH_F_*
    )

    # The kernel validates nexthop attributes strictly (strict_start_type =
    # 1), so nested attributes must carry NLA_F_NESTED.
    nla_map = (
        (0, "NHA_UNSPEC", "none"),
        (1, "NHA_ID", "uint32"),
        (2, "NHA_GROUP", "nh_group"),
        (3, "NHA_GROUP_TYPE", "uint16"),
        (4, "NHA_BLACKHOLE", "flag"),
        (5, "NHA_OIF", "uint32"),
        (6, "NHA_GATEWAY", "ipaddr"),  # 4 or 16 bytes; family-agnostic
        (7, "NHA_ENCAP_TYPE", "uint16"),
        (8, "NHA_ENCAP", "hex"),
        (9, "NHA_GROUPS", "flag"),
        (10, "NHA_MASTER", "uint32"),
        (11, "NHA_FDB", "flag"),
        (12, "NHA_RES_GROUP", "res_group", NLA_F_NESTED),
        (13, "NHA_RES_BUCKET", "res_bucket", NLA_F_NESTED),
        (14, "NHA_OP_FLAGS", "uint32"),
        (15, "NHA_GROUP_STATS", "hex"),
        (16, "NHA_HW_STATS_ENABLE", "uint32"),
        (17, "NHA_HW_STATS_USED", "uint32"),
    )

    def decode(self):
        super().decode()
        # MarshalRtnl.fix_message names events from pyroute2's RTM table,
        # which lacks the nexthop types; name them here instead.
        event = _EVENTS.get(self["header"].get("type"))
        if event is not None:
            self["event"] = event

    class nh_group(nla_string):
        """NHA_GROUP: a bare array of struct nexthop_grp (no per-entry NLA)."""

        __slots__ = ()

        def encode(self):
            entries = []
            for member in self.value:
                if isinstance(member, Mapping):
                    nh_id, weight = member["id"], member.get("weight", 1)
                else:
                    nh_id, weight = member, 1
                if not 1 <= weight <= 0x10000:
                    raise ValueError(f"nexthop weight {weight} out of range")
                w = weight - 1
                entries.append(_GRP_ENTRY.pack(nh_id, w & 0xFF, w >> 8, 0))
            self["value"] = b"".join(entries)
            nla_string.encode(self)

        def decode(self):
            nla_string.decode(self)
            raw = self["value"]
            usable = len(raw) - len(raw) % _GRP_ENTRY.size
            self.value = tuple(
                {"id": nh_id, "weight": 1 + (low | high << 8)}
                for nh_id, low, high, _ in _GRP_ENTRY.iter_unpack(raw[:usable])
            )

    class res_group(nla):
        __slots__ = ()
        prefix = "NHA_RES_GROUP_"
        nla_map = (
            (0, "NHA_RES_GROUP_PAD", "none"),
            (1, "NHA_RES_GROUP_BUCKETS", "uint16"),
            (2, "NHA_RES_GROUP_IDLE_TIMER", "uint32"),  # clock_t
            (3, "NHA_RES_GROUP_UNBALANCED_TIMER", "uint32"),  # clock_t
            (4, "NHA_RES_GROUP_UNBALANCED_TIME", "uint64"),  # clock_t, dump only
        )

    class res_bucket(nla):
        __slots__ = ()
        prefix = "NHA_RES_BUCKET_"
        nla_map = (
            (0, "NHA_RES_BUCKET_PAD", "none"),
            (1, "NHA_RES_BUCKET_INDEX", "uint16"),
            (2, "NHA_RES_BUCKET_IDLE_TIME", "uint64"),  # clock_t
            (3, "NHA_RES_BUCKET_NH_ID", "uint32"),
        )


class rtmsg_nh(rtmsg_base, nlmsg):
    """rtmsg that also knows the attributes after RTA_EXPIRES, up to RTA_NH_ID.

    Built from ``rtmsg_base`` like pyroute2's own ``rtmsg`` rather than by
    subclassing ``rtmsg``: pyroute2 caches the compiled NLA table on the
    first instantiated class, and a subclass of an already-compiled class
    would silently inherit the shorter table.
    """

    __slots__ = ()

    nla_map = rtmsg_base.nla_map + (
        ("RTA_PAD", "hex"),
        ("RTA_UID", "uint32"),
        ("RTA_TTL_PROPAGATE", "uint8"),
        ("RTA_IP_PROTO", "uint8"),
        ("RTA_SPORT", "be16"),
        ("RTA_DPORT", "be16"),
        ("RTA_NH_ID", "uint32"),
    )


# rtmsg_base.nla_map is positional: make sure RTA_NH_ID lands on 30.
assert [name for name, _ in rtmsg_nh.nla_map].index("RTA_NH_ID") == RTA_NH_ID


POLICY = {
    RTM_NEWNEXTHOP: nhmsg,
    RTM_DELNEXTHOP: nhmsg,
    RTM_GETNEXTHOP: nhmsg,
    RTM_NEWROUTE: rtmsg_nh,
    RTM_DELROUTE: rtmsg_nh,
    RTM_GETROUTE: rtmsg_nh,
}


def register(sock) -> None:
    """Teach one pyroute2 RTNL socket (AsyncIPRoute, IPRoute, ...) to parse
    nexthop messages and RTA_NH_ID.  Per socket, not global: other users of
    pyroute2 in the process keep the stock marshal."""
    sock.register_policy(POLICY)


def group_members(value: Iterable[Mapping]) -> tuple[int, ...]:
    """Sorted member ids of a decoded NHA_GROUP."""
    return tuple(sorted(member["id"] for member in value))
