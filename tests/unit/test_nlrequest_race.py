"""BoundedNetlink.dump reads past the kernel's one-shot EINVAL of the
send/receive dump race (see BoundedNetlink._forget_dump_race), and only that."""

import asyncio
import errno
import threading

import pytest
from pyroute2.netlink.core import CoreProtocol

from linkpassd.adapters.nlrequest import BoundedNetlink, KernelSocketError


class StickyIpr:
    """pyroute2's way: an error the reader saw is kept and raised on every use."""

    def __init__(self, exc: OSError):
        self._error_event = threading.Event()
        self._error_event.set()
        self.status = {"error": exc}
        self.msg_queue = type("MessageQueue", (), {"root": asyncio.Queue()})()
        self.msg_queue.root.put_nowait(b"an unrelated message nobody has read")
        # and the record pyroute2 files for the error, made by pyroute2 itself
        CoreProtocol.enqueue_error(self, exc.errno)

    def enqueue(self, data, addr):
        self.msg_queue.root.put_nowait(data)

    def root(self) -> list:
        return list(self.msg_queue.root._queue)


def bounded(exc: OSError, fail_times: int) -> tuple[BoundedNetlink, list]:
    nl = BoundedNetlink(StickyIpr(exc))
    calls: list[int] = []

    async def request(msg, msg_type, flags):
        calls.append(msg_type)
        if nl.ipr._error_event.is_set() and len(calls) <= fail_times:
            raise nl.ipr.status["error"]
        return [{"header": {"flags": 0}, "n": len(calls)}]

    nl.request = request  # type: ignore[method-assign]
    return nl, calls


def test_the_races_einval_is_forgotten_once_and_the_dump_read_again():
    exc = OSError(errno.EINVAL, "Invalid argument")
    nl, calls = bounded(exc, fail_times=1)
    replies = asyncio.run(nl.dump(lambda: None, 26, "route dump"))
    assert replies == [{"header": {"flags": 0}, "n": 2}] and len(calls) == 2
    assert nl.races_forgotten == 1 and not nl.ipr._error_event.is_set()
    # pyroute2's made-up error message went with it; nothing else did
    assert nl.ipr.root() == [b"an unrelated message nobody has read"]


@pytest.mark.parametrize("code", [errno.ENOBUFS, errno.EBADF])
def test_other_socket_errors_stay_errors(code):
    exc = OSError(code, "boom")
    nl, calls = bounded(exc, fail_times=99)
    with pytest.raises(KernelSocketError, match="route dump: netlink socket failed"):
        asyncio.run(nl.dump(lambda: None, 26, "route dump"))
    assert nl.races_forgotten == 0 and len(calls) == 1
    assert len(nl.ipr.root()) == 2  # an error that stays an error keeps its record


def test_an_einval_that_is_not_the_kept_one_is_not_forgotten():
    kept = OSError(errno.EINVAL, "kept")
    nl, calls = bounded(kept, fail_times=0)

    async def request(msg, msg_type, flags):
        raise OSError(errno.EINVAL, "another")

    nl.request = request  # type: ignore[method-assign]
    with pytest.raises(KernelSocketError):
        asyncio.run(nl.dump(lambda: None, 26, "route dump"))
    assert nl.races_forgotten == 0
