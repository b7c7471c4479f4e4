"""`grpo-fleet up`: make what is missing (tiny model, task slice), then start the embedded Redis and every service
of the fleet as local processes on loopback, and supervise them until the trainer finishes (or Ctrl-C / SIGTERM)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Mapping
from pathlib import Path

from fleet.config import MasterConfig
from fleet.config.loader import write_resolved
from fleet.logs import setup_logging
from fleet.paths import ROOT, run_dir
from fleet.progress import waiting
from launch.ports import pick_ports
from launch.supervisor import FleetFailed, Supervisor
from launch.topology import ProcessSpec, check_cpu_affinity, embedded_redis_process, fleet_processes
from workshop.resolve import resolve_model

log = logging.getLogger(__name__)


def prepare(cfg: MasterConfig) -> None:
    """First run: make the tiny model and the task slice the config asks for (idempotent, with progress)."""
    with waiting(f"grpo-fleet: model {cfg.policy.model_name}"):
        model = resolve_model(cfg.policy.model_name)
    print(f"grpo-fleet: model ready at {model}", flush=True)
    from launch.data.prepare import prepare_dataset

    for ds in [cfg.data.train, cfg.data.validation]:
        if ds is not None:
            prepare_dataset(ds, grpo=cfg.grpo, sandbox=cfg.sandbox)


def _trained(metrics: Path) -> bool:
    try:
        return any('"loss/' in line for line in metrics.read_text().splitlines())
    except OSError:
        return False


async def _first_step(metrics: Path) -> None:
    """A line that ticks from "fleet up" to the first trained step: engines starting, the first weights reaching the
    workers, the first rollouts graded. Later steps are in the log and `grpo-fleet status`."""
    with waiting("grpo-fleet: first training step (engines start, first weights, first rollouts)"):
        while True:  # a file another process writes: polled, there is no event to wait on
            if await asyncio.to_thread(_trained, metrics):
                break
            await asyncio.sleep(1.0)
    print("grpo-fleet: first step trained", flush=True)


def vllm_ipc_folder(specs: list[ProcessSpec], environ: Mapping[str, str]) -> str | None:
    """A folder of the fleet's own for vLLM's ZeroMQ sockets (`VLLM_RPC_BASE_PATH`), given to every process; the
    caller removes it when the fleet has stopped. vLLM names them `<base>/<uuid>` (default base: /tmp) and an
    engine never removes its own: a clean 3-step `grpo-fleet up` of the computer-use example left 7 in /tmp. Short,
    under the system's temp folder, because a socket's path has at most 107 bytes. A base the user set is kept
    (None)."""
    if environ.get("VLLM_RPC_BASE_PATH"):
        return None
    folder = tempfile.mkdtemp(prefix="grpo-fleet-ipc-")
    for spec in specs:
        spec.env["VLLM_RPC_BASE_PATH"] = folder
    return folder


async def _run(cfg: MasterConfig, config_path: str | None, overrides: list[str]) -> int:
    rd = run_dir(cfg.run.dir)
    write_resolved(cfg, rd)
    redis_url = cfg.redis.url
    redis_specs: list[ProcessSpec] = []
    if not redis_url:
        # Supervised like every other process: restarted from its AOF when it exits, stopped last.
        redis_spec, redis_url = embedded_redis_process(rd / "redis", cfg.redis.appendfsync)
        redis_specs.append(redis_spec)
        print(f"grpo-fleet: embedded Redis at {redis_url} (AOF in {rd / 'redis'})", flush=True)
    ports, held = pick_ports(cfg.rollout)
    specs = redis_specs + fleet_processes(cfg, config_path, [*overrides, f"run.dir={rd}"], ports, redis_url)
    ipc = vllm_ipc_folder(specs, os.environ)
    sup = Supervisor(specs, rd / "logs" / "processes", cwd=ROOT, max_restarts=3)
    # Each port stays bound by the launcher until its service listens on it (launch/ports.py): a rollout worker
    # binds only after its imports, and the ephemeral range is the whole host's.
    releaser = asyncio.create_task(held.release_when_listening(), name="release-ports")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    rc = 1
    try:
        await sup.start_all()
        print(f"grpo-fleet: fleet up; run directory {rd}; `grpo-fleet status --config ... "
              f"services.replay_buffer.port={ports.replay_buffer} services.trainer.port={ports.trainer}` "
              "shows progress", flush=True)
        first_step = asyncio.create_task(_first_step(rd / "logs" / "metrics.jsonl"))
        try:
            rc = await sup.watch(stop)
        finally:
            first_step.cancel()
        if stop.is_set():
            print("grpo-fleet: stopping (trainer first, it writes a checkpoint) ...", flush=True)
            rc = 0
    except FleetFailed as exc:
        print(f"grpo-fleet: {exc}", flush=True)
        rc = 1
    finally:
        await sup.stop_all(grace_s=cfg.services.grace_s + 120)
        releaser.cancel()
        held.close()
        if ipc is not None:
            shutil.rmtree(ipc, ignore_errors=True)
        trainer = sup.procs.get("trainer")
        if stop.is_set() and trainer is not None and trainer.returncode not in (0, None, -signal.SIGTERM):
            rc = trainer.returncode or 1
    return rc


def up(cfg: MasterConfig, *, config_path: str | None, overrides: list[str]) -> int:
    setup_logging(cfg.logger.level, prefix="[up] ")
    check_cpu_affinity(cfg.cluster, os.sched_getaffinity(0))
    prepare(cfg)
    path = str(Path(config_path).resolve()) if config_path else None
    return asyncio.run(_run(cfg, path, list(overrides)))
