"""How `grpo-fleet up` wires its local processes to each other and to the task set."""

from pathlib import Path

from fleet.config import parse_config
from launch.topology import Ports, ProcessSpec, fleet_processes


def _sandbox(overrides: dict[str, object]) -> ProcessSpec:
    specs = fleet_processes(parse_config(overrides), None, [], Ports(1, 2, 3, [4]), "redis://x")
    return next(s for s in specs if s.role == "sandbox")


def test_local_sandbox_resolves_embedded_repositories_in_the_trained_task_set(tmp_path: Path) -> None:
    train = {"dataset_name": "swe_embedded", "data_path": str(tmp_path / "tasks")}
    assert f"sandbox.repos_root={tmp_path / 'tasks' / 'repos'}" in _sandbox({"data": {"train": train}}).argv


def test_a_configured_repos_root_is_left_alone() -> None:
    argv = _sandbox({"sandbox": {"repos_root": "/elsewhere"}}).argv
    assert not any(a.startswith("sandbox.repos_root=") for a in argv)


def test_every_local_service_gets_a_port_of_its_own() -> None:
    from launch.ports import pick_ports

    # The kernel may hand a just-released ephemeral port out again: a fleet once had its sandbox and replay buffer
    # on one port.
    rollout = parse_config({"rollout": {"num_workers": 4}}).rollout
    for _ in range(3000):  # the old picker collided about once in 1,000 draws
        ports, held = pick_ports(rollout)
        held.close()
        every = [ports.replay_buffer, ports.sandbox, ports.trainer, *ports.rollout]
        assert len(set(every)) == len(every) == 7
