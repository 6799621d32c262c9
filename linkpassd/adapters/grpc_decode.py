"""Requests that do not decode get INVALID_ARGUMENT, not UNKNOWN.

grpc.aio answers a unary request whose bytes are not the method's message
with UNKNOWN and the text of the Python exception ("Unexpected <class
'google.protobuf.message.DecodeError'>: ..."): a status that says neither
whose fault it is nor why, and leaks how the server is built. `add_servicer`
registers a generated servicer with every unary request decoded safely: an
undecodable one reaches a wrapper that answers INVALID_ARGUMENT naming the
message type. (A streaming request's undecodable message ends its stream in
the servicer itself: aggregator.server.AgentServicer._read.)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import grpc


class Undecodable:
    """What a request that did not decode becomes."""

    def __init__(self, type_name: str, error: Exception) -> None:
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        self.message = f"the request is not a valid {type_name}: {first_line}"


class _Capture:
    """Stands in for the server while a generated add_*_to_server registers."""

    def __init__(self) -> None:
        self.services: list[tuple[str, dict[str, grpc.RpcMethodHandler]]] = []

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # the same handlers come again through add_registered_method_handlers

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.services.append((service, handlers))


def _safe_deserializer(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    type_name = getattr(getattr(deserialize, "__self__", None), "DESCRIPTOR", None)
    name = type_name.full_name if type_name is not None else "request"

    def decode(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # noqa: BLE001 - whatever the bytes did, the caller is told
            return Undecodable(name, exc)
    return decode


def _checked(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    if handler.request_streaming or handler.request_deserializer is None:
        return handler
    decode = _safe_deserializer(handler.request_deserializer)
    if handler.response_streaming:
        inner = handler.unary_stream

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, Undecodable):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            result = inner(request, context)
            if inspect.isasyncgen(result) or hasattr(result, "__aiter__"):
                async for item in result:
                    yield item
            else:
                await result
        return grpc.unary_stream_rpc_method_handler(stream, request_deserializer=decode,
                                                    response_serializer=handler.response_serializer)
    inner_unary = handler.unary_unary

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        return await inner_unary(request, context)
    return grpc.unary_unary_rpc_method_handler(unary, request_deserializer=decode,
                                               response_serializer=handler.response_serializer)


def add_servicer(add: Callable[[Any, Any], None], servicer: Any, server: grpc.aio.Server) -> None:
    """`add(servicer, server)` (a generated add_*Servicer_to_server), with
    undecodable unary requests answered INVALID_ARGUMENT."""
    capture = _Capture()
    add(servicer, capture)
    for service, handlers in capture.services:
        checked = {name: _checked(h) for name, h in handlers.items()}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, checked),))
        server.add_registered_method_handlers(service, checked)
