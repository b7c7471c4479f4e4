"""The prompt feeder: which prompt groups are enqueued for which optimizer step, reproducibly across restarts.

Prompts come from an endless stream that walks the dataset epoch by epoch, each epoch in its own seeded order; a
cursor counts the stream positions handed out so far. Step t's regular share is the next `num_prompts_per_step`
positions, taken when the trainer enqueues step t; a step that cannot fill (its groups were dead-lettered) is
topped up with further positions for the same step. Group ids are `EPOCH:POSITION` (position inside that epoch's
order), so a prompt enqueued twice carries the same id and the buffer's idempotent enqueue drops the second copy.

The data position saved in a checkpoint is the cursor, the first step not yet enqueued, and which cursor ranges were
enqueued for which steps not yet trained. After a resume the feeder continues at the checkpoint's cursor: positions
enqueued before the checkpoint are still in the buffer (pending, scored, or returned to the store by BeginRun);
positions the dead trainer enqueued after it are enqueued again under the same ids (duplicates, dropped). Nothing is
skipped, nothing is added twice, whatever the timing of top-ups was.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleet.contracts.groups import PromptGroup


@dataclass(frozen=True)
class Task:
    env_name: str
    task_id: str
    prompt_token_ids: list[int]
    env_payload: bytes
    repo: str = ""
    """The task's repository (SWE tasks), for messages that name where a problem is."""


class TaskSource(Protocol):
    """A dataset split as the feeder sees it: a length and tokenized tasks by index."""

    def __len__(self) -> int: ...

    def task(self, index: int) -> Task: ...

    def repo_of(self, task_id: str) -> str:
        """The repository of task `task_id` ("" when unknown), without building its prompt."""
        ...


@dataclass
class DataPosition:
    cursor: int = 0  # stream positions handed out so far
    next_step: int = 0  # first step whose regular share is not yet enqueued
    dataset_size: int = 0
    seed: int = 0
    shuffle: bool = True
    num_prompts_per_step: int = 0
    enqueued: dict[int, list[list[int]]] = field(default_factory=dict)  # step -> [[first, count], ...] untrained

    def to_json(self) -> dict[str, Any]:
        return {**vars(self), "enqueued": {str(k): v for k, v in self.enqueued.items()}}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> DataPosition:
        return cls(**{**raw, "enqueued": {int(k): [list(r) for r in v] for k, v in raw.get("enqueued", {}).items()}})


class PromptFeeder:
    def __init__(self, source: TaskSource, *, num_prompts: int, num_generations: int, seed: int,
                 shuffle: bool = True, position: DataPosition | None = None) -> None:
        if len(source) == 0:
            raise ValueError("data.train: the training dataset is empty")
        self.source = source
        self.n = num_prompts
        self.g = num_generations
        self.seed = seed
        self.shuffle = shuffle
        self._orders: dict[int, list[int]] = {}
        self.position = position or DataPosition()
        self._check_position()

    def _check_position(self) -> None:
        p = self.position
        if p.dataset_size == 0:  # fresh
            p.dataset_size, p.seed, p.shuffle = len(self.source), self.seed, self.shuffle
            p.num_prompts_per_step = self.n
            return
        now = (len(self.source), self.seed, self.shuffle, self.n)
        then = (p.dataset_size, p.seed, p.shuffle, p.num_prompts_per_step)
        if now != then:
            raise ValueError(
                "resume: the data order changed since the checkpoint (dataset size, grpo.seed, data.shuffle, "
                f"grpo.num_prompts_per_step were {then}, now {now}); prompts would be skipped or repeated. "
                "Restore them, or start a new run directory")

    def order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            idx = list(range(len(self.source)))
            if self.shuffle:
                random.Random(f"{self.seed}:{epoch}").shuffle(idx)
            self._orders = {epoch: idx}  # one epoch's order is all a step ever needs (plus a boundary)
        return self._orders[epoch]

    def locate(self, cursor: int) -> tuple[int, int, int]:
        """(epoch, position in epoch, dataset index) of a stream cursor."""
        epoch, pos = divmod(cursor, len(self.source))
        return epoch, pos, self.order(epoch)[pos]

    def _take(self, count: int, step: int) -> list[PromptGroup]:
        now_ms = int(time.time() * 1000)
        p = self.position
        out = []
        for cursor in range(p.cursor, p.cursor + count):
            epoch, pos, index = self.locate(cursor)
            task = self.source.task(index)
            out.append(PromptGroup(f"{epoch}:{pos}", step, task.env_name, task.task_id, list(task.prompt_token_ids),
                                  self.g, task.env_payload, enqueued_at_ms=now_ms))
        p.enqueued.setdefault(step, []).append([p.cursor, count])
        p.cursor += count
        return out

    def next_share(self, step: int) -> list[PromptGroup]:
        """Step `step`'s regular share; steps are taken in order. Advances the position (enqueue what you take)."""
        if step != self.position.next_step:
            raise RuntimeError(f"steps must be enqueued in order: expected {self.position.next_step}, got {step}")
        self.position.next_step = step + 1
        return self._take(self.n, step)

    def top_up(self, step: int, count: int) -> list[PromptGroup]:
        """`count` more prompts for `step` (replacing groups that were dead-lettered)."""
        return self._take(count, step)

    def pending_steps(self, upto_step: int) -> list[int]:
        """Steps in [next_step, upto_step] whose regular share is still to enqueue."""
        return list(range(self.position.next_step, upto_step + 1))

    def mark_trained(self, step: int) -> None:
        """Forget the audit entries of steps up to `step` (their groups are in the model once it is saved)."""
        for s in [s for s in self.position.enqueued if s <= step]:
            del self.position.enqueued[s]

    def state(self) -> dict[str, Any]:
        return self.position.to_json()


def validation_groups(source: TaskSource, step: int, max_samples: int) -> list[PromptGroup]:
    """The first `grpo.max_val_samples` tasks, in order, one generation each; ids unique per validation round."""
    now_ms = int(time.time() * 1000)
    out = []
    for i in range(min(max_samples, len(source))):
        t = source.task(i)
        out.append(PromptGroup(f"val:{step}:{i}", step, t.env_name, t.task_id, list(t.prompt_token_ids), 1,
                              t.env_payload, validation=True, enqueued_at_ms=now_ms))
    return out


class ListSource:
    """A TaskSource over a list (tests, and sources already materialised)."""

    def __init__(self, tasks: list[Task]) -> None:
        self.tasks = tasks

    def __len__(self) -> int:
        return len(self.tasks)

    def task(self, index: int) -> Task:
        return self.tasks[index]

    def repo_of(self, task_id: str) -> str:
        return next((t.repo for t in self.tasks if t.task_id == task_id), "")


def payload_bytes(payload: Any) -> bytes:
    if isinstance(payload, bytes | bytearray):
        return bytes(payload)
    if isinstance(payload, str):
        return payload.encode()
    return json.dumps(payload, sort_keys=True, default=str).encode()
