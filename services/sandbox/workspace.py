"""One task's working tree: materialised from a local repository at `base_commit`, patched, handed to the sandbox.

The tree borrows the source repository's objects through `objects/info/alternates` (no copy, no refs: ~20 ms
whatever the repository's size or number of refs). Its `.git` is removed before the tests run: the shared object
store holds every other commit of the repository, fixes included, and code under test must not be able to read them.
All git commands run here, as the executor's user, before the tree is handed to the sandbox's uid.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import shlex
import stat
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from services.sandbox.fstree import MNT_DETACH, libc, read_regular, remove_path, remove_tree, walk_tree
from services.sandbox.gitcmd import GitResult, git, parse_numstat, rename_sources, run_tool

log = logging.getLogger(__name__)


class InfraError(RuntimeError):
    """The executor could not do its job (repo, disk, git, sandbox start): reported as `infra_error`."""


class PatchError(Exception):
    """The agent's patch is malformed or does not apply (a verdict, `not_applied`)."""


class TreeFull(PatchError):
    """The tree's size-limited filesystem is full: the agent's patch made it so (a verdict, `not_applied`)."""


@dataclass(frozen=True)
class TreeLimits:
    """A tree on its own tmpfs (`size_mb`, `files` inodes), and the rlimits `git apply` runs under (a small binary
    patch can inflate to gigabytes)."""

    size_mb: int
    files: int
    apply_prefix: tuple[str, ...] = ()


@cache
def swebench_apply_chain() -> tuple[tuple[str, ...], ...]:
    """swebench's `GIT_APPLY_CMDS` (git apply, --3way, --reject, then `patch --batch --forward --fuzz=5 -p1 -i`),
    each as argv awaiting the patch file's path: SWE-bench's own harness applies a prediction this way."""
    from swebench.harness.run_evaluation import GIT_APPLY_CMDS

    return tuple(tuple(shlex.split(command)) for command in GIT_APPLY_CMDS)


_DIFF_LINE = re.compile(
    r"(diff --git |index |--- |\+\+\+ |@@ |[ +\-\\]|$|new file mode 100|deleted file mode 100|old mode 100|"
    r"new mode 100|similarity index |dissimilarity index |rename from |rename to |copy from |copy to )")


def plain_text_diff(text: str) -> bool:
    """Whether every line of `text` belongs to a unified diff of regular files: what may reach GNU `patch`, which
    unlike git also reads ed scripts (found by an `Index:` line; CVE-2018-1000156 ran their shell commands),
    context and normal diffs, symlinks and binary patches. A patch with anything else is judged by git alone."""
    return all(_DIFF_LINE.match(line) for line in text.splitlines())


def _patch_error(result: GitResult) -> PatchError:
    return PatchError(result.err.strip()[-2000:] or f"patch does not apply (git exit {result.code})")


def _raise_if_disk(err: str) -> None:
    if "No space left" in err or "Disk quota exceeded" in err:
        raise InfraError(f"disk full: {err.strip()[-300:]}")


class Workspace:
    """`root/` holds patch files; `root/tree/` is the working tree (the only thing the sandbox can write)."""

    def __init__(self, root: Path, limits: TreeLimits | None = None) -> None:
        self.root = root
        self.tree = root / "tree"
        self.commit = ""
        self.limits = limits
        self._mounted = False

    def _mount(self) -> None:
        """`root` becomes a tmpfs of `limits.size_mb`: checkout, patches and test writes all count against it."""
        assert self.limits is not None
        opts = f"size={self.limits.size_mb}m,nr_inodes={self.limits.files},mode=0711".encode()
        if libc().mount(b"tmpfs", str(self.root).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts) != 0:
            code = ctypes.get_errno()
            raise InfraError(f"cannot mount the tree's tmpfs on {self.root}: {os.strerror(code)}")
        self._mounted = True

    async def checkout(self, repo: Path, base_commit: str) -> str:
        """Materialise `repo`@`base_commit` in `tree`; returns the full commit id."""
        self.root.mkdir(mode=0o711)
        if self.limits is not None:
            self._mount()
        self.commit = await _resolve_commit(repo, base_commit)
        _init_repository(self.tree, _git_dir(repo) / "objects")
        co = await git("checkout", "--quiet", "--detach", self.commit, cwd=self.tree)
        _raise_if_disk(co.err)
        if co.code != 0:
            raise InfraError(f"checkout of {self.commit} failed: {co.err.strip()[-300:]}")
        return self.commit

    def _patch_file(self, name: str, text: str) -> Path:
        path = self.root / name
        # git apply rejects a last hunk without its final newline ("corrupt patch").
        try:
            # surrogateescape: bytes that JSON carried as lone surrogates go back to the bytes they were.
            data = (text if text.endswith("\n") else text + "\n").encode("utf-8", "surrogateescape")
        except UnicodeEncodeError as exc:
            raise PatchError(f"the patch is not encodable text: {exc.reason} at offset {exc.start}") from exc
        try:
            path.write_bytes(data)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT) and self._mounted:
                raise TreeFull(f"the patch does not fit in the task's {self._size_note()}") from exc
            raise
        return path

    def _size_note(self) -> str:
        return f"{self.limits.size_mb} MB tree" if self.limits else "tree"

    async def patch_paths(self, name: str, text: str) -> list[str]:
        """Every path `text` would touch, as git itself reads the patch (raises PatchError if it cannot)."""
        result = await git("apply", "--numstat", "-z", str(self._patch_file(name, text)), cwd=self.tree)
        if result.code != 0:
            raise PatchError(result.err.strip()[-2000:] or "malformed patch")
        return sorted({*parse_numstat(result.out), *rename_sources(text)})

    async def _stage_all(self) -> None:
        """Every file of the tree in git's index, ignored ones included."""
        added = await git("add", "--all", "--force", ".", cwd=self.tree)
        _raise_if_disk(added.err)
        if added.code != 0:
            raise InfraError(f"git add failed: {added.err.strip()[-300:]}")

    async def changed_paths(self) -> list[str]:
        """Every path that differs from base_commit, renames split in two: what a patch actually did."""
        await self._stage_all()
        diff = await git("diff", "--cached", "--name-only", "-z", "--no-renames", self.commit, cwd=self.tree)
        if diff.code != 0:
            raise InfraError(f"git diff failed: {diff.err.strip()[-300:]}")
        return [p for p in diff.out.split("\0") if p]

    async def tree_id(self) -> str:
        """git's id of the tree as it is now: every file's path, content and mode (links as links). Two trees with the
        same id hold the same files; a patch writes nothing git does not see (it refuses paths inside `.git`)."""
        await self._stage_all()
        written = await git("write-tree", cwd=self.tree)
        _raise_if_disk(written.err)
        if written.code != 0:
            raise InfraError(f"git write-tree failed: {written.err.strip()[-300:]}")
        return written.out.strip()

    async def base_text(self, rel: str) -> str | None:
        """A file's text at base_commit (None if it did not exist)."""
        shown = await git("cat-file", "blob", f"{self.commit}:{rel}", cwd=self.tree)
        return shown.out if shown.code == 0 else None

    async def apply(self, name: str, text: str) -> None:
        prefix = self.limits.apply_prefix if self.limits else ()
        result = await git("apply", "--whitespace=nowarn", str(self._patch_file(name, text)), cwd=self.tree,
                           prefix=prefix)
        self._raise_if_full(result)
        if result.code != 0:
            raise _patch_error(result)

    def _raise_if_full(self, result: GitResult) -> None:
        """TreeFull when an apply filled the task's tree (the patch's doing, a verdict); InfraError when the host's
        disk is full."""
        if self._mounted and any(m in result.err + result.out for m in ("No space left", "Disk quota")):
            raise TreeFull(f"the patch does not fit in the task's {self._size_note()}")
        _raise_if_disk(result.err)

    async def apply_as_harness(self, name: str, text: str) -> None:
        """The agent's patch, through SWE-bench's apply chain (`swebench_apply_chain`, as image tasks apply it):
        each command in turn on a tree reset after the one before failed, then the reverse check SWE-bench ends on;
        `patch` only for a plain unified diff (`plain_text_diff`). Applied more strictly, a patch SWE-bench grades on
        its tests (a hunk whose context line is a little off applies there with `patch --fuzz=5`) would be scored
        `not_applied`; more loosely, one it refuses would be credited. The error kept is the first command's (git's,
        naming the hunk that failed), as the policy reads it."""
        prefix = self.limits.apply_prefix if self.limits else ()
        path = str(self._patch_file(name, text))
        first: GitResult | None = None
        touched = False  # whether a failed command may have left part of the patch in the tree
        for argv in swebench_apply_chain():
            if argv[0] != "git" and not plain_text_diff(text):
                continue  # read only once git failed: most patches never get here
            if touched:
                await self._reset_tree()
            if argv[0] == "git":  # with the executor's git options (no host config, hooks or fsmonitor)
                result = await git(*argv[1:], path, cwd=self.tree, prefix=prefix)
            else:
                result = await run_tool(*argv, path, cwd=self.tree, prefix=prefix)
            self._raise_if_full(result)
            if result.code == 0:
                return
            first = first or result
            # A plain `git apply` applies all or nothing; --3way leaves conflicts, --reject and `patch` their hunks.
            touched = argv[:2] != ("git", "apply") or bool({"--3way", "--reject"} & set(argv))
        if (await git("apply", "--check", "--reverse", path, cwd=self.tree, prefix=prefix)).code == 0:
            return  # the chain left the patch wholly applied though every command exited non-zero
        if touched:
            await self._reset_tree()
        assert first is not None
        raise _patch_error(first)

    async def _reset_tree(self) -> None:
        """The tree back to base_commit after a failed attempt (`patch` leaves hunks, `.rej` and `.orig` files)."""
        for args in (("checkout", "--quiet", "--force", self.commit, "--", "."), ("clean", "-q", "-f", "-d", "-x")):
            result = await git(*args, cwd=self.tree)
            _raise_if_disk(result.err)
            if result.code != 0:
                raise InfraError(f"resetting the tree after a failed apply: git {args[0]}: {result.err.strip()[-300:]}")

    async def restore_pristine(self, paths: list[str]) -> None:
        """Put `paths` back as they are at base_commit (absent ones removed), whatever the patch made of them or of
        their folders: a link or a file where a folder was is removed first, so nothing is written through it."""
        if not paths:
            return
        tracked = await git("ls-tree", "-r", "-z", "--name-only", self.commit, "--", *paths, cwd=self.tree)
        at_base = set(filter(None, tracked.out.split("\0")))
        for rel in paths:
            if _clear_parents(self.tree, rel):
                remove_path(self.tree / rel)
        if at_base:
            restore = await git("checkout", self.commit, "--", *sorted(at_base), cwd=self.tree)
            if restore.code != 0:
                if self._mounted and "No space left" in restore.err:
                    raise TreeFull(f"the agent's files leave no room in the task's {self._size_note()}")
                raise InfraError(f"restoring test files failed: {restore.err.strip()[-300:]}")

    async def force_apply(self, name: str, text: str, paths: list[str]) -> None:
        """Apply the test patch over whatever the agent did to its files: they go back to base_commit first."""
        await self.restore_pristine(paths)
        try:
            await self.apply(name, text)
        except TreeFull:
            raise
        except PatchError as exc:
            raise InfraError(f"the task's test_patch does not apply at {self.commit[:12]}: {exc}") from exc

    def read_text(self, rel: str) -> str | None:
        """A small text file of the tree (None if absent, not a regular file, or over 4 MiB)."""
        path = self.tree / rel
        try:
            return read_regular(path, 4 << 20).decode(errors="replace")
        except OSError:
            return None

    def seal(self, uid: int | None) -> None:
        """Drop git metadata and hand the tree to the sandbox uid (lchown: symlinks are never followed)."""
        remove_path(self.tree / ".git")
        if uid is None:
            return
        os.lchown(self.tree, uid, uid)
        for path in walk_tree(self.tree):
            os.lchown(path, uid, uid)

    def remove(self) -> None:
        if self._mounted:
            # Lazy: a file still open elsewhere (never the sandbox's: its processes are gone) cannot keep it busy.
            libc().umount2(str(self.root).encode(), MNT_DETACH)
            self._mounted = False
        remove_tree(self.root)


_MS_NOSUID, _MS_NODEV = 2, 4


# Full commit ids already resolved, per repository: an object id names the same commit forever, so each is asked of
# git once per executor process (a git process is ~3 ms of a task's fixed cost).
_KNOWN_COMMITS: set[tuple[str, str]] = set()
_MAX_KNOWN = 100_000


async def _resolve_commit(repo: Path, base_commit: str) -> str:
    """The full id of `base_commit` in `repo` (InfraError if it names no commit)."""
    git_dir = _git_dir(repo)
    if (str(git_dir), base_commit) in _KNOWN_COMMITS:
        return base_commit
    found = await git("--git-dir", str(git_dir), "rev-parse", "--verify", "--quiet", f"{base_commit}^{{commit}}")
    if found.code != 0:
        raise InfraError(f"base_commit {base_commit!r} is not a commit of {repo}")
    commit = found.out.strip()
    if commit == base_commit and len(_KNOWN_COMMITS) < _MAX_KNOWN:
        _KNOWN_COMMITS.add((str(git_dir), commit))
    return commit


def _init_repository(tree: Path, objects: Path) -> None:
    """What `git init --template=` makes (one git process less per task), plus `objects` as the alternate store."""
    git_dir = tree / ".git"
    for sub in ("objects/info", "objects/pack", "refs/heads", "refs/tags"):
        (git_dir / sub).mkdir(parents=True)
    (git_dir / "HEAD").write_text("ref: refs/heads/master\n")
    (git_dir / "config").write_text("[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n"
                                    "\tlogallrefupdates = true\n")
    (git_dir / "objects" / "info" / "alternates").write_text(f"{objects}\n")


def _git_dir(repo: Path) -> Path:
    return repo / ".git" if (repo / ".git").is_dir() else repo


def _clear_parents(tree: Path, rel: str) -> bool:
    """Remove the first parent of `rel` that is not a real folder (a link, a file); True if every parent is one."""
    current = tree
    for part in Path(rel).parts[:-1]:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return False
        if not stat.S_ISDIR(mode):
            remove_path(current)
            return False
    return True
