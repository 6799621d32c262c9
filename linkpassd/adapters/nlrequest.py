"""Netlink requests bounded in time, on a caller-owned pyroute2 socket.

A reconcile loop that waits forever for a netlink answer (a lost ack, a
kernel stuck on rtnl_lock) stops protecting the host, so every request here
-- its send and all its replies -- must finish within ``timeout_s``.

Two facts shape this:

* The kernel handles an rtnetlink request inside sendmsg, under rtnl_lock.
  A lock held elsewhere (a wedged driver) blocks that syscall; on the
  event-loop thread it would freeze the whole daemon where no asyncio
  timeout can fire.  So sends run on one worker thread.
* Replies are matched to requests by sequence number: pyroute2 keeps one
  queue per request and retires a sequence number for 255 requests after
  use, so a reply arriving after its request timed out goes to the socket's
  default queue and never answers a later request.  It does stay in that
  queue: after timeouts, a long-running caller should switch to a fresh
  socket (``replace_socket``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import os
import struct
from collections.abc import Callable

from pyroute2.netlink import (
    NETLINK_EXT_ACK,
    NETLINK_GET_STRICT_CHK,
    NLM_F_DUMP,
    NLM_F_DUMP_INTR,
    NLM_F_REQUEST,
    NLMSG_ERROR,
    SOL_NETLINK,
)
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.nlsocket import NetlinkRequest

DEFAULT_TIMEOUT_S = 2.0
DUMP_ATTEMPTS = 3
_F_DUMP = NLM_F_REQUEST | NLM_F_DUMP


class KernelReadError(RuntimeError):
    """Reading kernel state failed; nothing partial is returned.  ``errno``
    is the kernel's error number when it refused the dump, else None."""

    def __init__(self, message: str, errno: int | None = None):
        super().__init__(message)
        self.errno = errno


class DumpInterrupted(KernelReadError):
    """A dump stayed inconsistent (NLM_F_DUMP_INTR) on every attempt."""


class KernelReadTimeout(KernelReadError):
    """A dump got no complete answer within ``timeout_s``."""


class KernelSocketError(KernelReadError):
    """The netlink socket itself failed (an OSError, not a kernel reply).
    pyroute2 keeps such an error on the socket and raises it again on every
    later use, so the caller must continue on a fresh socket."""


class _ThreadSentRequest(NetlinkRequest):
    """A NetlinkRequest whose sendmsg runs on the given worker thread."""

    async def send_via(self, executor: concurrent.futures.Executor) -> int:
        await self.prepare()
        loop = asyncio.get_running_loop()
        # pyroute2 keeps its socket per thread: take this thread's, here.
        sock = self.sock.socket
        try:
            return await loop.run_in_executor(executor, sock.send, self.msg.data)
        except BaseException:
            # Failed or cancelled (timeout): nobody will read the reply.  A
            # send still queued behind a stuck one is dropped with its future.
            self.cleanup()
            raise


class BoundedNetlink:
    """Requests and dumps on ``ipr`` (owned by the caller, who closes it),
    each bounded by ``timeout_s``.  Turns on NETLINK_EXT_ACK and, with
    ``strict_check``, NETLINK_GET_STRICT_CHK (the kernel then honours dump
    filters, and rejects malformed dump requests) on the socket."""

    def __init__(self, ipr, timeout_s: float = DEFAULT_TIMEOUT_S, strict_check: bool = True):
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
                or not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, not {timeout_s!r}")
        self.ipr = ipr
        self.timeout_s = float(timeout_s)
        self.requests = 0  # every request sent, reads included
        self.timeouts = 0
        self.races_forgotten = 0  # EINVALs of the send/receive dump race, read past (see dump)
        self.strict = False  # the kernel filters dumps; known after the first request
        self._strict_wanted = strict_check
        self._socket_ready = False
        self._sender: concurrent.futures.ThreadPoolExecutor | None = None

    def replace_socket(self, ipr):
        """Continue on ``ipr``; return the old socket for the caller to close.
        Late replies (and a send still stuck in the kernel, with its thread)
        stay behind with the old one."""
        old, self.ipr = self.ipr, ipr
        self._socket_ready = False
        self.close()
        return old

    def close(self) -> None:
        """Stop the sender thread without waiting for a stuck send."""
        if self._sender is not None:
            self._sender.shutdown(wait=False, cancel_futures=True)
            self._sender = None

    async def request(self, msg, msg_type: int, flags: int) -> list:
        """Send one request and collect all its replies within ``timeout_s``.
        Raises TimeoutError or NetlinkError."""
        await self.ipr.setup_endpoint()
        self._prepare_socket()
        request = _ThreadSentRequest(self.ipr, msg, msg_type=msg_type, msg_flags=flags)
        self.requests += 1
        try:
            async with asyncio.timeout(self.timeout_s):
                await request.send_via(self._sender_thread())
                # Cancelled inside response(), the generator frees its queue.
                return [reply async for reply in request.response()]
        except TimeoutError:
            self.timeouts += 1
            raise

    async def dump(self, make_msg: Callable, msg_type: int, what: str) -> list:
        """One complete dump of the request ``make_msg()`` builds.  A dump
        the kernel marks inconsistent (NLM_F_DUMP_INTR: the table changed
        mid-dump) is re-read, never used: the daemon must not plan from a
        partial view.  Raises KernelReadError (or a subclass) naming ``what``."""
        for attempt in range(DUMP_ATTEMPTS):
            try:
                replies = await self.request(make_msg(), msg_type, _F_DUMP)
            except TimeoutError:
                raise KernelReadTimeout(
                    f"{what}: no complete answer from the kernel within {self.timeout_s:g} s"
                ) from None
            except NetlinkError as e:
                raise KernelReadError(f"{what}: {kernel_message(e)}", e.code) from e
            except OSError as e:
                if attempt + 1 < DUMP_ATTEMPTS and self._forget_dump_race(e):
                    continue
                raise KernelSocketError(f"{what}: netlink socket failed: {e}", e.errno) from e
            if not any(r["header"]["flags"] & NLM_F_DUMP_INTR for r in replies):
                return replies
        raise DumpInterrupted(f"{what} (type {msg_type}) interrupted {DUMP_ATTEMPTS} times")

    def _forget_dump_race(self, exc: OSError) -> bool:
        """Requests are sent from a worker thread while the event loop reads
        the replies. When a dump the send started finishes in the kernel
        between the reader's lockless "a dump is running" check and its call
        to continue it, the kernel reports EINVAL once as a socket error
        (netlink_recvmsg -> netlink_dump with no dump running; sk_err is
        cleared when read). The socket itself is fine, but pyroute2 keeps that
        error and raises it on every later use: forget it, count it, and read
        again (True). Any other socket error stays an error (False)."""
        event = getattr(self.ipr, "_error_event", None)
        try:
            kept = self.ipr.status["error"]
        except (AttributeError, KeyError, TypeError):
            return False
        if exc.errno != errno.EINVAL or event is None or not event.is_set() or kept is not exc:
            return False
        event.clear()
        self._drop_error_record(exc.errno)
        self.races_forgotten += 1
        return True

    def _drop_error_record(self, code: int) -> None:
        """pyroute2 also files a socket error as a made-up NLMSG_ERROR with
        sequence number 0 in the socket's root queue, where nobody reads it:
        left there, every forgotten race would leave one behind for good."""
        queue = getattr(getattr(self.ipr, "msg_queue", None), "root", None)
        if queue is None:
            return
        kept = []
        while not queue.empty():
            data = queue.get_nowait()
            queue.task_done()
            if not _is_error_record(data, code):
                kept.append(data)
        for data in kept:
            queue.put_nowait(data)

    def _sender_thread(self) -> concurrent.futures.ThreadPoolExecutor:
        # One thread: while a send is stuck in the kernel the next ones wait
        # behind it and time out (and are dropped) instead of piling up.
        if self._sender is None:
            self._sender = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="linkpass-netlink")
        return self._sender

    def _prepare_socket(self) -> None:
        # Here, not in __init__: pyroute2 creates the socket lazily, inside
        # the event loop.
        if self._socket_ready:
            return
        self.ipr.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
        self.strict = False  # without it, callers filter dumps alone
        if self._strict_wanted:
            try:
                self.ipr.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
                self.strict = True
            except OSError:  # before Linux 4.20
                pass
        self._socket_ready = True


def _is_error_record(data, code: int) -> bool:
    """pyroute2's record of a socket error (CoreProtocol.enqueue_error): an
    NLMSG_ERROR of length 28, sequence and port id 0, the errno at offset 16."""
    if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) < 20:
        return False
    length, msg_type, _flags, seq, pid = struct.unpack_from("=IHHII", data)
    (error,) = struct.unpack_from("=i", data, 16)
    return (length, msg_type, seq, pid) == (28, NLMSG_ERROR, 0, 0) and error in (code, -code)


def kernel_message(e: NetlinkError) -> str:
    """The kernel's extended-ack text, else the errno's description."""
    message = e.args[1] if len(e.args) > 1 and e.args[1] else None
    return str(message) if message else os.strerror(e.code)
