"""A rail's verdict when a peer is in trouble on every rail (core.railverdict):
such a peer is set aside, so a stalled or dead peer host cannot fail our
rail over, while a fault of our own rail (its peers fine on the other rails)
still does."""

from __future__ import annotations

from linkpassd.core.model import Assessment, Verdict
from linkpassd.core.railverdict import peer_wide_trouble, rail_assessment

RAILS = ("198.18.0", "198.18.1")


def path(addr: str, severity: Verdict | None, status: str = "x") -> Assessment:
    return Assessment(f"probe:{addr}", severity, status, confirmed=status != "suspect")


def host_view(states: dict[str, tuple[Verdict | None, Verdict | None]]) -> dict[str, list]:
    """Per rail, its paths: `states` maps a peer's host number to its
    verdict on rail 0 and on rail 1 (one responder answers both)."""
    rails = {r: [path(f"{r}.{h}", v[i]) for h, v in states.items()]
             for i, r in enumerate(RAILS)}
    return rails


def judged(rails: dict[str, list], rail: str, aside: bool = True) -> Assessment:
    others = [r for r in rails if r != rail]
    paths = rails[rail]
    items = [(a, [rails[o][i] for o in others]) for i, a in enumerate(paths)]
    return rail_assessment(paths, "echo", peer_wide_trouble(items) if aside else frozenset())


def test_a_bystander_keeps_its_rails_when_the_faulted_host_and_a_stalled_peer_are_silent():
    """The fleet lab's bystander: peer 9 (faulted) and peer 7 (stalled)
    silent on both rails, peer 3 fine: 2 of 3 bad was DEGRADED, a failover."""
    D, U = Verdict.DOWN, Verdict.UP
    rails = host_view({"3": (U, U), "7": (D, D), "9": (D, D)})
    assert judged(rails, RAILS[0], aside=False).effective is Verdict.DEGRADED  # before
    for rail in RAILS:
        verdict = judged(rails, rail)
        assert verdict.effective is Verdict.UP, verdict
        assert f"{rail}.7" in verdict.detail and f"{rail}.9" in verdict.detail


def test_our_own_dead_rail_is_still_down_when_its_peers_answer_on_the_other():
    D, U = Verdict.DOWN, Verdict.UP
    rails = host_view({"3": (D, U), "7": (D, U), "9": (D, U)})
    assert judged(rails, RAILS[0]).effective is Verdict.DOWN
    assert judged(rails, RAILS[1]).effective is Verdict.UP
    # A peer still confirming on the other rail is not fine there: set aside
    # only while every rail's path to it is in trouble.
    rails = host_view({"3": (D, U), "7": (D, U), "9": (D, None)})
    rails[RAILS[1]][2] = path(f"{RAILS[1]}.9", Verdict.DOWN, "suspect")
    assert peer_wide_trouble([(rails[RAILS[0]][2], [rails[RAILS[1]][2]])]) == \
        frozenset({f"probe:{RAILS[0]}.9"})
    assert judged(rails, RAILS[0]).effective is Verdict.DOWN  # 3 and 7 say it is our rail


def test_a_path_still_confirming_is_not_set_aside_and_keeps_the_rail_from_down():
    """The fleet lab's stalled bystander: every path suspect at once, one
    confirmed DOWN (its sibling answered). The others, confirming on both
    rails, are no verdict to set aside: the rail waits for them."""
    D, U = Verdict.DOWN, Verdict.UP
    rail0 = [path("198.18.0.3", D), path("198.18.0.5", D, "suspect"),
             path("198.18.0.7", D, "suspect")]
    rail1 = [path("198.18.1.3", U), path("198.18.1.5", D, "suspect"),
             path("198.18.1.7", D, "suspect")]
    items = [(a, [b]) for a, b in zip(rail0, rail1)]
    assert peer_wide_trouble(items) == frozenset()
    verdict = rail_assessment(rail0, "echo", peer_wide_trouble(items))
    assert verdict.effective is None and verdict.status == "suspect"
    never = path("198.18.0.9", None, "never up")
    assert peer_wide_trouble([(never, [path("198.18.1.9", None, "never up")])]) == frozenset()


def test_a_peer_reached_on_one_rail_only_is_never_set_aside():
    lone = path("198.18.0.5", Verdict.DOWN)
    assert peer_wide_trouble([(lone, [])]) == frozenset()
    assert rail_assessment([lone], "echo", peer_wide_trouble([(lone, [])])).effective \
        is Verdict.DOWN


def test_a_rail_whose_every_peer_is_in_trouble_everywhere_has_no_opinion():
    D = Verdict.DOWN
    rails = host_view({"3": (D, D), "7": (D, D)})
    verdict = judged(rails, RAILS[0])
    assert verdict.effective is None and verdict.status == "their side"
    assert "198.18.0.3" in verdict.detail and "198.18.0.7" in verdict.detail
