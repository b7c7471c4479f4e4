"""The batched `hf` engine against the one-request path, in one process: generated tokens/s as the fleet sends work.

    python benchmarks/batched_engine_bench.py --out $OUT/batched_engine.json                 # on a GPU (H200)
    python benchmarks/batched_engine_bench.py --device cpu --shapes tiny --requests 1,8 --prompt 64 --new 16 \\
        --window 5 --out /tmp/e.json                                                        # the same wiring on CPU

Load: `n` requests in flight at all times, in groups of G = min(8, n) samples of one prompt (as a rollout worker
submits a GRPO group); each request asks for a number of new tokens drawn from [new/2, 3 new/2] (so requests leave at
different steps and the next group joins as the previous one drains), temperature 1, EOS ignored. Prompts are
`--prompt` random token ids. tokens/s = generated tokens over a measuring window that starts after a warm-up (the
first groups, graph captures); prefill is inside the window, as it is in a run.

Models: random-weight Qwen2 shapes made locally (workshop.tinymodel), bf16 on CUDA, float32 on CPU:
100m = hidden 768, 12 layers, 12 heads, 4 KV heads, MLP 2048, vocab 32768 (~101M parameters);
0.5b = Qwen2.5-0.5B's shape, vocab 151936 (494M).
Also recorded: the greedy agreement of the two engines on 8 prompts (token-exact in float32 on CPU, see
tests/integration/rollout/test_batched_engine.py; in bf16 the batched shapes' rounding may flip near-ties).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleet.paths import cache_dir  # noqa: E402
from rollout.engine import GenerationEngine, SamplingSpec  # noqa: E402
from workshop.tinymodel import ensure_tiny_model, make_qwen2_like  # noqa: E402

SHAPES = {  # hidden, layers, heads, kv_heads, intermediate, vocab
    "100m": (768, 12, 12, 4, 2048, 32768),
    "0.5b": (896, 24, 14, 2, 4864, 151936),
}


def model_for(shape: str) -> Path:
    root = cache_dir() / "models"
    tiny = ensure_tiny_model(root / "tiny-qwen2")
    if shape == "tiny":
        return tiny
    h, n, heads, kv, inter, vocab = SHAPES[shape]
    return make_qwen2_like(root / f"bench-qwen2-{shape}", h, n, heads, kv, inter, vocab, tokenizer_from=tiny)


def make(kind: str, path: Path, args: argparse.Namespace, decode_steps: int = 8) -> GenerationEngine:
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    max_len = args.prompt + args.new * 3 // 2 + 8
    if kind == "batched":
        from rollout.engine.hf_batched import BatchedHfEngine

        return BatchedHfEngine(path, dtype=dtype, device=args.device, max_model_len=max_len,
                               max_num_seqs=args.slots, cuda_graphs=not args.no_graphs, decode_steps=decode_steps)
    from rollout.engine.hf_engine import HfEngine

    return HfEngine(path, dtype=dtype, device=args.device, max_model_len=max_len)


async def load(engine: GenerationEngine, n: int, args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    """`n` requests in flight in groups; tokens/s over the window after the warm-up."""
    g = min(8, n)
    rng = random.Random(0)
    stop_at = [0.0]
    done_requests = [0]

    async def group_client(c: int) -> None:
        k = 0
        while time.perf_counter() < stop_at[0] or stop_at[0] == 0:
            prompt = [rng.randrange(3, vocab) for _ in range(args.prompt)]
            specs = [SamplingSpec(max_new_tokens=rng.randint(args.new // 2, args.new * 3 // 2), temperature=1.0,
                                  ignore_eos=True, seed=rng.randrange(2**31)) for _ in range(g)]
            await asyncio.gather(*(engine.generate(f"c{c}/{k}/{i}", prompt, s) for i, s in enumerate(specs)))
            done_requests[0] += g
            k += 1

    stop_at[0] = time.perf_counter() + args.warmup + args.window
    clients = [asyncio.create_task(group_client(c)) for c in range(n // g)]
    await asyncio.sleep(args.warmup)
    timings0, forwards0 = dict(getattr(engine, "timings", {})), dict(getattr(engine, "forwards", {}))
    t0, tok0, req0 = time.perf_counter(), engine.tokens_generated, done_requests[0]
    await asyncio.sleep(args.window)
    t1, tok1, req1 = time.perf_counter(), engine.tokens_generated, done_requests[0]
    timings = {k: v - timings0[k] for k, v in getattr(engine, "timings", {}).items()}
    forwards = {k: v - forwards0[k] for k, v in getattr(engine, "forwards", {}).items()}
    for c in clients:
        c.cancel()
    await asyncio.gather(*clients, return_exceptions=True)
    return {"requests": n, "group": g, "tok_s": (tok1 - tok0) / (t1 - t0), "window_s": t1 - t0,
            "tokens": tok1 - tok0, "requests_finished": req1 - req0, "engine_timings_s": timings,
            "engine_forwards": forwards}


def decode_microbench(engine: Any, b: int, attend: int, out_dir: Path, name: str) -> dict[str, float]:
    """One decode step of `b` rows attending over `attend` positions, alone: ms per graph replay, ms per eager
    forward, and a profile of the eager one (top kernels by device time) written beside the results."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = engine.device.type == "cuda"
    steps = engine._steps
    steps.inputs.zero_()
    steps.inputs[1, :b] = torch.arange(b) % (attend - 1)  # positions inside the window

    def timed(fn: Any, reps: int) -> float:
        fn()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / reps * 1e3

    with torch.inference_mode():
        out = {"rows": float(b), "attend": float(attend),
               "eager_ms": timed(lambda: steps.forward(b, attend, False), 10)}
        if cuda and steps.graphs_on:
            out["graph_ms"] = timed(lambda: steps.replay(b, attend, False), 30)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as prof:
            for _ in range(3):
                steps.forward(b, attend, False)
            if cuda:
                torch.cuda.synchronize()
    key = "cuda_time_total" if cuda else "cpu_time_total"
    (out_dir / f"profile_{name}.txt").write_text(prof.key_averages().table(sort_by=key, row_limit=30))
    return out


async def greedy_agreement(path: Path, args: argparse.Namespace, vocab: int, steps: list[int]) -> dict[str, Any]:
    """Greedy tokens of 8 prompts: the batched engine (each `decode_steps`) against the one-request path, and a
    batched engine's rounds against one-step rounds (same kernels and shapes per step, so they should agree)."""
    rng = random.Random(1)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(8, 64))] for _ in range(8)]
    spec = SamplingSpec(max_new_tokens=32, temperature=0, ignore_eos=True)
    outs = {}
    for kind, k in [("sequential", 1)] + [("batched", k) for k in sorted({1, *steps})]:
        eng = make(kind, path, args, decode_steps=k)
        await eng.start()
        try:
            name = kind if kind == "sequential" else f"batched_{k}"
            outs[name] = await asyncio.gather(*(eng.generate(f"{name}{i}", p, spec) for i, p in enumerate(prompts)))
        finally:
            await eng.stop()

    def compare(a_name: str, b_name: str) -> dict[str, Any]:
        pairs = list(zip(outs[a_name], outs[b_name], strict=True))
        return {"identical": sum(a.token_ids == b.token_ids for a, b in pairs),
                "first_logprob_max_abs_diff": max(abs(a.logprobs[0] - b.logprobs[0]) for a, b in pairs)}

    out: dict[str, Any] = {"prompts": len(prompts), **compare("sequential", f"batched_{max(steps)}")}
    out["by_decode_steps"] = {k: {"vs_sequential": compare("sequential", f"batched_{k}"),
                                  "vs_one_step_rounds": compare("batched_1", f"batched_{k}")}
                              for k in sorted({1, *steps})}
    return out


async def bench_shape(shape: str, args: argparse.Namespace) -> dict[str, Any]:
    path = model_for(shape)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    row: dict[str, Any] = {"shape": shape, "batched": [], "sequential": []}
    steps = [int(x) for x in args.decode_steps.split(",")]
    loads = [int(x) for x in args.requests.split(",")]
    for k in steps:
        eng = make("batched", path, args, decode_steps=k)
        await eng.start()
        try:
            for n in loads:
                r = {"decode_steps": k, **await load(eng, n, args, vocab)}
                print(f"{shape} batched decode_steps={k} n={n}: {r['tok_s']:.0f} tok/s {r['engine_timings_s']} "
                      f"{r['engine_forwards']}", flush=True)
                row["batched"].append(r)
            if args.profile and k == steps[-1]:
                b, attend = min(max(loads), eng.rows), eng.max_model_len  # type: ignore[attr-defined]
                async with eng._step_lock:  # type: ignore[attr-defined]
                    row["decode_step"] = await asyncio.to_thread(decode_microbench, eng, b, attend,
                                                                 Path(args.out).parent, shape)
                print(f"{shape} decode step alone: {row['decode_step']}", flush=True)
            row["graph_captures"] = getattr(eng, "forwards", {}).get("graph_captures")
            row["slots"] = getattr(eng, "rows", None)
        finally:
            await eng.stop()
    for spec in filter(None, args.extra.split(",")):  # other settings at the largest load only
        k_text, _, order = spec.partition(":")
        eng = make("batched", path, args, decode_steps=int(k_text))
        eng.overlap_prefill = order != "prefill-first"  # type: ignore[attr-defined]
        await eng.start()
        try:
            r = {"decode_steps": int(k_text), "order": order or "overlap", **await load(eng, max(loads), args, vocab)}
            print(f"{shape} batched {spec} n={max(loads)}: {r['tok_s']:.0f} tok/s {r['engine_timings_s']} "
                  f"{r['engine_forwards']}", flush=True)
            row.setdefault("extra", []).append(r)
        finally:
            await eng.stop()
    if args.skip_sequential:
        return row
    eng = make("sequential", path, args)
    await eng.start()
    try:
        for n in [int(x) for x in args.sequential_requests.split(",")]:
            r = await load(eng, n, args, vocab)
            print(f"{shape} sequential n={n}: {r['tok_s']:.0f} tok/s", flush=True)
            row["sequential"].append(r)
    finally:
        await eng.stop()
    row["greedy_agreement"] = await greedy_agreement(path, args, vocab, steps)
    return row


async def bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    return [await bench_shape(s, args) for s in args.shapes.split(",")]


def main(args: argparse.Namespace) -> None:
    import torch
    import transformers

    rows = asyncio.run(bench(args))
    out = {"device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu",
           "torch": torch.__version__, "transformers": transformers.__version__, "args": vars(args), "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--shapes", default="100m,0.5b")
    p.add_argument("--requests", default="1,64,256", help="requests in flight, batched engine")
    p.add_argument("--sequential-requests", default="1,64", help="requests in flight, one-request path")
    p.add_argument("--prompt", type=int, default=1024)
    p.add_argument("--new", type=int, default=128, help="mean new tokens per request")
    p.add_argument("--slots", type=int, default=256, help="max_num_seqs of the batched engine")
    p.add_argument("--decode-steps", default="8", help="decode steps per round, batched engine (one engine each)")
    p.add_argument("--extra", default="", help="STEPS:ORDER,... more batched engines at the largest load only; "
                   "ORDER overlap (decode steps launched before the prefill, the default) or prefill-first")
    p.add_argument("--no-graphs", action="store_true")
    p.add_argument("--warmup", type=float, default=15.0)
    p.add_argument("--window", type=float, default=20.0)
    p.add_argument("--profile", action="store_true", help="time and profile one decode step at the largest load")
    p.add_argument("--skip-sequential", action="store_true", help="the batched engine only")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "batched_engine.json"))
    main(p.parse_args())
