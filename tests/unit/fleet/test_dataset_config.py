"""`data.*` keys: any plausible split name, no gold-derived context, a 1800 s default task timeout."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from envs.swe.payload import payload_to_spec
from fleet.config.env import CodeEnvConfig, DatasetConfig
from fleet.contracts.sandbox import TaskSpec


@pytest.mark.parametrize("split", ["dev", "test", "train", "validation", "test_lite", "v2.1"])
def test_split_accepts_any_plausible_name(split):
    assert DatasetConfig(split=split).split == split


@pytest.mark.parametrize("split", ["", "../train", "data/dev", "dev*", "-dev"])
def test_split_refuses_names_that_are_not_split_names(split):
    with pytest.raises(ValidationError, match=r"data\.\*\.split: .* is not a split name"):
        DatasetConfig(split=split)


def test_oracle_context_is_refused_with_the_reason():
    with pytest.raises(ValidationError, match=r"data\.\*\.context: 'oracle' .* tells the policy where the fix is"):
        DatasetConfig(context="oracle")
    assert DatasetConfig().context == "bm25"


def test_task_timeout_defaults_to_the_swebench_harness_1800_s():
    payload = {"instance_id": "astropy__astropy-12907", "repo_url": "https://github.com/astropy/astropy.git",
               "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607", "test_patch": "", "fail_to_pass": ["t"],
               "pass_to_pass": [], "test_command": None}
    assert CodeEnvConfig().task_timeout == 1800.0
    assert TaskSpec(repo_url="embedded://x", base_commit="c", patch="").timeout == 1800.0
    assert payload_to_spec(payload, "").timeout == 1800.0
    assert payload_to_spec(payload, "", timeout=60).timeout == 60
