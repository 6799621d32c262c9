"""[announce] config checks and the FRR config linkpassd.announce_frr prints."""

import pytest

from linkpassd import announce_frr
from linkpassd.announce_frr import SnippetError, bgpd_config, snippet
from linkpassd.config import ConfigError, parse_config

RAILS = """
[[rail]]
name = "rail0"
port = "eth0"
address = "198.18.0.2/24"
gateway = "198.18.0.1"
backups = ["rail1"]
[[rail]]
name = "rail1"
port = "eth1"
address = "198.18.1.2/24"
gateway = "198.18.1.1"
backups = ["rail0"]
"""


def config(announce: str):
    return parse_config('[daemon]\ncontrol_socket = "/tmp/lp.sock"\n' + announce + RAILS)


def test_off_by_default():
    assert config("").announce.enabled is False


def test_table_inside_the_owned_range_is_refused():
    with pytest.raises(ConfigError) as info:
        config("[announce]\nenabled = true\ntable = 10100\n")
    assert "announce.table" in str(info.value) and "owned table range" in str(info.value)
    with pytest.raises(ConfigError) as info:
        config("[announce]\ntable = 254\n")
    assert "announce.table" in str(info.value)


def test_protocol_shared_with_the_routes_is_refused():
    with pytest.raises(ConfigError) as info:
        config("[announce]\nroute_protocol = 201\n")
    assert "announce.route_protocol" in str(info.value)


def test_snippet_has_a_session_and_route_map_per_rail():
    cfg = config("[announce]\nenabled = true\nlocal_asn = 65101\npeer_asn = 65001\n"
                 "owner_med = 50\n")
    text = snippet(cfg)
    assert "ip import-table 250\n" in text
    # zebra's nexthop objects would take ids in linkpassd's owned range
    assert "no zebra nexthop kernel enable\n" in text
    assert "redistribute table 250 route-map lp-announce-redistribute" in text
    assert " neighbor 198.18.0.1 update-source 198.18.0.2" in text
    assert " neighbor 198.18.1.1 route-map lp-out-rail1 out" in text
    rail1 = text[text.index("route-map lp-out-rail1 permit 10"):]
    rail1 = rail1[:rail1.index("!")]
    # own address over its own rail with owner_med; any rail address (a detour) with MED 0;
    # a settling one (metric base + 2 rails + position 1) with MED 0 and NO_EXPORT
    assert rail1.splitlines() == [
        "route-map lp-out-rail1 permit 10", " match ip address prefix-list lp-own-rail1",
        " match metric 1001", " set metric 50",
        "route-map lp-out-rail1 permit 20", " match ip address prefix-list lp-announce",
        " match metric 1001", " set metric 0",
        "route-map lp-out-rail1 permit 30", " match ip address prefix-list lp-announce",
        " match metric 1003", " set metric 0", " set community no-export",
        "route-map lp-out-rail1 deny 100"]
    assert "permit 198.18.9" not in text


def test_snippet_needs_the_as_numbers(tmp_path, capsys):
    with pytest.raises(SnippetError):
        bgpd_config(config("[announce]\nenabled = true\n"))
    text = bgpd_config(config("[announce]\nenabled = true\nlocal_asn = 65101\n"))
    assert " neighbor 198.18.0.1 remote-as external" in text
    path = tmp_path / "c.toml"
    path.write_text('[daemon]\ncontrol_socket = "/tmp/lp.sock"\n' + RAILS)
    assert announce_frr.main([str(path)]) == 1
    assert "[announce] is not enabled" in capsys.readouterr().err
    assert announce_frr.main([]) == 2
