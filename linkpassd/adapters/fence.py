"""Administrative down and up of a port (IFF_UP), for fencing (core.fence,
docs/fencing.md): the one place linkpassd changes a link's state.

Through a caller-owned pyroute2 ``AsyncIPRoute``. A write the kernel refuses,
or one that gets no answer in time, raises `FenceWriteError` naming the port
and the reason; the caller reports it and tries again on its next pass.
"""

from __future__ import annotations

import asyncio

from pyroute2.netlink.exceptions import NetlinkError

WRITE_TIMEOUT_S = 2.0


class FenceWriteError(Exception):
    """Setting a port down or up failed; str() says which port and why."""


async def set_admin(ipr, port: str, up: bool) -> None:
    """Set `port` administratively up or down."""
    what = "up" if up else "down"
    try:
        async with asyncio.timeout(WRITE_TIMEOUT_S):
            reply = await ipr.link("get", ifname=port)
            msgs = list(reply) if isinstance(reply, (list, tuple)) else [m async for m in reply]
            if not msgs:
                raise FenceWriteError(f"{port}: no such interface")
            await ipr.link("set", index=msgs[0]["index"], state=what)
    except NetlinkError as exc:
        raise FenceWriteError(f"{port}: setting it {what} refused: {exc.args[-1] if exc.args else exc}"
                              ) from None
    except TimeoutError:
        raise FenceWriteError(f"{port}: setting it {what}: no answer in {WRITE_TIMEOUT_S:g}s") from None
    except OSError as exc:
        raise FenceWriteError(f"{port}: setting it {what}: {exc}") from None
