"""The prompt feeder: a reproducible stream of prompt groups, and no prompt skipped or repeated across a resume."""

from __future__ import annotations

from collections import Counter

import pytest

from fleet.contracts.groups import PromptGroup
from trainer.data import DataPosition, ListSource, PromptFeeder, Task, validation_groups


def _source(n: int = 10) -> ListSource:
    return ListSource([Task("arith", f"task-{i}", [1, i + 2], b'{"i": %d}' % i) for i in range(n)])


class FakeBuffer:
    """EnqueuePrompts' contract: idempotent on group_id (a known id, in any state, is a duplicate)."""

    def __init__(self) -> None:
        self.groups: dict[str, PromptGroup] = {}
        self.duplicates = 0

    def enqueue(self, specs: list[PromptGroup]) -> None:
        for s in specs:
            if s.group_id in self.groups:
                assert self.groups[s.group_id].task_id == s.task_id, "same id must mean the same prompt"
                self.duplicates += 1
            else:
                self.groups[s.group_id] = s


def _enqueue_through(feeder: PromptFeeder, buffer: FakeBuffer, last: int) -> list[int]:
    steps = feeder.pending_steps(last)
    for step in steps:
        buffer.enqueue(feeder.next_share(step))
    return steps


def test_each_epoch_covers_every_task_once_in_a_seeded_order() -> None:
    feeder = PromptFeeder(_source(10), num_prompts=4, num_generations=8, seed=1)
    specs = [s for step in range(5) for s in feeder.next_share(step)]  # 20 groups = 2 epochs
    assert [s.group_id for s in specs[:3]] == ["0:0", "0:1", "0:2"]
    first, second = specs[:10], specs[10:]
    assert Counter(s.task_id for s in first) == Counter(f"task-{i}" for i in range(10))
    assert Counter(s.task_id for s in second) == Counter(f"task-{i}" for i in range(10))
    assert [s.task_id for s in first] != [s.task_id for s in second]  # each epoch reshuffled
    assert all(s.num_generations == 8 and s.target_step == i // 4 for i, s in enumerate(specs))
    again = PromptFeeder(_source(10), num_prompts=4, num_generations=8, seed=1)
    replay = [s for step in range(5) for s in again.next_share(step)]
    assert [(s.group_id, s.task_id) for s in replay] == [(s.group_id, s.task_id) for s in specs]


def test_resume_from_checkpoint_neither_skips_nor_repeats() -> None:
    max_age, n, buffer = 2, 4, FakeBuffer()
    run1 = PromptFeeder(_source(7), num_prompts=n, num_generations=2, seed=3)
    for step in range(4):  # async: steps s .. s+max_age enqueued before step s trains
        _enqueue_through(run1, buffer, step + max_age)
        if step == 1:  # a group of step 1 was dead-lettered: the step is topped up with one more prompt
            buffer.enqueue(run1.top_up(1, 1))
        if step == 2:  # checkpoint after step 2 trained
            run1.mark_trained(step)
            saved = DataPosition.from_json(run1.state())
        if step == 3:  # after the checkpoint, the dead run topped up step 3 too (the resumed run will not)
            buffer.enqueue(run1.top_up(3, 2))
    # run1 dies after enqueuing through step 5; the resumed run starts from the checkpoint's position.
    run2 = PromptFeeder(_source(7), num_prompts=n, num_generations=2, seed=3, position=saved)
    assert (run2.position.next_step, run2.position.cursor) == (2 + max_age + 1, 5 * n + 1)
    assert saved.enqueued == {3: [[12, 4]], 4: [[17, 4]]}  # enqueued before the checkpoint, not yet trained
    for step in range(3, 10):
        _enqueue_through(run2, buffer, min(step + max_age, 9))
    ids = sorted(buffer.groups, key=lambda g: tuple(int(x) for x in g.split(":")))
    # Every regular share plus run 1's pre-checkpoint top-up. The dead run's post-checkpoint top-up used positions
    # 25-26, which the resumed run hands out again as part of step 6's share: same ids, dropped as duplicates.
    total = 10 * n + 1
    assert run2.position.cursor == total and len(ids) == total
    assert ids == [f"{c // 7}:{c % 7}" for c in range(total)]  # stream positions 0..total-1, each exactly once
    assert buffer.duplicates == n + 2  # positions the dead run enqueued after the checkpoint, offered again


def test_resume_refuses_a_changed_data_order() -> None:
    feeder = PromptFeeder(_source(10), num_prompts=4, num_generations=2, seed=1)
    feeder.next_share(0)
    with pytest.raises(ValueError, match="grpo.seed"):
        PromptFeeder(_source(10), num_prompts=4, num_generations=2, seed=2,
                     position=DataPosition.from_json(feeder.state()))
    with pytest.raises(ValueError, match="dataset size"):
        PromptFeeder(_source(11), num_prompts=4, num_generations=2, seed=1,
                     position=DataPosition.from_json(feeder.state()))


def test_steps_must_be_enqueued_in_order() -> None:
    feeder = PromptFeeder(_source(), num_prompts=2, num_generations=2, seed=0)
    with pytest.raises(RuntimeError, match="in order"):
        feeder.next_share(1)


def test_validation_groups_have_one_generation_and_ids_per_round() -> None:
    a, b = validation_groups(_source(5), 10, 3), validation_groups(_source(5), 20, 3)
    assert [g.group_id for g in a] == ["val:10:0", "val:10:1", "val:10:2"]
    assert {g.group_id for g in a}.isdisjoint(g.group_id for g in b)
    assert all(g.validation and g.num_generations == 1 for g in a)
