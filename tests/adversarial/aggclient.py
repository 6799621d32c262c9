"""What the adversarial aggregator tests share: a real aggregator on
127.0.0.1 port 0 (SQLite), and raw agent streams that can send anything,
including bytes that are not a ConnectRequest."""

from __future__ import annotations

import asyncio
import time

import grpc

from linkpassd._proto.linkpass.v1 import control_pb2 as cpb
from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd.adapters.control_convert import timestamp
from tests.unit.agg_tls import insecure_settings, serving  # noqa: F401 - re-exported

DEADLINE_S = 20.0
CONNECT = "/linkpass.v1.AgentService/Connect"


def event(boot: str, seq: int, **kw) -> cpb.Event:
    base = dict(boot_id=boot, seq=seq, time=timestamp(time.time()), kind=cpb.EVENT_KIND_VERDICT,
                severity=cpb.SEVERITY_INFO, name="port_verdict", port="eth1", rail="rail0",
                message=f"event {seq}")
    base.update(kw)
    return cpb.Event(**base)


def hello(host: str, boot: str = "boot-a") -> pb.ConnectRequest:
    return pb.ConnectRequest(hello=pb.Hello(host_id=host, boot_id=boot, version="test"))


class RawAgent:
    """An agent stream that writes bytes: a serialized message, or garbage."""

    def __init__(self, ch: grpc.aio.Channel) -> None:
        self.call = ch.stream_stream(CONNECT, request_serializer=lambda b: b,
                                     response_deserializer=pb.ConnectResponse.FromString)()

    async def send(self, message: pb.ConnectRequest | bytes) -> None:
        await self.call.write(message if isinstance(message, bytes) else message.SerializeToString())

    async def read_kind(self, kind: str) -> pb.ConnectResponse:
        while True:
            got = await asyncio.wait_for(self.call.read(), DEADLINE_S)
            assert got is not grpc.aio.EOF, f"stream ended ({await self.call.code()}) before a {kind}"
            if got.WhichOneof("body") == kind:
                return got

    async def connect(self, host: str, boot: str = "boot-a") -> pb.Welcome:
        await self.send(hello(host, boot))
        return (await self.read_kind("welcome")).welcome

    async def outcome(self) -> tuple[grpc.StatusCode, str]:
        """Read until the stream ends: its status code and details (OK included)."""
        try:
            async with asyncio.timeout(DEADLINE_S):
                await self.call.done_writing()  # a message the server took: it ends the stream OK
                while await self.call.read() is not grpc.aio.EOF:
                    pass
                return await self.call.code(), await self.call.details()
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""


def run(scenario, timeout: float = 120.0) -> None:
    asyncio.run(asyncio.wait_for(scenario, timeout))
