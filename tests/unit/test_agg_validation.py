"""FleetService.Validate and GetValidationReport (aggregator/validation.py)
end to end: a real aggregator (grpc.aio, SQLite store) and fake agents played
by the test, which answer ValidateHost commands with crafted HostValidation
(a test double of the daemon's hostcheck: the host side has its own tests).

Localisation is linkpassd.validate.localize's (tested there); here a trivial
stand-in replaces it where a test needs a finding of its own making, so these
tests say what the aggregator does with findings, not which ones exist."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from agg_tls import channel, insecure_settings, make_pki, serving, tls_settings
from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd._proto.linkpass.v1 import fleet_pb2_grpc as pb_grpc
from linkpassd.aggregator import validation, web
from linkpassd.validate.localize import Analysis, Finding

DEADLINE_S = 30.0  # generous: a busy 2-core machine

# Two leaves per rail: h1, h2 under leaf-rN-a; h3, h4 under leaf-rN-b.
HOSTS = ("h1", "h2", "h3", "h4")
RAILS = ("rail0", "rail1")


def leaf(host: str, rail: str) -> str:
    return f"leaf-r{rail[-1]}-{'a' if host in ('h1', 'h2') else 'b'}"


def address(host: str, rail: str) -> str:
    return f"198.18.{rail[-1]}.{host[-1]}"


def plan(hosts=HOSTS, rails=RAILS) -> list[pb.PlannedPort]:
    return [pb.PlannedPort(host=h, port=f"eth{r[-1]}", switch_name=leaf(h, r), switch_port=f"Ethernet{h[-1]}",
                           rail=r, speed_mbps=400_000) for h in hosts for r in rails]


def run(scenario: Awaitable[None], timeout: float = 120.0) -> None:
    asyncio.run(asyncio.wait_for(scenario, timeout))


async def eventually(check: Callable[[], bool], what: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def healthy_answer(command: pb.Command) -> pb.HostValidation:
    """What a healthy host reports: every expected port up at speed with the
    planned LLDP neighbour, every probe answered."""
    v = command.validate
    return pb.HostValidation(
        run_id=v.run_id,
        ports=[pb.PortCheck(port=p.port, rail=p.rail, carrier=True, speed_mbps=p.speed_mbps,
                            lldp_system=p.switch_name, lldp_port=p.switch_port, lldp_source="wire")
               for p in v.ports],
        pairs=[pb.PairResult(rail=t.rail, peer=t.peer, peer_host=t.peer_host, sent=100, received=100,
                             rtt_p50_us=40, rtt_p99_us=90, burst_sent=1000, burst_received=1000)
               for t in v.targets])


class FakeAgent:
    """One host's agent stream: Hello, an Inventory with its rail addresses,
    then answers ValidateHost commands as `mode` says: "answer" at once,
    "held" once `release` is set, "silent" never, or "busy" (ABORTED, as a
    host already running a validation answers)."""

    def __init__(self, ch: grpc.aio.Channel, host: str, mode: str = "answer") -> None:
        self.host = host
        self.mode = mode
        self.call = pb_grpc.AgentServiceStub(ch).Connect()
        self.commands: list[pb.Command] = []
        self.release = asyncio.Event()
        self.answer = healthy_answer
        self.task: asyncio.Task[None] | None = None

    async def start(self, rails=RAILS) -> None:
        await self.call.write(pb.ConnectRequest(hello=pb.Hello(host_id=self.host, boot_id="boot-a", version="t")))
        while (await asyncio.wait_for(self.call.read(), DEADLINE_S)).WhichOneof("body") != "welcome":
            pass
        await self.call.write(pb.ConnectRequest(inventory=pb.Inventory(rails=[
            pb.RailInventory(rail=r, port=f"eth{r[-1]}", address=f"{address(self.host, r)}/24", leaf=leaf(self.host, r))
            for r in rails])))
        self.task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            got = await self.call.read()
            if got is grpc.aio.EOF:
                return
            if got.WhichOneof("body") != "command" or got.command.WhichOneof("action") != "validate":
                continue
            command = got.command
            self.commands.append(command)
            if self.mode == "silent":
                continue
            if self.mode == "busy":
                await self.call.write(pb.ConnectRequest(command_result=pb.CommandResult(
                    id=command.id, code=grpc.StatusCode.ABORTED.value[0], message="a validation is running")))
                continue
            if self.mode == "held":
                await asyncio.wait_for(self.release.wait(), DEADLINE_S)
            await self.call.write(pb.ConnectRequest(command_result=pb.CommandResult(
                id=command.id, validation=self.answer(command))))

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.call.cancel()


async def connect_agents(server, ch: grpc.aio.Channel, modes: dict[str, str], rails=RAILS) -> dict[str, FakeAgent]:
    agents = {host: FakeAgent(ch, host, mode) for host, mode in modes.items()}
    for agent in agents.values():
        await agent.start(rails)
    sessions = server.fleet.sessions
    await eventually(lambda: all(h in sessions and sessions[h].inventory is not None
                                 and len(sessions[h].inventory.rails) == len(rails) for h in agents),
                     "the agents' inventories")
    return agents


async def rest(call) -> list[pb.ValidateResponse]:
    """The call's responses up to its end, read with read() (grpc.aio does not
    let one call mix read() and async iteration)."""
    out = []
    while (got := await call.read()) is not grpc.aio.EOF:
        out.append(got)
    return out


def trivial_analyse(plan_, results) -> Analysis:
    """One finding per host whose pairs lost probes, naming the host."""
    return Analysis(findings=tuple(
        Finding(kind="lossy_link", component=f"{r.host_id} lost probes", hosts=(r.host_id,), confidence=0.5)
        for r in results if any(p.received < p.sent for p in r.validation.pairs)), loss_resolution=0.0123)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("val-pki"))


# --------------------------------------------------------------------------


def test_progress_streams_as_hosts_answer_and_the_report_names_every_host(tmp_path: Path, monkeypatch) -> None:
    """h1, h3 answer at once, h2 only when released, h4 is in the plan but not
    connected: progress 2/3 arrives while h2 still holds; the report has all
    four hosts, h4 "not connected" (a finding of its own), and what the
    (stand-in) localiser found in h3's answer."""
    monkeypatch.setattr(validation, "analyse", trivial_analyse)

    async def scenario() -> None:
        async with serving(insecure_settings(tmp_path / "fleet.db")) as server:
            async with channel(server.port, None) as ch:
                agents = await connect_agents(server, ch, {"h1": "answer", "h2": "held", "h3": "answer"})

                def lossy(command: pb.Command) -> pb.HostValidation:
                    answer = healthy_answer(command)
                    answer.pairs[0].received = 90
                    return answer
                agents["h3"].answer = lossy
                fleet = pb_grpc.FleetServiceStub(ch)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await fleet.GetValidationReport(pb.GetValidationReportRequest(), timeout=DEADLINE_S)
                assert err.value.code() == grpc.StatusCode.NOT_FOUND

                call = fleet.Validate(pb.ValidateRequest(plan=plan(), duration_s=5), timeout=DEADLINE_S)
                first = await call.read()
                assert first.progress == pb.ValidateProgress(hosts_done=0, hosts_total=3)
                seen = []
                while len(seen) < 2:
                    seen.append((await call.read()).progress)
                assert sorted(p.last_host for p in seen) == ["h1", "h3"]
                assert [p.hosts_done for p in seen] == [1, 2] and {p.hosts_total for p in seen} == {3}
                assert agents["h2"].commands, "h2 got its command with the others"
                agents["h2"].release.set()
                last = await call.read()
                assert (last.progress.hosts_done, last.progress.last_host) == (3, "h2")
                report = (await call.read()).report
                assert await call.read() is grpc.aio.EOF

                assert [(h.host_id, h.status) for h in report.hosts] == [
                    ("h1", "ok"), ("h2", "ok"), ("h3", "ok"), ("h4", "not connected")]
                assert report.hosts[0].validation.run_id == report.run_id
                assert [(f.kind, list(f.hosts)) for f in report.findings] == [
                    ("no_result", ["h4"]), ("lossy_link", ["h3"])]
                assert report.started.seconds and report.finished.ToNanoseconds() >= report.started.ToNanoseconds()
                assert report.loss_resolution == 0.0123  # the localiser's
                again = await fleet.GetValidationReport(pb.GetValidationReportRequest(), timeout=DEADLINE_S)
                assert again.report == report
                page = web.render_page(pb.ListHostsResponse(), [], pb.GetSummaryResponse(), insecure=True,
                                       now=time.time(), validation=server.fleet_api.validations.last)
                assert "Last validation" in page and "h3 lost probes" in page and "h4 (not connected)" in page
                for agent in agents.values():
                    agent.stop()

    run(scenario())


def test_each_host_gets_its_planned_ports_and_peers_at_their_inventory_addresses(tmp_path: Path) -> None:
    """ExpectedPorts from the plan; targets from the probe plan over the
    connected hosts, each peer at the address its own inventory gives for
    that rail; who probes a host is named too (its responder must answer)."""
    async def scenario() -> None:
        # a probe budget that binds: 100 probes/s over the busiest host's pairs
        async with serving(insecure_settings(tmp_path / "fleet.db", validation_host_budget_pps=100.0)) as server:
            async with channel(server.port, None) as ch:
                agents = await connect_agents(server, ch, {h: "answer" for h in HOSTS})
                call = pb_grpc.FleetServiceStub(ch).Validate(
                    pb.ValidateRequest(plan=plan(), rails=["rail1"], duration_s=3), timeout=DEADLINE_S)
                report = [r async for r in call][-1].report
                assert [h.status for h in report.hosts] == ["ok"] * 4
                assert list(report.findings) == []  # healthy answers: the real localiser finds nothing
                assert 0 < report.loss_resolution < 0.05
                sent: set[tuple[str, str]] = set()
                for host, agent in agents.items():
                    (command,) = agent.commands
                    v = command.validate
                    assert command.by == "insecure-mode operator" and v.run_id == report.run_id
                    assert [(p.port, p.rail, p.switch_name, p.switch_port, p.speed_mbps) for p in v.ports] == [
                        ("eth1", "rail1", leaf(host, "rail1"), f"Ethernet{host[-1]}", 400_000)]
                    assert v.duration_s == 3 and v.rate_pps > 0 and v.burst_pps > 0 and v.burst_s > 0
                    assert v.flows == 8
                    load = max(len(a.commands[0].validate.targets) + len(a.commands[0].validate.probed_by)
                               for a in agents.values())
                    assert v.burst_pps * load <= 100.0 < 500.0 * load  # schedule's cap, from the setting
                    for t in v.targets:
                        assert (t.rail, t.peer) == ("rail1", address(t.peer_host, "rail1")), t
                        sent.add(tuple(sorted((host, t.peer_host))))
                    for t in v.probed_by:
                        assert t.peer == address(t.peer_host, "rail1") and host in {
                            x.peer_host for x in agents[t.peer_host].commands[0].validate.targets}
                # Both pairs under each leaf, and the two leaves reach each other.
                assert {("h1", "h2"), ("h3", "h4")} <= sent
                assert any(a in ("h1", "h2") and b in ("h3", "h4") for a, b in sent)
                for agent in agents.values():
                    agent.stop()

    run(scenario())


def test_a_host_that_never_answers_times_out_and_is_reported(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(insecure_settings(tmp_path / "fleet.db")) as server:
            server.fleet_api.validations.margin_s = 1.0
            async with channel(server.port, None) as ch:
                agents = await connect_agents(server, ch, {"h1": "answer", "h2": "silent", "h3": "busy"})
                started = time.monotonic()
                call = pb_grpc.FleetServiceStub(ch).Validate(
                    pb.ValidateRequest(plan=plan(hosts=("h1", "h2", "h3")), duration_s=1), timeout=DEADLINE_S)
                responses = [r async for r in call]
                took = time.monotonic() - started
                assert [r.progress.hosts_done for r in responses[:-1]] == [0, 1, 2, 3]
                assert responses[-2].progress.last_host == "h2"  # the one that timed out comes last
                report = responses[-1].report
                statuses = {h.host_id: h.status for h in report.hosts}
                assert statuses["h1"] == "ok" and statuses["h2"] == "timed out"
                assert statuses["h3"].startswith("failed: ABORTED") and "a validation is running" in statuses["h3"]
                assert sorted(f.component for f in report.findings if f.kind == "no_result") == [
                    "h2 (timed out)", f"h3 ({statuses['h3']})"]
                assert 2.0 <= took < DEADLINE_S, took  # waited its window + margin for h2, no more
                assert agents["h2"].commands  # it was asked
                assert server.fleet.sessions["h2"].commands == {}  # nothing left waiting for it
                for agent in agents.values():
                    agent.stop()

    run(scenario())


def test_a_rail_without_an_address_in_the_inventory_is_reported_not_probed(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(insecure_settings(tmp_path / "fleet.db")) as server:
            async with channel(server.port, None) as ch:
                agents = await connect_agents(server, ch, {"h1": "answer", "h2": "answer"}, rails=("rail0",))
                call = pb_grpc.FleetServiceStub(ch).Validate(
                    pb.ValidateRequest(plan=plan(hosts=("h1", "h2")), duration_s=1), timeout=DEADLINE_S)
                report = (await rest(call))[-1].report
                # Both still check both planned ports; nobody probes on rail1.
                assert [p.rail for p in agents["h1"].commands[0].validate.ports] == ["rail0", "rail1"]
                assert {t.rail for a in agents.values() for t in a.commands[0].validate.targets} == {"rail0"}
                for host in report.hosts:
                    assert "no usable address for rail1 in the host's inventory: not probed on rail1" in list(
                        host.validation.problems)
                assert {f.kind for f in report.findings} == {"incomplete"}  # the localiser's word for it
                for agent in agents.values():
                    agent.stop()

    run(scenario())


def test_a_second_validation_is_refused_while_one_runs_naming_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(insecure_settings(tmp_path / "fleet.db")) as server:
            async with channel(server.port, None) as ch:
                agents = await connect_agents(server, ch, {"h1": "held", "h2": "answer"})
                fleet = pb_grpc.FleetServiceStub(ch)
                request = pb.ValidateRequest(plan=plan(hosts=("h1", "h2")), duration_s=5)
                first = fleet.Validate(request, timeout=DEADLINE_S)
                assert (await first.read()).progress.hosts_total == 2
                # the progress leaves as the commands do: h1 may not have read its own yet
                await eventually(lambda: bool(agents["h1"].commands), "h1 to receive its command")
                run_id = agents["h1"].commands[0].validate.run_id
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await fleet.Validate(request, timeout=DEADLINE_S).read()
                assert err.value.code() == grpc.StatusCode.ABORTED
                assert run_id in err.value.details() and "one at a time" in err.value.details()
                assert len(agents["h2"].commands) == 1  # the refused run sent nothing
                agents["h1"].release.set()
                assert (await rest(first))[-1].report.run_id == run_id
                # Once it is over, the next one runs.
                again = [r async for r in fleet.Validate(request, timeout=DEADLINE_S)]
                assert again[-1].report.run_id not in ("", run_id)
                for agent in agents.values():
                    agent.stop()

    run(scenario())


def test_a_cancelled_validation_frees_the_slot(tmp_path: Path) -> None:
    """The operator's Ctrl-C ends the call: the next run must not be refused for ever."""
    async def scenario() -> None:
        async with serving(insecure_settings(tmp_path / "fleet.db")) as server:
            async with channel(server.port, None) as ch:
                agents = await connect_agents(server, ch, {"h1": "silent"})
                fleet = pb_grpc.FleetServiceStub(ch)
                request = pb.ValidateRequest(plan=plan(hosts=("h1",)), duration_s=60)
                first = fleet.Validate(request, timeout=DEADLINE_S)
                await first.read()
                first.cancel()
                validations = server.fleet_api.validations
                await eventually(lambda: validations.running is None, "the cancelled run to end")
                assert server.fleet.sessions["h1"].commands == {}
                agents["h1"].stop()

    run(scenario())


@pytest.mark.parametrize("request_, words", [
    (pb.ValidateRequest(), ["no cabling plan"]),
    (pb.ValidateRequest(plan=plan(), hosts=["h9"]), ["not in the cabling plan", "h9"]),
    (pb.ValidateRequest(plan=plan(), rails=["rail7"]), ["rail7", "rail0, rail1"]),
    (pb.ValidateRequest(plan=plan(), duration_s=-1), ["duration_s -1"]),
    (pb.ValidateRequest(plan=plan(), duration_s=float("nan")), ["duration_s nan"]),
    (pb.ValidateRequest(plan=plan() + plan()[:1]), ["entry 9", "already planned in entry 1"]),
    (pb.ValidateRequest(plan=[pb.PlannedPort(host="h1", port="eth0", rail="rail0")]), ["entry 1", "switch"]),
])
def test_bad_requests_are_refused_naming_what_is_wrong(tmp_path: Path, request_, words) -> None:
    async def scenario() -> None:
        async with serving(insecure_settings(tmp_path / "fleet.db")) as server:
            async with channel(server.port, None) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await pb_grpc.FleetServiceStub(ch).Validate(request_, timeout=DEADLINE_S).read()
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                for word in words:
                    assert word in err.value.details(), err.value.details()
                assert server.fleet_api.validations.running is None

    run(scenario())


def test_validation_needs_an_operator_and_reading_the_report_does_not(pki: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving(tls_settings(pki, tmp_path / "fleet.db")) as server:
            async with channel(server.port, pki, "h1") as ch:
                fleet = pb_grpc.FleetServiceStub(ch)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await fleet.Validate(pb.ValidateRequest(plan=plan()), timeout=DEADLINE_S).read()
                assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "Validate needs an operator certificate" in err.value.details()
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await fleet.GetValidationReport(pb.GetValidationReportRequest(), timeout=DEADLINE_S)
                assert err.value.code() == grpc.StatusCode.NOT_FOUND  # allowed to read; nothing yet
            async with channel(server.port, pki, "alice") as ch:
                # The operator gets past the identity check (to the plan's: none of its hosts is connected).
                responses = [r async for r in pb_grpc.FleetServiceStub(ch).Validate(
                    pb.ValidateRequest(plan=plan(hosts=("h1",))), timeout=DEADLINE_S)]
                report = responses[-1].report
                assert [(h.host_id, h.status) for h in report.hosts] == [("h1", "not connected")]
                assert [f.kind for f in report.findings] == ["no_result"]

    run(scenario())


# --------------------------------------------------------------------------
# the page's section (pure)
# --------------------------------------------------------------------------


def test_the_page_shows_the_last_validation_or_says_there_is_none() -> None:
    def page(report: pb.ValidationReport | None) -> str:
        return web.render_page(pb.ListHostsResponse(), [], pb.GetSummaryResponse(), insecure=False,
                               now=1_800_000_100.0, validation=report)

    assert "No validation has run" in page(None)
    report = pb.ValidationReport(run_id="val-1", hosts=[pb.HostValidationResult(host_id="h1", status="ok")],
                                 loss_resolution=0.003)
    report.started.FromSeconds(1_800_000_000)
    report.finished.FromSeconds(1_800_000_040)
    clean = page(report)
    assert 'id="no-findings"' in clean and "val-1" in clean and "took 40 s" in clean and "1 of 1 hosts" in clean
    report.findings.append(pb.Finding(kind="miswire", component="h1 eth0 <script>", rail="rail0",
                                      evidence=["LLDP says leaf-b Ethernet2"], confidence=0.9,
                                      fix="move h1 eth0 to leaf-a Ethernet1"))
    found = page(report)
    assert 'id="findings"' in found and 'data-kind="miswire"' in found and "<script>" not in found
    assert "h1 eth0 &lt;script&gt;" in found and "90%" in found and "move h1 eth0 to leaf-a Ethernet1" in found
