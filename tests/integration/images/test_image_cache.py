"""The host-shared image cache against a real registry: one unpack per image, crash safety, budget, shared layers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from image_helpers import ImageSet

from services.sandbox.images.cache import ImageCache
from services.sandbox.images.pull import Puller, PullError, PullOptions

ROOT = Path(__file__).resolve().parents[3]


def _cache(root: Path, budget: int = 1 << 40) -> ImageCache:
    return ImageCache(root, Puller(PullOptions(tls_verify=False)), budget)


async def test_two_executors_pulling_one_image_at_once_unpack_it_once(images: ImageSet, tmp_path: Path) -> None:
    first, second = _cache(tmp_path / "c"), _cache(tmp_path / "c")
    ref = f"{images.registry}/{images.image}"
    a, b = await asyncio.gather(first.ensure(ref), second.ensure(ref))
    assert a.path == b.path and (a.rootfs / "testbed" / "calc" / "core.py").is_file()
    assert first.unpacks + second.unpacks == 1
    assert len(first.images()) == 1


async def test_pull_killed_half_way_leaves_the_cache_usable(images: ImageSet, tmp_path: Path) -> None:
    ref = f"{images.registry}/{images.image}"
    code = ("import asyncio, sys; from pathlib import Path; from services.sandbox.images.cache import ImageCache; "
            "from services.sandbox.images.pull import Puller, PullError, PullOptions; "
            "c = ImageCache(Path(sys.argv[1]), Puller(PullOptions(tls_verify=False)), 1 << 40); "
            "asyncio.run(c.ensure(sys.argv[2]))")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "c"), ref], cwd=ROOT)  # noqa: ASYNC220
    tmp = tmp_path / "c" / "tmp"
    deadline = time.monotonic() + 60
    while not any((p / "rootfs").exists() or (p / "oci").exists() for p in tmp.glob("*") if p.is_dir()):
        assert proc.poll() is None and time.monotonic() < deadline, "the pull ended before it could be killed"
        await asyncio.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    cache = _cache(tmp_path / "c")
    image = await cache.ensure(ref)
    assert (image.rootfs / "testbed" / "calc" / "core.py").is_file()
    assert [p.name for p in tmp.iterdir()] == []
    assert cache.unpacks == 1


async def test_instances_of_one_repo_hold_the_shared_base_once(images: ImageSet, tmp_path: Path) -> None:
    cache = _cache(tmp_path / "c")
    first = await cache.ensure(f"{images.registry}/{images.image}")
    second = await cache.ensure(f"{images.registry}/{images.future_image}")
    sizes = [int(json.loads((i.path / "meta.json").read_text())["bytes"]) for i in (first, second)]
    assert sizes[1] < sizes[0] / 20, sizes
    assert cache.size() == sum(sizes)


@pytest.fixture(scope="module")
def sizes(images: ImageSet, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, int]:
    """(bytes of the first image, bytes the second adds to a cache holding the first)."""
    probe = _cache(tmp_path_factory.mktemp("probe"))
    asyncio.run(probe.ensure(f"{images.registry}/{images.image}"))
    a_size = probe.size()
    asyncio.run(probe.ensure(f"{images.registry}/{images.future_image}"))
    return a_size, probe.size() - a_size


async def test_least_recently_used_image_is_evicted_past_the_budget(images: ImageSet, tmp_path: Path,
                                                                    sizes: tuple[int, int]) -> None:
    a_ref, b_ref = f"{images.registry}/{images.image}", f"{images.registry}/{images.future_image}"
    a_size, b_own = sizes
    budget = a_size + b_own // 2  # both do not fit; either alone does (b alone: a's base plus b's own /testbed)
    cache = _cache(tmp_path / "c", budget)
    await cache.ensure(a_ref)
    async with cache.use(b_ref) as b:
        assert [p.name for p in cache.images()] == [b.path.name]
        assert cache.size() <= budget
        assert (b.rootfs / "usr" / "bin" / "python3").exists()  # the shared base outlived the evicted image


async def test_full_cache_is_an_error_naming_the_image(images: ImageSet, tmp_path: Path,
                                                       sizes: tuple[int, int]) -> None:
    a_ref, b_ref = f"{images.registry}/{images.image}", f"{images.registry}/{images.future_image}"
    a_size, b_own = sizes
    cache = _cache(tmp_path / "c", a_size + b_own // 2)
    async with cache.use(a_ref):  # held by a run: cannot be evicted
        with pytest.raises(PullError, match="cache full") as err:
            await cache.ensure(b_ref)
    assert b_ref in str(err.value)
    assert len(cache.images()) == 1
