"""A real executor (SandboxServer over HTTP on 127.0.0.1:0) with real Chromium browsers in bwrap."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from computer_helpers import UID_BASE

from fleet.config.infra import SandboxConfig, SandboxSessionConfig
from services.sandbox.server import SandboxServer

_CANNOT = (shutil.which("bwrap") is None or os.geteuid() != 0
           or not any(shutil.which(c) for c in ("/usr/lib/chromium/chromium", "chromium")))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _CANNOT:
        return
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason="computer sessions need bubblewrap, root and chromium (scripts/setup.sh)")
    for item in items:
        if here in item.path.parents:
            item.add_marker(skip)


@pytest.fixture
def sandbox_cfg(tmp_path: Path) -> SandboxConfig:
    return SandboxConfig(pool_size=1, work_root=str(tmp_path / "work"), uid_base=UID_BASE,
                         sessions=SandboxSessionConfig(max_sessions=4, lease_s=2.0))


@pytest.fixture
async def server(sandbox_cfg: SandboxConfig) -> AsyncIterator[SandboxServer]:
    srv = SandboxServer(sandbox_cfg)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop(0)
