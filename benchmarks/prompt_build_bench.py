"""What the first validation round of a fleet waits for: building the prompts of the held-out tasks (retrieval over
each task's commit, then the functions packed into the budget), as the trainer builds them, with the retrieval's content
caches and without them (emptied before each task, as each commit's index was built from nothing before them).
The two settings alternate over three rounds in one sitting; every prompt must come out the same in both.

    .venv/bin/python benchmarks/prompt_build_bench.py --data .speedrun

Writes `benchmarks/results/prompt_build.json`: seconds per setting and round, and the medians' ratio.

    .venv/bin/python benchmarks/prompt_build_bench.py --data .speedrun --pack 1792:12,3072:24,4096:32

instead times the choice of the ranked functions that fill the budget, with the retrieval's caches warm, at each
BUDGET:FUNCTIONS: the packing (`envs.swe.prompt._pack`: the set of most worth that fits) against the greedy fit in
rank order it replaced (the whole prompt rendered for every candidate), and counts the prompts whose functions
differ and the worth each choice shows. Writes `benchmarks/results/prompt_pack.json`.
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
sys.path.insert(0, str(ROOT / "benchmarks" / "speedrun"))

from prompting import Prompting  # noqa: E402

from envs.swe import prompt, retrieval  # noqa: E402
from envs.swe.taskset import read_split  # noqa: E402
from fleet.tokenizer import load_tokenizer  # noqa: E402


def build_all(tasks: list[Any], tokenizer: Any, repos: Path, cached: bool) -> tuple[float, str]:
    """Seconds to build every task's prompt, and a digest of the prompts."""
    retrieval.clear_caches()
    digest = hashlib.sha256()
    t0 = time.perf_counter()
    for task in tasks:
        if not cached:
            retrieval.clear_caches(by_commit=False)
        built = Prompting().build(task, tokenizer, repos)  # the speedrun's default prompt
        digest.update(json.dumps(built.token_ids).encode())
    return time.perf_counter() - t0, digest.hexdigest()


def greedy_fit(statement: str, files: list[tuple[str, str]], tokenizer: Any, budget: int, system_prompt: str,
               bare: prompt.Rendered) -> tuple[list[tuple[str, str]], list[str], prompt.Rendered]:
    """The choice before the packing (`_pack`'s signature): greedily in rank order, each function in whole if it fits
    beside those already in, the whole prompt rendered for every candidate."""
    kept: list[tuple[str, str]] = []
    dropped: list[str] = []
    rendered = bare
    for path, body in files:
        trial = prompt._render(tokenizer, system_prompt, prompt._user_message(statement, [*kept, (path, body)], []))
        if len(trial[1]) <= budget:
            kept.append((path, body))
            rendered = trial
        else:
            dropped.append(path)
    return kept, dropped, rendered


def _worth(shown: dict[str, list[str]], ranked: dict[str, list[str]]) -> float:
    """Summed 1 / (rank + 1) of the functions shown, over the tasks: what the packing maximises."""
    return round(sum(1 / (ranked[i].index(label) + 1) for i, labels in shown.items() for label in labels), 1)


def pack_bench(tasks: list[Any], tokenizer: Any, repos: Path, settings: str, rounds: int) -> dict[str, Any]:
    packed = prompt._pack
    out: dict[str, Any] = {"tasks": len(tasks), "settings": []}
    for setting in Prompting.settings(settings):
        ranked = {t.instance_id: [label for label, _ in prompt.context_files(t, repos, setting.context,
                                                                             setting.functions)] for t in tasks}
        seconds: dict[str, list[float]] = {"packed": [], "greedy": []}
        shown: dict[str, dict[str, list[str]]] = {}
        try:
            for r in range(rounds):
                for name in (("packed", "greedy") if r % 2 == 0 else ("greedy", "packed")):
                    prompt._pack = packed if name == "packed" else greedy_fit
                    t0 = time.perf_counter()
                    shown[name] = {t.instance_id: setting.build(t, tokenizer, repos).context_files for t in tasks}
                    seconds[name].append(round(time.perf_counter() - t0, 2))
        finally:
            prompt._pack = packed

        med = {k: statistics.median(v) for k, v in seconds.items()}
        out["settings"].append({
            **setting.figures(), "seconds": seconds, "median_s": med,
            "packed_vs_greedy_time": round(med["packed"] / med["greedy"], 2),
            "prompts_differing": sum(shown["packed"][i] != shown["greedy"][i] for i in ranked),
            "functions_shown": {k: sum(map(len, v.values())) for k, v in shown.items()},
            "worth_shown": {k: _worth(v, ranked) for k, v in shown.items()}})
        print(json.dumps(out["settings"][-1]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT / ".speedrun", help="holds tasks/ and corpus/tokenizer")
    ap.add_argument("--split", default="validation")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pack", default=None, help="BUDGET:FUNCTIONS,...: time the packing instead (see above)")
    ap.add_argument("--out", type=Path, default=None,
                    help="default benchmarks/results/prompt_build.json (prompt_pack.json with --pack)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=SyntaxWarning)  # the repositories' own sources, parsed
    tasks = read_split(args.data / "tasks", args.split)
    tokenizer = load_tokenizer(args.data / "corpus" / "tokenizer")
    results = ROOT / "benchmarks" / "results"
    if args.pack:
        packs = pack_bench(tasks, tokenizer, args.data / "tasks" / "repos", args.pack, args.rounds)
        packs["host"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
        out = args.out or results / "prompt_pack.json"
        out.write_text(json.dumps(packs, indent=1) + "\n")
        return
    args.out = args.out or results / "prompt_build.json"
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
