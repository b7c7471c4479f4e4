"""What `policy.prefix_sharing` saves in the trainer: one step's forward + backward and its no-grad forward (the
reference's), with and without a group's answers sharing their prompt, in one process, on the shapes of two configs.

    python benchmarks/prefix_sharing_bench.py [--configs digits_skill,grpo_swe_tiny] [--threads 1] [--repeats 3]

Each config gives the model, prompts x answers per step, the micro-batch and global batch, the row length and the
answer cap; the step is planned by the trainer's own `plan_rank` and run through `PolicyModule` as `trainer.step`
runs it (the loss is a weighted sum of the log-probs: the backward's shape is the GRPO loss's). Prompts: the digits
config's are its real questions; the SWE config's are random tokens of between half and all of
`data.train.max_prompt_length` (no task set is built here), answers of 1 to `max_new_tokens` tokens. The log-probs of
the first micro-batch's samples under both layouts are compared as well (max abs difference). Results:
benchmarks/results/prefix_sharing.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402 (after the path: the benchmark runs as a script)

from fleet.config.loader import load_config  # noqa: E402
from trainer.batch import StepBatch, TrainSample, plan_rank  # noqa: E402
from trainer.logprobs import pack  # noqa: E402
from trainer.model import PolicyModule, forward_logprobs  # noqa: E402
from workshop.resolve import resolve_model  # noqa: E402

RESULTS = ROOT / "benchmarks/results"


def _prompts(cfg: Any, tok: Any, rng: random.Random) -> list[list[int]]:
    n = cfg.grpo.num_prompts_per_step
    if cfg.data.train.dataset_name.startswith("digits"):
        from envs.digits import make_digits_tasks

        kind = {"digits": "first", "digits_max": "max"}[cfg.data.train.dataset_name]
        out = []
        for t in make_digits_tasks(cfg.grpo.seed, "train", n, kind):
            text = tok.apply_chat_template([{"role": "user", "content": t.problem_statement}], tokenize=False,
                                           add_generation_prompt=True)
            out.append(list(tok(text, add_special_tokens=False)["input_ids"]))
        return out
    cap = cfg.data.train.max_prompt_length
    vocab = tok.vocab_size
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(cap // 2, cap))] for _ in range(n)]


def _batch(cfg: Any, tok: Any, seed: int) -> StepBatch:
    rng = random.Random(seed)
    g, cap = cfg.grpo.num_generations_per_prompt, cfg.policy.generation.max_new_tokens
    samples = []
    for k, prompt in enumerate(_prompts(cfg, tok, rng)):
        for _ in range(g):
            n = cap if cap <= 4 else rng.randint(1, cap)  # the digits answers are the cap; SWE's vary
            resp = [rng.randrange(3, tok.vocab_size) for _ in range(n)]
            samples.append(TrainSample(f"g{k}", prompt, resp, [-1.0] * n, advantage=rng.gauss(0, 1), reward=0.0,
                                       version=0))
    return StepBatch(step=1, samples=samples, group_ids=[f"g{k}" for k in range(len(samples) // g)])


def _time(fn: Any, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(name: str, threads: int, repeats: int) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from fleet.tokenizer import load_tokenizer

    cfg = load_config(ROOT / f"examples/configs/{name}.yaml", [])
    p = cfg.policy
    path = resolve_model(p.model_name)
    tok = load_tokenizer(path)
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    module = PolicyModule(lm, temperature=p.generation.temperature, chunk_tokens=p.logprob_chunk_tokens)
    batch = _batch(cfg, tok, cfg.grpo.seed)
    torch.set_num_threads(threads)
    cpu = torch.device("cpu")
    out: dict[str, Any] = {"config": name, "samples": len(batch.samples),
                           "prompt_tokens_mean": statistics.mean(len(s.prompt_ids) for s in batch.samples),
                           "answer_tokens_mean": statistics.mean(len(s.response_ids) for s in batch.samples)}
    for shared in (False, True):
        plan = plan_rank(batch, global_batch=p.train_global_batch_size, micro_batch=p.train_micro_batch_size,
                         rank=0, world=1, row_tokens=p.max_total_sequence_length, packing=p.sequence_packing,
                         share_prefixes=shared)
        mbs = [mb for minibatch in plan for mb in minibatch]

        def update(mbs: list[Any] = mbs) -> None:
            lm.zero_grad(set_to_none=True)
            for mb in mbs:
                lp = forward_logprobs(module, mb.packed, cpu)
                (lp * mb.advantages[:, None] * mb.mask).sum().backward()

        @torch.no_grad()
        def reference(mbs: list[Any] = mbs) -> list[torch.Tensor]:
            return [forward_logprobs(module, mb.packed, cpu) for mb in mbs]

        key = "shared" if shared else "plain"
        out[key] = {"rows": sum(mb.packed.input_ids.shape[0] for mb in mbs),
                    "laid_out_tokens": sum(mb.packed.input_ids.numel() - mb.packed.padded_tokens for mb in mbs),
                    "forward_backward_s": _time(update, repeats), "forward_s": _time(reference, repeats)}
    out["max_abs_logprob_diff"] = _max_diff(module, batch, p)
    for k in ("forward_backward_s", "forward_s"):
        out[f"speedup_{k}"] = out["plain"][k] / out["shared"][k]
    return out


def _max_diff(module: PolicyModule, batch: StepBatch, p: Any) -> float:
    """Max abs difference of the log-probs of the step's first micro-batch of samples, in one order, both layouts."""
    ss = batch.samples[: p.train_micro_batch_size]
    prompts, answers = [s.prompt_ids for s in ss], [s.response_ids for s in ss]
    with torch.no_grad():
        lp = [forward_logprobs(module, pack(prompts, answers, row_tokens=p.max_total_sequence_length,
                                            share_prefixes=shared), torch.device("cpu")) for shared in (False, True)]
    return float((lp[0] - lp[1]).abs().max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="digits_skill,grpo_swe_tiny")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the trainer's pinned core: 1)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="prefix_sharing")
    a = ap.parse_args()
    import os
    import platform

    results = [measure(name, a.threads, a.repeats) for name in a.configs.split(",")]
    doc = {"env": {"machine": platform.machine(), "cpus": os.cpu_count(), "threads": a.threads,
                   "torch": torch.__version__, "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
                   "loadavg_1m": os.getloadavg()[0]},
           "results": results}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{a.out}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
