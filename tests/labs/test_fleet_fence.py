"""Fencing in the fleet lab (issue 26, "Must show": fencing never fires in
the fleet lab's bystanders; a fenced port comes back once the fault clears,
within the backoff).

The lab of tests/labs/test_fleet_lab.py (railopt, 4 hosts x 2 rails, one leaf
per rail, 2 spines, the aggregator and its probe mesh, no probe_peers in any
config), with every linkpassd's ``[fence]`` on, written into the generated
configs the way labs/bench/hiccup.py's ``--fence-opt`` does
(``with_section_options``). The daemons keep the defaults the design relies
on in a fleet: ``require_leaf_grant = true`` (the aggregator's per-leaf
grant, leaf_cap 1) and ``min_echo_peers = 2``.

One host's rail 0 is silently blackholed at its leaf until its first test
after the fence has had its whole test_timeout_s (FAIL_TEST_S). What the
design says (docs/fencing.md): the faulted port's echo paths to its three
mesh peers are all down, which singles it out (core.fence.singled_out), its
other rail is healthy, its leaf's budget is free: it asks, is granted, and
is fenced fence_after_s after its DOWN verdict; its test after the backoff
fails while the fault lasts (no proof from its own probes), and once the
fault is gone the next test proves it and it is unfenced. A bystander's
rail 0 loses one peer of three and stays UP (core.railverdict), so no
bystander port ever even confirms a failure: no fence event of any kind.

The test reads each daemon's own word (ListFences, ListEvents kind fence)
over its control socket, and the port's administrative state from the
kernel.
"""

from __future__ import annotations

import json
import time

import grpc
import pytest
from test_fleet_lab import (
    MESH_S,
    PAGE_S,
    api_cells,
    fleet,
    mesh_problems,
    not_up,
    routed_dev,
    wait_no_problems,
)

from labs.faults import SilentBlackhole
from linkpassd._proto.linkpass.v1 import control_pb2, control_pb2_grpc

pytestmark = pytest.mark.lab

# The hiccup bench's fence settings (docs/fencing.md, "Measured"): the
# strictest fence_after_s, and short backoffs so the lab comes back within
# the test. A strict fence_after_s is the harder case for the bystanders.
FENCE = {"enabled": True, "fence_after_s": 0.5, "backoff_initial_s": 3.0,
         "backoff_max_s": 12.0, "test_timeout_s": 2.0, "test_window_s": 1.0}
# Detection (well under 1 s), fence_after_s, the ask and the grant (a
# heartbeat or two): injection -> the faulted port administratively down.
FENCED_WITHIN_S = 10.0
# The fault stays this long after the fence: the backoff, then the first
# test's whole test_timeout_s (it must fail: the fault is still there), and 1 s.
FAIL_TEST_S = FENCE["backoff_initial_s"] + FENCE["test_timeout_s"] + 1.0
SLACK_S = 10.0  # a loaded 2-core VM, on top of what the fence's own timers allow
POLL_S = 0.2
HOLDING = ("FENCED", "TESTING")


def control(lab, host: str, call):
    with grpc.insecure_channel(f"unix:{lab.control_socket(host)}") as channel:
        return call(control_pb2_grpc.ControlServiceStub(channel))


def fences(lab, host: str) -> dict[str, control_pb2.FenceInfo]:
    reply = control(lab, host, lambda s: s.ListFences(control_pb2.ListFencesRequest(), timeout=5))
    assert reply.enabled, f"{host}: [fence] is not enabled"
    return {f.port: f for f in reply.fences}


def fence_events(lab, host: str) -> list[control_pb2.Event]:
    reply = control(lab, host, lambda s: s.ListEvents(control_pb2.ListEventsRequest(), timeout=5))
    return [e for e in reply.events if e.kind == control_pb2.EVENT_KIND_FENCE]


def admin_up(lab, host: str, port: str) -> bool:
    (link,) = json.loads(lab.run(host, ["ip", "-j", "link", "show", "dev", port]).stdout)
    return "UP" in link["flags"]


def describe(infos: dict[str, control_pb2.FenceInfo]) -> str:
    return "; ".join(f"{p}: {f.state} fences={f.fences} held={f.held!r} ({f.summary})"
                     for p, f in sorted(infos.items()))


@pytest.fixture(scope="module")
def fenced_fleet():
    with fleet({"fence": FENCE}) as lab:
        yield lab


def test_a_blackholed_rail_fences_only_its_own_port_and_comes_back(fenced_fleet):
    lab = fenced_fleet
    wait_no_problems("the aggregator's mesh on every host and rail",
                     lambda: mesh_problems(lab), MESH_S)
    wait_no_problems("every host's every rail UP before the fault",
                     lambda: not_up(api_cells(lab)), PAGE_S)
    victim = lab.hosts[0]
    port = victim.rail(0).port
    bystanders = [h.name for h in lab.hosts if h is not victim]
    dst = lab.hosts[1].rail(0).address
    for host in lab.hosts:  # a healthy start: nothing fenced, nothing ever was
        infos = fences(lab, host.name)
        assert sorted(infos) == sorted(r.port for r in host.rails), describe(infos)
        assert all(f.state == "ARMED" and f.fences == 0 for f in infos.values()), (
            f"{host.name} before the fault: {describe(infos)}")
        assert not fence_events(lab, host.name), host.name

    fault = SilentBlackhole(lab, victim.name, 0)
    fault.inject()
    injected = time.monotonic()
    fenced_at = None
    try:
        while fenced_at is None or time.monotonic() - injected < fenced_at + FAIL_TEST_S:
            now = time.monotonic()
            held = [f"{name} {p} at +{now - injected:.2f}s: {describe({p: f})}"
                    for name in bystanders for p, f in fences(lab, name).items()
                    if f.state in HOLDING or f.fences]
            assert not held, "bystanders fenced:\n  " + "\n  ".join(held)
            mine = fences(lab, victim.name)
            if fenced_at is None and mine[port].state == "FENCED":
                fenced_at = now - injected
                assert not admin_up(lab, victim.name, port), f"{port} FENCED but admin up"
                assert routed_dev(lab, victim.name, dst, victim.rail(0).address) \
                    == victim.rail(1).port
            if fenced_at is None and now - injected > FENCED_WITHIN_S:
                pytest.fail(f"{victim.name} {port} not fenced within {FENCED_WITHIN_S:g} s of a "
                            f"silent blackhole (3 mesh peers down, a free leaf): "
                            f"{describe(mine)}")
            time.sleep(POLL_S)
        at_clear = fences(lab, victim.name)[port]
    finally:
        fault.clear()
    cleared = time.monotonic()
    assert fenced_at is not None
    # Its test during the fault failed: it was never unfenced while the fault lasted.
    names = [e.name for e in fence_events(lab, victim.name)]
    assert "fence_fence" in names and "fence_unfence" not in names, names
    assert at_clear.state in HOLDING, describe({port: at_clear})
    assert at_clear.backoff_s > FENCE["backoff_initial_s"], (
        f"the test during the fault should have failed and doubled the backoff: "
        f"{describe({port: at_clear})}")

    # Back within what the fence's own timers allow from here: the wait left
    # (or, if a test was running at the clear and fails, the next doubled
    # backoff), one test, and slack.
    left = max(0.0, at_clear.until - time.time())
    if at_clear.state == "TESTING":
        left += min(2 * at_clear.backoff_s, FENCE["backoff_max_s"])
    bound = left + FENCE["test_timeout_s"] + SLACK_S
    deadline = cleared + bound
    while True:
        infos = {h.name: fences(lab, h.name) for h in lab.hosts}
        held = [f"{h} {p}: {f.state}" for h, ports in infos.items() for p, f in ports.items()
                if f.state in HOLDING]
        if not held and admin_up(lab, victim.name, port):
            break
        if time.monotonic() > deadline:
            pytest.fail(f"fences not over within {bound:.1f} s of the clear: {held}; "
                        f"{victim.name}: {describe(infos[victim.name])}")
        time.sleep(POLL_S)
    unfenced_after = time.monotonic() - cleared
    assert infos[victim.name][port].state == "ARMED", describe(infos[victim.name])
    # The victim's record: held back until its leaf's grant came (the ask),
    # fenced, tested and fenced again while the fault lasted, unfenced after.
    events = [e for e in fence_events(lab, victim.name) if e.port == port]
    names = [e.name for e in events]
    assert names[-1] == "fence_unfence", names
    first_fence = names.index("fence_fence")
    asks = [e for e in events[:first_fence] if e.name == "fence_held"]
    assert asks and all(e.fields["reason"].startswith("no leaf grant yet") for e in asks), (
        f"the fence should have waited for its leaf's grant: {[e.message for e in events]}")
    assert "fence_refence" in names[first_fence:], names
    t0 = events[0].monotonic_s
    timeline = ", ".join(f"{e.name} +{e.monotonic_s - t0:.2f}s" for e in events)
    # ... and its traffic back on its own rail, after the usual rise and hold-down
    wait_no_problems("every host's every rail UP after the unfence",
                     lambda: not_up(api_cells(lab)), PAGE_S)
    assert routed_dev(lab, victim.name, dst, victim.rail(0).address) == port
    for name in bystanders:  # never anything: not a fence, not a held one
        assert not fence_events(lab, name), (name, [e.message for e in fence_events(lab, name)])
        assert all(f.fences == 0 for f in fences(lab, name).values()), name
        assert all(admin_up(lab, name, r.port) for r in lab.host(name).rails), name
    print(f"\n{victim.name} {port}: fenced {fenced_at:.2f} s after the injection; "
          f"at the clear ({cleared - injected:.1f} s) {at_clear.state}, backoff {at_clear.backoff_s:g} s, "
          f"{at_clear.fences} fence(s); unfenced {unfenced_after:.2f} s after the clear "
          f"(bound {bound:.1f} s); bystanders: 0 fences, 0 fence events\n{victim.name} {port}: {timeline}")
