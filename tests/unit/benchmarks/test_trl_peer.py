"""The in-process peer (benchmarks/trl_peer.py) on the arith demo asks the fleet's questions and pays the fleet's
rewards: its prompts, validation tasks and rewards against the fleet's own loader, environment and reward path, for
the same seed, on the real config and a locally made tokenizer."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from fleet.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from benchmarks import skill_demo, trl_peer  # noqa: E402
from envs.registry import load_dataset, make_environment  # noqa: E402
from sandbox_client.reward import reward_from_verdict  # noqa: E402
from workshop.resolve import resolve_model  # noqa: E402
from workshop.tinymodel import ensure_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(ensure_tiny_model(tmp_path_factory.mktemp("m") / "tiny"))


@pytest.fixture(scope="module")
def tok(tiny: Path) -> Any:
    return load_tokenizer(tiny)


def _cfg(seed: int) -> Any:
    # As `skill_demo.py compare --task arith` passes them: the seed and the validation both systems get.
    return trl_peer.recipe([f"grpo.seed={seed}", *skill_demo.ARITH_VAL], "arith")


@pytest.mark.parametrize("seed", [1, 3])
def test_arith_peer_asks_the_fleets_questions(tok: Any, seed: int) -> None:
    cfg = _cfg(seed)
    name, train, val, _ = trl_peer.environment(cfg, seed)
    assert name == "arith"
    fleet_train = list(load_dataset(cfg.data.train, env_cfg=cfg.env, seed=cfg.grpo.seed))
    fleet_val = list(load_dataset(cfg.data.validation_or_default(), env_cfg=cfg.env, seed=cfg.grpo.seed))
    fleet_val = fleet_val[:cfg.grpo.max_val_samples]  # what a validation round asks (trainer/validation.py)
    assert [t.instance_id for t in train] == [t.instance_id for t in fleet_train]
    assert [t.instance_id for t in val] == [t.instance_id for t in fleet_val]
    assert len(val) == 200
    env = make_environment(name, cfg.env)
    for mine, theirs in zip([*train[:50], *val[:50]], [*fleet_train[:50], *fleet_val[:50]], strict=True):
        fleet_prompt = env.build_prompt(theirs, tok, cfg.data.train.max_prompt_length, cfg.data.train.context)
        assert trl_peer.chat_prompt(tok, mine.problem_statement) == fleet_prompt.text
        assert mine.metadata["answer"] == theirs.metadata["answer"]
    # Another seed asks other questions (the comparison's seeds are not one run three times).
    other = trl_peer.environment(_cfg(seed + 1), seed + 1)[1]
    assert [t.problem_statement for t in other[:20]] != [t.problem_statement for t in train[:20]]


def test_arith_peer_pays_the_fleets_rewards() -> None:
    seed = 2
    cfg = _cfg(seed)
    name, train, _, score = trl_peer.environment(cfg, seed)
    env = make_environment(name, cfg.env)
    mode, fmt = cfg.env.reward_settings(name)
    assert (cfg.env.arith.answer_format, mode) == ("number", "pass_rate")
    seen = set()
    for task in train[:20]:
        answer = int(task.metadata["answer"])
        for text in (f"{answer}", f" {answer} and more", f"{answer + 1}", "no number", "", f"<answer>{answer}"):
            mine = reward_from_verdict(score(answer, text, False).verdict, mode, fmt)
            payload = env.task_to_payload(task)
            theirs = reward_from_verdict(asyncio.run(env.score(payload, text, truncated=False)).verdict, mode, fmt)
            assert mine == theirs, (answer, text)
            seen.add(mine)
    assert seen == {0.0, 0.5, 1.0}  # right, a wrong number, no number: pass_rate's three rewards


def test_arith_peer_uses_the_fleets_base_model_and_lengths(tiny: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _cfg(1)
    assert cfg.policy.model_name == "tiny-qwen2"
    # The fleet's resolver: the locally made tiny model in the cache the fleet reads (here one made by the fixture).
    monkeypatch.setenv("GRPO_FLEET_CACHE", str(tmp_path))
    (tmp_path / "models").mkdir()
    (tmp_path / "models/tiny-qwen2").symlink_to(tiny)
    assert trl_peer.model_path(cfg) == Path(resolve_model("tiny-qwen2")) == tmp_path / "models/tiny-qwen2"
    # digits keeps its checkout-relative path.
    digits = trl_peer.recipe([])
    assert trl_peer.model_path(digits) == ROOT / ".cache/models/tiny-qwen2-digits_max-format"
    assert cfg.policy.generation.max_new_tokens == 64
    assert cfg.grpo.val_period == 10 and cfg.grpo.val_temperature == 1.0
