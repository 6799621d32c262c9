"""Which of our paths one peer daemon answers, and which of them are
confirming a loss: what ordering evidence (core.probe: Prober.peer_answered)
needs from the service.

Every reply carries the responder's id, one per peer daemon (it answers on
all the peer's rail addresses). A responder answers requests in the order
they reach it, so when it answers a probe we sent on one path after the
confirmation probes of another path to it, those confirmation probes, still
unanswered a moment later, were lost on their path: the peer was not
stalled (a stalled peer answers nothing later either). This keeps, per
responder, its paths and those confirming, so a reply costs one lookup, and
names the witness a confirmation pokes after its last probe: another path
to the same peer, another rail first (a rail fault would silence a witness
on its own rail too).

The paths are the adapter's keys (hashable); pure and mutable, like
core.railwatch.RailWatch.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable


class PeerWatch:
    def __init__(self) -> None:
        self._paths: dict[int, set[Hashable]] = {}  # responder id -> the paths it answers
        self._of: dict[Hashable, int] = {}  # path -> the responder that last answered it
        self._confirming: dict[int, set[Hashable]] = {}  # responder id -> paths confirming

    def responder(self, path: Hashable) -> int | None:
        return self._of.get(path)

    def answered(self, path: Hashable, responder_id: int) -> Iterable[Hashable]:
        """A reply from `responder_id` reached `path`: the paths (other than
        `path`) confirming a loss towards the same responder, to be told."""
        if self._of.get(path) != responder_id:
            self._move(path, responder_id)
        confirming = self._confirming.get(responder_id)
        if not confirming:
            return ()
        return [p for p in confirming if p is not path]

    def confirming(self, path: Hashable, on: bool) -> None:
        """`path` started (on) or ended a confirmation (only paths with a known
        responder can use ordering evidence; the others wait for timeouts)."""
        rid = self._of.get(path)
        if rid is None:
            return
        group = self._confirming.get(rid)
        if on:
            if group is None:
                group = self._confirming[rid] = set()
            group.add(path)
        elif group is not None:
            group.discard(path)
            if not group:
                del self._confirming[rid]

    def witness(self, path: Hashable, rail_of: Callable[[Hashable], Hashable],
                usable: Callable[[Hashable], bool]) -> Hashable | None:
        """A usable path to the same responder as `path`, on another rail if
        there is one (None: none, or the responder is not known yet)."""
        rid = self._of.get(path)
        if rid is None:
            return None
        rail, same_rail = rail_of(path), None
        for other in self._paths.get(rid, ()):
            if other is path or not usable(other):
                continue
            if rail_of(other) != rail:
                return other
            same_rail = same_rail or other
        return same_rail

    def forget(self, path: Hashable) -> None:
        self.confirming(path, False)
        rid = self._of.pop(path, None)
        if rid is not None:
            self._leave(path, rid)

    def _move(self, path: Hashable, rid: int) -> None:
        old = self._of.get(path)
        was_confirming = old is not None and path in self._confirming.get(old, ())
        if old is not None:
            self.confirming(path, False)
            self._leave(path, old)
        self._of[path] = rid
        self._paths.setdefault(rid, set()).add(path)
        if was_confirming:
            self.confirming(path, True)

    def _leave(self, path: Hashable, rid: int) -> None:
        group = self._paths.get(rid)
        if group is not None:
            group.discard(path)
            if not group:
                del self._paths[rid]
