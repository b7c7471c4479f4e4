"""`sandbox.runtime: docker`: the same image tasks through a real Docker engine (started here if none runs)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from image_helpers import ImageSet

from fleet.config.infra import SandboxConfig
from services.sandbox.executor import Executor

ROOT = Path(__file__).resolve().parents[3]
ENGINE = ROOT / "scripts" / "docker-engine.sh"
pytestmark = pytest.mark.slow


def _answers() -> bool:
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "info"], capture_output=True, timeout=30).returncode == 0


@pytest.fixture(scope="module")
def docker_engine() -> Iterator[None]:
    """An engine for this module: one that runs already is used and left running; one started here is stopped."""
    if _answers():
        yield
        return
    if not ENGINE.is_file() or shutil.which("dockerd") is None:
        pytest.skip("no Docker engine and no scripts/docker-engine.sh to start one")
    subprocess.run(["bash", str(ENGINE), "start"], check=True, timeout=300)
    try:
        yield
    finally:
        subprocess.run(["bash", str(ENGINE), "stop"], check=False, timeout=120)


@pytest.fixture
def docker_cfg(image_cfg: SandboxConfig) -> SandboxConfig:
    return image_cfg.model_copy(update={"runtime": "docker"})


async def test_gold_full_and_empty_no_in_docker(docker_engine: None, images: ImageSet,
                                                docker_cfg: SandboxConfig) -> None:
    async with Executor(docker_cfg) as ex:
        assert ex.images is not None, ex.image_error
        gold = await ex.run(images.spec(images.repo.gold))
        empty = await ex.run(images.spec(""))
        missing = await ex.run(images.spec("", image="swe/no-such-image:v1"))
    assert (gold.status, gold.resolution, gold.exit_code) == ("completed", "FULL", 0), gold.error
    assert (empty.status, empty.resolution) == ("completed", "NO"), empty.error
    assert missing.status == "infra_error" and "swe/no-such-image:v1" in missing.error


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True, text=True, timeout=300).stdout.strip()


async def test_restart_removes_containers_of_a_killed_executor(docker_engine: None, images: ImageSet,
                                                               docker_cfg: SandboxConfig) -> None:
    ref = f"{images.registry}/{images.image}"
    await asyncio.to_thread(_docker, "pull", "-q", ref)
    made = await asyncio.to_thread(_docker, "create", "--label", "grpo-fleet.sandbox=1", "--label",
                                   "grpo-fleet.owner=deadbeef", ref, "sleep", "infinity")
    async with Executor(docker_cfg) as ex:
        assert ex.images is not None
        left = await asyncio.to_thread(_docker, "ps", "-aq", "--no-trunc", "--filter",
                                       "label=grpo-fleet.owner=deadbeef")
    assert made not in left.split()
