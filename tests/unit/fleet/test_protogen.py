"""Generated gRPC code is built from protos/, never committed, and a stale build is detected."""

import subprocess
import sys
from pathlib import Path

from fleet import protogen

ROOT = Path(__file__).resolve().parents[3]


def test_generated_code_matches_protos() -> None:
    assert not protogen.is_stale(), "run `python -m fleet.protogen`: grpofleet/ is older than protos/"


def test_check_command_fails_when_sources_change(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    stamp = tmp_path / "SOURCES_SHA256"
    stamp.write_text(protogen.sources_digest())
    monkeypatch.setattr(protogen, "STAMP", stamp)
    assert not protogen.is_stale()
    stamp.write_text("0" * 64)
    assert protogen.is_stale()


def test_generated_code_is_not_tracked_by_git() -> None:
    tracked = subprocess.run(["git", "ls-files", "grpofleet"], cwd=ROOT, capture_output=True, text=True).stdout
    assert tracked.strip() == ""


def test_every_service_is_generated() -> None:
    out = subprocess.run([sys.executable, "-c", "from grpofleet.v1 import replay_buffer_pb2_grpc as r, "
                          "rollout_worker_pb2_grpc as w, trainer_pb2_grpc as t; "
                          "print(r.ReplayBufferStub, w.RolloutWorkerStub, t.TrainerStub)"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
