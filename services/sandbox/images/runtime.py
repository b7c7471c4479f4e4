"""Runtimes that run commands inside a task's image: the interface, and the daemonless bubblewrap one.

The interface is what the SWE-bench eval contract (`contract.py`) and sandbox sessions need, nothing more:
    async with runtime.environment(image_ref) as env:   # the image's rootfs + a fresh writable layer
        env.put("patch.diff", text)                      # a file the commands can read at env.io_dir
        result = await env.exec(["git", "apply", ...], limit_s=60)
    # leaving the block removes the layer (and the container, for Docker); the image itself is never changed
`BwrapImageRuntime` runs each `exec` in bubblewrap with the layer's merged tree as `/`: new pid/net/ipc/uts
namespaces (no network), every capability dropped, `/proc/sys` read-only and no `/sys`, a private /tmp, the image's
Env and the working directory `/testbed`; outside it, prlimit (address space, CPU, file size, no core) and the host
path's per-task cgroup (`task_memory_mb`, `max_processes`: the run is uid 0, which RLIMIT_NPROC does not bind).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

from fleet.config.infra import SandboxConfig
from fleet.contracts.swe_eval import WORKDIR
from services.sandbox.cgroups import CgroupRoot
from services.sandbox.images.cache import CachedImage, ImageCache
from services.sandbox.images.layers import Layer, RunLayers
from services.sandbox.process import RunResult, run_limited

log = logging.getLogger(__name__)
IO_DIR = "/run/grpo-io"
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ImageEnv(Protocol):
    """One prepared environment: an image's root filesystem with its own writable layer."""

    image: CachedImage | None
    ref: str

    def put(self, name: str, text: str) -> None:
        """Write `name` into the folder the commands see at `IO_DIR` (read-only to them)."""

    async def exec(self, argv: list[str], *, limit_s: float, output_cap: int | None = None,
                   env: dict[str, str] | None = None, workdir: str = WORKDIR) -> RunResult:
        """Run `argv` inside the environment (no network, the sandbox's limits)."""


class ImageRuntime(Protocol):
    name: str

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    def environment(self, ref: str) -> contextlib.AbstractAsyncContextManager[ImageEnv, bool | None]: ...
    def health(self) -> dict[str, object]: ...


class BwrapEnv:
    def __init__(self, runtime: BwrapImageRuntime, image: CachedImage, layer: Layer) -> None:
        self.runtime, self.layer, self.ref = runtime, layer, image.ref
        self.image: CachedImage | None = image

    def put(self, name: str, text: str) -> None:
        (self.layer.io / name).write_text(text)

    async def exec(self, argv: list[str], *, limit_s: float, output_cap: int | None = None,
                   env: dict[str, str] | None = None, workdir: str = WORKDIR) -> RunResult:
        return await self.runtime.run_in(self, argv, limit_s=limit_s, output_cap=output_cap, extra=env or {},
                                         workdir=workdir)


class BwrapImageRuntime:
    """Daemonless: images from the host-shared cache, each run in bubblewrap over its own layer."""

    name = "bwrap-image"

    def __init__(self, cfg: SandboxConfig, cache: ImageCache, layers_root: Path) -> None:
        self.cfg = cfg
        self.cache = cache
        self.layers = RunLayers(layers_root, cfg.image_layers)
        self.cgroups: CgroupRoot | None = None
        self.tools: dict[str, str] = {}

    async def start(self) -> None:
        missing = [t for t in ("bwrap", "prlimit", "skopeo", "umoci") if shutil.which(t) is None]
        if missing:
            raise RuntimeError(f"missing tools for image tasks: {', '.join(missing)} "
                               "(packages: bubblewrap, util-linux, skopeo, umoci)")
        self.tools = {t: shutil.which(t) or t for t in ("bwrap", "prlimit")}
        removed = self.layers.start() + self.cache.sweep()
        if removed:
            log.info("cleaned %d leftovers of killed executors (run layers, pulls)", removed)
        # The host path's per-task cgroups (services/sandbox/cgroups.py), with the same keys.
        self.cgroups = None if self.cfg.cgroups == "off" else CgroupRoot.detect()
        if self.cgroups is None and self.cfg.cgroups == "required":
            raise RuntimeError("sandbox.cgroups=required but the memory/pids cgroups cannot be used here")
        if self.cgroups is None:
            log.warning("image runs: no per-task cgroup here; only rlimits bound them")

    async def close(self) -> None:
        self.layers.close()

    @contextlib.asynccontextmanager
    async def environment(self, ref: str) -> AsyncIterator[ImageEnv]:
        async with self.cache.use(ref) as image:
            layer = await self.layers.create(image.rootfs)
            try:
                yield BwrapEnv(self, image, layer)
            finally:
                await self.layers.remove(layer)

    def argv(self, env: BwrapEnv, command: list[str], workdir: str) -> list[str]:
        cfg = self.cfg
        cpu_s = cfg.cpu_s
        limits = [self.tools["prlimit"], f"--as={cfg.memory_mb << 20}", f"--cpu={cpu_s}:{cpu_s + 5}",
                  f"--fsize={cfg.max_file_mb << 20}", "--core=0", "--"]
        bwrap = [self.tools["bwrap"], "--die-with-parent", "--new-session", "--unshare-all", "--hostname", "sandbox",
                 "--cap-drop", "ALL", "--bind", str(env.layer.merged), "/", "--proc", "/proc",
                 "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev",
                 "--perms", "1777", "--size", str(cfg.tmpfs_mb << 20), "--tmpfs", "/tmp",
                 "--ro-bind", str(env.layer.io), IO_DIR, "--chdir", workdir, "--", *command]
        return [*limits, *bwrap]

    def environ(self, image: CachedImage | None, extra: dict[str, str]) -> dict[str, str]:
        """The image's Env, then ours: nothing of the executor's environment reaches the run."""
        base = {"PATH": _DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
        return {**base, **(image.env() if image else {}), **extra}

    async def run_in(self, env: BwrapEnv, argv: list[str], *, limit_s: float, output_cap: int | None,
                     extra: dict[str, str], workdir: str) -> RunResult:
        group = self.cgroups.task(self.cfg.task_memory_mb << 20, self.cfg.max_processes) if self.cgroups else None
        try:
            command = self.argv(env, argv, workdir)
            command = group.wrap(command) if group else command
            status = os.pipe()
            bwrap_at = command.index(self.tools["bwrap"])
            command[bwrap_at + 1:bwrap_at + 1] = ["--json-status-fd", str(status[1])]
            cap = output_cap or self.cfg.max_output_kb << 10
            result = await run_limited(command, env=self.environ(env.image, extra), cwd="/", limit_s=limit_s,
                                       output_cap=cap, status_pipe=status)
            if group is not None and group.stats().memory_limit_hit:
                result.stderr.feed(b"\n[sandbox] memory limit of the task reached (sandbox.task_memory_mb)\n")
            return result
        finally:
            if group is not None:
                await group.remove()

    def health(self) -> dict[str, object]:
        return {"image_runtime": self.name, "image_layers": self.layers.mode, "image_cgroups": self.cgroups is not None,
                **self.cache.stats()}
