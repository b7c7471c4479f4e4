"""Client channels with the fleet's transport settings and the bearer token attached to every call."""

from __future__ import annotations

from grpc import aio

from fleet.config.infra import ServicesConfig
from services.runtime.server import auth_token, channel_options


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
