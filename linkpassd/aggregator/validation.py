"""FleetService.Validate and GetValidationReport: a fleet validation run,
from the operator's cabling plan to the report (issue 13).

Why here and not in each host: the hosts see only their own ports and the
peers they are told to probe; the aggregator is the one place that knows
which hosts are connected, where each rail's address lives (the hosts'
inventories) and which hosts share a leaf (the plan). So it

1. selects the hosts: plan ∩ request.hosts ∩ connected. A selected host that
   is not connected is *reported* ("not connected"), never silently dropped:
   a cluster with an unvalidated host is not ready to hand over;
2. gives each host its part (ValidateHost): the ports the plan expects of it,
   whom to probe (linkpassd.validate.probeplan over the connected hosts,
   with their rail addresses from their inventories) and how fast
   (linkpassd.validate.schedule: rates within a per-host probe budget, a
   burst long enough to resolve the target loss on every port), over
   `FLOWS` source ports per target;
3. sends every command at once down the hosts' streams (the command relay
   FleetDrain uses: HostSession.commands + send), so the whole fleet's window
   runs in parallel and a run takes one window, not one per host;
4. streams progress as results come back, gives up on a host at its window
   plus a margin (reported "timed out"), and
5. localises (linkpassd.validate.localize): which link or device is at fault.

One run at a time: two runs would probe each other's links at the high rate
and each find the other's traffic as loss. The last report stays in memory
(GetValidationReport, the page); it is not stored, so an aggregator restart
forgets it (the operator's own JSON output is the durable copy).
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
import structlog

from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd.aggregator.session import HostSession, StreamEnd
from linkpassd.validate import localize as locate
from linkpassd.validate import plan as cabling
from linkpassd.validate import probeplan
from linkpassd.validate import schedule as rates
from linkpassd.validate.plan import CablingPlan

if TYPE_CHECKING:
    from linkpassd.aggregator.fleet import Fleet

log = structlog.get_logger("linkpassd.aggregator.validation")

DEFAULT_DURATION_S = 30.0  # fleet.proto ValidateRequest.duration_s 0
MIN_DURATION_S = 1.0
MAX_DURATION_S = 600.0
# Beyond its window, how long a host may take to answer: its last LLDP read,
# counters, the result's trip up the stream on a loaded aggregator.
ANSWER_MARGIN_S = 15.0
FLOWS = 8  # UDP source ports per target (the host's default too; fleet.proto ValidateHost.flows)
MAX_PLAN_PORTS = 100_000  # 2,048 hosts x 8 rails x a few: a bound on what one request may carry
NOT_CONNECTED = "not connected"
# Several replicas (replicas.py): a run reaches only the hosts on the streams
# of the replica that runs it; the others are named, never silently dropped.
ON_OTHER_REPLICA = "on another aggregator replica (validation reaches the hosts of the replica it runs on)"
TIMED_OUT = "timed out"


class RequestError(Exception):
    """The request cannot run: `code` and a message naming what is wrong."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Selection:
    """What a request asks for, checked: the plan's ports of the selected
    hosts and rails, and the selected hosts (connected or not)."""

    plan: CablingPlan  # the selected hosts' ports on the selected rails
    # Every host's ports on the selected rails: localisation names where a
    # miswired cable should go even when that switch port is another host's.
    reference: CablingPlan
    hosts: tuple[str, ...]  # sorted
    rails: tuple[str, ...]  # sorted
    duration_s: float


def select(request: pb.ValidateRequest) -> Selection:
    """Check a ValidateRequest against its own plan (pure): hosts and rails it
    names must be in the plan, the duration in range. RequestError names the
    bad input."""
    if not request.plan:
        raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, "the request carries no cabling plan (plan is empty)")
    if len(request.plan) > MAX_PLAN_PORTS:
        raise RequestError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"the plan has {len(request.plan)} ports: at most {MAX_PLAN_PORTS}")
    try:
        full = cabling.plan_from_proto(request.plan)
    except cabling.PlanError as exc:
        raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, f"cabling plan: {exc}") from None
    duration = request.duration_s or DEFAULT_DURATION_S
    if not math.isfinite(duration) or not MIN_DURATION_S <= duration <= MAX_DURATION_S:
        raise RequestError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"duration_s {request.duration_s!r}: between {MIN_DURATION_S:g} and "
                           f"{MAX_DURATION_S:g} s (0: {DEFAULT_DURATION_S:g} s)")
    plan_hosts = {p.host for p in full.ports}
    plan_rails = {p.rail for p in full.ports}
    unknown_hosts = sorted(set(request.hosts) - plan_hosts)
    if unknown_hosts:
        raise RequestError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"hosts not in the cabling plan: {', '.join(unknown_hosts[:10])}"
                           f"{' …' if len(unknown_hosts) > 10 else ''}")
    unknown_rails = sorted(set(request.rails) - plan_rails)
    if unknown_rails:
        raise RequestError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"rails not in the cabling plan: {', '.join(unknown_rails)} "
                           f"(it has {', '.join(sorted(plan_rails))})")
    selected = full.select(request.hosts, request.rails)
    if not selected.ports:
        raise RequestError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"the plan has no port of hosts {sorted(request.hosts)[:10]} "
                           f"on rails {sorted(request.rails)}")
    return Selection(plan=selected, reference=full.select(rails=request.rails), hosts=selected.hosts(),
                     rails=selected.rails(), duration_s=duration)


def rail_addresses(inventory: pb.Inventory | None) -> dict[str, str]:
    """rail -> its address without prefix, from one host's inventory; a rail
    whose address does not parse is left out (the host is then not probed
    on it, and the report says so)."""
    out: dict[str, str] = {}
    for rail in inventory.rails if inventory is not None else ():
        try:
            out[rail.rail] = str(ipaddress.ip_interface(rail.address.strip()).ip)
        except ValueError:
            continue
    return out


def expected_ports(selection: Selection, host: str) -> list[pb.ExpectedPort]:
    return [pb.ExpectedPort(port=p.port, rail=p.rail, speed_mbps=p.speed_mbps, switch_name=p.switch,
                            switch_port=p.switch_port)
            for p in selection.plan.ports if p.host == host]


def unvalidated_finding(result: pb.HostValidationResult) -> pb.Finding:
    """A host that gave no result is a finding of its own: nothing about it
    was proven, so the cluster is not ready to hand over."""
    return pb.Finding(kind="no_result", component=f"{result.host_id} ({result.status})", hosts=[result.host_id],
                      evidence=[f"{result.host_id}: {result.status}: its ports and cables were not checked"],
                      confidence=1.0)


class Validations:
    """The validation runs of one aggregator: at most one at a time, and the last report."""

    def __init__(self, fleet: Fleet, *, margin_s: float = ANSWER_MARGIN_S,
                 budget_pps: float = rates.HOST_BUDGET_PPS) -> None:
        self.fleet = fleet
        self.margin_s = margin_s
        self.budget_pps = budget_pps  # [validation] host_budget_pps
        self.last: pb.ValidationReport | None = None
        self.running: tuple[str, str] | None = None  # (run_id, by)

    async def run(self, request: pb.ValidateRequest, by: str,
                  context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ValidateResponse]:
        try:
            selection = select(request)
        except RequestError as exc:
            await context.abort(exc.code, exc.message)
        if self.running is not None:
            running_id, running_by = self.running
            await context.abort(grpc.StatusCode.ABORTED,
                                f"validation {running_id} (by {running_by}) is running: one at a time, "
                                "so that two runs do not count each other's probes as loss; wait for its report")
        run_id = f"val-{uuid.uuid4().hex[:12]}"
        self.running = (run_id, by)  # no await since the check above: two calls cannot both pass it
        try:
            async for response in self._run(selection, run_id, by):
                yield response
        finally:
            self.running = None

    async def _run(self, selection: Selection, run_id: str, by: str) -> AsyncIterator[pb.ValidateResponse]:
        fleet = self.fleet
        started = fleet.clock()
        sessions = {h: s for h in selection.hosts if (s := fleet.sessions.get(h)) is not None and s.open}
        elsewhere: set[str] = set()
        if fleet.replicas is not None:
            now = fleet.clock()
            elsewhere = {row.host_id for row in await fleet.store.hosts(
                [h for h in selection.hosts if h not in sessions]) if fleet.connected(row, now)}
        results: dict[str, pb.HostValidationResult] = {
            h: pb.HostValidationResult(host_id=h, status=ON_OTHER_REPLICA if h in elsewhere else NOT_CONNECTED)
            for h in selection.hosts if h not in sessions}
        # Off the loop for a big fleet (aggregator.worker): at 2,048 hosts x 8
        # rails the probe plan is seconds of pure Python, and every agent's
        # stream would wait that long for its acks.
        wire, unprobed, plan = await fleet.worker.run(
            len(sessions), plan_commands_wire, selection, run_id, addresses_of(sessions), self.budget_pps)
        commands = {host: pb.ValidateHost.FromString(raw) for host, raw in wire.items()}
        log.info("validation_started", run_id=run_id, by=by, hosts=len(selection.hosts), connected=len(sessions),
                 rails=list(selection.rails), duration_s=selection.duration_s,
                 targets=sum(len(c.targets) for c in commands.values()), rate_pps=plan.rate_pps,
                 burst_pps=plan.burst_pps, burst_s=plan.burst_s, host_load=plan.host_load,
                 expected_resolution=plan.resolution)
        loop = asyncio.get_running_loop()
        pending: dict[asyncio.Future[pb.CommandResult], tuple[str, str]] = {}
        for host, validate in commands.items():
            session = sessions[host]
            command = pb.Command(id=fleet.command_id(), by=by, validate=validate)
            future: asyncio.Future[pb.CommandResult] = loop.create_future()
            session.commands[command.id] = future
            session.send(pb.ConnectResponse(command=command))
            pending[future] = (host, command.id)
        total = len(pending)
        done = 0
        yield pb.ValidateResponse(progress=pb.ValidateProgress(hosts_done=0, hosts_total=total))
        timeout = selection.duration_s + self.margin_s
        deadline = loop.time() + timeout
        try:
            while pending:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                finished, _ = await asyncio.wait(pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                for future in finished:
                    host, _ = pending.pop(future)
                    results[host] = self._result(host, run_id, future)
                    done += 1
                    yield pb.ValidateResponse(progress=pb.ValidateProgress(
                        hosts_done=done, hosts_total=total, last_host=host))
            for _future, (host, _) in sorted(pending.items(), key=lambda item: item[1]):
                results[host] = pb.HostValidationResult(host_id=host, status=TIMED_OUT)
                log.warning("validation_host_timed_out", run_id=run_id, host=host, after_s=timeout)
                done += 1
                yield pb.ValidateResponse(progress=pb.ValidateProgress(
                    hosts_done=done, hosts_total=total, last_host=host))
        finally:
            for future, (host, command_id) in pending.items():
                future.cancel()
                session = sessions[host]
                session.commands.pop(command_id, None)
        for host, rails in unprobed.items():
            if results[host].status == "ok":
                results[host].validation.problems.extend(
                    f"no usable address for {rail} in the host's inventory: not probed on {rail}"
                    for rail in sorted(set(rails)))
        ordered = [results[h] for h in selection.hosts]
        report = pb.ValidationReport(run_id=run_id, hosts=ordered)
        report.started.FromNanoseconds(round(started * 1e9))
        report.findings.extend(unvalidated_finding(r) for r in ordered if r.status != "ok")
        try:
            answered = [r for r in ordered if r.status == "ok"]
            analysis = await fleet.worker.run(len(answered), analyse_wire, selection.reference,
                                              [r.SerializeToString() for r in answered])
            report.findings.extend(f.to_proto() for f in analysis.findings)
            report.loss_resolution = analysis.loss_resolution
        except Exception as exc:  # a localiser bug must not lose the hosts' results: report them without
            log.exception("validation_localize_failed", run_id=run_id, error=str(exc))
            report.findings.append(pb.Finding(
                kind="internal", component="localisation failed (see the hosts' results)",
                evidence=[f"linkpassd.validate.localize raised {type(exc).__name__}: {exc}"[:500]], confidence=1.0))
        report.finished.FromNanoseconds(round(fleet.clock() * 1e9))
        self.last = report
        log.info("validation_finished", run_id=run_id, by=by, findings=len(report.findings),
                 hosts_ok=sum(r.status == "ok" for r in ordered), hosts=len(ordered))
        yield pb.ValidateResponse(report=report)

    @staticmethod
    def _result(host: str, run_id: str, future: asyncio.Future[pb.CommandResult]) -> pb.HostValidationResult:
        """One host's answer as the report shows it: "ok" with its findings,
        or why it gave none."""

        try:
            answer = future.result()
        except StreamEnd as end:
            return pb.HostValidationResult(host_id=host, status=f"disconnected: {end.message}")
        except asyncio.CancelledError:
            return pb.HostValidationResult(host_id=host, status="cancelled")
        if answer.code != 0:
            name = next((c.name for c in grpc.StatusCode if c.value[0] == answer.code), f"code {answer.code}")
            return pb.HostValidationResult(host_id=host, status=f"failed: {name}: {answer.message}"[:500])
        if not answer.HasField("validation"):
            return pb.HostValidationResult(host_id=host, status="failed: the host answered without a validation")
        if answer.validation.run_id and answer.validation.run_id != run_id:
            return pb.HostValidationResult(
                host_id=host, status=f"failed: the host answered for run {answer.validation.run_id[:40]}, not {run_id}")
        return pb.HostValidationResult(host_id=host, status="ok", validation=answer.validation)


def addresses_of(sessions: dict[str, HostSession]) -> dict[str, dict[str, str]]:
    """Each connected host's rail addresses, from its inventory (what the
    probe plan needs of a session; plain dicts travel to the worker)."""
    return {host: rail_addresses(session.inventory) for host, session in sessions.items()}


def plan_commands(selection: Selection, run_id: str, addresses: dict[str, dict[str, str]],
                  budget_pps: float
                  ) -> tuple[dict[str, pb.ValidateHost], dict[str, list[str]], rates.Schedule]:
    """Each host's ValidateHost (hosts: the keys of `addresses`), per host
    the rails it cannot be probed on (no address in its inventory), and the
    run's rates. Pure: runs on the aggregator's worker for a big fleet."""
    members = []
    unprobed: dict[str, list[str]] = defaultdict(list)
    for port in selection.plan.ports:
        if port.host not in addresses:
            continue
        address = addresses[port.host].get(port.rail)
        if address is None:
            unprobed[port.host].append(port.rail)
            continue
        # The leaf is the plan's switch (not the inventory's leaf): the plan says
        # where the cable must go, and the probe plan must cover its leaves.
        members.append(probeplan.Member(host=port.host, rail=port.rail, address=address, leaf=port.switch))
    probes = probeplan.ProbePlan.build(members)
    plan = rates.schedule(probes, selection.duration_s, budget_pps=budget_pps)
    commands = {}
    for host in addresses:
        commands[host] = pb.ValidateHost(
            run_id=run_id, duration_s=selection.duration_s, ports=expected_ports(selection, host),
            targets=[t.to_proto() for t in probes.targets_for(host)],
            probed_by=[t.to_proto() for t in probes.probers_of(host)],
            rate_pps=plan.rate_pps, burst_pps=plan.burst_pps, burst_s=plan.burst_s, flows=FLOWS)
    return dict(commands), dict(unprobed), plan


def plan_commands_wire(selection: Selection, run_id: str, addresses: dict[str, dict[str, str]],
                       budget_pps: float
                       ) -> tuple[dict[str, bytes], dict[str, list[str]], rates.Schedule]:
    """plan_commands with each ValidateHost serialized: what crosses to and
    from the worker process (our generated message classes do not pickle:
    their module is named after the proto package, not linkpassd._proto)."""
    commands, unprobed, plan = plan_commands(selection, run_id, addresses, budget_pps)
    return {host: c.SerializeToString() for host, c in commands.items()}, unprobed, plan


def analyse_wire(plan: CablingPlan, results: Sequence[bytes]) -> locate.Analysis:
    """analyse() from serialized HostValidationResults (see plan_commands_wire)."""
    return analyse(plan, [pb.HostValidationResult.FromString(raw) for raw in results])


def analyse(plan: CablingPlan, results: Sequence[pb.HostValidationResult]) -> locate.Analysis:
    """The boundary to linkpassd.validate.localize: the plan and the hosts that
    answered -> the findings (which link or device is at fault) and the loss
    rate the run resolved."""
    return locate.localize(plan, results)
