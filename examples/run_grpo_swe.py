"""The seed's launch line, for grpo-fleet:

    python examples/run_grpo_swe.py --config examples/configs/grpo_swe.yaml \\
        cluster.gpus_per_node=8 cluster.num_nodes=4 policy.model_name=Qwen/Qwen2.5-7B-Instruct

Same order as the seed's quickstart, with the fleet in place of Ray:
1. config load and validation (async-GRPO constraints included) before any model loads;
2. connect to the fleet: the replay buffer must answer (start one with `grpo-fleet up` or `docker compose up`);
3. tokenizer; 4. generation config; 5. data and environments through the registry;
6. set-up and 7. training: `torchrun trainer/main.py` on this node, which runs the synchronous or asynchronous loop
   per `grpo.async_grpo.enabled`. Multi-node: run this script on every trainer node with NODE_RANK and MASTER_ADDR
   set (as SLURM/K8s launchers do); the trainer nodes are `cluster.trainer_nodes` (default: all but one).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    from fleet.config import ConfigError, load_config

    try:
        cfg = load_config(args.config, args.overrides)  # 1. validated before anything heavy is imported
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    print(f"[1/7] config OK: {args.config} ({'async' if cfg.grpo.async_grpo.enabled else 'sync'} GRPO)")

    from launch.supervisor import probe

    address = cfg.services.replay_buffer.address  # 2. the fleet instead of Ray
    if not asyncio.run(probe(address)):
        print(f"[2/7] the replay buffer at {address} does not answer: start the fleet first "
              "(`grpo-fleet up --config ...` on one machine, or `docker compose up`), or set "
              "services.replay_buffer.host/port", file=sys.stderr)
        return 1
    print(f"[2/7] fleet reachable: replay buffer at {address}")

    from fleet.tokenizer import load_tokenizer
    from workshop.resolve import resolve_model

    model = resolve_model(cfg.policy.model_name)
    tokenizer = load_tokenizer(cfg.policy.tokenizer.name or model)  # 3.
    print(f"[3/7] tokenizer {type(tokenizer).__name__}, pad={tokenizer.pad_token!r}, eos={tokenizer.eos_token!r}")
    g = cfg.policy.generation  # 4.
    print(f"[4/7] generation: {g.backend}, temperature {g.temperature}, top_p {g.top_p}, max_new_tokens "
          f"{g.max_new_tokens}, G={cfg.grpo.num_generations_per_prompt}")

    from envs.registry import load_dataset  # 5.
    from launch.data.prepare import prepare_dataset

    prepare_dataset(cfg.data.train, grpo=cfg.grpo, sandbox=cfg.sandbox)
    train = load_dataset(cfg.data.train)
    print(f"[5/7] data: {len(train)} training tasks from {cfg.data.train.dataset_name} (environment {train.env_name})")

    nproc = max(1, cfg.cluster.gpus_per_node)  # 6. + 7.
    nodes = cfg.cluster.trainer_nodes or (cfg.cluster.num_nodes - 1 if cfg.cluster.num_nodes > 1 else 1)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--nnodes={nodes}"]
    if nodes > 1:
        cmd += [f"--node-rank={os.environ.get('NODE_RANK', '0')}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={os.environ.get('MASTER_ADDR', '127.0.0.1')}:29400"]
    else:
        cmd.append("--standalone")
    cmd += [str(ROOT / "trainer" / "main.py"), "--config", args.config, *args.overrides]
    print(f"[6/7] set-up: {nodes} trainer node(s) x {nproc} process(es)\n[7/7] training: {' '.join(cmd)}", flush=True)
    return subprocess.call(cmd, cwd=ROOT)


if __name__ == "__main__":
    raise SystemExit(main())
