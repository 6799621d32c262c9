"""The scenario lab's stand-in peers (labs/scenario.py, ScenarioLab(stand_in=)):
which echo peers each host rail gets, and what the option refuses. Pure: no
lab is started."""

from __future__ import annotations

import pytest

from labs.scenario import STAND_IN_PEER, ScenarioLab


def test_every_rail_probes_the_other_host_and_its_stand_in():
    lab = ScenarioLab("linkpassd", stand_in=True).lab
    for host, other in (("lph1", "lph2"), ("lph2", "lph1")):
        assert lab.echo_peers(host) == {
            r: [lab.rail(other, r).address, STAND_IN_PEER.format(rail=r)] for r in (0, 1)}
    # without it: the other host alone (one peer per rail)
    assert ScenarioLab("linkpassd").lab.echo_peers("lph1") == {
        r: [ScenarioLab("linkpassd").lab.rail("lph2", r).address] for r in (0, 1)}


def test_the_stand_in_is_no_address_of_the_lab():
    lab = ScenarioLab("linkpassd", stand_in=True).lab
    used = {a for h in lab.hosts for rail in h.rails for a in (rail.address, rail.gateway)}
    assert not used & {STAND_IN_PEER.format(rail=r) for r in (0, 1)}


@pytest.mark.parametrize("mechanism, kw", [("frr-bgp", {}), ("kernel", {}),
                                           ("linkpassd", {"aggregator": True})])
def test_stand_ins_need_linkpassd_with_configured_peers(mechanism, kw):
    with pytest.raises(ValueError, match="stand-in peers"):
        ScenarioLab(mechanism, stand_in=True, **kw)
