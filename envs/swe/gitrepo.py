"""Deterministic git plumbing on the bare repositories of a task set.

Commits use a fixed identity and date and no user or system git config, so the same tree always gets the same
commit id: task ids and `base_commit`s are reproducible from recipe + seed. Each task's `base_commit` is a
parentless commit holding the buggy tree, so `git log -p` inside a task checkout cannot reveal the fix.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

_FIXED_DATE = "2000-01-01T00:00:00+0000"
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "grpo-fleet",
    "GIT_AUTHOR_EMAIL": "tasks@grpo-fleet.invalid",
    "GIT_AUTHOR_DATE": _FIXED_DATE,
    "GIT_COMMITTER_NAME": "grpo-fleet",
    "GIT_COMMITTER_EMAIL": "tasks@grpo-fleet.invalid",
    "GIT_COMMITTER_DATE": _FIXED_DATE,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
}


class GitError(RuntimeError):
    pass


class BareRepo:
    """A bare repository `{repos_root}/{name}.git`: what the sandbox resolves `embedded://{name}` to."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def git(self, *args: str, input_text: str | None = None, env: dict[str, str] | None = None) -> str:
        full_env = {**os.environ, **_GIT_ENV, **(env or {})}
        proc = subprocess.run(["git", "--git-dir", str(self.path), *args], input=input_text, capture_output=True,
                              text=True, env=full_env, check=False)
        if proc.returncode != 0:
            raise GitError(f"git {' '.join(args[:3])} in {self.path} failed: {proc.stderr.strip()[-1000:]}")
        return proc.stdout

    @classmethod
    def create(cls, path: str | Path) -> BareRepo:
        repo = cls(path)
        repo.path.mkdir(parents=True, exist_ok=False)
        repo.git("init", "--bare", "--quiet")
        repo.git("config", "core.autocrlf", "false")
        return repo

    def commit_directory(self, src: Path, message: str) -> str:
        """Commit every file under `src` (ignore files included) as a parentless commit."""
        with tempfile.TemporaryDirectory() as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            self.git("--work-tree", str(src), "add", "--all", "--force", ".", env=env)
            tree = self.git("write-tree", env=env).strip()
        return self.git("commit-tree", tree, "-m", message).strip()

    def commit_replacing(self, base: str, files: dict[str, str], message: str) -> str:
        """A parentless commit whose tree is `base`'s with `files` (path -> new text) replaced."""
        with tempfile.TemporaryDirectory() as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            self.git("read-tree", base, env=env)
            for path, text in files.items():
                blob = self.git("hash-object", "-w", "--stdin", input_text=text).strip()
                mode = self.file_mode(base, path)
                self.git("update-index", "--cacheinfo", f"{mode},{blob},{path}", env=env)
            tree = self.git("write-tree", env=env).strip()
        return self.git("commit-tree", tree, "-m", message).strip()

    def file_mode(self, commit: str, path: str) -> str:
        out = self.git("ls-tree", commit, "--", path).split()
        return out[0] if out else "100644"

    def show(self, commit: str, path: str) -> str:
        return self.git("show", f"{commit}:{path}")

    def try_show(self, commit: str, path: str) -> str | None:
        try:
            return self.show(commit, path)
        except GitError:
            return None

    def list_files(self, commit: str) -> list[str]:
        return self.git("ls-tree", "-r", "--name-only", commit).splitlines()

    def file_sizes(self, commit: str) -> dict[str, int]:
        """path -> size in bytes of every file (blob) at `commit`."""
        out: dict[str, int] = {}
        for line in self.git("ls-tree", "-r", "-l", "-z", commit).split("\0"):
            meta, _, path = line.partition("\t")
            parts = meta.split()
            if len(parts) == 4 and parts[1] == "blob" and parts[3].isdigit():
                out[path] = int(parts[3])
        return out

    def read_files(self, commit: str, paths: list[str]) -> dict[str, str]:
        """path -> text at `commit` of many files in one `git cat-file --batch` (one process, not one per file);
        files that are not there or not UTF-8 text are left out."""
        request = "".join(f"{commit}:{p}\n" for p in paths).encode()
        proc = subprocess.run(["git", "--git-dir", str(self.path), "cat-file", "--batch"], input=request,
                              capture_output=True, env={**os.environ, **_GIT_ENV}, check=False)
        if proc.returncode != 0:
            raise GitError(f"git cat-file --batch in {self.path} failed: {proc.stderr.decode(errors='replace')[-500:]}")
        data, pos, out = proc.stdout, 0, {}
        for path in paths:
            end = data.index(b"\n", pos)
            header = data[pos:end].split()
            pos = end + 1
            if len(header) != 3:  # "<name> missing"
                continue
            size = int(header[2])
            blob, pos = data[pos:pos + size], pos + size + 1
            try:
                out[path] = blob.decode("utf-8")
            except UnicodeDecodeError:
                continue
        return out

    def diff(self, old: str, new: str) -> str:
        """Unified diff old -> new, in the `diff --git` form SWE-bench patches use."""
        return self.git("diff", "--no-color", "--no-ext-diff", "--no-renames", old, new)

    def set_ref(self, ref: str, commit: str) -> None:
        self.git("update-ref", ref, commit)

    def delete_ref(self, ref: str) -> None:
        self.git("update-ref", "-d", ref)

    def refs(self, prefix: str = "refs/") -> dict[str, str]:
        out = self.git("for-each-ref", "--format=%(refname) %(objectname)", prefix)
        pairs = (line.split(" ", 1) for line in out.splitlines() if line)
        return {name: sha for name, sha in pairs}

    def gc(self) -> None:
        """Drop the objects of rejected candidates; keeps the repository small and its content deterministic."""
        self.git("reflog", "expire", "--expire=now", "--all")
        self.git("gc", "--prune=now", "--quiet")
