"""The GRPO loops. Every rank runs `TrainLoop.run()`; rank 0 alone talks to the fleet (through the Coordinator) and
broadcasts each step's batch, so all ranks take the same decisions in the same order.

Synchronous (`grpo.async_grpo.enabled=false`), step s:
  enqueue step s's prompts -> wait for all of them, scored (Sample, groups accumulate) -> train -> push version s+1
  to every worker and wait for the answers -> PublishVersion(s+1). Nothing is generated while training.

Asynchronous, step s:
  keep steps s .. s+max_age enqueued (workers at version v lease targets <= v + max_age, so they run ahead) ->
  take whole groups within the age bound, oldest first, as they come (a group, not a step, is the unit of waiting) ->
  recompute old log-probs, train with IS correction -> start pushing version s+1 in the background and go on to
  step s+1 at once; the main thread waits for a push only when the next one is ready (one push in flight at most).

Both: validation every `grpo.val_period` steps, a checkpoint every `checkpointing.save_period` steps followed by
CommitStep, metrics and a progress bar on rank 0, and a clean stop (checkpoint included) on SIGTERM or when the
`grpo.max_train_s` budget is spent (then with a last validation round).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import torch

from fleet.config.algorithm import GrpoConfig
from fleet.config.infra import CheckpointingConfig, LoggerConfig
from fleet.config.policy import PolicyConfig
from trainer.batch import StepBatch, build_step_batch
from trainer.checkpoint import CheckpointManager, TrainerCheckpoint
from trainer.coordinator import Coordinator
from trainer.dist import Dist
from trainer.grading import check_grading
from trainer.metrics import Metrics, Progress, age_histogram
from trainer.model import PolicyModule
from trainer.status import TrainerState
from trainer.step import StepRunner
from trainer.weights import gather_snapshot
from weightsync.dtypes import DTYPES
from weightsync.header import WeightSnapshot

log = logging.getLogger(__name__)

BUDGET_SPENT = "the grpo.max_train_s budget is spent"


@dataclass
class StepMessage:
    """What rank 0 broadcasts before each step."""

    batch: StepBatch | None
    stop: str = ""  # "" = train this batch; otherwise why the run ends ("done", "sigterm", "error: ...")
    wait_s: float = 0.0


@dataclass
class Rank0:
    coordinator: Coordinator
    metrics: Metrics
    progress: Progress
    state: TrainerState
    log_dir: Path


@dataclass
class TrainLoop:
    grpo: GrpoConfig
    policy_cfg: PolicyConfig
    checkpointing: CheckpointingConfig
    logger: LoggerConfig
    dist: Dist
    runner: StepRunner
    policy: PolicyModule
    ckpt: CheckpointManager | None
    progress_state: TrainerCheckpoint
    rank0: Rank0 | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    """Set by SIGTERM; rank 0's coordinator reads the same one (app.py hands it to both) to give up waiting."""
    saved_step: int = -1
    """The step of the newest checkpoint on disk (the one resumed from; -1: none): saving it again is skipped."""
    _push: concurrent.futures.Future[dict[str, float]] | None = None
    _pending_metrics: dict[str, float] = field(default_factory=dict)
    _last_validation: dict[str, float] = field(default_factory=dict)
    _validated_weights: int = -1
    """The weights step the last validation round measured."""
    _deadline: float | None = None
    """`grpo.max_train_s` after the first step's start (monotonic); None: no budget."""

    # -- entry --------------------------------------------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        s = self.progress_state
        self._begin(s)
        if self.grpo.max_train_s is not None:
            self._deadline = time.monotonic() + self.grpo.max_train_s
        code = 0
        while s.step < self.grpo.max_num_steps:
            msg = self.dist.broadcast_object(self._prepare(s.step) if self.dist.is_main else None)
            if msg.stop:
                code = 0 if msg.stop in ("done", "sigterm", BUDGET_SPENT) else 1
                log.log(logging.INFO if code == 0 else logging.ERROR, "stopping at step %d: %s", s.step, msg.stop)
                if msg.stop == BUDGET_SPENT:
                    self._validate_last(s)
                break
            self._train(msg)
        self._finish(s)
        return code

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        log.warning("signal %d: stopping after the current step (a checkpoint is saved)", signum)
        self.stop.set()

    # -- phases -------------------------------------------------------------------------------------------------------
    def _snapshot(self, s: TrainerCheckpoint) -> WeightSnapshot | None:
        """Every rank gathers; rank 0 keeps the weights with their identity (`s.weights`: run epoch, step)."""
        dtype_name = self.policy_cfg.weight_sync.dtype
        dtype = DTYPES[self.policy_cfg.precision if dtype_name == "auto" else dtype_name]
        return gather_snapshot(self.policy, dtype, keep=self.dist.is_main, weights=s.weights)

    def _begin(self, s: TrainerCheckpoint) -> None:
        # Rank 0 opens the run epoch first (the other ranks wait in the gather), so the snapshot is minted whole.
        resume = self.rank0.coordinator.begin_run(s.step) if self.rank0 is not None else {}
        if self.rank0 is not None:
            s.epoch = self.rank0.coordinator.epoch
        snapshot = self._snapshot(s)
        if self.rank0 is not None:
            assert snapshot is not None  # rank 0 keeps the weights it gathers
            r0 = self.rank0
            r0.state.set_phase("pushing_weights")
            metrics = {**resume, **r0.coordinator.begin(snapshot)}
            r0.metrics.log(s.step, metrics)
            if self.grpo.val_at_start:
                r0.state.set_phase("validating")
                self._validate(s.step, s.step)

    def _prepare(self, step: int) -> StepMessage:
        """Rank 0: enqueue ahead, wait for this step's groups, build the batch."""
        assert self.rank0 is not None
        r0 = self.rank0
        if self.stop.is_set():
            return StepMessage(None, "sigterm")
        if self._deadline is not None and time.monotonic() >= self._deadline:
            return StepMessage(None, BUDGET_SPENT)
        r0.state.set_phase("waiting_for_data")
        t0 = time.monotonic()
        try:
            r0.coordinator.enqueue_through(step + self.grpo.async_grpo.age_bound)
            groups = r0.coordinator.collect(step, self.grpo.num_prompts_per_step)
        except InterruptedError:
            return StepMessage(None, "sigterm")
        except Exception as exc:  # every rank must hear about it, or the others wait in the broadcast forever
            log.exception("step %d: no batch", step)
            return StepMessage(None, f"error: {exc}")
        g = self.grpo
        batch = build_step_batch(groups, step, leave_one_out=g.use_leave_one_out_baseline,
                                 normalize=g.normalize_rewards, max_len=self.policy_cfg.max_total_sequence_length)
        batch.stats.update(check_grading(step, groups, r0.coordinator.feeder.source.repo_of))
        return StepMessage(batch, wait_s=time.monotonic() - t0)

    def _train(self, msg: StepMessage) -> None:
        assert msg.batch is not None
        s, t0 = self.progress_state, time.monotonic()
        if self.rank0 is not None:
            self.rank0.state.set_phase("training")
        metrics = self.runner.run(msg.batch)
        t1 = time.monotonic()
        s.step += 1
        push_wait = self._publish(s)
        metrics.update({"timing/wait_data_s": msg.wait_s, "timing/train_step_s": t1 - t0,
                        "timing/push_wait_s": push_wait, "timing/step_s": msg.wait_s + time.monotonic() - t0})
        metrics["perf/tokens_per_s"] = metrics["perf/train_tokens"] / max(metrics["timing/step_s"], 1e-9)
        if self.rank0 is not None:
            self._log_step(msg.batch, metrics)
        if self.grpo.val_period and s.step % self.grpo.val_period == 0 and self.rank0 is not None:
            self._wait_push()  # validate the weights just trained, not the previous version
            self.rank0.state.set_phase("validating")
            self._validate(msg.batch.step, s.step)
        if self.checkpointing.enabled and s.step % self.checkpointing.save_period == 0:
            self._save(s)

    def _publish(self, s: TrainerCheckpoint) -> float:
        """Gather version s.step on every rank; rank 0 pushes it (sync: waits; async: in flight). Returns the time
        the training thread spent blocked on weights."""
        t0 = time.monotonic()
        snapshot = self._snapshot(s)
        if self.rank0 is None:
            return time.monotonic() - t0
        assert snapshot is not None  # rank 0 keeps the weights it gathers
        self.rank0.state.set_phase("pushing_weights")
        self._wait_push()
        self._push = self.rank0.coordinator.publish(snapshot)
        a = self.grpo.async_grpo
        if not a.enabled:
            self._wait_push()
        self.rank0.state.step = s.step
        return time.monotonic() - t0

    def _wait_push(self) -> None:
        if self._push is not None:
            self._pending_metrics.update(self._push.result())
            self._push = None

    def _log_step(self, batch: StepBatch, metrics: dict[str, float]) -> None:
        assert self.rank0 is not None
        r0 = self.rank0
        coord = r0.coordinator
        max_age = self.grpo.async_grpo.age_bound
        merged = {**batch.stats, **metrics, **age_histogram(batch.ages, max_age), **self._pending_metrics,
                  **{f"starvation/{k}": float(v) for k, v in coord.starvation.items()}}
        self._pending_metrics = {}
        r0.metrics.log(batch.step, merged)
        r0.metrics.histogram(batch.step, "age/histogram", [float(a) for a in batch.ages])
        r0.state.metrics = {**self._last_validation, **merged}
        with (r0.log_dir / "trained_groups.jsonl").open("a") as fh:
            fh.write(json.dumps({"step": batch.step, "epoch": coord.epoch, "groups": batch.group_ids,
                                 "tasks": batch.group_tasks, "rewards": [round(r, 4) for r in batch.group_rewards],
                                 "resolved": batch.group_resolved,
                                 "scoring_s_max": [round(x, 3) for x in batch.group_scoring_s_max]}) + "\n")
        r0.progress.update(merged, coord.buffer_stats() if self.logger.progress_bar else None)

    def _validate(self, log_step: int, weights_step: int) -> None:
        """A validation round of the weights after `weights_step` steps, logged at `log_step`; GetStatus keeps
        showing its metrics (verdict breakdown included) until the next round."""
        assert self.rank0 is not None
        round_ = self.rank0.coordinator.validate(weights_step)
        self._validated_weights = weights_step
        metrics = round_.metrics
        self.rank0.metrics.log(log_step, metrics)
        if round_.verdicts:
            with (self.rank0.log_dir / "validation_tasks.jsonl").open("a") as fh:
                fh.write(json.dumps({"step": weights_step, "verdicts": round_.verdicts, "errors": round_.errors,
                                     "answers": round_.answers}) + "\n")
        self._last_validation = {k: v for k, v in metrics.items() if k.startswith("val/")}
        self.rank0.state.metrics = {**self.rank0.state.metrics, **self._last_validation}

    def _validate_last(self, s: TrainerCheckpoint) -> None:
        """The round a budget stop owes: the final weights, unless the last round measured them already."""
        if not self.grpo.val_period or self.rank0 is None or self._validated_weights == s.step or s.step == 0:
            return
        self._wait_push()
        self.rank0.state.set_phase("validating")
        self._validate(s.step - 1, s.step)

    def _save(self, s: TrainerCheckpoint) -> None:
        if self.ckpt is None or s.step == self.saved_step:
            return
        if self.rank0 is not None:
            self.rank0.state.set_phase("checkpointing")
            feeder = self.rank0.coordinator.feeder
            feeder.mark_trained(s.step - 1)
            s.data_position = feeder.state()
            s.metrics = dict(self.rank0.metrics.latest)
        s.scheduler = self.runner.scheduler.state_dict()
        s.world_size = self.dist.world_size
        self.ckpt.save(self.policy, self.runner.optimizer, s)
        self.saved_step = s.step
        if self.rank0 is not None:
            try:
                self.rank0.coordinator.commit(s.step - 1)
            except Exception:  # the checkpoint stands; an uncommitted step is only returned again on a resume
                log.exception("CommitStep(%d) failed", s.step - 1)

    def _finish(self, s: TrainerCheckpoint) -> None:
        if self.rank0 is not None:
            self._wait_push()
        if self.checkpointing.enabled:
            self._save(s)
        if self.rank0 is not None:
            if self._pending_metrics:
                self.rank0.metrics.log(max(0, s.step - 1), self._pending_metrics)
            self.rank0.state.set_phase("done")
        if torch.cuda.is_available():
            torch.cuda.synchronize()
