"""Generated tasks: deterministic, disjoint splits, registered like arith, payload and prompt per the contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from envs.computer_use.tasks import FAMILIES, make_tasks, split_of
from envs.registry import load_dataset, make_environment
from fleet.config.env import ComputerUseEnvConfig, DatasetConfig, EnvConfig


def test_tasks_are_deterministic_from_seed_and_split() -> None:
    a, b = make_tasks(3, "train", 12, FAMILIES, (224, 224)), make_tasks(3, "train", 12, FAMILIES, (224, 224))
    assert [t.html for t in a] == [t.html for t in b] and [t.check for t in a] == [t.check for t in b]
    assert [t.family for t in a[:4]] == list(FAMILIES), "families come in turn"
    assert [t.key for t in make_tasks(4, "train", 12, FAMILIES, (224, 224))] != [t.key for t in a]


def test_train_and_validation_parameter_sets_are_disjoint_whatever_the_seeds() -> None:
    train = {t.key for seed in (0, 1) for t in make_tasks(seed, "train", 800, FAMILIES, (224, 224))}
    validation = {t.key for seed in (0, 7) for t in make_tasks(seed, "validation", 200, FAMILIES, (224, 224))}
    assert not train & validation
    assert all(split_of(t.family, t.params) == "validation"
               for t in make_tasks(0, "validation", 40, FAMILIES, (224, 224)))


def test_dataset_and_environment_are_registered_like_arith() -> None:
    env_cfg = EnvConfig(computer_use=ComputerUseEnvConfig(num_tasks=8, num_validation_tasks=4,
                                                          families=["click_button", "pick_option"],
                                                          viewport=[280, 168]))
    train = load_dataset(DatasetConfig(dataset_name="computer_use"), env_cfg=env_cfg, seed=0)
    val = load_dataset(DatasetConfig(dataset_name="computer_use", split="test"), env_cfg=env_cfg, seed=0)
    assert (len(train), len(val), train.env_name) == (8, 4, "computer_use")
    assert {t.split for t in val} == {"validation"} and {t.metadata["family"] for t in train} == {
        "click_button", "pick_option"}
    payload = make_environment("computer_use", env_cfg).task_to_payload(train[0])
    assert payload["viewport"] == [280, 168] and "width:280px;height:168px" in payload["html"]
    assert {"html", "check", "instruction", "action_timeout_s", "max_actions"} <= set(payload)
    assert "solution" not in payload, "the reference solution never goes to the sandbox"


@pytest.mark.parametrize("viewport", [[230, 224], [224], [28, 28]])
def test_viewport_must_be_whole_qwen2_vl_patches(viewport: list[int]) -> None:
    with pytest.raises(ValidationError, match=r"env.computer_use.viewport: .* multiple of 28"):
        ComputerUseEnvConfig(viewport=viewport)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from fleet.tokenizer import load_tokenizer
    from workshop.tinymodel import ensure_tiny_model

    path: Path = ensure_tiny_model(tmp_path_factory.mktemp("m") / "tiny")
    return load_tokenizer(path)


def test_prompt_is_text_only_with_the_tools_and_the_instruction(tokenizer: Any) -> None:
    env = make_environment("computer_use", EnvConfig())
    task = load_dataset(DatasetConfig(dataset_name="computer_use", max_samples=1), seed=0)[0]
    prompt = env.build_prompt(task, tokenizer, 4096)
    assert task.problem_statement in prompt.text and '"name": "click"' in prompt.text
    assert "<|vision_start|>" not in prompt.text, "the first screenshot is the runner's first observation"
    assert prompt.token_ids == list(tokenizer(prompt.text, add_special_tokens=False)["input_ids"])
    with pytest.raises(ValueError, match="exceeds data.\\*.max_prompt_length=16"):
        env.build_prompt(task, tokenizer, 16)
