"""Rail-optimised fabric: N hosts x R rails, L leaves per rail (default 1), S spines.

    python -m labs.topos.railopt --hosts 4 --rails 2 --spines 2 --mechanism linkpassd --check
    python -m labs.topos.railopt --hosts 6 --rails 2 --spines 2 --leaves-per-rail 3 --check

With ``--leaves-per-rail L`` each rail's hosts are split into L groups, one
leaf each, every leaf linked to every spine (labs/topos/plan.py): traffic
between two groups of one rail crosses a spine, as in a real rail-optimised
fabric with more hosts than a leaf has ports.

builds the lab, (for ``linkpassd``) starts one daemon per host from the
generated configs, pings every host pair on every rail from the rail address,
prints the table and tears everything down. Exit status 0 only if every ping
was answered and teardown left nothing behind.

``--bfd-interval-ms 100 [--bfd-detect-mult 3]`` also runs FRR bfdd on every
leaf; the host side is linkpassd (mechanism ``linkpassd``, whose generated
configs then ask for BFD), FRR itself (``frr-bgp``, which needs these options:
they time its eBGP sessions' BFD) or else labs.bfdpeer, and --check also
requires every leaf's session with every host port to come Up.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from labs.daemonproc import wait_ready
from labs.topos.lab import CARRIER_EVENTS, Lab
from labs.topos.plan import FABRICS, HOST_SPACE, MECHANISMS, FabricPlan

DAEMON_READY_S = 20.0
BFD_UP_S = 15.0


def railopt(hosts: int = 4, rails: int = 2, spines: int = 2, mechanism: str = "none", *,
            detour: bool = True, leaves_per_rail: int = 1, fabric: str = "static",
            **lab_options) -> Lab:
    """An unstarted Lab; ``with railopt(...) as lab:`` builds it and tears it
    down. ``fabric``: ``static`` or ``bgp`` (FabricPlan). ``lab_options`` go
    to Lab (workdir, carrier_events, linkpassd_timers...)."""
    return Lab(FabricPlan(hosts, rails, spines, detour=detour, leaves_per_rail=leaves_per_rail,
                          fabric=fabric),
               mechanism, **lab_options)


def start_linkpassd(lab: Lab, host: str) -> subprocess.Popen:
    """One daemon in ``host`` on the generated config, stopped by the lab on
    teardown; returns once it has reconciled (or raises with its log)."""
    log_path = lab.host_dir(host) / "linkpassd.log"
    with open(log_path, "ab") as log:
        proc = lab.popen(host, [sys.executable, "-m", "linkpassd.daemon",
                                "--config", str(lab.config_path(host))],
                         stdout=log, stderr=subprocess.STDOUT)
    wait_ready(proc, lab.control_socket(host), log_path, DAEMON_READY_S)
    return proc


def wait_bfd_up(lab: Lab, timeout: float = BFD_UP_S) -> list[dict]:
    """Every leaf's peers, once all are up or ``timeout`` has passed (the
    caller judges): one row per session, as FRR sees it."""
    deadline = time.monotonic() + timeout
    while True:
        rows = [{"leaf": leaf, **peer} for leaf in lab.leaves for peer in lab.bfd_peers(leaf)]
        if all(row["status"] == "up" for row in rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def format_bfd(rows: list[dict]) -> str:
    lines = [f"{'leaf':<6}{'interface':<12}{'local':<15}{'peer':<15}{'status':<8}tx/rx ms x mult"]
    for row in rows:
        lines.append(f"{row['leaf']:<6}{row['interface']:<12}{row['local']:<15}{row['peer']:<15}"
                     f"{row['status']:<8}{row['transmit-interval']}/{row['receive-interval']} "
                     f"x {row['detect-multiplier']}")
    return "\n".join(lines)


def format_bgp(lab: Lab) -> str:
    """frr-bgp: each host's sessions as its bgpd sees them, and its kernel route."""
    lines = [f"{'host':<7}{'rail':<6}{'neighbor':<15}{'state':<13}kernel {HOST_SPACE}"]
    for host in lab.hosts:
        states = lab.frr(host).bgp_states()
        routes = ", ".join(f"via {r.get('gateway')} dev {r.get('dev')}"
                           for r in lab.fabric_routes(host)) or "none"
        for rail in host.rails:
            lines.append(f"{host.name:<7}{rail.index:<6}{rail.gateway:<15}"
                         f"{states.get(rail.gateway, '-'):<13}{routes if rail.index == 0 else ''}")
    return "\n".join(lines)


def format_reachability(rows: list[dict]) -> str:
    lines = [f"{'src':<7}{'dst':<7}{'rail':<6}{'from':<15}{'to':<15}result"]
    for row in rows:
        verdict = "ok" if row["ok"] else f"FAIL ({row['received']}/{row['sent']})"
        lines.append(f"{row['src']:<7}{row['dst']:<7}{row['rail']:<6}{row['from']:<15}"
                     f"{row['to']:<15}{verdict}")
    return "\n".join(lines)


def main(argv: list[str] | None = None, *, defaults: tuple[int, int, int] = (4, 2, 2),
         prog: str = "labs.topos.railopt") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=defaults[0])
    parser.add_argument("--rails", type=int, default=defaults[1])
    parser.add_argument("--spines", type=int, default=defaults[2])
    parser.add_argument("--leaves-per-rail", type=int, default=1, metavar="L",
                        help="split each rail's hosts over L leaves (default 1)")
    parser.add_argument("--mechanism", choices=MECHANISMS, default="none")
    parser.add_argument("--no-detour", action="store_true",
                        help="strict fabric: no fallback path to a host whose link is down")
    parser.add_argument("--fabric", choices=FABRICS, default="static",
                        help="bgp: leaves and spines run FRR bgpd and learn host routes "
                             "(labs/topos/bgpfabric.py)")
    parser.add_argument("--carrier-events", choices=CARRIER_EVENTS, default="physical")
    parser.add_argument("--bfd-interval-ms", type=int, metavar="MS",
                        help="run FRR bfdd on the leaves, a session per host port at this interval")
    parser.add_argument("--bfd-detect-mult", type=int, default=3, metavar="N")
    parser.add_argument("--check", action="store_true",
                        help="ping every host pair on every rail, print the table, tear down")
    parser.add_argument("--plan", action="store_true", help="print the addressing and exit")
    args = parser.parse_args(argv)
    plan = FabricPlan(args.hosts, args.rails, args.spines, detour=not args.no_detour,
                      leaves_per_rail=args.leaves_per_rail, fabric=args.fabric)
    if args.plan or not args.check:
        print(plan.describe())
        if not args.check:
            print("\n(nothing built: pass --check to build, ping and tear down)")
        return 0
    bfd = ({"interval_ms": args.bfd_interval_ms, "detect_mult": args.bfd_detect_mult}
           if args.bfd_interval_ms is not None else None)
    if args.mechanism == "frr-bgp" and bfd is None:
        parser.error("--mechanism frr-bgp tracks each rail with BFD: give --bfd-interval-ms")
    bfd_rows: list[dict] = []
    started = time.monotonic()
    with Lab(plan, args.mechanism, carrier_events=args.carrier_events, bfd=bfd) as lab:
        print(plan.describe())
        print(f"\nbuilt in {time.monotonic() - started:.2f}s, mechanism {args.mechanism}, "
              f"workdir {lab.workdir}")
        if args.mechanism == "linkpassd":
            for host in lab.hosts:
                start_linkpassd(lab, host.name)
            print(f"linkpassd running in {len(lab.hosts)} hosts")
        if args.mechanism == "frr-bgp":
            print()
            print(format_bgp(lab))
        if bfd:
            if args.mechanism not in ("linkpassd", "frr-bgp"):  # frr-bgp: the hosts' own bfdd
                from labs.bfdpeer import BfdPeerProcess

                for host in lab.hosts:
                    BfdPeerProcess.start(lab, host.name)
            bfd_rows = wait_bfd_up(lab)
            print()
            print(format_bfd(bfd_rows))
        rows = lab.reachability(count=1, wait_s=1.0)
        print()
        print(format_reachability(rows))
        failed = sum(not row["ok"] for row in rows)
        failed += sum(row["status"] != "up" for row in bfd_rows)
    bfd_note = (f"; {sum(r['status'] == 'up' for r in bfd_rows)}/{len(bfd_rows)} BFD sessions up"
                if bfd else "")
    print(f"\n{sum(row['ok'] for row in rows)}/{len(rows)} reachable{bfd_note}; torn down cleanly; "
          f"{time.monotonic() - started:.2f}s total")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
