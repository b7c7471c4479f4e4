"""The fleet's processes: which services run, with which command. The single source of truth for both
`grpo-fleet up` and compose.yaml (a test checks that compose runs the same roles with the same commands)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fleet.config import MasterConfig
from fleet.config.env import DatasetConfig
from fleet.config.infra import ClusterConfig, SandboxConfig

# Role -> the command that starts it, after the interpreter (compose uses the `grpo-fleet` script / torchrun).
ROLE_COMMANDS: dict[str, list[str]] = {
    "replay-buffer": ["-m", "launch.cli", "serve", "replay-buffer"],
    "sandbox": ["-m", "launch.cli", "serve", "sandbox"],
    "rollout": ["-m", "launch.cli", "serve", "rollout"],
    "trainer": ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node={nproc}", "trainer/main.py"],
}
# Made once before any service starts (tiny model, task set): in-process for `grpo-fleet up`, a one-shot container
# or init step elsewhere.
PREPARE_COMMAND = ["-m", "launch.cli", "prepare"]
# `grpo-fleet up` restarts a dead worker within seconds, so a trainer left without any for two minutes is waiting for
# nothing (services.no_worker_timeout_s; containers and pods keep the config's longer default).
LAUNCHER_NO_WORKER_TIMEOUT_S = 120.0


@dataclass
class ProcessSpec:
    name: str
    role: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    restartable: bool = True
    # "host:port" of its gRPC health endpoint, an http://.../healthz URL, or the unix:// URL of an embedded Redis
    # (PING); None = no readiness probe.
    ready: str | None = None
    # CPU cores the process (and its children) may run on; None = no pinning.
    cpus: list[int] | None = None


@dataclass
class Ports:
    replay_buffer: int
    sandbox: int
    trainer: int
    rollout: list[int]


def trainer_nproc(cluster: ClusterConfig) -> int:
    return max(1, cluster.gpus_per_node)


def role_argv(role: str, cluster: ClusterConfig, config_path: str | None, overrides: list[str]) -> list[str]:
    cmd = [part.format(nproc=trainer_nproc(cluster)) for part in ROLE_COMMANDS[role]]
    cfg_args = ["--config", config_path] if config_path else []
    return [sys.executable, *cmd, *cfg_args, *overrides]


def fleet_processes(cfg: MasterConfig, config_path: str | None, overrides: list[str], ports: Ports,
                    redis_url: str) -> list[ProcessSpec]:
    """The processes of one local fleet, in start order. Every process gets the same config plus the overrides
    that wire it to the others (ports, Redis URL, sandbox URL)."""
    host = "127.0.0.1"
    wiring = [
        f"redis.url={redis_url}",
        f"services.replay_buffer.host={host}",
        f"services.replay_buffer.port={ports.replay_buffer}",
        f"services.sandbox.host={host}",
        f"services.sandbox.port={ports.sandbox}",
        f"services.trainer.host={host}",
        f"services.trainer.port={ports.trainer}",
        f"env.code.sandbox_urls=[http://{host}:{ports.sandbox}]",
    ]
    base = [*overrides, *wiring]
    sandbox = [*base, *task_set_wiring(cfg.data.train, cfg.sandbox)]
    specs = [
        ProcessSpec("replay-buffer", "replay-buffer", role_argv("replay-buffer", cfg.cluster, config_path, base),
                    ready=f"{host}:{ports.replay_buffer}"),
        ProcessSpec("sandbox", "sandbox", role_argv("sandbox", cfg.cluster, config_path, sandbox),
                    ready=f"http://{host}:{ports.sandbox}/healthz"),
    ]
    for i, port in enumerate(ports.rollout):
        argv = role_argv("rollout", cfg.cluster, config_path,
                         [*base, f"services.rollout.port={port}", f"rollout.worker_id=rollout-{i}"])
        specs.append(ProcessSpec(f"rollout-{i}", "rollout", argv, ready=None))
    trainer = [*base]
    if "no_worker_timeout_s" not in cfg.services.model_fields_set:
        trainer.append(f"services.no_worker_timeout_s={LAUNCHER_NO_WORKER_TIMEOUT_S:g}")
    specs.append(ProcessSpec("trainer", "trainer", role_argv("trainer", cfg.cluster, config_path, trainer),
                             restartable=False))
    for spec in specs:
        spec.cpus = cfg.cluster.cpu_affinity.get(spec.role)  # type: ignore[call-overload]
        spec.env.update(cpu_host_env(cfg.cluster, os.environ))
    return specs


def cpu_host_env(cluster: ClusterConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """On a CPU host the fleets share its cores: an OpenMP thread that has finished its work must sleep, not spin
    for the next parallel region (libgomp's default), or it takes the core from the other fleet's threads (issue
    35: the trainer's reference forward 0.78 -> 1.27 s beside an idle vLLM engine's spinning threads). A value
    the user set is kept."""
    if cluster.gpus_per_node > 0 or "OMP_WAIT_POLICY" in environ:
        return {}
    return {"OMP_WAIT_POLICY": "PASSIVE"}


def task_set_wiring(train: DatasetConfig, sandbox: SandboxConfig) -> list[str]:
    """The sandbox resolves `embedded://NAME` in the task set the run trains on (`train`), unless
    `sandbox.repos_root` is set: without it every embedded task would be an infrastructure error."""
    if sandbox.repos_root is not None or train.dataset_name != "swe_embedded":
        return []
    from envs.swe.taskset import task_dir_of

    return [f"sandbox.repos_root={task_dir_of(train).resolve() / 'repos'}"]


def embedded_redis_process(data_dir: Path, appendfsync: str) -> tuple[ProcessSpec, str]:
    """The embedded Redis as a supervised process (first to start, last to stop) and its URL. Its data directory is
    prepared here: a server left running on it by an earlier launcher is shut down first."""
    from services.replay_buffer.embedded import prepare_server

    argv, sock = prepare_server(data_dir, appendfsync=appendfsync, log_to_file=False)
    url = f"unix://{sock}"
    return ProcessSpec("redis", "redis", argv, ready=url), url


def check_cpu_affinity(cluster: ClusterConfig, available: set[int]) -> None:
    """Fail before anything starts if a pinned core does not exist here (a config written for another machine)."""
    from fleet.config import ConfigError

    for role, cores in cluster.cpu_affinity.items():
        missing = sorted(set(cores) - available)
        if missing:
            raise ConfigError(f"cluster.cpu_affinity.{role}: cores {missing} are not available on this machine "
                              f"(available: {sorted(available)})")


# ---- containers and pods: each service its own host, found by its role's name, at a fixed port ----------------------
# compose.yaml and k8s/ are checked against (k8s/ generated from) what follows: same names, commands and wiring.
SERVICE_PORTS: dict[str, int] = {"redis": 6379, "replay-buffer": 50051, "sandbox": 9090, "rollout": 50060,
                                 "trainer": 50052}
CONTAINER_CONFIG = "examples/configs/grpo_swe_tiny.yaml"
"""The config the images run by default (compose: `${GRPO_FLEET_CONFIG:-...}`)."""
TASK_SET = "/cache/tasks"
"""Where the task set lies in the images' cache volume (GRPO_FLEET_CACHE=/cache)."""


def container_wiring(role: str) -> list[str]:
    """The overrides that wire `role` to the others when every service is a host named after its role."""
    port = SERVICE_PORTS
    if role not in ROLE_COMMANDS:
        return []
    key = role.replace("-", "_")
    own = [f"services.{key}.host=0.0.0.0", f"services.{key}.port={port[role]}"]
    buffer = ["services.replay_buffer.host=replay-buffer", f"services.replay_buffer.port={port['replay-buffer']}"]
    # The buffer's Redis is also the data plane: workers write scored groups' bytes there, the trainer reads them.
    redis = [f"redis.url=redis://redis:{port['redis']}/0"]
    if role == "replay-buffer":
        return [*redis, *own]
    if role == "sandbox":
        return [*own, f"sandbox.repos_root={TASK_SET}/repos"]
    return [*buffer, *redis, *own, f"env.code.sandbox_urls=[http://sandbox:{port['sandbox']}]"]


def container_command(role: str, config: str, *, torchrun: list[str] | None = None) -> list[str]:
    """The command of `role` in an image: the `grpo-fleet` script for services and `prepare`, torchrun for the
    trainer (`torchrun`: its launcher arguments; default one node, one process), then the config and the wiring."""
    if role == "prepare":
        head = ["grpo-fleet", *PREPARE_COMMAND[2:]]
    elif role == "trainer":
        head = ["torchrun", *(torchrun or ["--standalone", "--nproc-per-node=1"]), "trainer/main.py"]
    else:
        head = ["grpo-fleet", *ROLE_COMMANDS[role][2:]]
    return [*head, "--config", config, *container_wiring(role)]
