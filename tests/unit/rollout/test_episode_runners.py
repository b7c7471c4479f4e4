"""`rollout/server.py: episode_runners` composes a worker's multi-turn runners from the config: a sandbox-session
runner only in agent mode, in-process tools always, and the runners read the sections they were given."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fleet.config import parse_config
from fleet.tokenizer import load_tokenizer
from rollout.server import advertised_host, episode_runners, worker_id
from workshop.tinymodel import ensure_tiny_model


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> object:
    return load_tokenizer(ensure_tiny_model(tmp_path_factory.mktemp("m") / "tiny"))


def test_agent_mode_gets_a_session_runner_and_single_shot_does_not(tokenizer: object) -> None:
    none: Any = None
    single = episode_runners(parse_config({}), none, none, "w")
    assert single.agent is None and single.computer is None and single.local_tools is not None
    cfg = parse_config({}, ["env.code.mode=agent", "env.code.sandbox_urls=[http://127.0.0.1:9]",
                            "env.code.agent.max_turns=3"])
    agent = episode_runners(cfg, none, tokenizer, "w").agent
    assert agent is not None
    try:
        assert agent.limits.max_turns == 3 and agent.sessions.urls == ["http://127.0.0.1:9"]
        assert agent.sessions.owner.startswith("w/"), "the sessions belong to this worker process"
    finally:
        asyncio.run(agent.close())


def test_the_worker_advertises_its_configured_host_and_id() -> None:
    cfg = parse_config({}, ["rollout.advertise_host=10.0.0.7", "rollout.worker_id=r1"])
    assert (advertised_host(cfg.rollout, "0.0.0.0"), worker_id(cfg.rollout)) == ("10.0.0.7", "r1")
    assert advertised_host(parse_config({}).rollout, "127.0.0.1") == "127.0.0.1"
