"""End-to-end fixtures: a small real task slice built once per session, and a helper that runs `grpo-fleet up`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def task_slice(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One repository, a few validated bugs (real sdist, real sandbox)."""
    out = tmp_path_factory.mktemp("tasks")
    proc = subprocess.run([sys.executable, "-m", "launch.cli", "data", "build", "--out", str(out), "--repos", "toolz",
                           "--max-per-repo", "6"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "train.jsonl").exists()
    return out
