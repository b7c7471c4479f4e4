"""The agent runner end to end on a real executor: an episode (scripted policy, the tiny model's tokenizer) edits
the repository through a real sandbox session, submits, and is graded in a fresh tree; a lost session is an
infrastructure failure, never a reward."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from sandbox_helpers import CalcRepo

from buffer_client.wire import to_proto_trajectory
from fleet.config import MasterConfig
from fleet.contracts.groups import PromptGroup
from fleet.tokenizer import load_tokenizer
from grpofleet.v1 import common_pb2
from rollout.agent.runner import AgentRunner
from rollout.engine.base import Generation, SamplingSpec
from rollout.scoring import ScoringUnavailable
from services.sandbox.server import SandboxServer
from workshop.tinymodel import ensure_tiny_model


def _call(name: str, **arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class ScriptedEngine:
    def __init__(self, tokenizer: Any, turns: list[str]) -> None:
        self.tok, self.turns, self.calls = tokenizer, turns, 0

    async def generate(self, request_id: str, prompt: Sequence[int], sampling: SamplingSpec) -> Generation:
        text = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        ids = list(self.tok(text, add_special_tokens=False)["input_ids"]) + [self.tok.eos_token_id]
        return Generation(request_id, ids, [-0.1] * len(ids), [7] * len(ids), "stop", len(prompt))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_tokenizer(ensure_tiny_model(tmp_path_factory.mktemp("m") / "tiny"))


def _cfg(server: SandboxServer) -> MasterConfig:
    cfg = MasterConfig()
    cfg.env.code.sandbox_urls = [f"http://127.0.0.1:{server.port}"]
    cfg.env.code.mode = "agent"
    cfg.env.code.task_timeout = 60
    cfg.env.code.max_retries = 0
    return cfg


def _prompt(calc_repo: CalcRepo, runner: AgentRunner) -> tuple[PromptGroup, dict[str, Any]]:
    spec = calc_repo.spec("")
    payload = {"instance_id": "calc-1", "repo_url": spec.repo_url, "base_commit": spec.base_commit,
               "test_patch": spec.test_patch, "fail_to_pass": spec.fail_to_pass, "pass_to_pass": spec.pass_to_pass,
               "test_command": None}
    ids = runner.fmt.prompt_ids("Fix it.", "add and mul are wrong.", [])
    return PromptGroup(group_id="g", env_name="swe", prompt_token_ids=ids), payload


async def test_an_episode_fixes_the_repository_in_its_session_and_is_graded(
        server: SandboxServer, calc_repo: CalcRepo, tokenizer: Any) -> None:
    turns = [_call("shell", command="grep -n 'return' calc/core.py"),
             _call("file_editor", command="str_replace", path="calc/core.py", old_str="return a - b",
                   new_str="return a + b"),
             _call("file_editor", command="str_replace", path="calc/core.py", old_str="    return a + b\n\n\ndef neg",
                   new_str="    return a * b\n\n\ndef neg"),
             _call("submit")]
    cfg = _cfg(server)
    engine = ScriptedEngine(tokenizer, turns)
    runner = AgentRunner(cfg.env, cfg.policy, engine, tokenizer, "worker-1")  # type: ignore[arg-type]
    try:
        prompt, payload = _prompt(calc_repo, runner)
        traj = to_proto_trajectory(await runner.sample(prompt, payload, SamplingSpec(max_new_tokens=200), 0))
    finally:
        await runner.close()
    assert traj.finish_reason == "submitted" and traj.episode.turns == 4 and traj.episode.tool_errors == 0
    assert traj.verdict.resolution == common_pb2.RESOLUTION_FULL and traj.reward == 1.0
    assert len(traj.observation_spans) == 3
    assert {v for v in traj.token_versions} == {7, -1}
    assert server.sessions.sessions == {}, "the finished session is gone"


async def test_an_episode_that_changes_nothing_is_a_format_error_not_a_test_run(
        server: SandboxServer, calc_repo: CalcRepo, tokenizer: Any) -> None:
    cfg = _cfg(server)
    engine = ScriptedEngine(tokenizer, [_call("submit")])
    runner = AgentRunner(cfg.env, cfg.policy, engine, tokenizer, "w")  # type: ignore[arg-type]
    try:
        prompt, payload = _prompt(calc_repo, runner)
        traj = to_proto_trajectory(await runner.sample(prompt, payload, SamplingSpec(), 0))
    finally:
        await runner.close()
    assert traj.verdict.status == common_pb2.VERDICT_STATUS_FORMAT_ERROR and traj.reward == 0.0


async def test_a_session_lost_mid_episode_is_an_infrastructure_failure(
        server: SandboxServer, calc_repo: CalcRepo, tokenizer: Any) -> None:
    class Killer(ScriptedEngine):
        async def generate(self, request_id: str, prompt: Sequence[int], sampling: SamplingSpec) -> Generation:
            if self.calls == 1:  # the executor loses the session between two turns (restart, reaping)
                for sid in list(server.sessions.sessions):
                    await server.sessions.delete(sid, "executor_stopped")
            return await super().generate(request_id, prompt, sampling)

    engine = Killer(tokenizer, [_call("shell", command="true"), _call("shell", command="true")])
    cfg = _cfg(server)
    runner = AgentRunner(cfg.env, cfg.policy, engine, tokenizer, "w")  # type: ignore[arg-type]
    try:
        prompt, payload = _prompt(calc_repo, runner)
        with pytest.raises(ScoringUnavailable, match="executor_stopped"):
            await runner.sample(prompt, payload, SamplingSpec(), 0)
    finally:
        await runner.close()
    assert server.sessions.sessions == {}


def test_agent_mode_prompts_carry_the_tools(tokenizer: Any, tmp_path: Path) -> None:
    from envs.registry import Task, make_environment

    cfg = MasterConfig()
    cfg.env.code.mode = "agent"
    env = make_environment("swe", cfg.env, repos_root=str(tmp_path))
    task = Task("t1", "swe", "The mean of an empty list raises. " * 400, repo="stats")
    prompt = env.build_prompt(task, tokenizer, 1400)
    assert len(prompt.token_ids) <= 1400 and prompt.statement_truncated
    assert '"name": "file_editor"' in prompt.text and "the rest of the statement is cut" in prompt.text
    single = make_environment("swe", MasterConfig().env, repos_root=str(tmp_path))
    assert type(single).__name__ == "SweEnvironment"


async def test_an_episode_is_graded_failing_tests_first_when_the_config_asks(
        server: SandboxServer, calc_repo: CalcRepo, tokenizer: Any) -> None:
    """`env.code.fail_to_pass_first` reaches the session's spec: a diff that fixes no failing test is graded on the
    3 FAIL_TO_PASS tests alone (the full run would also pass the 3 PASS_TO_PASS ones)."""
    turns = [_call("file_editor", command="str_replace", path="calc/core.py", old_str="def add(a, b):",
                   new_str="def add(a, b):  # looked at, not fixed"),
             _call("submit")]
    cfg = _cfg(server)
    cfg.env.code.reward_mode = "fail_to_pass"
    cfg.env.code.fail_to_pass_first = True
    runner = AgentRunner(cfg.env, cfg.policy, ScriptedEngine(tokenizer, turns), tokenizer, "w")  # type: ignore[arg-type]
    try:
        prompt, payload = _prompt(calc_repo, runner)
        traj = to_proto_trajectory(await runner.sample(prompt, payload, SamplingSpec(max_new_tokens=200), 0))
    finally:
        await runner.close()
    assert traj.verdict.resolution == common_pb2.RESOLUTION_NO and traj.reward == 0.0
    assert (traj.verdict.tests_passed, traj.verdict.tests_failed) == (0, 3)
