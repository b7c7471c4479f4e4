"""Nothing of the gold patch reaches a prompt: not its files (names, counts, "left out" lists), not its lines.

The row is a princeton-nlp/SWE-bench row as the hub's parquet holds it (astropy__astropy-12907, FAIL_TO_PASS a JSON
string), loaded through the real loader.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from envs.registry import Task
from envs.swe.gitrepo import BareRepo
from envs.swe.loaders import parse_row
from envs.swe.prompt import build_prompt
from envs.swe_agent import SweAgentEnvironment

GOLD_PATCH = """diff --git a/astropy/modeling/separable.py b/astropy/modeling/separable.py
--- a/astropy/modeling/separable.py
+++ b/astropy/modeling/separable.py
@@ -242,7 +242,7 @@ def _cstack(left, right):
         cright = _coord_matrix(right, 'right', noutp)
     else:
         cright = np.zeros((noutp, right.shape[1]))
-        cright[-right.shape[0]:, -right.shape[1]:] = 1
+        cright[-right.shape[0]:, -right.shape[1]:] = right

     return np.hstack([cleft, cright])
"""
TEST_PATCH = """diff --git a/astropy/modeling/tests/test_separable.py b/astropy/modeling/tests/test_separable.py
--- a/astropy/modeling/tests/test_separable.py
+++ b/astropy/modeling/tests/test_separable.py
@@ -28,6 +28,13 @@
 p1 = models.Polynomial1D(1, name='p1')
+cm_4d_expected = (np.array([False, False, True, True]),
"""
STATEMENT = """Modeling's `separability_matrix` does not compute separability correctly for nested CompoundModels
Consider the following model:\r
\r
```python\r
from astropy.modeling import models as m\r
from astropy.modeling.separable import separability_matrix\r
\r
cm = m.Linear1D(10) & m.Linear1D(5)\r
```\r
\r
It's separability matrix as you might expect is a diagonal:\r
\r
```python\r
>>> separability_matrix(cm)\r
array([[ True, False],\r
       [False,  True]])\r
```\r
\r
If I make the model more complex:\r
```python\r
>>> separability_matrix(m.Pix2Sky_TAN() & m.Linear1D(10) & m.Linear1D(5))\r
```\r
Every input and output of the nested compound model is no longer separable.\r
"""
HUB_ROW: dict[str, Any] = {
    "repo": "astropy/astropy",
    "instance_id": "astropy__astropy-12907",
    "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
    "patch": GOLD_PATCH,
    "test_patch": TEST_PATCH,
    "problem_statement": STATEMENT,
    "hints_text": "",
    "created_at": "2022-03-03T15:14:54Z",
    "version": "4.3",
    "FAIL_TO_PASS": json.dumps(["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]",
                                "astropy/modeling/tests/test_separable.py::test_separable[compound_model9-result9]"]),
    "PASS_TO_PASS": json.dumps(["astropy/modeling/tests/test_separable.py::test_coord_matrix"]),
    "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752",
}
SEPARABLE = '''"""Functions to determine if a model is separable."""
import numpy as np

from .core import Model, ModelDefinitionError, CompoundModel


def separability_matrix(transform):
    """Compute the correlation between outputs and inputs."""
    if transform.n_inputs == 1 and transform.n_outputs > 1:
        return np.ones((transform.n_outputs, transform.n_inputs), dtype=np.bool_)
    separable_matrix = _separable(transform)
    return np.where(separable_matrix != 0, True, False)


def _cstack(left, right):
    noutp = _compute_n_outputs(left, right)
    if isinstance(right, Model):
        cright = _coord_matrix(right, 'right', noutp)
    else:
        cright = np.zeros((noutp, right.shape[1]))
        cright[-right.shape[0]:, -right.shape[1]:] = 1

    return np.hstack([cleft, cright])
'''
REPO_FILES = {
    "astropy/modeling/separable.py": SEPARABLE,
    "astropy/modeling/core.py": "class Model:\n    n_inputs = 1\n\n\nclass CompoundModel(Model):\n    pass\n",
    "astropy/units/quantity.py": "class Quantity:\n    unit = None\n",
    "astropy/modeling/tests/test_separable.py": "def test_coord_matrix():\n    pass\n",
}


def gold_paths(patch: str) -> set[str]:
    return set(re.findall(r"^(?:diff --git a/|--- a/|\+\+\+ b/)(\S+)", patch, re.M))


def added_lines(patch: str) -> list[str]:
    return [line[1:].strip() for line in patch.splitlines()
            if line.startswith("+") and not line.startswith("+++") and line[1:].strip()]


def body_lines(patch: str) -> list[str]:
    """Every code line of the patch (context, removed, added) and its hunk headers."""
    return [line[1:].strip() if line[:1] in "+- " else line for line in patch.splitlines()
            if not line.startswith(("diff --git", "--- ", "+++ ")) and line[1:].strip()]


def hub_task(**over: Any) -> Task:
    task, errors = parse_row({**HUB_ROW, **over}, 1, derive_image=True)
    assert task is not None, errors
    return task


def agent_env() -> SweAgentEnvironment:
    return SweAgentEnvironment(system_prompt="Fix the issue in the repository.", repos_root=None)


def local_repo(tmp_path: Path) -> tuple[str, str]:
    src = tmp_path / "astropy"
    for name, text in REPO_FILES.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    repo = BareRepo.create(tmp_path / "astropy.git")
    return f"file://{repo.path}", repo.commit_directory(src, "astropy at d16bfe05")


@pytest.mark.parametrize("context", ["bm25", "bm25_functions", "none"])
def test_a_hub_row_prompt_holds_no_gold_path_and_no_gold_line(chat_tokenizer, context):
    task = hub_task()
    for text in (build_prompt(task, chat_tokenizer, 100_000, context).text,
                 agent_env().build_prompt(task, chat_tokenizer, 100_000).text):
        for path in gold_paths(GOLD_PATCH) | gold_paths(TEST_PATCH):
            assert path not in text or path in STATEMENT
        for line in body_lines(GOLD_PATCH) + body_lines(TEST_PATCH):
            assert line not in text or line in STATEMENT, line
        assert "Files left out" not in text


def test_a_hub_row_names_no_file_when_the_budget_is_tight(chat_tokenizer):
    # The old leak: a hub row has no checkout, so every gold file was "unreadable" and listed as left out.
    task = hub_task()
    bare = build_prompt(task, chat_tokenizer, 100_000, "none")
    r = build_prompt(task, chat_tokenizer, len(bare.token_ids), "bm25")
    assert (r.context_files, r.dropped_files) == ([], []) and r.text == bare.text


def test_a_local_checkout_prompt_is_the_same_whatever_the_gold_patch(tmp_path, chat_tokenizer):
    url, commit = local_repo(tmp_path)
    task = hub_task(repo_url=url, base_commit=commit)
    other_gold = GOLD_PATCH.replace("astropy/modeling/separable.py", "astropy/units/quantity.py")
    variants = [task, hub_task(repo_url=url, base_commit=commit, patch=other_gold),
                hub_task(repo_url=url, base_commit=commit, patch="diff --git a/x b/x\n")]
    full = build_prompt(task, chat_tokenizer, 100_000, "bm25")
    bare = build_prompt(task, chat_tokenizer, 100_000, "none")
    # Budgets from everything fitting down to files being left out (and named) and the statement being cut.
    for budget in (100_000, len(full.token_ids) - 1, len(bare.token_ids) + 40, len(bare.token_ids) - 40):
        prompts = [build_prompt(t, chat_tokenizer, budget, "bm25") for t in variants]
        assert len({(p.text, tuple(p.context_files), tuple(p.dropped_files)) for p in prompts}) == 1, budget
    assert len({agent_env().build_prompt(t, chat_tokenizer, 100_000).text for t in variants}) == 1
    # The statement's words find the module (as they would for a reader of the issue); the fix is not in it.
    assert full.context_files[0] == "astropy/modeling/separable.py"
    assert "astropy/modeling/tests/test_separable.py" not in full.context_files
    for line in added_lines(GOLD_PATCH) + added_lines(TEST_PATCH):
        assert line not in full.text, line


def test_function_context_shows_the_matching_functions_whole_and_labelled(tmp_path, chat_tokenizer):
    url, commit = local_repo(tmp_path)
    task = hub_task(repo_url=url, base_commit=commit)
    r = build_prompt(task, chat_tokenizer, 100_000, "bm25_functions")
    # Functions, not files: each labelled with its file, first line and qualified name, ranked by the statement.
    assert r.context_files and all(re.fullmatch(r"[\w/]+\.py:\d+ [\w.]+", label) for label in r.context_files)
    assert r.context_files[0].startswith("astropy/modeling/separable.py:") and \
        r.context_files[0].endswith(" separability_matrix")
    assert not any("tests/" in label for label in r.context_files)
    assert "def separability_matrix(" in r.text and f"[start of {r.context_files[0]}]" in r.text
    for line in added_lines(GOLD_PATCH):
        assert line not in r.text, line
    # The same prompt whatever the gold patch says.
    other = hub_task(repo_url=url, base_commit=commit, patch="diff --git a/x b/x\n")
    assert build_prompt(other, chat_tokenizer, 100_000, "bm25_functions").text == r.text


def test_function_context_fits_more_of_the_right_code_in_a_small_budget(tmp_path, chat_tokenizer):
    url, commit = local_repo(tmp_path)
    task = hub_task(repo_url=url, base_commit=commit)
    bare = build_prompt(task, chat_tokenizer, 100_000, "none")
    first = build_prompt(task, chat_tokenizer, 100_000, "bm25_functions")
    body = first.text.split(f"[start of {first.context_files[0]}]")[1].split("[end of")[0]
    # Room for the best function with its label and tags, not for its module.
    budget = len(bare.token_ids) + len(chat_tokenizer(body)["input_ids"]) + 200
    assert len(chat_tokenizer(SEPARABLE)["input_ids"]) > budget - len(bare.token_ids)
    files = build_prompt(task, chat_tokenizer, budget, "bm25")
    functions = build_prompt(task, chat_tokenizer, budget, "bm25_functions")
    assert len(functions.token_ids) <= budget and "def separability_matrix(" in functions.text
    assert "def separability_matrix(" not in files.text  # the whole module does not fit
