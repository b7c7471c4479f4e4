"""What the executor delegates a task with an `image` to: the configured runtime, the cache, the eval contract.

`ImageTasks.run(spec, timings)` -> Verdict. A pull or unpack failure, a missing image, a full cache, a runtime that
does not answer: `infra_error` naming the image, never a failed patch. `prefetch(ref)` starts a pull early (the
executor calls it when a task is submitted, before it waits for a pool slot; clients may call it when they lease).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

from fleet.config.infra import SandboxConfig
from fleet.contracts.sandbox import TaskSpec, Verdict
from services.sandbox.images import contract
from services.sandbox.images.cache import ImageCache
from services.sandbox.images.pull import Puller, PullError, PullOptions, normalize
from services.sandbox.images.runtime import BwrapImageRuntime, ImageRuntime
from services.sandbox.treecache import TreeCache
from services.sandbox.workspace import InfraError

log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """Host-shared when root (/var/cache), the user's cache otherwise."""
    if os.geteuid() == 0:
        return Path("/var/cache/grpo-fleet/images")
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "grpo-fleet" / "images"


def make_cache(cfg: SandboxConfig) -> ImageCache:
    opts = PullOptions(source="docker-daemon" if cfg.image_source == "docker-daemon" else "docker",
                       tls_verify=cfg.image_tls_verify, max_in_flight=cfg.image_pulls_in_flight,
                       rate_per_min=cfg.image_pulls_per_min)
    root = Path(cfg.image_cache_dir) if cfg.image_cache_dir else default_cache_dir()
    return ImageCache(root, Puller(opts), int(cfg.image_cache_gb * (1 << 30)))


def make_runtime(cfg: SandboxConfig, cache: ImageCache) -> ImageRuntime:
    if cfg.runtime == "docker":
        from services.sandbox.images.docker_runtime import DockerRuntime

        return DockerRuntime(cfg)
    return BwrapImageRuntime(cfg, cache, cache.root.parent / "runs")


class ImageTasks:
    """Image tasks of one executor: `await start()`, `await run(spec, timings)`, `await close()`."""

    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg = cfg
        self.cache = make_cache(cfg)
        self.runtime = make_runtime(cfg, self.cache)
        self._prefetches: dict[str, asyncio.Task[object]] = {}

    def ref(self, image: str) -> str:
        """The pull reference: a bare name (`sweb.eval.x86_64.<id>`) gets `sandbox.image_namespace`, a name without
        a registry host gets `sandbox.image_registry`."""
        if "/" not in image and self.cfg.image_namespace:
            image = f"{self.cfg.image_namespace}/{image}"
        return normalize(image, self.cfg.image_registry)

    async def start(self) -> None:
        await self.runtime.start()
        await asyncio.to_thread(contract.load)

    async def close(self) -> None:
        for task in self._prefetches.values():
            task.cancel()
        await asyncio.gather(*self._prefetches.values(), return_exceptions=True)
        await self.runtime.close()

    def prefetch(self, image: str) -> None:
        """Start pulling `image` now (errors surface when a task uses it)."""
        if self.cfg.runtime == "docker":
            return  # the engine pulls on create
        ref = self.ref(image)
        if ref in self._prefetches:
            return
        task: asyncio.Task[object] = asyncio.ensure_future(self.cache.ensure(ref))
        self._prefetches[ref] = task
        task.add_done_callback(lambda t: (self._prefetches.pop(ref, None), t.cancelled() or t.exception()))

    async def run(self, spec: TaskSpec, timings: dict[str, float], trees: TreeCache | None = None) -> Verdict:
        assert spec.image is not None
        try:
            ref = self.ref(spec.image)
        except ValueError as exc:
            return Verdict(status="infra_error", error=str(exc))

        t = time.monotonic()
        try:
            async with self.runtime.environment(ref) as env:
                timings["image_s"] = time.monotonic() - t
                return await contract.run_task(env, spec, timings, trees)
        except PullError as exc:
            return Verdict(status="infra_error", error=str(exc))
        except InfraError as exc:
            return Verdict(status="infra_error", error=str(exc))
        except OSError as exc:
            return Verdict(status="infra_error", error=f"image {ref}: {type(exc).__name__}: {exc}")

    def health(self) -> dict[str, object]:
        return self.runtime.health()
