"""`docker compose up` for real: the images built from the Dockerfile, the whole fleet in containers with two rollout
replicas, one of them `docker kill`ed mid-run, and the run completes with every group accounted for -- the same
accounting as test_fleet_e2e.py. Then the sandbox container alone, through its HTTP API: a computer-use session in the
image's Chromium, an image task pulled and unpacked by the image's skopeo and umoci, and a task stopped by its per-task
cgroup (compose's `cgroup: private` and the image's entrypoint). Starts a Docker engine if none runs
(scripts/docker-engine.sh) and leaves the host as it found it: the project's containers, networks and volumes removed,
an engine it started stopped and its iptables rules, FORWARD policy, ip_forward and bridges undone. Image layers stay
in the engine's storage: the build cache.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

ROOT = Path(__file__).resolve().parents[2]
for helpers in ("sandbox", "images", "computer_use"):  # the calc repo and its images, the button task
    sys.path.insert(0, str(ROOT / "tests" / "integration" / helpers))

from computer_helpers import button_task, click_on, payload  # noqa: E402
from image_helpers import REGISTRY_CONFIG, ImageSet, free_port  # noqa: E402
from sandbox_helpers import make_calc_repo  # noqa: E402

from envs.swe.images import OciBuilder, base_tarball, make_testbed  # noqa: E402
from fleet.contracts.sandbox import Verdict  # noqa: E402
from sandbox_client import SandboxClient  # noqa: E402
from sandbox_client.computer import ComputerClient, ComputerVerdict  # noqa: E402

# One Docker engine per host, shared with the image tests' Docker runtime: one xdist lane (tests/conftest.py).
# timeout: the image build alone may take 10 minutes on a cold host (pyproject's default of 900 s cut a run short).
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]

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


def _trained_groups(env: dict[str, str], project: str) -> dict[int, list[str]]:
    """Step -> the groups it trained (the last record of each step: a resumed trainer retrains the steps its
    checkpoint did not cover)."""
    out = _compose(env, project, "exec", "-T", "replay-buffer", "cat", f"{RUN}/logs/trained_groups.jsonl").stdout
    last: dict[int, list[str]] = {}
    for rec in (json.loads(line) for line in out.splitlines() if line.strip()):
        last[int(rec["step"])] = [str(g) for g in rec["groups"]]
    return last


def _trainer_state(env: dict[str, str], project: str) -> tuple[str, int]:
    out = _compose(env, project, "ps", "-a", "--format", "json", "trainer").stdout.strip()
    rows = [json.loads(line) for line in out.splitlines() if line.strip()] if out else []
    if not rows:
        return "absent", -1
    return str(rows[0]["State"]), int(rows[0].get("ExitCode", -1))


def _wait_for_the_run(env: dict[str, str], project: str, timeout: float = 1500) -> tuple[str | None, float]:
    """Kill one rollout replica (`docker kill`: SIGKILL to the whole container, its engine included) once a
    step has trained, while the trainer trains the next; return its id and when it was killed, after the trainer
    exited."""
    killed, at = None, 0.0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _trainer_state(env, project)[0] == "exited":  # done, or failed past its restart policy
            return killed, at
        if killed is None and _trained_steps(env, project):
            replicas = _compose(env, project, "ps", "-q", "rollout").stdout.split()
            assert len(replicas) == 2, replicas
            killed = replicas[1]
            _sh(["docker", "kill", killed], env)
            at = time.time()
        if killed is not None:
            # The kill is done: from here only the trainer's exit matters, and the engine reports it (`docker wait`)
            # instead of a `compose ps` every few seconds. A crash it restarts from (on-failure) ends the wait too:
            # its state is then not "exited" and the loop waits again.
            trainer = _compose(env, project, "ps", "-a", "-q", "trainer").stdout.split()
            left = deadline - time.monotonic()
            if trainer and left > 0:
                try:
                    _sh(["docker", "wait", trainer[0]], env, timeout=left, check=False)
                except subprocess.TimeoutExpired:
                    break
                if _trainer_state(env, project)[0] == "exited":
                    return killed, at
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
        killed, killed_at = _wait_for_the_run(env, project)
        state, code = _trainer_state(env, project)
        logs = _compose(env, project, "logs", "--tail", "60", "trainer", check=False).stdout
        assert (state, code) == ("exited", 0), logs
        assert killed, "no rollout container was killed: the test did not test anything"
        assert _trained_steps(env, project) == list(range(STEPS))
        # Exact accounting: every step trained exactly its groups, none of them twice (the killed replica's leases
        # were reclaimed and generated again, not lost or doubled), and the buffer agrees.
        trained = _trained_groups(env, project)
        every = [g for gs in trained.values() for g in gs]
        assert sorted(trained) == list(range(STEPS)), trained
        assert all(len(gs) == GROUPS_PER_STEP for gs in trained.values()), trained
        assert len(every) == len(set(every)), f"a group trained twice: {trained}"
        out = _compose(env, project, "exec", "-T", "replay-buffer", "python", "-c", ACCOUNTING).stdout
        acc = json.loads(out.strip().splitlines()[-1])
        assert acc["violations"] == [], acc
        assert acc["by_state"].get("sampled", 0) == STEPS * GROUPS_PER_STEP, acc
        print(f"rollout replica killed at {time.strftime('%H:%M:%S', time.localtime(killed_at))}; "
              f"run finished {time.time() - killed_at:.0f} s later")
        _stops_gracefully(env, project)
    finally:
        t1 = time.monotonic()
        _compose(env, project, "down", "-v", "--remove-orphans", timeout=300)
        print(f"compose down in {time.monotonic() - t1:.1f} s; whole test {time.monotonic() - t0:.0f} s")
    left = _sh(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"], env).stdout
    assert not left.strip(), f"containers left behind: {left}"
    vols = _sh(["docker", "volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={project}"], env).stdout
    assert not vols.strip(), f"volumes left behind: {vols}"


SANDBOX_CONFIG = "tests/e2e/configs/compose_sandbox.yaml"  # cgroups required, task memory 512 MB, registry over HTTP
MEMORY_HOG = "python -c 'b = b\"x\" * (1 << 30)'"  # 1 GiB touched: over the task's 512 MB, within one process's 2 GB


def _addresses(env: dict[str, str], project: str, service: str) -> tuple[str, str]:
    """The container's address and its network's gateway (the host, as the container sees it)."""
    cid = _compose(env, project, "ps", "-q", service).stdout.split()[0]
    fmt = "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{.Gateway}}{{end}}"
    ip, gateway = _sh(["docker", "inspect", "-f", fmt, cid], env).stdout.split()
    return ip, gateway


def _registry(root: Path, gateway: str) -> tuple[subprocess.Popen[bytes], str]:
    """docker-registry on the gateway address (reachable from the container), answering."""
    port = free_port()
    root.mkdir(parents=True)
    (root / "config.yml").write_text(REGISTRY_CONFIG.format(root=root / "data", port=port).replace(
        "127.0.0.1", gateway))
    proc = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://{gateway}:{port}/v2/", timeout=2):
                return proc, f"{gateway}:{port}"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"docker-registry did not answer on {gateway}:{port}") from None
            time.sleep(0.1)


def _push_calc(root: Path, registry: str) -> ImageSet:
    """The image tests' calc instance image (the cached Debian base plus /testbed), in the registry."""
    repo = make_calc_repo(root / "calc")
    builder = OciBuilder(root / "oci")
    builder.base(base_tarball())
    make_testbed(repo.path, repo.base, root / "tb")
    builder.instance("calc", root / "tb")
    builder.push("calc", f"{registry}/swe/calc:v1")
    return ImageSet(registry, repo, f"{registry}/swe/calc:v1", "", "", builder)


async def _exercise_the_sandbox(url: str, images: ImageSet) -> tuple[Verdict, Verdict, dict[str, object],
                                                                     ComputerVerdict]:
    """The gold patch on the image task, the memory hog as its eval script, /healthz, a right click in a browser."""
    async with SandboxClient([url], task_timeout=300) as client:
        gold = await client.run(images.spec(images.repo.gold))
        hog = await client.run(images.spec(images.repo.gold, eval_script=MEMORY_HOG))
    async with aiohttp.ClientSession() as http, http.get(f"{url}/healthz") as resp:
        health = await resp.json()
    computer = ComputerClient([url], owner="compose-e2e", max_retries=1, backoff_s=0.5)
    try:
        task = button_task(0)
        session = await computer.open(payload(task))
        await session.act(click_on(task, task.metadata["params"][1]))
        clicked = await session.finish()
    finally:
        await computer.close()
    return gold, hog, health, clicked


def test_compose_sandbox_runs_a_browser_an_image_task_and_a_memory_limited_task(
        engine: dict[str, str], tmp_path: Path) -> None:
    env = {**engine, "GRPO_FLEET_CONFIG": SANDBOX_CONFIG}
    project = f"grpo-sbx-{os.getpid()}"
    t0 = time.monotonic()
    _compose(env, project, "build", "prepare", timeout=2400)  # built already by the fleet test: cached
    registry = None
    try:
        _compose(env, project, "up", "-d", "--no-deps", "--wait", "sandbox", timeout=300)
        ip, gateway = _addresses(env, project, "sandbox")
        registry, host = _registry(tmp_path / "registry", gateway)
        images = _push_calc(tmp_path, host)
        gold, hog, health, clicked = asyncio.run(_exercise_the_sandbox(f"http://{ip}:9090", images))
    finally:
        if registry is not None:
            registry.terminate()
            registry.wait(10)
        logs = _compose(env, project, "logs", "--tail", "40", "sandbox", check=False).stdout
        _compose(env, project, "down", "-v", "--remove-orphans", timeout=300)
        print(f"sandbox features checked in {time.monotonic() - t0:.0f} s")
    assert gold.status == "completed" and gold.resolution == "FULL", (gold, logs)  # skopeo + umoci + bwrap
    assert "memory limit of the task reached" in hog.stderr_tail, (hog, logs)  # the task's cgroup stopped it
    assert health["image_cgroups"] is True and health["image_unpacks"] == 1, health
    assert (clicked.passed, clicked.status) == (True, "passed"), clicked  # Chromium rendered, clicked, checked
