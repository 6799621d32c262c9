"""Link sensing against the real kernel: events, and recovery from ENOBUFS."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from labs.netnslib import run, wait_for
from linkpassd.adapters.links import LinkEvent, LinkMonitor, LinkSnapshot

pytestmark = pytest.mark.netns


def test_carrier_loss_and_return_arrive_as_events_with_counts(lab):
    rail = lab.rails[0]

    async def scenario():
        got = []

        async def emit(item):
            got.append(item)

        monitor = LinkMonitor([rail.port, "lpmissing0"], emit, netns=lab.host.name)
        task = asyncio.create_task(monitor.run())
        try:
            await wait_for(lambda: _async(bool(got)), 3.0, "start snapshot")
            snap = got[0]
            assert isinstance(snap, LinkSnapshot) and snap.reason == "start"
            assert snap.samples[rail.port].carrier and not snap.samples["lpmissing0"].present
            downs = snap.samples[rail.port].carrier_down_count
            lab.cut(rail)
            await wait_for(lambda: _async(any(isinstance(e, LinkEvent) and not e.sample.carrier
                                              for e in got)), 3.0, "carrier-down event")
            down = next(e.sample for e in got if isinstance(e, LinkEvent) and not e.sample.carrier)
            assert down.carrier_down_count == downs + 1 and down.admin_up
            lab.restore(rail)
            await wait_for(lambda: _async(got[-1].sample.carrier if isinstance(got[-1], LinkEvent)
                                          else False), 3.0, "carrier-up event")
        finally:
            task.cancel()

    run(scenario(), timeout=20)


def _async(value):
    async def ret():
        return value
    return ret()


def test_enobufs_leads_to_a_full_re_read_not_a_patched_event_stream(lab):
    """Overflow a tiny receive buffer while the loop is blocked; the monitor must
    report a fresh snapshot (reason enobufs) that matches the kernel."""
    rail = lab.rails[0]

    async def scenario():
        got = []

        async def emit(item):
            got.append(item)

        monitor = LinkMonitor([rail.port], emit, rcvbuf=4096, netns=lab.host.name)
        task = asyncio.create_task(monitor.run())
        try:
            await wait_for(lambda: _async(bool(got)), 3.0, "start snapshot")
            # Blocks the event loop: the kernel queues events we cannot read.
            subprocess.run(["ip", "netns", "exec", lab.host.name, "sh", "-c",
                            f"for i in $(seq 200); do ip link set {rail.port} down; "
                            f"ip link set {rail.port} up; done; ip link set {rail.port} down"],
                           check=True, timeout=60)
            def enobufs_snapshots():
                return [g for g in got if isinstance(g, LinkSnapshot) and g.reason == "enobufs"]

            await wait_for(lambda: _async(bool(enobufs_snapshots())), 5.0, "snapshot after ENOBUFS")
            assert monitor.resyncs >= 1
            await wait_for(lambda: _async(not got[-1].samples[rail.port].admin_up
                                          if isinstance(got[-1], LinkSnapshot)
                                          else not got[-1].sample.admin_up), 5.0, "final state")
            assert enobufs_snapshots()[-1].samples[rail.port].present
        finally:
            task.cancel()

    run(scenario(), timeout=90)


def test_a_port_renamed_away_is_reported_missing_and_back_when_renamed_back(lab):
    """Issue 28: a port renamed away still showed PRESENT. The kernel sends
    the rename as an RTM_NEWLINK of the same ifindex under the new name only."""
    rail = lab.rails[0]
    other = "lpren0"

    async def scenario():
        got = []

        async def emit(item):
            got.append(item)

        def samples_of(port):
            return [e.sample for e in got if isinstance(e, LinkEvent) and e.sample.port == port]

        monitor = LinkMonitor([rail.port], emit, netns=lab.host.name)
        task = asyncio.create_task(monitor.run())
        renamed = False
        try:
            await wait_for(lambda: _async(bool(got)), 3.0, "start snapshot")
            assert got[0].samples[rail.port].present
            lab.host.ip("link", "set", rail.port, "down")
            lab.host.ip("link", "set", rail.port, "name", other)
            renamed = True
            await wait_for(lambda: _async(any(not s.present for s in samples_of(rail.port))), 3.0,
                           "the renamed port reported missing")
            lab.host.ip("link", "set", other, "name", rail.port)
            renamed = False
            lab.host.ip("link", "set", rail.port, "up")
            await wait_for(lambda: _async(bool(samples_of(rail.port)) and samples_of(rail.port)[-1].present
                                          and samples_of(rail.port)[-1].admin_up), 3.0,
                           "the port back under its name")
        finally:
            task.cancel()
            if renamed:
                lab.host.ip("link", "set", other, "name", rail.port)
                lab.host.ip("link", "set", rail.port, "up")

    run(scenario(), timeout=20)
