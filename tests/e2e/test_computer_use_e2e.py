"""The whole fleet on the computer-use path on CPU -- the tiny Qwen2-VL, real vLLM serving screenshots, real
Chromium in the sandbox executor, real Redis -- through `grpo-fleet up`, asynchronous with in-flight weight pushes
of the whole VLM. Every group is accounted for, screenshots reach the trainer inline (64 tokens each for 224x224),
and the loss counts exactly the generated tokens: image and other observation tokens never."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from fleet_helpers import ROOT, metrics
from test_fleet_e2e import _accounting, _steps

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.vllm,
              pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0 or shutil.which("chromium") is None,
                                 reason="computer sessions need bubblewrap, root and chromium (scripts/setup.sh)")]


def _ipc_leftovers() -> set[str]:
    """vLLM's sockets in the temp folder (`<uuid>`, its default base) and the launchers' folders for them."""
    tmp = Path(tempfile.gettempdir())
    uuid = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
    return {p.name for p in tmp.iterdir() if uuid.fullmatch(p.name) or p.name.startswith("grpo-fleet-ipc-")}


def test_computer_use_fleet_trains_on_screenshots_with_in_flight_pushes(tmp_path: Path) -> None:
    run_dir = tmp_path / "cu"
    # One action (two turns): an episode is still screenshot | generated | observation | generated, so the loss check
    # below meets image and observation tokens between generated ones. The trainer's steps cost in proportion to
    # the tokens, and the random policy spends every action it is given (turns 4 -> 2, ~1,480 -> ~1,230 per sample).
    cmd = [sys.executable, "-m", "launch.cli", "up", "--config", "examples/configs/grpo_computer_use_tiny.yaml",
           f"run.dir={run_dir}", "grpo.max_num_steps=3", "logger.tensorboard_enabled=false",
           "checkpointing.save_period=10", "env.computer_use.max_actions=1"]
    # As a user runs it: without the test session's folder for vLLM's sockets, so the launcher makes its own.
    env = {k: v for k, v in os.environ.items() if k != "VLLM_RPC_BASE_PATH"}
    before = _ipc_leftovers()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert _ipc_leftovers() <= before, "vLLM's sockets (or the launcher's folder for them) outlived the fleet"
    out = proc.stdout + proc.stderr
    for hazard in ("image placeholder runs", "Encoder cache miss", "EngineDeadError"):  # met while building it
        assert hazard not in out, out[-6000:]
    assert _steps(run_dir) == [0, 1, 2]
    assert _accounting(run_dir).get("sampled", 0) == 3 * 2
    rows = [r for r in metrics(run_dir) if "agent/episodes" in r]
    assert len(rows) == 3, "every step trained on computer-use episodes"
    for r in rows:
        assert r["agent/episodes"] == 8 and r["agent/turns_mean"] >= 1
        # One minibatch per step: the loss counts exactly the generated tokens, never screenshots or other
        # observation tokens.
        assert r["loss/valid_tokens"] == pytest.approx(r["agent/generated_tokens_mean"] * r["agent/episodes"])
        assert r["vision/images"] >= r["agent/episodes"], "every episode carries at least its first screenshot"
        assert r["vision/image_tokens"] == 64 * r["vision/images"]
        assert r["agent/observation_tokens_mean"] * r["agent/episodes"] >= r["vision/image_tokens"]
    pushes = [r for r in metrics(run_dir) if r.get("weights/workers_ok", 0) >= 1]
    assert len(pushes) >= 2 and all(r["weights/workers_failed"] == 0 for r in pushes), "in-flight VLM pushes"
    assert max(r["age/max"] for r in metrics(run_dir) if "age/max" in r) <= 2
    print("computer-use e2e:", json.dumps([{k: v for k, v in r.items() if k.startswith(("agent/", "vision/",
                                                                                        "loss/valid"))}
                                           for r in rows]))
