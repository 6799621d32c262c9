"""The routing adapter: reads and writes nexthops, groups, routes and rules.

This is the only code that turns model values into netlink requests and
kernel dumps back into model values.  It talks netlink through a
caller-owned ``pyroute2.AsyncIPRoute`` (create it with ``netns=...`` to work
inside a namespace), sending one request per operation: no subprocesses.

Normalisation happens here so the core can compare with ``==``: ports are
interface names, prefixes are CIDR strings, timers are whole seconds, group
members are sorted ids.
"""

from __future__ import annotations

import dataclasses
import errno as _errno
import ipaddress
import os
from socket import AF_INET, AF_INET6, AF_UNSPEC

from pyroute2.netlink import (
    NETLINK_EXT_ACK,
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_DUMP_INTR,
    NLM_F_EXCL,
    NLM_F_REPLACE,
    NLM_F_REQUEST,
    SOL_NETLINK,
)
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.nlsocket import NetlinkRequest
from pyroute2.netlink.rtnl import (
    RTM_DELROUTE,
    RTM_DELRULE,
    RTM_GETROUTE,
    RTM_GETRULE,
    RTM_NEWROUTE,
    RTM_NEWRULE,
)
from pyroute2.netlink.rtnl.fibmsg import FR_ACT_TO_TBL, fibmsg

from linkpassd.adapters import nhmsg as nh
from linkpassd.core.model import (
    KernelObject,
    KernelState,
    Nexthop,
    NexthopGroup,
    Op,
    OpKind,
    Ownership,
    Route,
    Rule,
)

RT_TABLE_COMPAT = 252  # rtm_table/frh.table when the real id (>255) is in RTA_TABLE
RT_SCOPE_UNIVERSE = 0
RT_SCOPE_NOWHERE = 255  # in a delete request: match any scope
RTN_UNICAST = 1

_F_NEW = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
# REPLACE also creates: the reconcile loop is level-triggered, and an object
# the kernel dropped between observe and apply (carrier loss) should come back.
_F_REPLACE = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
_F_DEL = NLM_F_REQUEST | NLM_F_ACK
_F_DUMP = NLM_F_REQUEST | NLM_F_DUMP

_DUMP_ATTEMPTS = 3

# Values a non-resilient group reports for the resilient-only fields, so an
# observed mpath group equals a desired one built with the model defaults.
_GROUP_DEFAULTS = {
    f.name: f.default
    for f in dataclasses.fields(NexthopGroup)
    if f.name in ("buckets", "idle_timer_s", "unbalanced_timer_s")
}


class KernelOpError(Exception):
    """The kernel refused an operation.  Carries the op, the errno and the
    kernel's own explanation (netlink extended ack) when it gave one."""

    def __init__(self, op: Op, errno: int, message: str):
        super().__init__(op, errno, message)
        self.op = op
        self.errno = errno
        self.message = message

    def __str__(self) -> str:
        name = _errno.errorcode.get(self.errno, "?")
        return f"{self.op}: {self.message} ({name}, errno {self.errno})"


class DumpInterrupted(RuntimeError):
    """A dump stayed inconsistent (NLM_F_DUMP_INTR) on every attempt."""


class KernelAdapter:
    """Observe and change the kernel objects linkpassd owns.

    ``ipr`` is owned by the caller, who also closes it.  The adapter
    registers the nexthop message types on it (see ``nhmsg.register``) and
    turns on NETLINK_EXT_ACK so kernel error strings reach ``KernelOpError``.

    If ``ownership`` is given, ``apply`` refuses ops on objects outside it
    before anything is sent: a planner bug must not become a foreign write.
    """

    def __init__(self, ipr, ownership: Ownership | None = None):
        self.ipr = ipr
        self.ownership = ownership
        self.writes = 0
        self._index_by_name: dict[str, int] = {}
        self._name_by_index: dict[int, str] = {}
        self._ext_ack = False
        nh.register(ipr)

    # ------------------------------------------------------------------
    # links
    # ------------------------------------------------------------------

    async def refresh_links(self) -> None:
        """Re-read ifindex <-> name.  Called by every observe(); call it
        after link events if you apply without observing."""
        by_name: dict[str, int] = {}
        async for link in await self.ipr.link("dump"):
            by_name[link.get("ifname")] = link["index"]
        self._index_by_name = by_name
        self._name_by_index = {index: name for name, index in by_name.items()}

    async def _ifindex(self, port: str) -> int | None:
        if port not in self._index_by_name:
            await self.refresh_links()
        return self._index_by_name.get(port)

    async def _port_name(self, index: int) -> str:
        if index not in self._name_by_index:
            await self.refresh_links()
        # An index no link has (a race with deletion) stays visible as such.
        return self._name_by_index.get(index, f"#{index}")

    # ------------------------------------------------------------------
    # observe
    # ------------------------------------------------------------------

    async def observe(self, ownership: Ownership) -> KernelState:
        """Dump nexthops, routes and rules; return only the owned ones."""
        await self.refresh_links()
        nexthops: set[Nexthop] = set()
        groups: set[NexthopGroup] = set()
        # The kernel rejects a nexthop dump filtered by protocol (EINVAL
        # "Invalid values in header"), so dump all and filter here.
        for msg in await self._dump(nh.nhmsg(), nh.RTM_GETNEXTHOP, AF_UNSPEC):
            nh_id = msg.get("NHA_ID")
            if not ownership.owns_nexthop_id(nh_id):
                continue
            if msg["protocol"] != ownership.route_protocol:
                continue
            if msg.get("NHA_GROUP") is not None:
                groups.add(self._group_from_msg(msg))
            else:
                nexthops.add(await self._nexthop_from_msg(msg))

        routes: set[Route] = set()
        for msg in await self._dump(nh.rtmsg_nh(), RTM_GETROUTE, AF_INET):
            route = self._route_from_msg(msg)
            if (
                route is not None
                and ownership.owns_table(route.table)
                and route.protocol == ownership.route_protocol
            ):
                routes.add(route)

        rules: set[Rule] = set()
        for msg in await self._dump(fibmsg(), RTM_GETRULE, AF_INET):
            rule = self._rule_from_msg(msg)
            if (
                ownership.owns_rule_priority(rule.priority)
                and rule.protocol == ownership.route_protocol
            ):
                rules.add(rule)

        return KernelState(
            nexthops=frozenset(nexthops),
            groups=frozenset(groups),
            routes=frozenset(routes),
            rules=frozenset(rules),
        )

    async def _nexthop_from_msg(self, msg) -> Nexthop:
        # Blackhole or device-only nexthops have no gateway/oif; "" keeps
        # them visible (and different from anything desired) so the plan
        # replaces them rather than colliding with their id.
        oif = msg.get("NHA_OIF")
        return Nexthop(
            id=msg.get("NHA_ID"),
            gateway=msg.get("NHA_GATEWAY") or "",
            port=await self._port_name(oif) if oif else "",
            protocol=msg["protocol"],
        )

    @staticmethod
    def _group_from_msg(msg) -> NexthopGroup:
        resilient = msg.get("NHA_GROUP_TYPE") == nh.NEXTHOP_GRP_TYPE_RES
        params = dict(_GROUP_DEFAULTS)
        if resilient:
            res = msg.get("NHA_RES_GROUP")
            params = {
                "buckets": res.get("NHA_RES_GROUP_BUCKETS"),
                "idle_timer_s": _seconds(res.get("NHA_RES_GROUP_IDLE_TIMER")),
                "unbalanced_timer_s": _seconds(
                    res.get("NHA_RES_GROUP_UNBALANCED_TIMER")
                ),
            }
        return NexthopGroup(
            id=msg.get("NHA_ID"),
            members=nh.group_members(msg.get("NHA_GROUP")),
            protocol=msg["protocol"],
            resilient=resilient,
            **params,
        )

    @staticmethod
    def _route_from_msg(msg) -> Route | None:
        nhid = msg.get("RTA_NH_ID")
        if nhid is None:  # only routes through nexthop objects are ours
            return None
        table = msg.get("RTA_TABLE") or msg["table"]
        if msg["dst_len"] == 0:
            dst = "0.0.0.0/0"
        else:
            dst = f"{msg.get('RTA_DST')}/{msg['dst_len']}"
        return Route(
            table=table,
            dst=dst,
            nhid=nhid,
            protocol=msg["proto"],
            prefsrc=msg.get("RTA_PREFSRC"),
        )

    @staticmethod
    def _rule_from_msg(msg) -> Rule:
        src = msg.get("FRA_SRC")
        dst = msg.get("FRA_DST")
        ports = {}
        for key in ("dport", "sport"):
            port_range = msg.get(f"FRA_{key.upper()}_RANGE")  # "start:end"
            if port_range is not None:
                start, end = (int(x) for x in port_range.split(":"))
                # A real range is not representable; None makes it differ from
                # any desired single-port rule instead of passing for one.
                ports[key] = start if start == end else None
        return Rule(
            priority=msg.get("FRA_PRIORITY") or 0,
            table=msg.get("FRA_TABLE") or msg["table"],
            protocol=msg.get("FRA_PROTOCOL") or 0,
            src=f"{src}/{msg['src_len']}" if src is not None else None,
            dst=f"{dst}/{msg['dst_len']}" if dst is not None else None,
            ipproto=msg.get("FRA_IP_PROTO"),
            dport=ports.get("dport"),
            sport=ports.get("sport"),
        )

    async def _dump(self, msg, msg_type: int, family: int) -> list:
        """One complete dump.  A dump the kernel marks inconsistent
        (NLM_F_DUMP_INTR: the table changed mid-dump) is re-read, never
        used: the daemon must not plan from a partial view."""
        for _ in range(_DUMP_ATTEMPTS):
            msg = type(msg)()
            msg["family"] = family
            request = NetlinkRequest(
                self.ipr, msg, msg_type=msg_type, msg_flags=_F_DUMP
            )
            await request.send()
            replies = [reply async for reply in request.response()]
            if not any(r["header"]["flags"] & NLM_F_DUMP_INTR for r in replies):
                return replies
        raise DumpInterrupted(
            f"netlink dump type {msg_type} interrupted {_DUMP_ATTEMPTS} times"
        )

    # ------------------------------------------------------------------
    # apply
    # ------------------------------------------------------------------

    async def apply(self, op: Op) -> None:
        """Send one operation and wait for the kernel's ack.

        Raises KernelOpError when the kernel (or a missing port) refuses it,
        ValueError for an op that cannot be expressed (replacing a rule,
        an object outside ``ownership``).
        """
        obj = op.obj
        self._enable_ext_ack()
        if op.kind not in (OpKind.CREATE, OpKind.REPLACE, OpKind.DELETE):
            raise ValueError(f"unknown op kind {op.kind!r}")
        if self.ownership is not None and not _owned(self.ownership, obj):
            raise ValueError(f"{op}: object is outside linkpassd's ownership")
        if isinstance(obj, Nexthop):
            await self._apply_nexthop(op, obj)
        elif isinstance(obj, NexthopGroup):
            await self._apply_group(op, obj)
        elif isinstance(obj, Route):
            await self._apply_route(op, obj)
        elif isinstance(obj, Rule):
            await self._apply_rule(op, obj)
        else:
            raise TypeError(f"not a kernel object: {obj!r}")

    async def _apply_nexthop(self, op: Op, obj: Nexthop) -> None:
        if op.kind is OpKind.DELETE:
            await self._delete_nexthop(op, obj.id)
            return
        ifindex = await self._ifindex(obj.port)
        if ifindex is None:
            raise KernelOpError(op, _errno.ENODEV, f"no interface named {obj.port!r}")
        try:
            await self._write(op, self._nexthop_msg(obj, ifindex), nh.RTM_NEWNEXTHOP, _new_flags(op))
        except KernelOpError:
            # A port re-created since the cache was filled (driver reload)
            # has a new ifindex, and the kernel answers the stale one with
            # EINVAL "Invalid device index": re-resolve once and resend only
            # if the index really moved.
            await self.refresh_links()
            fresh = self._index_by_name.get(obj.port)
            if fresh is None or fresh == ifindex:
                raise
            await self._write(op, self._nexthop_msg(obj, fresh), nh.RTM_NEWNEXTHOP, _new_flags(op))

    @staticmethod
    def _nexthop_msg(obj: Nexthop, ifindex: int):
        msg = nh.nhmsg()
        msg["family"] = _family(obj.gateway)
        msg["protocol"] = obj.protocol
        msg["attrs"] = [
            ("NHA_ID", obj.id),
            ("NHA_OIF", ifindex),
            ("NHA_GATEWAY", obj.gateway),
        ]
        return msg

    async def _apply_group(self, op: Op, obj: NexthopGroup) -> None:
        if op.kind is OpKind.DELETE:
            await self._delete_nexthop(op, obj.id)
            return
        msg = nh.nhmsg()
        msg["family"] = AF_UNSPEC  # the kernel requires it for groups
        msg["protocol"] = obj.protocol
        attrs = [("NHA_ID", obj.id), ("NHA_GROUP", list(obj.members))]
        if obj.resilient:
            attrs += [
                ("NHA_GROUP_TYPE", nh.NEXTHOP_GRP_TYPE_RES),
                (
                    "NHA_RES_GROUP",
                    {
                        "attrs": [
                            ("NHA_RES_GROUP_BUCKETS", obj.buckets),
                            (
                                "NHA_RES_GROUP_IDLE_TIMER",
                                nh.seconds_to_clock_t(obj.idle_timer_s),
                            ),
                            (
                                "NHA_RES_GROUP_UNBALANCED_TIMER",
                                nh.seconds_to_clock_t(obj.unbalanced_timer_s),
                            ),
                        ]
                    },
                ),
            ]
        msg["attrs"] = attrs
        await self._write(op, msg, nh.RTM_NEWNEXTHOP, _new_flags(op))

    async def _delete_nexthop(self, op: Op, nh_id: int) -> None:
        """Delete by id after checking the protocol: the kernel matches a
        nexthop delete on the id alone (it rejects a protocol in the
        header), so this is the one place ownership must be checked here."""
        probe = nh.nhmsg()
        probe["attrs"] = [("NHA_ID", nh_id)]
        try:
            request = NetlinkRequest(
                self.ipr,
                probe,
                msg_type=nh.RTM_GETNEXTHOP,
                msg_flags=NLM_F_REQUEST | NLM_F_ACK,
            )
            await request.send()
            found = [m async for m in request.response() if m.get("NHA_ID") == nh_id]
        except NetlinkError as e:
            raise KernelOpError(op, e.code, _kernel_message(e)) from e
        if found and found[0]["protocol"] != op.obj.protocol:
            raise KernelOpError(
                op,
                _errno.EPERM,
                f"nexthop {nh_id} has protocol {found[0]['protocol']}, "
                f"not {op.obj.protocol}: not deleting",
            )
        msg = nh.nhmsg()
        msg["attrs"] = [("NHA_ID", nh_id)]
        await self._write(op, msg, nh.RTM_DELNEXTHOP, _F_DEL)

    async def _apply_route(self, op: Op, obj: Route) -> None:
        net = _network(op, obj.dst)
        msg = nh.rtmsg_nh()
        msg["family"] = AF_INET if net.version == 4 else AF_INET6
        msg["dst_len"] = net.prefixlen
        msg["table"] = obj.table if obj.table < 256 else RT_TABLE_COMPAT
        msg["proto"] = obj.protocol
        if op.kind is OpKind.DELETE:
            msg["scope"] = RT_SCOPE_NOWHERE
            msg["type"] = 0  # any type
        else:
            msg["scope"] = RT_SCOPE_UNIVERSE
            msg["type"] = RTN_UNICAST
        attrs = [("RTA_TABLE", obj.table)]
        if net.prefixlen:
            attrs.append(("RTA_DST", str(net.network_address)))
        attrs.append(("RTA_NH_ID", obj.nhid))
        if obj.prefsrc:
            attrs.append(("RTA_PREFSRC", obj.prefsrc))
        msg["attrs"] = attrs
        if op.kind is OpKind.DELETE:
            await self._write(op, msg, RTM_DELROUTE, _F_DEL)
        else:
            await self._write(op, msg, RTM_NEWROUTE, _new_flags(op))

    async def _apply_rule(self, op: Op, obj: Rule) -> None:
        if op.kind is OpKind.REPLACE:
            raise ValueError(
                f"{op}: rules cannot be replaced in place; delete and create"
            )
        msg = fibmsg()
        msg["family"] = AF_INET
        msg["table"] = obj.table if obj.table < 256 else RT_TABLE_COMPAT
        msg["action"] = FR_ACT_TO_TBL
        attrs = [
            ("FRA_PRIORITY", obj.priority),
            ("FRA_TABLE", obj.table),
            ("FRA_PROTOCOL", obj.protocol),
        ]
        for key, cidr in (("src", obj.src), ("dst", obj.dst)):
            if cidr is not None:
                net = _network(op, cidr)
                if net.prefixlen == 0:
                    # The kernel drops a /0 selector, so it would come back
                    # from observe() as None and never compare equal.
                    raise ValueError(f"{op}: {key} {cidr} matches everything; use None")
                msg[f"{key}_len"] = net.prefixlen
                attrs.append((f"FRA_{key.upper()}", str(net.network_address)))
        if obj.ipproto is not None:
            attrs.append(("FRA_IP_PROTO", obj.ipproto))
        if obj.dport is not None:
            attrs.append(("FRA_DPORT_RANGE", f"{obj.dport}:{obj.dport}"))
        if obj.sport is not None:
            attrs.append(("FRA_SPORT_RANGE", f"{obj.sport}:{obj.sport}"))
        msg["attrs"] = attrs
        if op.kind is OpKind.DELETE:
            await self._write(op, msg, RTM_DELRULE, _F_DEL)
        else:
            await self._write(op, msg, RTM_NEWRULE, _F_NEW)

    async def _write(self, op: Op, msg, msg_type: int, flags: int) -> None:
        """Send one write request, count it, wait for the ack."""
        request = NetlinkRequest(self.ipr, msg, msg_type=msg_type, msg_flags=flags)
        self.writes += 1
        try:
            await request.send()
            async for _ in request.response():
                pass
        except NetlinkError as e:
            raise KernelOpError(op, e.code, _kernel_message(e)) from e

    def _enable_ext_ack(self) -> None:
        # Deferred to the first write: pyroute2 creates the socket lazily,
        # inside the event loop.
        if not self._ext_ack:
            self.ipr.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
            self._ext_ack = True


# ----------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------


def _new_flags(op: Op) -> int:
    return _F_REPLACE if op.kind is OpKind.REPLACE else _F_NEW


def _network(op: Op, cidr: str):
    try:
        return ipaddress.ip_network(cidr)  # strict: host bits must be zero
    except ValueError as e:
        raise ValueError(f"{op}: {e}") from e


def _family(address: str) -> int:
    return AF_INET6 if ":" in address else AF_INET


def _seconds(ticks: int | None) -> int:
    return int(nh.clock_t_to_seconds(ticks or 0))


def _kernel_message(e: NetlinkError) -> str:
    message = e.args[1] if len(e.args) > 1 and e.args[1] else None
    return str(message) if message else os.strerror(e.code)


def _owned(ownership: Ownership, obj: KernelObject) -> bool:
    if obj.protocol != ownership.route_protocol:
        return False
    if isinstance(obj, (Nexthop, NexthopGroup)):
        return ownership.owns_nexthop_id(obj.id)
    if isinstance(obj, Route):
        return ownership.owns_table(obj.table)
    if isinstance(obj, Rule):
        return ownership.owns_rule_priority(obj.priority)
    return False
