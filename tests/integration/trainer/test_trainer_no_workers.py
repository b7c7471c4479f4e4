"""No silent idling: a trainer whose rollout fleet is gone stops after services.no_worker_timeout_s with one line that
names the rollout fleet and what the worker registry saw last, instead of waiting out grpo.sample_timeout_s."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from trainer_harness import FakeRollout, start_trainer, write_config

from trainer.metrics import read_jsonl


def _stopping_line(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if "stopping at step" in ln]
    assert lines, log.read_text(errors="replace")[-4000:]
    return lines[-1]


def test_a_trainer_whose_workers_died_stops_after_no_worker_timeout(
        tmp_path: Path, tiny_model_path: str, replay_buffer: Any) -> None:
    # grpo.sample_timeout_s stays at 120 s: a trainer that only knew that bound would still be waiting at the end.
    config = write_config(tmp_path, tiny_model_path, async_on=False, steps=50, services__no_worker_timeout_s=4.0,
                          replay_buffer__worker_timeout_s=2.0)
    worker = FakeRollout(replay_buffer(config), tiny_model_path, worker_id="w-gone").start()
    trainer = start_trainer(config)
    run = tmp_path / "run"
    deadline = time.monotonic() + 120
    try:
        while not [r for r in read_jsonl(run / "logs" / "metrics.jsonl") if "loss/loss" in r]:
            assert trainer.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "trainer.log").read_text()[-3000:]
            time.sleep(0.1)
    finally:
        worker.stop()  # the whole rollout fleet goes away
    gone = time.monotonic()
    assert trainer.wait(60) == 1, (tmp_path / "trainer.log").read_text()[-3000:]
    waited = time.monotonic() - gone
    line = _stopping_line(tmp_path / "trainer.log")
    assert "no live rollout worker for" in line and "services.no_worker_timeout_s=4" in line, line
    assert "w-gone" in line, line  # what the registry saw last
    # The worker counts as dead 2 s after its last heartbeat, then 4 s without one: not the 120 s sample timeout.
    assert 5.0 <= waited < 40.0, (waited, line)


def test_a_trainer_that_never_sees_a_worker_says_none_registered(
        tmp_path: Path, tiny_model_path: str, replay_buffer: Any) -> None:
    config = write_config(tmp_path, tiny_model_path, async_on=False, steps=2, services__no_worker_timeout_s=3.0)
    replay_buffer(config)
    trainer = start_trainer(config)
    assert trainer.wait(120) == 1, (tmp_path / "trainer.log").read_text()[-3000:]
    line = _stopping_line(tmp_path / "trainer.log")
    assert "no rollout worker ever registered" in line and "services.no_worker_timeout_s=3" in line, line
