"""The trainer's loops against a real replay buffer, with scored groups submitted through the buffer's gRPC API."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from trainer_harness import load, start_trainer, write_config

from grpofleet.v1 import trainer_pb2, trainer_pb2_grpc
from trainer.metrics import read_jsonl
from trainer.status import PHASES


def _step_records(run: Path) -> list[dict]:  # type: ignore[type-arg]
    return [r for r in read_jsonl(run / "logs" / "metrics.jsonl") if "loss/loss" in r]


def _accounting(stats: dict) -> None:  # type: ignore[type-arg]
    """The buffer's invariant: every enqueued group is sampled, pending, ready, or dead-lettered with a reason."""
    assert stats["enqueued"] == (stats["sampled"] + stats["prompts_pending"] + stats["groups_ready"]
                                 + stats["validation_ready"] + stats["dead_lettered"])


def test_sync_loop_trains_each_step_on_fresh_weights(tmp_path: Path, tiny_model_path: str, replay_buffer,
                                                     fake_rollout) -> None:  # type: ignore[no-untyped-def]
    config = write_config(tmp_path, tiny_model_path, async_on=False, steps=3, grpo__val_period=2,
                          grpo__max_val_samples=3)
    address = replay_buffer(config)
    worker = fake_rollout(address, tiny_model_path)
    trainer = start_trainer(config)
    assert trainer.wait(180) == 0, (tmp_path / "trainer.log").read_text()[-4000:]
    run = tmp_path / "run"
    records = _step_records(run)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(r["age/max"] == 0 and r["data/groups"] == 2 for r in records)  # sync: always on-policy
    epoch = worker.pushes[0][0]
    assert worker.pushes == [(epoch, v) for v in range(4)]  # v0 at start, then v1..v3 after each step
    # Sync: nothing leased for step s+1 before version s+1 was served.
    assert all(version == int(gid.split(":")[1]) // 2 for gid, _, version in worker.leased if gid[0] != "v")
    assert {gid for gid, _, version in worker.leased if gid[0] == "v"} == {"val:2:0", "val:2:1", "val:2:2"}
    trained = [g for r in read_jsonl(run / "logs" / "trained_groups.jsonl") for g in r["groups"]]
    assert sorted(trained) == sorted(f"0:{i}" for i in range(6))
    stats = worker.stats()
    # 6 training groups and 3 validation groups, every one sampled exactly once.
    assert (stats["enqueued"], stats["sampled"], stats["dead_lettered"], stats["uncommitted_groups"]) == (9, 9, 0, 0)
    _accounting(stats)
    final = json.loads((run / "checkpoints" / "step_00000003" / "trainer.json").read_text())
    assert final["step"] == 3 and "weight_version" not in final  # the version is the step
    assert (run / "logs" / "tensorboard").is_dir()
    [val] = [r for r in read_jsonl(run / "logs" / "metrics.jsonl") if "val/accuracy" in r]
    # Logged after step index 1 (2 steps trained): val_period=2.
    assert val["step"] == 1 and val["val/tasks"] == 3 and 0.0 <= val["val/accuracy"] <= 1.0
    assert val["val/verdict/resolved"] + val["val/verdict/tests_failed"] == 3  # the fake's verdicts all ran tests
    assert stats["validation_ready"] == 0


def test_a_spent_time_budget_ends_the_run_with_a_last_validation_round(
        tmp_path: Path, tiny_model_path: str, replay_buffer, fake_rollout) -> None:  # type: ignore[no-untyped-def]
    config = write_config(tmp_path, tiny_model_path, async_on=True, steps=1000, grpo__max_train_s=3.0,
                          grpo__val_period=1000, grpo__max_val_samples=2)
    fake_rollout(replay_buffer(config), tiny_model_path)
    trainer = start_trainer(config)
    assert trainer.wait(180) == 0, (tmp_path / "trainer.log").read_text()[-4000:]
    run = tmp_path / "run"
    done = len(_step_records(run))
    assert 1 <= done < 1000
    assert "the grpo.max_train_s budget is spent" in (tmp_path / "trainer.log").read_text()
    # val_period (1000) was never reached: the one round is the one the budget stop owes, of the final weights.
    [val] = [r for r in read_jsonl(run / "logs" / "metrics.jsonl") if "val/accuracy" in r]
    assert val["step"] == done - 1 and val["val/tasks"] == 2
    [logged] = [json.loads(x) for x in (run / "logs" / "validation_tasks.jsonl").read_text().splitlines()]
    assert logged["step"] == done
    saved = json.loads((run / "checkpoints" / f"step_{done:08d}" / "trainer.json").read_text())
    assert saved["step"] == done


@pytest.mark.slow
def test_sigterm_stops_after_the_step_with_a_checkpoint(tmp_path: Path, tiny_model_path: str, replay_buffer,
                                                        fake_rollout) -> None:  # type: ignore[no-untyped-def]
    import signal
    import time

    config = write_config(tmp_path, tiny_model_path, async_on=True, steps=100)
    fake_rollout(replay_buffer(config), tiny_model_path)
    trainer = start_trainer(config)
    run = tmp_path / "run"
    while not _step_records(run):
        assert trainer.poll() is None, (tmp_path / "trainer.log").read_text()[-3000:]
        time.sleep(0.05)
    trainer.send_signal(signal.SIGTERM)
    assert trainer.wait(120) == 0
    done = len(_step_records(run))
    saved = json.loads((run / "checkpoints" / f"step_{done:08d}" / "trainer.json").read_text())
    assert saved["step"] == done and done < 100


def test_async_loop_runs_ahead_within_the_age_bound_and_skips_stragglers(
        tmp_path: Path, tiny_model_path: str, replay_buffer, fake_rollout) -> None:  # type: ignore[no-untyped-def]
    config = write_config(tmp_path, tiny_model_path, async_on=True, steps=4)
    address = replay_buffer(config)
    # Group 0:1 (meant for step 0) takes 25 s: the trainer must fill step 0 with other groups, not wait for it.
    worker = fake_rollout(address, tiny_model_path, slow_groups={"0:1": 25.0})
    trainer = start_trainer(config)
    status = _poll_status(load(config)["services"]["trainer"]["port"], trainer)
    assert trainer.wait(240) == 0, (tmp_path / "trainer.log").read_text()[-4000:]
    run = tmp_path / "run"
    records = _step_records(run)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert all(r["age/max"] <= 2 and r["age/min"] >= 0 for r in records)
    assert max(r["age/max"] for r in records) >= 1  # rollouts ran ahead of training
    assert all(r["timing/wait_data_s"] < 20 for r in records)  # the straggler held no step, not even the last
    steps_of = {g: r["step"] for r in read_jsonl(run / "logs" / "trained_groups.jsonl") for g in r["groups"]}
    assert "0:1" not in steps_of or steps_of["0:1"] > 0
    for key in ("loss/sampling_importance_ratio", "loss/is_ratio_min", "loss/is_ratio_max",
                "loss/token_mult_prob_error", "loss/is_oob_ratio", "weights/push_s", "timing/push_wait_s",
                "perf/tokens_per_s"):
        assert any(key in r for r in records), key
    stats = worker.stats()
    _accounting(stats)
    assert stats["sampled"] == 8 and stats["uncommitted_groups"] == 0
    assert status and status <= set(PHASES)  # GetStatus answered while the trainer ran


def _poll_status(port: int, trainer) -> set[str]:  # type: ignore[no-untyped-def]
    """Phases seen through grpofleet.v1.Trainer/GetStatus while the trainer runs."""
    import time

    seen: set[str] = set()
    # The trainer's server comes up only after torch and the model load: without a short reconnect backoff the
    # channel's exponential backoff (up to minutes) can sleep through a whole short run on a loaded machine.
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.initial_reconnect_backoff_ms", 200),
                                                                   ("grpc.max_reconnect_backoff_ms", 500)])
    stub = trainer_pb2_grpc.TrainerStub(channel)
    deadline = time.monotonic() + 120
    while trainer.poll() is None and time.monotonic() < deadline and len(seen) < 3:
        try:
            r = stub.GetStatus(trainer_pb2.TrainerStatusRequest(), timeout=10, wait_for_ready=True)
            seen.add(r.phase)
            assert r.async_mode and r.max_steps == 4
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    channel.close()
    return seen
