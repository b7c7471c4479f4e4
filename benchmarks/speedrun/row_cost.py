"""What a pre-training token costs at each prompt setting's row length: the speedrun's base (the "100M" shape, the
corpus tokenizer) under the trainer's own code (`lm.setup` / `lm.train`: compiled layers, bf16, the fused loss and
AdamW), on random token rows of `budget + MAX_NEW` tokens, as many rows a step as keep the tokens a step of the
2,048-token runs (`lm.rows_per_step`). Settings alternate round by round so that a drifting clock hits each alike;
the first steps of a setting's first round (compilation for its shape) are not counted.

On the lent GPU (carry [".speedrun/corpus/tokenizer"] and the wheels pydantic needs; writes $OUT/row_cost.json
after every round, so a call cut short still brings back what it measured):

    python benchmarks/speedrun/row_cost.py --budgets 1792,4096 --steps 24 --rounds 2 --out $OUT/row_cost.json

`--cpu` runs the smoke shape on the CPU (the wiring only: its figures say nothing about the GPU).
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "speedrun"))
import lm  # noqa: E402
from prompting import MAX_NEW  # noqa: E402

ROWS_AT_2048 = 64  # the pre-training step of every run so far


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    device = "cpu" if args.cpu else "cuda"
    rows = {b: (b + MAX_NEW, lm.rows_per_step(b + MAX_NEW, args.rows_at_2048)) for b in args.budgets}
    longest = max(r for r, _ in rows.values())
    gen = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model = lm.make_model(args.tokenizer, Path(tmp) / "init", lm.SMOKE_SHAPE if args.cpu else lm.SHAPE,
                              max_positions=longest)
        s = lm.setup(model, lr=1e-4, weight_decay=0.1, device=device, compile=not args.cpu)
        vocab = int(s.module.lm.config.vocab_size)
        out: dict[str, Any] = {
            "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
            "params": sum(p.numel() for p in s.module.lm.parameters()), "steps_per_round": args.steps,
            "settings": [{"max_prompt_length": b, "row_tokens": r, "rows_per_step": n, "rounds": []}
                         for b, (r, n) in rows.items()]}
        for round_ in range(args.rounds):
            for entry in out["settings"]:
                r, n = entry["row_tokens"], entry["rows_per_step"]
                batch = torch.randint(0, vocab, (n, r), generator=gen).tolist()
                skip = args.warmup if round_ == 0 else 0

                def batches(step: int, batch: list[list[int]] = batch) -> tuple[list[list[int]], list[list[int]]]:
                    return [row[:1] for row in batch], [row[1:] for row in batch]

                if skip:
                    t0 = time.perf_counter()
                    lm.train(s, batches, steps=skip, peak_lr=1e-4, warmup=1, row_tokens=r, max_seconds=1e9,
                             log_every=10**9)
                    entry["first_steps_s"] = round(time.perf_counter() - t0, 2)
                # `train` reads the loss (a sync) at its last step, inside its clock: each call's seconds hold all
                # of its GPU work and none of the call before.
                stats = lm.train(s, batches, steps=args.steps, peak_lr=1e-4, warmup=1, row_tokens=r,
                                 max_seconds=1e9, log_every=10**9)
                entry["rounds"].append({"tokens_per_s": round(stats["tokens"] / stats["seconds"]),
                                        "seconds": round(stats["seconds"], 3)})
                entry["tokens_per_s"] = max(x["tokens_per_s"] for x in entry["rounds"])
                if device == "cuda":
                    entry["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
                logging.info("%s", json.dumps(entry))
                base = out["settings"][0]["tokens_per_s"]
                for e in out["settings"]:
                    if "tokens_per_s" in e:
                        e["cost_per_token_vs_first"] = round(base / e["tokens_per_s"], 3)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(out, indent=1) + "\n")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budgets", default="1792,4096", help="prompt budgets (SPEEDRUN_MAX_PROMPT values), first = base")
    p.add_argument("--tokenizer", type=Path, default=ROOT / ".speedrun" / "corpus" / "tokenizer")
    p.add_argument("--rows-at-2048", type=int, default=ROWS_AT_2048)
    p.add_argument("--steps", type=int, default=24, help="timed steps a setting a round")
    p.add_argument("--warmup", type=int, default=4, help="untimed first steps of each setting (compilation)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "row_cost.json")
    args = p.parse_args()
    args.budgets = [int(b) for b in args.budgets.split(",")]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    measure(args)
    print(args.out.read_text())


if __name__ == "__main__":
    main()
