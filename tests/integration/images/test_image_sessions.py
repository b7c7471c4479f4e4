"""Sessions in a task's instance image (bwrap-image, and docker when an engine answers), over the real HTTP server:
commands run in the image's /testbed at base_commit with later commits scrubbed, files read and written there,
finish grades the diff in a fresh environment like a submitted patch (test files dropped, recorded), and the
environment (run layer or container) goes with the session: on finish, on a command timeout it survives, and when
its owner stops renewing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from image_helpers import ImageSet
from sandbox_helpers import FIXED

from fleet.config.infra import SandboxConfig, SandboxSessionConfig
from sandbox_client.sessions import SessionClient
from services.sandbox.server import SandboxServer


@pytest.fixture(params=["bwrap-image", pytest.param("docker", marks=pytest.mark.slow)])
async def srv(request: pytest.FixtureRequest, image_cfg: SandboxConfig) -> AsyncIterator[SandboxServer]:
    if request.param == "docker":
        request.getfixturevalue("docker_engine")  # started here if none runs, stopped after the module
    sessions = SandboxSessionConfig(max_sessions=2, lease_s=3.0, exec_timeout_s=20)
    server = SandboxServer(image_cfg.model_copy(update={"runtime": request.param, "sessions": sessions}))
    await server.start()
    try:
        yield server
    finally:
        await server.stop(0)


@pytest.fixture
async def client(srv: SandboxServer) -> AsyncIterator[SessionClient]:
    c = SessionClient([f"http://127.0.0.1:{srv.port}"], owner="worker-a", max_retries=1, backoff_s=0.05)
    try:
        yield c
    finally:
        await c.close()


def _live_envs(srv: SandboxServer) -> int:
    """Run layers (bwrap-image) or containers (docker) the executor holds now."""
    images = srv.executor.images
    assert images is not None, srv.executor.image_error
    runtime = images.runtime
    if runtime.name == "docker":
        return int(runtime.health()["containers"])  # type: ignore[call-overload]
    own: Path = runtime.layers.own  # type: ignore[attr-defined]
    return len(list(own.iterdir())) if own.exists() else 0


async def test_image_session_works_in_the_image_and_finish_grades_like_a_patch(
        srv: SandboxServer, client: SessionClient, images: ImageSet) -> None:
    session = await client.open(images.spec(""))
    assert _live_envs(srv) == 1
    look = await session.exec("pwd; grep -c 'return a - b' calc/core.py; test -f /etc/debian_version && echo debian")
    assert look.exit_code == 0 and look.stdout.split() == ["/testbed", "1", "debian"], look
    text, truncated = await session.read_file("calc/core.py")
    assert "return a - b" in text and not truncated
    await session.write_file("calc/core.py", FIXED)
    await session.write_file("tests/test_repro.py", "from calc import mul\n\n\ndef test_repro():\n"
                                                    "    assert mul(2, 3) == 6\n")
    check = await session.exec("python3 -m pytest -q -p no:cacheprovider tests/test_repro.py")
    assert check.exit_code == 0, check.stdout + check.stderr
    slow = await session.exec("sleep 30", limit_s=1.0)
    assert slow.timed_out and (await session.exec("echo still-here")).stdout.strip() == "still-here"
    verdict, patch = await session.finish()
    assert verdict.status == "completed" and verdict.resolution == "FULL", verdict.error + verdict.stdout_tail[-1500:]
    assert "calc/core.py" in patch and "test_repro" not in patch and "tests/test_repro.py" in verdict.error
    assert srv.sessions.sessions == {} and _live_envs(srv) == 0


async def test_image_session_hides_later_commits_and_goes_with_its_owner(srv: SandboxServer, images: ImageSet) -> None:
    url = f"http://127.0.0.1:{srv.port}"
    body = {"owner": "dead-worker", **{k: v for k, v in images.spec("", image=images.future_image).to_json().items()
                                      if k not in ("patch", "reference_patch")}}
    async with aiohttp.ClientSession() as http:  # an owner that never renews: a killed rollout worker
        async with http.post(f"{url}/session", json=body) as resp:
            opened = await resp.json()
        sid, key = opened["session_id"], {"X-Session-Key": opened["session_key"]}
        command = (f"git -c safe.directory='*' cat-file -e {images.future_commit} && echo LEAK; "
                   "git -c safe.directory='*' log --all --format=%s | grep -c 'THE FIX'")
        async with http.post(f"{url}/session/{sid}/exec", json={"command": command}, headers=key) as resp:
            probe = await resp.json()
        assert "LEAK" not in probe["stdout"] and probe["stdout"].strip() == "0", probe
        for _ in range(300):
            if sid not in srv.sessions.sessions:
                break
            await asyncio.sleep(0.1)
        async with http.post(f"{url}/session/{sid}/exec", json={"command": "true"}, headers=key) as resp:
            assert resp.status == 404 and (await resp.json())["reason"] == "owner_lost"
    for _ in range(100):  # the session is unlisted first, then its environment removed
        if _live_envs(srv) == 0:
            break
        await asyncio.sleep(0.1)
    assert _live_envs(srv) == 0
