"""One confirmation per rail, not one per path: how a rail-wide fault is judged
at the cost of a few probes, whatever the number of peers behind the rail.

A silent blackhole of a rail makes every path of that rail (one per peer) miss
its next steady probe within one interval. If each then confirmed its loss on
its own (core.probe: a burst of `burst_count` probes, plus witness probes),
128 peers meant ~1,000 extra probes and timers in ~10 ms: the event loop
stalled for 130 ms, and the lag guard (rightly) refused to count misses that
fell in the stall, so confirmation started again (issue 11). So, per rail:

* **At most `max_bursting` paths of a rail confirm at once.** A path that
  becomes suspect while they do *waits* (it keeps its steady probes; a reply
  still clears it); it bursts when a slot frees, unless the rail's verdict
  comes first.
* **A rail is dead when a path of it went DOWN by its own full confirmation,
  and since that path's first missed probe no path of the rail has heard any
  reply, and at least `evidence` other live paths of the rail lost a probe
  sent in that silence.** Then every live path of the rail is DOWN: a path
  over a dead rail cannot carry a conversation, whether or not its own steady
  probe has come round yet. A path whose own peer answered is never taken
  down this way: any reply on the rail ends the silence.
* **A rail with fewer live paths than `evidence` gets no rail verdict**: its
  other live paths are probed at once (`unconfirmed`), and each that misses
  confirms on its own, with its own burst and guards. Few paths cost little
  to confirm one by one, and one lost probe from each of two or three peers is
  weak evidence on a busy host, where a peer's reply can come later than a
  timeout (the fleet lab runs four daemons on two cores).
* Why that cannot fail a healthy rail more often than one path's confirmation
  could: the confirming path already needed `1 + burst_count` exchanges lost
  (and, core.probe, a live witness elsewhere, so the host itself is not what
  is silent); the rail verdict adds `evidence` more peers lost and no reply
  from any peer of the rail. Peers that die (host down) leave the other peers
  answering, and one reply clears the rail: only the dead peers' paths go DOWN,
  each by its own burst. The adapter pokes up to `evidence` live paths of the
  rail that have not lost a probe yet when its first path goes DOWN
  (`unconfirmed`), so a rail with few peers need not wait for their steady
  probes.

The paths are the adapter's keys (hashable); times are the caller's. Pure and
mutable (like core.stalls.StallLog): one per echo service, fed by its events.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable
from dataclasses import dataclass, field

MAX_BURSTING = 2  # paths of one rail confirming a loss at once
RAIL_EVIDENCE = 8  # other live paths of a rail that must have lost a probe in its silence


@dataclass
class _Rail:
    heard_at: float = float("-inf")  # latest reply on any path of the rail
    lost: dict[Hashable, float] = field(default_factory=dict)  # path -> a probe lost since heard_at
    bursting: set[Hashable] = field(default_factory=set)
    waiting: dict[Hashable, None] = field(default_factory=dict)  # suspects waiting, first in first
    silent_since: float | None = None  # a path went DOWN by its burst, first miss sent then


class RailWatch:
    """Burst slots, silences and verdicts of every rail (port) of a service."""

    def __init__(self, max_bursting: int = MAX_BURSTING, evidence: int = RAIL_EVIDENCE):
        if max_bursting < 1 or evidence < 1:
            raise ValueError(f"max_bursting and evidence must be >= 1, got {max_bursting!r}, "
                             f"{evidence!r}")
        self.max_bursting = max_bursting
        self.evidence = evidence
        self._rails: dict[Hashable, _Rail] = {}
        self.held = 0  # suspicions that waited for a slot (counters, for operators and tests)
        self.verdicts = 0  # rails judged dead

    def _rail(self, rail: Hashable) -> _Rail:
        r = self._rails.get(rail)
        if r is None:
            r = self._rails[rail] = _Rail()
        return r

    # ---------------------------------------------------------------- inputs

    def heard(self, rail: Hashable, at: float) -> None:
        """A reply reached a path of `rail` at `at`: the rail carries traffic."""
        r = self._rail(rail)
        if at <= r.heard_at:
            return
        r.heard_at = at
        if r.lost:
            r.lost = {k: s for k, s in r.lost.items() if s > at}
        if r.silent_since is not None and at >= r.silent_since:
            r.silent_since = None

    def lost(self, rail: Hashable, path: Hashable, sent_at: float) -> None:
        """A probe of `path` sent at `sent_at` was judged lost (not unknown)."""
        r = self._rail(rail)
        if sent_at > r.heard_at:
            r.lost[path] = max(sent_at, r.lost.get(path, sent_at))

    def suspect(self, rail: Hashable, path: Hashable) -> bool:
        """`path` became suspect: True if it may confirm now, False if it must
        wait for a slot (or the rail's verdict)."""
        r = self._rail(rail)
        if path in r.bursting:
            return True
        if len(r.bursting) < self.max_bursting:
            r.waiting.pop(path, None)
            r.bursting.add(path)
            return True
        if path not in r.waiting:
            self.held += 1
            r.waiting[path] = None
        return False

    def settled(self, rail: Hashable, path: Hashable) -> list[Hashable]:
        """`path` is no longer suspect (cleared, DOWN, or gone). Returns the
        waiting paths that may confirm now, in the order they became suspect."""
        r = self._rail(rail)
        r.bursting.discard(path)
        r.waiting.pop(path, None)
        promoted = []
        while r.waiting and len(r.bursting) < self.max_bursting:
            nxt = next(iter(r.waiting))
            del r.waiting[nxt]
            r.bursting.add(nxt)
            promoted.append(nxt)
        return promoted

    def burst_lost(self, rail: Hashable, since: float) -> None:
        """A path of `rail` went DOWN by its own confirmation; its first missed
        probe was sent at `since`."""
        r = self._rail(rail)
        if since > r.heard_at:
            r.silent_since = since if r.silent_since is None else min(r.silent_since, since)

    def bursting(self, rail: Hashable, path: Hashable) -> bool:
        r = self._rails.get(rail)
        return r is not None and path in r.bursting

    def silent(self, rail: Hashable) -> bool:
        """A path of `rail` went DOWN by its burst and nothing was heard on the rail since."""
        r = self._rails.get(rail)
        return r is not None and r.silent_since is not None

    def forget(self, rail: Hashable, path: Hashable) -> list[Hashable]:
        """`path` is no longer probed. Returns the waiting paths that may confirm now."""
        r = self._rails.get(rail)
        if r is None:
            return []
        r.lost.pop(path, None)
        return self.settled(rail, path)

    # --------------------------------------------------------------- verdict

    def judges(self, live: Collection[Hashable]) -> bool:
        """Whether a rail with these `live` paths can get a rail verdict at
        all (else each of its paths confirms on its own)."""
        return len(live) >= self.evidence

    def dead(self, rail: Hashable, live: Collection[Hashable]) -> bool:
        """Whether `rail` is dead, given its `live` paths (UP or suspect, not
        DOWN nor never up): see the module docstring."""
        r = self._rails.get(rail)
        if r is None or r.silent_since is None or not self.judges(live):
            return False
        need = self.evidence
        have = 0
        for path in r.lost:  # every entry was sent after the rail's last reply
            if path in live:
                have += 1
                if have >= need:
                    return True
        return False

    def unconfirmed(self, rail: Hashable, live: Collection[Hashable]) -> list[Hashable]:
        """The live paths that still have to lose a probe for a verdict, at
        most as many as are missing (with fewer live paths than `evidence`:
        those that have not lost one yet, to confirm on their own). The
        adapter pokes them, so a rail with few peers need not wait for their
        steady probes."""
        r = self._rails.get(rail)
        if r is None or r.silent_since is None:
            return []
        missing = min(self.evidence, len(live)) - sum(1 for p in r.lost if p in live)
        return [p for p in live if p not in r.lost][:max(0, missing)]

    def concluded(self, rail: Hashable) -> None:
        """The rail was judged dead and its paths taken DOWN: start afresh."""
        r = self._rail(rail)
        self.verdicts += 1
        r.silent_since = None
        r.lost.clear()
        r.bursting.clear()
        r.waiting.clear()

    def snapshot(self, rail: Hashable) -> dict[str, object]:
        r = self._rails.get(rail) or _Rail()
        return {"bursting": len(r.bursting), "waiting": len(r.waiting), "lost": len(r.lost),
                "silent_since": r.silent_since, "heard_at": r.heard_at}
