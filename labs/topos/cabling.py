"""The cabling plan of a railopt lab, as the validation's ``cabling`` file.

A lab is built from a FabricPlan, so its cabling plan is known exactly: host
``lph<i>`` port ``lph<i>-eth<r>`` goes to its leaf's port on ``rail<r>``
(with one leaf per rail leaf ``lpl<r>`` port ``lpl<r>-eth<i-1>``; with
several, the leaf of its group, see labs/topos/plan.py). ``cabling_toml`` renders it in the format
of linkpassd/validate/plan.py (one ``[[port]]`` table per host port)::

    [[port]]
    host = "lph1"
    port = "lph1-eth0"
    switch = "lpl0"
    switch_port = "lpl0-eth0"
    rail = "rail0"
    speed_mbps = 10000

Speed: a veth reports 10000 Mb/s to ``ethtool`` (checked on this machine's
6.18 kernel; tests/labs/test_lab_lldp.py asserts it on a live lab), so the
plan says 10000. ``speed_mbps=0`` writes "unchecked" instead.

Two ways to make the plan and the wiring disagree, for the miswire test:
``swapped_plan`` keeps the lab and writes a plan whose two entries trade
switch ports (validation must report both ports), or keep the plan and
inject labs.faults.Miswire, which re-patches the two cables at the leaves:
LLDP on host port rail-a then names leaf b's port and vice versa, exactly
``lldp_after_miswire``.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from labs.topos.plan import FabricPlan, LabError, _toml

VETH_SPEED_MBPS = 10_000  # ethtool on a lab veth: "Speed: 10000Mb/s"


@dataclass(frozen=True)
class CableEntry:
    """One ``[[port]]`` of the cabling file."""

    host: str
    port: str
    switch: str
    switch_port: str
    rail: str
    speed_mbps: int


def cabling_entries(plan: FabricPlan, speed_mbps: int = VETH_SPEED_MBPS) -> list[CableEntry]:
    """Every host port of the lab, hosts then rails in order."""
    if not isinstance(speed_mbps, int) or isinstance(speed_mbps, bool) or speed_mbps < 0:
        raise LabError(f"speed_mbps must be a non-negative integer, got {speed_mbps!r}")
    return [CableEntry(host.name, rail.port, rail.leaf, rail.leaf_port, rail.name, speed_mbps)
            for host in plan.hosts for rail in host.rails]


def cabling_toml(entries: list[CableEntry], *, comment: str | None = None) -> str:
    out = [f"# {line}" for line in (comment or "").splitlines()]
    for entry in entries:
        out += ["", "[[port]]"]
        out += [f"{key} = {_toml(value)}" for key, value in asdict(entry).items()]
    return "\n".join(out).lstrip("\n") + "\n"


def write_cabling(plan: FabricPlan, path: str | os.PathLike[str], *,
                  speed_mbps: int = VETH_SPEED_MBPS,
                  entries: list[CableEntry] | None = None) -> Path:
    """Write the plan's cabling file (or ``entries``, e.g. a swapped_plan)."""
    entries = cabling_entries(plan, speed_mbps) if entries is None else entries
    leaves = f"{plan.leaves_per_rail} leaves per rail" if plan.leaves_per_rail > 1 else "a leaf per rail"
    shape = f"railopt lab: {plan.n_hosts} hosts x {plan.n_rails} rails, {plan.n_spines} spines, {leaves}"
    target = Path(path)
    target.write_text(cabling_toml(entries, comment=shape))
    return target


def swapped_plan(entries: list[CableEntry], host: str, port_a: str,
                 port_b: str) -> list[CableEntry]:
    """A deliberately wrong plan: ``host``'s ports ``port_a`` and ``port_b``
    trade their switch, switch port and rail; everything else is kept."""
    index = {(e.host, e.port): k for k, e in enumerate(entries)}
    try:
        ka, kb = index[(host, port_a)], index[(host, port_b)]
    except KeyError as exc:
        raise LabError(f"no entry for {exc.args[0]} in the plan") from None
    if ka == kb:
        raise LabError(f"swapping {port_a} with itself changes nothing")
    out = list(entries)
    a, b = entries[ka], entries[kb]
    out[ka] = replace(a, switch=b.switch, switch_port=b.switch_port, rail=b.rail)
    out[kb] = replace(b, switch=a.switch, switch_port=a.switch_port, rail=a.rail)
    return out


def expected_lldp(entries: list[CableEntry]) -> dict[tuple[str, str], tuple[str, str]]:
    """{(host, port): (switch, switch_port)}: what LLDP on each host port
    shows when the wiring matches these entries."""
    return {(e.host, e.port): (e.switch, e.switch_port) for e in entries}


def lldp_after_miswire(plan: FabricPlan, host: str, rail_a: int,
                       rail_b: int) -> dict[tuple[str, str], tuple[str, str]]:
    """What LLDP shows on every host port after labs.faults.Miswire(lab,
    host, rail_a, rail_b): the two ports see each other's planned leaf port."""
    want = expected_lldp(cabling_entries(plan))
    a, b = plan.host(host).rail(rail_a), plan.host(host).rail(rail_b)
    want[(host, a.port)], want[(host, b.port)] = (b.leaf, b.leaf_port), (a.leaf, a.leaf_port)
    return want
