"""The floor of labs/bench/aggregator: a gRPC server that does nothing but
read each agent's stream and answer it, with the aggregator's own server
options.

    python -m labs.bench.agg_floor --listen 127.0.0.1:PORT

Its CPU per message, under the same load processes as the aggregator, is
what grpc.aio itself costs on this machine (reading the message, writing a
Welcome and the acks, HTTP/2 keepalives, one connection per host): the part
of the aggregator's cost that no change to linkpass can remove. It stores
nothing; an ack names the batch's last seq at once.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import grpc

from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd._proto.linkpass.v1 import fleet_pb2_grpc as pb_grpc
from linkpassd.aggregator.server import server_options


class FloorServicer(pb_grpc.AgentServiceServicer):
    async def Connect(self, requests, context):  # the gRPC method's name
        async for request in requests:
            which = request.WhichOneof("body")
            if which == "hello":
                await context.write(pb.ConnectResponse(welcome=pb.Welcome(heartbeat_s=5.0)))
            elif which == "events" and request.events.events:
                await context.write(pb.ConnectResponse(ack=pb.EventAck(
                    boot_id=request.events.boot_id, seq=request.events.events[-1].seq)))


async def serve(listen: str) -> None:
    server = grpc.aio.server(options=server_options(4 << 20))
    pb_grpc.add_AgentServiceServicer_to_server(FloorServicer(), server)
    server.add_insecure_port(listen)
    await server.start()
    print("serving", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    await server.stop(1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="loopback HOST:PORT")
    args = parser.parse_args(argv)
    if not args.listen.startswith(("127.0.0.1:", "[::1]:", "localhost:")):
        parser.error(f"--listen must be a loopback address, got {args.listen!r}")
    asyncio.run(serve(args.listen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
