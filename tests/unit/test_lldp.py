"""LLDP neighbours (adapters.lldp): real lldpd 1.0.16 output in both of its JSON
shapes, a real LLDP frame it sent, and broken input of every kind — which
gives a named problem, never an exception.

Fixtures (tests/unit/lldp_fixtures) were captured on this machine from two
lldpd 1.0.16 in two lab namespaces joined by two veth pairs: one announcing
"leaf-r0-a" with port IDs by interface name (lpv2a, lpv2c), the other with
lldpd's defaults (MAC port IDs, interface name as description)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from linkpassd.adapters import lldp
from linkpassd.adapters.lldp import LldpNeighbour, parse_frame, parse_lldpctl

FIXTURES = Path(__file__).parent / "lldp_fixtures"


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@pytest.mark.parametrize("name", ["lldpd-1.0.16-two-ports.json",  # interface: [{port: {...}}, ...]
                                  "lldpd-1.0.16-two-ports.json0"])  # interface: [{"name": ...}]
def test_both_lldpctl_shapes_give_each_ports_system_name_and_port_id(name):
    view = parse_lldpctl(fixture(name))
    assert view.problem == ""
    assert {p: (n.system, n.port_id, n.port_id_type, n.port_descr, n.source)
            for p, n in view.neighbours.items()} == {
        "lpv2b": ("leaf-r0-a", "lpv2a", "ifname", "Ethernet1", "lldpd"),
        "lpv2d": ("leaf-r0-a", "lpv2c", "ifname", "Ethernet2", "lldpd")}
    assert view.neighbours["lpv2b"].switch_port == "lpv2a"


def test_one_port_json_is_an_object_keyed_by_port_not_a_list():
    view = parse_lldpctl(fixture("lldpd-1.0.16-one-port.json"))
    assert view.problem == ""
    assert list(view.neighbours) == ["lpv2b"]
    assert view.neighbours["lpv2b"].system == "leaf-r0-a"


def test_a_mac_port_id_says_nothing_to_a_plan_so_the_description_is_compared():
    view = parse_lldpctl(fixture("lldpd-1.0.16-mac-port-id.json"))
    n = view.neighbours["lpv2a"]
    assert n.port_id_type == "mac" and ":" in n.port_id
    assert n.switch_port == "lpv2b" and n.system == "gpu-001"


def test_no_neighbour_is_an_empty_view_without_a_problem():
    view = parse_lldpctl(fixture("lldpd-1.0.16-none.json"))
    assert view.neighbours == {} and view.problem == ""
    assert parse_lldpctl(b'{"lldp": [{}]}') == lldp.LldpdView({})  # json0's empty answer


@pytest.mark.parametrize("document, named", [
    (b"", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[" * 100_000, "not JSON"),
    (b"[]", "without an 'lldp' key"),
    (b'{"lldp": 3}', "lldp is int"),
    (b'{"lldp": {"interface": 5}}', "lldp.interface is int"),
    (b'{"lldp": {"interface": [1]}}', "lldp.interface[0] is int"),
    (b'{"lldp": {"interface": {"eth0": {"port": 7}}}}', "lldp.interface['eth0'].port is int"),
    (b'{"lldp": [{"interface": [{"name": "eth0", "chassis": 5}]}]}', "chassis is int"),
    (b'{"lldp": [{"interface": [{"via": "LLDP"}]}]}', "has no name"),
])
def test_a_malformed_document_is_a_named_problem_never_an_exception(document, named):
    view = parse_lldpctl(document)
    assert view.neighbours == {}
    assert named in view.problem and view.problem.startswith("lldpctl output")


def test_a_real_frame_off_the_wire_gives_the_same_neighbour():
    frame = bytes.fromhex(fixture("lldpd-1.0.16-frame.hex").decode().strip())
    neighbour, why = parse_frame(frame, "lpv2b")
    assert why == ""
    assert neighbour == LldpNeighbour(port="lpv2b", system="leaf-r0-a", port_id="lpv2a",
                                      port_id_type="ifname", port_descr="Ethernet1",
                                      source="wire")


@pytest.mark.parametrize("cut, named", [(0, "too short"), (13, "too short"),
                                        (30, "undecodable"), (20, "undecodable")])
def test_a_truncated_frame_is_a_named_problem(cut, named):
    frame = bytes.fromhex(fixture("lldpd-1.0.16-frame.hex").decode().strip())
    neighbour, why = parse_frame(frame[:cut], "eth0")
    assert neighbour is None and named in why


def test_a_frame_of_another_protocol_is_not_taken_for_lldp():
    ipv4 = bytes(6) + bytes(6) + b"\x08\x00" + bytes(40)
    neighbour, why = parse_frame(ipv4, "eth0")
    assert neighbour is None and "not an LLDP frame" in why


def test_without_an_lldpd_socket_the_view_says_so(tmp_path):
    view = asyncio.run(lldp.query_lldpd(str(tmp_path / "lldpd.sock")))
    assert view.neighbours == {} and "no lldpd socket at" in view.problem


def test_an_lldpctl_that_fails_is_a_problem_with_its_message(tmp_path, monkeypatch):
    fake = tmp_path / "lldpctl"
    fake.write_text("#!/bin/sh\necho 'unable to connect to socket' >&2\nexit 1\n")
    fake.chmod(0o755)
    sock = tmp_path / "lldpd.sock"
    sock.write_text("")
    monkeypatch.setenv("PATH", str(tmp_path))
    view = asyncio.run(lldp.query_lldpd(str(sock)))
    assert "failed (exit 1)" in view.problem and "unable to connect" in view.problem


def test_an_lldpctl_that_hangs_is_given_up_and_named(tmp_path, monkeypatch):
    fake = tmp_path / "lldpctl"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    sock = tmp_path / "lldpd.sock"
    sock.write_text("")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    view = asyncio.run(lldp.query_lldpd(str(sock), timeout_s=0.3))
    assert "did not answer within 0.3 s" in view.problem
