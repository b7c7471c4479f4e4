"""Fetching an image from an OCI registry into an OCI layout (skopeo), and unpacking it to a root filesystem (umoci).

Both tools run as children that die with the executor (`setpriv --pdeathsig KILL`): an executor killed half way
through a pull must not leave a skopeo writing into a folder that the next executor is about to sweep.
Pulls are bounded (`max_in_flight`), spaced (`rate_per_min`, a token bucket: the hub limits anonymous pulls) and
retried with exponential backoff when the registry says so (429, 5xx, connection reset). A missing image is never
retried: it is reported at once, naming the image.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from fleet.spawn import guarded
from services.sandbox.process import kill_and_reap

log = logging.getLogger(__name__)
_TOOL_TIMEOUT_S = 3600.0
_MISSING = ("manifest unknown", "name unknown", "not found", "no such image", "repository does not exist",
            "requested access to the resource is denied")
_TRANSIENT = ("toomanyrequests", "too many requests", "429", "503", "502", "500 internal", "connection reset",
              "connection refused", "i/o timeout", "tls handshake timeout", "eof", "temporary failure")


class PullError(RuntimeError):
    """An image could not be obtained or unpacked: an infrastructure failure, never the patch's. Names the image."""

    def __init__(self, image: str, message: str, *, missing: bool = False) -> None:
        super().__init__(f"image {image}: {message}")
        self.image = image
        self.missing = missing


def normalize(image: str, registry: str) -> str:
    """`name[:tag]` -> `registry/name:tag`; a name whose first part is a host (has `.` or `:`) keeps its own."""
    if not image or any(c.isspace() for c in image) or image.startswith("-"):
        raise ValueError(f"invalid image name {image!r}")
    first, _, rest = image.partition("/")
    has_host = bool(rest) and ("." in first or ":" in first or first == "localhost")
    name = image if has_host or not registry else f"{registry.rstrip('/')}/{image}"
    last = name.rsplit("/", 1)[-1]
    if "@" not in last and ":" not in last:
        name += ":latest"
    return name


@dataclass(frozen=True)
class PullOptions:
    source: str = "docker"
    """skopeo transport of images: `docker` (a registry) or `docker-daemon` (the local engine's images)."""
    tls_verify: bool = True
    max_in_flight: int = 4
    rate_per_min: float = 60.0
    retries: int = 4
    backoff_s: float = 2.0


async def _tool(argv: list[str], timeout_s: float = _TOOL_TIMEOUT_S) -> tuple[int, str]:
    """(exit code, stderr+stdout tail) of a tool that dies with this process."""
    argv, hook = guarded(argv, death_signal=signal.SIGKILL)
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT, preexec_fn=hook)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except BaseException:
        await kill_and_reap(proc)
        raise
    return proc.returncode or 0, out.decode(errors="replace")[-2000:]


class _Bucket:
    """Token bucket: at most `rate_per_min` pull starts a minute, with a burst of `max(1, rate/6)`."""

    def __init__(self, rate_per_min: float) -> None:
        self.rate = rate_per_min / 60.0
        self.capacity = max(1.0, rate_per_min / 6.0)
        self.tokens = self.capacity
        self.stamp = time.monotonic()
        self.lock = asyncio.Lock()

    async def take(self) -> None:
        async with self.lock:
            while True:
                now = time.monotonic()
                self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
                self.stamp = now
                if self.tokens >= 1.0:
                    self.tokens -= 1.0
                    return
                await asyncio.sleep((1.0 - self.tokens) / self.rate)


class Puller:
    """skopeo + umoci behind a concurrency bound, a rate limit and a retry policy."""

    def __init__(self, opts: PullOptions) -> None:
        self.opts = opts
        self._slots = asyncio.Semaphore(opts.max_in_flight)
        self._bucket = _Bucket(opts.rate_per_min)
        self.in_flight = 0
        self.pulls = 0
        self.retried = 0

    def _source(self, ref: str) -> str:
        return f"{self.opts.source}:{ref}" if self.opts.source == "docker-daemon" else f"docker://{ref}"

    async def fetch(self, ref: str, layout: Path, tag: str = "img") -> None:
        """Copy `ref` into the OCI layout `layout` under `tag` (retrying transient registry errors)."""
        tls = [] if self.opts.source != "docker" else [f"--src-tls-verify={str(self.opts.tls_verify).lower()}"]
        argv = ["skopeo", "copy", "--quiet", *tls, self._source(ref), f"oci:{layout}:{tag}"]
        async with self._slots:
            self.in_flight += 1
            try:
                await self._with_retries(ref, argv)
            finally:
                self.in_flight -= 1
        self.pulls += 1

    async def _with_retries(self, ref: str, argv: list[str]) -> None:
        delay = self.opts.backoff_s
        for attempt in range(self.opts.retries + 1):
            await self._bucket.take()
            code, out = await _tool(argv)
            if code == 0:
                return
            text = out.lower()
            if any(m in text for m in _MISSING):
                raise PullError(ref, f"not found in the registry: {out.strip()[-400:]}", missing=True)
            if attempt == self.opts.retries or not any(t in text for t in _TRANSIENT):
                raise PullError(ref, f"pull failed (skopeo exit {code}): {out.strip()[-400:]}")
            self.retried += 1
            log.warning("pull of %s failed (%s), retrying in %.1f s", ref, out.strip()[-200:], delay)
            await asyncio.sleep(delay)
            delay *= 2

    @staticmethod
    async def unpack(ref: str, layout: Path, rootfs: Path, tag: str = "img") -> None:
        """Apply the image's layers into `rootfs` (umoci handles whiteouts, hard links and ownership)."""
        code, out = await _tool(["umoci", "raw", "unpack", "--image", f"{layout}:{tag}", str(rootfs)])
        if code != 0:
            raise PullError(ref, f"unpack failed (umoci exit {code}): {out.strip()[-400:]}")


def read_image(layout: Path, tag: str = "img") -> tuple[str, list[str], dict[str, object]]:
    """(manifest digest, layer digests, image config `config` object) of `tag` in an OCI layout."""
    index = json.loads((layout / "index.json").read_text())
    for desc in index.get("manifests", []):
        if desc.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            digest = str(desc["digest"])
            break
    else:
        raise ValueError(f"{layout}: no tag {tag!r}")
    manifest = json.loads(_blob(layout, digest).read_text())
    layers = [str(layer["digest"]) for layer in manifest.get("layers", [])]
    config = json.loads(_blob(layout, manifest["config"]["digest"]).read_text())
    return digest, layers, dict(config.get("config") or {})


def _blob(layout: Path, digest: str) -> Path:
    algo, _, hexpart = digest.partition(":")
    return layout / "blobs" / algo / hexpart
