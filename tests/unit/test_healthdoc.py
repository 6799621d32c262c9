"""core.healthdoc: the document launchers read, its JSON, freshness and NCCL advice."""

import copy
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from linkpassd.core import drain as drains
from linkpassd.core import healthdoc
from linkpassd.core.healthdoc import HealthDoc, HealthDocError, PortHealthRow
from linkpassd.core.model import Drain, PortState, Verdict
from tests.unit.corefixtures import port, ports, rails_config

RDMA = {"eth0": ("mlx5_0", 1), "eth1": ("mlx5_1", 1), "eth2": ("mlx5_3", 2)}


def doc_for(states, rdma=RDMA, n=3, written_at=1000.0, valid_s=5.0):
    config = rails_config(n)
    return healthdoc.build("gpu17", "boot-1", 4, written_at, valid_s, 4242, config.rails, states, rdma)


def row(port_name, verdict=Verdict.UP, drained=False, device="", number=0, reason="ok", rail=None):
    return PortHealthRow(port=port_name, rail=rail or f"r-{port_name}", rdma_device=device,
                         rdma_port=number, verdict=verdict, since=10.0, reason=reason, drained=drained)


def doc_of(*rows):
    return HealthDoc(hostname="gpu17", boot_id="b", generation=1, written_at=1000.0,
                     valid_until=1005.0, pid=7, ports=tuple(rows))


# ---------------------------------------------------------------- build


def test_build_lists_rails_in_config_order_with_their_rdma_devices():
    config = rails_config(3)
    doc = healthdoc.build("gpu17", "boot-1", 4, 1000.0, 5.0, 4242, config.rails, ports(config), RDMA)
    assert [(r.rail, r.port, r.rdma_device, r.rdma_port) for r in doc.ports] == [
        ("rail0", "eth0", "mlx5_0", 1), ("rail1", "eth1", "mlx5_1", 1), ("rail2", "eth2", "mlx5_3", 2)]
    assert (doc.hostname, doc.boot_id, doc.generation, doc.pid) == ("gpu17", "boot-1", 4, 4242)
    assert (doc.written_at, doc.valid_until) == (1000.0, 1005.0)
    assert all(r.usable for r in doc.ports)


def test_build_reason_is_first_evidence_line_else_phase_and_since_is_kept():
    config = rails_config(2)
    states = ports(config,
                   eth0=PortState("eth0", Verdict.DOWN, False, "DOWN", since=1234.5,
                                  evidence=("carrier lost", "operstate DOWN")),
                   eth1=PortState("eth1", Verdict.UP, True, "STABLE", since=99.0))
    doc = doc_for(states, n=2)
    assert [(r.verdict, r.reason, r.since, r.usable) for r in doc.ports] == [
        (Verdict.DOWN, "carrier lost", 1234.5, False), (Verdict.UP, "STABLE", 99.0, True)]


def test_build_marks_a_drained_port_not_usable_with_the_drain_as_reason():
    config = rails_config(2)
    d = Drain(port="eth1", reason="optic swap", by="root (uid 0)", at=900.0)
    states = drains.apply(ports(config), {"eth1": d})
    doc = doc_for(states, n=2)
    eth1 = doc.ports[1]
    assert eth1.drained and not eth1.usable and eth1.verdict is Verdict.DEGRADED
    assert eth1.reason == "drained by root (uid 0): optic swap"
    assert not doc.ports[0].drained and doc.ports[0].usable


def test_build_lists_an_unjudged_port_and_a_port_without_rdma():
    states = {"eth0": port("eth0")}  # eth1 not judged yet
    doc = doc_for(states, rdma={"eth1": ("mlx5_1", 1)}, n=2)
    assert (doc.ports[0].rdma_device, doc.ports[0].rdma_port) == ("", 0)
    assert doc.ports[1].verdict is None and doc.ports[1].since == 0.0 and not doc.ports[1].usable
    assert doc.ports[1].reason == "not judged yet"


@pytest.mark.parametrize("valid_s", [0.0, -1.0, float("nan"), float("inf")])
def test_build_refuses_a_validity_that_is_not_a_positive_time(valid_s):
    config = rails_config(1)
    with pytest.raises(ValueError, match="valid_s"):
        healthdoc.build("h", "b", 1, 1000.0, valid_s, 1, config.rails, ports(config), {})


def test_stopped_is_expired_at_once_and_newer():
    doc = doc_for(ports(rails_config(3)))
    final = healthdoc.stopped(doc, now=1002.0)
    assert (final.written_at, final.valid_until, final.generation) == (1002.0, 1002.0, doc.generation + 1)
    assert final.ports == doc.ports


# ---------------------------------------------------------------- JSON


def test_json_has_the_documented_fields_and_round_trips():
    doc = doc_for(drains.apply(ports(rails_config(3)),
                               {"eth2": Drain("eth2", "bad optic", "alice (uid 1000)", 5.0, 99.0)}))
    obj = healthdoc.to_json(doc)
    assert json.loads(json.dumps(obj)) == obj  # plain JSON values only
    assert obj["format"] == healthdoc.FORMAT_VERSION
    assert obj["ports"][2] == {"port": "eth2", "rail": "rail2", "rdma_device": "mlx5_3", "rdma_port": 2,
                               "verdict": "DEGRADED", "since": 0.0,
                               "reason": "drained by alice (uid 1000): bad optic",
                               "drained": True, "usable": False}
    assert obj["ports"][0]["usable"] is True
    assert healthdoc.from_json(obj) == doc


_names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_times = st.floats(min_value=0, max_value=4e9, allow_nan=False)
_rows = st.builds(PortHealthRow, port=_names.filter(bool), rail=_names, rdma_device=_names,
                  rdma_port=st.integers(0, 255), verdict=st.none() | st.sampled_from(Verdict),
                  since=_times, reason=_names, drained=st.booleans())


@given(hostname=_names, boot_id=_names, generation=st.integers(0, 2**53), written_at=_times,
       valid_s=_times, pid=st.integers(-1, 2**31), pid_ns=st.integers(0, 2**63),
       rows=st.lists(_rows, max_size=6, unique_by=lambda r: r.rail))
def test_any_document_survives_json_text(hostname, boot_id, generation, written_at, valid_s, pid, pid_ns, rows):
    doc = HealthDoc(hostname, boot_id, generation, written_at, written_at + valid_s, pid, tuple(rows), pid_ns)
    assert healthdoc.from_json(json.loads(json.dumps(healthdoc.to_json(doc)))) == doc


def _good():
    return healthdoc.to_json(doc_for(ports(rails_config(2)), n=2))


def _set(path, value):
    def change(obj):
        target = obj
        for key in path[:-1]:
            target = target[key]
        if value is _DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value
    return change


_DELETE = object()


@pytest.mark.parametrize("change, named", [
    (_set(("format",), 2), "format: 2"),
    (_set(("format",), _DELETE), "format: missing"),
    (_set(("hostname",), 5), "hostname: expected a string"),
    (_set(("generation",), 1.5), "generation: expected an integer"),
    (_set(("generation",), True), "generation: expected an integer"),
    (_set(("generation",), -1), "generation: must not be negative"),
    (_set(("written_at",), "noon"), "written_at: expected a number"),
    (_set(("valid_until",), None), "valid_until: expected a number"),
    (_set(("pid",), "42"), "pid: expected an integer"),
    (_set(("pid_ns",), "4026531836"), "pid_ns: expected an integer"),
    (_set(("pid_ns",), -1), "pid_ns: must not be negative"),
    (_set(("ports",), {}), "ports: expected a list"),
    (_set(("ports", 1), "eth1"), "ports[1]: expected an object"),
    (_set(("ports", 0, "verdict"), "SICK"), "ports[0].verdict: 'SICK' is not one of UP, DEGRADED, DOWN"),
    (_set(("ports", 0, "verdict"), 1), "ports[0].verdict: expected a string or null"),
    (_set(("ports", 1, "drained"), "no"), "ports[1].drained: expected true or false"),
    (_set(("ports", 1, "drained"), 0), "ports[1].drained: expected true or false"),
    (_set(("ports", 1, "rdma_port"), -1), "ports[1].rdma_port: must not be negative"),
    (_set(("ports", 1, "since"), _DELETE), "ports[1].since: missing"),
    (_set(("ports", 0, "port"), ""), "ports[0].port: must not be empty"),
    (_set(("ports", 1, "rail"), "rail0"), "ports[1].rail: 'rail0' is listed twice"),
])
def test_from_json_names_the_bad_field(change, named):
    obj = copy.deepcopy(_good())
    change(obj)
    with pytest.raises(HealthDocError) as err:
        healthdoc.from_json(obj)
    assert named in str(err.value)


@pytest.mark.parametrize("obj", [[], "health", None, 3])
def test_from_json_refuses_what_is_not_an_object(obj):
    with pytest.raises(HealthDocError, match="expected a JSON object"):
        healthdoc.from_json(obj)


def test_pid_ns_is_written_read_back_and_zero_when_absent():
    config = rails_config(1)
    doc = healthdoc.build("gpu17", "b", 1, 1000.0, 30.0, 4242, config.rails, ports(config), {},
                          pid_ns=4026531836)
    obj = healthdoc.to_json(doc)
    assert obj["pid_ns"] == 4026531836
    assert healthdoc.from_json(obj) == doc
    del obj["pid_ns"]  # a daemon from before pid_ns
    assert healthdoc.from_json(obj) == HealthDoc(**{**doc.__dict__, "pid_ns": 0})
    assert doc_for(ports(rails_config(1)), n=1).pid_ns == 0  # build's default: unknown


def test_the_pid_is_comparable_only_within_one_known_namespace():
    doc = HealthDoc("gpu17", "b", 1, 1000.0, 1030.0, 4242, (), pid_ns=4026531836)
    assert healthdoc.pid_comparable(doc, 4026531836)
    assert not healthdoc.pid_comparable(doc, 4026532000)  # the reader is in a container
    assert not healthdoc.pid_comparable(doc, 0)  # the reader cannot tell its own
    assert not healthdoc.pid_comparable(HealthDoc("gpu17", "b", 1, 1000.0, 1030.0, 4242, ()), 0)


def test_from_json_ignores_fields_it_does_not_know():
    obj = _good()
    obj["new_top"] = {"x": 1}
    obj["ports"][0]["new_port_field"] = [1]
    assert healthdoc.from_json(obj) == healthdoc.from_json(_good())


# ---------------------------------------------------------------- staleness


def test_fresh_until_valid_until_then_stale_with_the_age_named():
    doc = doc_for(ports(rails_config(1)), n=1, written_at=1000.0, valid_s=5.0)
    assert healthdoc.staleness(doc, 1000.0, True) is None
    assert healthdoc.staleness(doc, 1005.0, None) is None
    why = healthdoc.staleness(doc, 1012.5, True)
    assert why is not None and "not rewritten for 12.5s" in why and "gone or stuck" in why


def test_a_dead_pid_is_stale_at_once():
    doc = doc_for(ports(rails_config(1)), n=1)
    why = healthdoc.staleness(doc, 1000.5, pid_alive=False)
    assert why is not None and "pid 4242" in why and "no longer running" in why


def test_a_stopped_document_is_stale_even_if_the_clock_went_back():
    doc = healthdoc.stopped(doc_for(ports(rails_config(1)), n=1), now=1003.0)
    for now in (1003.0, 1004.0, 990.0):
        why = healthdoc.staleness(doc, now, pid_alive=True)
        assert why is not None and "stopped at 1003" in why


# ---------------------------------------------------------------- nccl_env


def test_nccl_env_lists_usable_ports_with_exact_match_syntax_in_rail_order():
    doc = doc_of(row("eth0", device="mlx5_0", number=1),
                 row("eth1", Verdict.DOWN, device="mlx5_1", number=1),
                 row("eth2", Verdict.DEGRADED, device="mlx5_2", number=1),
                 row("eth3", device="mlx5_3", number=1), row("eth4", drained=True, device="mlx5_4", number=1))
    assert healthdoc.nccl_env(doc) == {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_3:1",
                                       "NCCL_SOCKET_IFNAME": "=eth0,eth3"}
    assert healthdoc.nccl_env_refusal(doc) is None


def test_nccl_env_keeps_the_port_number_of_a_dual_port_device():
    doc = doc_of(row("p0", device="mlx4_0", number=1, verdict=Verdict.DOWN),
                 row("p1", device="mlx4_0", number=2))
    assert healthdoc.nccl_env(doc)["NCCL_IB_HCA"] == "=mlx4_0:2"


def test_nccl_env_without_rdma_devices_gives_only_the_socket_list():
    doc = doc_of(row("eth0"), row("eth1", Verdict.DOWN))
    assert healthdoc.nccl_env(doc) == {"NCCL_SOCKET_IFNAME": "=eth0"}


def test_usable_ports_without_rdma_next_to_an_rdma_port_do_not_hide_it():
    doc = doc_of(row("eth0", device="mlx5_0", number=1), row("eth1"))
    assert healthdoc.nccl_env(doc) == {"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_SOCKET_IFNAME": "=eth0,eth1"}


def test_nccl_env_never_writes_an_empty_list_that_nccl_would_read_as_all_devices():
    doc = doc_of(row("eth0", Verdict.DOWN, device="mlx5_0", number=1, reason="carrier lost"),
                 row("eth1", drained=True, device="mlx5_1", number=1, reason="drained by root: x"),
                 row("eth2", verdict=None, reason="not judged yet"))
    assert healthdoc.nccl_env(doc) == {}
    why = healthdoc.nccl_env_refusal(doc)
    assert why == ("no usable port on gpu17: eth0 DOWN (carrier lost); eth1 UP, drained "
                   "(drained by root: x); eth2 not judged yet")


def test_rdma_host_whose_only_usable_ports_lack_rdma_gets_no_advice():
    # The RDMA ports are bad; the usable one has no RDMA device: an NCCL_IB_HCA
    # left unset would let NCCL pick the bad HCAs.
    doc = doc_of(row("eth0", Verdict.DOWN, device="mlx5_0", number=1, reason="carrier lost"), row("mgmt0"))
    assert healthdoc.nccl_env(doc) == {}
    assert healthdoc.nccl_env_refusal(doc) == ("no usable RDMA port on gpu17: "
                                               "mlx5_0:1 (eth0) DOWN (carrier lost)")


def test_a_port_shared_by_two_rails_is_listed_once():
    doc = doc_of(row("eth0", device="mlx5_0", number=1, rail="a"),
                 row("eth0", device="mlx5_0", number=1, rail="b"))
    assert healthdoc.nccl_env(doc) == {"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_SOCKET_IFNAME": "=eth0"}


def test_no_ports_at_all_is_refused():
    assert healthdoc.nccl_env(doc_of()) == {}
    assert healthdoc.nccl_env_refusal(doc_of()) == "no usable port on gpu17: no rail ports"


# ---------------------------------------------------------------- port failover (NCCL 2.29.7+)


def rdma_rows(*verdicts):
    """One RDMA port per verdict, ethN on mlx5_N:1, in rail order."""
    return [row(f"eth{i}", v, device=f"mlx5_{i}", number=1) for i, v in enumerate(verdicts)]


@pytest.mark.parametrize("text, version", [
    ("2.29.7", (2, 29, 7)), ("2.30.3-1", (2, 30, 3)), ("v2.29.7-1", (2, 29, 7)),
    ("2.29.7+cuda12.9", (2, 29, 7)), ("3.0.0", (3, 0, 0))])
def test_nccl_versions_as_nccl_and_its_tags_write_them_are_read(text, version):
    assert healthdoc.parse_nccl_version(text) == version


@pytest.mark.parametrize("text", ["2.29", "2.29.x", "", "latest", "2.29.7.1", " 2.29.7", "2.29.7-rc1",
                                  "2..7", "2.29.7;rm -rf /"])
def test_a_malformed_nccl_version_is_refused_naming_it(text):
    with pytest.raises(ValueError) as err:
        healthdoc.parse_nccl_version(text)
    assert repr(text) in str(err.value) and "not an NCCL version" in str(err.value)


@pytest.mark.parametrize("version, refused", [
    ((2, 29, 6), True), ((2, 29, 3), True), ((2, 28, 9), True), ((1, 99, 99), True),
    ((2, 29, 7), False), ((2, 30, 0), False), ((3, 0, 0), False)])
def test_port_failover_is_refused_before_nccl_2_29_7_naming_the_version(version, refused):
    why = healthdoc.port_failover_refusal(version)
    assert (why is not None) == refused
    if refused:
        assert why.startswith(f"NCCL {'.'.join(map(str, version))} has no port failover")
        assert "2.29.7" in why


def test_port_failover_merges_the_usable_ports_in_pairs_in_rail_order():
    doc = doc_of(*rdma_rows(Verdict.UP, Verdict.UP, Verdict.UP, Verdict.UP))
    env, notes = healthdoc.port_failover_env(doc)
    assert env == {"NCCL_IB_RESILIENCY_PORT_FAILOVER": "1",
                   "NCCL_NET_FORCE_MERGE": "mlx5_0:1,mlx5_1:1;mlx5_2:1,mlx5_3:1"}
    assert notes == []


def test_an_unusable_port_leaves_its_group_without_shifting_the_others():
    """Groups are cut from every RDMA port, so a host with a bad port keeps the
    same groups as its healthy peers, minus that port; its lone partner is
    named as unprotected; a DOWN, DEGRADED, drained or unjudged port is never
    named (NCCL fails init on a merge group naming an absent device)."""
    rows = rdma_rows(Verdict.UP, Verdict.DOWN, Verdict.UP, Verdict.UP, Verdict.DEGRADED, None,
                     Verdict.UP, Verdict.UP)
    rows[7] = row("eth7", drained=True, device="mlx5_7", number=1)
    env, notes = healthdoc.port_failover_env(doc_of(*rows))
    assert env["NCCL_NET_FORCE_MERGE"] == "mlx5_2:1,mlx5_3:1"
    for bad in ("mlx5_1", "mlx5_4", "mlx5_5", "mlx5_7"):
        assert bad not in env["NCCL_NET_FORCE_MERGE"]
    assert notes == ["no failover for mlx5_0:1, mlx5_6:1: no other usable port in its merge group "
                     "(groups of 2 in rail order)"]


def test_merge_size_four_keeps_three_usable_ports_of_a_group_together():
    doc = doc_of(*rdma_rows(Verdict.UP, Verdict.DOWN, Verdict.UP, Verdict.UP, Verdict.UP))
    env, notes = healthdoc.port_failover_env(doc, size=4)
    assert env["NCCL_NET_FORCE_MERGE"] == "mlx5_0:1,mlx5_2:1,mlx5_3:1"
    assert notes == ["no failover for mlx5_4:1: no other usable port in its merge group "
                     "(groups of 4 in rail order)"]


@pytest.mark.parametrize("size", [0, 1, 5])
def test_a_merge_size_nccl_cannot_take_is_refused(size):
    with pytest.raises(ValueError, match=f"not {size}"):
        healthdoc.merge_groups(doc_of(*rdma_rows(Verdict.UP, Verdict.UP)), size)


def test_the_two_ports_of_one_device_and_a_shared_port_are_merged_once():
    doc = doc_of(row("p0", device="mlx5_0", number=1, rail="a"),
                 row("p0", device="mlx5_0", number=1, rail="b"),
                 row("p1", device="mlx5_0", number=2))
    env, _ = healthdoc.port_failover_env(doc)
    assert env["NCCL_NET_FORCE_MERGE"] == "mlx5_0:1,mlx5_0:2"


def test_one_usable_rdma_port_gets_failover_on_but_no_merge_and_a_note():
    doc = doc_of(*rdma_rows(Verdict.UP, Verdict.DOWN))
    env, notes = healthdoc.port_failover_env(doc)
    assert env == {"NCCL_IB_RESILIENCY_PORT_FAILOVER": "1"}
    assert notes and notes[0].startswith("no failover for mlx5_0:1:")


def test_a_host_without_rdma_ports_gets_nothing_for_failover_but_says_why():
    env, notes = healthdoc.port_failover_env(doc_of(row("eth0"), row("eth1")))
    assert env == {}
    assert notes == ["no RDMA port on gpu17: port failover is a NET/IB feature, nothing added"]


@given(st.lists(st.sampled_from([Verdict.UP, Verdict.DOWN, Verdict.DEGRADED, None]), max_size=12),
       st.integers(2, healthdoc.MERGE_MAX))
def test_merge_groups_name_only_usable_ports_at_least_two_at_most_size(verdicts, size):
    doc = doc_of(*rdma_rows(*verdicts))
    usable = {f"{r.rdma_device}:{r.rdma_port}" for r in doc.ports if r.usable}
    groups = healthdoc.merge_groups(doc, size)
    named = [p for g in groups for p in g]
    assert set(named) <= usable and len(named) == len(set(named))
    assert all(2 <= len(g) <= size for g in groups)
