"""A rail's probe verdict from its paths to several peers.

Apart from core.probe (one path's judgement) because it is a different
question: not "is this path dead" but "is our rail dead, or only some of
the peers behind it".
"""

from __future__ import annotations

from collections.abc import Iterable

from linkpassd.core.model import Assessment, Verdict


def rail_assessment(paths: Iterable[Assessment], name: str = "probe") -> Assessment:
    """Combine one rail's per-peer path assessments into one "probe" signal.

    A dead or restarting peer host must not fail our rail over: the rail is
    DOWN only when every peer that has an opinion is DOWN through it, and
    DEGRADED when most of them are degraded or down. Peers with no opinion
    (never up, unconfirmed suspicion) are no evidence of a fault, but a path
    still confirming keeps the rail from DOWN until it has (a rail with one
    dead peer and two paths that missed a probe at the same moment is not
    down yet: in the fleet lab such a rail failed over on its one confirmed
    peer), and counts as not bad for DEGRADED."""
    paths = list(paths)
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
    bad_paths = [a for a in judged if a.effective in (Verdict.DOWN, Verdict.DEGRADED)]
    bad = sorted(a.signal.removeprefix("probe:") for a in bad_paths)
    direction, which = _direction(bad_paths, ours=2 * len(bad) > len(judged) + len(confirming)
                                  or len(down) == len(judged))
    if len(down) == len(judged) and confirming:
        return Assessment(name, None, "suspect",
                          f"{len(down)} of {len(judged) + len(confirming)} peers unreachable "
                          f"({', '.join(down)}); confirming a missed probe towards "
                          + ", ".join(confirming))
    if len(down) == len(judged):
        return Assessment(name, Verdict.DOWN, "down",
                          f"all {len(judged)} peers unreachable: " + ", ".join(down) + which,
                          direction=direction, witnesses=len(judged))
    if 2 * len(bad) > len(judged) + len(confirming):
        return Assessment(name, Verdict.DEGRADED, "degraded",
                          f"{len(bad)} of {len(judged)} peers degraded or down: "
                          + ", ".join(bad) + which, direction=direction,
                          witnesses=len(judged))
    if bad:
        return Assessment(name, Verdict.UP, "ok",
                          f"{len(judged) - len(bad)} of {len(judged)} peers fine; "
                          f"trouble only towards {', '.join(bad)} (their side){which}",
                          direction=direction, witnesses=len(judged))
    return Assessment(name, Verdict.UP, "ok", f"all {len(judged)} peers answer",
                      witnesses=len(judged))


# What a direction shared by most of a rail's paths says about the rail (our side)...
_RAIL_WORDS = {
    "requests": "loss towards the peers, replies fine (our transmit direction)",
    "replies": "replies lost on the way back, requests reach the peers (our receive direction)",
    "both": "loss both ways",
}
# ...and by a few of them (their side).
_PEER_WORDS = {"requests": "loss towards {peers}, replies fine",
               "replies": "replies lost from {peers}, requests reach them",
               "both": "loss both ways with {peers}"}


def _direction(bad: list[Assessment], ours: bool) -> tuple[str, str]:
    """The direction the troubled paths share (core.direction's words) and
    a clause saying it (`ours`: as our rail's direction, else as the
    peers'), with each path's when they differ."""
    if not bad:
        return "", ""
    kinds = {a.direction or "unknown" for a in bad}
    if len(kinds) == 1:
        (kind,) = kinds
        if kind in _RAIL_WORDS:
            if ours:
                return kind, f"; {_RAIL_WORDS[kind]}"
            peers = ", ".join(sorted(a.signal.removeprefix("probe:") for a in bad))
            return kind, "; " + _PEER_WORDS[kind].format(peers=peers)
        return "unknown", ("; which way is unknown (nothing came back yet, or the peers keep "
                           "no receipts)")
    known = sorted(f"{a.signal.removeprefix('probe:')} {a.direction}" for a in bad
                   if a.direction in _RAIL_WORDS)
    return "unknown", ("; which way differs by peer (lost: " + ", ".join(known) + ")"
                       if known else "")
