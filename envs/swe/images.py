"""Building small SWE-bench-style instance images locally, daemonless (debootstrap, umoci, skopeo).

An image has two layers, as SWE-bench's do in spirit: a base (Debian bookworm minbase with git, patch, python3 and
pytest: the test environment) shared by every instance, and an instance layer holding `/testbed`, a git repository
at `base_commit` whose history ends there. The base root filesystem is built once with debootstrap and kept as a
tarball (`base_tarball`, ~1 minute the first time); every image after that is a tar of /testbed and one umoci call.
`push` copies an image from the OCI layout to a registry (skopeo), from where executors pull it as from the hub.
"""

from __future__ import annotations

import fcntl
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

BASE_PACKAGES = ("git", "patch", "python3", "python3-pytest")
DEBIAN_MIRROR = "http://deb.debian.org/debian"
_GIT_ENV = {"GIT_AUTHOR_NAME": "swe", "GIT_AUTHOR_EMAIL": "swe@localhost", "GIT_COMMITTER_NAME": "swe",
            "GIT_COMMITTER_EMAIL": "swe@localhost", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
_SLIM = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "var/cache/apt", "var/lib/apt/lists")


def default_base_cache() -> Path:
    root = Path("/var/cache/grpo-fleet") if os.geteuid() == 0 else Path.home() / ".cache" / "grpo-fleet"
    return root / "base"


def _run(argv: list[str], **kw: object) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if done.returncode != 0:
        why = (done.stderr or done.stdout)[-800:]
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed ({done.returncode}): {why}")
    return str(done.stdout)


def base_tarball(cache: Path | None = None, mirror: str = DEBIAN_MIRROR) -> Path:
    """The base root filesystem as a tar, built with debootstrap on first use (root only) and cached."""
    cache = cache or default_base_cache()
    cache.mkdir(parents=True, exist_ok=True)
    tar = cache / f"bookworm-minbase-{'-'.join(BASE_PACKAGES)}.tar"
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test sessions build it once
        if tar.is_file():
            return tar
        if shutil.which("debootstrap") is None or os.geteuid() != 0:
            raise RuntimeError("building the base image needs root and debootstrap (apt-get install debootstrap)")
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            rootfs = Path(tmp) / "rootfs"
            _run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", "bookworm",
                  str(rootfs), mirror], timeout=1200)
            for sub in _SLIM:
                shutil.rmtree(rootfs / sub, ignore_errors=True)
            _run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", f"{tar}.tmp", "."])
            os.replace(f"{tar}.tmp", tar)
    return tar


def make_testbed(source_repo: Path, base_commit: str, dest: Path) -> str:
    """`dest`: a clone of `source_repo` at `base_commit` with no ref, reflog or object past it; returns the commit."""
    _run(["git", "clone", "--quiet", "--no-checkout", "--no-local", str(source_repo), str(dest)], env=_GIT_ENV)
    commit = _run(["git", "-C", str(dest), "rev-parse", f"{base_commit}^{{commit}}"], env=_GIT_ENV).strip()
    _run(["git", "-C", str(dest), "checkout", "--quiet", "-B", "main", commit], env=_GIT_ENV)
    refs = _run(["git", "-C", str(dest), "for-each-ref", "--format=%(refname)"], env=_GIT_ENV).split()
    for ref in refs:
        if ref != "refs/heads/main":
            _run(["git", "-C", str(dest), "update-ref", "-d", ref], env=_GIT_ENV)
    _run(["git", "-C", str(dest), "remote", "remove", "origin"], env=_GIT_ENV)
    _run(["git", "-C", str(dest), "reflog", "expire", "--expire=now", "--all"], env=_GIT_ENV)
    _run(["git", "-C", str(dest), "gc", "--quiet", "--prune=now"], env=_GIT_ENV)
    return commit


def _reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


class OciBuilder:
    """Images in one OCI layout: `base(tar)` once, then `instance(tag, testbed)` per task, then `push(tag, ref)`."""

    def __init__(self, layout: Path) -> None:
        self.layout = layout
        if not (layout / "index.json").is_file():
            _run(["umoci", "init", "--layout", str(layout)])

    def base(self, tarball: Path, tag: str = "base") -> str:
        if tag in _run(["umoci", "ls", "--layout", str(self.layout)]).split():
            return tag
        _run(["umoci", "new", "--image", f"{self.layout}:{tag}"])
        _run(["umoci", "raw", "add-layer", "--image", f"{self.layout}:{tag}", str(tarball)])
        # `python` as SWE-bench's conda images have it (Debian ships only python3): task commands say `python`.
        with tempfile.NamedTemporaryFile(suffix=".tar", dir=self.layout.parent) as layer:
            with tarfile.open(fileobj=layer, mode="w") as tar:
                link = _reset(tarfile.TarInfo("usr/local/bin/python"))
                link.type, link.linkname = tarfile.SYMTYPE, "/usr/bin/python3"
                tar.addfile(link)
            layer.flush()
            _run(["umoci", "raw", "add-layer", "--image", f"{self.layout}:{tag}", layer.name])
        _run(["umoci", "config", "--image", f"{self.layout}:{tag}", "--config.workingdir", "/testbed",
              "--config.env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
              "--config.env", "LANG=C.UTF-8", "--config.cmd", "/bin/bash"])
        return tag

    def instance(self, tag: str, testbed: Path, base: str = "base", extra: dict[str, str] | None = None) -> str:
        """A new tag: `base` plus one layer with `testbed` at /testbed (and `extra` files, path -> text)."""
        with tempfile.NamedTemporaryFile(suffix=".tar", dir=self.layout.parent) as layer:
            with tarfile.open(fileobj=layer, mode="w") as tar:
                tar.add(testbed, arcname="testbed", filter=_reset)
                for path, text in (extra or {}).items():
                    data = text.encode()
                    info = _reset(tarfile.TarInfo(path.lstrip("/")))
                    info.size, info.mode = len(data), 0o755
                    tar.addfile(info, io.BytesIO(data))
            layer.flush()
            _run(["umoci", "raw", "add-layer", "--image", f"{self.layout}:{base}", "--tag", tag, layer.name])
        return tag

    def push(self, tag: str, ref: str, *, tls_verify: bool = False) -> None:
        _run(["skopeo", "copy", "--quiet", f"--dest-tls-verify={str(tls_verify).lower()}",
              f"oci:{self.layout}:{tag}", f"docker://{ref}"], timeout=600)
