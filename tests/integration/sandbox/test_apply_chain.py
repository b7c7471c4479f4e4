"""A host task's patch goes through SWE-bench's apply chain (`git apply`, ..., `patch --batch --forward --fuzz=5`),
as SWE-bench's harness and the sandbox's image tasks apply a prediction: a hunk whose context is a little off is
graded on its tests, not scored `not_applied`. The shapes are the ones a model writes (one line of context, the
function's `def` line given as the line before a change that sits under a docstring)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from sandbox_helpers import CalcRepo, git

from services.sandbox.executor import Executor
from services.sandbox.workspace import swebench_apply_chain

# The changed lines are right; the first hunk's context line is `def neg(x):`, which is in the file but not above
# `return a - b`. git apply refuses it; patch finds the hunk with fuzz 1.
OFF_CONTEXT = """diff --git a/calc/core.py b/calc/core.py
--- a/calc/core.py
+++ b/calc/core.py
@@ -1,2 +1,2 @@
 def neg(x):
-    return a - b
+    return a + b
@@ -5,2 +5,2 @@
 def mul(a, b):
-    return a + b
+    return a * b
"""


def test_the_chain_is_swebenchs_own() -> None:
    chain = swebench_apply_chain()
    assert chain[0][:2] == ("git", "apply") and chain[-1][0] == "patch" and "--fuzz=5" in chain[-1]


def test_git_apply_alone_refuses_the_off_context_patch(calc_repo: CalcRepo, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    git(calc_repo.path, "worktree", "add", "-q", "--detach", str(tree), calc_repo.base)
    (tmp_path / "p.diff").write_text(OFF_CONTEXT)
    assert subprocess.run(["git", "-C", str(tree), "apply", "--check", str(tmp_path / "p.diff")],
                          capture_output=True).returncode != 0


async def test_a_hunk_with_an_off_context_line_applies_with_fuzz_and_resolves(executor: Executor,
                                                                              calc_repo: CalcRepo) -> None:
    v = await executor.run(calc_repo.spec(OFF_CONTEXT))
    assert (v.status, v.patch_applied, v.resolution) == ("completed", True, "FULL")


async def test_a_patch_that_applies_only_in_part_is_not_applied(executor: Executor, calc_repo: CalcRepo) -> None:
    # patch writes the first hunk and rejects the second (its removed line is nowhere in the file): the tree is
    # reset, the reverse check fails, and git's own message is the one the policy reads.
    half = OFF_CONTEXT.replace("-    return a + b\n+    return a * b", "-    return a ** b\n+    return a * b")
    v = await executor.run(calc_repo.spec(half))
    assert (v.status, v.patch_applied, v.resolution) == ("not_applied", False, "NO")
    assert "patch does not apply" in v.error and "calc/core.py" in v.error and not v.is_infra_failure


async def test_a_fuzzed_patch_is_still_refused_when_it_touches_a_test(executor: Executor,
                                                                      calc_repo: CalcRepo) -> None:
    tamper = """diff --git a/tests/test_core.py b/tests/test_core.py
--- a/tests/test_core.py
+++ b/tests/test_core.py
@@ -5,2 +5,2 @@
 import os
-    assert add(2, 3) == 5
+    assert True
"""
    v = await executor.run(calc_repo.spec(tamper))
    assert v.status == "refused" and "tests/test_core.py" in v.error


def test_only_a_plain_unified_diff_may_reach_gnu_patch(calc_repo: CalcRepo) -> None:
    from services.sandbox.workspace import plain_text_diff

    assert plain_text_diff(calc_repo.gold) and plain_text_diff(calc_repo.test_patch) and plain_text_diff(OFF_CONTEXT)
    moved = calc_repo.diff({"calc/core.py": None, "calc/base.py": "x = 1\n"})  # a file deleted, one created
    assert "deleted file mode 100644" in moved and "new file mode 100644" in moved and plain_text_diff(moved)
    # What patch reads and git does not: an ed script found by its Index: line, a context diff, a normal diff.
    assert not plain_text_diff(OFF_CONTEXT + "Index: a/calc/core.py\n1c\nimport os; os.system('id')\n.\n")
    assert not plain_text_diff("*** calc/core.py\n--- calc/core.py\n***************\n*** 1,2 ****\n")
    assert not plain_text_diff("2c2\n<     return a - b\n---\n>     return a + b\n")
    # A symlink or a binary file: git's alone to write.
    link = calc_repo.diff({}, symlinks={"calc/link": "/etc/passwd"})
    assert "new file mode 120000" in link and not plain_text_diff(link)
    assert not plain_text_diff("diff --git a/x.bin b/x.bin\nnew file mode 100644\nGIT binary patch\nliteral 3\n")


async def test_a_patch_carrying_an_ed_script_is_judged_by_git_alone(executor: Executor, calc_repo: CalcRepo) -> None:
    # Given to patch, the unified part applies with fuzz and the ed script then replaces line 1 (checked by hand:
    # `import os` lands there). The whole is not a plain diff, so patch never sees it.
    v = await executor.run(calc_repo.spec(OFF_CONTEXT + "Index: a/calc/core.py\n1c\nimport os\n.\n"))
    assert (v.status, v.patch_applied) == ("not_applied", False) and "patch does not apply" in v.error
