"""`grpo-fleet up` gives its processes one folder for vLLM's sockets, unless the user chose one."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from launch.supervisor import Supervisor
from launch.topology import ProcessSpec
from launch.up import vllm_ipc_folder

# What a vLLM process does with the variable: a socket named <base>/<uuid>.
BIND = ("import os, socket, uuid; s = socket.socket(socket.AF_UNIX); "
        "s.bind(os.path.join(os.environ['VLLM_RPC_BASE_PATH'], str(uuid.uuid4())))")


def test_every_process_gets_the_same_fresh_short_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    specs = [ProcessSpec("rollout-0", "rollout", ["x"]), ProcessSpec("trainer", "trainer", ["y"])]
    folder = vllm_ipc_folder(specs, {})
    assert folder is not None and Path(folder).is_dir() and Path(folder).parent == tmp_path
    assert Path(folder).name.startswith("grpo-fleet-ipc-")
    assert {s.env["VLLM_RPC_BASE_PATH"] for s in specs} == {folder}


def test_a_folder_the_user_chose_is_kept() -> None:
    specs = [ProcessSpec("rollout-0", "rollout", ["x"])]
    assert vllm_ipc_folder(specs, {"VLLM_RPC_BASE_PATH": "/run/mine"}) is None
    assert "VLLM_RPC_BASE_PATH" not in specs[0].env  # inherited from the launcher's environment as it is


@pytest.fixture
def short_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temp folder as short as the system's: pytest's tmp_path is too long for a socket's path (107 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="ipc-test-"))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_supervised_process_binds_its_sockets_in_the_fleets_folder(tmp_path: Path, short_tmp: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    spec = ProcessSpec("rollout-0", "rollout", [sys.executable, "-c", BIND], restartable=False)
    folder = vllm_ipc_folder([spec], {})
    assert folder is not None

    async def run() -> None:
        sup = Supervisor([spec], tmp_path / "logs", cwd=tmp_path, max_restarts=0)
        await sup.start_all()
        await asyncio.wait_for(sup.procs["rollout-0"].wait(), 30)
        await sup.stop_all(grace_s=5)

    asyncio.run(run())
    assert len(list(Path(folder).iterdir())) == 1
