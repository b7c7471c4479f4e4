"""Kill the trainer with SIGKILL between two checkpoints, start the same command again: it resumes from the last
checkpoint, re-syncs the workers' weights before any lease, and step, weight version and prompt accounting are exact.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from trainer_harness import start_trainer, write_config

from trainer.metrics import read_jsonl

STEPS = 6


def _wait_for_step(run: Path, step: int, proc, timeout: float = 180.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r.get("step") == step and "loss/loss" in r for r in read_jsonl(run / "logs" / "metrics.jsonl")):
            return
        assert proc.poll() is None, "trainer exited early"
        time.sleep(0.02)
    raise TimeoutError(f"step {step} never finished")


@pytest.mark.slow
@pytest.mark.parametrize("async_on", [True, False], ids=["async", "sync"])
def test_sigkill_mid_run_then_resume_is_exact(tmp_path: Path, tiny_model_path: str, replay_buffer, fake_rollout,
                                              async_on: bool) -> None:  # type: ignore[no-untyped-def]
    config = write_config(tmp_path, tiny_model_path, async_on=async_on, steps=STEPS)
    worker = fake_rollout(replay_buffer(config), tiny_model_path, delay_s=0.4)
    run = tmp_path / "run"
    first = start_trainer(config)
    _wait_for_step(run, 2, first)  # steps 0-2 trained; the checkpoint holds steps 0-1 (save_period 2)
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    checkpoints = sorted(p.name for p in (run / "checkpoints").glob("step_*"))
    assert checkpoints and checkpoints[-1] == "step_00000002", checkpoints
    pushes_before = len(worker.pushes)

    second = start_trainer(config)
    assert second.wait(240) == 0, (tmp_path / "trainer.log").read_text()[-4000:]

    final = json.loads((run / "checkpoints" / f"step_{STEPS:08d}" / "trainer.json").read_text())
    assert (final["step"], final["epoch"]) == (STEPS, 2)
    # Weights: the resumed run's first push is the checkpoint's version in the new epoch, and every lease granted
    # in epoch 2 came after it (the buffer refuses leases to workers without this epoch's weights).
    assert worker.pushes[pushes_before] == (2, 2)
    assert all(version >= 2 for _, epoch, version in worker.leased if epoch == 2)
    assert not any(epoch == 1 for _, epoch, _ in worker.leased[_first_epoch2_lease(worker):])
    # Prompts: per step, the record of the run that the final model descends from; each group trained exactly once.
    latest: dict[int, dict] = {}  # type: ignore[type-arg]
    for rec in read_jsonl(run / "logs" / "trained_groups.jsonl"):
        latest[rec["step"]] = rec
    assert sorted(latest) == list(range(STEPS))
    assert all(latest[s]["epoch"] == 1 for s in (0, 1)) and all(latest[s]["epoch"] == 2 for s in range(2, STEPS))
    trained = [g for s in range(STEPS) for g in latest[s]["groups"]]
    assert len(trained) == len(set(trained)) == 2 * STEPS
    stats = worker.stats()
    assert stats["sampled"] == 2 * STEPS and stats["uncommitted_groups"] == 0
    assert stats["returned_on_resume"] >= 2  # what the killed run trained after its checkpoint came back
    assert stats["enqueued"] == (stats["sampled"] + stats["prompts_pending"] + stats["groups_ready"]
                                 + stats["validation_ready"] + stats["dead_lettered"])
    # Every enqueued prompt is a distinct stream position: none skipped between 0 and the last one.
    positions = sorted(int(g.split(":")[1]) + 40 * int(g.split(":")[0]) for g in set(trained))
    assert positions[0] == 0
    assert set(positions) <= set(range(stats["enqueued"]))
    records = [r for r in read_jsonl(run / "logs" / "metrics.jsonl") if "loss/loss" in r]
    assert all(0 <= r["age/min"] and r["age/max"] <= (2 if async_on else 0) for r in records)


def _first_epoch2_lease(worker) -> int:  # type: ignore[no-untyped-def]
    return next(i for i, (_, epoch, _) in enumerate(worker.leased) if epoch == 2)
