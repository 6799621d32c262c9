"""The demo: break a cable, watch the traffic survive (or not), measured.

Builds the dualrail lab three times, once per host-routing mechanism: static
per-rail routes (no failover), the kernel alone (linkdown-aware routes, no
daemon) and linkpassd. The fabric is the bgp one (labs/topos/bgpfabric.py):
both leaves and the spine run FRR bgpd and learn host routes from the hosts.
In each it sends two RoCEv2 flows from lph1 to lph2 (out: kernel-path and
qp-pinned) and two back from lph2 to lph1's address on the faulted rail (in:
kernel-path-reverse and qp-pinned-reverse, see labs/scenario.py), pulls a cable and then
blackholes the same link silently, and prints the blackout each flow saw.
With linkpassd each host also runs FRR (zebra + bgpd) announcing its rail
addresses as linkpassd decides ([announce], docs/bgp.md), and each host rail
a BFD session with its leaf (the leaf's BFD tracks its BGP session with
that host port).
With linkpassd it also prints `linkpassctl status` on lph1 before, during and
after the cable pull, what `linkpassctl nccl-env` would give a launcher before
and during it, and at the end `linkpassctl events`: every decision linkpassd
made from the cable pull to its recovery. Both daemons report to a linkpass-aggregator
(started with the lab, reached over a Unix socket), which hands out their echo
peers; the demo ends with `linkpassctl fleet` and the address of the
aggregator's page, saved as HTML (and PNG, with chromium) because the lab is
gone by then. Everything is torn down at the end, and verified gone.

Run as root from the repo root: `make demo` (or .venv/bin/python -m labs.demo).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

from labs.browser import chromium, screenshot
from labs.scenario import FLOWS, MECHANISMS, REVERSE, REVERSE_QP, ScenarioLab, TrialResult

DEMO_FAULTS = ("cable-pull", "silent-blackhole")
# FRR alone (frr-bgp) is in the failover bench (labs/bench/failover.py), not
# in the demo by default: --mechanisms adds it.
DEMO_MECHANISMS = ("none", "kernel", "linkpassd")
COLUMN = {"none": "no failover", "kernel": "kernel alone", "linkpassd": "linkpassd",
          "frr-bgp": "FRR BGP+BFD alone"}
DIRECTION = {"kernel-path": "out lph1 -> lph2", "qp-pinned": "out lph1 -> lph2",
             REVERSE: "in  lph2 -> lph1", REVERSE_QP: "in  lph2 -> lph1"}
RESULTS = Path(__file__).parent / "bench" / "results"


def indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines())


def cell(trial: TrialResult, mode: str) -> str:
    flow = trial.flows[mode]
    return f"{flow.blackout_s * 1e3:8.1f} ms ({flow.lost} lost)"


def table(results: dict[tuple[str, str], TrialResult], fault_s: float) -> str:
    mechs = [m for m in MECHANISMS if any(k[0] == m for k in results)]
    lines = [f"{'fault':<18}{'flow':<21}{'direction':<17}"
             + "".join(f"{COLUMN[m]:>24}" for m in mechs)]
    for fault in DEMO_FAULTS:
        for mode in FLOWS:
            row = f"{fault:<18}{mode:<21}{DIRECTION[mode]:<17}"
            for mech in mechs:
                trial = results.get((mech, fault))
                row += f"{cell(trial, mode) if trial else '-':>24}"
            lines.append(row)
    lines.append(f"(each fault lasts {fault_s:g} s; blackout is the longest gap between "
                 "packets at the receiver)")
    return "\n".join(lines)


def fleet_view(lab: ScenarioLab) -> str:
    """`linkpassctl fleet` and `fleet summary` against the lab's aggregator, and
    its page saved (the page lives only as long as the lab)."""
    agg = lab.lab.aggregator
    grid = agg.ctl()
    summary = agg.ctl("summary", "--days", "1")
    page = RESULTS / "demo-fleet.html"
    RESULTS.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(agg.web_url, timeout=10) as reply:
        page.write_bytes(reply.read())
    saved = [str(page)]
    if chromium():
        saved.append(str(screenshot(agg.web_url, RESULTS / "demo-fleet.png")))
    return ("linkpassctl fleet (the aggregator's view of both hosts, after the faults):\n"
            + indent(grid.stdout if grid.returncode == 0 else grid.stderr)
            + "\nlinkpassctl fleet summary --days 1:\n"
            + indent(summary.stdout if summary.returncode == 0 else summary.stderr)
            + f"\nthe aggregator's page was {agg.web_url} while the lab ran; saved: "
            + " and ".join(saved))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mechanisms", default=",".join(DEMO_MECHANISMS),
                        help="comma-separated subset of " + ",".join(MECHANISMS))
    parser.add_argument("--fault-seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    mechanisms = [m.strip() for m in args.mechanisms.split(",") if m.strip()]
    unknown = [m for m in mechanisms if m not in MECHANISMS]
    if unknown or not mechanisms:
        parser.error(f"unknown mechanism(s) {unknown}; choose from {', '.join(MECHANISMS)}")
    if not 0.5 <= args.fault_seconds <= 10:
        parser.error("--fault-seconds must be between 0.5 and 10")

    started = time.monotonic()
    print("linkpass demo: dualrail lab, 2 GPU hosts x 2 rails, a leaf per rail, one spine;")
    print("the leaves and the spine run FRR bgpd (eBGP, each its own AS) and learn host routes")
    print("four RoCEv2 flows at 1000 packets/s each, two lph1 -> lph2:")
    print("  kernel-path  routed per packet (Soft-RoCE, TCP): moves when a route moves")
    print("  qp-pinned    port and next hop fixed at connect (hardware QP): moves only when it")
    print("               reconnects after 3 ACK timeouts of 50 ms and re-resolves its route")
    print("and two back, lph2 -> lph1's address on the faulted rail (kernel-path-reverse,")
    print("qp-pinned-reverse): they arrive over the broken link until the fabric routes lph1's")
    print("               address through another rail: with linkpassd, lph1's FRR announces")
    print("               it over a healthy rail's BGP session once linkpassd distrusts the rail")
    print(f"faults on the rail lph1's QP uses, {args.fault_seconds:g} s each: "
          + ", then ".join(DEMO_FAULTS) + "\n", flush=True)

    results: dict[tuple[str, str], TrialResult] = {}
    events = ""
    fleet = ""
    for mech in mechanisms:
        print(f"== {COLUMN[mech]} ({mech})", flush=True)
        with ScenarioLab(mech, aggregator=mech == "linkpassd") as lab:
            events_from = events_to = 0
            if mech == "linkpassd":
                print("  linkpassctl status on lph1, before:\n" + indent(lab.status_text()))
                print("  linkpassctl nccl-env on lph1, before:\n" + indent(lab.nccl_env_text()))
            for fault in DEMO_FAULTS:
                if mech == "linkpassd" and fault == "cable-pull":
                    events_from = lab.last_event_seq()
                trial = lab.trial(fault, fault_s=args.fault_seconds)
                results[(mech, fault)] = trial
                print(f"  {trial.description}")
                for mode in FLOWS:
                    flow = trial.flows[mode]
                    extra = (f", {flow.reconnects} reconnect(s)"
                             if mode in ("qp-pinned", REVERSE_QP) else "")
                    print(f"    {mode:<20} blackout {flow.blackout_s * 1e3:7.1f} ms, "
                          f"{flow.lost} of {flow.sent} lost{extra}")
                if mech == "linkpassd" and fault == "cable-pull":
                    print("  linkpassctl status on lph1, during the cable pull:\n"
                          + indent(trial.status_during))
                    print("  linkpassctl nccl-env on lph1, during the cable pull:\n"
                          + indent(trial.nccl_env_during))
                    lab.wait_recovered()
                    print("  linkpassctl status on lph1, after the cable is back and the "
                          "hold-down has passed:\n" + indent(lab.status_text()))
                    events_to = lab.last_event_seq()
                sys.stdout.flush()
            if mech == "linkpassd":
                events = (f"linkpassctl events --after {events_from} --limit "
                          f"{events_to - events_from} on lph1: what linkpassd did from the cable "
                          f"pull to its recovery\n"
                          + indent(lab.events_text(after=events_from,
                                                   limit=events_to - events_from)))
                lab.wait_recovered()  # the fleet as it stands once the faults are over
                fleet = fleet_view(lab)
        print(f"  lab torn down, nothing left behind ({time.monotonic() - started:.0f} s)\n",
              flush=True)

    print(table(results, args.fault_seconds))
    print("\nA silent blackhole leaves the link up: carrier-based failover (the kernel's")
    print("own) cannot see it. linkpassd echo-probes the other host on every rail (50 ms,")
    print("DOWN once a silence outlasts the 30 ms tolerance) and runs BFD with each leaf")
    print("(FRR bfdd, 100 ms x 3),")
    print("and moves the rail's traffic as soon as either says the path is dead.")
    print(f"Both directions: the in flows ({REVERSE}, {REVERSE_QP}) recover because linkpassd also moves")
    print("lph1's announcement of its faulted rail's address to the other rail's BGP")
    print("session; the fabric learns it (that rail's leaf, then the spine, then the faulted")
    print("rail's leaf: FRR 8.4's bgpd holds each update ~50 ms before it processes it) and")
    print("routes the address over lph1's other port. Without linkpassd nothing announces")
    print("it, so that flow stays dark for the")
    print("whole fault, on a cable pull too: the leaf loses its connected route and the")
    print("fabric has no other way to the address.")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "demo.json"
    out.write_text(json.dumps([t.as_dict() for t in results.values()], indent=2))
    if events:
        print("\n" + events)
    print(f"\nresults: {out}   total {time.monotonic() - started:.0f} s")
    if fleet:
        print("\n" + fleet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
