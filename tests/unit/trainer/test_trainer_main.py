"""`trainer/main.py` rejects a config it cannot honour before torch (let alone the model) is imported."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MAIN = ROOT / "trainer" / "main.py"


def _run(*overrides: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    # -X importtime lists every module imported, on stderr: proof that torch never loaded.
    proc = subprocess.run([sys.executable, "-X", "importtime", str(MAIN), *overrides], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})}, cwd=ROOT)
    return proc, time.monotonic() - t0


def _imported(stderr: str) -> set[str]:
    return {line.split("|")[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def test_async_without_importance_sampling_is_rejected_before_torch_loads() -> None:
    proc, seconds = _run("policy.model_name=/nonexistent/model", "grpo.async_grpo.enabled=true",
                         "loss_fn.use_importance_sampling_correction=false")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "grpo.async_grpo.enabled=true requires loss_fn.use_importance_sampling_correction=true" in proc.stderr
    assert seconds < 3.0
    modules = _imported(proc.stderr)
    assert "fleet.config" in modules and "torch" not in modules and "transformers" not in modules


def test_batch_not_divisible_by_world_size_is_rejected_before_torch_loads() -> None:
    proc, seconds = _run("policy.train_global_batch_size=16", env={"WORLD_SIZE": "3", "RANK": "0"})
    assert proc.returncode == 2
    assert "policy.train_global_batch_size (16) must be a multiple of the number of trainer processes (3" in \
        proc.stderr
    assert seconds < 3.0 and "torch" not in _imported(proc.stderr)


def test_misspelled_override_names_the_closest_key() -> None:
    proc, _ = _run("grpo.async_grpo.max_trajectory_age=2")
    assert proc.returncode == 2
    assert "did you mean 'grpo.async_grpo.max_trajectory_age_steps'" in proc.stderr


def test_a_missing_task_set_fails_naming_the_commands_that_build_it(tmp_path: Path) -> None:
    # The trainer never builds a task set (that runs the sandbox executor: the launch floor's job).
    proc = subprocess.run([sys.executable, str(MAIN), "--config", str(ROOT / "examples/configs/grpo_swe_tiny.yaml"),
                           f"data.train.data_path={tmp_path / 'none'}", f"run.dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "trainer: no training tasks" in proc.stderr and "grpo-fleet prepare --config" in proc.stderr
    assert "grpo-fleet data build" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "none" / "train.jsonl").exists()
