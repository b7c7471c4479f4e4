"""Server interceptors: bearer-token auth and the single place where exceptions become status codes."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from services.runtime.errors import DomainError

log = logging.getLogger(__name__)

# Health and reflection stay open so that probes and `grpcurl list` work without the token.
_OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")

try:  # redis is a dependency of the package, but the runtime must not require it to import.
    from redis.exceptions import ConnectionError as _RedisConnectionError
    from redis.exceptions import TimeoutError as _RedisTimeoutError

    _UNAVAILABLE_EXC: tuple[type[BaseException], ...] = (_RedisConnectionError, _RedisTimeoutError, ConnectionError)
except ImportError:  # pragma: no cover
    _UNAVAILABLE_EXC = (ConnectionError,)


def _wrap(handler: grpc.RpcMethodHandler, wrap: Callable[[Any], Any]) -> grpc.RpcMethodHandler:
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(
            wrap(handler.unary_unary), handler.request_deserializer, handler.response_serializer
        )
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(
            wrap(handler.stream_unary), handler.request_deserializer, handler.response_serializer
        )
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(
            wrap(handler.unary_stream), handler.request_deserializer, handler.response_serializer
        )
    return handler  # stream-stream: none of our services use it


class ErrorInterceptor(aio.ServerInterceptor):
    """Domain errors -> their status code; Redis down -> UNAVAILABLE; anything else -> INTERNAL with a short
    message (the traceback goes to the log, never to the caller)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        method = details.method

        def wrap(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            async def guarded(request: Any, context: aio.ServicerContext) -> Any:
                try:
                    return await fn(request, context)
                except DomainError as exc:
                    await context.abort(exc.code, str(exc))
                except _UNAVAILABLE_EXC as exc:
                    log.warning("%s: backend unavailable: %s", method, exc)
                    await context.abort(grpc.StatusCode.UNAVAILABLE, f"backend unavailable: {exc}")
                except aio.AbortError:
                    raise
                except Exception as exc:
                    log.exception("%s failed", method)
                    await context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")

            return guarded

        return _wrap(handler, wrap)


class AuthInterceptor(aio.ServerInterceptor):
    """Requires `authorization: Bearer <token>` on every method except health and reflection."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(_OPEN_PREFIXES):
            return handler
        supplied = dict(details.invocation_metadata or ()).get("authorization", "")
        if isinstance(supplied, str):
            supplied = supplied.encode()
        if hmac.compare_digest(supplied, self._expected):
            return handler

        def deny(_fn: Any) -> Callable[..., Awaitable[Any]]:
            async def denied(request: Any, context: aio.ServicerContext) -> Any:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

            return denied

        return _wrap(handler, deny)
