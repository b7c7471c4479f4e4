import asyncio
import json

import pytest

from envs.registry import (
    Environment,
    Task,
    TaskDataset,
    dataset_names,
    environment_names,
    get_environment,
    load_dataset,
    make_environment,
    register_dataset,
)
from envs.swe.payload import payload_to_spec, task_to_payload
from fleet.config.env import DatasetConfig
from fleet.contracts.sandbox import TaskSpec, Verdict

DIFF = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"
TASK = Task("demo__op__1", "swe", "broken", repo="demo", repo_url="embedded://demo", base_commit="c" * 40,
            patch=DIFF, fail_to_pass=("t.py::test_a",), pass_to_pass=("t.py::test_b",), test_command="pytest t.py")


def test_builtin_names_are_registered():
    assert {"swe_embedded", "swebench", "arith"} <= set(dataset_names())
    assert {"swe", "arith"} <= set(environment_names())
    with pytest.raises(KeyError, match="unknown dataset 'nope'; registered: arith"):
        load_dataset(DatasetConfig(dataset_name="nope"))
    with pytest.raises(KeyError, match="unknown environment"):
        make_environment("nope")


def test_plugged_in_dataset_is_loaded_by_name():
    register_dataset("tiny_test", lambda cfg, **kw: TaskDataset("tiny_test", "arith", [TASK] * kw["n"]))
    assert len(load_dataset(DatasetConfig(dataset_name="tiny_test"), n=3)) == 3


def test_payload_is_json_and_becomes_a_task_spec_without_the_gold_patch():
    payload = json.loads(json.dumps(task_to_payload(TASK)))
    assert "patch" not in payload and "problem_statement" not in payload
    spec = payload_to_spec(payload, "PATCH", timeout=12)
    assert spec == TaskSpec(repo_url="embedded://demo", base_commit="c" * 40, patch="PATCH", test_patch="",
                            test_command="pytest t.py", fail_to_pass=["t.py::test_a"],
                            pass_to_pass=["t.py::test_b"], timeout=12, task_paths=["m.py"])
    with pytest.raises(ValueError, match="lacks base_commit"):
        payload_to_spec({k: v for k, v in payload.items() if k != "base_commit"}, "x")


def test_swe_environment_scores_through_the_scorer_and_flags_format_errors():
    seen: list[TaskSpec] = []

    async def scorer(spec: TaskSpec) -> Verdict:
        seen.append(spec)
        return Verdict(status="completed", patch_applied=True, resolution="FULL")

    env = make_environment("swe", scorer=scorer)
    assert isinstance(env, Environment)
    payload = env.task_to_payload(TASK)
    ok = asyncio.run(env.score(payload, f"Fix:\n```diff\n{DIFF}```"))
    assert (ok.verdict.resolution, ok.format_error) == ("FULL", None)
    assert seen[0].patch == DIFF.replace("@@ -1 +1 @@", "@@ -1,1 +1,1 @@")
    for text, status in [("no patch here", "missing"), ("```diff\nnope\n```", "malformed"),
                         (f"```diff\n{DIFF[:40]}", "truncated"),
                         (f"```diff\n{DIFF.replace('+a = 2', '+a = 1')}```", "no_change")]:
        r = asyncio.run(env.score(payload, text))
        assert (r.format_error, r.verdict.status, r.verdict.resolution) == (status, "format_error", "NO")
    assert len(seen) == 1  # format errors never reach a sandbox
    cut = asyncio.run(env.score(payload, "Let me think about th", truncated=True))
    assert cut.format_error == "truncated"


def test_swe_environment_takes_a_per_call_sandbox_and_reports_infra_errors():
    class FakeSandbox:
        async def run(self, spec: TaskSpec) -> Verdict:
            return Verdict(status="infra_error", error="repo missing")

    env = get_environment("swe")
    r = asyncio.run(env.score(task_to_payload(TASK), f"```diff\n{DIFF}```", sandbox=FakeSandbox()))
    assert r.infra_error == "repo missing" and r.format_error is None


def test_swe_environment_without_scorer_refuses_to_score():
    env = make_environment("swe")
    with pytest.raises(RuntimeError, match="has no scorer"):
        asyncio.run(env.score(task_to_payload(TASK), f"```diff\n{DIFF}```"))
