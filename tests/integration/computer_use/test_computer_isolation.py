"""What a session's browser can reach: no network (not even the executor's port on the host's loopback), none of
the host's files outside `sandbox.visible_paths` (the repository and its task set included), and nothing left
running once its executor stops or dies."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest
from computer_helpers import UID, button_task, payload, sandbox_pids

from fleet.config.infra import SandboxConfig
from services.sandbox.computer.renderer import Renderer, find_chromium
from services.sandbox.computer.sessions import renderer_spec
from services.sandbox.computer.task import task_from_json
from services.sandbox.server import SandboxServer

ROOT = Path(__file__).resolve().parents[3]


async def _navigate(r: Renderer, url: str) -> str:
    nav = await r.call("Page.navigate", {"url": url}, limit_s=30)
    return str(nav.get("errorText", ""))


async def test_the_renderer_has_no_network_and_sees_no_host_file_outside_the_system(
        server: SandboxServer, sandbox_cfg: SandboxConfig) -> None:
    spec = renderer_spec(sandbox_cfg, task_from_json(payload(button_task())), "isolation", UID,
                         {"prlimit": "prlimit", "bwrap": "bwrap", "setpriv": "setpriv"})
    r = await Renderer.launch(spec, chromium=find_chromium())
    try:
        assert await _navigate(r, "file:///etc/os-release") == "", "the read-only system is visible"
        assert (ROOT / "pyproject.toml").exists()
        assert await _navigate(r, f"file://{ROOT}/pyproject.toml") == "net::ERR_FILE_NOT_FOUND"
        assert await _navigate(r, f"file://{ROOT}/envs/computer_use/tasks.py") == "net::ERR_FILE_NOT_FOUND"
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{server.port}/healthz") as resp:
            assert resp.status == 200, "the executor answers on the host's loopback"
        error = await _navigate(r, f"http://127.0.0.1:{server.port}/healthz")
        assert error.startswith("net::ERR_"), "but not to the browser"
    finally:
        await r.close()


def long_lease(cfg: SandboxConfig) -> SandboxConfig:
    """The fixture's 2 s lease is for the reaping tests: an owner that never renews loses its session 2 s after
    opening it. Here the sessions must outlive their opening, however slowly a loaded host starts a browser (a CI run
    lost the first of two sessions to `owner_lost` while the second one started)."""
    return cfg.model_copy(update={"sessions": cfg.sessions.model_copy(update={"lease_s": 600.0})})


async def test_stopping_the_executor_kills_every_browser(sandbox_cfg: SandboxConfig) -> None:
    srv = SandboxServer(long_lease(sandbox_cfg))
    await srv.start()
    try:
        async with aiohttp.ClientSession() as http:
            sids = []
            for i in range(2):
                async with http.post(f"http://127.0.0.1:{srv.port}/computer/sessions",
                                     json={"owner": "w", "task": payload(button_task(i))}) as resp:
                    sids.append((await resp.json())["session_id"])
        assert all(sandbox_pids(s) for s in sids)
    finally:
        await srv.stop(0)
    assert [p for s in sids for p in sandbox_pids(s)] == []


_SERVE = """
import asyncio, sys
from fleet.config.infra import SandboxConfig
from services.sandbox.server import SandboxServer
async def main():
    srv = SandboxServer(SandboxConfig.model_validate_json(sys.argv[1]))
    await srv.start()
    print(srv.port, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


@pytest.mark.slow
async def test_a_killed_executor_leaves_no_browser_behind(sandbox_cfg: SandboxConfig) -> None:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _SERVE, long_lease(sandbox_cfg).model_dump_json(),
                                                cwd=ROOT, stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        port = int(await asyncio.wait_for(proc.stdout.readline(), 120))
        async with aiohttp.ClientSession() as http, http.post(
                f"http://127.0.0.1:{port}/computer/sessions", json={"owner": "w", "task": payload(button_task())}) as r:
            sid = (await r.json())["session_id"]
        assert sandbox_pids(sid)
        os.kill(proc.pid, signal.SIGKILL)  # no cleanup runs: bwrap's --die-with-parent must do it
        await asyncio.wait_for(proc.wait(), 30)
        for _ in range(200):
            if not sandbox_pids(sid):
                break
            await asyncio.sleep(0.05)
        assert sandbox_pids(sid) == []
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
