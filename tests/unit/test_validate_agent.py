"""The agent's handler of Command.validate (daemon.aggregator) and the host check's
pure parts (adapters.hostcheck): one validation at a time per host, the
answer's shape through the real agent stream, bad requests named, a run
bounded by its duration, and the daemon's other commands unblocked while a
validation runs."""

from __future__ import annotations

import asyncio
import math

import grpc

from linkpassd._proto.linkpass.v1 import fleet_pb2
from linkpassd.adapters import hostcheck
from linkpassd.adapters.links import LinkSnapshot
from linkpassd.core.model import CounterSample, HealthPolicy, LinkSample, ModuleIdentity, OpticsReading, Unreadable
from linkpassd.core.model import Thresholds as ModelThresholds
from linkpassd.daemon import aggregator as agentlink
from test_agent import connected_agent, make_daemon, until
from test_daemon_faults import link

OK, ABORTED = grpc.StatusCode.OK.value[0], grpc.StatusCode.ABORTED.value[0]


class GatedValidation:
    """Stands in for hostcheck.validate_host: answers once released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started: list[tuple[fleet_pb2.ValidateHost, hostcheck.HostContext]] = []
        self.cancelled = 0

    async def __call__(self, request, context):
        self.started.append((request, context))
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return fleet_pb2.HostValidation(
            run_id=request.run_id,
            ports=[fleet_pb2.PortCheck(port="eth0", rail="rail0", carrier=True)],
            pairs=[fleet_pb2.PairResult(rail="rail0", peer=t.peer, sent=10, received=9)
                   for t in request.targets])


def validate(command_id: str, run_id: str, duration_s: float = 5.0, **kw) -> fleet_pb2.ConnectResponse:
    request = fleet_pb2.ValidateHost(
        run_id=run_id, duration_s=duration_s, rate_pps=10, burst_pps=100, burst_s=1,
        ports=[fleet_pb2.ExpectedPort(port="eth0", rail="rail0")],
        targets=[fleet_pb2.ProbeTarget(rail="rail0", peer="198.19.0.7", peer_host="gpu-002")],
        **kw)
    return fleet_pb2.ConnectResponse(command=fleet_pb2.Command(id=command_id, by="alice",
                                                               validate=request))


def test_one_validation_at_a_time_and_its_answer_carries_the_host_validation(tmp_path, monkeypatch):
    gate = GatedValidation()
    monkeypatch.setattr(hostcheck, "validate_host", gate)

    async def main():
        daemon = make_daemon(tmp_path, static=())
        daemon.sensor = object()  # what the run gets; the gate does not read it
        await daemon.handle([LinkSnapshot(samples={p: link(p) for p in ("eth0", "eth1")},
                                          reason="start")])
        async with connected_agent(tmp_path, daemon) as fake:
            await fake.outgoing.put(validate("v1", "run-1"))
            await until(lambda: len(gate.started) == 1, "the first validation running")
            await fake.outgoing.put(validate("v2", "run-2"))
            # While it runs the host still takes other commands (a drain, through the pass).
            await fake.outgoing.put(fleet_pb2.ConnectResponse(command=fleet_pb2.Command(
                id="d1", by="alice", drain=fleet_pb2.FleetDrainRequest(port="eth1", reason="optic swap"))))
            await until(lambda: {r.id for r in fake.results} == {"v2", "d1"},
                        "the second validation refused and the drain done")
            gate.release.set()
            await until(lambda: len(fake.results) == 3, "the first validation's answer")
            gate.release = asyncio.Event()
            await fake.outgoing.put(validate("v3", "run-3"))  # one at a time, not one ever
            await until(lambda: len(gate.started) == 2, "a later validation starts")
            gate.release.set()
            await until(lambda: len(fake.results) == 4, "the later validation's answer")
        results = {r.id: r for r in fake.results}
        assert results["v2"].code == ABORTED
        assert "a validation is running" in results["v2"].message and "run-1" in results["v2"].message
        assert not results["v2"].HasField("validation")
        assert results["d1"].code == OK and not results["d1"].HasField("validation")
        first = results["v1"]
        assert first.code == OK and first.HasField("validation")
        assert first.validation.run_id == "run-1"
        assert [(p.peer, p.sent, p.received) for p in first.validation.pairs] == [("198.19.0.7", 10, 9)]
        assert results["v3"].code == OK and results["v3"].validation.run_id == "run-3"
        request, context = gate.started[0]
        assert request.run_id == "run-1"
        rails = {r.rail: (r.port, r.address) for r in context.rails}
        assert rails == {r.name: (r.port, r.address) for r in daemon.config.rails}
        assert context.sensor is daemon.sensor and context.echo_port == daemon.config.probes.port
    asyncio.run(main())


def test_a_bad_request_is_refused_naming_each_bad_field(tmp_path):
    async def main():
        daemon = make_daemon(tmp_path, static=())
        daemon.sensor = object()
        command = validate("v1", "run-1", duration_s=math.nan).command
        command.validate.targets.add(rail="rail0", peer="not-an-address")
        command.validate.ports.add(port="eth0/../x")
        return await daemon.aggregator.command(command)
    code, message = asyncio.run(main())
    assert code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "duration_s" in message and "nan" in message
    assert "targets[1].peer 'not-an-address'" in message
    assert "ports[1].port 'eth0/../x'" in message


def test_a_validation_that_outlives_its_duration_is_cancelled_and_answered(tmp_path, monkeypatch):
    gate = GatedValidation()  # never released
    monkeypatch.setattr(hostcheck, "validate_host", gate)
    monkeypatch.setattr(agentlink, "VALIDATION_MARGIN_S", 0.2)

    async def main():
        daemon = make_daemon(tmp_path, static=())
        daemon.sensor = object()
        answer = await asyncio.wait_for(
            daemon.aggregator.command(validate("v1", "run-1", duration_s=1.0).command), 20)
        return answer, daemon.aggregator.validation_task
    (code, message), task = asyncio.run(main())
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    assert "within 1.2 s" in message
    assert gate.cancelled == 1 and task.done()


# ---------------------------------------------------------------- hostcheck's pure parts


def test_counters_that_rose_over_the_window_are_reported_with_their_increase():
    start = CounterSample("eth0", rx_crc_errors=5, fec_corrected=100, fec_uncorrectable=2,
                          symbol_errors=None)
    end = CounterSample("eth0", rx_crc_errors=12, fec_corrected=900, fec_uncorrectable=2,
                        symbol_errors=4)
    flaps0 = LinkSample("eth0", present=True, carrier=True, carrier_down_count=3)
    flaps1 = LinkSample("eth0", present=True, carrier=True, carrier_down_count=4)
    assert hostcheck.counters_rising(start, end, flaps0, flaps1, HealthPolicy()) == {
        "rx_crc_errors": 7, "carrier_down": 1}  # corrected FEC: not watched by default
    watched = HealthPolicy(fec_corrected_per_s=1.0)
    assert hostcheck.counters_rising(start, end, None, None, watched) == {
        "rx_crc_errors": 7, "fec_corrected": 800}
    reset = CounterSample("eth0", rx_crc_errors=0)  # a driver reset: says nothing
    assert hostcheck.counters_rising(start, reset, None, None, HealthPolicy()) == {}


def test_an_unreadable_optic_is_not_checked_rather_than_a_problem_of_the_optic():
    assert hostcheck.optics_verdict(Unreadable("eth0: no module"), HealthPolicy()) == \
        ([], "eth0: no module")


def _reading(rx_dbm: float) -> OpticsReading:
    return OpticsReading(identity=ModuleIdentity("CMIS", "QSFP-DD", "SIM", "P", "S"),
                         temperature_c=40.0, voltage_v=3.3, tx_bias_ma=(7.5,) * 4,
                         tx_power_dbm=(-0.5,) * 4, rx_power_dbm=(rx_dbm,) * 4,
                         thresholds=(("rx_power_dbm", ModelThresholds(4.0, 3.0, -9.0, -11.0)),))


def test_an_optic_that_dies_during_the_window_is_a_problem_read_at_its_end():
    healthy, dead = _reading(-1.5), _reading(-30.0)
    policy = HealthPolicy()
    assert hostcheck.optics_over_window(healthy, healthy, policy) == ([], "")
    found, why = hostcheck.optics_over_window(healthy, dead, policy)
    assert why == "" and found and all(p.startswith("at the window's end: ") for p in found)
    assert any("RX -30.00" in p for p in found), found
    # dead from the start: told once, not again for the end
    assert hostcheck.optics_over_window(dead, dead, policy) == hostcheck.optics_verdict(dead, policy)
    # a module that stops answering mid-window is the optic's problem, not a check that did not run
    found, why = hostcheck.optics_over_window(healthy, Unreadable("eth1: EEPROM read failed"), policy)
    assert (found, why) == (["the module answered at the window's start, not at its end: "
                             "eth1: EEPROM read failed"], "")
    # no module at all (a veth): not checked, at either end
    assert hostcheck.optics_over_window(Unreadable("no module"), Unreadable("no module"), policy) == \
        ([], "no module")
    # not read again (the end read timed out): the start's verdict alone
    assert hostcheck.optics_over_window(healthy, None, policy) == ([], "")


def test_flows_beyond_the_limit_are_refused():
    request = validate("v", "r").command.validate
    request.flows = 65
    assert any(e.startswith("flows must be 0..64") for e in hostcheck.request_errors(request))
    request.flows = 0
    assert hostcheck.request_errors(request) == []


def test_a_run_too_large_to_keep_books_on_is_refused():
    request = validate("v", "r").command.validate
    request.rate_pps, request.duration_s = 10_000, 600
    for i in range(2000):
        request.targets.add(rail="rail0", peer=f"198.19.{i // 250}.{i % 250 + 1}")
    assert any("probes in all" in e for e in hostcheck.request_errors(request))
