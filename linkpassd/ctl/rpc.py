"""What linkpassctl's two kinds of target share: the local daemon
(`ctl.main.Target`, a Unix socket) and the aggregator (`ctl.fleet.Aggregator`).

Each command makes one unary call or reads one server stream on a channel of
its own, and every failure becomes one line with an exit code (the target's
`failure`). The exit code of a status the far side sent on purpose is the
same for both: STATUS_EXIT.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from linkpassd.exitcodes import ExitCode

R = TypeVar("R", bound=Message)

# A refusal, an unknown name or a bad argument: the far side's message says
# what and why, and the exit code says which kind (linkpassd/exitcodes.py).
STATUS_EXIT = {
    grpc.StatusCode.DEADLINE_EXCEEDED: ExitCode.UNREACHABLE,
    grpc.StatusCode.PERMISSION_DENIED: ExitCode.REFUSED,
    grpc.StatusCode.UNAUTHENTICATED: ExitCode.REFUSED,
    grpc.StatusCode.NOT_FOUND: ExitCode.NOT_FOUND,
    grpc.StatusCode.INVALID_ARGUMENT: ExitCode.USAGE,
}


def status_of(exc: grpc.RpcError) -> tuple[grpc.StatusCode | None, str]:
    """(code, details) of a failed call; a transport error may lack either."""
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else None) or ""
    return code, details


class RpcTarget:
    """Mixin: `call` and `stream` on top of the subclass's `stub`,
    `timeout`, `channel()` and `failure()`; `before()` checks what can be
    checked before connecting (e.g. the socket's permissions)."""

    stub: Callable[[grpc.Channel], Any]
    timeout: float

    def channel(self) -> grpc.Channel:
        raise NotImplementedError

    def failure(self, exc: grpc.RpcError) -> Exception:
        raise NotImplementedError

    def before(self) -> None:
        """Checks before connecting; raise the target's error to stop."""

    def call(self, method: Callable[[Any], Callable[..., R]], request: Message, at_least: float = 0.0) -> R:
        """One unary call, every failure one line; `at_least` raises the
        deadline for calls the far side may take long to answer by design
        (a drain waits for its pass)."""
        self.before()
        try:
            with self.channel() as channel:
                return method(self.stub(channel))(request, timeout=max(self.timeout, at_least))
        except grpc.RpcError as exc:
            raise self.failure(exc) from None

    def stream(self, method: Callable[[Any], Callable[..., Iterator[R]]], request: Message) -> Iterator[R]:
        """A server stream's messages for as long as it runs (no deadline);
        failures as in call(). Closing the iterator (Ctrl-C, or enough read)
        cancels the call."""
        self.before()
        with self.channel() as channel:
            responses = method(self.stub(channel))(request)
            try:
                yield from responses
            except grpc.RpcError as exc:
                raise self.failure(exc) from None
            finally:
                responses.cancel()
