"""A real OCI registry on loopback (Debian's docker-registry) and small SWE-bench-style images pushed to it.

The images come from `envs.swe.images`: the cached Debian base plus a `/testbed` layer holding the sandbox tests'
`calc` repository at its base commit, and an eval script of SWE-bench 5's shape.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sandbox_helpers import F2P, P2P, CalcRepo

from envs.swe.images import OciBuilder
from fleet.contracts.sandbox import TaskSpec

# swebench's pytest log parser splits lines on whitespace, so `test_mul[two three]` cannot be graded from a log.
IMAGE_F2P = [t for t in F2P if " " not in t]


@dataclass
class ImageSet:
    registry: str
    repo: CalcRepo
    image: str
    """The well-built instance image (name without the registry)."""
    future_image: str
    """/testbed holds the fix as a later commit on a branch."""
    future_commit: str
    builder: OciBuilder

    def spec(self, patch: str, image: str | None = None, **kw: object) -> TaskSpec:
        files = sorted({t.split("::", 1)[0] for t in [*F2P, *P2P]})
        args: dict[str, object] = {
            "repo_url": "calc", "base_commit": self.repo.base, "patch": patch, "test_patch": self.repo.test_patch,
            "fail_to_pass": IMAGE_F2P, "pass_to_pass": P2P, "timeout": 120.0, "image": image or self.image,
            "eval_script": eval_script(self.repo.base, files, self.repo.test_patch), "log_parser": "parse_log_pytest"}
        args.update(kw)
        return TaskSpec(**args)  # type: ignore[arg-type]


REGISTRY_CONFIG = """version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Registry:
    host: str
    proc: subprocess.Popen[bytes]


@contextlib.contextmanager
def local_registry(root: Path) -> Iterator[Registry]:
    """`docker-registry serve` on 127.0.0.1:<free port>, stopped (by its pid) when the block ends."""
    port = free_port()
    root.mkdir(parents=True, exist_ok=True)
    config = root / "config.yml"
    config.write_text(REGISTRY_CONFIG.format(root=root / "data", port=port))
    proc = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("docker-registry did not start") from None
                time.sleep(0.1)
        yield Registry(f"127.0.0.1:{port}", proc)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def eval_script(base_commit: str, test_files: list[str], test_patch: str) -> str:
    """The shape of a SWE-bench 5 `eval_script` (markers as `:` commands printed by `set -x`)."""
    files = " ".join(test_files)
    return f"""#!/bin/bash
set -uxo pipefail
cd /testbed
git -c safe.directory='*' checkout {base_commit} -- {files} 2>/dev/null || true
git -c safe.directory='*' apply --verbose - <<'EOF_114329324912'
{test_patch.rstrip(chr(10))}
EOF_114329324912
: '>>>>> Start Test Output'
python3 -m pytest -p no:cacheprovider -rA {files}
: '>>>>> End Test Output'
git -c safe.directory='*' checkout {base_commit} -- {files} 2>/dev/null || true
"""


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t.invalid", "GIT_CONFIG_GLOBAL": os.devnull}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def tree_digest(path: Path) -> dict[str, tuple[int, int]]:
    """{relative path: (size, mode)} of a folder: what 'the image is unchanged' compares."""
    out: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for name in (*dirnames, *filenames):
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            out[os.path.relpath(full, path)] = (st.st_size, st.st_mode)
    return out


def scratch(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
