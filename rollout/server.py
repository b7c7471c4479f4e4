"""`grpo-fleet serve rollout`: one rollout worker (engine + scorer + lease loop + RolloutWorker service)."""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from fleet.config import MasterConfig
from fleet.config.infra import RolloutConfig
from fleet.config.vision import uses_computer_use
from fleet.entry import service_main
from grpofleet.v1 import rollout_worker_pb2_grpc
from services.runtime.server import GrpcService, run, run_service
from workshop.resolve import resolve_model

if TYPE_CHECKING:
    from rollout.engine import GenerationEngine
    from rollout.worker import EpisodeRunners, RolloutWorker

log = logging.getLogger(__name__)


def advertised_host(rollout: RolloutConfig, listen_host: str) -> str:
    """Where the trainer reaches this worker: `rollout.advertise_host`, else the listen host
    (`services.rollout.host`) -- unless that is a wildcard (a container or pod listening on every interface), then
    this host's own address (its hostname resolved: the container's or pod's IP, which compose and Kubernetes put in
    /etc/hosts)."""
    host = rollout.advertise_host or listen_host
    if host in ("", "0.0.0.0", "::"):
        return socket.gethostbyname(socket.gethostname())
    return host


def worker_id(rollout: RolloutConfig) -> str:
    return rollout.worker_id or f"{socket.gethostname()}-{os.getpid()}"


def episode_runners(cfg: MasterConfig, engine: GenerationEngine, tokenizer: Any, wid: str) -> EpisodeRunners:
    """The worker's multi-turn runners, each given the config sections it reads. Computer use gets the model's
    multimodal processor (from `policy.tokenizer.name`, else the served folder: what the trainer loads)."""
    from rollout.agent.computer import ComputerRunner
    from rollout.agent.local import LocalToolRunner
    from rollout.agent.runner import AgentRunner
    from rollout.worker import EpisodeRunners

    agent = AgentRunner(cfg.env, cfg.policy, engine, tokenizer, wid) if cfg.env.code.mode == "agent" else None
    computer = None
    if uses_computer_use(cfg.data):
        from workshop.tinyvlm import load_processor

        processor = load_processor(cfg.policy.tokenizer.name or engine.model_path)
        computer = ComputerRunner(cfg.env, cfg.policy, engine, processor, wid)
    return EpisodeRunners(LocalToolRunner(cfg.env, cfg.policy, engine, tokenizer), agent, computer)


async def serve(cfg: MasterConfig) -> int:
    from buffer_client import BufferClient
    from fleet.tokenizer import load_tokenizer
    from rollout.engine import make_engine
    from rollout.engine.factory import max_images
    from rollout.scoring import Scorer
    from rollout.servicer import RolloutWorkerServicer
    from rollout.worker import Decoder, RolloutWorker

    model_path = resolve_model(cfg.policy.model_name)
    tokenizer = load_tokenizer(cfg.policy.tokenizer.name or model_path)
    images = max_images(cfg.env.computer_use if uses_computer_use(cfg.data) else None)
    engine = make_engine(cfg.policy, model_path, seed=cfg.grpo.seed, max_images_per_prompt=images)
    service = GrpcService("rollout", cfg.services.rollout, cfg.services)
    buffer = BufferClient(cfg.services, cfg.redis, cfg.run.dir)
    scorer = Scorer(cfg.env)
    # The port first: the launcher picked it free, and a vLLM engine's start (30 s on a loaded CPU host) opens
    # sockets of its own on random ports; bound after it, the port was once taken and the worker started twice.
    port = service.bind()
    await engine.start()
    host, wid = advertised_host(cfg.rollout, cfg.services.rollout.host), worker_id(cfg.rollout)
    runners = episode_runners(cfg, engine, tokenizer, wid)
    worker = RolloutWorker(cfg, wid, f"{host}:{port}", engine, scorer, buffer, Decoder(tokenizer), runners)
    service.add(rollout_worker_pb2_grpc.add_RolloutWorkerServicer_to_server,
                RolloutWorkerServicer(worker, cfg.policy.generation.backend), "grpofleet.v1.RolloutWorker")

    async def on_stop() -> None:
        await worker.drain(timeout_s=cfg.services.grace_s)
        write_summary(cfg.run.dir, cfg.policy.generation.backend, worker)
        await scorer.close()
        await buffer.close()
        await engine.stop()

    background = [worker.heartbeat_loop, worker.lease_loop, worker.engine_watch]
    return await run_service(service, background=background, on_stop=on_stop)


def write_summary(run_dir: str, backend: str, worker: RolloutWorker) -> None:
    """The worker's lifetime figures (tokens, groups, busy/idle/pause seconds), logged and written to
    `<run.dir>/logs/workers/<worker_id>-<UTC stop time>.json` for benchmarks and post-mortems (`backend`: the engine's
    name). One file per lifetime: a worker restarted by the healer, or a run resumed in another job, adds its own
    beside the earlier ones instead of writing over their figures."""
    summary = {"worker_id": worker.worker_id, "engine": backend, **worker.stats.summary()}
    if worker.scorer.verdicts is not None:
        summary["verdict_cache"] = worker.scorer.verdicts.stats()
    if figures := worker.engine.figures():
        summary["engine_figures"] = figures
    log.info("worker summary: %s", json.dumps(summary))
    try:
        folder = Path(run_dir) / "logs" / "workers"
        folder.mkdir(parents=True, exist_ok=True)
        stem = f"{worker.worker_id}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
        path, n = folder / f"{stem}.json", 1
        while path.exists():  # two lifetimes that ended in the same second: keep both
            path, n = folder / f"{stem}.{n}.json", n + 1
        path.write_text(json.dumps(summary, indent=1) + "\n")
    except OSError as exc:  # a read-only run dir must not turn a clean stop into a failure
        log.warning("could not write the worker summary: %s", exc)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `grpo-fleet serve rollout [--config FILE] [overrides...]`."""
    return service_main("grpo-fleet serve rollout", argv, serve_config)


def serve_config(cfg: MasterConfig) -> int:
    exit_now(run(lambda: serve(cfg)))


def exit_now(code: int) -> NoReturn:
    """Exit once the service has stopped in order (drained, clients closed, engine stopped): run the exit handlers,
    flush, and skip the interpreter's teardown. That teardown collects and frees the whole heap (torch, transformers,
    vLLM): 1.5-3 s after "rollout stopped" on a loaded 2-core host, which `docker compose down` waited out (issue
    18); the process's memory goes back to the OS anyway. It would also wait for any non-daemon thread left."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
