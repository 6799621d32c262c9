"""The daemon's state files: what must outlive one run of it.

Four files in `[daemon] state_dir`, each written atomically and only when its
content changes, always after the kernel writes of the same pass (a disk
never delays a failover):

  verdicts.json    each port's verdict and the signals it awaits (core.carried),
                   so a rail that failed over stays failed over across a restart
                   until its own probes prove it healthy;
  allocation.json  nexthop ids, rule priorities and auto tables by name
                   (core.alloc), so a reload or restart renumbers nothing in use;
  drains.json      the operators' drains (core.drain), kept across restarts;
  mesh.json        the last probe peers (and who probes us) the aggregator
                   handed down, so a daemon restarted while the aggregator is
                   away still probes its mesh paths and still answers the hosts
                   that probe it, instead of waiting for the aggregator with
                   those paths unwatched. The aggregator's next plan replaces
                   it. A stale entry costs little: a peer that never answers
                   is "never up" and moves nothing.

`StateFiles` reads and writes them and nothing else: it is handed values and
returns values, and never reaches into the daemon. A file that cannot be read
or written is a reported problem (`problems`, shown by `status`), never the
daemon's end; other parts of the daemon report their own problems (the health
file, the metrics endpoint, the open-file limit) through the same `problem()`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import structlog
from google.protobuf import json_format

from linkpassd._proto.linkpass.v1 import fleet_pb2
from linkpassd.adapters.statefile import StateFileError, read_json, write_json_atomic
from linkpassd.core import alloc, carried, drain, health
from linkpassd.core.model import Config, Drain, HealthPolicy, KernelState, Problem, Verdict

log = structlog.get_logger("linkpassd")

VERDICT_FILE = "verdicts.json"  # in the state directory
ALLOCATION_FILE = "allocation.json"  # in the state directory: ids, priorities, tables by name
DRAIN_FILE = "drains.json"  # in the state directory
MESH_FILE = "mesh.json"  # in the state directory: the aggregator's last probe peers for us
MESH_FILE_VERSION = 1
ECHO_SIGNAL = "echo"  # the health signal that combines a rail's echo paths


class StateFiles:
    """The state directory of the running config (`config()` is read at each
    use, so a reload's state_dir applies to the next write)."""

    def __init__(self, config: Callable[[], Config], wallclock: Callable[[], float]) -> None:
        self.config = config
        self.wallclock = wallclock
        self.problems: dict[str, Problem] = {}  # what cannot be read or written, by path
        self.saved_verdicts: dict | None = None  # what the verdict file says now
        self.saved_allocation: alloc.Allocation | None = None  # what allocation.json says now
        self.saved_drains: dict[str, Drain] | None = None
        self.saved_mesh: bytes | None = None  # the ProbePeers mesh.json holds now
        self.saved_mesh_message: fleet_pb2.ProbePeers | None = None  # last compared with it

    def _path(self, name: str) -> str:
        return os.path.join(self.config().state_dir, name)

    # ------------------------------------------------------------ problems

    def problem(self, where: str, detail: str, kind: str = "state") -> None:
        """Report that `where` is unusable (once; `clear` when it works again)."""
        if where not in self.problems:
            if kind == "state":  # the other kinds are logged by who reports them
                log.error("state_file_problem", path=where, error=detail)
            self.problems[where] = Problem(kind, where, detail, self.wallclock())

    def clear(self, where: str) -> None:
        self.problems.pop(where, None)

    # ------------------------------------------------------------ verdicts

    def load_verdicts(self, observed: KernelState | None,
                      drained: Mapping[str, Drain]) -> dict[str, carried.Carried]:
        """What the last daemon knew: its verdict file, and rail tables the
        kernel still routes through a backup. Such ports start as not trusted
        (see core.carried), unless a drain (loaded first) explains the
        failover; anything unreadable is reported and skipped."""
        config = self.config()
        known: dict[str, carried.Carried] = {}
        path = self._path(VERDICT_FILE)
        try:
            doc = read_json(path)
            if doc is not None:
                known = carried.decode(doc, self.wallclock())
        except (StateFileError, carried.CarriedError) as exc:
            self.problem(path, f"verdict file unusable, ignored: {exc}")
        for port, why in (carried.failed_over(config, observed) if observed else {}).items():
            if port not in known and port not in drained:  # a drain explains the failover
                known[port] = carried.Carried(
                    Verdict.DOWN, why, carried.probe_signals(config, port, ECHO_SIGNAL))
        rail_of = {r.port: r.name for r in config.rails}
        for port, c in known.items():
            log.warning("verdict_carried", port=port, rail=rail_of.get(port, ""),
                        verdict=str(c.verdict), awaiting=",".join(c.awaiting) or "-",
                        reason=c.reason)
        return known

    def save_verdicts(self, ports: Mapping[str, health.PortHealth], policy: HealthPolicy) -> None:
        """Write the verdict file when a verdict (or what it awaits) changed."""
        verdicts = {p: (h.verdict, h.reason, health.bad_signals(h, policy)
                        if h.verdict is not Verdict.UP else ())
                    for p, h in ports.items()}
        if verdicts == self.saved_verdicts:
            return
        path = self._path(VERDICT_FILE)
        try:
            write_json_atomic(path, carried.encode(verdicts, self.wallclock()))
        except OSError as exc:
            self.problem(path, f"cannot write the verdict file: {exc}")
            return
        self.saved_verdicts = verdicts
        self.clear(path)

    # ------------------------------------------------------------ allocation

    def load_allocation(self, observed: KernelState | None) -> alloc.Allocation | None:
        """The numbering allocation.json keeps; without a usable file, the
        one the kernel shows (so a host upgraded from positional numbering
        renumbers nothing); None when neither says anything."""
        path = self._path(ALLOCATION_FILE)
        try:
            doc = read_json(path)
            if doc is not None:
                self.saved_allocation = alloc.Allocation.from_json(doc)
                return self.saved_allocation
        except (StateFileError, alloc.AllocationFileError) as exc:
            self.problem(path, f"allocation file unusable, derived from the kernel instead: {exc}")
        if observed is not None:
            return alloc.derive(self.config(), observed)
        return None

    def save_allocation(self, state_dir: str, allocation: alloc.Allocation) -> None:
        """Write allocation.json if it changed (before any kernel write that
        uses it). `state_dir`: the new config's, in a reload."""
        if allocation == self.saved_allocation:
            return
        path = os.path.join(state_dir, ALLOCATION_FILE)
        try:
            write_json_atomic(path, allocation.to_json())
        except OSError as exc:
            self.problem(path, f"cannot write the allocation file: {exc}")
            return
        self.saved_allocation = allocation
        self.clear(path)

    # ------------------------------------------------------------ drains

    def load_drains(self) -> dict[str, Drain]:
        path = self._path(DRAIN_FILE)
        drains: dict[str, Drain] = {}
        try:
            doc = read_json(path)
            if doc is not None:
                drains = drain.decode(doc)
                self.saved_drains = dict(drains)
        except (StateFileError, drain.DrainError) as exc:
            self.problem(path, f"drain file unusable, no port is drained: {exc}")
        for d in drains.values():
            log.warning("drain_carried", port=d.port, by=d.by, reason=d.reason,
                        until=d.until or "undrain")
        return drains

    def save_drains(self, drains: Mapping[str, Drain]) -> None:
        if drains == self.saved_drains:
            return
        path = self._path(DRAIN_FILE)
        try:
            write_json_atomic(path, drain.encode(dict(drains)))
        except OSError as exc:
            self.problem(path, f"cannot write the drain file (drains hold until a restart): {exc}")
            return
        self.saved_drains = dict(drains)
        self.clear(path)

    # ------------------------------------------------------------ mesh

    def load_mesh(self) -> tuple[fleet_pb2.ProbePeers, float | None] | None:
        """The probe peers of the last plan applied (mesh.json) and when they
        were written, or None."""
        path = self._path(MESH_FILE)
        try:
            doc = read_json(path)
            if doc is None:
                return None
            if doc.get("version") != MESH_FILE_VERSION:
                raise StateFileError(f"version {doc.get('version')!r}, expected {MESH_FILE_VERSION}")
            message = json_format.ParseDict(doc.get("probe_peers"), fleet_pb2.ProbePeers())
        except (StateFileError, json_format.ParseError, TypeError, AttributeError) as exc:
            self.problem(path, f"mesh file unusable, ignored (the aggregator's next plan "
                               f"applies): {exc}")
            return None
        self.saved_mesh_message = message
        self.saved_mesh = message.SerializeToString(deterministic=True)
        return message, doc.get("written_at")

    def save_mesh(self, message: fleet_pb2.ProbePeers | None) -> None:
        """After the pass: write mesh.json when the applied plan changed."""
        if message is None or message is self.saved_mesh_message:
            return
        raw = message.SerializeToString(deterministic=True)
        if raw == self.saved_mesh:
            self.saved_mesh_message = message  # every pass calls this: compare once per plan
            return
        path = self._path(MESH_FILE)
        doc = {"version": MESH_FILE_VERSION, "written_at": self.wallclock(),
               "probe_peers": json_format.MessageToDict(message)}
        try:
            write_json_atomic(path, doc)
        except OSError as exc:
            self.problem(path, f"cannot write the mesh file: {exc}")
            return
        self.saved_mesh, self.saved_mesh_message = raw, message
        self.clear(path)
