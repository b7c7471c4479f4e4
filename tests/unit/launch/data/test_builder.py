import asyncio
import random
import time

import pytest

from envs.registry import Task
from launch.data.builder import BuildError, BuildOptions, build_lock, build_taskset, select_in_order
from launch.data.candidates import Candidate
from launch.data.recipe import load_recipe
from launch.data.validate import Outcome, function_split, task_split


def plan(n_functions: int, per_fn: int) -> list[Candidate]:
    cands = []
    for r in range(per_fn):
        for f in range(n_functions):
            cands.append(Candidate(len(cands), f"m{f % 3}.py", f"fn{f}", "op_change", r, ("t.py",)))
    return cands


def accepts(c: Candidate) -> bool:
    return (c.order * 7919) % 5 in (0, 2, 3)


async def run(cands, want, per_function, concurrency, jitter_seed):
    rng = random.Random(jitter_seed)
    delays = {c.order: rng.random() * 0.01 for c in cands}

    async def validate(c: Candidate) -> Outcome:
        await asyncio.sleep(delays[c.order])
        task = Task(str(c.order), "swe", "") if accepts(c) else None
        return Outcome(c, "accepted" if task else "no_failure", task=task)

    outcomes = await select_in_order(cands, validate, want, per_function, concurrency)
    return [(o.candidate.order, o.reason) for o in outcomes]


def sequential(cands, want, per_function):
    taken: dict[str, int] = {}
    out, accepted = [], 0
    for c in cands:
        if accepted == want:
            break
        if taken.get(c.function_id, 0) >= per_function:
            continue
        ok = accepts(c)
        out.append((c.order, "accepted" if ok else "no_failure"))
        if ok:
            taken[c.function_id] = taken.get(c.function_id, 0) + 1
            accepted += 1
    return out


def test_parallel_selection_equals_the_sequential_rule_whatever_the_timing():
    cands = plan(12, 4)
    for want, per_function in [(5, 1), (10, 2), (100, 2)]:
        expected = sequential(cands, want, per_function)
        for concurrency in (1, 3, 8):
            for jitter in range(3):
                assert asyncio.run(run(cands, want, per_function, concurrency, jitter)) == expected


def test_a_deadline_keeps_a_prefix_of_the_sequential_rule_and_leaves_nothing_running():
    cands = plan(12, 4)
    full = sequential(cands, 100, 2)
    running: set[int] = set()

    async def validate(c: Candidate) -> Outcome:
        running.add(c.order)
        try:
            await asyncio.sleep(0.05)
        finally:
            running.discard(c.order)
        task = Task(str(c.order), "swe", "") if accepts(c) else None
        return Outcome(c, "accepted" if task else "no_failure", task=task)

    async def cut() -> list[tuple[int, str]]:
        outcomes = await select_in_order(cands, validate, 100, 2, 1, deadline=time.monotonic() + 0.5)
        return [(o.candidate.order, o.reason) for o in outcomes]

    got = asyncio.run(cut())
    assert 0 < len(got) < len(full) and got == full[: len(got)]
    assert not running  # the candidates in flight at the deadline were cancelled, not left to run


def test_split_is_by_function_and_independent_of_seed_and_kind():
    splits = {function_split("toolz", f"toolz/a.py::f{i}", 0.2) for i in range(200)}
    assert splits == {"train", "validation"}
    assert function_split("toolz", "toolz/a.py::f1", 0.2) == function_split("toolz", "toolz/a.py::f1", 0.2)
    share = sum(function_split("r", f"f{i}", 0.2) == "validation" for i in range(2000)) / 2000
    assert 0.15 < share < 0.25


def test_a_held_out_repository_sends_every_task_to_its_split_and_others_split_by_function():
    toolz = load_recipe().repo("toolz")
    assert toolz.split is None
    functions = [f"toolz/a.py::f{i}" for i in range(200)]
    assert [task_split(toolz, f, 0.2) for f in functions] == [function_split("toolz", f, 0.2) for f in functions]
    for split in ("train", "validation"):
        held = toolz.model_copy(update={"split": split})
        assert {task_split(held, f, 0.2) for f in functions} == {split}


def test_a_second_build_into_the_same_folder_fails_fast_instead_of_racing(tmp_path):
    def no_runner(*_):
        raise AssertionError("a refused build must not start the sandbox")

    with build_lock(tmp_path, wait=False):
        with pytest.raises(BuildError, match="another build is writing"):
            asyncio.run(build_taskset(BuildOptions(out=tmp_path), make_runner=no_runner))
    (tmp_path / "train.jsonl").write_text("")
    report = asyncio.run(build_taskset(BuildOptions(out=tmp_path, if_missing=True), make_runner=no_runner))
    assert report.reused and report.tasks == []
