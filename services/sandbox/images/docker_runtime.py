"""`sandbox.runtime: docker`: one container per task through the Docker API, the same eval contract as bwrap-image.

The container runs the image with networking disabled, memory, pids and rlimits (`ulimits`) from the sandbox
config, idling (`sleep infinity`) while the contract's steps run in it with `exec`, the way the SWE-bench harness
drives its containers; it is removed when the task ends. Images missing from the engine are pulled through it
(from `sandbox.image_registry`). Every container carries the labels `grpo-fleet.sandbox=1` and
`grpo-fleet.owner=<executor id>`, and the executor holds a flock on `/tmp/.grpo-docker-<id>.lock`; `start()`
removes the containers of owners whose lock is free (an executor killed with SIGKILL leaves none behind).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import logging
import os
import tarfile
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fleet.config.infra import SandboxConfig
from fleet.contracts.swe_eval import WORKDIR
from services.sandbox.images.cache import CachedImage
from services.sandbox.images.pull import PullError
from services.sandbox.images.runtime import IO_DIR, ImageEnv
from services.sandbox.process import RunResult, TailBuffer

log = logging.getLogger(__name__)
_LABEL, _OWNER = "grpo-fleet.sandbox", "grpo-fleet.owner"
_LOCKS = "/tmp"


def _lock_path(owner: str) -> str:
    return os.path.join(_LOCKS, f".grpo-docker-{owner}.lock")


class DockerEnv:
    def __init__(self, runtime: DockerRuntime, ref: str, container: Any) -> None:
        self.runtime, self.ref, self.container = runtime, ref, container
        self.image: CachedImage | None = None
        self._pending: dict[str, str] = {}

    def put(self, name: str, text: str) -> None:
        self._pending[name] = text  # uploaded before the next exec (put_archive is a blocking HTTP call)

    def _upload(self) -> None:
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w") as tar:
            for name, text in self._pending.items():
                raw = text.encode()
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(raw), 0o644
                tar.addfile(info, io.BytesIO(raw))
        self.container.put_archive(IO_DIR, data.getvalue())
        self._pending.clear()

    async def exec(self, argv: list[str], *, limit_s: float, output_cap: int | None = None,
                   env: dict[str, str] | None = None, workdir: str = WORKDIR) -> RunResult:
        if self._pending:
            await asyncio.to_thread(self._upload)
        cap = output_cap or self.runtime.cfg.max_output_kb << 10
        return await self.runtime.run_in(self, argv, limit_s=limit_s, cap=cap, extra=env or {}, workdir=workdir)


class DockerRuntime:
    name = "docker"

    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg = cfg
        self.owner = uuid.uuid4().hex[:16]
        self.client: Any = None
        self._lock_fd: int | None = None
        self.containers = 0
        self.pulls_in_flight = 0

    async def start(self) -> None:
        import docker  # the SDK swebench also uses; imported only for this runtime

        try:
            self.client = docker.DockerClient(base_url=self.cfg.docker_url) if self.cfg.docker_url \
                else docker.from_env()
            await asyncio.to_thread(self.client.ping)
        except Exception as exc:
            raise RuntimeError(f"no Docker engine answers ({self.cfg.docker_url or 'DOCKER_HOST'}): {exc}") from exc
        self._lock_fd = os.open(_lock_path(self.owner), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        removed = await asyncio.to_thread(self.sweep)
        if removed:
            log.info("removed %d containers left by killed executors", removed)

    def sweep(self) -> int:
        """Remove sandbox containers whose executor is gone (its lock is free)."""
        removed = 0
        for container in self.client.containers.list(all=True, filters={"label": _LABEL}):
            owner = container.labels.get(_OWNER, "")
            if owner == self.owner or not _owner_dead(owner):
                continue
            with contextlib.suppress(Exception):
                container.remove(force=True)
                removed += 1
        return removed

    async def close(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_lock_path(self.owner))
            os.close(self._lock_fd)
            self._lock_fd = None
        if self.client is not None:
            self.client.close()

    def _ensure_image(self, ref: str) -> None:
        import docker.errors

        try:
            self.client.images.get(ref)
            return
        except docker.errors.ImageNotFound:
            pass
        self.pulls_in_flight += 1
        try:
            self.client.images.pull(ref)
        except docker.errors.NotFound as exc:
            raise PullError(ref, f"not found in the registry: {exc}", missing=True) from exc
        except docker.errors.APIError as exc:
            raise PullError(ref, f"pull through the Docker engine failed: {exc}") from exc
        finally:
            self.pulls_in_flight -= 1

    def _create(self, ref: str) -> Any:
        from docker.types import Ulimit

        cfg = self.cfg
        container = self.client.containers.create(
            ref, command=["sleep", "infinity"], detach=True, network_disabled=True, working_dir=WORKDIR,
            labels={_LABEL: "1", _OWNER: self.owner}, mem_limit=cfg.memory_mb << 20, pids_limit=cfg.max_processes,
            ulimits=[Ulimit(name="cpu", soft=cfg.cpu_s, hard=cfg.cpu_s + 5),
                     Ulimit(name="fsize", soft=cfg.max_file_mb << 20, hard=cfg.max_file_mb << 20),
                     Ulimit(name="core", soft=0, hard=0)],
            tmpfs={"/tmp": f"size={cfg.tmpfs_mb}m"})
        container.start()
        container.exec_run(["mkdir", "-p", IO_DIR])
        return container

    @contextlib.asynccontextmanager
    async def environment(self, ref: str) -> AsyncIterator[ImageEnv]:
        import docker.errors

        await asyncio.to_thread(self._ensure_image, ref)
        try:
            container = await asyncio.to_thread(self._create, ref)
        except docker.errors.APIError as exc:
            raise PullError(ref, f"container did not start: {exc}") from exc
        self.containers += 1
        try:
            yield DockerEnv(self, ref, container)
        finally:
            self.containers -= 1
            with contextlib.suppress(Exception):
                await asyncio.to_thread(container.remove, force=True)

    async def run_in(self, env: DockerEnv, argv: list[str], *, limit_s: float, cap: int, extra: dict[str, str],
                     workdir: str) -> RunResult:
        api = self.client.api
        t0 = time.monotonic()
        exec_id = await asyncio.to_thread(api.exec_create, env.container.id, argv, workdir=workdir,
                                          environment=extra or None)
        out, err = TailBuffer(cap), TailBuffer(cap)
        timed_out = False
        try:
            stdout, stderr = await asyncio.wait_for(asyncio.to_thread(api.exec_start, exec_id, demux=True), limit_s)
            out.feed(stdout or b"")
            err.feed(stderr or b"")
        except TimeoutError:
            timed_out = True
            with contextlib.suppress(Exception):
                await asyncio.to_thread(env.container.kill)  # the run is over: the whole container goes
        code = None if timed_out else (await asyncio.to_thread(api.exec_inspect, exec_id)).get("ExitCode")
        return RunResult(code, timed_out, True, out, err, time.monotonic() - t0)

    def health(self) -> dict[str, object]:
        return {"image_runtime": self.name, "containers": self.containers, "pulls_in_flight": self.pulls_in_flight}


def _owner_dead(owner: str) -> bool:
    try:
        fd = os.open(_lock_path(owner), os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True
