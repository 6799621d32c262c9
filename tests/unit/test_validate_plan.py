"""The cabling plan (linkpassd/validate/plan.py): bad files are refused with
the file, entry and key named; duplicates are refused; the plan survives
the trip through a ValidateRequest. Also: the validate package stays pure."""

import ast
import pathlib

import pytest

import linkpassd.validate
from linkpassd._proto.linkpass.v1 import fleet_pb2
from linkpassd.validate import plan as cabling

GOOD = """
[[port]]
host = "gpu-001"
port = "eth0"
switch = "leaf-r0-a"
switch_port = "Ethernet1"
rail = "rail0"
speed_mbps = 400000

[[port]]
host = "gpu-001"
port = "eth1"
switch = "leaf-r1-a"
switch_port = "Ethernet1"
rail = "rail1"

[[port]]
host = "gpu-002"
port = "eth0"
switch = "leaf-r0-a"
switch_port = "Ethernet2"
rail = "rail0"
speed_mbps = 400000
"""


def entry(**overrides):
    base = {"host": "gpu-001", "port": "eth0", "switch": "leaf-r0-a", "switch_port": "Ethernet1", "rail": "rail0"}
    base.update(overrides)
    return "[[port]]\n" + "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in base.items() if v is not None)


def test_a_good_plan_parses_in_file_order():
    plan = cabling.parse(GOOD, "cabling.toml")
    assert [(p.host, p.port, p.switch, p.switch_port, p.rail, p.speed_mbps) for p in plan.ports] == [
        ("gpu-001", "eth0", "leaf-r0-a", "Ethernet1", "rail0", 400000),
        ("gpu-001", "eth1", "leaf-r1-a", "Ethernet1", "rail1", 0),
        ("gpu-002", "eth0", "leaf-r0-a", "Ethernet2", "rail0", 400000),
    ]
    assert plan.hosts() == ("gpu-001", "gpu-002")
    assert plan.rails() == ("rail0", "rail1")
    assert plan.leaves("rail0") == {"leaf-r0-a": ("gpu-001", "gpu-002")}
    assert plan.port_of("gpu-002", "rail0").switch_port == "Ethernet2"
    assert plan.at_switch_port("leaf-r1-a", "Ethernet1").port == "eth1"
    assert plan.port_of("gpu-002", "rail1") is None


def test_load_reads_a_file_and_names_it_when_unreadable(tmp_path):
    path = tmp_path / "cabling.toml"
    path.write_text(GOOD)
    assert len(cabling.load(path).ports) == 3
    with pytest.raises(cabling.PlanError, match=r"missing\.toml: cannot read"):
        cabling.load(tmp_path / "missing.toml")


@pytest.mark.parametrize("text, message", [
    ("[[port]\nhost=", r"cabling\.toml: not valid TOML"),
    ("", r"cabling\.toml: no \[\[port\]\] entries"),
    ("ports = 1\n", r"cabling\.toml: unknown top-level key 'ports'"),
    ("port = 3\n", r"cabling\.toml: 'port' must be an array of tables"),
    (entry() + entry(host="gpu-002", switch_port="Ethernet2", speed_mpbs=1),
     r"cabling\.toml: port entry 2: unknown key 'speed_mpbs'"),
    (entry(rail=None), r"cabling\.toml: port entry 1: missing key 'rail'"),
    (entry() + entry(host="gpu-002", switch_port=""), r"port entry 2: key 'switch_port' is empty"),
    (entry(switch="leaf r0"), r"port entry 1: key 'switch' = 'leaf r0'"),
    ("[[port]]\nhost = 7\nport = 'eth0'\nswitch = 'l'\nswitch_port = 'E1'\nrail = 'r0'\n",
     r"port entry 1: key 'host' must be a string, not int"),
    (entry() + "speed_mbps = -1\n", r"port entry 1: key 'speed_mbps' = -1"),
    (entry() + "speed_mbps = true\n", r"port entry 1: key 'speed_mbps' = True"),
    (entry() + "speed_mbps = 400.5\n", r"port entry 1: key 'speed_mbps' = 400\.5"),
])
def test_bad_plans_name_file_entry_and_key(text, message):
    with pytest.raises(cabling.PlanError, match=message):
        cabling.parse(text, "cabling.toml")


@pytest.mark.parametrize("second, message", [
    (entry(switch_port="Ethernet9"), r"port entry 2: host port gpu-001 eth0 is already planned in entry 1"),
    (entry(host="gpu-002"), r"port entry 2: switch port leaf-r0-a Ethernet1 is already planned in entry 1"),
    (entry(port="eth4", switch_port="Ethernet9"),
     r"port entry 2: host gpu-001 on rail rail0 is already planned in entry 1 \(one port per host per rail"),
])
def test_duplicates_are_refused_naming_both_entries(second, message):
    with pytest.raises(cabling.PlanError, match=message):
        cabling.parse(entry() + second, "cabling.toml")


def test_round_trip_through_the_request_proto():
    plan = cabling.parse(GOOD, "cabling.toml")
    request = fleet_pb2.ValidateRequest(plan=cabling.plan_to_proto(plan))
    wire = fleet_pb2.ValidateRequest.FromString(request.SerializeToString())
    assert wire.plan[0].switch_name == "leaf-r0-a"
    back = cabling.plan_from_proto(wire.plan)
    assert back.ports == plan.ports
    assert [cabling.from_proto(cabling.to_proto(p)) for p in plan.ports] == list(plan.ports)


def test_a_request_plan_gets_the_same_checks_as_a_file():
    ports = [fleet_pb2.PlannedPort(host="a", port="eth0", switch_name="l", switch_port="E1", rail="r0"),
             fleet_pb2.PlannedPort(host="b", port="eth0", switch_name="l", switch_port="E1", rail="r0")]
    with pytest.raises(cabling.PlanError, match=r"request plan: port entry 2: switch port l E1"):
        cabling.plan_from_proto(ports)
    with pytest.raises(cabling.PlanError, match=r"request plan: port entry 1: key 'rail' is empty"):
        cabling.plan_from_proto([fleet_pb2.PlannedPort(host="a", port="eth0", switch_name="l", switch_port="E1")])


def test_select_keeps_only_the_named_hosts_and_rails():
    plan = cabling.parse(GOOD, "cabling.toml")
    assert [(p.host, p.rail) for p in plan.select(hosts=["gpu-001"]).ports] == [("gpu-001", "rail0"),
                                                                               ("gpu-001", "rail1")]
    assert [(p.host, p.rail) for p in plan.select(rails=["rail0"]).ports] == [("gpu-001", "rail0"),
                                                                             ("gpu-002", "rail0")]


# The pure modules of linkpassd/validate (the host's side is adapters/hostcheck.py).
PURE = ("plan.py", "probeplan.py", "results.py", "localize.py", "report.py")
FORBIDDEN = {"asyncio", "pyroute2", "grpc", "socket", "time", "subprocess", "threading", "select", "signal",
             "matplotlib"}


def test_the_validate_core_is_pure_and_matplotlib_is_imported_lazily():
    root = pathlib.Path(linkpassd.validate.__file__).parent
    offenders = {}
    for name in PURE:
        tree = ast.parse((root / name).read_text())
        top_level = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            else:
                continue
            for module in names:
                top = module.split(".")[0]
                if top in FORBIDDEN and not (top == "matplotlib" and node not in top_level):
                    offenders.setdefault(name, []).append(module)
    assert offenders == {}
