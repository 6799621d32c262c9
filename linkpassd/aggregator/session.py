"""One agent's stream as the aggregator's servicers see it: its
`HostSession` (what the host said, its outbox, the commands waiting for an
answer) and `StreamEnd`, the status a stream ends with. The server makes
them; the fleet API, the replicas and fleet validation use them to talk to a
host.
"""

from __future__ import annotations

import asyncio
import collections
import time

import grpc

from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb

OUTBOX_MAX = 1024  # responses not written yet, per stream


class StreamEnd(Exception):
    """End this stream with `code` and a message that says why."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message



class HostSession:
    """One agent stream, from an accepted Hello to its end."""

    def __init__(self, host_id: str, boot_id: str, version: str, peer: str) -> None:
        self.host_id = host_id
        self.boot_id = boot_id
        self.version = version
        self.peer = peer
        self.inventory: pb.Inventory | None = None
        # (when queued, the response): the queued time is the "outbox" stage.
        # Unbounded as a queue, bounded by send() (OUTBOX_MAX), so finish()
        # can always add the None that wakes the writer.
        self.outbox: asyncio.Queue[tuple[float, pb.ConnectResponse] | None] = asyncio.Queue()
        self.ended: asyncio.Future[StreamEnd | None] = asyncio.get_running_loop().create_future()
        self.commands: dict[str, asyncio.Future[pb.CommandResult]] = {}
        self.last_seq: dict[str, int] = {}  # per boot: the newest seq this stream sent
        self.gone = False  # the call itself failed: nothing more can be written
        self.gpus: dict[str, int] = {}  # rail -> GPUs behind it, from the newest inventory read
        # Read, not handled yet (AgentServicer._take): (what, ..., when read);
        # the worker task runs only while there is some.
        self.pending: collections.deque[tuple] = collections.deque()
        self.worker: asyncio.Task[None] | None = None

    @property
    def open(self) -> bool:
        return not self.ended.done()

    def finish(self, outcome: StreamEnd | None) -> None:
        """End the stream (None: cleanly); the first outcome wins."""
        if not self.ended.done():
            self.ended.set_result(outcome)
            self.outbox.put_nowait(None)  # the writer: no more to wait for
        for future in self.commands.values():
            if not future.done():
                future.set_exception(StreamEnd(grpc.StatusCode.UNAVAILABLE,
                                               f"host {self.host_id} disconnected before answering"))

    def send(self, message: pb.ConnectResponse) -> None:
        """Queue a response; an agent that stops reading its responses loses its stream."""
        if not self.open:
            return
        if self.outbox.qsize() >= OUTBOX_MAX:
            self.finish(StreamEnd(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  f"host {self.host_id} is not reading its responses ({OUTBOX_MAX} queued)"))
            return
        self.outbox.put_nowait((time.perf_counter(), message))
