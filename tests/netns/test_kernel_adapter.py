"""KernelAdapter against the real kernel, in throw-away namespaces.

Each test writes through the adapter, reads back through observe(), and
checks with ``ip -j`` (an independent netlink implementation) that the
kernel holds what was written.
"""

from __future__ import annotations

import asyncio
import errno
import threading
import time

import pytest

from labs.netnslib import HostLab, run, run_ip, wait_for, wait_for_sync
from linkpassd.adapters import nhmsg
from linkpassd.adapters.kernel import (
    DumpInterrupted,
    KernelAdapter,
    KernelOpError,
    KernelReadError,
    KernelReadTimeout,
)
from linkpassd.core.model import (
    KernelState,
    Nexthop,
    NexthopGroup,
    Op,
    OpKind,
    Ownership,
    Route,
    Rule,
)

pytestmark = pytest.mark.netns

OWN = Ownership()  # proto 201, tables/priorities 10100-10199, ids 1000100-1000199
PROTO = OWN.route_protocol
NH_A, NH_B, NH_C, GRP = 1_000_100, 1_000_101, 1_000_102, 1_000_150


def create(obj):
    return Op(OpKind.CREATE, obj)


def replace(obj):
    return Op(OpKind.REPLACE, obj)


def delete(obj):
    return Op(OpKind.DELETE, obj)


def nh_on(lab: HostLab, nh_id: int, rail: int) -> Nexthop:
    r = lab.rails[rail]
    return Nexthop(id=nh_id, gateway=r.gateway, port=r.port, protocol=PROTO)


def ip_nexthops(lab: HostLab) -> dict[int, dict]:
    return {nh["id"]: nh for nh in lab.host.ipj("nexthop", "show")}


def ip_routes(lab: HostLab, table: int) -> dict[str, dict]:
    return {r["dst"]: r for r in lab.host.ipj("route", "show", "table", str(table))}


def ip_rules(lab: HostLab) -> dict[int, dict]:
    return {r["priority"]: r for r in lab.host.ipj("rule", "show")}


# ---------------------------------------------------------------------------


def test_nexthop_create_replace_delete(lab: HostLab):
    async def scenario():
        async with lab.host.iproute() as ipr:
            kernel = KernelAdapter(ipr)
            a = nh_on(lab, NH_A, 0)
            await kernel.apply(create(a))
            assert (await kernel.observe(OWN)).nexthops == {a}
            seen = ip_nexthops(lab)[NH_A]
            assert (seen["gateway"], seen["dev"], str(seen["protocol"])) == (
                "198.18.0.1", "lprail0", "201",
            )

            # new gateway on the same port
            a2 = Nexthop(id=NH_A, gateway="198.18.0.3", port="lprail0", protocol=PROTO)
            await kernel.apply(replace(a2))
            assert (await kernel.observe(OWN)).nexthops == {a2}
            assert ip_nexthops(lab)[NH_A]["gateway"] == "198.18.0.3"

            # move it to the other rail
            a3 = nh_on(lab, NH_A, 1)
            await kernel.apply(replace(a3))
            assert (await kernel.observe(OWN)).nexthops == {a3}
            seen = ip_nexthops(lab)[NH_A]
            assert (seen["gateway"], seen["dev"]) == ("198.18.1.1", "lprail1")

            await kernel.apply(delete(a3))
            assert (await kernel.observe(OWN)).nexthops == frozenset()
            assert NH_A not in ip_nexthops(lab)
            assert kernel.writes == 4

    run(scenario())


def test_resilient_group_round_trip(lab: HostLab):
    async def scenario():
        async with lab.host.iproute() as ipr:
            kernel = KernelAdapter(ipr)
            a, b = nh_on(lab, NH_A, 0), nh_on(lab, NH_B, 1)
            c = Nexthop(id=NH_C, gateway="198.18.1.3", port="lprail1", protocol=PROTO)
            for n in (a, b, c):
                await kernel.apply(create(n))
            group = NexthopGroup(
                id=GRP, members=(NH_A, NH_B), protocol=PROTO,
                resilient=True, buckets=32, idle_timer_s=3, unbalanced_timer_s=7,
            )
            await kernel.apply(create(group))
            state = await kernel.observe(OWN)
            assert state.groups == {group}
            assert state.nexthops == {a, b, c}

            seen = ip_nexthops(lab)[GRP]
            assert seen["type"] == "resilient"
            assert sorted(m["id"] for m in seen["group"]) == [NH_A, NH_B]
            args = seen["resilient_args"]
            assert (args["buckets"], args["idle_timer"], args["unbalanced_timer"]) == (32, 3, 7)

            # replace the members in place (same bucket count)
            swapped = NexthopGroup(
                id=GRP, members=(NH_A, NH_C), protocol=PROTO,
                resilient=True, buckets=32, idle_timer_s=5, unbalanced_timer_s=0,
            )
            await kernel.apply(replace(swapped))
            assert (await kernel.observe(OWN)).groups == {swapped}
            seen = ip_nexthops(lab)[GRP]
            assert sorted(m["id"] for m in seen["group"]) == [NH_A, NH_C]
            assert seen["resilient_args"]["idle_timer"] == 5

            # Kernel rule: a resilient group's bucket count is fixed at
            # creation, and a group cannot change type; both need a new group.
            with pytest.raises(KernelOpError) as info:
                await kernel.apply(replace(
                    NexthopGroup(id=GRP, members=(NH_A, NH_C), protocol=PROTO, buckets=64)
                ))
            assert "buckets" in info.value.message
            with pytest.raises(KernelOpError):
                await kernel.apply(replace(
                    NexthopGroup(id=GRP, members=(NH_A, NH_C), protocol=PROTO, resilient=False)
                ))
            assert (await kernel.observe(OWN)).groups == {swapped}

            await kernel.apply(delete(swapped))
            state = await kernel.observe(OWN)
            assert state.groups == frozenset()
            assert state.nexthops == {a, b, c}  # members survive their group
            assert GRP not in ip_nexthops(lab)

    run(scenario())


def test_mpath_group_reports_model_defaults(lab: HostLab):
    async def scenario():
        async with lab.host.iproute() as ipr:
            kernel = KernelAdapter(ipr)
            await kernel.apply(create(nh_on(lab, NH_A, 0)))
            await kernel.apply(create(nh_on(lab, NH_B, 1)))
            group = NexthopGroup(id=GRP, members=(NH_B, NH_A), protocol=PROTO, resilient=False)
            await kernel.apply(create(group))
            (seen,) = (await kernel.observe(OWN)).groups
            # members come back sorted; resilient-only fields as model defaults
            assert seen == NexthopGroup(id=GRP, members=(NH_A, NH_B), protocol=PROTO, resilient=False)
            seen = ip_nexthops(lab)[GRP]
            assert "type" not in seen and "resilient_args" not in seen  # hash-threshold
            assert sorted(m["id"] for m in seen["group"]) == [NH_A, NH_B]

    run(scenario())


def test_route_with_nhid_create_replace_delete(lab: HostLab):
    async def scenario():
        async with lab.host.iproute() as ipr:
            kernel = KernelAdapter(ipr)
            a, b = nh_on(lab, NH_A, 0), nh_on(lab, NH_B, 1)
            group = NexthopGroup(id=GRP, members=(NH_A, NH_B), protocol=PROTO)
            for obj in (a, b, group):
                await kernel.apply(create(obj))

            default = Route(table=10100, dst="0.0.0.0/0", nhid=NH_A, protocol=PROTO,
                            prefsrc="198.18.0.2")
            spread = Route(table=10100, dst="198.19.0.0/24", nhid=GRP, protocol=PROTO)
            await kernel.apply(create(default))
            await kernel.apply(create(spread))
            assert (await kernel.observe(OWN)).routes == {default, spread}

            seen = ip_routes(lab, 10100)
            assert set(seen) == {"default", "198.19.0.0/24"}
            assert (seen["default"]["nhid"], seen["default"]["prefsrc"]) == (NH_A, "198.18.0.2")
            assert str(seen["default"]["protocol"]) == "201"
            assert seen["198.19.0.0/24"]["nhid"] == GRP

            # Compat mode (net.ipv4.nexthop_compat_mode=1, the default): a
            # route through a group is also dumped with RTA_MULTIPATH, one
            # entry per member; a route through one nexthop with
            # RTA_GATEWAY/RTA_OIF.  observe() reads only RTA_NH_ID.
            assert lab.host.sysctl("net.ipv4.nexthop_compat_mode") == "1"
            # A socket of its own: under the adapter's strict checking,
            # pyroute2's route("dump") (table 254 in its header) sees only main.
            async with lab.host.iproute() as plain:
                nhmsg.register(plain)
                raw = {
                    m.get("RTA_DST"): m
                    async for m in await plain.route("dump", table=10100)
                }
            assert raw["198.19.0.0"].get("RTA_NH_ID") == GRP
            hops = raw["198.19.0.0"].get("RTA_MULTIPATH")
            assert sorted(h.get("RTA_GATEWAY") for h in hops) == ["198.18.0.1", "198.18.1.1"]
            assert raw[None].get("RTA_GATEWAY") == "198.18.0.1"

            moved = Route(table=10100, dst="0.0.0.0/0", nhid=NH_B, protocol=PROTO)
            await kernel.apply(replace(moved))
            assert (await kernel.observe(OWN)).routes == {moved, spread}
            seen = ip_routes(lab, 10100)
            assert seen["default"]["nhid"] == NH_B and "prefsrc" not in seen["default"]
            assert len(seen) == 2  # replaced in place, not appended

            await kernel.apply(delete(moved))
            await kernel.apply(delete(spread))
            assert (await kernel.observe(OWN)).routes == frozenset()
            assert ip_routes(lab, 10100) == {}
            assert kernel.writes == 3 + 2 + 1 + 2

    run(scenario())


def test_rules_create_delete(lab: HostLab):
    async def scenario():
        async with lab.host.iproute() as ipr:
            kernel = KernelAdapter(ipr)
            by_src = Rule(priority=10100, table=10100, protocol=PROTO, src="198.18.0.2/32")
            roce = Rule(priority=10101, table=10101, protocol=PROTO, ipproto=17, dport=4791)
            by_dst = Rule(priority=10102, table=10102, protocol=PROTO, dst="198.19.0.0/16")
            rail_roce = Rule(priority=10103, table=10100, protocol=PROTO, src="198.18.0.2/32",
                             ipproto=17, dport=4791)
            echo_reply = Rule(priority=10104, table=10101, protocol=PROTO, src="198.18.0.2/32",
                              ipproto=17, sport=4793)
            rules = (by_src, roce, by_dst, rail_roce, echo_reply)
            for rule in rules:
                await kernel.apply(create(rule))
            assert (await kernel.observe(OWN)).rules == set(rules)

            seen = ip_rules(lab)
            assert (seen[10100]["src"], seen[10100]["table"], str(seen[10100]["protocol"])) == (
                "198.18.0.2", "10100", "201",
            )
            assert (seen[10101]["ipproto"], seen[10101]["dport"], seen[10101]["table"]) == (
                "udp", 4791, "10101",
            )
            assert (seen[10102]["dst"], seen[10102]["dstlen"]) == ("198.19.0.0", 16)
            r = seen[10103]
            assert (r["src"], r["ipproto"], r["dport"], r["table"]) == (
                "198.18.0.2", "udp", 4791, "10100",
            )
            r = seen[10104]
            assert (r["ipproto"], r["sport"], r["table"]) == ("udp", 4793, "10101")
            assert "dport" not in r

            # the same rule twice is refused (NLM_F_EXCL), not duplicated
            with pytest.raises(KernelOpError) as info:
                await kernel.apply(create(roce))
            assert info.value.errno == errno.EEXIST
            # rules have no in-place replace
            writes = kernel.writes
            with pytest.raises(ValueError):
                await kernel.apply(replace(roce))
            # a /0 selector would not round-trip (the kernel drops it)
            with pytest.raises(ValueError):
                await kernel.apply(create(Rule(priority=10104, table=10100, protocol=PROTO,
                                               dst="0.0.0.0/0")))
            assert kernel.writes == writes

            # delete matches on every field: deleting roce leaves rail_roce
            await kernel.apply(delete(roce))
            assert (await kernel.observe(OWN)).rules == {by_src, by_dst, rail_roce, echo_reply}
            for rule in (by_src, by_dst, rail_roce, echo_reply):
                await kernel.apply(delete(rule))
            assert (await kernel.observe(OWN)).rules == frozenset()
            assert not {10100, 10101, 10102, 10103, 10104} & set(ip_rules(lab))

    run(scenario())


def test_foreign_objects_are_not_observed_and_survive(lab: HostLab):
    h = lab.host
    # foreign, written by someone else with ip(8)
    h.ip("nexthop", "add", "id", "2000000", "via", "198.18.0.1", "dev", "lprail0", "proto", "201")
    h.ip("nexthop", "add", "id", str(NH_C), "via", "198.18.1.1", "dev", "lprail1", "proto", "static")
    h.ip("nexthop", "add", "id", "1000160", "group", f"2000000/{NH_C}", "proto", "static")
    h.ip("route", "add", "198.19.1.0/24", "nhid", "2000000", "table", "10100", "proto", "static")
    h.ip("route", "add", "198.19.2.0/24", "nhid", "2000000", "table", "200", "proto", "201")
    h.ip("route", "add", "198.19.3.0/24", "via", "198.18.0.1", "table", "10100", "proto", "201")
    h.ip("rule", "add", "priority", "20000", "from", "198.18.0.2", "lookup", "10100", "proto", "201")
    h.ip("rule", "add", "priority", "10150", "from", "198.18.1.2", "lookup", "10100", "proto", "static")

    async def scenario():
        async with h.iproute() as ipr:
            kernel = KernelAdapter(ipr)
            a = nh_on(lab, NH_A, 0)
            route = Route(table=10100, dst="198.19.0.0/24", nhid=NH_A, protocol=PROTO)
            rule = Rule(priority=10100, table=10100, protocol=PROTO, src="198.18.0.2/32")
            for obj in (a, route, rule):
                await kernel.apply(create(obj))

            state = await kernel.observe(OWN)
            assert state == KernelState(
                nexthops=frozenset({a}), routes=frozenset({route}), rules=frozenset({rule})
            )

            # Everything inside the owned ranges that is not ours is reported;
            # what lies outside them (id 2000000, table 200, priority 20000) is not.
            seen = await kernel.observe_with_foreign(OWN)
            assert seen.state == state
            assert [(f.kind, f.protocol, f.id, f.table, f.priority, f.dst)
                    for f in seen.foreign] == [
                ("group", 4, 1000160, None, None, None),
                ("nexthop", 4, NH_C, None, None, None),
                ("route", 4, None, 10100, None, "198.19.1.0/24"),
                ("route", PROTO, None, 10100, None, "198.19.3.0/24"),
                ("rule", 4, None, 10100, 10150, None),
            ]
            assert [str(f) for f in seen.foreign] == [
                f"nexthop group id 1000160 members {NH_C}/2000000 proto 4 (static)",
                f"nexthop id {NH_C} via 198.18.1.1 dev lprail1 proto 4 (static)",
                "route 198.19.1.0/24 table 10100 nhid 2000000 proto 4 (static)",
                "route 198.19.3.0/24 table 10100 via 198.18.0.1 dev lprail0 proto 201",
                "rule priority 10150 from 198.18.1.2/32 lookup 10100 proto 4 (static)",
            ]

            # The kernel deletes a nexthop by id alone; the adapter checks the
            # protocol first and refuses to delete another protocol's object.
            foreign = Nexthop(id=NH_C, gateway="198.18.1.1", port="lprail1", protocol=PROTO)
            with pytest.raises(KernelOpError) as info:
                await kernel.apply(delete(foreign))
            assert info.value.errno == errno.EPERM and info.value.foreign
            assert f"nexthop id {NH_C} via 198.18.1.1" in info.value.message
            # With an ownership guard, out-of-range objects never reach netlink:
            # not the delete, not even the protocol check's read before it.
            guarded = KernelAdapter(ipr, ownership=OWN)
            with pytest.raises(ValueError):
                await guarded.apply(delete(Nexthop(id=2000000, gateway="198.18.0.1",
                                                   port="lprail0", protocol=PROTO)))
            assert (guarded.writes, guarded.requests) == (0, 0)

            for obj in (rule, route, a):
                await kernel.apply(delete(obj))
            assert await kernel.observe(OWN) == KernelState()

    run(scenario())

    # every foreign object is still there
    nhs = ip_nexthops(lab)
    assert {2000000, NH_C, 1000160} <= set(nhs)
    assert str(nhs[NH_C]["protocol"]) == "static"
    assert set(ip_routes(lab, 10100)) == {"198.19.1.0/24", "198.19.3.0/24"}
    assert set(ip_routes(lab, 200)) == {"198.19.2.0/24"}
    assert {20000, 10150} <= set(ip_rules(lab))


def test_kernel_errors_name_the_op(lab: HostLab):
    async def scenario():
        async with lab.host.iproute() as ipr:
            kernel = KernelAdapter(ipr)
            await kernel.apply(create(nh_on(lab, NH_A, 0)))

            broken = NexthopGroup(id=GRP, members=(NH_A, 1_000_199), protocol=PROTO)
            with pytest.raises(KernelOpError) as info:
                await kernel.apply(create(broken))
            err = info.value
            assert err.op == create(broken)
            assert err.errno == errno.EINVAL
            text = str(err)
            assert "NexthopGroup" in text and str(GRP) in text and "1000199" in text
            assert "Invalid nexthop id" in err.message  # the kernel's own words

            with pytest.raises(KernelOpError) as info:
                await kernel.apply(create(nh_on(lab, NH_A, 0)))
            assert info.value.errno == errno.EEXIST

            writes = kernel.writes
            with pytest.raises(KernelOpError) as info:
                await kernel.apply(create(
                    Nexthop(id=NH_B, gateway="198.18.0.1", port="lpnosuch", protocol=PROTO)
                ))
            assert info.value.errno == errno.ENODEV and "lpnosuch" in str(info.value)
            assert kernel.writes == writes  # refused before anything was sent

            with pytest.raises(KernelOpError) as info:
                await kernel.apply(delete(Route(table=10100, dst="198.19.9.0/24",
                                                nhid=NH_A, protocol=PROTO)))
            assert info.value.errno == errno.ESRCH
            assert (await kernel.observe(OWN)).groups == frozenset()

    run(scenario())


def test_port_names_follow_link_changes(lab: HostLab):
    """The ifindex cache refreshes on a miss, and on ENODEV from a stale index."""
    h = lab.host

    def add_port(name: str, peer: str) -> None:
        h.ip("link", "add", name, "type", "veth", "peer", "name", peer, "netns", lab.leaf.name)
        h.ip("addr", "add", "198.18.9.2/24", "dev", name)
        lab.leaf.ip("addr", "add", "198.18.9.1/24", "dev", peer)
        h.ip("link", "set", name, "up")
        lab.leaf.ip("link", "set", peer, "up")
        wait_for_sync(lambda: h.has_carrier(name), 3.0, f"carrier on {name}")

    async def scenario():
        async with h.iproute() as ipr:
            kernel = KernelAdapter(ipr)
            await kernel.observe(OWN)  # fills the cache without lpnew0
            add_port("lpnew0", "lpnewp0")
            a = Nexthop(id=NH_A, gateway="198.18.9.1", port="lpnew0", protocol=PROTO)
            await kernel.apply(create(a))
            assert (await kernel.observe(OWN)).nexthops == {a}
            old_index = h.ipj("link", "show", "dev", "lpnew0")[0]["ifindex"]

            # re-create the port: same name, new ifindex; the cache is stale
            h.ip("link", "del", "lpnew0")
            add_port("lpnew0", "lpnewp0")
            assert h.ipj("link", "show", "dev", "lpnew0")[0]["ifindex"] != old_index
            writes = kernel.writes
            await kernel.apply(create(a))
            assert kernel.writes == writes + 2  # refused once, re-resolved, resent
            assert (await kernel.observe(OWN)).nexthops == {a}
            assert ip_nexthops(lab)[NH_A]["dev"] == "lpnew0"

    run(scenario())


def test_carrier_loss_deletes_nexthop_and_shrinks_group(lab: HostLab):
    """Documents the kernel behaviour the daemon is built around."""
    rail0 = lab.rails[0]

    async def scenario():
        async with lab.host.iproute() as ipr:
            kernel = KernelAdapter(ipr)
            a, b = nh_on(lab, NH_A, 0), nh_on(lab, NH_B, 1)
            group = NexthopGroup(id=GRP, members=(NH_A, NH_B), protocol=PROTO, buckets=16)
            pinned = Route(table=10101, dst="0.0.0.0/0", nhid=NH_A, protocol=PROTO)
            spread = Route(table=10100, dst="0.0.0.0/0", nhid=GRP, protocol=PROTO)
            for obj in (a, b, group, pinned, spread):
                await kernel.apply(create(obj))

            lab.cut(rail0)

            async def a_gone():
                state = await kernel.observe(OWN)
                return state if a not in state.nexthops else None

            # linkwatch may batch carrier events for up to ~1 s
            state = await wait_for(a_gone, 3.0, "nexthop on the cut rail to vanish")
            assert state.nexthops == {b}
            assert state.groups == {
                NexthopGroup(id=GRP, members=(NH_B,), protocol=PROTO, buckets=16)
            }
            assert state.routes == {spread}  # the route pinned to NH_A went too
            assert sorted(m["id"] for m in ip_nexthops(lab)[GRP]["group"]) == [NH_B]

            # the kernel refuses a nexthop on a port without carrier
            with pytest.raises(KernelOpError) as info:
                await kernel.apply(create(a))
            assert info.value.errno == errno.ENETDOWN
            assert "Carrier" in info.value.message

            # carrier back: the kernel re-creates nothing by itself
            lab.restore(rail0)
            await wait_for(
                lambda: asyncio.to_thread(lab.host.has_carrier, rail0.port),
                3.0, "carrier on rail0",
            )
            assert a not in (await kernel.observe(OWN)).nexthops

            await kernel.apply(create(a))
            await kernel.apply(replace(group))
            await kernel.apply(create(pinned))
            assert await kernel.observe(OWN) == KernelState(
                nexthops=frozenset({a, b}), groups=frozenset({group}),
                routes=frozenset({pinned, spread}),
            )

    run(scenario())


def test_last_member_loss_removes_group_and_its_routes(lab: HostLab):
    async def scenario():
        async with lab.host.iproute() as ipr:
            kernel = KernelAdapter(ipr)
            a = nh_on(lab, NH_A, 0)
            group = NexthopGroup(id=GRP, members=(NH_A,), protocol=PROTO)
            route = Route(table=10100, dst="0.0.0.0/0", nhid=GRP, protocol=PROTO)
            for obj in (a, group, route):
                await kernel.apply(create(obj))
            lab.cut(lab.rails[0])

            async def all_gone():
                state = await kernel.observe(OWN)
                return state if state == KernelState() else None

            await wait_for(all_gone, 3.0, "group and route to vanish")
            assert GRP not in ip_nexthops(lab)
            assert ip_routes(lab, 10100) == {}

    run(scenario())


def test_nexthop_events_parse(lab: HostLab):
    """RTNLGRP_NEXTHOP multicast messages decode as nhmsg on a registered socket."""

    async def scenario():
        async with lab.host.iproute() as events, lab.host.iproute() as ipr:
            nhmsg.register(events)
            await events.bind(groups=0)
            events.add_membership(nhmsg.RTNLGRP_NEXTHOP)
            kernel = KernelAdapter(ipr)
            a = nh_on(lab, NH_A, 0)
            await kernel.apply(create(a))
            await kernel.apply(delete(a))

            seen = []

            async def collect():
                # get() on the multicast queue ends after each batch read
                while len(seen) < 2:
                    async for msg in events.get():
                        if isinstance(msg, nhmsg.nhmsg) and msg.get("NHA_ID") == NH_A:
                            seen.append((msg["event"], msg["protocol"], msg.get("NHA_GATEWAY")))

            await asyncio.wait_for(collect(), 3.0)
            assert seen == [
                ("RTM_NEWNEXTHOP", PROTO, "198.18.0.1"),
                ("RTM_DELNEXTHOP", PROTO, "198.18.0.1"),
            ]

    run(scenario())


class HeldSend:
    """Holds the next send on a netlink socket, as a kernel stuck in sendmsg
    (rtnl_lock held elsewhere) would, until released; then really sends it,
    so the kernel answers late, after the caller has given up."""

    def __init__(self, sock):
        self.sock = sock
        self.real_send = sock.send
        self.released = threading.Event()
        self.sent = threading.Event()
        self.armed = False
        sock.send = self._send  # the instance's, at the syscall boundary

    def arm(self) -> None:
        self.released.clear()
        self.sent.clear()
        self.armed = True

    def _send(self, data, *flags):
        if not self.armed:
            return self.real_send(data, *flags)
        self.armed = False
        self.released.wait(10.0)  # bounded even if the test dies first
        try:
            return self.real_send(data, *flags)
        finally:
            self.sent.set()

    async def release(self) -> None:
        """Let the held request reach the kernel; return once it has (its
        answer is then queued on the socket)."""
        self.released.set()
        assert await asyncio.to_thread(self.sent.wait, 10.0), "held send never went out"

    def restore(self) -> None:
        self.released.set()
        del self.sock.send


def test_requests_time_out_and_late_answers_reach_no_later_request(lab: HostLab):
    timeout_s = 0.5

    async def scenario():
        async with lab.host.iproute() as ipr:
            kernel = KernelAdapter(ipr, timeout_s=timeout_s)
            a, b = nh_on(lab, NH_A, 0), nh_on(lab, NH_B, 1)
            await kernel.apply(create(a))  # the socket exists from here on
            held = HeldSend(ipr.socket)
            try:
                # A write stuck in the kernel: refused in time, naming the op.
                held.arm()
                broken = NexthopGroup(id=GRP, members=(NH_A, 1_000_199), protocol=PROTO)
                started = time.monotonic()
                with pytest.raises(KernelOpError) as info:
                    await kernel.apply(create(broken))
                elapsed = time.monotonic() - started
                assert info.value.errno == errno.ETIMEDOUT and not info.value.foreign
                assert "NexthopGroup" in str(info.value) and "no answer" in str(info.value)
                assert timeout_s <= elapsed < timeout_s + 3.0
                assert kernel.timeouts == 1

                # The kernel now gets it and answers EINVAL (no member
                # 1000199) under the old sequence number; that answer must
                # not be taken for the next request's.
                await held.release()
                await kernel.apply(create(b))
                assert (await kernel.observe(OWN)).nexthops == {a, b}

                # A dump stuck the same way; its late multi-part answer must
                # not end up in the next dump either.
                held.arm()
                with pytest.raises(KernelReadTimeout) as info:
                    await kernel.observe(OWN)
                assert "link dump" in str(info.value) and "0.5 s" in str(info.value)
                assert isinstance(info.value, KernelReadError)
                await held.release()
                assert await kernel.observe(OWN) == KernelState(nexthops=frozenset({a, b}))
                assert kernel.timeouts == 2
                assert issubclass(DumpInterrupted, KernelReadError)
                # Where the late answers went: pyroute2's default queue,
                # unread; hence replace_socket for a long-running caller.
                assert ipr.msg_queue.root.qsize() >= 2
            finally:
                held.restore()
            async with lab.host.iproute() as fresh:
                assert kernel.replace_socket(fresh) is ipr
                assert await kernel.observe(OWN) == KernelState(nexthops=frozenset({a, b}))
                await kernel.apply(delete(b))
                assert fresh.msg_queue.root.qsize() == 0

    run(scenario())


def test_kernel_filtered_dumps_equal_full_dumps_filtered_here(lab: HostLab, tmp_path):
    h = lab.host
    # Foreign routes: many in main, ours-by-protocol in a table we do not
    # own, another protocol and a gateway route in owned tables.
    batch = [f"route add 198.19.{i // 250}.{i % 250 + 1}/32 via 198.18.0.1" for i in range(300)]
    batch += [
        "route add 198.19.100.0/24 via 198.18.1.1 table 200 proto 201",
        "route add 198.19.101.0/24 via 198.18.0.1 table 10100 proto static",
        "route add 198.19.102.0/24 via 198.18.0.1 table 10102 proto static",
        "route add 198.19.103.0/24 via 198.18.1.1 table 10101 proto 201",
    ]
    # not in the batch: there, iproute2 6.1 gave the rule an earlier route's proto
    h.ip("rule", "add", "priority", "10160", "from", "198.18.1.2", "lookup", "10101",
         "proto", "static")
    (tmp_path / "routes.batch").write_text("\n".join(batch) + "\n")
    h.ip("-batch", str(tmp_path / "routes.batch"))

    async def scenario():
        async with h.iproute() as ipr, h.iproute() as plain_ipr:
            kernel = KernelAdapter(ipr)
            plain = KernelAdapter(plain_ipr, strict_check=False)
            a, b = nh_on(lab, NH_A, 0), nh_on(lab, NH_B, 1)
            group = NexthopGroup(id=GRP, members=(NH_A, NH_B), protocol=PROTO)
            ours = {
                Route(table=10100, dst="0.0.0.0/0", nhid=NH_A, protocol=PROTO,
                      prefsrc="198.18.0.2"),
                Route(table=10100, dst="198.19.200.0/24", nhid=GRP, protocol=PROTO),
                Route(table=10101, dst="0.0.0.0/0", nhid=NH_B, protocol=PROTO),
            }
            rule = Rule(priority=10100, table=10100, protocol=PROTO, src="198.18.0.2/32")
            for obj in (a, b, group, *sorted(ours), rule):
                await kernel.apply(create(obj))
            h.ip("route", "add", "198.19.104.0/24", "nhid", str(NH_A), "table", "200",
                 "proto", "201")

            state = await kernel.observe(OWN)
            assert state == KernelState(nexthops=frozenset({a, b}), groups=frozenset({group}),
                                        routes=frozenset(ours), rules=frozenset({rule}))
            assert state == await plain.observe(OWN)
            filtered = await kernel.observe_with_foreign(OWN)
            assert filtered == await plain.observe_with_foreign(OWN)
            assert filtered.state == state
            assert {(f.kind, f.table, f.dst or f.priority) for f in filtered.foreign} == {
                ("route", 10100, "198.19.101.0/24"),
                ("route", 10102, "198.19.102.0/24"),
                ("route", 10101, "198.19.103.0/24"),
                ("rule", 10101, 10160),
            }

            # The kernel did the filtering: strict dumps hold only what was
            # asked for, the plain one everything.
            by_proto = await kernel._routes_of_protocol(PROTO)
            assert {m["proto"] for m in by_proto} == {PROTO}
            assert len(by_proto) == len(ours) + 3  # + 10101 via gw, table 200 x2
            in_tables = await kernel._routes_in_owned_tables(OWN)
            assert len(in_tables) == len(ours) + 3
            assert len(await plain._routes_of_protocol(PROTO)) > 300
            # pyroute2's link dump still works on the strict socket (the
            # daemon's link snapshot uses it).
            names = {m.get("ifname") async for m in await ipr.get_links()}
            assert {"lo", "lprail0", "lprail1"} <= names
            assert ipr.msg_queue.root.qsize() == 0  # no answer left over unread

    run(scenario())


def test_create_blocked_by_a_foreign_object_names_it(lab: HostLab):
    h = lab.host
    h.ip("nexthop", "add", "id", str(NH_B), "via", "198.18.1.1", "dev", "lprail1",
         "proto", "static")
    h.ip("route", "add", "198.19.5.0/24", "via", "198.18.0.1", "table", "10100",
         "proto", "static")

    async def scenario():
        async with h.iproute() as ipr:
            kernel = KernelAdapter(ipr, ownership=OWN)
            with pytest.raises(KernelOpError) as info:
                await kernel.apply(create(nh_on(lab, NH_B, 1)))
            err = info.value
            assert (err.errno, err.foreign) == (errno.EEXIST, True)
            assert "foreign object is in the way" in str(err)
            assert f"nexthop id {NH_B} via 198.18.1.1 dev lprail1 proto 4 (static)" in err.message

            a = nh_on(lab, NH_A, 0)
            await kernel.apply(create(a))
            with pytest.raises(KernelOpError) as info:
                await kernel.apply(create(Route(table=10100, dst="198.19.5.0/24", nhid=NH_A,
                                                protocol=PROTO)))
            assert (info.value.errno, info.value.foreign) == (errno.EEXIST, True)
            assert ("route 198.19.5.0/24 table 10100 via 198.18.0.1 dev lprail0 proto 4 (static)"
                    in info.value.message)

            # Our own object in the way is a stale view, not a conflict.
            with pytest.raises(KernelOpError) as info:
                await kernel.apply(create(a))
            assert (info.value.errno, info.value.foreign) == (errno.EEXIST, False)
            # the look-ups behind these answers left nothing unread behind
            assert ipr.msg_queue.root.qsize() == 0

    run(scenario())
    assert str(ip_nexthops(lab)[NH_B]["protocol"]) == "static"
    assert str(ip_routes(lab, 10100)["198.19.5.0/24"]["protocol"]) == "static"


def test_ownership_follows_a_reload_and_bad_arguments_are_named(lab: HostLab):
    async def scenario():
        async with lab.host.iproute() as ipr:
            kernel = KernelAdapter(ipr, ownership=OWN)
            a = nh_on(lab, NH_A, 0)
            await kernel.apply(create(a))
            assert await kernel.observe() == KernelState(nexthops=frozenset({a}))

            # a reload that gives up NH_A: no longer seen, no longer touched
            kernel.ownership = Ownership(nexthop_id_min=NH_B)
            requests = kernel.requests
            with pytest.raises(ValueError, match="outside"):
                await kernel.apply(delete(a))
            assert kernel.requests == requests
            assert await kernel.observe() == KernelState()
            assert NH_A in ip_nexthops(lab)

            with pytest.raises(TypeError, match="ownership"):
                kernel.ownership = "10100-10199"
            for bad in (0, -1.0, "2", True, float("nan")):
                with pytest.raises(ValueError, match="timeout_s"):
                    KernelAdapter(ipr, timeout_s=bad)
            with pytest.raises(ValueError, match="Ownership"):
                await KernelAdapter(ipr).observe()

    run(scenario())


def test_teardown_leaves_no_namespace(netns_factory):
    """The factory deletes exactly what it created, by name."""
    ns = netns_factory("z")
    assert ns.name.startswith("lp-z")
    assert len(ns.name) <= 32
    assert netns_factory.cleanup() == []
    assert ns.name not in run_ip("netns", "list").stdout
