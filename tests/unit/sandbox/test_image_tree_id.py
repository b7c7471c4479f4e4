"""The tree id an image task is cached under (`contract.tree_id_script`), run by the host's git on a real
repository: the files the tests will see, the patch's ignored files included, and the repository's index untouched."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from services.sandbox.images.contract import tree_id_script

ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t.invalid", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@t.invalid", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
       "TMPDIR": "/tmp"}


def _repo(path: Path) -> Path:
    path.mkdir()
    (path / ".gitignore").write_text("build/\n")
    (path / "mod.py").write_text("x = 1\n")
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run(["git", *argv], cwd=path, env=ENV, check=True)
    return path


def _tree(repo: Path, forced: list[str]) -> str:
    out = subprocess.run(["/bin/sh", "-c", tree_id_script(forced, str(repo))], env=ENV, capture_output=True,
                         text=True, check=True).stdout
    return next(line.split()[1] for line in out.splitlines() if line.startswith("GRPO_TREE "))


def test_the_tree_id_follows_the_files_and_leaves_the_index_alone(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "r")
    index = (repo / ".git" / "index").read_bytes()
    base = _tree(repo, [])
    assert base == subprocess.run(["git", "rev-parse", "HEAD^{tree}"], cwd=repo, env=ENV, capture_output=True,
                                  text=True, check=True).stdout.strip()
    (repo / "mod.py").write_text("x = 2\n")
    (repo / "new.py").write_text("y = 1\n")
    changed = _tree(repo, ["mod.py", "new.py"])
    assert changed != base
    assert _tree(repo, []) == changed  # untracked, not ignored: in the tree whether the patch names it or not
    assert (repo / ".git" / "index").read_bytes() == index


def test_an_ignored_file_counts_only_where_the_patch_wrote_it(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "r")
    base = _tree(repo, [])
    (repo / "build").mkdir()
    (repo / "build" / "conftest.py").write_text("import os\n")
    assert _tree(repo, []) == base  # what the image left ignored is not the patch's doing
    assert _tree(repo, ["build/conftest.py"]) != base
    assert _tree(repo, ["gone.py"]) == base  # a path the patch deleted, or never made, is skipped
