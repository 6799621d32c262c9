"""The daemon's state files: what must outlive one run of it.

A mixin of `Daemon`.  Three files in `[daemon] state_dir`, each written
atomically and only when its content changes, always after the kernel writes
of the same pass (a disk never delays a failover):

  verdicts.json    each port's verdict and the signals it awaits (core.carried),
                   so a rail that failed over stays failed over across a restart
                   until its own probes prove it healthy;
  allocation.json  nexthop ids, rule priorities and auto tables by name
                   (core.alloc), so a reload or restart renumbers nothing in use;
  mesh.json        the last probe peers (and who probes us) the aggregator
                   handed down, so a daemon restarted while the aggregator is
                   away still probes its mesh paths and still answers the hosts
                   that probe it, instead of waiting for the aggregator with
                   those paths unwatched. The aggregator's next plan replaces
                   it. A stale entry costs little: a peer that never answers
                   is "never up" and moves nothing.

A file that cannot be read or written is a reported problem (`status`), never
the daemon's end.
"""

from __future__ import annotations

import structlog
from google.protobuf import json_format

from linkpassd._proto.linkpass.v1 import fleet_pb2
from linkpassd.adapters.statefile import StateFileError, read_json, write_json_atomic
from linkpassd.agent import reports
from linkpassd.core import alloc, carried, health
from linkpassd.core.model import Config, KernelState, Problem, Verdict

log = structlog.get_logger("linkpassd")

VERDICT_FILE = "verdicts.json"  # in the state directory
ALLOCATION_FILE = "allocation.json"  # in the state directory: ids, priorities, tables by name
MESH_FILE = "mesh.json"  # in the state directory: the aggregator's last probe peers for us
MESH_FILE_VERSION = 1
ECHO_SIGNAL = "echo"  # the health signal that combines a rail's echo paths


class StateFiles:
    def _adopt(self, observed: KernelState | None) -> None:
        """What the last daemon knew: its verdict file, and rail tables the
        kernel still routes through a backup. Such ports start as not trusted
        (see core.carried), unless a drain (loaded first) explains the
        failover; anything unreadable is reported and skipped."""
        path = f"{self.config.state_dir}/{VERDICT_FILE}"
        try:
            doc = read_json(path)
            if doc is not None:
                self.carried = carried.decode(doc, self.wallclock())
        except (StateFileError, carried.CarriedError) as exc:
            self._state_problem(path, f"verdict file unusable, ignored: {exc}")
        for port, why in (carried.failed_over(self.config, observed) if observed else {}).items():
            known = self.carried.get(port)
            if known is None and port not in self.drains:  # a drain explains the failover
                self.carried[port] = carried.Carried(
                    Verdict.DOWN, why, carried.probe_signals(self.config, port, ECHO_SIGNAL))
        for port, c in self.carried.items():
            log.warning("verdict_carried", port=port, rail=self._rail_of(port), verdict=str(c.verdict),
                        awaiting=",".join(c.awaiting) or "-", reason=c.reason)

    def _save_verdicts(self) -> None:
        """Write the verdict file when a verdict (or what it awaits) changed:
        after the kernel writes, so it never delays a failover."""
        verdicts = {p: (h.verdict, h.reason, health.bad_signals(h, self.config.health)
                        if h.verdict is not Verdict.UP else ())
                    for p, h in self.health.items()}
        if verdicts == self.saved_verdicts:
            return
        path = f"{self.config.state_dir}/{VERDICT_FILE}"
        try:
            write_json_atomic(path, carried.encode(verdicts, self.wallclock()))
        except OSError as exc:
            self._state_problem(path, f"cannot write the verdict file: {exc}")
            return
        self.saved_verdicts = verdicts
        self.state_problems.pop(path, None)

    def _load_allocation(self, observed: KernelState | None) -> None:
        """Nexthop ids, rule priorities and auto tables by name (core.alloc),
        from allocation.json; without a usable file, from what the kernel
        shows, so a host upgraded from positional numbering renumbers nothing.
        New numbers never take an id still in the kernel."""
        path = f"{self.config.state_dir}/{ALLOCATION_FILE}"
        previous = None
        try:
            doc = read_json(path)
            if doc is not None:
                previous = self.saved_allocation = alloc.Allocation.from_json(doc)
        except (StateFileError, alloc.AllocationFileError) as exc:
            self._state_problem(path, f"allocation file unusable, derived from the kernel "
                                      f"instead: {exc}")
        if previous is None and observed is not None:
            previous = alloc.derive(self.config, observed)
        reserved = alloc.kernel_ids(observed) if observed is not None else frozenset()
        try:
            allocation = alloc.allocate(self.config, previous, reserved)
        except alloc.AllocationError as exc:
            # What was kept no longer fits; numbering afresh beats not running
            # (the config check guarantees a fresh start fits).
            log.error("allocation_renumbered", error=str(exc))
            allocation = alloc.allocate(self.config, None)
        self.config = self._use_allocation(self.config, allocation)

    async def _kernel_ids(self) -> frozenset[int]:
        """Owned ids in the kernel now (a fresh dump; our view if that fails)."""
        assert self.kernel is not None
        try:
            return alloc.kernel_ids(await self.kernel.observe(self.config.ownership))
        except Exception as exc:  # noqa: BLE001 - fall back to what we know
            log.warning("allocation_kernel_read_failed", error=repr(exc), fallback="last view")
            return alloc.kernel_ids(self.kernel_view) if self.kernel_view else frozenset()

    def _use_allocation(self, config: Config, allocation: alloc.Allocation) -> Config:
        """Adopt `allocation`, write allocation.json if it changed (before any
        kernel write that uses it), and return `config` with its auto tables
        resolved. A write that fails is reported; the daemon goes on."""
        self.allocation = allocation
        path = f"{config.state_dir}/{ALLOCATION_FILE}"
        if allocation != self.saved_allocation:
            try:
                write_json_atomic(path, allocation.to_json())
                self.saved_allocation = allocation
                self.state_problems.pop(path, None)
            except OSError as exc:
                self._state_problem(path, f"cannot write the allocation file: {exc}")
        return alloc.resolve(config, allocation)

    def _load_mesh(self) -> None:
        """At start, before the echo service is made: the probe peers of the
        last plan applied (mesh.json), checked against this config like a
        plan just received. Standalone daemons ([aggregator] absent) have no
        mesh and ignore the file."""
        if self.config.aggregator is None:
            return
        path = f"{self.config.state_dir}/{MESH_FILE}"
        try:
            doc = read_json(path)
            if doc is None:
                return
            if doc.get("version") != MESH_FILE_VERSION:
                raise StateFileError(f"version {doc.get('version')!r}, expected {MESH_FILE_VERSION}")
            message = json_format.ParseDict(doc.get("probe_peers"), fleet_pb2.ProbePeers())
        except (StateFileError, json_format.ParseError, TypeError, AttributeError) as exc:
            self._state_problem(path, f"mesh file unusable, ignored (the aggregator's next plan "
                                      f"applies): {exc}")
            return
        self.mesh_message = self.saved_mesh_message = message
        self.saved_mesh = message.SerializeToString(deterministic=True)
        self.mesh_peers, problems = reports.validate_peers(self.config, message)
        self.mesh_probers, prober_problems = reports.validate_probers(self.config, message)
        self.mesh_slot.publish((self.mesh_peers, self.mesh_probers))
        log.info("mesh_peers_restored", generation=message.generation,
                 written_at=doc.get("written_at"), peers=sum(len(p) for p in self.mesh_peers.values()),
                 probed_by=sum(len(p) for p in self.mesh_probers.values()),
                 ignored=len(problems) + len(prober_problems))

    def _save_mesh(self) -> None:
        """After the pass: write mesh.json when the applied plan changed."""
        message = self.mesh_message
        if message is None or message is self.saved_mesh_message or self.config.aggregator is None:
            return
        raw = message.SerializeToString(deterministic=True)
        if raw == self.saved_mesh:
            self.saved_mesh_message = message  # every pass calls this: compare once per plan
            return
        path = f"{self.config.state_dir}/{MESH_FILE}"
        doc = {"version": MESH_FILE_VERSION, "written_at": self.wallclock(),
               "probe_peers": json_format.MessageToDict(message)}
        try:
            write_json_atomic(path, doc)
        except OSError as exc:
            self._state_problem(path, f"cannot write the mesh file: {exc}")
            return
        self.saved_mesh, self.saved_mesh_message = raw, message
        self.state_problems.pop(path, None)

    def _state_problem(self, path: str, detail: str) -> None:
        if path not in self.state_problems:
            log.error("state_file_problem", path=path, error=detail)
            self.state_problems[path] = Problem("state", path, detail, self.wallclock())

