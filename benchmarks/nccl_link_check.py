"""Does a rollout worker's NCCL weight link stay quiet once the trainer that hosted its rendezvous has exited?

Two GPUs: `python benchmarks/nccl_link_check.py` starts a "trainer" (rank 0, hosts the TCPStore) and a "worker"
(rank 1) over `weightsync.nccl`, broadcasts one bucket, lets the trainer exit, and counts the warnings the worker prints
over the next `--linger` seconds, then aborts its link. Prints one JSON line. `TORCH_NCCL_ENABLE_MONITORING=1
TORCH_NCCL_DUMP_ON_TIMEOUT=1 python benchmarks/nccl_link_check.py` shows the behaviour without the link's defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def role(rank: int, init: str, linger: float) -> None:
    import torch

    from weightsync import nccl
    from weightsync.header import TensorMeta

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    metas = [TensorMeta("w", "float32", (1024, 1024))]
    link = nccl.link(init, 2, rank, dev)
    if rank == 0:
        nccl.send(link, metas, {"w": torch.ones(1024, 1024)})
        print("trainer sent; exiting", flush=True)
        os._exit(0)  # like a trainer process that ends without tearing the link down
    got = nccl.recv(link, metas)
    print(f"worker received sum={float(got['w'].sum()):.0f}; lingering {linger}s", flush=True)
    time.sleep(linger)
    link.close()  # what a worker does when a push names a new rendezvous
    print("worker done", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--role", type=int)
    p.add_argument("--init")
    p.add_argument("--linger", type=float, default=8.0)
    a = p.parse_args()
    if a.role is not None:
        role(a.role, a.init, a.linger)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        init = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    procs = [subprocess.Popen([sys.executable, __file__, "--role", str(r), "--init", init, "--linger", str(a.linger)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    worker = outs[1].splitlines()
    if not any("lingering" in line for line in worker):
        raise SystemExit(f"the worker did not receive:\n{outs[1][-3000:]}\ntrainer:\n{outs[0][-2000:]}")
    after = worker[next(i for i, line in enumerate(worker) if "lingering" in line):]
    noisy = [line for line in after if "lingering" not in line and "worker done" not in line and line.strip()]
    print(json.dumps({"monitoring": os.environ.get("TORCH_NCCL_ENABLE_MONITORING", "default"),
                      "received": any("sum=1048576" in line for line in worker), "closed": "worker done" in outs[1],
                      "lines_after_trainer_exit": len(noisy), "sample": noisy[:3],
                      "rc": [p.returncode for p in procs]}))


if __name__ == "__main__":
    main()
