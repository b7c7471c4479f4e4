"""`policy.generation.vllm_cfg.cpu_threads`: where vLLM's CPU threads run (issue 35)."""

from __future__ import annotations

import pytest

from rollout.engine.vllm_engine import cpu_thread_env

cr_utils = pytest.importorskip("vllm.utils.cpu_resource_utils")


def test_auto_leaves_vllm_its_own_binding() -> None:
    assert cpu_thread_env("auto", {0, 1}, {}) == {}


def test_affinity_binds_a_thread_to_every_core_of_the_worker_and_keeps_none_back() -> None:
    env = cpu_thread_env("affinity", {3, 1, 2}, {})
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "1,2,3", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert cr_utils.parse_id_list(env["VLLM_CPU_OMP_THREADS_BIND"]) == [1, 2, 3]  # the form vLLM reads


def test_a_binding_set_by_the_user_wins_and_their_reserve_is_kept() -> None:
    assert cpu_thread_env("affinity", {0, 1}, {"VLLM_CPU_OMP_THREADS_BIND": "0"}) == {}
    env = cpu_thread_env("affinity", {0, 1}, {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"})
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
