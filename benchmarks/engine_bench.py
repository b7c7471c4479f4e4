"""Generation engines: tokens/s with and without periodic weight pushes, and update latency vs model size.

Run: `python benchmarks/engine_bench.py [--sizes tiny,50m,0.5b] [--backend vllm] [--duration 20]`.
Writes `benchmarks/results/engine.json`. Models are random-weight Qwen2 shapes made locally (workshop.tinymodel) and
cached under `fleet.paths.cache_dir()/models`. Every update pushes a full tensor set in the served dtype (float32),
in-flight, without KV recompute, as the default async config does. `memcpy_GBps` (one torch clone of the same bytes,
measured in the same run) is the floor a load could reach; `load_GBps` is what the engine achieved.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from fleet.paths import cache_dir
from rollout.engine import GenerationEngine, SamplingSpec
from workshop.tinymodel import ensure_tiny_model, make_qwen2_like

log = logging.getLogger("engine_bench")
RESULTS = Path(__file__).resolve().parent / "results" / "engine.json"
# name -> (hidden, layers, heads, kv_heads, intermediate, vocab); 0.5b is Qwen2.5-0.5B's shape.
SHAPES = {
    "50m": (512, 10, 8, 2, 1536, 32768),
    "0.5b": (896, 24, 14, 2, 4864, 151936),
}
PROMPT = [1, 87, 425, 201, 57, 1851, 314, 223, 19, 20]


def model_for(size: str) -> Path:
    root = cache_dir() / "models"
    tiny = ensure_tiny_model(root / "tiny-qwen2")
    if size == "tiny":
        return tiny
    h, n, heads, kv, inter, vocab = SHAPES[size]
    return make_qwen2_like(root / f"bench-qwen2-{size}", h, n, heads, kv, inter, vocab, tokenizer_from=tiny)


def make(backend: str, path: Path) -> GenerationEngine:
    if backend == "vllm":
        from fleet.config.policy import VllmConfig
        from rollout.engine.vllm_engine import VllmEngine

        return VllmEngine(path, VllmConfig(max_num_seqs=16, cpu_kvcache_space_gb=1.0), max_model_len=1024)
    from rollout.engine.hf_engine import HfEngine

    return HfEngine(path, max_model_len=1024, device="cuda" if backend == "hf-cuda" else "cpu")


async def throughput(
    engine: GenerationEngine, weights: dict[str, torch.Tensor], *, duration: float, push_every: float | None,
    concurrency: int, max_new: int,
) -> dict[str, Any]:  # fmt: skip
    """Keep `concurrency` requests generating for `duration` s; optionally push weights every `push_every` s."""
    spec = SamplingSpec(max_new_tokens=max_new, temperature=1.0, ignore_eos=True)
    stop_at = time.monotonic() + duration
    counter = iter(range(10**9))

    async def client() -> None:
        while time.monotonic() < stop_at:
            await engine.generate(f"bench/{next(counter)}", PROMPT, spec)

    async def pusher() -> list[dict[str, float]]:
        stats = []
        while push_every and time.monotonic() + push_every < stop_at:
            await asyncio.sleep(push_every)
            s = await engine.update_weights(engine.served_version + 1, weights, in_flight=True, reset_cache=False)
            stats.append({"pause_s": s.pause_s, "load_s": s.load_s, "in_flight": s.requests_in_flight})
        return stats

    t0, n0 = time.monotonic(), engine.tokens_generated
    *_, pushes = await asyncio.gather(*(client() for _ in range(concurrency)), pusher())
    elapsed = time.monotonic() - t0
    out: dict[str, Any] = {"tokens_per_s": (engine.tokens_generated - n0) / elapsed, "elapsed_s": elapsed}
    if push_every:
        out |= {"push_every_s": push_every, "pushes": len(pushes),
                "pause_s_total": sum(p["pause_s"] for p in pushes),
                "pause_s_median": statistics.median(p["pause_s"] for p in pushes) if pushes else None}  # fmt: skip
    return out


async def update_latency(engine: GenerationEngine, weights: dict[str, torch.Tensor], repeats: int) -> dict[str, Any]:
    idle = []
    for _ in range(repeats):
        s = await engine.update_weights(engine.served_version + 1, weights, in_flight=True, reset_cache=False)
        idle.append((s.pause_s, s.load_s, s.stage_s))
    # The same push while 4 requests generate: the pause also waits for the step in progress.
    spec = SamplingSpec(max_new_tokens=10**4, temperature=1.0, ignore_eos=True)
    tasks = [asyncio.create_task(engine.generate(f"lat/{i}", PROMPT, spec)) for i in range(4)]
    n0 = engine.tokens_generated
    for _ in range(100_000):  # until the requests are well under way
        if engine.tokens_generated - n0 >= 40:
            break
        await asyncio.sleep(0.01)
    busy = await engine.update_weights(engine.served_version + 1, weights, in_flight=True, reset_cache=True)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())
    load = statistics.median(x[1] for x in idle)
    return {
        "bytes": nbytes,
        "idle_pause_s_median": statistics.median(x[0] for x in idle),
        "idle_load_s_median": load,
        "idle_load_s_all": [round(x[1], 4) for x in idle],
        "idle_stage_s_median": statistics.median(x[2] for x in idle),
        "load_GBps": nbytes / load / 1e9,
        "busy_pause_s": busy.pause_s,
        "busy_load_s": busy.load_s,
        "load_over_memcpy": None,
        "busy_requests_in_flight": busy.requests_in_flight,
        "busy_kv_recomputed": busy.kv_recomputed,
    }


def memcpy_gbps(weights: dict[str, torch.Tensor]) -> float:
    t0 = time.perf_counter()
    copies = [t.clone() for t in weights.values()]
    dt = time.perf_counter() - t0
    return sum(c.numel() * c.element_size() for c in copies) / dt / 1e9


async def bench_size(size: str, backend: str, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    path = model_for(size)
    build_s = time.perf_counter() - t0
    weights = load_file(path / "model.safetensors")
    engine = make(backend, path)
    t0 = time.perf_counter()
    await engine.start()
    row: dict[str, Any] = {
        "size": size, "backend": backend, "params": sum(t.numel() for t in weights.values()),
        "model_build_or_cache_s": build_s, "engine_start_s": time.perf_counter() - t0,
        "memcpy_GBps": memcpy_gbps(weights),
        "loadavg_1m_at_start": os.getloadavg()[0],  # a shared 2-core box: other jobs skew every number here
    }  # fmt: skip
    try:
        row["update"] = await update_latency(engine, weights, repeats=3)
        # How far the engine's load is from a plain in-memory copy of the same bytes (1.0 = memcpy speed).
        row["update"]["load_over_memcpy"] = row["memcpy_GBps"] / row["update"]["load_GBps"]
        big = size == "0.5b"  # a CPU makes ~0.5B tokens slowly: shorter answers, same shape of experiment
        kw = dict(concurrency=8, max_new=64 if big else 256)
        row["gen_no_push"] = await throughput(engine, weights, duration=args.duration, push_every=None, **kw)
        row["gen_push"] = await throughput(engine, weights, duration=args.duration, push_every=args.push_every, **kw)
        row["gen_push_slowdown"] = 1 - row["gen_push"]["tokens_per_s"] / row["gen_no_push"]["tokens_per_s"]
    finally:
        await engine.stop()
    row["loadavg_1m_at_end"] = os.getloadavg()[0]
    log.info("%s", json.dumps(row, indent=1))
    return row


def write_results(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Merge rows into the results file by (size, backend), so runs of a few sizes update it, and a run cut short
    keeps what it measured."""
    previous = json.loads(RESULTS.read_text())["results"] if RESULTS.is_file() else []
    fresh = {(r["size"], r["backend"]) for r in rows}
    merged = [r for r in previous if (r["size"], r["backend"]) not in fresh] + rows
    env = {
        "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "torch": torch.__version__, "dtype": "float32", "device": "cpu",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "duration_s": args.duration, "push_every_s": args.push_every,
    }  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"env": env, "results": merged}, indent=2) + "\n")


async def main(args: argparse.Namespace) -> None:
    rows: list[dict[str, Any]] = []
    for backend in args.backend.split(","):
        for size in args.sizes.split(","):
            rows.append(await bench_size(size, backend, args))
            write_results(rows, args)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":  # vLLM spawns processes: the guard keeps them from re-running the benchmark
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="tiny,50m,0.5b")
    p.add_argument("--backend", default="vllm", help="vllm, hf, or both: vllm,hf")
    p.add_argument("--duration", type=float, default=20.0, help="seconds per throughput run")
    p.add_argument("--push-every", type=float, default=2.0, help="seconds between weight pushes")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(main(p.parse_args()))
