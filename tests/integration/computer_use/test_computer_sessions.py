"""Computer sessions on a real executor over HTTP with real Chromium: screenshots, actions, verdicts, rejected
actions, and renderer failures that are infrastructure failures, never failed episodes."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import aiohttp
import pytest
from computer_helpers import UID_BASE, browser_pid, button_task, click_on, payload, png_size, sandbox_pids, uid_of

from envs.computer_use.actions import Click, Done, Key
from sandbox_client.computer import ActionRejected, ComputerClient
from sandbox_client.sessions import SessionUnavailable
from services.sandbox.server import SandboxServer


@pytest.fixture
async def client(server: SandboxServer) -> AsyncIterator[ComputerClient]:
    c = ComputerClient([f"http://127.0.0.1:{server.port}"], owner="worker-a", max_retries=1, backoff_s=0.05)
    try:
        yield c
    finally:
        await c.close()


async def test_first_screenshot_is_a_viewport_png_and_the_right_click_passes(client: ComputerClient) -> None:
    task = button_task(0)
    session = await client.open(payload(task))
    assert png_size(session.first.png) == (224, 224) == (session.first.width, session.first.height)
    assert uid_of(browser_pid(session.id)) >= UID_BASE, "the browser runs as the session's own uid, not root"
    _, target = task.metadata["params"]
    after = await session.act(click_on(task, target))
    assert png_size(after.png) == (224, 224) and after.png != session.first.png, "the pressed button shows"
    verdict = await session.finish()
    assert (verdict.passed, verdict.reward, verdict.status) == (True, 1.0, "passed")
    assert verdict.detail == f"pressed: {target}"


async def test_a_wrong_click_fails_and_no_action_fails(client: ComputerClient) -> None:
    task = button_task(1)
    labels, target = task.metadata["params"]
    wrong = next(b for b in labels if b != target)
    session = await client.open(payload(task))
    await session.act(click_on(task, wrong))
    await session.act(Done())
    verdict = await session.finish()
    assert (verdict.passed, verdict.reward, verdict.status, verdict.detail) == (False, 0.0, "failed",
                                                                               f"pressed: {wrong}")
    idle = await client.open(payload(task))
    assert (await idle.finish()).detail == "no button pressed"


async def test_invalid_actions_are_400s_naming_the_error_and_leave_the_page(
        server: SandboxServer, client: ComputerClient) -> None:
    task = button_task(2)
    session = await client.open(payload(task, max_actions=1))
    with pytest.raises(ActionRejected, match=r"click: \(400, 10\) is outside the 224x224 screen"):
        await session.act(Click(400, 10))
    async with client._session().post(f"{session.url}/computer/sessions/{session.id}/act",
                                       json={"action": {"name": "drag", "arguments": {}}},
                                       headers={"X-Session-Key": session.key}) as resp:
        body = await resp.json()
    assert resp.status == 400 and body["field"] == "action" and "unknown action 'drag'" in body["error"]
    await session.act(Key("Tab"))
    with pytest.raises(ActionRejected, match="actions are used up"):
        await session.act(Key("Tab"))
    verdict = await session.finish()
    assert verdict.status == "failed", "rejected actions changed nothing and are no infrastructure failure"


async def test_a_killed_renderer_is_an_infrastructure_failure(server: SandboxServer, client: ComputerClient) -> None:
    task = button_task(3)
    session = await client.open(payload(task))
    os.kill(browser_pid(session.id), signal.SIGKILL)
    with pytest.raises(SessionUnavailable, match="renderer failed"):
        await session.act(Click(10, 10))
    assert sandbox_pids(session.id) == [], "the whole sandbox went with its browser"
    assert await reaped(client) == {"renderer_failed": 1}

    graded = await client.open(payload(task))
    os.kill(browser_pid(graded.id), signal.SIGKILL)
    with pytest.raises(SessionUnavailable, match="could not be graded|is gone"):
        await graded.finish()


async def test_a_hung_renderer_is_an_infrastructure_failure(client: ComputerClient) -> None:
    session = await client.open(payload(button_task(4), action_timeout_s=1.0))
    pid = browser_pid(session.id)
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(SessionUnavailable, match="no answer within 1 s"):
            await session.act(Click(10, 10))
    finally:
        if sandbox_pids(session.id):
            os.kill(pid, signal.SIGCONT)
    assert sandbox_pids(session.id) == []


async def test_owner_gone_removes_the_session_and_its_browser(server: SandboxServer) -> None:
    url = f"http://127.0.0.1:{server.port}"
    async with aiohttp.ClientSession() as http:  # an owner that opens a session and then never renews
        async with http.post(f"{url}/computer/sessions", json={"owner": "ghost", "task": payload(button_task(5))}) as r:
            opened = await r.json()
        sid, key = opened["session_id"], {"X-Session-Key": opened["session_key"]}
        assert sandbox_pids(sid)
        for _ in range(200):
            if not sandbox_pids(sid):
                break
            await asyncio.sleep(0.05)
        async with http.post(f"{url}/computer/sessions/{sid}/act", json={"action": Done().to_json()},
                             headers=key) as r:
            assert r.status == 404 and (await r.json())["reason"] == "owner_lost"
    assert sandbox_pids(sid) == []


async def reaped(client: ComputerClient) -> dict[str, int]:
    async with client._session().get(f"{client.urls[0]}/computer/sessions?all=1") as resp:
        return dict((await resp.json())["computer_sessions_reaped"])
