"""labs.topos.plan with several leaves per rail (issue 13's spine faults):
hosts split into groups, each group's ports on its own leaf per rail, every
leaf linked to every spine and routed so that same-rail traffic between
groups crosses a spine; one leaf per rail stays the shape it always was."""

from __future__ import annotations

import ipaddress
import re
from collections import Counter

import pytest

from labs.topos.plan import LAB_NAME_RE, FabricPlan, LabError


def test_one_leaf_per_rail_is_the_shape_it_always_was():
    plan = FabricPlan(4, 2, 2)
    assert plan.leaf_names == ["lpl0", "lpl1"]
    rail = plan.host("lph3").rail(1)
    assert (rail.leaf, rail.leaf_port, rail.address, rail.gateway) == \
        ("lpl1", "lpl1-eth2", "198.18.1.7", "198.18.1.6")
    up = next(u for u in plan.uplinks if (u.leaf, u.spine) == ("lpl1", "lps1"))
    assert (up.leaf_port, up.spine_port, up.leaf_address) == ("lpl1-eth5", "lps1-eth1", "198.19.1.3")
    assert plan.leaf_of(1) == "lpl1"
    spine = plan.setup("lps0", "linkpassd")
    assert "route add 198.18.1.0/24 via 198.19.0.3 dev lps0-eth1" in spine.ip_batch
    assert not any("hash_policy" in key for key in spine.sysctls)


@pytest.mark.parametrize("hosts,rails,per_rail", [(6, 2, 3), (8, 4, 2), (5, 2, 2), (7, 1, 7)])
def test_every_host_sits_under_one_leaf_per_rail_in_the_same_group_on_every_rail(hosts, rails, per_rail):
    plan = FabricPlan(hosts, rails, 2, leaves_per_rail=per_rail)
    assert len(plan.leaves) == rails * per_rail
    for r in range(rails):
        under = [i for leaf in plan.leaves if leaf.rail == r for i in leaf.hosts]
        assert sorted(under) == list(range(1, hosts + 1))
    sizes = [len(leaf.hosts) for leaf in plan.leaves]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    for host in plan.hosts:
        groups = {plan.leaf(rail.leaf).group for rail in host.rails}
        assert len(groups) == 1
    # names the lab's teardown recognises, unique per node; addresses unique
    ports = [(r.leaf, r.leaf_port) for h in plan.hosts for r in h.rails]
    ports += [(u.leaf, u.leaf_port) for u in plan.uplinks] + [(u.spine, u.spine_port) for u in plan.uplinks]
    assert all(LAB_NAME_RE.match(name) for _, name in ports)
    assert len(set(ports)) == len(ports)
    addresses = [r.address for h in plan.hosts for r in h.rails] + [r.gateway for h in plan.hosts for r in h.rails]
    addresses += [u.leaf_address for u in plan.uplinks] + [u.spine_address for u in plan.uplinks]
    assert len(set(addresses)) == len(addresses)
    assert Counter(u.leaf for u in plan.uplinks) == {name: 2 for name in plan.leaf_names}
    for leaf in plan.leaf_names:
        assert plan.leaf_ports(leaf)[-2:] == [u.leaf_port for u in plan.uplinks if u.leaf == leaf]


def routes(plan: FabricPlan, node: str) -> dict[str, str]:
    out = {}
    for line in plan.setup(node, "linkpassd").ip_batch:
        m = re.match(r"route add (\S+) (.*)$", line)
        if m and "table" not in line:
            out[m.group(1)] = m.group(2)
    return out


def test_same_rail_traffic_between_groups_goes_up_to_the_spines_and_down_to_the_right_leaf():
    plan = FabricPlan(6, 2, 2, leaves_per_rail=3)
    h1, h3 = plan.host("lph1").rail(0), plan.host("lph3").rail(0)
    assert (h1.leaf, h3.leaf) == ("lpl0", "lpl1")
    leaf = routes(plan, "lpl0")
    to_h3 = leaf[f"{h3.gateway}/31"]
    assert to_h3.count("nexthop via 198.19.") == 2  # ECMP over both spines
    assert f"{h1.gateway}/31" not in leaf  # its own host: the connected route
    for spine in plan.spine_names:
        down = routes(plan, spine)[f"{h3.gateway}/31"]
        up = next(u for u in plan.uplinks if (u.leaf, u.spine) == ("lpl1", spine))
        assert down == f"via {up.leaf_address} dev {up.spine_port}"
        assert plan.setup(spine, "linkpassd").sysctls["net.ipv4.fib_multipath_hash_policy"] == "1"
    assert plan.setup("lpl0", "linkpassd").sysctls["net.ipv4.fib_multipath_hash_policy"] == "1"
    # every host /31 of the rail is covered by exactly one spine route
    spine = routes(plan, "lps0")
    nets = [ipaddress.ip_network(p) for p in spine if p.startswith("198.18.0.")]
    assert sorted(nets) == sorted(ipaddress.ip_network(f"{r.gateway}/31")
                                  for h in plan.hosts for r in h.rails if r.index == 0)


def test_a_detour_lands_on_the_same_group_s_leaf_of_the_next_rail():
    plan = FabricPlan(6, 2, 2, leaves_per_rail=3)
    h3 = plan.host("lph3")
    batch = plan.setup("lps0", "linkpassd").ip_batch
    up = next(u for u in plan.uplinks if (u.leaf, u.spine) == (h3.rail(0).leaf, "lps0"))
    nxt = next(u for u in plan.uplinks if (u.leaf, u.spine) == (h3.rail(1).leaf, "lps0"))
    table = 2000 + up.leaf_index
    assert f"rule add pref {table} iif {up.spine_port} to {h3.rail(0).gateway}/31 lookup {table}" in batch
    assert f"route add {h3.rail(0).gateway}/31 via {nxt.leaf_address} dev {nxt.spine_port} table {table}" in batch
    # the next rail's leaf delivers it over the host's own port there, only for its own hosts
    leaf = plan.setup(h3.rail(1).leaf, "linkpassd").ip_batch
    assert (f"route add {h3.rail(0).address}/32 via {h3.rail(1).address} dev {h3.rail(1).leaf_port} "
            "table 2000") in leaf
    assert not any(f"{plan.host('lph1').rail(0).address}/32" in line for line in leaf)


def test_bad_shapes_are_refused_naming_the_option():
    with pytest.raises(LabError, match="leaves_per_rail must be an integer in 1..hosts"):
        FabricPlan(4, 2, 2, leaves_per_rail=5)
    with pytest.raises(LabError, match="leaves_per_rail must be an integer"):
        FabricPlan(4, 2, 2, leaves_per_rail=0)
    with pytest.raises(LabError, match="rails x leaves_per_rail must be <= 128"):
        FabricPlan(100, 65, 1, leaves_per_rail=2)
    with pytest.raises(LabError, match="rail 0 has 2 leaves \\(lpl0, lpl1\\): name one"):
        FabricPlan(4, 2, 2, leaves_per_rail=2).leaf_of(0)
