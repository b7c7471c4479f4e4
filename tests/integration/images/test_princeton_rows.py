"""princeton-nlp rows (no eval_script) run the script swebench 4.1 makes, inside a locally built image, end to end.

Two repositories in the shape of their SWE-bench families: a django-like tree whose `tests/runtests.py` is a
unittest runner taking Django's arguments (`--verbosity 2 --settings=test_sqlite --parallel 1 <modules>`, output in
the `test_x (module.Class...) ... ok` form `parse_log_django` reads), and a pytest repository graded as psf/requests
(`pytest -rA <files>`, `parse_log_pytest_options`). Their rows name the real repo and a real version, so the loader
derives 4.1's script; the gold patch must grade FULL and the empty patch NO, through the real executor.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from image_helpers import ImageSet, git

from envs.registry import load_dataset
from envs.swe.images import make_testbed
from envs.swe.payload import payload_to_spec, task_to_payload
from fleet.config.env import DatasetConfig
from fleet.config.infra import SandboxConfig
from services.sandbox.executor import Executor

RUNTESTS = '''#!/usr/bin/env python3
"""Django's tests/runtests.py, as far as the harness sees it: its arguments, unittest's verbose output."""
import argparse, os, sys, unittest
parser = argparse.ArgumentParser()
parser.add_argument("modules", nargs="*")
parser.add_argument("--verbosity", type=int, default=1)
parser.add_argument("--settings")
parser.add_argument("--parallel")
args = parser.parse_args()
here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.dirname(here)]
print("Testing against Django installed in '%s'" % os.path.dirname(here))
suite = unittest.defaultTestLoader.loadTestsFromNames(args.modules)
result = unittest.TextTestRunner(verbosity=args.verbosity).run(suite)
sys.exit(not result.wasSuccessful())
'''
VALIDATORS = "def ascii_ok(name):\n    return name.isalnum()\n"
FIXED = "def ascii_ok(name):\n    return name.isascii() and name.replace('_', 'a').isalnum()\n"
TEST_BEFORE = '''import unittest
from djangolike.validators import ascii_ok


class UsernameValidatorsTests(unittest.TestCase):
    def test_plain(self):
        self.assertTrue(ascii_ok("bob"))
'''
TEST_AFTER = TEST_BEFORE + '''
    def test_ascii_validator(self):
        self.assertTrue(ascii_ok("bob_1"))
        self.assertFalse(ascii_ok("b\\u00f8b"))
'''
REQ_BEFORE = "def quote(s):\n    return s.replace(' ', '%20')\n"
REQ_FIXED = "def quote(s):\n    return s.replace('%', '%25').replace(' ', '%20')\n"
REQ_TEST_BEFORE = "from reqlike.utils import quote\n\n\ndef test_space():\n    assert quote('a b') == 'a%20b'\n"
REQ_TEST_AFTER = REQ_TEST_BEFORE + "\n\ndef test_percent():\n    assert quote('5%') == '5%25'\n"


def _repo(root: Path, files: dict[str, str]) -> str:
    root.mkdir(parents=True)
    git(root, "init", "-q")
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    if (root / "tests" / "runtests.py").exists():
        (root / "tests" / "runtests.py").chmod(0o755)
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    return git(root, "rev-parse", "HEAD")


def _diff(root: Path, changes: dict[str, str]) -> str:
    for rel, text in changes.items():
        (root / rel).write_text(text)
    diff = git(root, "diff") + "\n"
    git(root, "checkout", "-q", "--", ".")
    return diff


def _row(images: ImageSet, tmp: Path, name: str, repo: str, version: str, files: dict[str, str],
         gold: dict[str, str], tests: dict[str, str], f2p: list[str], p2p: list[str]) -> dict[str, object]:
    src = tmp / f"{name}-src"
    base = _repo(src, files)
    row = {"instance_id": f"{repo.replace('/', '__')}-1", "repo": repo, "version": version, "base_commit": base,
           "patch": _diff(src, gold), "test_patch": _diff(src, tests), "problem_statement": "validators are wrong",
           "hints_text": "", "created_at": "2020-01-01T00:00:00Z", "environment_setup_commit": base,
           "FAIL_TO_PASS": json.dumps(f2p), "PASS_TO_PASS": json.dumps(p2p)}
    testbed = tmp / f"{name}-tb"
    make_testbed(src, base, testbed)
    subprocess.run(["chmod", "-R", "a+rwX", str(testbed)], check=True)
    images.builder.instance(name, testbed)
    row["image"] = f"{images.registry}/swe/{name}:v1"
    images.builder.push(name, str(row["image"]))
    return row


async def test_princeton_rows_grade_gold_full_and_empty_no_with_swebench_4_1s_script(
        images: ImageSet, image_cfg: SandboxConfig, tmp_path: Path) -> None:
    django = _row(images, tmp_path, "djangolike", "django/django", "3.0",
                  {"djangolike/__init__.py": "", "djangolike/validators.py": VALIDATORS, "tests/runtests.py": RUNTESTS,
                   "tests/auth_tests/__init__.py": "", "tests/auth_tests/test_validators.py": TEST_BEFORE},
                  {"djangolike/validators.py": FIXED}, {"tests/auth_tests/test_validators.py": TEST_AFTER},
                  ["test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests.test_ascii_validator)"],
                  ["test_plain (auth_tests.test_validators.UsernameValidatorsTests.test_plain)"])
    requests = _row(images, tmp_path, "reqlike", "psf/requests", "2.0",
                    {"reqlike/__init__.py": "", "reqlike/utils.py": REQ_BEFORE, "conftest.py": "",
                     "tests/test_utils.py": REQ_TEST_BEFORE},
                    {"reqlike/utils.py": REQ_FIXED}, {"tests/test_utils.py": REQ_TEST_AFTER},
                    ["tests/test_utils.py::test_percent"], ["tests/test_utils.py::test_space"])
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (django, requests)))
    tasks = list(load_dataset(DatasetConfig(dataset_name="swebench", data_path=str(path))))
    assert [t.metadata["log_parser"] for t in tasks] == ["parse_log_django", "parse_log_pytest_options"]
    results = {}
    async with Executor(image_cfg) as ex:
        for task in tasks:
            payload = task_to_payload(task)
            gold, empty = await ex.run(payload_to_spec(payload, task.patch)), await ex.run(payload_to_spec(payload, ""))
            results[task.repo] = (gold.resolution, empty.resolution, gold.error, gold.stdout_tail[-1500:])
    assert {k: v[:2] for k, v in results.items()} == {"django/django": ("FULL", "NO"),
                                                      "psf/requests": ("FULL", "NO")}, results
