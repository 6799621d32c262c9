"""labs.routewatch against the real kernel: every kind of change a host
routing mechanism makes is seen, when it happens, as the kernel answers it.

One dualrail lab (mechanism ``none``); the test itself plays the mechanism in
lph1, with the objects the real ones use: a rule to a table whose route uses a
nexthop id (linkpassd's rails), a nexthop replaced under a route, a resilient
group and its members replaced, rule removal, an unreachable route, and a
carrier loss with ``ignore_routes_with_linkdown`` (no route changes, only the
answer). After each step the watcher's answer must equal ``ip route get``'s
and must have arrived by notification, not by the safety-net poll (switched
off here). Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from labs.faults import CablePull
from labs.routewatch import RouteChange, RouteWatch
from labs.topos.dualrail import dualrail
from labs.topos.lab import Lab

pytestmark = pytest.mark.lab

H1, H2 = "lph1", "lph2"
SEEN_WITHIN_S = 3.0
TABLE, PREF = 3000, 500  # outside the plan's rail (1000+) and detour (2000+) ranges


def needs_root() -> None:
    if os.geteuid() != 0 or shutil.which("mnexec") is None:
        pytest.skip("needs root and mnexec (apt-get install mininet)")


def kernel_answer(lab: Lab, dst: str, src: str | None = None) -> tuple[str | None, str | None]:
    argv = ["ip", "-j", "route", "get", dst] + (["from", src] if src else [])
    proc = lab.run(H1, argv, check=False)
    if proc.returncode:
        return None, None
    (route,) = json.loads(proc.stdout)
    return route.get("dev"), route.get("gateway")


def step(lab: Lab, watch: RouteWatch, ip_batch: list[str], want: tuple[str | None, str | None],
         causes: set[str]) -> RouteChange:
    """Apply ``ip_batch`` in lph1; the watcher must report ``want`` (oif,
    gateway) after notifications of the kinds the batch makes (``causes``:
    which of them the watcher had read when it re-asked depends on timing),
    no earlier than the change was made."""
    mark = watch.mark()
    before = time.monotonic()
    lab.run(H1, ["ip", "-batch", "-"], input="\n".join(ip_batch) + "\n")
    change = watch.wait_change(lambda c: (c.oif, c.gateway) == want, SEEN_WITHIN_S,
                               f"{want} after {ip_batch}", after=mark)
    assert change.at >= before
    assert change.cause and set(change.cause) <= causes, change
    assert watch.changes(mark) == [change]  # one change, no flapping on the way
    return change


def test_routewatch_sees_rules_nexthops_groups_and_carrier():
    needs_root()
    with dualrail("none") as lab:
        h1, dst = lab.host(H1), lab.rail(H2, 0).address
        r0, r1 = h1.rail(0), h1.rail(1)
        # No poll: every change below must come from a notification.
        watch = RouteWatch.start(lab, H1, dst, duration_s=60.0, poll_s=0)
        bound = RouteWatch.start(lab, H1, dst, src=r1.address, duration_s=60.0, poll_s=0)
        # Plan routing: main via rail 0; from the rail-1 address, rail 1's table.
        assert (watch.initial.oif, watch.initial.gateway) == (r0.port, r0.gateway)
        assert (bound.initial.oif, bound.initial.gateway) == (r1.port, r1.gateway)
        assert kernel_answer(lab, dst) == (r0.port, r0.gateway)
        assert kernel_answer(lab, dst, r1.address) == (r1.port, r1.gateway)

        # A rule to a table whose route uses a nexthop object (linkpassd's shape).
        step(lab, watch, [f"nexthop add id 9001 via {r1.gateway} dev {r1.port}",
                          f"route add 198.18.0.0/16 nhid 9001 table {TABLE}",
                          f"rule add pref {PREF} to 198.18.0.0/16 lookup {TABLE}"],
             (r1.port, r1.gateway), {"nexthop", "route", "rule"})
        assert bound.changes() == []  # the bound source already went via rail 1
        # The nexthop replaced under the route (the kernel also re-announces the route).
        mark = bound.mark()
        step(lab, watch, [f"nexthop replace id 9001 via {r0.gateway} dev {r0.port}"],
             (r0.port, r0.gateway), {"nexthop", "route"})
        bound.wait_change(lambda c: c.oif == r0.port, SEEN_WITHIN_S, "bound via rail 0", mark)
        assert kernel_answer(lab, dst, r1.address) == (r0.port, r0.gateway)
        # A resilient group (linkpassd's multipath), then its members replaced.
        step(lab, watch, [f"nexthop add id 9002 via {r1.gateway} dev {r1.port}",
                          "nexthop add id 9100 group 9002 type resilient buckets 8 idle_timer 0",
                          f"route replace 198.18.0.0/16 nhid 9100 table {TABLE}"],
             (r1.port, r1.gateway), {"nexthop", "route"})
        step(lab, watch, ["nexthop replace id 9100 group 9001 type resilient buckets 8 "
                          "idle_timer 0"], (r0.port, r0.gateway), {"nexthop", "route"})
        assert kernel_answer(lab, dst) == (r0.port, r0.gateway)
        # Unreachable is an answer too.
        mark = watch.mark()
        lab.run(H1, ["ip", "route", "replace", "unreachable", "198.18.0.0/16",
                     "table", str(TABLE)])
        gone = watch.wait_change(lambda c: c.oif is None, SEEN_WITHIN_S, "unreachable", mark)
        assert gone.gateway is None and gone.error and "UNREACH" in gone.error
        assert kernel_answer(lab, dst) == (None, None)
        # Rule removed: back to main, via rail 0... then carrier, with main
        # offering rail 1 at a higher metric and linkdown routes ignored.
        step(lab, watch, [f"rule del pref {PREF}",
                          f"route add 198.18.0.0/15 via {r1.gateway} dev {r1.port} metric 100"],
             (r0.port, r0.gateway), {"rule", "route"})
        lab.run(H1, ["sysctl", "-q", "-w", "net.ipv4.conf.all.ignore_routes_with_linkdown=1",
                     f"net.ipv4.conf.{r0.port}.ignore_routes_with_linkdown=1"])
        pull = CablePull(lab, H1, 0)
        mark = watch.mark()
        t_pull = pull.inject()
        moved = watch.wait_change(lambda c: c.oif == r1.port, SEEN_WITHIN_S, "carrier", mark)
        # No route changes here, only the answer: the link event is what tells.
        assert moved.at >= t_pull and set(moved.cause) <= {"link", "nexthop"}
        assert kernel_answer(lab, dst) == (r1.port, r1.gateway)
        mark = watch.mark()
        t_back = pull.clear()
        back = watch.wait_change(lambda c: c.oif == r0.port, SEEN_WITHIN_S, "carrier back", mark)
        assert back.at >= t_back

        for w in (watch, bound):
            stopped = w.stop()
            assert stopped is not None and stopped["reason"] == "signal"
            assert stopped["changes"] == len(w.changes())
            assert w.proc.returncode == 0


def test_routewatch_stops_by_itself_after_its_duration():
    needs_root()
    with dualrail("none") as lab:
        started = time.monotonic()
        watch = RouteWatch.start(lab, H1, lab.rail(H2, 0).address, duration_s=1.0)
        stopped = watch.lines.wait(lambda e: e["event"] == "stopped", 5.0, "stopped")
        assert stopped["reason"] == "duration" and stopped["changes"] == 0
        assert 1.0 <= stopped["at"] - watch.initial.at < 3.0
        assert watch.proc.wait(5.0) == 0
        assert time.monotonic() - started < 10.0
