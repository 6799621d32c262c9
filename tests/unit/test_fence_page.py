"""A fenced port on the fleet page and in `linkpassctl fleet`: the host's
overlay (core.fence) sets the port's phase, the agent reports it, the grid
(fleet/grid.py) reads it, and both views mark the cell."""

from __future__ import annotations

from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd.adapters.control_convert import port_state_to_proto
from linkpassd.core import fence
from linkpassd.core.model import PortState, Verdict
from linkpassd.ctl.fleet import render_grid
from linkpassd.fleet import grid
from test_web import NOW, Dom, page, ts


def reported(states: dict[str, PortState]) -> pb.HostView:
    rails = [pb.RailInventory(rail=f"rail{i}", port=p) for i, p in enumerate(states)]
    return pb.HostView(host_id="h1", connected=True, last_seen=ts(NOW - 5), rails=rails,
                       report=pb.PortReport(ports=[port_state_to_proto(s) for s in states.values()],
                                            rail_paths={"rail0": "rail1", "rail1": "rail1",
                                                        "rail2": "rail2"}))


def host_with(state0: fence.State) -> pb.HostView:
    states = {p: PortState(p, Verdict.UP, True, "UP", NOW - 100) for p in ("eth0", "eth1", "eth2")}
    held = fence.overlay(states, {"eth0": fence.Fence("eth0", state0, reason="DOWN with carrier")})
    return reported(held)


def test_the_overlay_phase_is_what_the_grid_reads():
    for state, want in ((fence.State.FENCED, "FENCED"), (fence.State.TESTING, "TESTING"),
                        (fence.State.CONFIRMING, ""), (fence.State.LIFTED, "")):
        g = grid.build(pb.ListHostsResponse(hosts=[host_with(state)]))
        assert g.cell("h1", "rail0").fence == want, state
        assert g.cell("h1", "rail1").fence == ""


def test_the_page_marks_a_fenced_cell_and_lists_it_as_a_problem():
    dom = Dom(page([host_with(fence.State.FENCED)]))
    cells = dom.cells()
    c0 = cells[("h1", "rail0")]
    assert c0["data-fence"] == "FENCED" and "fenced" in c0["class"].split()
    assert c0["data-verdict"] == "DOWN" and "taken down by its host" in c0["title"]
    assert cells[("h1", "rail1")]["data-fence"] == ""
    text = "".join(dom.text)
    assert "DOWN fenced" in text
    assert ".fenced{outline" in text
    testing = Dom(page([host_with(fence.State.TESTING)])).cells()[("h1", "rail0")]
    assert testing["data-fence"] == "TESTING" and "up for a test" in testing["title"]


def test_linkpassctl_fleet_shows_the_fence():
    out = render_grid(pb.ListHostsResponse(served_at=ts(NOW), hosts=[host_with(fence.State.FENCED)]))
    lines = out.splitlines()
    row = next(line for line in lines if line.startswith("h1 "))
    assert "FNC*" in row.split()
    assert any(line.split()[:5] == ["h1", "rail0", "eth0", "DOWN", "fenced"] for line in lines)
    assert "1 fenced" in lines[-1]
