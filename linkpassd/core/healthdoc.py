"""The host's health document: what collective libraries and launchers read.

`/run/linkpass/health.json` (and the WatchHealth stream) says, per rail port,
whether a job may use it, so a launcher can leave a bad NIC out of
NCCL_IB_HCA before it starts.  The document carries its own freshness: the
daemon rewrites it before `valid_until`, so a file older than that means the
daemon is gone or stuck and the file must not be trusted.

Pure: the daemon's adapters write the file and give the times.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from linkpassd.core.model import PortState, RailConfig, Verdict

FORMAT_VERSION = 1


@dataclass(frozen=True)
class PortHealthRow:
    port: str  # netdev
    rail: str
    rdma_device: str  # "" when the netdev has no RDMA device
    rdma_port: int  # 0 when none
    verdict: Verdict | None  # None: not judged yet
    since: float  # unix time of the last verdict change; 0 when not judged
    reason: str
    drained: bool

    @property
    def usable(self) -> bool:
        """A launcher may put this port in a job's device list."""
        return self.verdict is Verdict.UP and not self.drained


@dataclass(frozen=True)
class HealthDoc:
    hostname: str
    boot_id: str
    generation: int  # 1, 2, 3... within a boot
    written_at: float  # unix time
    valid_until: float  # unix time; later than this without a newer one: stale
    pid: int  # the daemon's
    ports: tuple[PortHealthRow, ...]
    # The daemon's PID namespace (st_ino of /proc/self/ns/pid); 0: unknown.
    # `pid` means something only to a reader in the same namespace: in a
    # container, kill(pid, 0) would call a live daemon gone.
    pid_ns: int = 0


class HealthDocError(ValueError):
    """A health document is not usable; the message names the bad field."""


# --------------------------------------------------------------------------
# Building (the daemon)
# --------------------------------------------------------------------------


def build(hostname: str, boot_id: str, generation: int, written_at: float, valid_s: float,
          pid: int, rails: Sequence[RailConfig], states: Mapping[str, PortState],
          rdma: Mapping[str, tuple[str, int]], *, pid_ns: int = 0) -> HealthDoc:
    """The document for the port states the policy acts on right now.

    `states` are keyed by netdev and carry `since` in unix time and `drain`
    for drained ports (core.drain.apply), so a launcher sees exactly the
    verdicts that move the host's traffic.  One row per rail, in config order
    (the order an operator wrote, which is also the order NCCL_IB_HCA lists
    them).  A rail whose port has no state yet is listed unjudged (verdict
    None, not usable) rather than left out, so a reader can tell "not judged
    yet" from "not a rail".  `pid_ns` is the daemon's PID namespace as the
    caller read it (adapters.healthfile.own_pid_namespace; 0: unknown).
    """
    if not valid_s > 0 or not math.isfinite(valid_s):
        raise ValueError(f"valid_s must be a positive number of seconds, not {valid_s!r}")
    rows = []
    for rail in rails:
        state = states.get(rail.port)
        device, device_port = rdma.get(rail.port, ("", 0))
        if state is None:
            rows.append(PortHealthRow(port=rail.port, rail=rail.name, rdma_device=device,
                                      rdma_port=device_port, verdict=None, since=0.0,
                                      reason="not judged yet", drained=False))
            continue
        rows.append(PortHealthRow(port=rail.port, rail=rail.name, rdma_device=device,
                                  rdma_port=device_port, verdict=state.verdict, since=state.since,
                                  reason=state.evidence[0] if state.evidence else state.phase,
                                  drained=state.drain is not None))
    return HealthDoc(hostname=hostname, boot_id=boot_id, generation=generation,
                     written_at=written_at, valid_until=written_at + valid_s, pid=pid,
                     ports=tuple(rows), pid_ns=pid_ns)


def stopped(doc: HealthDoc, now: float) -> HealthDoc:
    """The last document a cleanly stopping daemon writes: the same rows, but
    already past its validity (valid_until == written_at == now), so readers
    refuse it at once instead of trusting it until the old valid_until.  It
    is a newer document, so its generation is one more."""
    return replace(doc, generation=doc.generation + 1, written_at=now, valid_until=now)


# --------------------------------------------------------------------------
# JSON (health.json): what launchers read without a socket
# --------------------------------------------------------------------------


def to_json(doc: HealthDoc) -> dict[str, Any]:
    """The document as JSON-ready values.  `usable` is derived but written out,
    so a launcher reading the file with jq needs none of linkpass's rules."""
    return {
        "format": FORMAT_VERSION,
        "hostname": doc.hostname,
        "boot_id": doc.boot_id,
        "generation": doc.generation,
        "written_at": doc.written_at,
        "valid_until": doc.valid_until,
        "pid": doc.pid,
        "pid_ns": doc.pid_ns,
        "ports": [{
            "port": row.port,
            "rail": row.rail,
            "rdma_device": row.rdma_device,
            "rdma_port": row.rdma_port,
            "verdict": None if row.verdict is None else row.verdict.value,
            "since": row.since,
            "reason": row.reason,
            "drained": row.drained,
            "usable": row.usable,
        } for row in doc.ports],
    }


def from_json(obj: object) -> HealthDoc:
    """A document read back (by linkpassctl nccl-env, or any tool); HealthDocError
    naming the bad field otherwise.  Keys it does not know are ignored (a newer
    daemon of the same format may add some); a newer format is refused."""
    if not isinstance(obj, dict):
        raise HealthDocError(f"expected a JSON object, got {type(obj).__name__}")
    fmt = _field(obj, "format", int)
    if fmt != FORMAT_VERSION:
        raise HealthDocError(f"format: {fmt} is not the format this version reads ({FORMAT_VERSION})")
    ports = _field(obj, "ports", list)
    rows = tuple(_row(item, f"ports[{i}]") for i, item in enumerate(ports))
    seen: set[str] = set()
    for i, row in enumerate(rows):
        if row.rail in seen:
            raise HealthDocError(f"ports[{i}].rail: {row.rail!r} is listed twice")
        seen.add(row.rail)
    generation = _field(obj, "generation", int)
    if generation < 0:
        raise HealthDocError(f"generation: must not be negative, got {generation}")
    pid_ns = _field(obj, "pid_ns", int) if "pid_ns" in obj else 0  # absent: a daemon before pid_ns
    if pid_ns < 0:
        raise HealthDocError(f"pid_ns: must not be negative, got {pid_ns}")
    return HealthDoc(hostname=_field(obj, "hostname", str), boot_id=_field(obj, "boot_id", str),
                     generation=generation, written_at=_field(obj, "written_at", float),
                     valid_until=_field(obj, "valid_until", float), pid=_field(obj, "pid", int),
                     ports=rows, pid_ns=pid_ns)


def _row(item: object, where: str) -> PortHealthRow:
    if not isinstance(item, dict):
        raise HealthDocError(f"{where}: expected an object, got {type(item).__name__}")
    verdict_text = _field(item, "verdict", str, where, nullable=True)
    if verdict_text is None:
        verdict = None
    else:
        try:
            verdict = Verdict(verdict_text)
        except ValueError:
            raise HealthDocError(f"{where}.verdict: {verdict_text!r} is not one of "
                                 f"{', '.join(v.value for v in Verdict)} or null") from None
    port = _field(item, "port", str, where)
    if not port:
        raise HealthDocError(f"{where}.port: must not be empty")
    rdma_port = _field(item, "rdma_port", int, where)
    if rdma_port < 0:
        raise HealthDocError(f"{where}.rdma_port: must not be negative, got {rdma_port}")
    return PortHealthRow(port=port, rail=_field(item, "rail", str, where),
                         rdma_device=_field(item, "rdma_device", str, where), rdma_port=rdma_port,
                         verdict=verdict, since=_field(item, "since", float, where),
                         reason=_field(item, "reason", str, where),
                         drained=_field(item, "drained", bool, where))


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
               list: "a list"}


def _field(obj: dict[str, Any], key: str, kind: type, where: str = "", nullable: bool = False) -> Any:
    """obj[key] checked against `kind` (bool is not a number here; an int is a
    float; a float must be finite), HealthDocError naming `where.key` otherwise."""
    name = f"{where}.{key}" if where else key
    if key not in obj:
        raise HealthDocError(f"{name}: missing")
    value = obj[key]
    if value is None and nullable:
        return None
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        value = float(value) if ok else value
    if not ok:
        expected = _TYPE_NAMES[kind] + (" or null" if nullable else "")
        raise HealthDocError(f"{name}: expected {expected}, got {value!r}"[:200])
    return value


# --------------------------------------------------------------------------
# Reading (launchers)
# --------------------------------------------------------------------------


def _unix_time(unix: float) -> str:
    return f"{unix:.0f} (unix time)"


def staleness(doc: HealthDoc, now: float, pid_alive: bool | None,
              show_time: Callable[[float], str] = _unix_time) -> str | None:
    """Why `doc` must not be trusted at `now`, or None when it is fresh.

    Two rules, either suffices: the daemon promised a newer document before
    `valid_until` and none came (it is gone, stuck, or stopped cleanly, which
    writes valid_until == written_at); or the process that wrote it is gone
    (`pid_alive` False: seen at once, without waiting for valid_until).
    `pid_alive` None means the reader cannot tell (another PID namespace than
    `doc.pid_ns`, say: see `pid_comparable`); the time rule still holds.
    `show_time`: how the reader shows a time to people (linkpassctl: local
    ISO 8601 with the offset); the core never picks a zone.
    """
    if doc.valid_until <= doc.written_at:
        return (f"linkpassd stopped at {show_time(doc.written_at)}; its health data is "
                "not current")
    if pid_alive is False:
        return f"written by linkpassd pid {doc.pid}, which is no longer running"
    if now > doc.valid_until:
        return (f"not rewritten for {now - doc.written_at:.1f}s (valid until "
                f"{show_time(doc.valid_until)}, now {show_time(now)}): linkpassd is gone or stuck")
    return None


def pid_comparable(doc: HealthDoc, reader_pid_ns: int) -> bool:
    """Whether `doc.pid` names the same process for a reader in PID namespace
    `reader_pid_ns` (0: unknown): only when both namespaces are known and
    equal.  A reader in a container sees other pids (or none) for the daemon."""
    return doc.pid_ns != 0 and doc.pid_ns == reader_pid_ns


def nccl_env(doc: HealthDoc) -> dict[str, str]:
    """NCCL_IB_HCA and NCCL_SOCKET_IFNAME listing only the usable ports, in rail order.

    NCCL's documented syntax (NCCL user guide, "Environment Variables"): both
    take a comma-separated list of name prefixes; a leading `^` makes it an
    exclude list; a leading `=` makes every token an exact name instead of a
    prefix, and `device:port` selects one port of an HCA.  Without `=`,
    `mlx5_1` also selects mlx5_10..mlx5_19, so we always write `=`:
    `NCCL_IB_HCA==mlx5_0:1,mlx5_3:1` and `NCCL_SOCKET_IFNAME==eth0,eth3`.

    An empty list is never written: NCCL parses it to zero entries and then
    matches *every* device (matchIfList: "no user list is defined" -> true),
    i.e. `NCCL_IB_HCA==` would hand the job the bad NICs too.  So when no port
    is usable, or the host has RDMA ports and none of them is usable, this
    returns {} and `nccl_env_refusal` says why; the caller must not start the
    job on this advice (linkpassctl nccl-env exits NO_USABLE).  On a host
    without any RDMA device only NCCL_SOCKET_IFNAME is given.
    """
    if nccl_env_refusal(doc) is not None:
        return {}
    usable = [row for row in doc.ports if row.usable]
    env = {}
    hcas = [f"{row.rdma_device}:{row.rdma_port}" for row in usable if row.rdma_device]
    if hcas:
        env["NCCL_IB_HCA"] = "=" + ",".join(_unique(hcas))
    env["NCCL_SOCKET_IFNAME"] = "=" + ",".join(_unique([row.port for row in usable]))
    return env


def nccl_env_refusal(doc: HealthDoc) -> str | None:
    """Why `nccl_env` gives nothing (None when it gives a device list): one
    line naming every port and what is wrong with it."""
    usable = [row for row in doc.ports if row.usable]
    if not usable:
        detail = "; ".join(f"{row.port} {_state_text(row)}" for row in doc.ports) or "no rail ports"
        return f"no usable port on {doc.hostname}: {detail}"
    if any(row.rdma_device for row in doc.ports) and not any(row.rdma_device for row in usable):
        detail = "; ".join(f"{row.rdma_device}:{row.rdma_port} ({row.port}) {_state_text(row)}"
                           for row in doc.ports if row.rdma_device)
        return f"no usable RDMA port on {doc.hostname}: {detail}"
    return None


# --------------------------------------------------------------------------
# NCCL port failover (linkpassctl nccl-env --port-failover)
# --------------------------------------------------------------------------

# The first NCCL release with NET/IB port failover: v2.29.7-1 is the first
# tag that has src/transport/net_ib/p2p_resiliency.cc (v2.29.3-1 has none).
PORT_FAILOVER_SINCE = (2, 29, 7)
# Devices one NCCL_NET_FORCE_MERGE group may hold: NCCL_NET_MAX_DEVS_PER_NIC
# is 4 in 2.29 and for net plugins before API v12; 2.30 raised it to 8 for
# v12 plugins.  4 holds for every version that has failover.
MERGE_MAX = 4
DEFAULT_MERGE_SIZE = 2

# "2.29.7", "v2.29.7-1" (a release tag), "2.29.7+cuda12.9" (what NCCL prints
# at init: "NCCL version 2.29.7+cuda12.9").
_NCCL_VERSION = re.compile(r"v?(\d{1,4})\.(\d{1,4})\.(\d{1,4})(?:-\d{1,4})?(?:\+[A-Za-z0-9.]{1,40})?")


def parse_nccl_version(text: str) -> tuple[int, int, int]:
    """(major, minor, patch) of an NCCL version as NCCL or its release tags
    write it; ValueError naming `text` for anything else."""
    match = _NCCL_VERSION.fullmatch(text)
    if match is None:
        raise ValueError(f"{text[:60]!r} is not an NCCL version (expected MAJOR.MINOR.PATCH, "
                         "e.g. 2.29.7, 2.29.7-1 or 2.29.7+cuda12.9)")
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def port_failover_refusal(version: tuple[int, int, int]) -> str | None:
    """Why NCCL `version` cannot fail a port over (None when it can)."""
    if version >= PORT_FAILOVER_SINCE:
        return None
    since = ".".join(map(str, PORT_FAILOVER_SINCE))
    return (f"NCCL {'.'.join(map(str, version))} has no port failover (NET/IB port failover "
            f"came in NCCL {since}); start the job without --port-failover")


def merge_groups(doc: HealthDoc, size: int = DEFAULT_MERGE_SIZE) -> list[list[str]]:
    """The usable RDMA ports as NCCL_NET_FORCE_MERGE groups (`device:port`).

    NCCL fails a queue pair over only to another device of the same merged
    (virtual) NIC, so the ports must be merged to protect each other.  The
    groups are cut from *all* the host's RDMA ports in rail order, `size` at a
    time, and only then are the unusable ports taken out: hosts with the same
    rails get the same groups whatever their health, and a bad port leaves
    its group rather than shifting every later group by one.  A group left
    with fewer than two usable ports is left out (NCCL makes no merged NIC of
    one device; such a port cannot fail over).
    """
    if not 2 <= size <= MERGE_MAX:
        raise ValueError(f"merge size must be 2 to {MERGE_MAX}, not {size}")
    all_ports = _unique([f"{row.rdma_device}:{row.rdma_port}" for row in doc.ports if row.rdma_device])
    usable = {f"{row.rdma_device}:{row.rdma_port}" for row in doc.ports if row.usable and row.rdma_device}
    chunks = [all_ports[i:i + size] for i in range(0, len(all_ports), size)]
    groups = [[port for port in chunk if port in usable] for chunk in chunks]
    return [group for group in groups if len(group) >= 2]


def port_failover_env(doc: HealthDoc, size: int = DEFAULT_MERGE_SIZE) -> tuple[dict[str, str], list[str]]:
    """What NCCL 2.29.7 and later needs, on top of `nccl_env`, to fail a port
    over to another port of this host: NCCL_IB_RESILIENCY_PORT_FAILOVER=1 (off
    by default) and NCCL_NET_FORCE_MERGE with the usable ports grouped by
    `merge_groups`.  The syntax (NCCL's src/graph/topo.cc, ncclTopoForceMerge):
    groups separated by `;`, devices by `,`, each `device[:port]`, always
    matched exactly (no leading `=`), and every device of a group must exist
    or NCCL's init fails: so no unusable port is ever named.

    Returns the variables and notes for the person or log (a port that
    cannot fail over, say).  Nothing when the host has no usable RDMA port
    (`nccl_env` refuses that host anyway) or no RDMA port at all: port
    failover is a NET/IB feature.
    """
    notes: list[str] = []
    usable = _unique([f"{row.rdma_device}:{row.rdma_port}" for row in doc.ports
                      if row.usable and row.rdma_device])
    if not usable:
        if not any(row.rdma_device for row in doc.ports):
            notes.append(f"no RDMA port on {doc.hostname}: port failover is a NET/IB feature, "
                         "nothing added")
        return {}, notes
    groups = merge_groups(doc, size)
    env = {"NCCL_IB_RESILIENCY_PORT_FAILOVER": "1"}
    if groups:
        env["NCCL_NET_FORCE_MERGE"] = ";".join(",".join(group) for group in groups)
    merged = {port for group in groups for port in group}
    alone = [port for port in usable if port not in merged]
    if alone:
        notes.append(f"no failover for {', '.join(alone)}: no other usable port in its merge group "
                     f"(groups of {size} in rail order)")
    return env, notes


def _state_text(row: PortHealthRow) -> str:
    if row.verdict is None:
        return "not judged yet"
    state = f"{row.verdict.value}, drained" if row.drained else row.verdict.value
    return f"{state} ({row.reason})" if row.reason else state


def _unique(items: list[str]) -> list[str]:
    """In order, without repeats (two rails may share a port)."""
    return list(dict.fromkeys(items))
