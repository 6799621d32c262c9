"""A rail's probe verdict from its paths to several peers.

Apart from core.probe (one path's judgement) because it is a different
question: not "is this path dead" but "is our rail dead, or only some of
the peers behind it". core.probe re-exports it.
"""

from __future__ import annotations

from collections.abc import Iterable

from linkpassd.core.model import Assessment, Verdict


def fine(assessment: Assessment) -> bool:
    """Up and not confirming a loss: an opinion that the peer answers."""
    return assessment.effective is Verdict.UP and assessment.status != "suspect"


def peer_wide_trouble(paths: Iterable[tuple[Assessment, Iterable[Assessment]]]) -> frozenset[str]:
    """The signals of one rail's paths whose peer is in trouble on every rail:
    each item is a path's assessment and those of the same peer daemon's
    paths on our other rails. A path judged down or degraded whose every
    sibling is not fine either (down, degraded or confirming; a path still
    confirming itself is not set aside, it keeps the rail from DOWN until it
    has confirmed) names a peer that is stalled,
    restarting or gone, and says nothing about our rail. A peer reached on
    this rail only is never set aside: nothing tells its trouble from ours.
    (In the fleet lab a bystander failed a rail over because the faulted host
    and a stalled peer were both silent on it, and on its other rail too.)"""
    out = set()
    for path, siblings in paths:
        if path.effective is None or fine(path):
            continue  # only a verdict is set aside: a confirming path still holds the rail
        siblings = list(siblings)
        if siblings and not any(fine(s) for s in siblings):
            out.add(path.signal)
    return frozenset(out)


def rail_assessment(paths: Iterable[Assessment], name: str = "probe",
                    peer_wide: frozenset[str] = frozenset()) -> Assessment:
    """Combine one rail's per-peer path assessments into one "probe" signal.

    A dead or restarting peer host must not fail our rail over: the rail is
    DOWN only when every peer that has an opinion is DOWN through it, and
    DEGRADED when most of them are degraded or down. Peers with no opinion
    (never up, unconfirmed suspicion) are no evidence of a fault, but a path
    still confirming keeps the rail from DOWN until it has (a rail with one
    dead peer and two paths that missed a probe at the same moment is not
    down yet: in the fleet lab such a rail failed over on its one confirmed
    peer), and counts as not bad for DEGRADED. Paths in `peer_wide` (their
    peer is in trouble on every rail, see peer_wide_trouble) are set aside."""
    paths = list(paths)
    aside = sorted(a.signal.removeprefix("probe:") for a in paths if a.signal in peer_wide)
    if aside:
        paths = [a for a in paths if a.signal not in peer_wide]
        if not any(a.effective is not None or a.status == "suspect" for a in paths):
            return Assessment(name, None, "their side",
                              f"no reply from {', '.join(aside)} on any rail: the peers' "
                              "trouble, not this rail's"
                              + (f" ({len(paths)} more never up)" if paths else ""))
    judged = [a for a in paths if a.effective is not None]
    confirming = sorted(a.signal.removeprefix("probe:") for a in paths
                        if a.effective is None and a.status == "suspect")
    if not judged:
        suspect = sorted(a.signal.removeprefix("probe:") for a in paths if a.status == "suspect")
        if suspect:
            return Assessment(name, None, "suspect",
                              "confirming a missed probe towards " + ", ".join(suspect))
        return Assessment(name, None, "never up" if paths else "unsupported",
                          f"no peer has answered yet ({len(paths)} probed)")
    down = sorted(a.signal.removeprefix("probe:") for a in judged if a.effective is Verdict.DOWN)
    bad = sorted(a.signal.removeprefix("probe:") for a in judged
                 if a.effective in (Verdict.DOWN, Verdict.DEGRADED))
    if len(down) == len(judged) and confirming:
        return Assessment(name, None, "suspect",
                          f"{len(down)} of {len(judged) + len(confirming)} peers unreachable "
                          f"({', '.join(down)}); confirming a missed probe towards "
                          + ", ".join(confirming))
    if len(down) == len(judged):
        return Assessment(name, Verdict.DOWN, "down",
                          f"all {len(judged)} peers unreachable: " + ", ".join(down))
    if 2 * len(bad) > len(judged) + len(confirming):
        return Assessment(name, Verdict.DEGRADED, "degraded",
                          f"{len(bad)} of {len(judged)} peers degraded or down: " + ", ".join(bad))
    if bad:
        return Assessment(name, Verdict.UP, "ok",
                          f"{len(judged) - len(bad)} of {len(judged)} peers fine; "
                          f"trouble only towards {', '.join(bad)} (their side)")
    if aside:
        return Assessment(name, Verdict.UP, "ok",
                          f"all {len(judged)} peers answer; set aside, silent on every rail "
                          f"(their side): {', '.join(aside)}")
    return Assessment(name, Verdict.UP, "ok", f"all {len(judged)} peers answer")
