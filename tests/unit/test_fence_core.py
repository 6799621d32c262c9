"""core.fence: the per-port fence state machine, on simulated time."""

from __future__ import annotations

import itertools

import pytest

from linkpassd.core import fence
from linkpassd.core.fence import TRANSITIONS, Action, Gate, Sight, State
from linkpassd.core.model import Assessment, FenceSettings, PortState, Verdict

CFG = FenceSettings(enabled=True, fence_after_s=5.0, backoff_initial_s=30.0, backoff_max_s=120.0,
                    test_window_s=3.0, test_timeout_s=15.0, max_fenced=1, lift_hold_s=600.0,
                    require_leaf_grant=False)

UP = Sight(Verdict.UP, carrier=True, evidence=Verdict.UP)
# blackhole: carrier, probes down, evidence that points at the port (core.fence.singled_out)
DEAD = Sight(Verdict.DOWN, carrier=True, evidence=Verdict.DOWN, singled_out=True)
ADMIN_DOWN = Sight(Verdict.DOWN, carrier=False)  # what a fenced port looks like


class Run:
    """A host's ports on simulated time, stepped every `dt` seconds."""

    def __init__(self, ports=("p0", "p1"), cfg=CFG, gates=None):
        self.ports = list(ports)
        self.cfg = cfg
        self.gates = gates or {}
        self.fences: dict[str, fence.Fence] = {}
        self.steps: list[tuple[float, fence.Step]] = []
        self.now = 0.0

    def run(self, seconds: float, sights: dict[str, Sight], dt: float = 0.1):
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.now = round(self.now + dt, 6)
            self.fences, steps = fence.step(self.fences, sights, self.cfg, self.gates, self.now,
                                            self.ports)
            self.steps += [(self.now, s) for s in steps]

    def state(self, port: str) -> State:
        return self.fences[port].state

    def actions(self, port: str) -> list[tuple[float, Action]]:
        return [(t, s.action) for t, s in self.steps
                if s.port == port and s.action is not Action.NONE]


def test_every_transition_names_a_trigger_of_its_state():
    for (state, trigger) in TRANSITIONS:
        assert trigger in fence._TRIGGERS[state], (state, trigger)
    for state, triggers in fence._TRIGGERS.items():
        for trigger in triggers:
            assert (state, trigger) in TRANSITIONS, (state, trigger)


def test_never_fences_before_fence_after():
    r = Run()
    r.run(4.9, {"p0": DEAD, "p1": UP})
    assert r.state("p0") is State.CONFIRMING
    assert r.actions("p0") == []
    r.run(0.3, {"p0": DEAD, "p1": UP})
    assert r.state("p0") is State.FENCED
    ((t, action),) = r.actions("p0")
    assert action is Action.FENCE and 5.0 <= t <= 5.2


def test_failures_shorter_than_fence_after_never_fence_however_often():
    r = Run()
    for _ in range(50):  # 4.5 s down, 1 s up, 50 times
        r.run(4.5, {"p0": DEAD, "p1": UP})
        r.run(1.0, {"p0": UP, "p1": UP})
    assert r.actions("p0") == []
    assert r.state("p0") is State.ARMED


def test_a_down_verdict_in_its_hold_down_is_not_a_failure():
    """The probes are UP again, the verdict waits out its hold-down: a hiccup
    of 1 s plus a hold-down of 10 s never reaches fence_after_s 5."""
    recovering = Sight(Verdict.DOWN, carrier=True, evidence=Verdict.UP)
    r = Run()
    for _ in range(10):
        r.run(1.0, {"p0": DEAD, "p1": UP})
        r.run(10.0, {"p0": recovering, "p1": UP})
        r.run(1.0, {"p0": UP, "p1": UP})
    assert r.actions("p0") == []


def test_carrier_loss_or_drain_or_degraded_or_no_probe_word_is_not_fenced():
    r = Run()
    r.run(60, {"p0": Sight(Verdict.DOWN, carrier=True, evidence=None), "p1": UP})
    r.run(60, {"p0": Sight(Verdict.DOWN, carrier=True, evidence=Verdict.DEGRADED), "p1": UP})
    r.run(60, {"p0": Sight(Verdict.DOWN, carrier=False), "p1": UP})
    r.run(60, {"p0": Sight(Verdict.DOWN, carrier=True, drained=True), "p1": UP})
    r.run(60, {"p0": Sight(Verdict.DEGRADED, carrier=True), "p1": UP})
    assert r.actions("p0") == []


def test_down_evidence_that_does_not_single_the_port_out_is_not_fenced():
    """A rail whose only echo peer is dead reads DOWN exactly as a dead rail
    does: the lone peer's host may be the one that failed."""
    r = Run()
    r.run(120, {"p0": Sight(Verdict.DOWN, carrier=True, evidence=Verdict.DOWN), "p1": UP})
    assert r.actions("p0") == [] and r.state("p0") is State.ARMED


def _echo(verdict, peers):
    return ("echo", Assessment("echo", verdict, "down" if verdict is Verdict.DOWN else "ok",
                               witnesses=peers))


def _bfd(verdict):
    return ("bfd:leaf", Assessment("bfd:leaf", verdict, "down" if verdict is Verdict.DOWN
                                   else "up"))


@pytest.mark.parametrize("probes, min_peers, singled", [
    ([_echo(Verdict.DOWN, 1)], 2, False),  # one peer: its failure or ours
    ([_echo(Verdict.DOWN, 2)], 2, True),  # every one of two peers down through this port
    ([_echo(Verdict.DOWN, 3)], 2, True),
    ([_echo(Verdict.DOWN, 1)], 1, True),  # the operator says the one peer is the leaf itself
    ([_bfd(Verdict.DOWN)], 2, True),  # single hop with the leaf: the link or the leaf
    ([_echo(Verdict.DOWN, 1), _bfd(Verdict.UP)], 2, False),
    ([_echo(Verdict.DOWN, 1), _bfd(Verdict.DOWN)], 2, True),
    ([_echo(Verdict.UP, 3)], 2, False),
    ([_echo(Verdict.DEGRADED, 3)], 2, False),
    ([], 2, False),
])
def test_singled_out_needs_the_leaf_or_more_than_one_peer(probes, min_peers, singled):
    assert fence.singled_out(probes, "echo", min_peers) is singled


def test_never_the_last_healthy_rail():
    r = Run()
    r.run(60, {"p0": DEAD, "p1": Sight(Verdict.DEGRADED, carrier=True)})
    assert r.actions("p0") == [] and r.actions("p1") == []
    assert "no other rail is healthy" in r.fences["p0"].held
    # both dead: neither is fenced
    r.run(60, {"p0": DEAD, "p1": DEAD})
    assert r.actions("p0") == [] and r.actions("p1") == []


def test_a_fence_is_released_when_the_other_rail_fails():
    r = Run()
    r.run(6, {"p0": DEAD, "p1": UP})
    assert r.state("p0") is State.FENCED
    r.run(0.1, {"p0": ADMIN_DOWN, "p1": DEAD})
    assert r.state("p0") is State.LIFTED
    assert r.actions("p0")[-1][1] is Action.RELEASE


def test_host_cap_counts_fences_of_the_same_pass():
    r = Run(ports=("p0", "p1", "p2", "p3"), cfg=FenceSettings(**{**CFG.__dict__, "max_fenced": 2}))
    r.run(10, {"p0": DEAD, "p1": DEAD, "p2": DEAD, "p3": UP})
    fenced = [p for p in r.ports if r.state(p) is State.FENCED]
    assert fenced == ["p0", "p1"]
    assert r.state("p2") is State.CONFIRMING and "host cap" in r.fences["p2"].held


def test_leaf_gate_holds_the_fence_and_says_why():
    r = Run(gates={"p0": Gate(False, "leaf L1: 3 of 3 fences in use")})
    r.run(30, {"p0": DEAD, "p1": UP})
    assert r.actions("p0") == []
    assert r.fences["p0"].held == "leaf L1: 3 of 3 fences in use"


def test_held_back_by_the_leaf_alone_is_an_ask_and_says_so_in_the_phase():
    r = Run(gates={"p0": Gate(False, "no grant")})
    r.run(6, {"p0": DEAD, "p1": UP})
    assert r.fences["p0"].asking
    states = {p: PortState(p, Verdict.DOWN if p == "p0" else Verdict.UP, True, "X", 0.0)
              for p in ("p0", "p1")}
    assert fence.overlay(states, r.fences)["p0"].phase == fence.ASKING_PHASE
    assert fence.overlay(states, r.fences)["p1"].phase == "X"
    # granted: fenced, and no longer asking
    r.gates = {"p0": Gate(True)}
    r.run(0.1, {"p0": DEAD, "p1": UP})
    assert r.state("p0") is State.FENCED and not r.fences["p0"].asking
    # held back by the host's own checks: not an ask (the aggregator cannot help)
    r2 = Run(gates={"p0": Gate(False, "no grant")})
    r2.run(6, {"p0": DEAD, "p1": Sight(Verdict.DEGRADED, carrier=True)})
    assert not r2.fences["p0"].asking


def test_backoff_then_test_then_unfence_on_own_evidence():
    r = Run()
    r.run(5.1, {"p0": DEAD, "p1": UP})
    assert r.state("p0") is State.FENCED
    fenced_at = r.actions("p0")[0][0]
    r.run(29.8, {"p0": ADMIN_DOWN, "p1": UP})
    assert r.state("p0") is State.FENCED
    r.run(0.3, {"p0": ADMIN_DOWN, "p1": UP})
    assert r.state("p0") is State.TESTING
    test_at = r.actions("p0")[-1][0]
    assert test_at - fenced_at == pytest.approx(30.0, abs=0.11)
    # up, carrier, the health verdict may even be UP: no evidence from probes yet, no unfence
    r.run(5, {"p0": Sight(Verdict.UP, carrier=True, evidence=None), "p1": UP})
    assert r.state("p0") is State.TESTING
    r.run(2.9, {"p0": Sight(Verdict.DOWN, carrier=True, evidence=Verdict.UP), "p1": UP})
    assert r.state("p0") is State.TESTING
    r.run(0.2, {"p0": Sight(Verdict.DOWN, carrier=True, evidence=Verdict.UP), "p1": UP})
    assert r.state("p0") is State.ARMED
    assert r.actions("p0")[-1][1] is Action.UNFENCE


def test_a_broken_run_of_evidence_starts_the_window_again_and_fails_the_test():
    r = Run()
    r.run(5.1, {"p0": DEAD, "p1": UP})
    r.run(30, {"p0": ADMIN_DOWN, "p1": UP})
    assert r.state("p0") is State.TESTING
    r.run(2, {"p0": Sight(Verdict.DOWN, carrier=True, evidence=Verdict.UP), "p1": UP})
    r.run(0.1, {"p0": DEAD, "p1": UP})  # bad again after UP: fails at once
    assert r.state("p0") is State.FENCED
    assert r.actions("p0")[-1][1] is Action.REFENCE
    assert r.fences["p0"].backoff_s == 60.0


def test_backoff_doubles_up_to_the_max_while_the_fault_stays():
    r = Run()
    r.run(5.1, {"p0": DEAD, "p1": UP})
    backoffs = []
    for _ in range(5):
        backoffs.append(r.fences["p0"].backoff_s)
        r.run(r.fences["p0"].until - r.now + 0.1, {"p0": ADMIN_DOWN, "p1": UP})
        assert r.state("p0") is State.TESTING
        r.run(15.1, {"p0": DEAD, "p1": UP})  # no proof within test_timeout_s
        assert r.state("p0") is State.FENCED
    assert backoffs == [30.0, 60.0, 120.0, 120.0, 120.0]
    assert all(a in (Action.FENCE, Action.TEST, Action.REFENCE) for _, a in r.actions("p0"))


def test_a_port_failing_again_soon_after_its_fence_keeps_the_doubled_backoff():
    r = Run()
    r.run(5.1, {"p0": DEAD, "p1": UP})
    r.run(30, {"p0": ADMIN_DOWN, "p1": UP})
    r.run(15.1, {"p0": DEAD, "p1": UP})  # failed test: 60
    r.run(60, {"p0": ADMIN_DOWN, "p1": UP})
    r.run(3.2, {"p0": UP, "p1": UP})
    assert r.state("p0") is State.ARMED
    r.run(10, {"p0": DEAD, "p1": UP})
    assert r.fences["p0"].backoff_s == 120.0
    r2 = Run()
    r2.run(5.1, {"p0": DEAD, "p1": UP})
    r2.run(30.1, {"p0": ADMIN_DOWN, "p1": UP})
    r2.run(3.2, {"p0": UP, "p1": UP})
    r2.run(200, {"p0": UP, "p1": UP})  # longer than backoff_max_s: forgotten
    r2.run(6, {"p0": DEAD, "p1": UP})
    assert r2.fences["p0"].backoff_s == 30.0


def test_operator_lift_holds_off_until_trusted_or_the_hold_ends():
    r = Run()
    r.run(5.1, {"p0": DEAD, "p1": UP})
    r.fences["p0"] = fence.lift(r.fences["p0"], 100.0, r.now)
    r.run(0.1, {"p0": ADMIN_DOWN, "p1": UP})
    assert r.state("p0") is State.LIFTED
    assert r.actions("p0")[-1][1] is Action.RELEASE
    r.run(99, {"p0": DEAD, "p1": UP})  # still dead, but lifted: not fenced again
    assert r.state("p0") is State.LIFTED
    r.run(1.1, {"p0": DEAD, "p1": UP})
    assert r.state("p0") in (State.ARMED, State.CONFIRMING)
    r.run(5.1, {"p0": DEAD, "p1": UP})
    assert r.state("p0") is State.FENCED
    # trusted again ends a lift early
    r.fences["p0"] = fence.lift(r.fences["p0"], 1000.0, r.now)
    r.run(0.1, {"p0": ADMIN_DOWN, "p1": UP})
    r.run(0.1, {"p0": UP, "p1": UP})
    assert r.state("p0") is State.ARMED


def test_resumed_port_is_tested_not_trusted():
    f = fence.resumed("p0", 60.0, CFG, now=100.0)
    assert f.state is State.TESTING and f.backoff_s == 60.0
    fences, _ = fence.step({"p0": f}, {"p0": DEAD, "p1": UP}, CFG, {}, 115.1, ["p0", "p1"])
    assert fences["p0"].state is State.FENCED and fences["p0"].backoff_s == 120.0


def test_turned_off_releases_held_ports():
    r = Run()
    r.run(5.1, {"p0": DEAD, "p1": UP})
    off = FenceSettings(**{**CFG.__dict__, "enabled": False})
    fences, steps = fence.step(r.fences, {"p0": ADMIN_DOWN, "p1": UP}, off, {}, r.now + 1)
    assert fences["p0"].state is State.ARMED
    assert [s.action for s in steps] == [Action.RELEASE]


def test_disabled_never_acts():
    r = Run(cfg=FenceSettings())
    r.run(100, {"p0": DEAD, "p1": UP})
    assert r.steps == []


def test_overlay_keeps_routes_away_while_fenced_or_testing():
    states = {p: PortState(p, Verdict.UP, True, "UP", 0.0) for p in ("p0", "p1")}
    for st in (State.FENCED, State.TESTING):
        out = fence.overlay(states, {"p0": fence.Fence("p0", st, reason="x")})
        assert out["p0"].verdict is Verdict.DOWN and out["p1"].verdict is Verdict.UP
    for st in (State.ARMED, State.CONFIRMING, State.LIFTED):
        assert fence.overlay(states, {"p0": fence.Fence("p0", st)})["p0"].verdict is Verdict.UP


@pytest.mark.parametrize("dead_for", [0.1, 1.0, 2.0, 4.9])
def test_random_hiccups_below_fence_after_never_fence(dead_for):
    r = Run()
    for i in itertools.islice(itertools.count(), 40):
        r.run(dead_for, {"p0": DEAD, "p1": UP})
        r.run(0.1 + (i % 3), {"p0": UP, "p1": UP})
    assert r.actions("p0") == []


def test_probes_coming_back_after_carrier_returns_are_not_a_failure():
    """A cable pull: the leaf saw it (carrier). When the cable is back, the
    port's BFD session needs up to core.bfd.BRING_UP_S at its slow-start
    rate to be Up again, and its DOWN meanwhile is no gray failure: no fence,
    however short fence_after_s is. A port still DOWN on its probes after
    that is a gray failure like any other (a reseated cable with a dead
    optic), counted from the end of the bring-up."""
    from linkpassd.core.bfd import BRING_UP_S

    cfg = FenceSettings(**{**vars(CFG), "fence_after_s": 0.5})
    r = Run(cfg=cfg)
    r.run(1.0, {"p0": UP, "p1": UP})
    r.run(3.0, {"p0": ADMIN_DOWN, "p1": UP})  # the pull: no carrier
    back = r.now
    r.run(BRING_UP_S - 0.2, {"p0": DEAD, "p1": UP})  # carrier back, BFD still coming up
    assert r.state("p0") is State.ARMED and r.actions("p0") == []
    r.run(1.0, {"p0": UP, "p1": UP})  # BFD up: healed, never fenced
    assert r.actions("p0") == []
    # the same pull, but the probes never come back: fenced once the
    # bring-up and then fence_after_s have passed
    r.run(3.0, {"p0": ADMIN_DOWN, "p1": UP})
    back = r.now
    r.run(BRING_UP_S + cfg.fence_after_s + 0.5, {"p0": DEAD, "p1": UP})
    ((at, action),) = r.actions("p0")
    assert action is Action.FENCE
    assert at >= back + BRING_UP_S + cfg.fence_after_s - 1e-6, (at, back)


def test_a_gray_failure_without_carrier_loss_still_fences_after_fence_after_only():
    cfg = FenceSettings(**{**vars(CFG), "fence_after_s": 0.5})
    r = Run(cfg=cfg)
    r.run(1.0, {"p0": UP, "p1": UP})
    start = r.now
    r.run(1.0, {"p0": DEAD, "p1": UP})
    ((at, action),) = r.actions("p0")
    assert action is Action.FENCE and at - start <= cfg.fence_after_s + 0.2
