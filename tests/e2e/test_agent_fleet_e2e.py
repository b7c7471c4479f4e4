"""The whole fleet in agent mode on CPU -- tiny model, the batched `hf` engine, real sandbox sessions, real Redis --
through `grpo-fleet up`, asynchronous with in-flight pushes and two rollout workers. One worker is SIGKILLed while its
episodes hold sandbox sessions: the executor removes them once their owner stops renewing, and the run completes
with every group accounted for. Trajectories have several turns, the loss counts exactly the generated tokens.

The engine is the in-process `hf` one: what this test checks lives in the worker's episode loop, the sandbox and the
buffer, and the vLLM path has its own fleet tests (test_fleet_e2e.py, test_chaos.py). A vLLM engine costs about
20 CPU-seconds of imports in its three processes before it loads a model, and this test starts three."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import ROOT, fleet_cmd, metrics
from test_fleet_e2e import _accounting, _steps

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

AGENT = ["env.code.mode=agent", "env.code.agent.max_turns=3", "env.code.agent.max_new_tokens_per_turn=24",
         "env.code.agent.max_observation_tokens=48", "env.code.agent.command_timeout_s=10",
         "env.code.agent.episode_timeout_s=300", "policy.max_total_sequence_length=1536",
         "data.train.max_prompt_length=1200", "sandbox.sessions.lease_s=5", "grpo.max_num_steps=3",
         "rollout.num_workers=2", "grpo.async_grpo.max_trajectory_age_steps=2", "replay_buffer.lease_timeout_s=20",
         "policy.generation.backend=hf"]


def _sandbox_url(run_dir: Path) -> str | None:
    log = run_dir / "logs" / "processes" / "sandbox.log"
    found = re.search(r"listening on ([\d.]+:\d+)", log.read_text()) if log.exists() else None
    return f"http://{found.group(1)}" if found else None


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


def _sessions_by_worker(url: str) -> dict[str, list[str]]:
    """rollout worker -> the sessions it holds now (an owner is `WORKER/episode`)."""
    held: dict[str, list[str]] = {}
    for s in _get(f"{url}/session?all=1")["sessions"]:
        held.setdefault(s["owner"].split("/", 1)[0], []).append(s["session_id"])
    return held


def test_agent_fleet_runs_multi_turn_episodes_and_leaves_no_session_behind(task_slice: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "agent"
    # The launcher does not point the executor at the task slice's repositories: sessions need them.
    cmd = fleet_cmd(run_dir, task_slice, *AGENT, f"sandbox.repos_root={task_slice / 'repos'}")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    seen: dict[str, Any] = {}

    def killer() -> None:
        # Kill the first worker seen holding sessions (mid-episode), then watch the executor remove them. Which
        # worker that is depends on which engine came up first: on a loaded machine one worker can sample every group.
        deadline = time.monotonic() + 1500
        while time.monotonic() < deadline and proc.poll() is None:
            pids, url = run_dir / "logs" / "processes" / "pids.json", _sandbox_url(run_dir)
            try:
                held = _sessions_by_worker(url) if url and pids.exists() else {}
            except OSError:
                held = {}
            worker = next((w for w in sorted(held) if w.startswith("rollout-")), None)
            if worker and "pid" not in seen:
                pid = json.loads(pids.read_text())[worker]
                os.killpg(pid, signal.SIGKILL)
                seen.update(worker=worker, pid=pid, orphans=held[worker], url=url, killed_at=time.monotonic())
            if "pid" in seen:
                try:
                    live = {s["session_id"] for s in _get(f"{seen['url']}/session?all=1")["sessions"]}
                except OSError:
                    return
                if not live & set(seen["orphans"]):
                    seen["reaped_after_s"] = time.monotonic() - seen["killed_at"]
                    seen["health"] = _get(f"{seen['url']}/healthz")
                    return
            time.sleep(0.2)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    out, _ = proc.communicate(timeout=1800)
    thread.join(timeout=5)
    assert proc.returncode == 0, out[-6000:]
    assert "pid" in seen, "no worker was seen holding a session: the test did not test anything"
    assert "reaped_after_s" in seen, f"the killed worker's sessions {seen['orphans']} were never removed"
    assert seen["health"]["sessions_reaped"].get("owner_lost", 0) >= 1
    assert _steps(run_dir) == [0, 1, 2]
    assert _accounting(run_dir).get("sampled", 0) == 3 * 2
    rows = [r for r in metrics(run_dir) if "agent/episodes" in r]
    assert rows, "no agent metrics: the trainer saw no agent trajectories"
    for r in rows:
        assert r["agent/turns_mean"] >= 2, "episodes of several turns"
        assert r["agent/observation_tokens_mean"] > 0
        # One minibatch per step: the loss counts exactly the generated tokens, never the observations.
        assert r["loss/valid_tokens"] == pytest.approx(r["agent/generated_tokens_mean"] * r["agent/episodes"])
    assert max(r["age/max"] for r in metrics(run_dir) if "age/max" in r) <= 2
    print("agent e2e:", json.dumps({"killed": seen["worker"], "reaped_after_s": round(seen["reaped_after_s"], 1),
                                    "orphans": len(seen["orphans"]),
                                    "steps": [{k: v for k, v in r.items() if k.startswith(("agent/", "loss/valid"))}
                                              for r in rows]}))
