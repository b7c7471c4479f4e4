"""Weight push over NCCL on two GPUs: our data plane (weightsync.nccl: a stateless NCCL group per rendezvous, per-dtype
1 GiB buckets, broadcast from the trainer) against a plain torch.distributed send/recv of the same bytes, measured
in the same run, for Qwen2-shaped state dicts of ~0.5B and ~1.5B parameters (random bf16 weights).

    python benchmarks/gpu_weight_push.py --out results.json      # needs 2 GPUs (nvidia-h200-x2)

Rank 0 plays the trainer (GPU 0), rank 1 the rollout worker (GPU 1). Push time is from the trainer's first byte to
the worker holding every named tensor (synchronised). Bus bandwidth = bytes / time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from weightsync import nccl  # noqa: E402
from weightsync.header import TensorMeta  # noqa: E402

SHAPES = {
    "qwen2-0.5b": dict(hidden=896, layers=24, heads=14, kv=2, inter=4864, vocab=151936),
    "qwen2-1.5b": dict(hidden=1536, layers=28, heads=12, kv=2, inter=8960, vocab=151936),
}


def qwen2_metas(hidden: int, layers: int, heads: int, kv: int, inter: int, vocab: int) -> list[TensorMeta]:
    hd = hidden // heads
    metas = [TensorMeta("model.embed_tokens.weight", "bfloat16", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        metas += [
            TensorMeta(p + "self_attn.q_proj.weight", "bfloat16", (hidden, hidden)),
            TensorMeta(p + "self_attn.q_proj.bias", "bfloat16", (hidden,)),
            TensorMeta(p + "self_attn.k_proj.weight", "bfloat16", (kv * hd, hidden)),
            TensorMeta(p + "self_attn.k_proj.bias", "bfloat16", (kv * hd,)),
            TensorMeta(p + "self_attn.v_proj.weight", "bfloat16", (kv * hd, hidden)),
            TensorMeta(p + "self_attn.v_proj.bias", "bfloat16", (kv * hd,)),
            TensorMeta(p + "self_attn.o_proj.weight", "bfloat16", (hidden, hidden)),
            TensorMeta(p + "mlp.gate_proj.weight", "bfloat16", (inter, hidden)),
            TensorMeta(p + "mlp.up_proj.weight", "bfloat16", (inter, hidden)),
            TensorMeta(p + "mlp.down_proj.weight", "bfloat16", (hidden, inter)),
            TensorMeta(p + "input_layernorm.weight", "bfloat16", (hidden,)),
            TensorMeta(p + "post_attention_layernorm.weight", "bfloat16", (hidden,)),
        ]
    metas.append(TensorMeta("model.norm.weight", "bfloat16", (hidden,)))
    return metas


def plain_sendrecv(rank: int, metas: list[TensorMeta], tensors: dict[str, torch.Tensor], dev: torch.device) -> None:
    """The baseline: one flat buffer of the same bytes, dist.send / dist.recv on the default NCCL group."""
    total = sum(m.nbytes for m in metas) // 2
    if rank == 0:
        flat = torch.cat([tensors[m.name].reshape(-1) for m in metas])
        dist.send(flat, 1)
    else:
        flat = torch.empty(total, dtype=torch.bfloat16, device=dev)
        dist.recv(flat, 0)
    torch.cuda.synchronize(dev)


def push(label: str, rank: int, metas: list[TensorMeta], tensors: dict[str, torch.Tensor], dev: torch.device,
         link: nccl.NcclLink) -> None:
    if label == "plain_sendrecv":
        plain_sendrecv(rank, metas, tensors, dev)
    elif rank == 0:
        nccl.send(link, metas, tensors)
    else:
        nccl.recv(link, metas)


def worker(rank: int, args: argparse.Namespace, port: int, link_port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=dev)
    results = []
    link = nccl.link(f"tcp://127.0.0.1:{link_port}", 2, rank, dev)
    for name, shape in SHAPES.items():
        metas = qwen2_metas(**shape)
        nbytes = sum(m.nbytes for m in metas)
        tensors = ({m.name: torch.randn(m.shape, device=dev, dtype=torch.bfloat16) for m in metas}
                   if rank == 0 else {})
        row: dict[str, object] = {"model": name, "params": nbytes // 2, "bytes": nbytes}
        for label in ("plain_sendrecv", "ours_nccl"):
            push(label, rank, metas, tensors, dev, link)  # warm-up: communicators, allocator
            times = []
            for _ in range(args.repeats):
                dist.barrier()
                t0 = time.perf_counter()
                push(label, rank, metas, tensors, dev, link)
                dist.barrier()
                times.append(time.perf_counter() - t0)
            best = min(times)
            row[label] = {"push_s": best, "median_s": sorted(times)[len(times) // 2], "GB_per_s": nbytes / best / 1e9}
        gbps = {k: row[k]["GB_per_s"] for k in ("ours_nccl", "plain_sendrecv")}  # type: ignore[index]
        row["ratio_ours_vs_plain"] = gbps["ours_nccl"] / gbps["plain_sendrecv"]
        results.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)
        tensors.clear()
        torch.cuda.empty_cache()
    if rank == 0:
        Path(out).write_text(json.dumps({"gpus": torch.cuda.get_device_name(0), "results": results}, indent=1))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu_weight_push.json"))
    a = ap.parse_args()
    mp.spawn(worker, args=(a, free_port(), free_port(), a.out), nprocs=2)
