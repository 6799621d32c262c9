"""The aggregator in a lab: the probe mesh it hands out finds a silent
blackhole, and its page shows the fault, read by a real browser.

railopt with 4 hosts x 2 rails (a leaf per rail, 2 spines), linkpassd on
every host with echo probing on and *no* probe_peers in any config, and one
linkpass-aggregator (labs.aggproc: root namespace, Unix socket, insecure lab
mode). Everything the test knows about the daemons' probe paths it reads from
the aggregator (ListHosts: each host's last PortReport), and what it knows of
the kernel it reads from the kernel (`ip route get`).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path

import pytest

from labs.browser import chromium, dump_dom, screenshot
from labs.faults import SilentBlackhole
from labs.scenario import LAB_TIMERS
from labs.topos.plan import with_section_options
from labs.topos.railopt import railopt, start_linkpassd
from linkpassd._proto.linkpass.v1 import control_pb2, fleet_pb2, fleet_pb2_grpc

pytestmark = pytest.mark.lab

HOSTS, RAILS = 4, 2
MESH_S = 60.0  # every host's paths handed out and up (generous: 4 daemons + aggregator, 2 cores)
DETECT_S = 10.0  # a blackhole found and routed around (measured well under 1 s)
PAGE_S = 30.0
RESULTS = Path(__file__).resolve().parents[2] / "labs" / "bench" / "results"


def needs_lab() -> None:
    if os.geteuid() != 0 or shutil.which("mnexec") is None:
        pytest.skip("needs root and mnexec (apt-get install mininet)")


# Echo probes with the defaults (docs/probing.md): on this 2-core VM with four
# daemons, the aggregator and a browser, the contract must hold as it is.
FLEET_PROBES = {"interval_ms": 50}


@contextmanager
def fleet(sections: dict[str, dict] | None = None):
    """The fleet lab with every daemon started; `sections`: linkpassd config
    sections to set in every host's config first (e.g. ``{"fence": {...}}``)."""
    needs_lab()
    with railopt(HOSTS, RAILS, 2, "linkpassd", linkpassd_timers=LAB_TIMERS,
                 probes=FLEET_PROBES, aggregator=True, mesh=True) as lab:
        for host in lab.hosts:
            path = lab.config_path(host.name)
            for section, opts in (sections or {}).items():
                path.write_text(with_section_options(path.read_text(), section, opts))
            start_linkpassd(lab, host.name)
        yield lab


@pytest.fixture(scope="module")
def fleet_lab():
    with fleet() as lab:
        yield lab


def hosts_view(lab) -> dict[str, fleet_pb2.HostView]:
    with lab.aggregator.channel() as channel:
        reply = fleet_pb2_grpc.FleetServiceStub(channel).ListHosts(fleet_pb2.ListHostsRequest(),
                                                                   timeout=10)
    return {h.host_id: h for h in reply.hosts}


def mesh_problems(lab) -> list[str]:
    """What keeps the mesh from being complete: every host connected, and on
    every rail at least one echo path, all up, to other hosts' same-rail
    addresses."""
    view = hosts_view(lab)
    problems = []
    same_rail = {r: {lab.rail(h, r).address for h in lab.hosts} for r in range(RAILS)}
    for host in lab.hosts:
        seen = view.get(host.name)
        if seen is None or not seen.connected:
            problems.append(f"{host.name}: not connected to the aggregator")
            continue
        for rail in host.rails:
            paths = [p for p in seen.report.paths if p.port == rail.port]
            if not paths:
                problems.append(f"{host.name} {rail.port}: no echo path")
            for p in paths:
                if p.peer not in same_rail[rail.index] - {rail.address}:
                    problems.append(f"{host.name} {rail.port}: peer {p.peer} is not another "
                                    f"host's rail{rail.index} address")
                if p.state != "up":
                    problems.append(f"{host.name} {rail.port} -> {p.peer}: {p.state}")
    return problems


def wait_for(what: str, check, timeout: float):
    """Until check() returns something truthy, which is returned; fails
    naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.1)
    pytest.fail(f"{what}: not within {timeout:g} s")


def wait_no_problems(what: str, problems, timeout: float) -> None:
    """Until problems() is empty; fails naming the last problems seen."""
    deadline = time.monotonic() + timeout
    while found := problems():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:g} s:\n  " + "\n  ".join(found))
        time.sleep(0.2)


def api_cells(lab) -> dict[tuple[str, str], dict[str, str]]:
    """Every (host, rail)'s verdict as the aggregator holds it (ListHosts),
    shaped like the page's cells. The test watches the fleet through this
    cheap call and reads the page with Chromium only where the page is the
    subject: a headless Chromium per poll kept both cores busy and starved
    the four daemons into the very bystander failovers the test looks for."""
    cells = {}
    for host_id, view in hosts_view(lab).items():
        verdicts = {p.port: control_pb2.Verdict.Name(p.verdict).removeprefix("VERDICT_")
                    for p in view.report.ports}
        for rail in view.rails:
            cells[(host_id, rail.rail)] = {"data-verdict": verdicts.get(rail.port, "UNKNOWN"),
                                           "title": f"{rail.port} (aggregator)"}
    return cells


def page_shows(lab, what: str, check) -> dict:
    """Read the page (one headless Chromium each) until check(cells) holds,
    pausing between reads so the browser does not crowd the daemons out;
    fails naming `what` at the deadline."""
    deadline = time.monotonic() + PAGE_S
    while True:
        cells = page_cells(lab.aggregator.web_url)
        if check(cells):
            return cells
        if time.monotonic() > deadline:
            pytest.fail(f"the page: {what}: not within {PAGE_S:g} s; it shows "
                        + "; ".join(f"{k}: {c['data-verdict']}" for k, c in sorted(cells.items())))
        time.sleep(1.0)


def not_up(cells: dict[tuple[str, str], dict[str, str]]) -> list[str]:
    """The cells not UP, each with its title (port, verdict, evidence)."""
    return [f"{key}: {cell['data-verdict']} ({cell.get('title')})"
            for key, cell in sorted(cells.items()) if cell["data-verdict"] != "UP"]


def probe_log(lab, host: str, lines: int = 40) -> str:
    """The host's last log lines about probe paths and verdicts, for a failure."""
    text = (lab.host_dir(host) / "linkpassd.log").read_text(errors="replace").splitlines()
    keep = [ln for ln in text if "probe" in ln or "verdict" in ln or "rail_path" in ln]
    return f"\n--- {host} ---\n" + "\n".join(ln[:400] for ln in keep[-lines:])


def failures_today(lab) -> tuple[int, int]:
    """(absorbed, outgoing only) today, from the aggregator's summary."""
    with lab.aggregator.channel() as channel:
        summary = fleet_pb2_grpc.FleetServiceStub(channel).GetSummary(
            fleet_pb2.GetSummaryRequest(days=1), timeout=10)
    return (sum(day.failures_absorbed for day in summary.days),
            sum(day.failures_outgoing_only for day in summary.days))


def rail_path_events(lab) -> list[tuple[str, int, str, str, dict[str, str]]]:
    """Every rail path event the aggregator holds: (host, seq, message, rail, fields)."""
    with lab.aggregator.channel() as channel:
        events = fleet_pb2_grpc.FleetServiceStub(channel).ListFleetEvents(
            fleet_pb2.ListFleetEventsRequest(kind=control_pb2.EVENT_KIND_RAIL_PATH), timeout=10)
    return [(fe.host_id, fe.event.seq, fe.event.message, fe.event.rail, dict(fe.event.fields))
            for fe in events.events]


def failovers(events) -> list[str]:
    """The events that put a rail on a path other than its own."""
    return [f"{host} seq {seq}: {message} {fields}" for host, seq, message, rail, fields in events
            if fields.get("path") != rail]


def routed_dev(lab, host: str, dst: str, src: str) -> str | None:
    out = lab.run(host, ["ip", "-j", "route", "get", dst, "from", src], check=False).stdout
    return json.loads(out)[0].get("dev") if out.strip() else None


class Cells(HTMLParser):
    """The grid's cells: (data-host, data-rail) -> data-verdict."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[tuple[str, str], dict[str, str]] = {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "td" and "data-host" in a and "data-rail" in a:
            self.cells[(a["data-host"], a["data-rail"])] = a


def page_cells(url: str) -> dict[tuple[str, str], dict[str, str]]:
    parser = Cells()
    parser.feed(dump_dom(url))
    return parser.cells


def test_configs_name_no_probe_peers_and_the_mesh_covers_every_rail(fleet_lab):
    for host in fleet_lab.hosts:
        assert "probe_peers" not in fleet_lab.config_path(host.name).read_text()
    wait_no_problems("the aggregator's mesh on every host and rail",
                     lambda: mesh_problems(fleet_lab), MESH_S)


def test_a_silent_blackhole_is_found_through_the_mesh_and_the_page_shows_it(fleet_lab):
    if chromium() is None:
        pytest.fail("chromium is missing: ./scripts/bootstrap.sh installs it")
    lab = fleet_lab
    wait_no_problems("the mesh up before the fault", lambda: mesh_problems(lab), MESH_S)
    victim = lab.hosts[0]
    rail0, rail1 = victim.rail(0), victim.rail(1)
    peer = lab.hosts[1]
    dst = peer.rail(0).address
    assert routed_dev(lab, victim.name, dst, rail0.address) == rail0.port
    # A verified healthy start: every host's every rail UP, not only the
    # victim's (a bystander still settling would be misread below), as the
    # aggregator holds it and then on the page.
    wait_no_problems("every host's every rail UP before the fault",
                     lambda: not_up(api_cells(lab)), PAGE_S)
    page_shows(lab, "every cell UP", lambda cells: cells and not not_up(cells))
    # No failover at all so far: a start-up failover (a host failing over as
    # the mesh is handed out, on a healthy fabric) is a false one.
    events_before = rail_path_events(lab)
    assert not failovers(events_before), "failovers with no fault:\n  " + "\n  ".join(
        failovers(events_before)) + "".join(probe_log(lab, h.name) for h in lab.hosts)
    absorbed_before, outgoing_before = failures_today(lab)
    fault = SilentBlackhole(lab, victim.name, 0)
    fault.inject()
    try:
        wait_for(f"{victim.name} rail0 routed through {rail1.port}",
                 lambda: routed_dev(lab, victim.name, dst, rail0.address) == rail1.port, DETECT_S)

        def fault_held(cells):
            cell = cells.get((victim.name, "rail0"), {})
            return cell if cell.get("data-verdict") == "DOWN" else None

        wait_for("the aggregator holding the faulted port DOWN",
                 lambda: fault_held(api_cells(lab)), PAGE_S)
        cell = fault_held(page_shows(lab, "the faulted port DOWN", fault_held))
        assert cell["data-port"] == rail0.port
        # The fault is the victim's alone: a bystander's rail0 loses one of its
        # three peers (the victim) and stays UP (core.railverdict), and is
        # never DOWN on the way.
        bystanders = [(h.name, "rail0") for h in lab.hosts if h is not victim]
        seen_down: list[str] = []

        def bystanders_up():
            cells = api_cells(lab)
            seen_down.extend(f"{k}: {cells[k].get('title')}" for k in bystanders
                             if cells[k]["data-verdict"] == "DOWN")
            return [f"{k}: {cells[k]['data-verdict']} ({cells[k].get('title')})"
                    for k in bystanders if cells[k]["data-verdict"] != "UP"]

        wait_no_problems("the bystanders' rail0 UP while the victim's is down", bystanders_up,
                         PAGE_S)
        assert not seen_down, seen_down
        page_shows(lab, "the bystanders' rail0 UP, the victim's DOWN", lambda cells: (
            fault_held(cells) and all(cells[k]["data-verdict"] == "UP" for k in bystanders)))
        # the one failover this fault caused is counted once, as outgoing only:
        # this lab's daemons run without [announce], so traffic to the victim's
        # rail0 address was not moved and the failure is not absorbed
        wait_for("the failover counted as outgoing only",
                 lambda: failures_today(lab)[1] >= outgoing_before + 1, PAGE_S)
        assert failures_today(lab) == (absorbed_before, outgoing_before + 1)
        after = [e for e in rail_path_events(lab) if e not in events_before]
        moved = failovers(after)
        mine = [e for e in moved if e.startswith(f"{victim.name} ")]
        assert len(mine) == 1 and len(moved) == 1, (
            f"the fault must fail over exactly {victim.name}'s rail0, once:\n  "
            + "\n  ".join(moved)
            + "".join(probe_log(lab, h.name) for h in lab.hosts if h is not victim))
        for host in lab.hosts[1:]:  # every bystander on its own rail-0 path
            src = host.rail(0)
            other = next(h for h in lab.hosts[1:] if h is not host).rail(0).address
            assert routed_dev(lab, host.name, other, src.address) == src.port, host.name
        shot = screenshot(lab.aggregator.web_url, RESULTS / "fleet-page-fault.png")
        assert shot.stat().st_size > 10_000  # a rendered page, not a blank one
    finally:
        fault.clear()
