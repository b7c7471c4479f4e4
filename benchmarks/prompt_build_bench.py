"""What the first validation round of a fleet waits for: building the prompts of the held-out tasks (retrieval over
each task's commit, then the greedy fit to the budget), as the trainer builds them, with the retrieval's content
caches and without them (emptied before each task, as each commit's index was built from nothing before them).
The two settings alternate over three rounds in one sitting; every prompt must come out the same in both.

    .venv/bin/python benchmarks/prompt_build_bench.py --data .speedrun

Writes `benchmarks/results/prompt_build.json`: seconds per setting and round, and the medians' ratio.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envs.swe import retrieval  # noqa: E402
from envs.swe.prompt import build_prompt  # noqa: E402
from envs.swe.taskset import read_split  # noqa: E402
from fleet.tokenizer import load_tokenizer  # noqa: E402

# The speedrun's default prompt (benchmarks/speedrun/prompting.py).
MAX_PROMPT, CONTEXT = 1792, "bm25_functions"


def build_all(tasks: list[Any], tokenizer: Any, repos: Path, cached: bool) -> tuple[float, str]:
    """Seconds to build every task's prompt, and a digest of the prompts."""
    retrieval.clear_caches()
    digest = hashlib.sha256()
    t0 = time.perf_counter()
    for task in tasks:
        if not cached:
            retrieval.clear_caches(by_commit=False)
        prompt = build_prompt(task, tokenizer, MAX_PROMPT, CONTEXT, repos_root=repos)
        digest.update(json.dumps(prompt.token_ids).encode())
    return time.perf_counter() - t0, digest.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT / ".speedrun", help="holds tasks/ and corpus/tokenizer")
    ap.add_argument("--split", default="validation")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "prompt_build.json")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=SyntaxWarning)  # the repositories' own sources, parsed
    tasks = read_split(args.data / "tasks", args.split)
    tokenizer = load_tokenizer(args.data / "corpus" / "tokenizer")
    seconds: dict[str, list[float]] = {"without_caches": [], "with_caches": []}
    digests = set()
    for r in range(args.rounds):
        for cached in ((False, True) if r % 2 == 0 else (True, False)):
            s, digest = build_all(tasks, tokenizer, args.data / "tasks" / "repos", cached)
            seconds["with_caches" if cached else "without_caches"].append(round(s, 2))
            digests.add(digest)
            print(f"round {r}: {'with' if cached else 'without'} caches {s:.1f} s", flush=True)
    if len(digests) != 1:
        raise SystemExit("the prompts differ between the settings")
    med = {k: statistics.median(v) for k, v in seconds.items()}
    result = {"tasks": len(tasks), "split": args.split, "commits": len({t.base_commit for t in tasks}),
              "repositories": len({t.repo_url for t in tasks}), "seconds": seconds, "median_s": med,
              "speedup": round(med["without_caches"] / med["with_caches"], 2), "prompts_identical": True,
              "host": {"cpus": os.cpu_count(), "python": platform.python_version()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
