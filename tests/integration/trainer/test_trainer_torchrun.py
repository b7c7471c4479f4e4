"""torchrun with two gloo ranks (FSDP2 on CPU) against real services, resuming a one-process run's checkpoint:
checkpoints are portable across world sizes, and rank 0 alone talks to the fleet."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_harness import ROOT, child_env, start_trainer, write_config

from trainer.metrics import read_jsonl


@pytest.mark.slow
def test_two_rank_torchrun_resumes_a_one_process_checkpoint(tmp_path: Path, tiny_model_path: str, replay_buffer,
                                                            fake_rollout) -> None:  # type: ignore[no-untyped-def]
    config = write_config(tmp_path, tiny_model_path, async_on=False, steps=2)
    worker = fake_rollout(replay_buffer(config), tiny_model_path)
    assert start_trainer(config).wait(180) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    with open(tmp_path / "trainer.log", "ab") as log:
        rc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                             str(ROOT / "trainer" / "main.py"), "--config", str(config), "grpo.max_num_steps=4"],
                            cwd=ROOT, env=child_env(), stdout=log, stderr=subprocess.STDOUT, timeout=240).returncode
    assert rc == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    run = tmp_path / "run"
    final = json.loads((run / "checkpoints" / "step_00000004" / "trainer.json").read_text())
    assert (final["step"], final["world_size"]) == (4, 2)
    assert [(e, v) for e, v in worker.pushes] == [(1, 0), (1, 1), (1, 2), (2, 2), (2, 3), (2, 4)]
    steps = [r["step"] for r in read_jsonl(run / "logs" / "metrics.jsonl") if "loss/loss" in r]
    assert steps == [0, 1, 2, 3]  # one line per step: rank 1 logs nothing
    trained = [g for r in read_jsonl(run / "logs" / "trained_groups.jsonl") for g in r["groups"]]
    assert sorted(trained, key=lambda g: int(g.split(":")[1])) == [f"0:{i}" for i in range(8)]
