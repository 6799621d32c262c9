"""Gray failures: the link stays up and packets die, in the leaf only.

Rules live in the leaf's namespace, in table ``netdev lp_fault``, on base
chains bound to the leaf's host-facing port: the ``ingress`` hook drops
host->leaf, the ``egress`` hook (Linux >= 5.16; checked on 6.18) drops
leaf->host. Both hooks see every frame, ARP included, as a failing optic
would. Each fault owns its chains (named after the fault), counts what it saw
and dropped, and deletes its chains (and the table once empty) on clear.

Timing: the rules are installed first, armed but matching nothing: they
drop only while the port's interface group is the fault's own group number.
inject() then sets that group and clear() sets it back to 0, each with one
netlink request on a socket the lab opened once in the leaf (no process
started, nothing for nft to parse or commit), stamped right before it and
right after the kernel's acknowledgement. Call arm() before the trial to
install the rules ahead of time (they then stay until disarm() or the lab's
teardown, and counters add up over every injection); without it inject()
installs them itself and clear() removes them, as it always did.

What a drop does to the node that sent the frame: a frame dropped at
another node's ingress, or a forwarded frame dropped at egress, is simply
gone, as on a broken wire. A frame the node itself sent and its own egress
hook drops is not: the kernel returns NET_XMIT_DROP to the sender, which a
UDP socket with IP_RECVERR (linkpassd's) receives as ENOBUFS (measured on
6.18: 289 of 1,000 datagrams refused, none of them sent; a ping retries
them and loses none). An ``ip``/``inet`` postrouting drop is refused too
(EPERM). Either tells the host what a failing transmitter never does, so a
fault on a node's own transmit direction (HostPortLoss host_to_leaf)
diverts the frames instead (``fwd to "lo"``: the hook has stolen the frame,
the send succeeds, and the node's loopback discards a frame addressed to
another MAC), see ``verdicts``.
"""

from __future__ import annotations

import itertools
import json

from labs.faults.base import Fault
from labs.topos.lab import Lab
from labs.topos.plan import HostPlan, LabError

TABLE = "lp_fault"
HOOKS = {"host_to_leaf": "ingress", "leaf_to_host": "egress"}
GROUP_MATCH = {"ingress": "iifgroup", "egress": "oifgroup"}
GROUP_BASE = 0x4C500000  # "LP": interface group numbers that arm lab faults
_serial = itertools.count(1)


class NftFault(Fault):
    """Drop rules on the leaf's host-facing port, per direction. One nft
    fault per port at a time (the port has one interface group)."""

    kind = "nft"
    # direction -> the hook that sees it at the port the rules go on (the
    # leaf's host-facing port here; a fault elsewhere maps its own).
    hooks = HOOKS
    # direction -> what the armed rule does to a matching frame ("drop"
    # unless named here; see the module doc for the node's own transmit).
    verdicts: dict[str, str] = {}

    def __init__(self, lab: Lab, host: str | int | HostPlan, rail: int | str,
                 directions: tuple[str, ...] = ("host_to_leaf", "leaf_to_host")):
        super().__init__(lab, host, rail)
        self._init_rules(self.rail.leaf, self.rail.leaf_port, directions)

    def _init_rules(self, node: str, port: str, directions: tuple[str, ...]) -> None:
        """Where the rules go: ``node``'s ``port`` (the leaf's host-facing
        port here; a fabric-link fault passes its own)."""
        self.node, self.port = node, port
        for d in directions:
            if d not in self.hooks:
                raise LabError(f"direction must be one of {', '.join(self.hooks)}, got {d!r}")
        self.directions = tuple(directions)
        serial = next(_serial)
        self.tag = f"{self.kind.replace('-', '_')}{serial}"
        self.group = GROUP_BASE + serial
        self.final_counts: dict[str, dict[str, int]] | None = None
        self._armed_by_inject = False

    def chain(self, direction: str) -> str:
        return f"{self.tag}_{self.hooks[direction]}"

    def _match(self) -> str:
        """nft expressions between the group match and ``counter drop``."""
        return ""

    def _arm(self) -> None:
        script = [f"add table netdev {TABLE}"]
        for d in self.directions:
            hook, chain = self.hooks[d], self.chain(d)
            armed = f"meta {GROUP_MATCH[hook]} {self.group}"
            script += [
                f'add chain netdev {TABLE} {chain} {{ type filter hook {hook} '
                f'device "{self.port}" priority 0; policy accept; }}',
                f'add rule netdev {TABLE} {chain} {armed} counter comment "seen"',
                f'add rule netdev {TABLE} {chain} {armed} {self._match()} counter '
                f'{self.verdicts.get(d, "drop")} comment "dropped"',
            ]
        self.final_counts = None
        self.lab.nft(self.node, "\n".join(script) + "\n")

    def _disarm(self) -> None:
        self.final_counts = self._read_counts()
        self.lab.nft(self.node, "".join(f"delete chain netdev {TABLE} {self.chain(d)}\n"
                                        for d in self.directions))
        if not self._chains_left():
            self.lab.nft(self.node, f"delete table netdev {TABLE}\n")

    def _inject(self) -> float:
        for other in self.lab._faults:
            if other is not self and other.active and isinstance(other, NftFault) \
                    and (other.node, other.port) == (self.node, self.port):
                raise LabError(f"{self.description}: {other} is already on this port")
        self._armed_by_inject = not self.armed
        self.arm()
        stamp, self.inject_acked_at = self.lab.set_link_timed(self.node, self.port,
                                                              group=self.group)
        return stamp

    def _clear(self) -> float:
        stamp, self.clear_acked_at = self.lab.set_link_timed(self.node, self.port, group=0)
        if self._armed_by_inject:  # inject() installed the rules: take them away again
            self.armed = False
            self._disarm()
        return stamp

    def _table(self) -> list[dict]:
        out = self.lab.run(self.node, ["nft", "-j", "list", "table", "netdev", TABLE]).stdout
        return json.loads(out)["nftables"]

    def _chains_left(self) -> list[str]:
        return [x["chain"]["name"] for x in self._table() if "chain" in x]

    def _read_counts(self) -> dict[str, dict[str, int]]:
        counts = {d: {"seen": 0, "dropped": 0} for d in self.directions}
        by_chain = {self.chain(d): d for d in self.directions}
        for item in self._table():
            rule = item.get("rule")
            if not rule or rule["chain"] not in by_chain or \
                    rule.get("comment") not in ("seen", "dropped"):
                continue
            for expr in rule["expr"]:
                if "counter" in expr:
                    counts[by_chain[rule["chain"]]][rule["comment"]] = expr["counter"]["packets"]
        return counts

    def counts(self) -> dict[str, dict[str, int]]:
        """Frames ``seen`` and ``dropped`` per direction while the port's
        group was the fault's: live while the rules are installed, the final
        reading once they are removed."""
        if self.armed:
            return self._read_counts()
        if self.final_counts is None:
            raise LabError(f"{self.description}: not injected")
        return self.final_counts


class SilentBlackhole(NftFault):
    """Link up, carrier up, every frame dropped both ways."""

    kind = "silent-blackhole"


class OneWayLoss(NftFault):
    """100 % loss in one direction only (``host_to_leaf`` or ``leaf_to_host``):
    the asymmetric optic fault carrier state cannot see."""

    kind = "one-way-loss"

    def __init__(self, lab: Lab, host: str | int | HostPlan, rail: int | str,
                 direction: str = "host_to_leaf"):
        if direction not in HOOKS:
            raise LabError(f"direction must be one of {', '.join(HOOKS)}, got {direction!r}")
        self.direction = direction
        super().__init__(lab, host, rail, directions=(direction,))

    @property
    def description(self) -> str:
        return f"{super().description}: {self.direction.replace('_', ' ')}"


def _percent(percent: object) -> int:
    if not isinstance(percent, int) or isinstance(percent, bool) or not 0 <= percent <= 100:
        raise LabError(f"percent must be an integer in 0..100, got {percent!r}")
    return percent


class RandomLoss(NftFault):
    """Each frame dropped with probability ``percent``/100 at the leaf's
    host-facing port, both directions (``numgen random mod 100 < N``), or
    one: ``directions=("host_to_leaf",)`` or ``("leaf_to_host",)``."""

    kind = "random-loss"

    def __init__(self, lab: Lab, host: str | int | HostPlan, rail: int | str, percent: int,
                 directions: tuple[str, ...] = ("host_to_leaf", "leaf_to_host")):
        self.percent = _percent(percent)
        super().__init__(lab, host, rail, directions=directions)

    @property
    def description(self) -> str:
        ways = "" if len(self.directions) == 2 else f" {self.directions[0].replace('_', ' ')}"
        return f"{super().description}: {self.percent}% loss{ways}"

    def _match(self) -> str:
        return f"numgen random mod 100 < {self.percent}"


class HostPortLoss(RandomLoss):
    """As RandomLoss, but at the host's own port (rules in the host's
    namespace): a host NIC or optic losing what it receives (leaf to host:
    the ingress hook) or what it transmits (host to leaf: the egress hook).
    A transmitted frame that the egress hook picks is diverted to the host's
    loopback, not dropped (``fwd to "lo"``): a drop there is reported to the
    sending socket (ENOBUFS; see the module doc), and linkpassd rightly
    counts a refused send as no evidence, while a failing transmitter tells
    the host nothing. On loopback the frame, addressed to the leaf's MAC, is
    discarded by the host's own stack (not for this host). ARP is diverted too."""

    kind = "host-port-loss"
    hooks = {"host_to_leaf": "egress", "leaf_to_host": "ingress"}
    verdicts = {"host_to_leaf": 'fwd to "lo"'}

    def __init__(self, lab: Lab, host: str | int | HostPlan, rail: int | str, percent: int,
                 directions: tuple[str, ...] = ("host_to_leaf", "leaf_to_host")):
        super().__init__(lab, host, rail, percent, directions)
        self._init_rules(self.host.name, self.rail.port, directions)
