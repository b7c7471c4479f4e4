"""The config tree: YAML + overrides, errors that name the dotted key, async constraints, shipped configs."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.config import ConfigError, MasterConfig, load_config, parse_config
from fleet.config.loader import dump_config, write_resolved

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = sorted(p for p in ROOT.glob("examples/**/*.yaml") if "recipe" not in p.name)


def test_defaults_validate() -> None:
    cfg = load_config(None)
    assert isinstance(cfg, MasterConfig)
    assert cfg.env.code.sandbox_urls == ["http://localhost:9090"]
    assert cfg.grpo.num_prompts_per_step == 16 and cfg.grpo.num_generations_per_prompt == 8


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_config_validates(path: Path) -> None:
    load_config(path)


def test_shipped_configs_exist() -> None:
    names = {p.name for p in SHIPPED}
    assert {"grpo_swe.yaml", "grpo_swe_tiny.yaml"} <= names


def test_seed_launch_line_overrides_apply() -> None:
    cfg = load_config(ROOT / "examples/configs/grpo_swe.yaml",
                      ["cluster.gpus_per_node=8", "cluster.num_nodes=4", "policy.model_name=Qwen/Qwen2.5-7B-Instruct"])
    assert cfg.cluster.gpus_per_node == 8 and cfg.cluster.num_nodes == 4
    assert cfg.policy.model_name == "Qwen/Qwen2.5-7B-Instruct"
    assert cfg.grpo.async_grpo.enabled and cfg.grpo.async_grpo.in_flight_weight_updates


def test_override_values_parse_as_yaml_scalars_and_lists() -> None:
    cfg = load_config(None, ["grpo.seed=7", "policy.optimizer.lr=3e-4", "grpo.normalize_rewards=false",
                             "env.code.sandbox_urls=[http://a:1,http://b:2]", "policy.generation.top_k=null"])
    assert cfg.grpo.seed == 7 and cfg.policy.optimizer.lr == pytest.approx(3e-4)
    assert cfg.grpo.normalize_rewards is False
    assert cfg.env.code.sandbox_urls == ["http://a:1", "http://b:2"]
    assert cfg.policy.generation.top_k is None


def test_misspelled_override_names_key_and_closest_match() -> None:
    with pytest.raises(ConfigError, match=r"policy\.generation\.temprature.*policy\.generation\.temperature"):
        load_config(None, ["policy.generation.temprature=0.5"])


def test_misspelled_key_in_file_names_dotted_path(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("grpo:\n  async_grpo:\n    max_trajectory_age: 3\n")
    with pytest.raises(ConfigError, match=r"grpo\.async_grpo\.max_trajectory_age.*max_trajectory_age_steps"):
        load_config(f)


def test_bad_value_names_dotted_key() -> None:
    with pytest.raises(ConfigError, match=r"grpo\.num_generations_per_prompt"):
        load_config(None, ["grpo.num_generations_per_prompt=0"])
    with pytest.raises(ConfigError, match=r"policy\.generation\.backend"):
        load_config(None, ["policy.generation.backend=tgi"])


def test_plus_adds_and_tilde_deletes(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("grpo:\n  seed: 5\n")
    assert load_config(f, ["~grpo.seed"]).grpo.seed == 42
    assert load_config(f, ["+grpo.val_period=3"]).grpo.val_period == 3
    with pytest.raises(ConfigError, match=r"~grpo\.val_period.*not set"):
        load_config(f, ["~grpo.val_period"])
    with pytest.raises(ConfigError, match=r"unknown config key 'grpo\.nonsense'"):
        load_config(f, ["+grpo.nonsense=1"])


def test_malformed_override_is_rejected() -> None:
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["grpo.seed"])


def test_defaults_inheritance_merges_nested_sections(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("grpo:\n  seed: 1\n  max_num_steps: 9\n")
    (tmp_path / "top.yaml").write_text("defaults: [base]\ngrpo:\n  seed: 2\n")
    cfg = load_config(tmp_path / "top.yaml")
    assert cfg.grpo.seed == 2 and cfg.grpo.max_num_steps == 9


def test_defaults_cycle_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("defaults: [b]\n")
    (tmp_path / "b.yaml").write_text("defaults: [a]\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "a.yaml")


def test_missing_file_and_bad_yaml_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("grpo: [\n")
    with pytest.raises(ConfigError, match="bad.yaml: invalid YAML"):
        load_config(tmp_path / "bad.yaml")


ASYNC = ["grpo.async_grpo.enabled=true", "loss_fn.use_importance_sampling_correction=true"]


def test_async_requires_importance_sampling_correction() -> None:
    with pytest.raises(ConfigError, match="loss_fn.use_importance_sampling_correction=true"):
        load_config(None, ["grpo.async_grpo.enabled=true"])


def test_async_requires_positive_max_age() -> None:
    with pytest.raises(ConfigError, match=r"max_trajectory_age_steps must be >= 1"):
        load_config(None, [*ASYNC, "grpo.async_grpo.max_trajectory_age_steps=0"])


def test_in_flight_updates_require_async() -> None:
    with pytest.raises(ConfigError, match="in_flight_weight_updates=true requires grpo.async_grpo.enabled"):
        load_config(None, ["grpo.async_grpo.in_flight_weight_updates=true"])


def test_colocated_generation_is_rejected_with_reason() -> None:
    with pytest.raises(ConfigError, match="colocated.enabled=true is not supported"):
        load_config(None, ["policy.generation.colocated.enabled=true"])


def test_async_with_sync_vllm_engine_is_rejected() -> None:
    with pytest.raises(ConfigError, match="vllm_cfg.async_engine=true"):
        load_config(None, [*ASYNC, "policy.generation.vllm_cfg.async_engine=false"])


def test_batch_sizes_must_divide() -> None:
    with pytest.raises(ConfigError, match="policy.train_global_batch_size"):
        load_config(None, ["policy.train_global_batch_size=48"])
    with pytest.raises(ConfigError, match="policy.train_micro_batch_size"):
        load_config(None, ["policy.train_global_batch_size=32", "policy.train_micro_batch_size=5"])


def test_truncated_is_needs_bounds_and_correction() -> None:
    with pytest.raises(ConfigError, match="truncated_importance_sampling_ratio \\(upper bound\\)"):
        load_config(None, ["loss_fn.use_importance_sampling_correction=true",
                           "loss_fn.truncated_importance_sampling_type=tis"])
    with pytest.raises(ConfigError, match="use_importance_sampling_correction=true"):
        load_config(None, ["loss_fn.truncated_importance_sampling_type=tis",
                           "loss_fn.truncated_importance_sampling_ratio=2"])


TIS = ["loss_fn.use_importance_sampling_correction=true", "loss_fn.truncated_importance_sampling_type=tis",
       "loss_fn.truncated_importance_sampling_ratio=2.0"]


@pytest.mark.parametrize(("overrides", "match"), [
    (["loss_fn.reference_policy_kl_type=k1"], "loss_fn.reference_policy_kl_type"),
    (["loss_fn.reference_policy_kl_penalty=-0.1"], "loss_fn.reference_policy_kl_penalty"),
    (["loss_fn.ratio_clip_c=1.0"], "loss_fn.ratio_clip_c"),
    (["loss_fn.ratio_clip_min=1.5"], "loss_fn.ratio_clip_min"),
    (["loss_fn.ratio_clip_max=-0.1"], "loss_fn.ratio_clip_max"),
    (["loss_fn.sequence_level_importance_ratios=true"], "loss_fn.token_level_loss=false"),
    (["loss_fn.truncated_importance_sampling_ratio=2.0"], "loss_fn.truncated_importance_sampling_type is null"),
    (["loss_fn.truncated_importance_sampling_ratio_min=0.5"], "loss_fn.truncated_importance_sampling_type is null"),
    (TIS[1:], "loss_fn.use_importance_sampling_correction=true"),
    ([*TIS[:2], "loss_fn.truncated_importance_sampling_ratio=0"], "loss_fn.truncated_importance_sampling_ratio"),
    ([*TIS[:2]], "loss_fn.truncated_importance_sampling_ratio (upper bound) must be set"),
    ([*TIS, "loss_fn.truncated_importance_sampling_type=clip"], "loss_fn.truncated_importance_sampling_type"),
    ([*TIS, "loss_fn.truncated_importance_sampling_type=icepop"], "loss_fn.truncated_importance_sampling_ratio_min"),
    ([*TIS, "loss_fn.truncated_importance_sampling_ratio_min=2.5"], "ratio_min (2.5) must be <="),
    ([*TIS, "loss_fn.truncated_importance_sampling_type=seq-mask-tis",
      "loss_fn.truncated_importance_sampling_ratio_min=0.5", "loss_fn.sequence_level_importance_ratios=true",
      "loss_fn.token_level_loss=false"],
     "cannot be combined with loss_fn.sequence_level_importance_ratios=true"),
])
def test_every_loss_rule_is_checked_at_load_naming_the_key(overrides: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(match)):
        load_config(None, overrides)


def test_tis_accepts_equal_bounds_and_no_lower_bound() -> None:
    assert load_config(None, [*TIS, "loss_fn.truncated_importance_sampling_ratio_min=2.0"])
    assert load_config(None, TIS).loss_fn.truncated_importance_sampling_ratio_min is None


def test_config_check_rejects_what_the_trainer_would_with_exit_status_2() -> None:
    # The example from issue 14: this bound used to pass `config check` and fail in the trainer after torch loaded.
    proc = subprocess.run([sys.executable, "-m", "launch.cli", "config", "check",
                           "loss_fn.truncated_importance_sampling_ratio=2.0"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert "loss_fn.truncated_importance_sampling_ratio" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("enabled", "want"), [(False, 0), (True, 3)])
def test_age_bound_is_the_max_age_only_when_async(enabled: bool, want: int) -> None:
    flags = [*ASYNC, "grpo.async_grpo.max_trajectory_age_steps=3"] if enabled else [
        "grpo.async_grpo.max_trajectory_age_steps=3"]
    assert load_config(None, flags).grpo.async_grpo.age_bound == want


def test_resolved_config_round_trips(tmp_path: Path) -> None:
    cfg = load_config(None, ["grpo.seed=11"])
    path = write_resolved(cfg, tmp_path / "run")
    again = load_config(path)
    assert again == cfg
    assert dump_config(again) == path.read_text()


def test_parse_config_does_not_mutate_input() -> None:
    tree = {"grpo": {"seed": 1}}
    parse_config(tree, ["grpo.seed=2"])
    assert tree == {"grpo": {"seed": 1}}


def test_configuration_reference_page_is_current() -> None:
    from fleet.config import reference

    assert (ROOT / "docs/configuration.md").read_text() == reference.render(), (
        "docs/configuration.md is stale: run `python -m fleet.config.reference`")


def test_every_config_field_has_a_docstring() -> None:
    from pydantic import BaseModel

    from fleet.config.loader import _section_type

    missing = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            if not field.description:
                missing.append(prefix + name)
            sub = _section_type(field.annotation)
            if sub is not None:
                walk(sub, f"{prefix}{name}.")

    walk(MasterConfig, "")
    assert missing == []


def test_fail_to_pass_first_is_refused_with_a_reward_that_pays_pass_to_pass() -> None:
    assert load_config(None, ["env.code.reward_mode=fail_to_pass", "env.code.fail_to_pass_first=true"])
    assert load_config(None, ["env.code.fail_to_pass_first=true"]).env.code.reward_mode == "binary"
    with pytest.raises(ConfigError, match=r"env\.code\.fail_to_pass_first.*pass_rate"):
        load_config(None, ["env.code.reward_mode=pass_rate", "env.code.fail_to_pass_first=true"])
