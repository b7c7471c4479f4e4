"""Checkpoints: atomic, HF-loadable, exact to resume.

Layout of `CHECKPOINT_DIR/step_00000012/` (12 steps trained, weight version 12):
  model/            save_pretrained safetensors + tokenizer, in fp32 (the masters: a resume continues bit-exactly)
  optimizer.pt      full optimizer state keyed by parameter name (any world size can load it)
  rng_rank{r}.pt    Python / torch (CPU, CUDA) RNG state of each rank
  trainer.json      step (= the weight version), run epoch, data position, scheduler, metrics, world size
  config.yaml       the resolved config

Every rank writes into `.tmp-step_...`; rank 0 renames it into place after a barrier, so a directory named `step_*`
is always complete (a crash mid-save leaves only a `.tmp-*`, removed by the next save). After the rename the
buffer is told (CommitStep) that the checkpoint holds every step up to this one.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fleet.config.infra import CheckpointingConfig
from fleet.contracts.weights import WeightsId
from trainer.dist import Dist
from trainer.model import PolicyModule, iter_full_state

log = logging.getLogger(__name__)
PREFIX = "step_"


@dataclass
class TrainerCheckpoint:
    step: int
    """Steps trained = the next step to train = the version of the weights (one optimizer step, one version)."""
    epoch: int = 0
    data_position: dict[str, Any] = field(default_factory=dict)
    scheduler: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    world_size: int = 1

    @property
    def weights(self) -> WeightsId:
        """The identity of the weights this state holds: the run epoch and the step."""
        return WeightsId(self.epoch, self.step)

    @classmethod
    def from_json(cls, data: dict[str, Any], source: Path) -> TrainerCheckpoint:
        """`trainer.json` as written; checkpoints from before issue 14 also carry `weight_version`, which always
        equalled `step` (a file where it does not was not written by this trainer)."""
        data = dict(data)
        version = data.pop("weight_version", None)
        if version is not None and version != data.get("step"):
            raise ValueError(f"{source}: weight_version {version} differs from step {data.get('step')}; the trainer "
                             "never writes that (the weights' version is the step)")
        return cls(**data)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:  # pragma: no cover
        pass
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])


def _optim_options(**kw: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def _full_optimizer_state(module: PolicyModule, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(module, optimizer, options=_optim_options(cpu_offload=True))


def _load_optimizer(module: PolicyModule, optimizer: torch.optim.Optimizer, full: dict[str, Any],
                    dist: Dist) -> None:
    if dist.distributed:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(module, optimizer, optim_state_dict=full if dist.is_main else {},
                                 options=_optim_options(broadcast_from_rank0=True))
        return
    # One process: the name-keyed full state maps onto parameter indices (DCP's loader needs existing state).
    index = {name: i for i, (name, _) in enumerate(module.named_parameters())}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in full["param_groups"]]
    optimizer.load_state_dict({"state": {index[n]: s for n, s in full["state"].items()}, "param_groups": groups})


class CheckpointManager:
    def __init__(self, ckpt: CheckpointingConfig, root: Path, dist: Dist, tokenizer_path: str | None, *,
                 resolved_config: str) -> None:
        """`resolved_config`: the run's whole config as YAML, written beside every checkpoint (`config.yaml`)."""
        self.ckpt = ckpt
        self.resolved_config = resolved_config
        self.root = root
        self.dist = dist
        self.tokenizer_path = tokenizer_path

    def latest(self) -> Path | None:
        done = sorted(p for p in self.root.glob(f"{PREFIX}*") if (p / "trainer.json").is_file())
        return done[-1] if done else None

    def save(self, module: PolicyModule, optimizer: torch.optim.Optimizer, state: TrainerCheckpoint) -> Path:
        """Collective: every rank calls it. Returns the final directory."""
        final = self.root / f"{PREFIX}{state.step:08d}"
        tmp = self.root / f".tmp-{final.name}"
        if self.dist.is_main:
            for stale in self.root.glob(".tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            tmp.mkdir(parents=True)
        weights = {n: t.detach().to("cpu", torch.float32) for n, t in iter_full_state(module)}
        optim = _full_optimizer_state(module, optimizer)
        self.dist.barrier()  # tmp exists before the other ranks write into it
        torch.save(_rng_state(), tmp / f"rng_rank{self.dist.rank}.pt")
        if self.dist.is_main:
            self._write_main(tmp, module, weights, optim, state)
        self.dist.barrier()
        if self.dist.is_main:
            if final.exists():  # the same step saved again (e.g. end of run right after a periodic save)
                shutil.rmtree(final)
            tmp.rename(final)
            self._prune(final)
            log.info("checkpoint %s saved (step %d, weights %s)", final, state.step, state.weights)
        self.dist.barrier()
        return final

    def _write_main(self, tmp: Path, module: PolicyModule, weights: dict[str, torch.Tensor], optim: dict[str, Any],
                    state: TrainerCheckpoint) -> None:
        lm: Any = module.lm
        lm.config.save_pretrained(tmp / "model")
        if getattr(lm, "generation_config", None) is not None:
            lm.generation_config.save_pretrained(tmp / "model")
        from safetensors.torch import save_file

        save_file(weights, str(tmp / "model" / "model.safetensors"), metadata={"format": "pt"})
        if self.tokenizer_path:
            from fleet.tokenizer import load_tokenizer

            load_tokenizer(self.tokenizer_path).save_pretrained(tmp / "model")
        torch.save(optim, tmp / "optimizer.pt")
        (tmp / "trainer.json").write_text(json.dumps(vars(state), indent=1, sort_keys=True, default=float))
        (tmp / "config.yaml").write_text(self.resolved_config)

    def _score(self, path: Path) -> float | None:
        metrics = json.loads((path / "trainer.json").read_text()).get("metrics", {})
        value = metrics.get(self.ckpt.metric_name, metrics.get("reward/mean"))
        if value is None:
            return None
        return float(value) if self.ckpt.higher_is_better else -float(value)

    def _prune(self, newest: Path) -> None:
        k = self.ckpt.keep_top_k
        if k is None:
            return
        done = [p for p in self.root.glob(f"{PREFIX}*") if (p / "trainer.json").is_file() and p != newest]
        ranked = sorted(done, key=lambda p: (self._score(p) is not None, self._score(p) or 0.0, p.name), reverse=True)
        for p in ranked[max(0, k - 1):]:  # the newest always stays and counts towards k
            shutil.rmtree(p, ignore_errors=True)

    def load(self, path: Path, module: PolicyModule, optimizer: torch.optim.Optimizer) -> TrainerCheckpoint:
        """Collective. The model weights were already loaded from `path/model` when the policy was built."""
        state = TrainerCheckpoint.from_json(json.loads((path / "trainer.json").read_text()), path / "trainer.json")
        full = torch.load(path / "optimizer.pt", weights_only=False) if self.dist.is_main or not \
            self.dist.distributed else {}
        _load_optimizer(module, optimizer, full, self.dist)
        rng = path / f"rng_rank{self.dist.rank}.pt"
        if rng.is_file():
            _set_rng_state(torch.load(rng, weights_only=False))
        else:
            log.warning("%s: no RNG state for rank %d (saved with world size %d)", path, self.dist.rank,
                        state.world_size)
        return state
