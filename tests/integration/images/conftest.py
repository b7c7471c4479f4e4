"""Session fixtures: a loopback registry holding small SWE-bench-style images built from the sandbox tests' repo.

Built once per session: the Debian base (cached on disk across sessions by `envs.swe.images.base_tarball`), then
two instance images of the `calc` repository -- one well built, one whose /testbed still holds a later commit
(the fix) on a branch, for the future-commit check.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sandbox"))

from image_helpers import ImageSet, git, local_registry  # noqa: E402
from sandbox_helpers import CalcRepo, make_calc_repo  # noqa: E402

from envs.swe.images import OciBuilder, base_tarball, make_testbed  # noqa: E402
from fleet.config.infra import SandboxConfig  # noqa: E402

_TOOLS = ("bwrap", "skopeo", "umoci", "docker-registry")
_CANNOT = os.geteuid() != 0 or any(shutil.which(t) is None for t in _TOOLS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _CANNOT:
        return
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason=f"image tests need root and {', '.join(_TOOLS)} (scripts/setup.sh installs them)")
    for item in items:
        if here in item.path.parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImageSet]:
    root = tmp_path_factory.mktemp("images")
    repo = make_calc_repo(root / "calc")
    builder = OciBuilder(root / "oci")
    builder.base(base_tarball())
    builder.instance("calc", _testbed(repo, root / "tb"))
    future_tb = root / "tb-future"
    make_testbed(repo.path, repo.base, future_tb)
    git(future_tb, "checkout", "-q", "-b", "fix")
    (future_tb / "calc" / "core.py").write_text((repo.path / "calc" / "core.py").read_text().replace("a - b", "a + b"))
    git(future_tb, "commit", "-qam", "THE FIX")
    future = git(future_tb, "rev-parse", "HEAD")
    git(future_tb, "checkout", "-q", "main")
    builder.instance("calc-future", future_tb)
    builder.instance("calc-clean", _clean_testbed(repo, root / "tb-clean"))
    with local_registry(root / "registry") as reg:
        for tag in ("calc", "calc-future", "calc-clean"):
            builder.push(tag, f"{reg.host}/swe/{tag}:v1")
        # The names SWE-bench and SWE-Gym publish instance `calc__1` under (same image, so one unpack).
        builder.push("calc", f"{reg.host}/swebench/sweb.eval.x86_64.calc_1776_1:latest")
        builder.push("calc", f"{reg.host}/xingyaoww/sweb.eval.x86_64.calc_s_1:latest")
        yield ImageSet(reg.host, repo, "swe/calc:v1", "swe/calc-future:v1", future, builder)


def _clean_testbed(repo: CalcRepo, dest: Path) -> Path:
    """calc with both bugs fixed and the test patch in: a SWE-smith image, whose task applies a bug."""
    make_testbed(repo.path, repo.base, dest)
    for patch in (repo.gold, repo.test_patch):
        subprocess.run(["git", "-C", str(dest), "apply", "-"], input=patch, text=True, check=True)
    git(dest, "add", "-A")
    git(dest, "commit", "-qm", "clean")
    return dest


def _testbed(repo: CalcRepo, dest: Path) -> Path:
    make_testbed(repo.path, repo.base, dest)
    return dest


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One image cache for the executor tests, as one host's executors share it (the cache tests make their own)."""
    return tmp_path_factory.mktemp("cache") / "images"


@pytest.fixture
def image_cfg(images: ImageSet, tmp_path: Path, shared_cache: Path) -> SandboxConfig:
    return SandboxConfig(pool_size=2, work_root=str(tmp_path / "work"), memory_mb=2048, cpu_s=60, max_processes=128,
                         image_cache_dir=str(shared_cache), image_registry=images.registry,
                         image_tls_verify=False, result_ttl_s=600)

ENGINE = Path(__file__).resolve().parents[3] / "scripts" / "docker-engine.sh"


def _answers() -> bool:
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "info"], capture_output=True, timeout=30).returncode == 0


def _forget_images(registry: str) -> None:
    """Remove the engine's images pulled from `registry` (tagged or left dangling). The engine keeps its store between
    runs and the Docker runtime uses an image it already holds under the same reference, as SWE-bench's harness does;
    a later session whose loopback registry got the same port would then run an earlier session's image, whose
    repository has other commits (`base_commit not in /testbed`)."""
    listed = subprocess.run(["docker", "images", "--format", "{{.Repository}} {{.ID}}"], capture_output=True,
                            text=True, timeout=60).stdout.split("\n")
    ids = sorted({line.split()[1] for line in listed if line.startswith(registry + "/")})
    if ids:
        subprocess.run(["docker", "rmi", "-f", *ids], capture_output=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def docker_engine(images: ImageSet) -> Iterator[None]:
    """A Docker engine for the module that asks for one: one that runs already is used and left running, one
    started here is stopped after the module. Either way the engine holds no image of this session's registry before
    the module, nor after it."""
    started = False
    if not _answers():
        if not ENGINE.is_file() or shutil.which("dockerd") is None:
            pytest.skip("no Docker engine and no scripts/docker-engine.sh to start one")
        subprocess.run(["bash", str(ENGINE), "start"], check=True, timeout=300)
        started = True
    _forget_images(images.registry)
    try:
        yield
    finally:
        _forget_images(images.registry)
        if started:
            subprocess.run(["bash", str(ENGINE), "stop"], check=False, timeout=120)
