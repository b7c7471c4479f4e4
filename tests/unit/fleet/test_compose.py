"""compose.yaml, checked without a Docker engine: it parses, runs the roles `grpo-fleet up` runs with the same
commands, every command's config validates, scalable services have no fixed host ports or names."""

from pathlib import Path

import pytest
import yaml

from fleet.config import load_config
from fleet.launcher.topology import ROLE_COMMANDS

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
GPU = yaml.safe_load((ROOT / "compose.gpu.yaml").read_text())
FLEET_ROLES = set(ROLE_COMMANDS)


def _split(command: list[str]) -> tuple[list[str], str, list[str]]:
    """compose command -> (role command in launcher form, config path, overrides)."""
    if command[0] == "grpo-fleet":
        head = ["-m", "fleet.cli", *command[1:3]]
        rest = command[3:]
    else:
        assert command[0] == "torchrun"
        i = command.index("trainer/main.py")
        head = ["-m", "torch.distributed.run", *command[1:i + 1]]
        rest = command[i + 1:]
    assert rest[0] == "--config", f"{command}: --config must follow the role"
    return head, rest[1], rest[2:]


def test_compose_runs_exactly_the_launcher_roles_plus_redis() -> None:
    assert set(COMPOSE["services"]) == FLEET_ROLES | {"redis"}


@pytest.mark.parametrize("role", sorted(FLEET_ROLES))
def test_compose_command_matches_launcher(role: str) -> None:
    head, _, _ = _split(COMPOSE["services"][role]["command"])
    expected = [p.format(nproc=1) for p in ROLE_COMMANDS[role]]
    assert head == expected


@pytest.mark.parametrize("compose,role", [(COMPOSE, r) for r in sorted(FLEET_ROLES)] + [(GPU, "trainer")])
def test_compose_command_config_validates(compose: dict, role: str) -> None:
    _, config, overrides = _split(compose["services"][role]["command"])
    load_config(ROOT / config, overrides)


def test_every_service_has_a_healthcheck() -> None:
    for name, svc in COMPOSE["services"].items():
        assert "healthcheck" in svc, name


def test_scalable_rollout_has_no_fixed_host_port_or_name() -> None:
    rollout = COMPOSE["services"]["rollout"]
    assert "ports" not in rollout and "container_name" not in rollout
    assert not any("container_name" in s for s in COMPOSE["services"].values())


def test_services_restart_on_their_own_and_the_trainer_on_failure() -> None:
    services = COMPOSE["services"]
    for name in ("redis", "replay-buffer", "sandbox", "rollout"):
        assert services[name]["restart"] == "unless-stopped", name
    assert services["trainer"]["restart"].startswith("on-failure")  # a finished run (exit 0) stays finished


def test_redis_keeps_an_append_only_file_on_a_volume() -> None:
    redis = COMPOSE["services"]["redis"]
    assert "--appendonly" in redis["command"] and "yes" in redis["command"]
    assert any(v.endswith(":/data") for v in redis["volumes"])


def test_gpu_override_reserves_gpus_for_rollout_and_trainer() -> None:
    for role in ("rollout", "trainer"):
        devices = GPU["services"][role]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]


def test_dockerfile_has_cpu_and_cuda_targets() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert " AS cpu" in text and " AS cuda" in text
