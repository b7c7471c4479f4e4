"""compose.yaml and compose.gpu.yaml, checked without a Docker engine: they run the services of the topology source
(launch/topology.py) with its container commands, which run what `grpo-fleet up` runs; every command's config
validates; bubblewrap gets the options it needs and no more; the fleet image is built once, lean, from one
Dockerfile."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fleet.config import load_config
from launch.topology import CONTAINER_CONFIG, PREPARE_COMMAND, ROLE_COMMANDS, container_command

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
GPU = yaml.safe_load((ROOT / "compose.gpu.yaml").read_text())
SERVICES = COMPOSE["services"]
FLEET_ROLES = set(ROLE_COMMANDS)
CONFIG_VAR = "${GRPO_FLEET_CONFIG:-" + CONTAINER_CONFIG + "}"
FLEET_IMAGE = "grpo-fleet:${GRPO_FLEET_TARGET:-cpu}"


def _config_and_overrides(command: list[str]) -> tuple[str, list[str]]:
    i = command.index("--config")
    config = re.sub(r"^\$\{GRPO_FLEET_CONFIG:-(.*)\}$", r"\1", command[i + 1])
    return config, command[i + 2:]


def test_compose_runs_the_topology_roles_plus_redis_and_prepare() -> None:
    assert set(SERVICES) == FLEET_ROLES | {"redis", "prepare"}


@pytest.mark.parametrize("role", sorted(FLEET_ROLES | {"prepare"}))
def test_compose_command_is_the_topology_container_command(role: str) -> None:
    assert SERVICES[role]["command"] == container_command(role, CONFIG_VAR)


@pytest.mark.parametrize("role", sorted(FLEET_ROLES | {"prepare"}))
def test_container_command_runs_what_the_launcher_runs(role: str) -> None:
    command = container_command(role, "c.yaml")
    head = command[:command.index("--config")]
    if role == "trainer":
        launcher = [p.format(nproc=1) for p in ROLE_COMMANDS[role]]
        assert ["-m", "torch.distributed.run", *head[1:]] == launcher
    else:
        assert ["-m", "launch.cli", *head[1:]] == (PREPARE_COMMAND if role == "prepare" else ROLE_COMMANDS[role])


@pytest.mark.parametrize("compose,role", [(COMPOSE, r) for r in sorted(FLEET_ROLES | {"prepare"})] + [(GPU, "trainer")])
def test_compose_command_config_validates(compose: dict, role: str) -> None:
    config, overrides = _config_and_overrides(compose["services"][role]["command"])
    load_config(ROOT / config, overrides)


def test_every_long_running_service_has_a_healthcheck_and_an_init() -> None:
    for name, svc in SERVICES.items():
        assert svc.get("init") is True, name  # PID 1 forwards SIGTERM: `down` does not wait out the stop timeout
        if name != "prepare":
            assert "healthcheck" in svc, name


def test_bubblewrap_gets_what_it_needs_and_no_more() -> None:
    for name, svc in SERVICES.items():
        assert not svc.get("privileged"), name
        if name in ("sandbox", "prepare"):  # prepare validates the task set in the same sandbox
            assert svc["cap_add"] == ["SYS_ADMIN", "NET_ADMIN"]  # namespaces; the task's own loopback
            assert set(svc["security_opt"]) == {"seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"}
            # the sandbox's own cgroup namespace, for its per-task groups (the image's entrypoint makes it writable)
            assert svc.get("cgroup") == ("private" if name == "sandbox" else None), name
        else:
            assert "cap_add" not in svc and "security_opt" not in svc, name


def test_scalable_rollout_has_no_fixed_host_port_or_name() -> None:
    rollout = SERVICES["rollout"]
    assert "ports" not in rollout and "container_name" not in rollout
    assert not any("container_name" in s for s in SERVICES.values())


def test_services_restart_on_their_own_and_the_trainer_on_failure() -> None:
    for name in ("redis", "replay-buffer", "sandbox", "rollout"):
        assert SERVICES[name]["restart"] == "unless-stopped", name
    assert SERVICES["trainer"]["restart"].startswith("on-failure")  # a finished run (exit 0) stays finished
    assert SERVICES["prepare"]["restart"] == "no"


def test_redis_keeps_an_append_only_file_on_a_volume() -> None:
    redis = SERVICES["redis"]
    assert "--appendonly" in redis["command"] and "yes" in redis["command"]
    assert any(v.endswith(":/data") for v in redis["volumes"])


def test_the_fleet_image_is_built_once_and_used_by_every_fleet_service() -> None:
    assert [n for n, s in SERVICES.items() if "build" in s] == ["redis", "prepare"]
    args = SERVICES["prepare"]["build"]["args"]
    assert set(args) == {"BASE_IMAGE", "PIP_LOCAL"}  # public defaults; scripts/docker-base.sh sets local ones
    for role in FLEET_ROLES | {"prepare"}:
        assert SERVICES[role]["image"] == FLEET_IMAGE, role
        assert SERVICES[role]["pull_policy"] in ("never", "missing"), role  # made here, never pulled


def test_gpu_override_reserves_gpus_and_runs_the_trainer_command_on_one_gpu() -> None:
    for role in ("rollout", "trainer"):
        devices = GPU["services"][role]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]
    assert GPU["services"]["trainer"]["command"] == [*SERVICES["trainer"]["command"], "cluster.gpus_per_node=1",
                                                     "cluster.num_nodes=1"]


@pytest.mark.skipif(shutil.which("docker") is None, reason="needs the docker CLI with the compose plugin")
def test_gpu_override_renders_one_cuda_image_for_the_whole_fleet() -> None:
    out = subprocess.run(["docker", "compose", "-f", "compose.yaml", "-f", "compose.gpu.yaml", "config", "--format",
                          "json"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if out.returncode != 0 and "is not a docker command" in out.stderr:
        pytest.skip("no compose plugin")
    assert out.returncode == 0, out.stderr
    services = yaml.safe_load(out.stdout)["services"]
    for role in FLEET_ROLES | {"prepare"}:
        assert services[role]["image"] == "grpo-fleet:cuda", role
    build = services["prepare"]["build"]
    assert build["target"] == "cuda" and set(build["args"]) == {"BASE_IMAGE", "PIP_LOCAL"}


def _stages(dockerfile: str) -> dict[str, str]:
    """Stage name -> its text (FROM line included)."""
    parts = re.split(r"(?m)^(?=FROM )", dockerfile)
    return {m.group(1): p for p in parts if (m := re.match(r"FROM \S+ AS (\S+)", p))}


def test_dockerfile_has_cpu_cuda_and_redis_targets_without_a_toolchain_in_cpu() -> None:
    stages = _stages((ROOT / "Dockerfile").read_text())
    assert {"cpu", "cuda", "redis"} <= set(stages)
    for name in ("os", "runtime", "cpu", "redis"):
        assert not re.search(r"build-essential|\bgcc\b|python3-dev", stages[name]), name
    assert not re.search(r"build-essential|python3-dev", stages["cuda"])  # gcc only: triton compiles at run time
    assert re.match(r"FROM runtime AS cpu", stages["cpu"]) and "COPY --from=build-cpu /opt/venv" in stages["cpu"]
    # Both final images carry the sandbox's features: the browser, the image runtime's tools, the cgroup entrypoint.
    assert re.match(r"FROM runtime AS cuda", stages["cuda"])
    assert all(re.search(rf"\b{tool}\b", stages["runtime"]) for tool in ("chromium", "skopeo", "umoci"))
    assert "ENTRYPOINT" in stages["runtime"]


def test_fleet_services_get_the_launchers_cpu_host_environment() -> None:
    from fleet.config import parse_config
    from launch.topology import cpu_host_env

    wanted = cpu_host_env(parse_config({}).cluster, {})  # what `grpo-fleet up` gives each process on a CPU host
    assert wanted
    for role in FLEET_ROLES | {"prepare"}:
        env = SERVICES[role]["environment"]
        for key, value in wanted.items():
            assert env.get(key) == f"${{{key}:-{value}}}", (role, env)  # a value the user exports is kept
