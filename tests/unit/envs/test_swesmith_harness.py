"""SWE-smith rows get the task SWE-smith's own harness (swesmith 0.0.9) would run, and its gold-run logs grade FULL.

Expected values are recorded from swesmith 0.0.9 (`harness/utils.py::run_patch_in_container`, `profiles/*.py`). The live
tests recompute them with swesmith's own registry in a subprocess (`SWESMITH_ROOT`, default
`.venv/opt/swesmith-0.0.9`, installed by `make setup`), and check the vendored profile table is not stale.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envs.registry import load_dataset
from envs.swe.harnesses.swesmith import PROFILES_PATH, eval_script, profiles, reverse_patch
from envs.swe.loaders import DatasetFormatError
from envs.swe.payload import payload_to_spec, task_to_payload
from fleet.config.env import DatasetConfig
from services.sandbox.images import contract
from services.sandbox.images.parsers.swesmith import PARSERS

ROOT = Path(__file__).resolve().parents[3]
# `make setup` installs swesmith 0.0.9 there (--no-deps --target); SWESMITH_ROOT points elsewhere.
SWESMITH = Path(os.environ.get("SWESMITH_ROOT", Path(__file__).resolve().parents[3] / ".venv/opt/swesmith-0.0.9"))
# Not skipped when missing: a green run must have compared with swesmith itself.
live = pytest.mark.usefixtures("swesmith_installed")


@pytest.fixture
def swesmith_installed() -> None:
    assert (SWESMITH / "swesmith" / "profiles").is_dir(), f"swesmith not at {SWESMITH}: `make setup` installs it"

PY_CMD = ("source /opt/miniconda3/bin/activate; conda activate testbed; "
          "pytest --disable-warnings --color=no --tb=no --verbose")
BUG = ("diff --git a/addict/addict.py b/addict/addict.py\n--- a/addict/addict.py\n+++ b/addict/addict.py\n"
       "@@ -1,3 +1,3 @@\n class Dict(dict):\n-    def copy(self):\n+    def copy(self):  # bug\n         pass\n")
ADDICT_F2P = ["test_addict.py::DictTests::test_copy", "test_addict.py::ChildDictTests::test_copy"]
ADDICT_P2P = ["test_addict.py::DictTests::test_add_on_empty_dict"]
GIN_F2P = ["TestContextReset"]
GIN_P2P = ["TestBindingDefault", "TestRenderJSON", "TestRouteParamsByName", "TestRouteParamsByName/with_slash"]

# Recorded from swesmith 0.0.9: `rp.image_name` (x86_64), `rp.get_test_cmd(instance)[0]` and the eval.sh that
# run_patch_in_container writes, for the rows below.
SWESMITH_009 = {
    "mewwts__addict.75284f95": {"image": "swebench/swesmith.x86_64.mewwts_1776_addict.75284f95", "cmd": PY_CMD},
    "gin-gonic__gin.3c12d2a8": {"image": "swebench/swesmith.x86_64.gin-gonic_1776_gin.3c12d2a8",
                                "cmd": "go test -v ./..."},
    "clap-rs__clap.3716f9f4": {"image": "swebench/swesmith.x86_64.clap-rs_1776_clap.3716f9f4",
                               "cmd": "make test-full ARGS=--verbose"},
    "dask__dask.5f61e423": {"image": "swebench/swesmith.x86_64.dask_1776_dask.5f61e423",
                            "cmd": PY_CMD + " dask/tests/test_base.py dask/array/tests/test_array_core.py"},
}


def _row(key: str, f2p: list[str], p2p: list[str], **extra: Any) -> dict[str, Any]:
    """A row as `harness/gather.py` writes it."""
    return {"instance_id": f"{key}.func_pm_op_change__abcd1234", "patch": BUG, "FAIL_TO_PASS": f2p,
            "PASS_TO_PASS": p2p, "image_name": SWESMITH_009.get(key, {}).get("image", "x"),
            "repo": f"swesmith/{key}", **extra}


ROWS = {
    "mewwts__addict.75284f95": _row("mewwts__addict.75284f95", ADDICT_F2P, ADDICT_P2P),
    "gin-gonic__gin.3c12d2a8": _row("gin-gonic__gin.3c12d2a8", GIN_F2P, GIN_P2P),
    "clap-rs__clap.3716f9f4": _row("clap-rs__clap.3716f9f4", ["builder::tests::app_send_sync"], ["parse::t1"]),
    "dask__dask.5f61e423": _row("dask__dask.5f61e423", ["dask/tests/test_base.py::test_tokenize"],
                                ["dask/array/tests/test_array_core.py::test_stack"]),
}


def _load(tmp_path: Path, rows: list[dict[str, Any]]) -> list[Any]:
    path = tmp_path / "smith.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return list(load_dataset(DatasetConfig(dataset_name="swe_smith", data_path=str(path))))


def _harness_eval_sh(command: str) -> str:
    """run_patch_in_container's eval.sh."""
    return "\n".join(["#!/bin/bash", "set -uxo pipefail", "cd /testbed", ": '>>>>> Start Test Output'", command,
                      ": '>>>>> End Test Output'"]) + "\n"


def _without_restore(script: str) -> str:
    # The restore runs in the harness before eval.sh is written; here it is the script's first step.
    lines = script.splitlines()
    start = lines.index(": '>>>>> Start Test Output'")
    return "\n".join(lines[:3] + lines[start:]) + "\n"


def test_gather_rows_get_the_profile_image_head_base_and_eval_script(tmp_path: Path) -> None:
    tasks = {t.instance_id.rsplit(".", 1)[0]: t for t in _load(tmp_path, list(ROWS.values()))}
    for key, want in SWESMITH_009.items():
        task = tasks[key]
        assert task.metadata["image"] == want["image"], key
        assert task.base_commit == "HEAD", key
        assert task.metadata["setup_patch"] == BUG and task.patch == reverse_patch(BUG), key
        assert _without_restore(task.metadata["eval_script"]) == _harness_eval_sh(want["cmd"]), key
        assert task.problem_statement == ""
    assert {k: t.metadata["log_parser"] for k, t in tasks.items()} == {
        "mewwts__addict.75284f95": "swesmith_pytest", "gin-gonic__gin.3c12d2a8": "swesmith_gotest",
        "clap-rs__clap.3716f9f4": "swesmith_cargo", "dask__dask.5f61e423": "swesmith_pytest"}


def test_python_eval_script_restores_the_f2p_and_p2p_test_files(tmp_path: Path) -> None:
    [task] = _load(tmp_path, [ROWS["dask__dask.5f61e423"]])
    restore = task.metadata["eval_script"].splitlines()[3]
    assert restore.endswith("checkout -- dask/tests/test_base.py dask/array/tests/test_array_core.py")


def test_hub_parquet_rows_with_list_columns_load_like_gather_rows(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    gather = ROWS["mewwts__addict.75284f95"]
    # SWE-bench/SWE-smith's columns: instance_id, patch, FAIL_TO_PASS and PASS_TO_PASS (list<string>), image_name,
    # repo, problem_statement; older exports add created_at and base_commit (the bug branch's commit).
    hub = {**gather, "problem_statement": "copy() returns None", "created_at": "2025-03-14T00:00:00",
           "base_commit": "0123456789abcdef0123456789abcdef01234567",
           "image_name": "jyangballin/swesmith.x86_64.mewwts_1776_addict.75284f95"}
    path = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist([hub]), path)
    [from_hub] = list(load_dataset(DatasetConfig(dataset_name="swe_smith", data_path=str(path))))
    [from_gather] = _load(tmp_path, [gather])
    assert from_hub.problem_statement == "copy() returns None"
    assert from_hub.base_commit == from_gather.base_commit == "HEAD"
    assert from_hub.metadata["image"] == from_gather.metadata["image"] == SWESMITH_009[
        "mewwts__addict.75284f95"]["image"]
    assert from_hub.metadata["eval_script"] == from_gather.metadata["eval_script"]
    assert from_hub.fail_to_pass == tuple(ADDICT_F2P)


@pytest.mark.parametrize("image_name", ["swesmith.x86_64.mewwts__addict.75284f95", None,
                                        "jyangballin/swesmith.x86_64.mewwts_1776_addict.75284f95"])
def test_old_local_tags_and_missing_names_get_the_profile_image(image_name: str | None, tmp_path: Path) -> None:
    row = {**ROWS["mewwts__addict.75284f95"], "image_name": image_name}
    [task] = _load(tmp_path, [row])
    assert task.metadata["image"] == "swebench/swesmith.x86_64.mewwts_1776_addict.75284f95"


def test_repo_falls_back_to_the_instance_id_as_the_registry_does(tmp_path: Path) -> None:
    row = {k: v for k, v in ROWS["gin-gonic__gin.3c12d2a8"].items() if k != "repo"}
    [task] = _load(tmp_path, [row])
    assert task.metadata["log_parser"] == "swesmith_gotest"


def test_unknown_repos_and_unported_languages_are_refused_with_counts(tmp_path: Path) -> None:
    unknown = [_row("nobody__nothing.12345678", ["t"], []) | {"instance_id": f"nobody__nothing.12345678.b{i}"}
               for i in range(2)]
    java = _row("AsyncHttpClient__async-http-client.ae59f51f", ["a.B#c"], [])
    with pytest.raises(DatasetFormatError) as err:
        _load(tmp_path, [*unknown, java, ROWS["gin-gonic__gin.3c12d2a8"]])
    text = str(err.value)
    assert "3 row(s) cannot be graded yet" in text
    assert "2 row(s) of swe_smith: no swesmith 0.0.9 profile for repo nobody__nothing.12345678" in text
    assert ("1 row(s) of swe_smith java: AsyncHttpClient__async-http-client.ae59f51f: log parser "
            "Asynchttpclientae59f51f.log_parser not ported") in text


def test_a_row_of_another_repos_profile_is_an_invalid_field(tmp_path: Path) -> None:
    row = {**ROWS["gin-gonic__gin.3c12d2a8"], "instance_id": "mewwts__addict.75284f95.x"}
    with pytest.raises(DatasetFormatError, match=r"field instance_id: not an instance of gin-gonic__gin.3c12d2a8"):
        _load(tmp_path, [row])


def test_a_profileless_row_with_its_own_test_command_keeps_its_image(tmp_path: Path) -> None:
    row = {**_row("me__calc.00000001", ["tests/t.py::t"], []), "image_name": "me/calc:v1",
           "test_command": "python3 -m pytest -rA tests"}
    [task] = _load(tmp_path, [row])
    assert task.metadata["image"] == "me/calc:v1" and "eval_script" not in task.metadata
    assert task.test_command == "python3 -m pytest -rA tests" and task.base_commit == "HEAD"


def test_go_restore_puts_back_the_test_files_defining_the_listed_tests(tmp_path: Path) -> None:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a_test.go").write_text("package pkg\n\nfunc TestContextReset(t *testing.T) {}\n")
    (tmp_path / "pkg" / "b_test.go").write_text("package pkg\n\nfunc TestOther(t *testing.T) {}\n")
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "bug"], check=True)
    for name in ("a_test.go", "b_test.go"):
        (tmp_path / "pkg" / name).write_text("package pkg // edited by the agent\n")
    profile = profiles()["profiles"]["gin-gonic__gin.3c12d2a8"]
    script = eval_script(profile, GIN_F2P, GIN_P2P).replace("cd /testbed", f"cd {tmp_path}")
    lines = script.splitlines()
    restore = "\n".join(lines[:lines.index(": '>>>>> Start Test Output'")])
    subprocess.run(["bash", "-c", restore], check=True, capture_output=True)
    assert "TestContextReset" in (tmp_path / "pkg" / "a_test.go").read_text()
    assert "edited by the agent" in (tmp_path / "pkg" / "b_test.go").read_text()


GO_GOLD_LOG = """+ cd /testbed
+ : '>>>>> Start Test Output'
+ go test -v ./...
=== RUN   TestBindingDefault
--- PASS: TestBindingDefault (0.00s)
=== RUN   TestContextReset
--- PASS: TestContextReset (0.00s)
=== RUN   TestRouteParamsByName
=== RUN   TestRouteParamsByName/with_slash
    --- PASS: TestRouteParamsByName/with_slash (0.00s)
--- PASS: TestRouteParamsByName (0.00s)
PASS
ok  \tgithub.com/gin-gonic/gin\t0.412s
?   \tgithub.com/gin-gonic/gin/internal/json\t[no test files]
=== RUN   TestRenderJSON
--- PASS: TestRenderJSON (0.00s)
PASS
ok  \tgithub.com/gin-gonic/gin/render\t0.011s
+ : '>>>>> End Test Output'
"""
GO_BUG_LOG = GO_GOLD_LOG.replace("--- PASS: TestContextReset (0.00s)",
                                 "    context_test.go:123: expected 0, got 1\n--- FAIL: TestContextReset (0.00s)"
                                 ).replace("PASS\nok  \tgithub.com/gin-gonic/gin\t0.412s",
                                           "FAIL\nFAIL\tgithub.com/gin-gonic/gin\t0.412s")
PY_GOLD_LOG = f"""+ cd /testbed
+ : '>>>>> Start Test Output'
+ source /opt/miniconda3/bin/activate
+ conda activate testbed
+ pytest --disable-warnings --color=no --tb=no --verbose
============================= test session starts ==============================
platform linux -- Python 3.10.16, pytest-8.3.4, pluggy-1.5.0 -- /opt/miniconda3/envs/testbed/bin/python
cachedir: .pytest_cache
rootdir: /testbed
collecting ... collected 3 items

{ADDICT_P2P[0]} PASSED                  [ 33%]
{ADDICT_F2P[0]} PASSED                                [ 66%]
{ADDICT_F2P[1]} PASSED                           [100%]

============================== 3 passed in 0.05s ===============================
+ : '>>>>> End Test Output'
"""
PY_BUG_LOG = PY_GOLD_LOG.replace(f"{ADDICT_F2P[0]} PASSED", f"{ADDICT_F2P[0]} FAILED").replace(
    f"{ADDICT_F2P[1]} PASSED", f"{ADDICT_F2P[1]} FAILED").replace("3 passed", "2 failed, 1 passed")


@pytest.mark.parametrize("key,gold,bug", [
    ("gin-gonic__gin.3c12d2a8", GO_GOLD_LOG, GO_BUG_LOG),
    ("mewwts__addict.75284f95", PY_GOLD_LOG, PY_BUG_LOG),
])
def test_the_harness_gold_run_log_grades_full_and_the_bug_run_no(key: str, gold: str, bug: str,
                                                                  tmp_path: Path) -> None:
    [task] = _load(tmp_path, [ROWS[key]])
    spec = payload_to_spec(task_to_payload(task), task.patch)
    ts = contract.test_spec(spec, [])
    assert contract.grade(spec, ts, gold).resolution == "FULL"
    assert contract.grade(spec, ts, bug).resolution == "NO"


_REFERENCE = """
import json, sys
sys.path.insert(0, sys.argv[2])
import regen_swesmith_profiles as regen
from pathlib import Path
registry = regen.load_registry(Path(sys.argv[1]))
req = json.load(sys.stdin)
out = {"rows": {}, "logs": {}}
for r in req["rows"]:
    rp = registry.get_from_inst(r)
    rp.arch = "x86_64"
    cmd = rp.get_test_cmd(r)[0]
    files = rp.get_test_files(r) if type(rp).__module__.endswith("python") else None
    out["rows"][r["instance_id"]] = {"image": rp.image_name, "cmd": cmd, "files": files}
for key, log in req["logs"]:
    out["logs"].setdefault(key, []).append(registry.get(key).log_parser(log))
json.dump(out, sys.stdout)
"""
PARSER_LOGS = {
    "gin-gonic__gin.3c12d2a8": [GO_GOLD_LOG, GO_BUG_LOG],
    "mewwts__addict.75284f95": [PY_GOLD_LOG, "a.py::t ERROR\nb.py::u XFAIL\nFAILED a.py::t - boom\n"],
    "clap-rs__clap.3716f9f4": ["running 2 tests\ntest builder::tests::app_send_sync ... ok\n"
                               "test parse::t1 ... FAILED\ntest parse::t2 ... ignored\n"],
    "Automattic__mongoose.5f57a5bb": ["  ✔ saves a doc (5ms)\n  - pending one\n  1) fails here\n"],
    "11ty__eleventy.e9a16667": ["  ✔ renders  (3ms)\n  ✖ breaks\n"],
}


REFERENCE_ROWS = [r for k, r in ROWS.items() if k != "gin-gonic__gin.3c12d2a8"]  # Go's get_test_files clones
REFERENCE_LOGS = [(key, log) for key, group in PARSER_LOGS.items() for log in group]


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    """swesmith's own answers for REFERENCE_ROWS and REFERENCE_LOGS, from one subprocess (loading its registry takes
    seconds; the two tests that read it share it)."""
    assert (SWESMITH / "swesmith" / "profiles").is_dir(), f"swesmith not at {SWESMITH}: `make setup` installs it"
    done = subprocess.run([sys.executable, "-c", _REFERENCE, str(SWESMITH), str(ROOT / "scripts")],
                          input=json.dumps({"rows": REFERENCE_ROWS, "logs": REFERENCE_LOGS}), capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@live
def test_tasks_match_swesmith_own_registry(tmp_path: Path, reference: dict[str, Any]) -> None:
    rows = REFERENCE_ROWS
    ref = reference["rows"]
    for task in _load(tmp_path, rows):
        want = ref[task.instance_id]
        assert task.metadata["image"] == want["image"]
        assert _without_restore(task.metadata["eval_script"]) == _harness_eval_sh(want["cmd"])
        assert want == {**want, **SWESMITH_009[task.instance_id.rsplit(".", 1)[0]]}
        if want["files"] is not None:
            files = want["files"][0] + want["files"][1]
            assert task.metadata["eval_script"].splitlines()[3].endswith("checkout -- " + " ".join(files))


@live
def test_ported_parsers_read_logs_as_swesmith_does(reference: dict[str, Any]) -> None:
    ref = reference["logs"]
    table = profiles()["profiles"]
    for key, group in PARSER_LOGS.items():
        parser = PARSERS[table[key]["log_parser"]]
        assert [parser(log, None) for log in group] == ref[key], key


@live
def test_vendored_profiles_are_what_the_regen_script_makes(tmp_path: Path) -> None:
    out = tmp_path / "profiles.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts/regen_swesmith_profiles.py"), "--swesmith",
                           str(SWESMITH), "--out", str(out)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    fresh = json.loads(out.read_text())
    assert fresh == json.loads(PROFILES_PATH.read_text()), "run scripts/regen_swesmith_profiles.py"
