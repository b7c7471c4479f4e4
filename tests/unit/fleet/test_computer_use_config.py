"""The computer-use path's config rules hold at load time, before any model loads, with errors naming the keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.config import parse_config
from fleet.config.loader import ConfigError

CU = "data.train.dataset_name=computer_use"


def test_a_text_only_model_with_the_computer_use_env_is_a_named_error() -> None:
    with pytest.raises(ConfigError, match=r"policy\.model_name='tiny-qwen2' is a text-only model.*"
                                          r"data\.train\.dataset_name=computer_use"):
        parse_config({}, [CU])


def test_a_text_only_model_folder_is_refused_from_its_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    with pytest.raises(ConfigError, match=r"policy\.model_name=.*text-only model \(qwen2 \(text only\)\)"):
        parse_config({}, [CU, f"policy.model_name={tmp_path}"])


def test_a_validation_set_of_computer_use_selects_the_path_too() -> None:
    with pytest.raises(ConfigError, match="text-only model"):
        parse_config({"data": {"validation": {"dataset_name": "computer_use"}}}, [])


def test_the_hf_engine_cannot_serve_images() -> None:
    with pytest.raises(ConfigError, match=r"policy\.generation\.backend=hf cannot serve images"):
        parse_config({}, [CU, "policy.model_name=tiny-qwen2-vl", "policy.generation.backend=hf"])


def test_a_processor_folder_without_an_image_processor_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"policy\.tokenizer\.name=.*no preprocessor_config\.json"):
        parse_config({}, [CU, "policy.model_name=tiny-qwen2-vl", f"policy.tokenizer.name={tmp_path}"])


def test_the_tiny_vlm_with_the_computer_use_env_loads() -> None:
    cfg = parse_config({}, [CU, "policy.model_name=tiny-qwen2-vl",
                            "policy.vision.max_image_bytes_per_trajectory=65536"])
    assert cfg.policy.vision.max_image_bytes_per_trajectory == 65536
    parse_config({}, ["policy.model_name=tiny-qwen2-vl"])  # a VLM on a text task is fine


def test_the_image_bound_has_a_floor() -> None:
    with pytest.raises(ConfigError, match="max_image_bytes_per_trajectory"):
        parse_config({}, ["policy.vision.max_image_bytes_per_trajectory=10"])
