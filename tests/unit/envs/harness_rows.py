"""princeton-nlp-layout rows for every repo and version of a harness's specs, for comparing eval scripts.

Each row has a test patch in the hub's shape for its language: a modified test file, a new test file (no `a/`
source: not reset), and a non-test data file (dropped from the test directives), so every branch of the harness's
derivation is exercised.
"""

from __future__ import annotations

import json
from typing import Any

_EXT_TEST = {"py": "tests/test_core.py", "js": "test/core.test.js", "go": "pkg/core_test.go",
             "rs": "tests/core.rs", "java": "src/test/java/CoreTest.java", "php": "tests/CoreTest.php",
             "rb": "test/core_test.rb", "c": "tests/core.c"}
_REPO_TEST = {"django/django": "tests/auth_tests/test_validators.py", "sympy/sympy": "sympy/core/tests/test_basic.py",
              "Automattic/wp-calypso": "client/state/test/index.js", "python/mypy": "test-data/unit/check-classes.test"}


def _diff(path: str, new: bool = False) -> str:
    if new:
        return (f"diff --git a/{path} b/{path}\nnew file mode 100644\nindex 0000000..1111111\n--- /dev/null\n"
                f"+++ b/{path}\n@@ -0,0 +1,2 @@\n+first\n+second\n")
    return (f"diff --git a/{path} b/{path}\nindex 1111111..2222222 100644\n--- a/{path}\n+++ b/{path}\n"
            "@@ -1,3 +1,4 @@\n line one\n+[case testAdded]\n line two\n line three\n")


def row(repo: str, version: str, ext: str) -> dict[str, Any]:
    test = _REPO_TEST.get(repo, _EXT_TEST[ext])
    folder = test.rsplit("/", 1)[0]
    extra = test.rsplit(".", 1)[0] + "_extra." + test.rsplit(".", 1)[1]
    test_patch = _diff(test) + _diff(extra, new=True) + _diff(f"{folder}/fixtures/data.json")
    iid = f"{repo.replace('/', '__')}-{version.replace('.', '')}1"
    out: dict[str, Any] = {
        "repo": repo, "instance_id": iid, "base_commit": "0123456789abcdef0123456789abcdef01234567",
        "patch": _diff("src/core.py"), "test_patch": test_patch, "problem_statement": "It is broken.",
        "hints_text": "", "created_at": "2023-01-01T00:00:00Z", "version": version,
        "FAIL_TO_PASS": json.dumps(["test_a"]), "PASS_TO_PASS": json.dumps([]),
        "environment_setup_commit": "fedcba9876543210fedcba9876543210fedcba98",
    }
    if ext == "js":
        out["image_assets"] = json.dumps({"problem_statement": ["https://example.com/a.png"], "test_patch": [
            {"path": f"{folder}/__screenshots__/a.png", "url": "https://example.com/b.png"}]})
    return out


def rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (repo, version) of the vendored specs `data` (swebench_4_1.json / swe_gym_fork.json)."""
    ext = data.get("ext", {})
    return [row(repo, version, ext.get(repo, "py")) for repo, versions in data["specs"].items() for version in versions]
