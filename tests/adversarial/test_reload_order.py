"""Issue 30, item 6: reloads were handled ahead of link events and never
coalesced: 100 SIGHUPs in 2 s with a cable pull in the middle delayed the
backup route from 8 ms to 115-386 ms. Now SIGHUPs queued together are one
reload, and it runs after every link event queued before or during it."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from linkpassd import config as configmod
from linkpassd.adapters.links import LinkEvent
from linkpassd.daemon.loop import Daemon, Reload, Tick

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "linkpassd.toml"


class _Watchdog:
    def progress(self, now: float) -> None:
        pass


def test_sighups_coalesce_and_a_reload_never_runs_ahead_of_link_events() -> None:
    async def scenario() -> list:
        daemon = Daemon(configmod.load_config(EXAMPLE), str(EXAMPLE))
        daemon.watchdog = _Watchdog()
        handled: list = []

        async def handle(events: list) -> None:
            handled.append([type(e).__name__ for e in events])
            if events == [Tick()]:  # a link event arrives while the first batch is handled
                daemon.queue.put_nowait(link)
                daemon.request_reload()
            await asyncio.sleep(0)

        daemon.handle = handle  # type: ignore[method-assign]
        link = LinkEvent.__new__(LinkEvent)
        for _ in range(50):
            daemon.request_reload()
        daemon.queue.put_nowait(Tick())
        for _ in range(50):
            daemon.request_reload()
        assert daemon.queue.qsize() == 2  # one Reload, one Tick
        loop = asyncio.create_task(daemon.reconcile_loop())
        try:
            async with asyncio.timeout(5):
                while not handled or handled[-1] != ["Reload"]:
                    await asyncio.sleep(0.01)
        finally:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
        return handled

    handled = asyncio.run(scenario())
    assert handled == [["Tick"], ["LinkEvent"], ["Reload"]]


def test_a_sighup_during_a_reload_asks_for_another() -> None:
    async def scenario() -> int:
        daemon = Daemon(configmod.load_config(EXAMPLE), str(EXAMPLE))
        daemon.watchdog = _Watchdog()
        reloads = 0

        async def handle(events: list) -> None:
            nonlocal reloads
            if events == [Reload()]:
                reloads += 1
                if reloads == 1:
                    daemon.request_reload()  # the file may have changed after this reload read it

        daemon.handle = handle  # type: ignore[method-assign]
        daemon.request_reload()
        loop = asyncio.create_task(daemon.reconcile_loop())
        try:
            async with asyncio.timeout(5):
                while reloads < 2:
                    await asyncio.sleep(0.01)
        finally:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
        return reloads

    assert asyncio.run(scenario()) == 2
