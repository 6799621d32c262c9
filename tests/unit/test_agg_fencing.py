"""The aggregator's fence grants (aggregator/fencing.py): the cap per leaf
across hosts, pure and through the agents' streams."""

from __future__ import annotations

from pathlib import Path

import pytest

from agg_tls import channel, make_pki, serving, tls_settings
from linkpassd._proto.linkpass.v1 import control_pb2 as cpb
from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd.aggregator.fencing import grants
from linkpassd.aggregator.store import FencePort
from test_agg_server import Agent, run


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("agg-fence-pki"))


def seen(host, port, leaf, phase):
    return FencePort(host, port, leaf, phase)


def test_a_blackholed_leaf_gets_no_more_fences_than_the_cap():
    asking = [seen(f"h{i}", "eth1", "L1", "FENCE_ASKING") for i in range(1, 9)]
    assert grants(asking, 1) == {"h1": frozenset({"eth1"})}
    assert grants(asking, 3) == {f"h{i}": frozenset({"eth1"}) for i in (1, 2, 3)}
    assert grants(asking, 0) == {}


def test_held_ports_count_first_and_stay_granted():
    ports = [seen("h5", "eth1", "L1", "FENCE_TESTING"), seen("h1", "eth1", "L1", "FENCE_ASKING"),
             seen("h2", "eth2", "L2", "FENCE_ASKING")]
    # L1's one slot is h5's (held, even though h1 sorts first); L2 is its own leaf
    assert grants(ports, 1) == {"h5": frozenset({"eth1"}), "h2": frozenset({"eth2"})}
    # over the cap already (a lowered cap): nothing new, the held stay
    over = [seen("h1", "eth1", "L1", "FENCE_FENCED"), seen("h2", "eth1", "L1", "FENCE_FENCED"),
            seen("h3", "eth1", "L1", "FENCE_ASKING")]
    assert grants(over, 1) == {"h1": frozenset({"eth1"}), "h2": frozenset({"eth1"})}


def test_a_grant_stays_with_its_port_while_it_asks():
    """hb asked first and was granted; ha's ask comes before hb's report says
    FENCED (hb may have fenced already): hb keeps the slot, though ha sorts
    first (the netns leaf test fenced both before this)."""
    first = grants([seen("hb", "eth1", "L1", "FENCE_ASKING")], 1)
    assert first == {"hb": frozenset({"eth1"})}
    both = [seen("ha", "eth1", "L1", "FENCE_ASKING"), seen("hb", "eth1", "L1", "FENCE_ASKING")]
    assert grants(both, 1, frozenset({("hb", "eth1")})) == {"hb": frozenset({"eth1"})}
    assert grants(both, 1) == {"ha": frozenset({"eth1"})}  # without the memory: the old bug


def test_a_port_without_a_leaf_is_never_granted():
    assert grants([seen("h1", "eth1", "", "FENCE_ASKING")], 5) == {}


def report(phase: str) -> pb.ConnectRequest:
    return pb.ConnectRequest(ports=pb.PortReport(ports=[
        cpb.PortState(port="eth1", verdict=cpb.VERDICT_DOWN, phase=phase)]))


def inventory(address: str, leaf: str) -> pb.ConnectRequest:
    return pb.ConnectRequest(inventory=pb.Inventory(rails=[
        pb.RailInventory(rail="rail0", port="eth1", address=address, leaf=leaf)]))


def test_grants_go_down_the_streams_under_the_leaf_cap(pki: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(tls_settings(pki, tmp_path / "fleet.db")) as server:
            async with (channel(server.port, pki, "h1") as c1, channel(server.port, pki, "h2") as c2,
                        channel(server.port, pki, "h3") as c3):
                agents = {}
                for n, (host, ch) in enumerate((("h1", c1), ("h2", c2), ("h3", c3)), start=1):
                    agents[host] = Agent(ch)
                    await agents[host].connect(host)
                    await agents[host].send(inventory(f"198.18.0.{n}/24", "L1"))

                async def granted(host: str) -> list[str]:
                    got = (await agents[host].read_kind("fence")).fence
                    assert got.leaf_cap == 1
                    return list(got.ports)

                # every host's rail on leaf L1 asks at once: one grant, to whichever
                # ask the aggregator read first (the streams race; the grant stays
                # with its port while it asks, so no later ask takes it over)
                for host in agents:
                    await agents[host].send(report("FENCE_ASKING"))
                told = {h: await granted(h) for h in agents}
                holders = [h for h, ports in told.items() if ports]
                assert len(holders) == 1, told
                first = holders[0]
                assert told[first] == ["eth1"]
                # it fences; then its fence ends: the slot goes to the next asker
                # (the first of the others by name)
                await agents[first].send(report("FENCE_FENCED"))
                await agents[first].send(report("UP"))
                assert await granted(first) == []
                after = min(set(agents) - {first})
                assert await granted(after) == ["eth1"]
                for agent in agents.values():
                    agent.call.cancel()

    run(scenario())
