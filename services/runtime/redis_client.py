"""What every process that talks to Redis shares: the client settings and the set of "Redis is down" errors.

The replay buffer's Redis watch (services/replay_buffer/redis_watch.py) and the data plane's `PayloadStore`
(buffer_client/payloads.py), used by the trainer and the rollout workers, both use them, so they live here, a floor
below both: the buffer never imports its own client.
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# redis-py's connection errors do not derive from the builtin ConnectionError; BusyLoadingError (a Redis replaying
# its AOF) derives from its ConnectionError. OSError covers the builtin TimeoutError of a call that got no answer.
REDIS_DOWN = (RedisConnectionError, RedisTimeoutError, OSError)


def redis_client(url: str) -> Redis:
    """A client whose failures surface fast rather than hanging calls. One retry on a fresh connection covers a Redis
    that restarted between two calls (the pooled connection is stale); longer outages are the caller's to ride out,
    not each command's. A timeout is not retried: that would double a hung call."""
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), 1, supported_errors=(RedisConnectionError,))
    return Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5, health_check_interval=30, retry=retry)


def describe_redis_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
