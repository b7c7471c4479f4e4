"""Helpers of the store tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

from services.replay_buffer.models import PromptIn, ScoredIn, WorkerRecord
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
