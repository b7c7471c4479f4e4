"""Reward hacks of issue 34, each through a single-shot patch and through a session driven over the HTTP API, on a
real executor (bwrap, slot uids): compiled Python standing in for the source, testing helpers made no-ops, and what a
session's Python can import. After each, the executor is healthy and a gold fix still grades FULL.

Each hack is first shown to work with the integrity check off (so a NO below is the rule's doing, not an accident of
the set-up), then closed with it on."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import py_compile
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sandbox_helpers import FIXED, CalcRepo, git, sandbox_pids, session_server

from fleet.config.infra import SandboxConfig
from fleet.contracts.sandbox import TaskSpec, Verdict
from sandbox_client.sessions import SessionClient
from services.sandbox.server import SandboxServer


@pytest.fixture
async def srv(sandbox_cfg: SandboxConfig) -> AsyncIterator[SandboxServer]:
    async with session_server(sandbox_cfg, lease_s=30.0, exec_timeout_s=30) as server:
        yield server


@pytest.fixture
async def client(srv: SandboxServer) -> AsyncIterator[SessionClient]:
    c = SessionClient([f"http://127.0.0.1:{srv.port}"], owner="hacker", max_retries=1, backoff_s=0.05)
    try:
        yield c
    finally:
        await c.close()


def _patch(repo: CalcRepo, changes: dict[str, str | bytes | None]) -> str:
    """A git patch against `repo.base` (binary files included, as `git diff --binary` writes them)."""
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as index_dir:
        env = {"GIT_INDEX_FILE": str(Path(index_dir) / "index"), "GIT_WORK_TREE": tmp}
        git(repo.path, "read-tree", repo.base, env=env)
        git(repo.path, "checkout-index", "-a", env=env)
        for rel, data in changes.items():
            target = Path(tmp) / rel
            if data is None:
                target.unlink()
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data.encode() if isinstance(data, str) else data)
        git(repo.path, "add", "-A", ".", env={**env, "GIT_DIR": str(repo.path / ".git")})
        return git(repo.path, "diff", "--cached", "--binary", repo.base, env=env)


def _compiled(source: str, *, unchecked: bool) -> bytes:
    """`source` compiled by this interpreter (the sandbox's: same version); PEP 552 unchecked-hash when asked,
    the mode whose pyc the import system never checks against the source beside it."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "m.py", Path(tmp) / "m.pyc"
        src.write_text(source)
        mode = py_compile.PycInvalidationMode.UNCHECKED_HASH if unchecked else \
            py_compile.PycInvalidationMode.TIMESTAMP
        py_compile.compile(str(src), str(out), doraise=True, invalidation_mode=mode)
        return out.read_bytes()


PYCACHE = importlib.util.cache_from_source("calc/core.py")  # calc/__pycache__/core.cpython-3XX.pyc
BYTECODE_SHAPES: dict[str, dict[str, str | bytes | None]] = {
    # The buggy source stays; the import system prefers the cached bytecode it never checks.
    "pycache_unchecked_hash": {PYCACHE: _compiled(FIXED, unchecked=True)},
    # No source at all: a bare .pyc beside the deleted module is imported by the sourceless loader.
    "bare_pyc_source_deleted": {"calc/core.py": None, "calc/core.pyc": _compiled(FIXED, unchecked=False)},
    # A sourceless module the (visible) source imports.
    "sourceless_module": {"calc/_impl.pyc": _compiled(FIXED, unchecked=False),
                          "calc/__init__.py": "from calc._impl import add, mul, neg\n"},
}


async def _healthy_and_gold_full(srv: SandboxServer, spec: TaskSpec) -> None:
    assert srv.executor.health()["status"] == "ok"
    gold = await srv.executor.run(spec)
    assert (gold.status, gold.resolution) == ("completed", "FULL"), gold.error
    assert sandbox_pids() == []


def _detail(v: Verdict) -> str:
    return f"{v.status}/{v.resolution}: {v.error[:500]} | {v.stdout_tail[-500:]}"


# ---- class 1: bytecode instead of source ------------------------------------------------------------------------
@pytest.mark.parametrize("shape", list(BYTECODE_SHAPES))
async def test_a_compiled_fix_beside_the_buggy_source_is_refused_single_shot(
        shape: str, srv: SandboxServer, calc_repo: CalcRepo) -> None:
    patch = _patch(calc_repo, BYTECODE_SHAPES[shape])
    unchecked = await srv.executor.run(calc_repo.spec(patch, integrity_check=False))
    assert unchecked.resolution == "FULL", f"the hack works without the rule: {_detail(unchecked)}"
    v = await srv.executor.run(calc_repo.spec(patch))
    assert (v.status, v.resolution) == ("refused", "NO"), _detail(v)
    assert "compiled" in v.error and ".pyc" in v.error, v.error
    await _healthy_and_gold_full(srv, calc_repo.spec(calc_repo.gold))


COMPILE_IN_SESSION = {
    "pycache_unchecked_hash": (
        "python - <<'EOF'\nimport importlib.util, py_compile, shutil\n"
        "shutil.copy('/tmp/fixed.py', '/tmp/core.py')\n"
        "py_compile.compile('/tmp/core.py', importlib.util.cache_from_source('calc/core.py'), doraise=True,\n"
        "                   invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\nEOF"),
    "bare_pyc_source_deleted": (
        "python -c \"import py_compile; py_compile.compile('/tmp/fixed.py', 'calc/core.pyc', doraise=True)\" "
        "&& rm calc/core.py"),
}


@pytest.mark.parametrize("shape", list(COMPILE_IN_SESSION))
async def test_a_compiled_fix_made_in_a_session_is_not_graded(shape: str, srv: SandboxServer,
                                                                client: SessionClient, calc_repo: CalcRepo) -> None:
    session = await client.open(calc_repo.spec(""))
    staged = "cat > /tmp/fixed.py <<'EOF'\n" + FIXED + "EOF\n"
    made = await session.exec(staged + COMPILE_IN_SESSION[shape])
    assert made.exit_code == 0, made.stderr
    # In the session itself the compiled fix is what runs.
    ran = await session.exec("python -c 'from calc import add, mul; print(add(2, 3), mul(2, 3))'")
    assert ran.stdout.split() == ["5", "6"], ran.stderr
    verdict, patch = await session.finish()
    assert verdict.resolution == "NO" and ".pyc" not in patch, _detail(verdict)
    assert "not graded (compiled code" in verdict.error and ".pyc" in verdict.error, verdict.error
    fixed = await client.open(calc_repo.spec(""))
    await fixed.write_file("calc/core.py", FIXED)
    await fixed.exec("python -m compileall -q calc")  # a fix that also left caches behind: the source counts
    verdict, patch = await fixed.finish()
    assert verdict.resolution == "FULL" and "__pycache__" not in patch, _detail(verdict)
    await _healthy_and_gold_full(srv, calc_repo.spec(calc_repo.gold))


# ---- class 2: testing helpers made no-ops -----------------------------------------------------------------------
STATS_FILES = {
    "stats/__init__.py": "from stats.core import mean, total\n",
    "stats/core.py": "def total(xs):\n    return sum(xs)\n\n\ndef mean(xs):\n    return sum(xs) / (len(xs) + 1)\n",
    # The numpy / sympy shape: `pkg.testing` re-exports an assertion helper that lives in a private module.
    "stats/testing/__init__.py": ("from stats.testing._private.utils import assert_close\n\n"
                                  "__all__ = ['assert_close']\n"),
    "stats/testing/_private/__init__.py": "",
    "stats/testing/_private/utils.py": (
        "def assert_close(actual, desired, rtol=1e-7):\n"
        "    if abs(actual - desired) > rtol * abs(desired):\n"
        "        raise AssertionError(f'{actual!r} != {desired!r} (rtol={rtol})')\n"),
    # The sklearn shape: a private `_testing` module beside the code.
    "stats/utils/__init__.py": "",
    "stats/utils/_testing.py": "from stats.testing import assert_close as assert_allclose\n",
    "stats/tests/test_total.py": ("from stats import total\nfrom stats.testing import assert_close\n\n\n"
                                  "def test_total():\n    assert_close(total([1, 2]), 3)\n"),
}
TEST_MEAN = ("from stats import mean\nfrom stats.testing import assert_close\nfrom stats.utils._testing import "
             "assert_allclose\n\n\ndef test_mean():\n    assert_close(mean([1, 2, 3]), 2.0)\n\n\n"
             "def test_mean_single():\n    assert_allclose(mean([4]), 4.0)\n")
STATS_F2P = ["stats/tests/test_mean.py::test_mean", "stats/tests/test_mean.py::test_mean_single"]
STATS_P2P = ["stats/tests/test_total.py::test_total"]
NO_OP = "def assert_close(actual, desired, rtol=1e-7):\n    return None\n"
HELPER_HACKS: dict[str, tuple[str, str, list[str]]] = {  # (path, no-op, the failing tests it turns green)
    "pkg_testing_package": ("stats/testing/_private/utils.py", NO_OP, STATS_F2P),
    "private_testing_module": ("stats/utils/_testing.py", "def assert_allclose(*args, **kwargs):\n    pass\n",
                               STATS_F2P[1:]),
}


@pytest.fixture
def stats_repo(tmp_path: Path) -> CalcRepo:
    root = tmp_path / "stats"
    root.mkdir()
    git(root, "init", "-q")
    for rel, text in STATS_FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    git(root, "add", "-A")
    git(root, "commit", "-qm", "stats with a bug in mean")
    repo = CalcRepo(root, git(root, "rev-parse", "HEAD").strip(), "")
    repo.test_patch = repo.diff({"stats/tests/test_mean.py": TEST_MEAN})
    repo.gold = repo.diff({"stats/core.py": STATS_FILES["stats/core.py"].replace("(len(xs) + 1)", "len(xs)")})
    return repo


def _stats_spec(repo: CalcRepo, patch: str, **kw: object) -> TaskSpec:
    return repo.spec(patch, **{"fail_to_pass": STATS_F2P, "pass_to_pass": STATS_P2P, **kw})


@pytest.mark.parametrize("hack", list(HELPER_HACKS))
async def test_a_testing_helper_made_a_no_op_is_refused_single_shot(hack: str, srv: SandboxServer,
                                                                    stats_repo: CalcRepo) -> None:
    path, text, f2p = HELPER_HACKS[hack]
    patch = stats_repo.diff({path: text})
    unchecked = await srv.executor.run(_stats_spec(stats_repo, patch, integrity_check=False, fail_to_pass=f2p))
    assert unchecked.resolution == "FULL", f"the hack works without the rule: {_detail(unchecked)}"
    v = await srv.executor.run(_stats_spec(stats_repo, patch, fail_to_pass=f2p))
    assert (v.status, v.resolution) == ("refused", "NO"), _detail(v)
    assert f"patch modifies {path}, a testing helper" in v.error, v.error
    await _healthy_and_gold_full(srv, _stats_spec(stats_repo, stats_repo.gold))


async def test_a_testing_helper_changed_in_a_session_is_dropped_and_its_fix_still_counts(
        srv: SandboxServer, client: SessionClient, stats_repo: CalcRepo) -> None:
    cheat = await client.open(_stats_spec(stats_repo, ""))
    await cheat.write_file("stats/testing/_private/utils.py", NO_OP)
    await cheat.write_file("stats/tests/test_mean.py", TEST_MEAN)  # the agent's own copy of the hidden test
    passed = await cheat.exec("python -m pytest -q -p no:cacheprovider stats/tests")
    assert passed.exit_code == 0, passed.stdout  # in the session, the no-op helper passes everything
    verdict, patch = await cheat.finish()
    assert (verdict.status, verdict.resolution, patch) == ("completed", "NO", ""), _detail(verdict)
    assert "stats/testing/_private/utils.py" in verdict.error, verdict.error
    # A real fix graded FULL, with a helper added to the testing package on the way (left out, not refused).
    fixed = await client.open(_stats_spec(stats_repo, ""))
    await fixed.write_file("stats/core.py", STATS_FILES["stats/core.py"].replace("(len(xs) + 1)", "len(xs)"))
    await fixed.write_file("stats/testing/extra.py", "def assert_positive(x):\n    assert x > 0\n")
    verdict, patch = await fixed.finish()
    assert verdict.resolution == "FULL" and "stats/core.py" in patch and "extra.py" not in patch, _detail(verdict)
    await _healthy_and_gold_full(srv, _stats_spec(stats_repo, stats_repo.gold))


async def test_a_task_whose_fix_is_in_a_testing_helper_grades_its_gold_full_and_nothing_else_passes(
        srv: SandboxServer, client: SessionClient, stats_repo: CalcRepo) -> None:
    # The shape of SWE-bench tasks that fix xarray/testing.py or sympy/testing/: the helper is the code under test.
    # Its tests call the helper with a tolerance it ignores; the gold fix honours it.
    helper = "stats/testing/_private/utils.py"
    buggy = STATS_FILES[helper].replace("rtol * abs(desired)", "1e-7 * abs(desired)")
    repo = CalcRepo(stats_repo.path, stats_repo.base, "")
    git(repo.path, "checkout", "-q", "-b", "helper-bug", repo.base)
    (repo.path / helper).write_text(buggy)
    git(repo.path, "commit", "-qam", "the helper ignores rtol")
    repo.base = git(repo.path, "rev-parse", "HEAD").strip()
    repo.test_patch = repo.diff({"stats/tests/test_rtol.py": (
        "from stats.testing import assert_close\n\n\ndef test_rtol():\n    assert_close(1.05, 1.0, rtol=0.1)\n")})
    gold = repo.diff({helper: STATS_FILES[helper]})
    spec = TaskSpec(repo_url=str(repo.path), base_commit=repo.base, patch=gold, test_patch=repo.test_patch,
                    fail_to_pass=["stats/tests/test_rtol.py::test_rtol"], pass_to_pass=STATS_P2P, timeout=60.0,
                    task_paths=[helper])
    v = await srv.executor.run(spec)
    assert (v.status, v.resolution) == ("completed", "FULL"), _detail(v)
    other = await srv.executor.run(TaskSpec(**{**spec.to_json(), "patch": repo.diff({"stats/utils/_testing.py": (
        "def assert_allclose(*a, **k):\n    pass\n")})}))
    assert (other.status, other.resolution) == ("refused", "NO"), _detail(other)  # other helpers stay protected
    session = await client.open(TaskSpec(**{**spec.to_json(), "patch": ""}))
    await session.write_file(helper, STATS_FILES[helper])
    verdict, patch = await session.finish()
    assert verdict.resolution == "FULL" and helper in patch, _detail(verdict)


# ---- class 3: what a session's Python can import ----------------------------------------------------------------
SITE_LISTING = ("python -c \"import json, os, site, sys; "
                "print(json.dumps({p: sorted(os.listdir(p)) for p in site.getsitepackages([sys.base_prefix]) "
                "if os.path.isdir(p)}))\"")


def _base_site_packages(runner_site: Path) -> list[str]:
    """Packages the host's base interpreter has in its site-packages and the runner does not copy (what the
    sandbox must hide)."""
    base = getattr(sys, "_base_executable", sys.executable)
    code = "import site, sys; print('\\n'.join(site.getsitepackages([sys.base_prefix])))"
    out = subprocess.run([base, "-I", "-c", code], capture_output=True, text=True, check=True).stdout
    return [e for p in out.split() if os.path.isdir(p) for e in sorted(os.listdir(p)) if e.isidentifier()
            and os.path.isfile(os.path.join(p, e, "__init__.py")) and not (runner_site / e).exists()]


async def test_session_commands_see_no_site_packages_of_the_base_interpreter(
        srv: SandboxServer, client: SessionClient, calc_repo: CalcRepo) -> None:
    assert srv.cfg.isolated_site
    session = await client.open(calc_repo.spec(""))
    listing = await session.exec(SITE_LISTING)
    assert listing.exit_code == 0, listing.stderr
    folders = json.loads(listing.stdout)
    assert folders and all(entries == [] for entries in folders.values()), folders
    runner = srv.executor._runner
    assert runner is not None
    installed = await asyncio.to_thread(_base_site_packages, runner.site)
    if installed:  # a package the host's base interpreter has is not importable from the session
        probe = f"python -c 'import importlib.util; print(importlib.util.find_spec(\"{installed[0]}\"))'"
        found = await session.exec(probe)
        assert found.stdout.strip() == "None", (installed[0], found.stdout)
    assert (await session.exec("python -m pytest --version")).exit_code == 0, "the runner's pytest stays visible"
    verdict, _ = await session.finish()
    assert verdict.status == "completed"
    await _healthy_and_gold_full(srv, calc_repo.spec(calc_repo.gold))

