"""Wiring of one trainer process: distributed set-up, model, optimizer, resume, rank 0's coordinator, the loop.

`trainer/main.py` validates the config (no torch) and calls `run()`. Order matters for resume: the newest checkpoint
is found first, the policy is built from ITS weights, the optimizer/scheduler/RNG/data position are restored, and
only then does rank 0 begin a run epoch and push those weights to the workers (TrainLoop._begin).
"""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

import torch

from fleet.config import MasterConfig
from fleet.config.loader import dump_config, write_resolved
from trainer.checkpoint import CheckpointManager, TrainerCheckpoint
from trainer.coordinator import Coordinator
from trainer.data import DataPosition, PromptFeeder, TaskSource
from trainer.dist import Dist, pick_device, read_env
from trainer.loop import Rank0, TrainLoop
from trainer.metrics import Metrics, Progress
from trainer.model import build_policy, build_reference, resolve_model_path
from trainer.status import TrainerState
from trainer.step import StepRunner, make_optimizer
from trainer.vlm import attach_image_codec

log = logging.getLogger(__name__)


def _under(run_dir: Path, sub: str) -> Path:
    p = Path(sub)
    return p if p.is_absolute() else run_dir / p


def _sources(cfg: MasterConfig, model_path: str,
             sources: tuple[TaskSource, TaskSource | None] | None) -> tuple[TaskSource, TaskSource | None]:
    if sources is not None:
        return sources
    from fleet.tokenizer import load_tokenizer
    from trainer.tasks import SourceDeps, load_sources

    tokenizer = load_tokenizer(cfg.policy.tokenizer.name or model_path)
    deps = SourceDeps(cfg.env, cfg.grpo.seed, cfg.sandbox.repos_root)
    return load_sources(cfg.data, tokenizer, deps, validate=bool(cfg.grpo.val_period or cfg.grpo.val_at_start))


def _rank0(cfg: MasterConfig, dist: Dist, state: TrainerCheckpoint, run_dir: Path,
           sources: tuple[TaskSource, TaskSource | None], stop: threading.Event) -> Rank0:
    train, val = sources
    g = cfg.grpo
    position = DataPosition.from_json(state.data_position) if state.data_position else None
    feeder = PromptFeeder(train, num_prompts=g.num_prompts_per_step, num_generations=g.num_generations_per_prompt,
                          seed=g.seed, shuffle=cfg.data.shuffle, position=position)
    status = TrainerState(step=state.step, max_steps=g.max_num_steps,
                          world_size=dist.world_size, async_mode=g.async_grpo.enabled)
    coordinator = Coordinator(cfg, feeder, val, status, dist.device, stop_requested=stop.is_set)
    log_dir = _under(run_dir, cfg.logger.log_dir)
    metrics = Metrics(cfg.logger, log_dir, run_name=cfg.run.name, run_config=cfg.model_dump(mode="json"))
    progress = Progress(cfg.logger.progress_bar, g.max_num_steps, state.step)
    return Rank0(coordinator, metrics, progress, status, log_dir)


def run(cfg: MasterConfig, *, sources: tuple[TaskSource, TaskSource | None] | None = None) -> int:
    """Train until `grpo.max_num_steps` (or SIGTERM). `sources` replaces the envs registry (tests)."""
    env = read_env()
    device = pick_device(env)
    # Ranks > 0 wait in a broadcast while rank 0 waits for a step's data and, at most once per step, a validation
    # round: each may take up to grpo.sample_timeout_s.
    dist = Dist(env, device, timeout_s=2 * cfg.grpo.sample_timeout_s + 900)
    rank0: Rank0 | None = None
    try:
        run_dir = Path(cfg.run.dir).resolve()
        model_path = resolve_model_path(cfg.policy.model_name) if dist.is_main else ""
        if dist.is_main:
            write_resolved(cfg, run_dir)
            try:
                src = _sources(cfg, model_path, sources)
            except FileNotFoundError as exc:
                # The trainer only reads a task set; building one runs the sandbox executor (the launch floor).
                print(f"trainer: no training tasks: {exc}\n`grpo-fleet up` and `grpo-fleet prepare --config FILE` "
                      "build the embedded set's first slice before the fleet starts; `grpo-fleet data build` builds "
                      "the full set", file=sys.stderr, flush=True)
                return 1
        dist.barrier()  # rank 0 made the tiny model, if it had to
        model_path = resolve_model_path(cfg.policy.model_name)
        ckpt = CheckpointManager(cfg.checkpointing, _under(run_dir, cfg.checkpointing.checkpoint_dir), dist,
                                 cfg.policy.tokenizer.name or model_path, resolved_config=dump_config(cfg))
        latest = ckpt.latest() if cfg.checkpointing.resume else None
        if latest is not None:
            log.info("resuming from %s", latest)
        policy = build_policy(cfg.policy, str(latest / "model") if latest else model_path, dist)
        kl = cfg.loss_fn.reference_policy_kl_penalty > 0
        reference = build_reference(cfg.policy, model_path, dist) if kl else None
        attach_image_codec([policy, reference], model_path, cfg.policy.tokenizer.name or model_path)
        optimizer, scheduler = make_optimizer(policy, cfg.policy.optimizer)
        state = TrainerCheckpoint(step=0)
        if latest is not None:
            state = ckpt.load(latest, policy, optimizer)
            scheduler.load_state_dict(state.scheduler)
        else:
            torch.manual_seed(cfg.grpo.seed + env.rank)
        runner = StepRunner(cfg.policy, cfg.grpo, cfg.loss_fn, dist, policy, reference, optimizer, scheduler,
                            pad_multiple=64 if device.type == "cuda" else 1)
        stop = threading.Event()  # SIGTERM (the loop's handler) also ends the coordinator's waits
        if dist.is_main:
            rank0 = _rank0(cfg, dist, state, run_dir, src, stop)
        loop = TrainLoop(cfg.grpo, cfg.policy, cfg.checkpointing, cfg.logger, dist, runner, policy,
                         ckpt if cfg.checkpointing.enabled else None, state, rank0, stop=stop,
                         saved_step=state.step if latest is not None else -1)
        if rank0 is not None:
            rank0.coordinator.start()
        return loop.run()
    finally:
        if rank0 is not None:
            rank0.progress.close()
            rank0.metrics.close()
            rank0.coordinator.close()
        dist.close()
