"""`grpo-fleet serve NAME` hands the rest of the line to that service's own `main(argv)`, which validates the config
before anything starts: a bad key exits 2 naming it, for every service, without importing torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launch.cli import SERVICES, main, service_main

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", SERVICES)
def test_each_service_main_rejects_a_bad_key_with_exit_status_2(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert service_main(name)(["sandbox.pool_size=0"]) == 2
    assert "sandbox.pool_size" in capsys.readouterr().err


def test_serve_dispatches_to_the_service_main(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "replay-buffer", "--config", "examples/configs/grpo_swe_tiny.yaml", "nosuch.key=1"]) == 2
    assert "nosuch" in capsys.readouterr().err


def test_a_service_help_answers_before_torch_is_imported() -> None:
    code = ("import sys; from launch.cli import main\ntry:\n    main(['serve', 'rollout', '--help'])\n"
            "except SystemExit:\n    pass\nassert 'torch' not in sys.modules and 'vllm' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--config" in proc.stdout


def test_the_replay_buffer_service_never_imports_torch() -> None:
    # It holds no tensors; importing torch only made a SIGKILLed buffer come back seconds later (4-13 s of a loaded
    # 2-core box, which every client waited out as an outage).
    code = ("import sys; import services.replay_buffer.server, services.replay_buffer.servicer\n"
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
