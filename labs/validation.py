"""A railopt lab ready for fleet validation, and one `linkpassctl validate`
run in it (issue 13): shared by tests/labs/test_validate_lab.py and
labs/bench/validate.py, so the test and the benchmark run the same thing.

The lab: linkpassd in every host (the lab's fast timers, echo probing on,
the aggregator's probe mesh), a lab aggregator, lldpd in every switch, and
the cabling plan the lab was built with (labs/topos/cabling.py).

Probe budget: every lab host shares this machine's two cores, so the
aggregator's per-host budget ([validation] host_budget_pps, see
linkpassd/validate/schedule.py) is LAB_TOTAL_PPS shared over the hosts, not
a real host's 10,000/s. At ~50 us of CPU per probe handled (sent or
answered), 16,000/s is most of one core: the other core stays for the
daemons, the aggregator and whatever else runs on the machine. Without it a
6-host lab's burst (~36,000 probes/s in all) saturates both cores, and
probes that starved read as random loss.

Healthy, before a run: every host connected to the aggregator with every
port UP in its last report, no fault's nftables table left in any switch,
and every host pair answering a ping on every rail (across the spines too).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from labs.scenario import LAB_TIMERS
from labs.topos.cabling import write_cabling
from labs.topos.lab import Lab
from labs.topos.plan import LabError
from labs.topos.railopt import railopt, start_linkpassd

LAB_TOTAL_PPS = 16_000.0
HEALTHY_S = 60.0
EXIT_FINDINGS = 8  # linkpassctl validate: the run found something


@contextmanager
def validation_lab(hosts: int, rails: int, spines: int = 2, *, leaves_per_rail: int = 1,
                   budget_pps: float | None = None) -> Iterator[Lab]:
    """A started lab (daemons running, `lab.cabling_path` written), torn
    down on exit. `budget_pps`: the per-host probe budget (default
    LAB_TOTAL_PPS / hosts)."""
    budget = LAB_TOTAL_PPS / hosts if budget_pps is None else budget_pps
    with railopt(hosts, rails, spines, "linkpassd", leaves_per_rail=leaves_per_rail,
                 linkpassd_timers=LAB_TIMERS, probes={"interval_ms": 50},
                 aggregator={"validation_budget_pps": budget}, mesh=True, lldp=True) as lab:
        for host in lab.hosts:
            start_linkpassd(lab, host.name)
        lab.cabling_path = lab.workdir / "cabling.toml"
        write_cabling(lab.plan, lab.cabling_path)
        lab.validation_budget_pps = budget
        yield lab


def problems(lab: Lab) -> list[str]:
    """What keeps the lab from a clean start (module doc); [] when healthy."""
    from linkpassd._proto.linkpass.v1 import fleet_pb2, fleet_pb2_grpc

    assert lab.aggregator is not None
    with lab.aggregator.channel() as channel:
        hosts = fleet_pb2_grpc.FleetServiceStub(channel).ListHosts(
            fleet_pb2.ListHostsRequest(), timeout=10).hosts
    seen = {h.host_id: h for h in hosts}
    found = []
    for host in lab.hosts:
        view = seen.get(host.name)
        if view is None or not view.connected:
            found.append(f"{host.name}: not connected")
            continue
        for port in view.report.ports:
            if port.verdict != 1:  # VERDICT_UP
                found.append(f"{host.name} {port.port}: verdict {port.verdict}")
        if len(view.report.ports) != lab.plan.n_rails:
            found.append(f"{host.name}: {len(view.report.ports)} ports reported")
    for node in lab.plan.leaf_names + lab.plan.spine_names:
        found += [f"{node}: fault table {name} left" for _, name in lab.nft_tables(node)
                  if name.startswith("lp_")]
    if not found:
        found += [f"{row['src']} -> {row['dst']} on rail {row['rail']}: no answer"
                  for row in lab.reachability(count=1, wait_s=1.0) if not row["ok"]]
    return found


def wait_healthy(lab: Lab, timeout_s: float = HEALTHY_S) -> float:
    """Until problems() is empty; the seconds it took. LabError lists what
    was still wrong at the deadline."""
    started = time.monotonic()
    while found := problems(lab):
        if time.monotonic() - started > timeout_s:
            raise LabError(f"lab not healthy after {timeout_s:g} s:\n  " + "\n  ".join(found))
        time.sleep(0.5)
    return time.monotonic() - started


@dataclass(frozen=True)
class Run:
    code: int  # 0: no finding, 8: findings
    report: dict  # the JSON report (proto field names)
    wall_s: float  # linkpassctl validate, start to exit


def validate(lab: Lab, duration_s: float, timeout_s: float = 180.0) -> Run:
    """One `linkpassctl validate -o json` run through the lab's aggregator;
    LabError unless it ran to a report."""
    assert lab.aggregator is not None
    argv = [sys.executable, "-m", "linkpassd.ctl.main", "validate", "--aggregator",
            lab.aggregator.address, "--insecure", "--plan", str(lab.cabling_path),
            "--duration", f"{duration_s:g}", "-o", "json"]
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    wall = time.monotonic() - started
    if proc.returncode not in (0, EXIT_FINDINGS):
        raise LabError(f"validate failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return Run(proc.returncode, json.loads(proc.stdout), wall)


def findings(report: dict) -> list[dict]:
    return report.get("findings", [])


def summary(report: dict) -> str:
    """Each finding with its evidence: a failed assertion shows why."""
    return "\n".join(f"{f.get('kind')}: {f.get('component')} ({f.get('confidence')})"
                     + "".join(f"\n    {e}" for e in f.get("evidence", []))
                     for f in findings(report)) or "no findings"
