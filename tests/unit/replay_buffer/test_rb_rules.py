"""The buffer's rules as pure functions (rules.py): the specification the Lua scripts implement."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.config import load_config
from services.replay_buffer import rules
from services.replay_buffer.models import StoreSettings

steps = st.integers(min_value=0, max_value=10_000)
ages = st.integers(min_value=0, max_value=8)


def test_sync_mode_has_age_bound_zero() -> None:
    flags = ["grpo.async_grpo.max_trajectory_age_steps=3", "loss_fn.use_importance_sampling_correction=true"]
    assert load_config(None, flags).grpo.async_grpo.age_bound == 0
    assert load_config(None, [*flags, "grpo.async_grpo.enabled=true"]).grpo.async_grpo.age_bound == 3


def test_settings_take_the_bound_from_config() -> None:
    sync = load_config(None, ["grpo.async_grpo.max_trajectory_age_steps=4"])
    assert StoreSettings.from_config(sync).max_age == 0
    on = load_config(
        None,
        [
            "grpo.async_grpo.enabled=true",
            "grpo.async_grpo.max_trajectory_age_steps=4",
            "loss_fn.use_importance_sampling_correction=true",
        ],
    )
    s = StoreSettings.from_config(on)
    assert s.max_age == 4
    assert s.max_response_bytes < on.services.max_message_mb * 1024 * 1024


@given(target=steps, floor=steps, step=steps, version=steps, max_age=ages)
def test_a_leased_group_is_young_enough_for_every_step_it_can_train(
    target: int, floor: int, step: int, version: int, max_age: int
) -> None:
    """Whatever the worker generates has min_version >= version; the group trains no earlier than its effective
    target; so eligibility implies the age bound holds at the earliest step the group can train."""
    if rules.lease_eligible(target, floor, step, version, max_age):
        earliest = rules.effective_target(target, floor, step)
        assert rules.within_age(earliest, version, max_age)


@given(target=steps, floor=steps, step=steps, version=steps, max_age=ages)
def test_newer_weights_never_lose_eligibility(target: int, floor: int, step: int, version: int, max_age: int) -> None:
    if rules.lease_eligible(target, floor, step, version, max_age):
        assert rules.lease_eligible(target, floor, step, version + 1, max_age)
        assert rules.lease_eligible(target, floor, step, version, max_age + 1)


def test_floor_and_current_step_retarget_old_groups() -> None:
    assert rules.effective_target(3, 10, 0) == 10
    assert rules.effective_target(3, 0, 7) == 7
    assert rules.effective_target(12, 10, 7) == 12
    # A worker on version 8 with bound 1 cannot take a group whose step is already 10: its output would be evicted.
    assert not rules.lease_eligible(3, 10, 0, 8, 1)
    assert rules.lease_eligible(3, 10, 0, 9, 1)


@pytest.mark.parametrize(
    ("pending", "outstanding", "live", "evicted", "reason"),
    [
        (0, 0, 1, 0, "no_prompts"),
        (0, 0, 1, 2, "evicted"),
        (5, 0, 0, 0, "no_workers"),
        (5, 2, 1, 0, "generating"),
        (5, 0, 1, 1, "evicted"),
        (5, 0, 1, 0, "workers_behind"),
    ],
)
def test_starvation_reason(pending: int, outstanding: int, live: int, evicted: int, reason: str) -> None:
    got = rules.starvation_reason(
        prompts_pending=pending, leases_outstanding=outstanding, live_workers=live, evicted_now=evicted
    )
    assert got == reason


@given(ms=st.integers(0, 2**63 - 1), seq=st.integers(0, 2**63 - 1), epoch=st.integers(0, 2**40))
def test_lease_id_round_trip(ms: int, seq: int, epoch: int) -> None:
    lease_id = rules.format_lease_id(f"{ms}-{seq}", epoch)
    assert rules.parse_lease_id(lease_id) == (f"{ms}-{seq}", epoch)


@pytest.mark.parametrize("bad", ["", "abc", "1-0", "1-0@", "@3", "1@3", "1-0@x", "1-0@3@4", " 1-0@3"])
def test_malformed_lease_ids_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="malformed lease id"):
        rules.parse_lease_id(bad)
