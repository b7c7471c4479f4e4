"""Are vLLM's log-probs those of the weights a token is labelled with, under in-flight pushes? (issue 21)

    python benchmarks/engine_inflight_check.py [--reset] [--rounds 12] [--scale 0.01]

The fleet's IS correction takes the engine's log-prob of every generated token as the behaviour policy's. This runs
the vLLM engine on the skill demo's base model (`.cache/models/tiny-qwen2-digits_max-format`, made by
`benchmarks/skill_demo.py pretrain`) the way the demo's async rollout worker does: rounds of 16 prompts x 16
answers (temperature 1, at most 4 tokens), and during each round an in-flight push of new weights (the previous
version plus `--scale` x N(0, 1) noise), received into the engine's staging memory. Then every token is scored by
a transformers forward over prompt + answer with the weights of the version the engine labelled it with, and the
|difference| is reported for tokens of answers that saw one version only and, for answers a push cut in two, for
tokens before and after it.

Without `--reset` (the demo's default, `recompute_kv_cache_after_weight_updates: false`) a token generated after a
push by a request that started before it attends to keys/values the old weights computed: its log-prob is that of
neither version. It is still the probability the token was sampled with, so importance weights stay exact; only
the token's version label (for the age bound) is approximate. `--reset` recomputes those requests' KV at the push.
Result: benchmarks/results/engine_inflight_check[_reset].json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODEL = ROOT / ".cache/models/tiny-qwen2-digits_max-format"


def _noisy(base: dict[str, torch.Tensor], seed: int, scale: float) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in base.items()}


async def _generate(args: argparse.Namespace) -> tuple[list[tuple[list[int], Any]], dict[int, dict[str, torch.Tensor]]]:
    from safetensors.torch import load_file

    from fleet.config.policy import VllmConfig
    from fleet.tokenizer import load_tokenizer
    from rollout.engine import SamplingSpec
    from rollout.engine.vllm_engine import VllmEngine

    tok = load_tokenizer(MODEL)
    eng = VllmEngine(MODEL, VllmConfig(max_num_seqs=256, cpu_kvcache_space_gb=0.5), max_model_len=128,
                     stage_min_bytes=0)
    await eng.start()
    versions = {0: load_file(MODEL / "model.safetensors")}
    rng = random.Random(0)
    prompts = []
    for _ in range(16):
        digits = " ".join(str(rng.randrange(10)) for _ in range(5))
        text = tok.apply_chat_template([{"role": "user", "content": f"Largest digit of {digits}?"}], tokenize=False,
                                       add_generation_prompt=True)
        prompts.append(list(tok(text, add_special_tokens=False)["input_ids"]))
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert isinstance(end, int)
    spec = SamplingSpec(max_new_tokens=4, temperature=1.0, stop_token_ids=(end,))
    out: list[tuple[list[int], Any]] = []
    try:
        for v in range(1, args.rounds + 1):
            tasks = [asyncio.create_task(eng.generate(f"r{v}/{i}/{j}", p, spec))
                     for i, p in enumerate(prompts) for j in range(16)]
            await asyncio.sleep(0.05 + 0.1 * rng.random())  # the push lands while the round is generating
            w = _noisy(versions[v - 1], v, args.scale)
            versions[v] = {k: t.clone() for k, t in w.items()}  # staged memory is the engine's from here on
            staged = eng.stage([(k, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for k, t in w.items()])
            for k, t in w.items():
                staged[k].copy_(t)
            await eng.update_weights(v, staged, in_flight=True, reset_cache=args.reset)
            for g in await asyncio.gather(*tasks):
                out.append((prompts[int(g.request_id.split("/")[1])], g))
    finally:
        await eng.stop()
    return out, versions


def _score(gens: list[tuple[list[int], Any]], versions: dict[int, dict[str, torch.Tensor]]) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)  # thousands of tiny forwards: more threads only spin on a loaded machine
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    diffs: dict[str, list[float]] = {"one_version": [], "cut_before_push": [], "cut_after_push": []}
    for v, weights in versions.items():  # one weight load per version
        model.load_state_dict(weights, strict=False)
        for prompt, g in gens:
            if v not in g.token_versions:
                continue
            with torch.no_grad():
                logits = model(torch.tensor([prompt + g.token_ids])).logits[0, len(prompt) - 1 : -1]
            ref = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(g.token_ids)[:, None])[:, 0]
            for i, tv in enumerate(g.token_versions):
                if tv == v:
                    kind = ("one_version" if len(set(g.token_versions)) == 1
                            else "cut_before_push" if tv == g.token_versions[0] else "cut_after_push")
                    diffs[kind].append(abs(float(ref[i]) - g.logprobs[i]))
    summary = {}
    for kind, d in diffs.items():
        d.sort()
        summary[kind] = {"tokens": len(d), "median": d[len(d) // 2] if d else None,
                         "p99": d[int(len(d) * 0.99)] if d else None, "max": d[-1] if d else None,
                         "over_0.01": sum(x > 0.01 for x in d)}
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reset", action="store_true", help="recompute the KV of requests in flight at each push")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--scale", type=float, default=0.01, help="std of the noise each push adds to every weight")
    args = p.parse_args()
    gens, versions = asyncio.run(_generate(args))
    result = {"reset_cache": args.reset, "rounds": args.rounds, "scale": args.scale, "answers": len(gens),
              "answers_cut_by_a_push": sum(len(set(g.token_versions)) > 1 for _, g in gens),
              "abs_logprob_diff": _score(gens, versions)}
    print(json.dumps(result, indent=1))
    name = "engine_inflight_check" + ("_reset" if args.reset else "")
    (ROOT / f"benchmarks/results/{name}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
