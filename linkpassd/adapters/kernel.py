"""The routing adapter: reads and writes nexthops, groups, routes and rules.

This is the only code that turns model values into netlink requests and
kernel dumps back into model values.  It talks netlink through a
caller-owned ``pyroute2.AsyncIPRoute`` (create it with ``netns=...`` to work
inside a namespace), sending one request per operation: no subprocesses.

Normalisation happens here so the core can compare with ``==``: ports are
interface names, prefixes are CIDR strings, timers are whole seconds, group
members are sorted ids.

Every request is bounded by ``timeout_s`` (a lost or late answer must not
stall the reconcile loop) and dumps ask the kernel to filter where it can
(NETLINK_GET_STRICT_CHK), so a host with thousands of foreign routes costs
no more to observe than an empty one.
"""

from __future__ import annotations

import dataclasses
import errno as _errno
import ipaddress
from socket import AF_INET, AF_INET6, AF_UNSPEC

from pyroute2.netlink import (
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_EXCL,
    NLM_F_REPLACE,
    NLM_F_REQUEST,
)
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import (
    RTM_DELROUTE,
    RTM_DELRULE,
    RTM_GETLINK,
    RTM_GETROUTE,
    RTM_GETRULE,
    RTM_NEWROUTE,
    RTM_NEWRULE,
    rt_proto,
    rt_type,
)
from pyroute2.netlink.rtnl.fibmsg import FR_ACT_TO_TBL, fibmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from linkpassd.adapters import nhmsg as nh
from linkpassd.adapters.nlrequest import (
    DEFAULT_TIMEOUT_S,
    BoundedNetlink,
    DumpInterrupted,
    KernelReadError,
    KernelReadTimeout,
    KernelSocketError,
    kernel_message,
)
from linkpassd.core.model import (
    ForeignObject,
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

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DumpInterrupted",
    "KernelAdapter",
    "KernelOpError",
    "KernelReadError",
    "KernelReadTimeout",
    "KernelSocketError",
    "Observation",
]

RT_TABLE_COMPAT = 252  # rtm_table/frh.table when the real id (>255) is in RTA_TABLE
RT_SCOPE_UNIVERSE = 0
RT_SCOPE_NOWHERE = 255  # in a delete request: match any scope
RTN_UNICAST = 1

_F_NEW = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
# REPLACE also creates: the reconcile loop is level-triggered, and an object
# the kernel dropped between observe and apply (carrier loss) should come back.
_F_REPLACE = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
_F_DEL = NLM_F_REQUEST | NLM_F_ACK

# Past this many owned tables, the kernel-filtered dumps of each (~0.3-0.5 ms
# each, measured on a busy 2-core VM) cost more than one full route dump on
# most hosts (parsed here at ~40-120 us per route).
_MAX_TABLE_DUMPS = 256

# Values a non-resilient group reports for the resilient-only fields, so an
# observed mpath group equals a desired one built with the model defaults.
_GROUP_DEFAULTS = {
    f.name: f.default
    for f in dataclasses.fields(NexthopGroup)
    if f.name in ("buckets", "idle_timer_s", "unbalanced_timer_s")
}


class KernelOpError(Exception):
    """The kernel refused an operation (or did not answer: ETIMEDOUT).
    Carries the op, the errno and the kernel's own explanation (netlink
    extended ack) when it gave one.

    ``foreign`` is True when an object linkpassd does not own holds the id or
    key: a conflict to report, which re-reading the kernel will not resolve.
    """

    def __init__(self, op: Op, errno: int, message: str, *, foreign: bool = False):
        super().__init__(op, errno, message)
        self.op = op
        self.errno = errno
        self.message = message
        self.foreign = foreign

    def __str__(self) -> str:
        name = _errno.errorcode.get(self.errno, "?")
        return f"{self.op}: {self.message} ({name}, errno {self.errno})"


@dataclasses.dataclass(frozen=True)
class Observation:
    """What ``observe_with_foreign`` saw: the owned objects (exactly what
    ``observe`` returns) and, sorted, every object inside the owned ranges
    that is someone else's."""

    state: KernelState
    foreign: tuple[ForeignObject, ...] = ()


class KernelAdapter:
    """Observe and change the kernel objects linkpassd owns.

    ``ipr`` is owned by the caller, who also closes it.  The adapter
    registers the nexthop message types on it (see ``nhmsg.register``) and
    turns on NETLINK_EXT_ACK (kernel error strings reach ``KernelOpError``)
    and, unless ``strict_check=False``, NETLINK_GET_STRICT_CHK (dumps
    filtered by the kernel).  Strict checking is per socket: pyroute2 0.9's
    own ``route("dump")`` puts table 254 in its request, so on this socket it
    then sees the main table only; use another socket for that.

    If ``ownership`` is given, ``apply`` refuses ops on objects outside it
    before anything is sent: a planner bug must not become a foreign write.
    Assign ``ownership`` again when the configuration changes.

    Each request (send and every reply) must finish within ``timeout_s``;
    ``timeouts`` counts those that did not.  Replies are matched to requests
    by sequence number, so a late reply never answers a later request, but it
    still lands in the socket's default queue: after timeouts, a long-running
    caller should ``replace_socket`` with a fresh one.
    """

    def __init__(self, ipr, ownership: Ownership | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, strict_check: bool = True):
        self._nl = BoundedNetlink(ipr, timeout_s, strict_check)
        self.ownership = ownership
        self.writes = 0  # write requests sent
        self._index_by_name: dict[str, int] = {}
        self._name_by_index: dict[int, str] = {}
        self._route_filter_ok = True  # the kernel accepted our route dump filters
        nh.register(ipr)

    @property
    def ipr(self):
        return self._nl.ipr

    @property
    def timeout_s(self) -> float:
        return self._nl.timeout_s

    @property
    def requests(self) -> int:
        """Every netlink request sent, reads included."""
        return self._nl.requests

    @property
    def timeouts(self) -> int:
        return self._nl.timeouts

    @property
    def ownership(self) -> Ownership | None:
        return self._ownership

    @ownership.setter
    def ownership(self, value: Ownership | None) -> None:
        if value is not None and not isinstance(value, Ownership):
            raise TypeError(f"ownership must be an Ownership or None, not {value!r}")
        self._ownership = value

    def replace_socket(self, ipr):
        """Continue on a fresh socket; returns the old one for the caller to
        close.  Late replies to timed-out requests (and a send still blocked
        in the kernel) stay with the old socket and its sender thread."""
        nh.register(ipr)
        return self._nl.replace_socket(ipr)

    def close(self) -> None:
        """Stop the sender thread (the socket is the caller's to close)."""
        self._nl.close()

    # ------------------------------------------------------------------
    # links
    # ------------------------------------------------------------------

    async def refresh_links(self) -> None:
        """Re-read ifindex <-> name.  Called by every observe(); call it
        after link events if you apply without observing."""
        by_name: dict[str, int] = {}
        for link in await self._nl.dump(lambda: _dump_msg(ifinfmsg, AF_UNSPEC),
                                        RTM_GETLINK, "link dump"):
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

    async def observe(self, ownership: Ownership | None = None) -> KernelState:
        """Dump nexthops, routes and rules; return only the owned ones.
        ``ownership`` defaults to the adapter's own."""
        return (await self._observe(self._ownership_for(ownership), False)).state

    async def observe_with_foreign(self, ownership: Ownership | None = None) -> Observation:
        """Like ``observe``, and also report every object inside the owned
        ranges that is not ours: a nexthop or group with an owned id and
        another protocol, a route in an owned table with another protocol or
        not through a nexthop object, a rule at an owned priority with another
        protocol.  Costs one route dump per owned table (see
        ``_routes_in_owned_tables``) instead of one."""
        return await self._observe(self._ownership_for(ownership), True)

    def _ownership_for(self, ownership: Ownership | None) -> Ownership:
        own = ownership if ownership is not None else self._ownership
        if not isinstance(own, Ownership):
            raise ValueError(f"observe needs an Ownership (given none, adapter has {own!r})")
        return own

    async def _observe(self, own: Ownership, with_foreign: bool) -> Observation:
        await self.refresh_links()
        foreign: list[ForeignObject] = []
        nexthops: set[Nexthop] = set()
        groups: set[NexthopGroup] = set()
        # The kernel rejects a nexthop dump filtered by protocol (EINVAL
        # "Invalid values in header") and has no id-range filter: dump all
        # and filter here.
        for msg in await self._nl.dump(lambda: _dump_msg(nh.nhmsg, AF_UNSPEC),
                                       nh.RTM_GETNEXTHOP, "nexthop dump"):
            if not own.owns_nexthop_id(msg.get("NHA_ID")):
                continue
            if msg["protocol"] != own.route_protocol:
                foreign.append(self._foreign_nexthop(msg))
            elif msg.get("NHA_GROUP") is not None:
                groups.add(self._group_from_msg(msg))
            else:
                nexthops.add(await self._nexthop_from_msg(msg))

        routes: set[Route] = set()
        if with_foreign:
            route_msgs = await self._routes_in_owned_tables(own)
        else:
            route_msgs = await self._routes_of_protocol(own.route_protocol)
        for msg in route_msgs:
            if not own.owns_table(_route_table(msg)):
                continue
            route = self._route_from_msg(msg)
            if route is not None and route.protocol == own.route_protocol:
                routes.add(route)
            else:
                foreign.append(self._foreign_route(msg))

        rules: set[Rule] = set()
        # A strict rule dump accepts no filter at all; rules are few anyway.
        for msg in await self._nl.dump(lambda: _dump_msg(fibmsg, AF_INET),
                                       RTM_GETRULE, "rule dump"):
            rule = self._rule_from_msg(msg)
            if not own.owns_rule_priority(rule.priority):
                continue
            if rule.protocol == own.route_protocol:
                rules.add(rule)
            else:
                foreign.append(_foreign_rule(rule, msg["action"]))

        state = KernelState(
            nexthops=frozenset(nexthops),
            groups=frozenset(groups),
            routes=frozenset(routes),
            rules=frozenset(rules),
        )
        return Observation(state, tuple(sorted(foreign)) if with_foreign else ())

    async def _routes_of_protocol(self, protocol: int) -> list:
        """IPv4 routes of one protocol, in every table: one dump the kernel
        filters by rtm_protocol.  Measured with 5000 foreign routes in main:
        observe() takes 4 ms, against 645 ms with a full dump parsed here.
        Callers filter again: a kernel without strict checking ignores it."""
        if self._nl.strict and self._route_filter_ok:
            try:
                return await self._nl.dump(lambda: _route_dump_msg(protocol=protocol),
                                           RTM_GETROUTE, f"route dump (proto {protocol})")
            except KernelReadError as e:
                if e.errno != _errno.EINVAL:
                    raise
                self._route_filter_ok = False  # refused: filter here from now on
        return await self._nl.dump(_route_dump_msg, RTM_GETROUTE, "route dump")

    async def _routes_in_owned_tables(self, own: Ownership) -> list:
        """Every IPv4 route in the owned tables, whatever its protocol: one
        dump per owned table, filtered by the kernel (RTA_TABLE; a table that
        does not exist answers ENOENT).  Measured for 100 owned tables:
        observe_with_foreign() takes 30-60 ms however many routes the host
        has; with one full dump parsed here it takes 10 ms with 50 routes but
        430 ms with 5000.  A fixed cost is the safer one for a daemon.  With
        more tables than _MAX_TABLE_DUMPS, or no strict checking, read one
        full dump."""
        n_tables = own.table_max - own.table_min + 1
        if n_tables > _MAX_TABLE_DUMPS or not (self._nl.strict and self._route_filter_ok):
            return await self._nl.dump(_route_dump_msg, RTM_GETROUTE, "route dump")
        replies: list = []
        for table in range(own.table_min, own.table_max + 1):
            replies += await self._routes_in_table(table)
            if not self._route_filter_ok:  # refused just now: read everything once
                return await self._nl.dump(_route_dump_msg, RTM_GETROUTE, "route dump")
        return replies

    async def _routes_in_table(self, table: int) -> list:
        """The routes of one table ([] when the table does not exist)."""
        if self._nl.strict and self._route_filter_ok:
            try:
                return await self._nl.dump(lambda: _route_dump_msg(table=table),
                                           RTM_GETROUTE, f"route dump of table {table}")
            except KernelReadError as e:
                if e.errno == _errno.ENOENT:  # "FIB table does not exist"
                    return []
                if e.errno != _errno.EINVAL:
                    raise
                self._route_filter_ok = False
        full = await self._nl.dump(_route_dump_msg, RTM_GETROUTE, "route dump")
        return [msg for msg in full if _route_table(msg) == table]

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
        return Route(
            table=_route_table(msg),
            dst=_route_dst(msg),
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

    def _foreign_nexthop(self, msg) -> ForeignObject:
        """Describe a nexthop or group dump message (port names from the cache)."""
        nh_id, proto = msg.get("NHA_ID"), msg["protocol"]
        members = msg.get("NHA_GROUP")
        if members is not None:
            ids = "/".join(str(i) for i in nh.group_members(members))
            text = f"nexthop group id {nh_id} members {ids} proto {_proto(proto)}"
            return ForeignObject("group", proto, text, id=nh_id)
        parts = [f"nexthop id {nh_id}"]
        if msg.get("NHA_GATEWAY"):
            parts.append(f"via {msg.get('NHA_GATEWAY')}")
        if msg.get("NHA_OIF"):
            parts.append(f"dev {self._cached_port_name(msg.get('NHA_OIF'))}")
        if msg.get("NHA_BLACKHOLE") is not None:
            parts.append("blackhole")
        parts.append(f"proto {_proto(proto)}")
        return ForeignObject("nexthop", proto, " ".join(parts), id=nh_id)

    def _foreign_route(self, msg) -> ForeignObject:
        table, dst, proto = _route_table(msg), _route_dst(msg), msg["proto"]
        parts = [f"route {dst} table {table}"]
        if msg["type"] != RTN_UNICAST:
            parts.append(f"type {rt_type.get(msg['type'], msg['type'])}")
        if msg.get("RTA_NH_ID") is not None:
            parts.append(f"nhid {msg.get('RTA_NH_ID')}")
        elif msg.get("RTA_MULTIPATH") is not None:
            parts.append("multipath")
        elif msg.get("RTA_GATEWAY"):
            parts.append(f"via {msg.get('RTA_GATEWAY')}")
        if msg.get("RTA_NH_ID") is None and msg.get("RTA_OIF"):
            parts.append(f"dev {self._cached_port_name(msg.get('RTA_OIF'))}")
        parts.append(f"proto {_proto(proto)}")
        return ForeignObject("route", proto, " ".join(parts), table=table, dst=dst)

    def _cached_port_name(self, index: int) -> str:
        return self._name_by_index.get(index, f"#{index}")

    async def _foreign_in_the_way(self, op: Op) -> ForeignObject | None:
        """After EEXIST on a CREATE: the object that holds the id or key, if
        it is not ours.  Best effort: a failed look-up returns None.  Rules
        need no look-up: the kernel's EEXIST test for rules compares the
        protocol too, so another protocol's rule never collides with ours."""
        obj = op.obj
        try:
            if isinstance(obj, (Nexthop, NexthopGroup)):
                msg = await self._get_nexthop(obj.id)
                if msg is not None and msg["protocol"] != obj.protocol:
                    return self._foreign_nexthop(msg)
            elif isinstance(obj, Route):
                for msg in await self._routes_in_table(obj.table):
                    if _route_dst(msg) == obj.dst and (
                        msg["proto"] != obj.protocol or msg.get("RTA_NH_ID") is None
                    ):
                        return self._foreign_route(msg)
        except (KernelReadError, NetlinkError, TimeoutError):
            return None
        return None

    async def _get_nexthop(self, nh_id: int):
        """The kernel's nexthop (or group) with this id, or None.  Raises
        NetlinkError (ENOENT when there is none) or TimeoutError."""
        probe = nh.nhmsg()
        probe["attrs"] = [("NHA_ID", nh_id)]
        # No NLM_F_ACK: the answer is the object or an error.  An ack would
        # come after the object, when pyroute2 has stopped listening, and
        # pile up in the socket's default queue.
        replies = await self._nl.request(probe, nh.RTM_GETNEXTHOP, NLM_F_REQUEST)
        return next((m for m in replies if m.get("NHA_ID") == nh_id), None)

    # ------------------------------------------------------------------
    # apply
    # ------------------------------------------------------------------

    async def apply(self, op: Op) -> None:
        """Send one operation and wait for the kernel's ack.

        Raises KernelOpError when the kernel (or a missing port) refuses it
        or does not answer in time (ETIMEDOUT), ValueError for an op that
        cannot be expressed (replacing a rule, an object outside
        ``ownership``: refused before any request, reads included).
        """
        obj = op.obj
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
        except KernelOpError as e:
            # A port re-created since the cache was filled (driver reload)
            # has a new ifindex, and the kernel answers the stale one with
            # EINVAL "Invalid device index": re-resolve once and resend only
            # if the index really moved.
            if e.errno not in (_errno.EINVAL, _errno.ENODEV):
                raise
            try:
                await self.refresh_links()
            except KernelReadError:
                raise e from None
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
        header), so the protocol is checked here, after apply's ownership
        guard (which refuses ids outside the owned range before this read)."""
        try:
            found = await self._get_nexthop(nh_id)
        except NetlinkError as e:
            raise KernelOpError(op, e.code, kernel_message(e)) from e
        except TimeoutError:
            raise self._timed_out(op) from None
        if found is not None and found["protocol"] != op.obj.protocol:
            raise KernelOpError(
                op,
                _errno.EPERM,
                f"a foreign object holds id {nh_id}: {self._foreign_nexthop(found)} "
                f"(protocol {found['protocol']}, not {op.obj.protocol}): not deleting",
                foreign=True,
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
        """Send one write request, count it, wait for the ack.  EEXIST on a
        CREATE is explained: a foreign object in the way is named."""
        self.writes += 1
        try:
            await self._nl.request(msg, msg_type, flags)
        except TimeoutError:
            raise self._timed_out(op) from None
        except NetlinkError as e:
            if e.code == _errno.EEXIST and op.kind is OpKind.CREATE:
                blocker = await self._foreign_in_the_way(op)
                if blocker is not None:
                    raise KernelOpError(
                        op, e.code, f"a foreign object is in the way: {blocker}", foreign=True
                    ) from e
            raise KernelOpError(op, e.code, kernel_message(e)) from e

    def _timed_out(self, op: Op) -> KernelOpError:
        return KernelOpError(
            op, _errno.ETIMEDOUT,
            f"no answer from the kernel within {self.timeout_s:g} s "
            "(the change may still have been made)",
        )


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


def _dump_msg(cls, family: int):
    msg = cls()
    msg["family"] = family
    return msg


def _route_dump_msg(protocol: int = 0, table: int | None = None):
    """An IPv4 route dump request; under strict checking the kernel returns
    only routes of ``protocol`` (0: any) in ``table`` (None: all)."""
    msg = _dump_msg(nh.rtmsg_nh, AF_INET)
    msg["proto"] = protocol
    if table is not None:
        msg["attrs"] = [("RTA_TABLE", table)]
    return msg


def _route_table(msg) -> int:
    return msg.get("RTA_TABLE") or msg["table"]


def _route_dst(msg) -> str:
    if msg["dst_len"] == 0:
        return "0.0.0.0/0"
    return f"{msg.get('RTA_DST')}/{msg['dst_len']}"


def _proto(number: int) -> str:
    name = rt_proto.get(number)
    return f"{number} ({name})" if isinstance(name, str) else str(number)


def _foreign_rule(rule: Rule, action: int) -> ForeignObject:
    parts = [f"rule priority {rule.priority} from {rule.src or 'all'}"]
    if rule.dst:
        parts.append(f"to {rule.dst}")
    if rule.ipproto is not None:
        parts.append(f"ipproto {rule.ipproto}")
    for key in ("sport", "dport"):
        if getattr(rule, key) is not None:
            parts.append(f"{key} {getattr(rule, key)}")
    parts.append(f"lookup {rule.table}" if action == FR_ACT_TO_TBL else f"action {action}")
    parts.append(f"proto {_proto(rule.protocol)}")
    return ForeignObject("rule", rule.protocol, " ".join(parts),
                         table=rule.table, priority=rule.priority)


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
