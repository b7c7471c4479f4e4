"""The adversarial suite (issue 16): every malicious patch of `adversarial_cases.CASES` is contained or detected, and
the executor that ran it stays healthy and grades the gold patch FULL right after, with no sandbox process left."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from adversarial_cases import CASES, Case
from sandbox_helpers import FIXED, TEST_MUL, CalcRepo, sandbox_pids

from fleet.config.infra import SandboxConfig
from services.sandbox.executor import Executor
from services.sandbox.server import SandboxServer


@asynccontextmanager
async def _planted_answer(ctx: dict[str, Any]) -> AsyncIterator[None]:
    """A task-set folder outside /tmp (visible to the sandbox before issue 16) holding the fixed code."""
    root = Path(f"/var/tmp/grpo-adv-{uuid.uuid4().hex[:8]}")
    (root / "tasks").mkdir(parents=True)
    (root / "tasks" / "GOLD_core.py").write_text(FIXED)
    os.chmod(root, 0o755)
    try:
        yield
    finally:
        shutil.rmtree(root, ignore_errors=True)


@asynccontextmanager
async def _host_socket(ctx: dict[str, Any]) -> AsyncIterator[None]:
    root = Path(f"/var/tmp/grpo-adv-{uuid.uuid4().hex[:8]}")
    await asyncio.to_thread(root.mkdir, 0o755)
    hits: list[bytes] = []
    ctx["socket_hits"] = hits

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hits.append(await reader.read(100))
        writer.close()

    server = await asyncio.start_unix_server(accept, str(root / "agent.sock"))
    os.chmod(root / "agent.sock", 0o777)
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()
        shutil.rmtree(root, ignore_errors=True)


def _upstream_venv(tmp_path: Path) -> str:
    """A test interpreter whose site-packages holds the unbugged `calc` (and pytest, through a .pth)."""
    venv = tmp_path / "upstream-venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    import pytest as host_pytest

    (site / "host.pth").write_text(str(Path(host_pytest.__file__).parents[1]) + "\n")
    (site / "calc").mkdir()
    (site / "calc" / "__init__.py").write_text("from calc.core import add, mul, neg\n")
    (site / "calc" / "core.py").write_text(FIXED)
    return str(venv / "bin" / "python")


def _spec_args(case: Case, repo: CalcRepo) -> dict[str, Any]:
    args = dict(case.spec)
    if args.get("test_patch") == "checks":  # the test patch also adds a file inside a new folder
        args["test_patch"] = repo.diff({"tests/test_mul.py": TEST_MUL, "checks/test_extra.py": "def test_x():\n"
                                        "    pass\n"})
    return args


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_adversarial_patch_is_contained_or_detected(case: Case, calc_repo: CalcRepo, sandbox_cfg: SandboxConfig,
                                                          tmp_path: Path) -> None:
    ctx: dict[str, Any] = {}
    update: dict[str, Any] = {"pool_size": 1, **case.cfg}
    async with AsyncExitStack() as stack:
        if case.setup == "answer":
            await stack.enter_async_context(_planted_answer(ctx))
        elif case.setup == "socket":
            await stack.enter_async_context(_host_socket(ctx))
        elif case.setup == "upstream":
            update["python"] = await asyncio.to_thread(_upstream_venv, tmp_path)
        async with Executor(sandbox_cfg.model_copy(update=update)) as ex:
            v = await ex.run(calc_repo.spec(case.patch(calc_repo, ctx), **_spec_args(case, calc_repo)))
            detail = f"{v.status}/{v.resolution}: {v.error[:600]} | {v.stderr_tail[-800:]} | {v.stdout_tail[-800:]}"
            assert v.resolution != "FULL", detail
            assert v.status in case.expect, detail
            if case.check is not None:
                case.check(v, ctx)
            gold = await ex.run(calc_repo.spec(calc_repo.gold))
            assert (gold.status, gold.resolution) == ("completed", "FULL"), gold.error
            assert ex.health()["status"] == "ok"
    assert sandbox_pids() == []


def test_the_suite_covers_every_class_with_several_cases() -> None:
    per_class: dict[str, int] = {}
    for case in CASES:
        per_class[case.klass] = per_class.get(case.klass, 0) + 1
    assert set(per_class) == {"runner_config", "report_forgery", "in_process", "import_shadowing", "reading_answer",
                              "resources", "dodging"}
    assert min(per_class.values()) >= 3, per_class


MOUNTS = "import sys; sys.stdout.write(open('/proc/self/mountinfo').read())"


async def test_the_mount_table_shows_only_system_folders_the_runner_and_the_tree(executor: Executor,
                                                                                calc_repo: CalcRepo) -> None:
    spec = calc_repo.spec(calc_repo.diff({"m.py": MOUNTS}), test_command="python m.py", fail_to_pass=[],
                          pass_to_pass=[])
    v = await executor.run(spec)
    assert v.status == "completed" and v.exit_code == 0, v.stderr_tail
    points = {line.split()[4] for line in v.stdout_tail.splitlines() if len(line.split()) > 4}
    allowed = ("/usr", "/etc", "/dev", "/proc", "/tmp", "/lib", "/bin", "/sbin", "/")
    unexpected = [p for p in points if not p.startswith(allowed) and ".pyenv" not in p]
    assert unexpected == [], unexpected
    # Neither the source repository nor this checkout (task sets, gold patches, the venv) is mounted.
    assert not any(p.startswith((str(calc_repo.path), "/work", "/home")) for p in points), points
    assert "site-packages" not in " ".join(p for p in points if "tmpfs" not in p) or all(
        "site-packages" not in p or p.endswith("site-packages") for p in points)


async def test_deeply_nested_json_is_a_400_and_the_server_stays_up(server: SandboxServer) -> None:
    url = f"http://127.0.0.1:{server.port}"
    async with aiohttp.ClientSession() as s:
        for route in ("/task/submit", "/session"):
            async with s.post(f"{url}{route}", data="[" * 200_000 + "]" * 200_000,
                              headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 400 and (await resp.json())["field"] == "body", route
        async with s.get(f"{url}/healthz") as resp:
            assert resp.status == 200
