"""Client channels with the fleet's transport settings and the bearer token attached to every call."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
from grpc import aio

from fleet.config.infra import ServicesConfig
from services.runtime.server import auth_token, channel_options

log = logging.getLogger(__name__)


class _BearerAuth(aio.UnaryUnaryClientInterceptor, aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self, token: str) -> None:
        self._md = ("authorization", f"Bearer {token}")

    def _details(self, details: aio.ClientCallDetails) -> aio.ClientCallDetails:
        md = list(details.metadata or ())
        md.append(self._md)
        return aio.ClientCallDetails(details.method, details.timeout, md, details.credentials, details.wait_for_ready)

    async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request)

    async def intercept_stream_unary(self, continuation, details, request_iterator):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request_iterator)


def make_channel(address: str, services: ServicesConfig, token: str | None = None) -> aio.Channel:
    """An insecure channel to `address` ("host:port"). Every call made on it must still pass `timeout=`."""
    token = token if token is not None else auth_token(services)
    interceptors = [_BearerAuth(token)] if token else None
    return aio.insecure_channel(address, options=channel_options(services), interceptors=interceptors)


_TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
T = TypeVar("T")


async def retry_transient(name: str, fn: Callable[[], Awaitable[T]], *, retries: int) -> T:
    """Run one client call, retrying UNAVAILABLE / DEADLINE_EXCEEDED with exponential backoff (0.2 s doubling to
    5 s), so that a service restart costs the caller a pause, not its work. Other errors propagate at once."""
    delay = 0.2
    for attempt in range(retries + 1):
        try:
            return await fn()
        except aio.AioRpcError as exc:
            if exc.code() not in _TRANSIENT or attempt == retries:
                raise
            log.warning("%s: %s; retrying in %.1fs", name, exc.code().name, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
    raise AssertionError("unreachable")
