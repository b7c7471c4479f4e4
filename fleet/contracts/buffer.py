"""The replay buffer's plain types, shared by the buffer (which makes its answers) and its clients (which read them),
and the data-plane contract between them: where a scored group's bytes live in Redis.

`Starvation` says why a Sample came back short: the store builds it, the servicer puts it on the wire, the client
reads it back, and the trainer's coordinator logs, counts and raises with it. One type for all four.

Payload keys: a rollout worker writes each scored group's bytes to Redis itself, under `payload_key(prefix, gid)`,
and submits only the header (the buffer is the control plane, Redis the data plane). The buffer refuses a key
outside `payload_key_space(prefix, gid)` (`check_payload_key`), so a client can name only a payload of its own group,
never a key the buffer's rules keep. The embedded Redis listens at `embedded_redis_socket(data_dir)`, which the buffer,
the workers and the trainer derive alike from the config (`data_plane_url`).
"""

from __future__ import annotations

import hashlib
import re
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from fleet.contracts.groups import PromptGroup


@dataclass(frozen=True)
class Starvation:
    reason: str = ""
    prompts_pending: int = 0
    leases_outstanding: int = 0
    live_workers: int = 0
    evicted_now: int = 0
    waited_s: float = 0.0

    def describe(self) -> str:
        return (
            f"{self.reason}: {self.prompts_pending} prompts pending, {self.leases_outstanding} leases out, "
            f"{self.live_workers} live workers, {self.evicted_now} evicted, waited {self.waited_s:.1f}s"
        )


@dataclass
class WorkerInfo:
    """A rollout worker as the registry holds it (the buffer's record, and what a worker registers and heartbeats).
    Version and epoch -1: the worker holds no pushed weights yet."""

    worker_id: str
    address: str
    weight_version: int = 0
    weight_epoch: int = 0
    last_heartbeat_ms: int = 0
    state: str = "starting"  # "starting" | "serving" | "draining"
    groups_in_flight: int = 0


@dataclass(frozen=True)
class Registration:
    """The buffer's answer to RegisterWorker / Heartbeat."""

    epoch: int
    current_version: int
    heartbeat_interval_ms: int = 0


@dataclass(frozen=True)
class Lease:
    """One leased prompt group (the buffer client converts the message: `buffer_client/wire.py`)."""

    lease_id: str
    group: PromptGroup
    delivery_count: int = 1


@dataclass(frozen=True)
class LeaseReply:
    leases: list[Lease] = field(default_factory=list)
    retry_after_ms: int = 0
    reason: str = ""  # when `leases` is empty: "queue_empty" | "age_bound"


@dataclass(frozen=True)
class SubmitOutcome:
    duplicate: bool = False
    dead_lettered: bool = False
    requeued: bool = False


# ---- the data plane -----------------------------------------------------------------------------------------------

_NONCE = re.compile(r"[0-9a-f]{16,64}")


def payload_key_space(prefix: str, group_id: str) -> str:
    """Every payload key of group `group_id` starts with this (the `{prefix}` hash tag: the buffer's Redis Cluster
    slot)."""
    return f"{{{prefix}}}:payload:{group_id}:"


def payload_key(prefix: str, group_id: str, nonce: str | None = None) -> str:
    """A fresh payload key for one write of group `group_id`'s bytes: a new nonce per write, so that a retried or
    competing submit never overwrites bytes the buffer already kept."""
    return payload_key_space(prefix, group_id) + (nonce or uuid.uuid4().hex)


def check_payload_key(prefix: str, group_id: str, key: str) -> None:
    """Raise ValueError unless `key` is a payload key of group `group_id` (`payload_key`'s form)."""
    space = payload_key_space(prefix, group_id)
    if not key.startswith(space) or not _NONCE.fullmatch(key[len(space):]):
        raise ValueError(f"payload_key {key[:300]!r} is not a payload key of group {group_id!r} "
                         f"(expected {space}NONCE, NONCE 16-64 lower-case hex digits)")


def payload_ttl_ms(outage_tolerance_s: float) -> int:
    """Expiry of a payload the worker wrote and the buffer has not accepted yet. It must outlast the submit that
    follows, which may ride out a buffer outage of up to `services.outage_tolerance_s`: twice that, at least 10
    minutes. A submit arriving after it expired is refused (FAILED_PRECONDITION), never stored without its bytes."""
    return int(max(600.0, 2 * outage_tolerance_s) * 1000)


_MAX_SOCKET_PATH = 100  # AF_UNIX paths are limited to 108 bytes including the NUL


def embedded_redis_socket(data_dir: Path) -> Path:
    """Where the embedded Redis of `data_dir` listens. Deterministic, so a restarted buffer finds a server left
    running, and its clients find the server the buffer started; longer paths get a socket in the temp dir."""
    path = data_dir / "redis.sock"
    if len(str(path)) <= _MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha1(str(data_dir).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"gf-redis-{digest}.sock"


def data_plane_url(redis_url: str, run_dir: str) -> str:
    """The Redis every process of a run reaches: `redis.url`, or (empty) the embedded server in `run.dir/redis`."""
    if redis_url:
        return redis_url
    return f"unix://{embedded_redis_socket((Path(run_dir) / 'redis').resolve())}"
