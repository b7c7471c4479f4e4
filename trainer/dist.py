"""The one place where rank, world size and local rank are read, and where the process group is made.

`read_env()` is torch-free so that `trainer/main.py` can check batch divisibility against the world size before
torch is imported. Everything else imports torch lazily or at call time.

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT. A world of one (a plain
`python trainer/main.py`, or torchrun with one process) makes no process group at all: there is nothing to shard or
reduce, and FSDP2's per-layer hooks would only add CPU overhead (measured on an H200: a 0.5B model at 4k tokens was
CPU-bound under FSDP2 with one rank).
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from fleet.config.infra import ClusterConfig
    from fleet.config.policy import PolicyConfig


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def read_env() -> DistEnv:
    """Rank, world size and local rank from torchrun's environment (rank 0 of 1 without it)."""
    return DistEnv(
        rank=int(os.environ.get("RANK", "0")),
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
    )


def check_world(policy: PolicyConfig, cluster: ClusterConfig, world_size: int) -> None:
    """Rules that need the world size (known before torch loads); ConfigError names the keys and the fix."""
    from fleet.config import ConfigError

    gbs = policy.train_global_batch_size
    if gbs % world_size:
        raise ConfigError(
            f"policy.train_global_batch_size ({gbs}) must be a multiple of the number of trainer processes "
            f"({world_size}, torchrun --nproc-per-node x nodes): each optimizer batch is split evenly across ranks")
    if policy.weight_sync.transport == "nccl" and cluster.gpus_per_node == 0:
        raise ConfigError("policy.weight_sync.transport=nccl needs GPUs (cluster.gpus_per_node > 0); use tcp")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Dist:
    """The process group of the training job (or its absence, for one CPU process) and the few collectives used."""

    def __init__(self, env: DistEnv, device: torch.device, timeout_s: float) -> None:
        import torch.distributed as dist

        self.env = env
        self.device = device
        self.initialized = False
        use_group = env.world_size > 1
        if use_group and not dist.is_initialized():
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            # Ranks > 0 sit in a broadcast while rank 0 waits for rollouts, so the collective timeout must outlast
            # the longest wait for data (grpo.sample_timeout_s), not the 10-30 min default.
            dist.init_process_group(
                backend="nccl" if device.type == "cuda" else "gloo",
                rank=env.rank,
                world_size=env.world_size,
                timeout=_dt.timedelta(seconds=timeout_s),
                device_id=device if device.type == "cuda" else None,
            )
            self.initialized = True
        self.distributed = use_group  # several ranks: FSDP2 shards, collectives reduce

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def is_main(self) -> bool:
        return self.env.is_main

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """`obj` from rank `src` on every rank (pickled; used for batches and control messages)."""
        if not self.distributed or self.world_size == 1:
            return obj
        import torch.distributed as dist

        box = [obj if self.rank == src else None]
        dist.broadcast_object_list(box, src=src, device=self.device if self.device.type == "cuda" else None)
        return box[0]

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """In-place all-reduce (sum, min or max); a no-op in a world of one."""
        if not self.distributed or self.world_size == 1:
            return tensor
        import torch.distributed as dist

        ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
        dist.all_reduce(tensor, op=ops[op])
        return tensor

    def barrier(self) -> None:
        if self.distributed and self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        if self.initialized:
            import torch.distributed as dist

            dist.destroy_process_group()
            self.initialized = False


def pick_device(env: DistEnv) -> torch.device:
    """cuda:LOCAL_RANK when CUDA is available, else CPU."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(env.local_rank)
        return torch.device("cuda", env.local_rank)
    return torch.device("cpu")
