"""Helpers of the store tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

from services.replay_buffer.models import PromptIn, SampleResult, ScoredIn, WorkerRecord
from services.replay_buffer.store import ReplayStore


def prompts(*specs: tuple[str, int], validation: bool = False) -> list[PromptIn]:
    """(group_id, target_step) pairs -> PromptIn with a recognizable payload."""
    return [PromptIn(gid, target, f"prompt:{gid}".encode(), validation) for gid, target in specs]


def scored(gid: str, min_version: int, max_version: int | None = None, *, validation: bool = False) -> ScoredIn:
    return ScoredIn(gid, 0, min_version, min_version if max_version is None else max_version,
                    f"scored:{gid}".encode(), validation)  # fmt: skip


async def start_run(store: ReplayStore, *workers: str, resume_step: int = 0, version: int = 0) -> int:
    """BeginRun and register workers: what the trainer and the workers do before any lease."""
    info = await store.begin_run(resume_step, version)
    for w in workers:
        await store.workers.put(WorkerRecord(w, f"{w}:1", version, info.epoch))
    return info.epoch


async def assert_accounting(store: ReplayStore) -> None:
    acc = await store.accounting()
    assert acc.ok, acc.violations
    assert acc.enqueued == acc.by_state["sampled"] + acc.pending + acc.by_state["dead"]


async def read(store: ReplayStore, res: SampleResult) -> list[bytes]:
    """The bytes of the groups a sample named, read from their payload keys, validation groups' then deleted (the
    trainer's part: buffer_client.BufferClient.sample)."""
    keys = res.payload_keys
    values = await store.redis.mget(keys) if keys else []
    if once := [g.payload_key for g in res.groups if g.validation]:
        await store.redis.delete(*once)
    assert all(v is not None for v in values), "a sampled group's payload key is gone"
    return [bytes(v) for v in values]
