"""The seed's launch line: config validated first (fast, before any model), then the fleet must answer."""

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LINE = [sys.executable, "examples/run_grpo_swe.py", "--config", "examples/configs/grpo_swe.yaml",
        "cluster.gpus_per_node=8", "cluster.num_nodes=4", "policy.model_name=Qwen/Qwen2.5-7B-Instruct"]


def test_launch_line_validates_config_then_asks_for_the_fleet() -> None:
    proc = subprocess.run([*LINE, "services.replay_buffer.port=1"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    assert "[1/7] config OK" in proc.stdout
    assert "does not answer: start the fleet first" in proc.stderr


def test_launch_line_rejects_a_bad_config_before_loading_anything() -> None:
    t0 = time.monotonic()
    proc = subprocess.run([*LINE, "loss_fn.use_importance_sampling_correction=false"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "loss_fn.use_importance_sampling_correction=true" in proc.stderr
    assert "[2/7]" not in proc.stdout
    assert time.monotonic() - t0 < 20
