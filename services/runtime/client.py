"""Client channels with the fleet's transport settings and the bearer token attached to every call, and the retry
loop that rides out a service's outage (`call_through_outage`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
from grpc import aio

from fleet.config.infra import ServicesConfig
from services.runtime.outage import Outage
from services.runtime.server import auth_token, channel_options

log = logging.getLogger(__name__)


class _BearerAuth(aio.UnaryUnaryClientInterceptor, aio.StreamUnaryClientInterceptor):
    def __init__(self, token: str) -> None:
        self._md = ("authorization", f"Bearer {token}")

    def _details(self, details: aio.ClientCallDetails) -> aio.ClientCallDetails:
        md = list(details.metadata or ())
        md.append(self._md)
        return aio.ClientCallDetails(details.method, details.timeout, md, details.credentials, details.wait_for_ready)

    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(self._details(details), request)

    async def intercept_stream_unary(self, continuation, details, request_iterator):
        return await continuation(self._details(details), request_iterator)


def make_channel(address: str, services: ServicesConfig, token: str | None = None) -> aio.Channel:
    """An insecure channel to `address` ("host:port"). Every call made on it must still pass `timeout=`."""
    token = token if token is not None else auth_token(services)
    interceptors = [_BearerAuth(token)] if token else None
    return aio.insecure_channel(address, options=[*channel_options(services), *_RECONNECT], interceptors=interceptors)


BACKEND_DOWN = "backend unavailable: "  # services.runtime.interceptors' prefix for a backend's failure
_TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
# Without these, a channel that failed to connect for a while waits up to gRPC's default 120 s before it tries again,
# and a restarted service would stay unreached long after it is back.
_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]
_MAX_DELAY_S = 2.0
T = TypeVar("T")


def describe_unavailable(exc: aio.AioRpcError) -> str:
    """What a transient failure says is down: the service itself (no answer) or what it depends on (it answered
    UNAVAILABLE naming its backend, e.g. the replay buffer's Redis)."""
    details = (exc.details() or "").strip()
    return f"{exc.code().name}: {details[:600]}" if details else exc.code().name


def backend_down(exc: aio.AioRpcError) -> bool:
    """The service answered, and said that what it depends on is down (the error interceptor's and the replay
    buffer's `backend unavailable: ...`), rather than not answering at all."""
    return exc.code() == grpc.StatusCode.UNAVAILABLE and (exc.details() or "").startswith(BACKEND_DOWN)


async def call_through_outage(name: str, fn: Callable[[], Awaitable[T]], outage: Outage) -> T:
    """Run one client call, riding out an outage of the service (UNAVAILABLE / DEADLINE_EXCEEDED) with exponential
    backoff (0.2 s doubling to 2 s), so that a restart costs the caller a pause, not its work. `outage` is shared by
    every call to the same service: it logs the outage once, and raises `ServiceDown` past its bound. Other errors
    propagate at once."""
    delay = 0.2
    while True:
        try:
            result = await fn()
        except aio.AioRpcError as exc:
            if exc.code() not in _TRANSIENT:
                outage.recovered()  # it answered: whatever it said, it is up
                raise
            detail, answered = describe_unavailable(exc), backend_down(exc)
        else:
            outage.recovered()
            return result
        # Outside the except block: a ServiceDown past the bound is the error, not a consequence of the last one.
        log.debug("%s: %s; retrying in %.1fs", name, detail, delay)
        outage.failed(detail, answered=answered)
        await asyncio.sleep(delay)
        delay = min(delay * 2, _MAX_DELAY_S)
