"""`docker compose up` for real: the images built from the Dockerfile, the whole fleet in containers with two rollout
replicas, one of them `docker kill`ed mid-run, and the run completes with every group accounted for -- the same
accounting as test_fleet_e2e.py. Starts a Docker engine if none runs (scripts/docker-engine.sh) and leaves the host as
it found it: the project's containers, networks and volumes removed, an engine it started stopped and its iptables
rules, FORWARD policy, ip_forward and bridges undone. Image layers stay in the engine's storage: the build cache.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "tests/e2e/configs/compose_short.yaml"  # 4 steps of 2 groups, a task slice of one repository
RUN = "/app/runs/compose_e2e"
STEPS, GROUPS_PER_STEP = 4, 2
ACCOUNTING = """
import asyncio, json
from redis.asyncio import Redis
from services.replay_buffer.store import ReplayStore, StoreSettings
async def main():
    client = Redis.from_url("redis://redis:6379/0")
    acc = await ReplayStore(client, StoreSettings()).accounting()
    print(json.dumps({"by_state": dict(acc.by_state), "violations": [str(v) for v in acc.violations]}))
    await client.aclose()
asyncio.run(main())
"""


def _sh(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 900,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"{shlex.join(cmd)} exited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}")
    return done


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A Docker engine with the compose plugin (started here if none runs) and the local base images' variables."""
    if os.geteuid() != 0:
        pytest.skip("starting a Docker engine needs root")
    env = {**os.environ, "GRPO_FLEET_DOCKER_STATE": str(tmp_path_factory.mktemp("docker-state")),
           "COMPOSE_BAKE": "false"}
    script = str(ROOT / "scripts" / "docker-engine.sh")
    _sh([script, "start"], env, timeout=300)
    try:
        exports = _sh([str(ROOT / "scripts" / "docker-base.sh")], env, timeout=1500).stdout
        for word in shlex.split(exports.strip().removeprefix("export ")):
            key, _, value = word.partition("=")
            env[key] = value
        yield env
    finally:
        # Keep the layer cache bounded: every rebuild leaves the previous image dangling (GBs each run otherwise).
        _sh(["docker", "image", "prune", "-f"], env, timeout=300, check=False)
        _sh(["docker", "builder", "prune", "-f", "--keep-storage", "12GB"], env, timeout=300, check=False)
        _sh([script, "stop"], env, timeout=120)


def _compose(env: dict[str, str], project: str, *args: str, timeout: float = 900,
             check: bool = True) -> subprocess.CompletedProcess[str]:
    return _sh(["docker", "compose", "-p", project, *args], env, timeout=timeout, check=check)


def _trained_steps(env: dict[str, str], project: str) -> list[int]:
    out = _compose(env, project, "exec", "-T", "replay-buffer", "cat", f"{RUN}/logs/metrics.jsonl", check=False)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []
    return sorted({int(r["step"]) for r in rows if any(k.startswith("loss/") for k in r)})


def _trainer_state(env: dict[str, str], project: str) -> tuple[str, int]:
    out = _compose(env, project, "ps", "-a", "--format", "json", "trainer").stdout.strip()
    rows = [json.loads(line) for line in out.splitlines() if line.strip()] if out else []
    if not rows:
        return "absent", -1
    return str(rows[0]["State"]), int(rows[0].get("ExitCode", -1))


def _wait_for_the_run(env: dict[str, str], project: str, timeout: float = 1500) -> str | None:
    """Kill one rollout replica once a step has trained; return its id after the trainer exited."""
    killed = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _trainer_state(env, project)[0] == "exited":  # done, or failed past its restart policy
            return killed
        if killed is None and _trained_steps(env, project):
            replicas = _compose(env, project, "ps", "-q", "rollout").stdout.split()
            assert len(replicas) == 2, replicas
            killed = replicas[1]
            _sh(["docker", "kill", killed], env)
        time.sleep(3)
    raise AssertionError(f"the run did not finish within {timeout:.0f} s")


def _stops_gracefully(env: dict[str, str], project: str) -> None:
    """`compose stop` (compose.yaml's stop_grace_period, as a user gets it): every running service exits on its
    SIGTERM, none is SIGKILLed (exit 137) after the grace period."""
    def containers() -> list[dict[str, object]]:
        out = _compose(env, project, "ps", "-a", "--format", "json").stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    running = {str(c["Name"]) for c in containers() if c["State"] == "running"}
    t = time.monotonic()
    _compose(env, project, "stop", timeout=300)
    print(f"compose stop in {time.monotonic() - t:.1f} s ({len(running)} running services)")
    codes = {str(c["Name"]): int(str(c.get("ExitCode", -1))) for c in containers() if c["Name"] in running}
    assert running and all(code != 137 for code in codes.values()), f"killed after the grace period: {codes}"


def test_compose_fleet_survives_a_killed_rollout_container(engine: dict[str, str]) -> None:
    env = {**engine, "GRPO_FLEET_CONFIG": CONFIG}
    project = f"grpo-e2e-{os.getpid()}"
    t0 = time.monotonic()
    _compose(env, project, "build", timeout=2400)
    print(f"images built in {time.monotonic() - t0:.0f} s")
    try:
        _compose(env, project, "up", "-d", "--scale", "rollout=2", timeout=1500)
        killed = _wait_for_the_run(env, project)
        state, code = _trainer_state(env, project)
        logs = _compose(env, project, "logs", "--tail", "60", "trainer", check=False).stdout
        assert (state, code) == ("exited", 0), logs
        assert killed, "no rollout container was killed: the test did not test anything"
        assert _trained_steps(env, project) == list(range(STEPS))
        out = _compose(env, project, "exec", "-T", "replay-buffer", "python", "-c", ACCOUNTING).stdout
        acc = json.loads(out.strip().splitlines()[-1])
        assert acc["violations"] == [], acc
        assert acc["by_state"].get("sampled", 0) == STEPS * GROUPS_PER_STEP, acc
        _stops_gracefully(env, project)
    finally:
        t1 = time.monotonic()
        _compose(env, project, "down", "-v", "--remove-orphans", timeout=300)
        print(f"compose down in {time.monotonic() - t1:.1f} s; whole test {time.monotonic() - t0:.0f} s")
    left = _sh(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"], env).stdout
    assert not left.strip(), f"containers left behind: {left}"
    vols = _sh(["docker", "volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={project}"], env).stdout
    assert not vols.strip(), f"volumes left behind: {vols}"
