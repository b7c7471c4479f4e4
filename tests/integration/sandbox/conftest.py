"""Real executors (bwrap sandboxes) and real HTTP servers on 127.0.0.1:0 over a small real git repository."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sandbox_helpers import UID_BASE, CalcRepo, make_calc_repo

from fleet.config.infra import SandboxConfig
from services.sandbox.executor import Executor
from services.sandbox.server import SandboxServer

_CANNOT_SANDBOX = shutil.which("bwrap") is None or os.geteuid() != 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _CANNOT_SANDBOX:
        return
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason="the sandbox tests need bubblewrap and root (one uid per pool slot)")
    for item in items:
        if here in item.path.parents:
            item.add_marker(skip)


@pytest.fixture
def calc_repo(tmp_path: Path) -> CalcRepo:
    return make_calc_repo(tmp_path / "calc")


@pytest.fixture
def sandbox_cfg(tmp_path: Path) -> SandboxConfig:
    return SandboxConfig(pool_size=2, work_root=str(tmp_path / "work"), memory_mb=1024, cpu_s=60, max_processes=64,
                         max_output_kb=64, uid_base=UID_BASE, result_ttl_s=600)


@pytest.fixture
async def executor(sandbox_cfg: SandboxConfig) -> AsyncIterator[Executor]:
    async with Executor(sandbox_cfg) as ex:
        yield ex


@pytest.fixture
async def server(sandbox_cfg: SandboxConfig) -> AsyncIterator[SandboxServer]:
    srv = SandboxServer(sandbox_cfg)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop(0)
