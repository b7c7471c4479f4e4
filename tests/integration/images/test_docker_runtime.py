"""`sandbox.runtime: docker`: the same image tasks through a real Docker engine (started here if none runs)."""

from __future__ import annotations

import asyncio
import subprocess

import pytest
from image_helpers import ImageSet

from fleet.config.infra import SandboxConfig
from services.sandbox.executor import Executor

pytestmark = pytest.mark.slow


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
