"""The computer-use episode runner against a real executor with real Chromium (the ENV side's client and routes),
with a scripted policy: first screenshot before the first turn, one action per turn, error observations for bad
calls, `done` -> finish -> reward, and the trajectory's images, spans and masks exact."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from buffer_client.wire import to_proto_trajectory
from envs.computer_use.env import ComputerUseEnvironment, make_computer_tasks
from envs.computer_use.tasks import _gap
from fleet.config import MasterConfig, parse_config
from fleet.config.env import ComputerUseEnvConfig
from fleet.config.infra import SandboxConfig, SandboxSessionConfig
from fleet.contracts.groups import PromptGroup
from rollout.agent.computer import ComputerRunner
from rollout.engine.base import Generation, SamplingSpec
from services.sandbox.server import SandboxServer
from workshop.resolve import resolve_model
from workshop.tinyvlm import load_processor
from workshop.vision import placeholder_runs

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0 or shutil.which("chromium") is None,
    reason="computer sessions need bubblewrap, root and chromium (scripts/setup.sh)")
CU = ComputerUseEnvConfig(families=["click_button"], max_actions=4, action_timeout_s=5.0)


class ScriptedEngine:
    """Answers each turn with the next scripted text (as tokens), recording the images it was given."""

    def __init__(self, tokenizer: Any, turns: list[str]) -> None:
        self.tok, self.turns, self.seen_images = tokenizer, turns, []  # type: list[int]

    async def generate(self, request_id: str, context: Sequence[int], sampling: SamplingSpec,
                       images: Sequence[bytes] = ()) -> Generation:
        self.seen_images.append(len(images))
        text = self.turns[min(len(self.seen_images) - 1, len(self.turns) - 1)] + "<|im_end|>"
        ids = list(self.tok(text, add_special_tokens=False)["input_ids"])
        return Generation(request_id, ids, [-0.5] * len(ids), [7] * len(ids), "stop", len(context))


@pytest.fixture
async def server(tmp_path: Any) -> AsyncIterator[SandboxServer]:
    srv = SandboxServer(SandboxConfig(pool_size=1, work_root=str(tmp_path / "work"), uid_base=63000,
                                      sessions=SandboxSessionConfig(max_sessions=4, lease_s=2.0)))
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop(0)


def _cfg(port: int) -> MasterConfig:
    return parse_config({"env": {"computer_use": CU.model_dump()}}, [
        "data.train.dataset_name=computer_use", "policy.model_name=tiny-qwen2-vl",
        f"env.code.sandbox_urls=[http://127.0.0.1:{port}]", "policy.max_total_sequence_length=2048",
        "data.train.max_prompt_length=1536"])


def _call(name: str, **args: Any) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


async def test_an_episode_sees_screenshots_acts_once_per_turn_and_is_graded(server: SandboxServer) -> None:
    cfg = _cfg(server.port)
    proc = load_processor(resolve_model("tiny-qwen2-vl"))
    task = make_computer_tasks(CU, 0, "train", 1)[0]
    labels, target = task.metadata["params"]
    row, gap = _gap((224, 224), len(labels))
    click = _call("click", x=112, y=8 + labels.index(target) * (row + gap) + row // 2)
    engine = ScriptedEngine(proc.tokenizer, ["let me see <tool_call>{oops", click + _call("done"), _call("done")])
    runner = ComputerRunner(cfg.env, cfg.policy, engine, proc, "worker-t")  # type: ignore[arg-type]
    env = ComputerUseEnvironment(CU)
    prompt_ids = env.build_prompt(task, proc.tokenizer, 1536).token_ids
    group = PromptGroup(group_id="g", env_name="computer_use", prompt_token_ids=prompt_ids)
    try:
        # As it goes on the wire: the buffer client's edge (buffer_client/wire.py) keeps every token, span and image.
        t = to_proto_trajectory(await runner.sample(group, env.task_to_payload(task), SamplingSpec(max_new_tokens=64),
                                                    0))
    finally:
        await runner.close()
    assert t.reward == 1.0 and t.finish_reason == "submitted"
    assert t.episode.turns == 3 and t.episode.tool_errors == 1, "the malformed call got an error observation"
    assert engine.seen_images == [1, 1, 2], "each turn gets every image of its context (one action per turn)"
    ids = list(t.response_token_ids)
    runs = placeholder_runs(ids, runner.fmt.codec.image_token_id)
    assert [(im.span.start, im.span.length) for im in t.images] == runs == [(runs[0][0], 64), (runs[1][0], 64)]
    assert all(im.png.startswith(b"\x89PNG") and (im.width, im.height) == (224, 224) for im in t.images)
    observed = {i for s in t.observation_spans for i in range(s.start, s.start + s.length)}
    assert all(i in observed for s, n in runs for i in range(s, s + n)), "image tokens lie in observation spans"
    assert t.observation_spans[0].start == 0, "the first screenshot comes before the first generation"
    for i, v in enumerate(t.token_versions):
        assert (v == -1) == (i in observed) and (t.generation_logprobs[i] == 0.0) == (i in observed)
    assert runner.summary()["actions"] == 1


async def test_an_unreachable_sandbox_gives_the_group_back_never_a_zero_reward() -> None:
    from rollout.scoring import ScoringUnavailable

    cfg = parse_config({}, ["data.train.dataset_name=computer_use", "policy.model_name=tiny-qwen2-vl",
                            "env.code.sandbox_urls=[http://127.0.0.1:9]", "env.code.max_retries=0"])
    proc = load_processor(resolve_model("tiny-qwen2-vl"))
    runner = ComputerRunner(cfg.env, cfg.policy, ScriptedEngine(proc.tokenizer, [_call("done")]), proc,  # type: ignore
                            "worker-u")
    task = make_computer_tasks(CU, 0, "train", 1)[0]
    group = PromptGroup(group_id="g", env_name="computer_use", prompt_token_ids=[1, 2, 3])
    try:
        with pytest.raises(ScoringUnavailable, match="sandbox computer session failed"):
            await runner.sample(group, ComputerUseEnvironment(CU).task_to_payload(task), SamplingSpec(), 0)
    finally:
        await runner.close()
