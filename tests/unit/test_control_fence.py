"""ListFences and Unfence through the control API and linkpassctl, against
the daemon's fence collaborator (daemon.fencing) on a config of two rails."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from corefixtures import rails_config
from linkpassd._proto.linkpass.v1 import control_pb2 as pb
from linkpassd.adapters.control_server import ControlServer
from linkpassd.core.fence import Fence, State
from linkpassd.core.model import FenceSettings
from linkpassd.daemon.fencing import Fencing
from test_control_api import WALL_NOW, realistic_status, run_ctl, running_server
from test_control_ops import rpc_error

pytestmark = pytest.mark.usefixtures("local_zone")

MONO_NOW = 500.0


@pytest.fixture
def fencing() -> Fencing:
    cfg = replace(rails_config(2), fence=FenceSettings(enabled=True, require_leaf_grant=False))
    holder = {"config": cfg}
    nudges: list[int] = []
    f = Fencing(lambda *a, **k: None, lambda: WALL_NOW, make_ipr=lambda: None,
                config=lambda: holder["config"], clock=lambda: MONO_NOW,
                nudge=lambda: nudges.append(1))
    f.holder = holder  # type: ignore[attr-defined]
    f.nudges = nudges  # type: ignore[attr-defined]
    f.fences["eth0"] = Fence("eth0", State.FENCED, since=MONO_NOW - 10, reason="DOWN with carrier "
                             "for 5.0s (fence_after_s 5); test in 30s", backoff_s=30.0,
                             until=MONO_NOW + 20, fences=1)
    return f


@pytest.fixture
def fence_server(sock: Path, fencing: Fencing) -> Iterator[ControlServer]:
    with running_server(sock, realistic_status, fences=fencing) as server:
        yield server


def test_fences_lists_every_rail_port(fence_server: ControlServer, sock: Path) -> None:
    result = run_ctl(sock, "fences")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "fencing on: at most 1 port(s) of this host, on the host's own checks" in lines
    eth0 = next(line for line in lines if line.startswith("eth0"))
    assert "FENCED" in eth0 and "test in 20.0s" in eth0
    assert any(line.startswith("eth1") and "ARMED" in line for line in lines)
    out = json.loads(run_ctl(sock, "fences", "-o", "json").stdout)
    (f0,) = [f for f in out["fences"] if f["port"] == "eth0"]
    assert f0["state"] == "FENCED" and f0["until"] == WALL_NOW + 20


def test_unfence_lifts_with_a_hold_and_asks_for_a_pass(fence_server: ControlServer, fencing: Fencing,
                                                       sock: Path) -> None:
    result = run_ctl(sock, "unfence", "eth0", "--for", "30m")
    assert result.exit_code == 0, result.output
    f = fencing.fences["eth0"]
    assert f.lift_by == "root (uid 0)" and f.lift_until == MONO_NOW + 1800
    assert fencing.nudges == [1]  # type: ignore[attr-defined]
    assert "lift asked by the root (uid 0)" in result.stdout


def test_unfence_errors_name_the_bad_input(fence_server: ControlServer, fencing: Fencing,
                                          sock: Path) -> None:
    err = rpc_error(sock, lambda s: s.Unfence(pb.UnfenceRequest(port="eth9"), timeout=20))
    assert err.code() == grpc.StatusCode.NOT_FOUND and "'eth9' is no rail's port" in err.details()
    err = rpc_error(sock, lambda s: s.Unfence(pb.UnfenceRequest(port="eth0", hold_s=-1), timeout=20))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "-1" in err.details()
    err = rpc_error(sock, lambda s: s.Unfence(pb.UnfenceRequest(port=""), timeout=20))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    bad = run_ctl(sock, "unfence", "eth0", "--for", "90")
    assert bad.exit_code == 2 and "'--for'" in bad.stderr
    fencing.holder["config"] = replace(fencing.holder["config"], fence=FenceSettings())  # type: ignore[attr-defined]
    err = rpc_error(sock, lambda s: s.Unfence(pb.UnfenceRequest(port="eth0"), timeout=20))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "fencing is off" in err.details()
    assert not fencing.fences["eth0"].lift_by


def test_without_a_provider_fences_are_unimplemented(sock: Path) -> None:
    with running_server(sock, realistic_status):
        err = rpc_error(sock, lambda s: s.ListFences(pb.ListFencesRequest(), timeout=20))
        assert err.code() == grpc.StatusCode.UNIMPLEMENTED
