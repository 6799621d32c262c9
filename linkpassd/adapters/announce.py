"""The interface to the host's BGP speaker (FRR): announcements are routes in
a dedicated kernel table that FRR's zebra imports (``ip import-table``) and
bgpd redistributes, per rail, through route-maps that match the metric
(core.announce says which metric means which rail; linkpassd.announce_frr
writes FRR's side). docs/bgp.md says why this interface.

Each announcement is ``<rail address>/32 dev lo table <table> proto <proto>
metric <metric>``. The table is never used for forwarding (no rule looks it
up). Moving an address from one rail to another deletes the old route, then
adds the new one (see apply: zebra 8.4 loses the prefix otherwise); the
fabric may see the withdrawal a moment before the new announcement.

Nothing is withdrawn at shutdown: a linkpassd restart leaves the table, and
so the fabric, as it is. An address that is not a configured rail address,
or that the host does not hold, is refused (never written) and reported.

Whether FRR is there to announce anything is read, not assumed: its pid
files in ``frr_run_dir`` (zebra, bgpd) and, for each announced address,
zebra's copy of the imported route in the main table (zebra installs what it
imports, with its own protocol): without it, the table is not imported.
"""

from __future__ import annotations

import errno
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from socket import AF_INET

from pyroute2.netlink.exceptions import NetlinkError

from linkpassd.core import announce
from linkpassd.core.announce import Announcement
from linkpassd.core.model import AnnounceSettings, Config

LOOPBACK = "lo"
MAIN_TABLE = 254
RTPROT_ZEBRA = 11  # zebra's protocol for the routes it imports from a table (FRR 8.4)
FRR_DAEMONS = ("zebra", "bgpd")


class AnnounceError(RuntimeError):
    pass


@dataclass(frozen=True)
class FrrState:
    """What the adapter can see of FRR: which of its daemons run, and which
    announced addresses zebra has imported."""

    missing_daemons: tuple[str, ...] = ()
    not_imported: tuple[str, ...] = ()

    @property
    def problems(self) -> tuple[str, ...]:
        out = []
        if self.missing_daemons:
            out.append(f"FRR not running: {', '.join(self.missing_daemons)}")
        if self.not_imported:
            out.append(f"not imported by zebra (ip import-table): {', '.join(self.not_imported)}")
        return tuple(out)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class ApplyResult:
    refused: list[str] = field(default_factory=list)  # foreign addresses, never written
    added: list[tuple[str, int]] = field(default_factory=list)
    removed: list[tuple[str, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def _collect(answer) -> list:
    """pyroute2's answers: a list (``get``) or an async iterator (``dump``)."""
    if hasattr(answer, "__aiter__"):
        return [m async for m in answer]
    return list(answer)


def pid_alive(path: Path) -> bool:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Announcer:
    """Writes the announcement table through a caller-owned pyroute2
    ``AsyncIPRoute`` (created with ``netns=...`` inside a namespace)."""

    def __init__(self, ipr, settings: AnnounceSettings, frr_run_dir: str | os.PathLike[str]):
        self.ipr = ipr
        self.settings = settings
        self.frr_run_dir = Path(frr_run_dir)
        self.writes = 0
        self._lo: int | None = None

    async def _loopback(self) -> int:
        if self._lo is None:
            links = await _collect(await self.ipr.link("get", ifname=LOOPBACK))
            self._lo = links[0]["index"]
        return self._lo

    async def _routes(self, table: int, protocol: int | None) -> list:
        query = {"table": table, "family": AF_INET}
        if protocol is not None:
            query["proto"] = protocol
        out = []
        for msg in await _collect(await self.ipr.route("dump", **query)):
            if msg.get("table") != table or msg["dst_len"] != 32:
                continue
            if protocol is not None and msg["proto"] != protocol:
                continue
            out.append(msg)
        return out

    async def observe(self) -> dict[str, set[int]]:
        """Address -> metrics of our routes in the announcement table."""
        out: dict[str, set[int]] = {}
        for msg in await self._routes(self.settings.table, self.settings.route_protocol):
            out.setdefault(msg.get("dst"), set()).add(msg.get("priority") or 0)
        return out

    async def held(self) -> set[str]:
        """The host's local IPv4 addresses."""
        return {m.get("address") for m in await _collect(await self.ipr.addr("dump", family=AF_INET))}

    async def apply(self, config: Config, desired: Mapping[str, Announcement]) -> ApplyResult:
        """Make the table say `desired` (address -> announcement): old routes
        go, then new ones come. Foreign addresses are refused, and any of
        ours already in the table for them is withdrawn."""
        result = ApplyResult()
        result.refused = announce.foreign(desired, config, await self.held())
        want = {a: x.metric for a, x in desired.items() if a not in result.refused}
        have = await self.observe()
        # Old routes go first: zebra imports one route per prefix, and when
        # the other of two routes for one prefix is deleted it drops the
        # prefix (seen with FRR 8.4), so make-before-break would withdraw it.
        for address, metrics in sorted(have.items()):
            for metric in sorted(metrics):
                if want.get(address) != metric:
                    await self._write("del", address, metric, result)
        for address, metric in sorted(want.items()):
            if metric not in have.get(address, set()):
                await self._write("add", address, metric, result)
        return result

    async def _write(self, verb: str, address: str, metric: int, result: ApplyResult) -> None:
        ipaddress.IPv4Address(address)  # a bad value is a bug: fail loudly
        try:
            await self.ipr.route(verb, dst=f"{address}/32", table=self.settings.table,
                                 proto=self.settings.route_protocol, priority=metric,
                                 oif=await self._loopback(), scope=253)
        except NetlinkError as exc:
            if verb == "add" and exc.code == errno.EEXIST or verb == "del" and exc.code == errno.ESRCH:
                return
            result.errors.append(f"{verb} {address}/32 metric {metric}: {os.strerror(exc.code)}")
            return
        self.writes += 1
        (result.added if verb == "add" else result.removed).append((address, metric))

    async def frr_state(self, announced: Mapping[str, Announcement]) -> FrrState:
        missing = tuple(d for d in FRR_DAEMONS if not pid_alive(self.frr_run_dir / f"{d}.pid"))
        imported = set()
        for msg in await self._routes(MAIN_TABLE, RTPROT_ZEBRA):
            imported.add(msg.get("dst"))
        not_imported = tuple(sorted(a for a in announced if a not in imported))
        return FrrState(missing, not_imported)
