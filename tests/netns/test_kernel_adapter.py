"""KernelAdapter against the real kernel, in throw-away namespaces.

Each test writes through the adapter, reads back through observe(), and
checks with ``ip -j`` (an independent netlink implementation) that the
kernel holds what was written.
"""

from __future__ import annotations

import asyncio
import errno

import pytest
from labs.netnslib import HostLab, run, run_ip, wait_for, wait_for_sync

from linkpassd.adapters import nhmsg
from linkpassd.adapters.kernel import KernelAdapter, KernelOpError
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
            raw = {
                m.get("RTA_DST"): m
                async for m in await ipr.route("dump", table=10100)
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

            # The kernel deletes a nexthop by id alone; the adapter checks the
            # protocol first and refuses to delete another protocol's object.
            foreign = Nexthop(id=NH_C, gateway="198.18.1.1", port="lprail1", protocol=PROTO)
            with pytest.raises(KernelOpError) as info:
                await kernel.apply(delete(foreign))
            assert info.value.errno == errno.EPERM
            # With an ownership guard, out-of-range objects never reach netlink.
            guarded = KernelAdapter(ipr, ownership=OWN)
            with pytest.raises(ValueError):
                await guarded.apply(delete(Nexthop(id=2000000, gateway="198.18.0.1",
                                                   port="lprail0", protocol=PROTO)))
            assert guarded.writes == 0

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


def test_teardown_leaves_no_namespace(netns_factory):
    """The factory deletes exactly what it created, by name."""
    ns = netns_factory("z")
    assert ns.name.startswith("lp-z")
    assert len(ns.name) <= 32
    assert netns_factory.cleanup() == []
    assert ns.name not in run_ip("netns", "list").stdout
