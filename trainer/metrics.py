"""One metrics interface for the trainer (rank 0): TensorBoard (default), W&B (optional), JSONL; and the progress bar.

Callers hand `log(step, {name: float})` and `histogram(step, name, values)`; backends decide how to store them.
JSONL is the machine-readable record (tests and `grpo-fleet status` read it): one object per step.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Protocol

from fleet.config.infra import LoggerConfig, WandbConfig

log = logging.getLogger(__name__)


class Backend(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def histogram(self, step: int, name: str, values: list[float]) -> None: ...

    def close(self) -> None: ...


class JsonlBackend:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: (v if math.isfinite(v) else None) for k, v in metrics.items()}  # JSON has no inf/nan
        # Wall-clock stamp: plots against time (sync vs async) need it, and TensorBoard records its own.
        self._append({"step": step, "time": time.time(), **clean})

    def histogram(self, step: int, name: str, values: list[float]) -> None:
        self._append({"step": step, "histogram": name, "values": values})

    def _append(self, record: dict[str, Any]) -> None:
        # One write per record (a line-buffered text file splits one longer than its 8 KiB buffer). Even one write
        # is not atomic for a concurrent reader (the page cache fills page by page), so readers use `read_jsonl`.
        data = (json.dumps(record, sort_keys=True) + "\n").encode()
        while data:
            data = data[os.write(self._fd, data):]

    def close(self) -> None:
        os.close(self._fd)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The complete records of a JSONL file another process may be appending to; a missing file has none.

    The last line is skipped until its newline lands, so a poll that races a write never sees half a record.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    complete = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


class TensorBoardBackend:
    def __init__(self, path: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._w = SummaryWriter(log_dir=str(path))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self._w.add_scalar(k, v, step)
        self._w.flush()

    def histogram(self, step: int, name: str, values: list[float]) -> None:
        if values:
            import numpy as np

            self._w.add_histogram(name, np.asarray(values, dtype=np.float64), step)

    def close(self) -> None:
        self._w.close()


class WandbBackend:
    def __init__(self, wb: WandbConfig, path: Path, *, run_name: str, run_config: dict[str, Any]) -> None:
        import wandb

        self._wandb = wandb
        self._run = wandb.init(project=wb.project, name=wb.name or run_name, dir=str(path), config=run_config,
                               resume="allow")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(metrics, step=step)

    def histogram(self, step: int, name: str, values: list[float]) -> None:
        self._run.log({name: self._wandb.Histogram(values)}, step=step)

    def close(self) -> None:
        self._run.finish()


class Metrics:
    """Fan-out to the configured backends; a failing backend is logged and dropped, never fatal to training."""

    def __init__(self, lg: LoggerConfig, log_dir: Path, *, run_name: str = "",
                 run_config: dict[str, Any] | None = None) -> None:
        """`run_name`, `run_config`: what W&B records the run as (the run's name, the whole resolved config)."""
        self.backends: list[Backend] = []
        if lg.jsonl_enabled:
            self.backends.append(JsonlBackend(log_dir / "metrics.jsonl"))
        if lg.tensorboard_enabled:
            self.backends.append(TensorBoardBackend(log_dir / "tensorboard"))
        if lg.wandb_enabled:
            self.backends.append(WandbBackend(lg.wandb, log_dir, run_name=run_name, run_config=run_config or {}))
        self.latest: dict[str, float] = {}

    def _each(self, method: str, *args: Any) -> None:
        for b in list(self.backends):
            try:
                getattr(b, method)(*args)
            except Exception:
                log.exception("metrics backend %s failed; disabled", type(b).__name__)
                self.backends.remove(b)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        # Merged, not replaced: checkpoint ranking reads the latest val/accuracy even on steps without validation.
        self.latest.update(metrics)
        self._each("log", step, metrics)

    def histogram(self, step: int, name: str, values: list[float]) -> None:
        self._each("histogram", step, name, values)

    def close(self) -> None:
        self._each("close")


def age_histogram(ages: list[int], max_age: int) -> dict[str, float]:
    """Trajectory ages (step - oldest version) as one scalar per age, plus the mean and max."""
    out = {f"age/groups_at_{a}": float(sum(1 for x in ages if x == a)) for a in range(max_age + 1)}
    out["age/mean"] = sum(ages) / len(ages) if ages else 0.0
    out["age/max"] = float(max(ages, default=0))
    out["age/min"] = float(min(ages, default=0))
    return out


class Progress:
    """tqdm on rank 0: step, reward, tokens/s and the buffer's queue state."""

    def __init__(self, enabled: bool, total: int, initial: int) -> None:
        self._bar: Any = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc="grpo", unit="step", dynamic_ncols=True)

    def update(self, metrics: dict[str, float], buffer: dict[str, Any] | None = None) -> None:
        if self._bar is None:
            return
        post = {"reward": f"{metrics.get('reward/mean', 0.0):.3f}",
                "tok/s": f"{metrics.get('perf/tokens_per_s', 0.0):.0f}"}
        if buffer:
            post["ready"] = str(buffer.get("groups_ready", "?"))
            post["pending"] = str(buffer.get("prompts_pending", "?"))
        self._bar.set_postfix(post, refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
