"""How many held-out prompts show the lines their fix changes, by prompt budget, and why the others do not.

A single-shot answer is a diff whose lines are copied from the prompt: a task whose fix's lines are not in its prompt
cannot be resolved, whatever the model (every held-out task any speedrun resolved had them). The budget and the
number of ranked functions (`SPEEDRUN_MAX_PROMPT`, `SPEEDRUN_CONTEXT_FUNCTIONS`: benchmarks/speedrun/prompting.py)
set that ceiling; the base must then be pre-trained for the longer rows. For each setting, the tasks whose prompt
shows the fix (`fixes.fix_visible`, read against the gold patch, which no prompt contains); for the misses of the
first setting, where the buggy function (the task's `metadata.function`) stood in the ranking:

  not_ranked      not among the first 64 functions of the ranking (or not a function the ranking keeps)
  ranked_beyond   ranked, but past the setting's number of functions
  cut_by_budget   among them, but left out: the functions before it took the budget
  lines_elsewhere shown, but the fix also changes lines outside it (another function, the module's top level)

    .venv/bin/python benchmarks/prompt_fix_shown.py --data .speedrun --settings 1792:12,3072:24,4096:32

Writes `benchmarks/results/prompt_fix_shown.json` and its figure (`.png`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "speedrun"))
import fixes  # noqa: E402
from prompting import Prompting  # noqa: E402
from report import REMOVAL_KINDS  # noqa: E402

RANKED = 64


def _one(job: tuple[Any, str, Prompting, bool]) -> dict[str, Any]:
    from envs.swe.prompt import resolve_repo
    from envs.swe.retrieval import retrieve_functions

    task, repos, prompting, why = job
    prompt = prompting.build(task, fixes._worker_tok, Path(repos))
    row: dict[str, Any] = {"id": task.instance_id, "shown": fixes.fix_visible(prompt.text, task.patch),
                           "tokens": len(prompt.token_ids), "functions": len(prompt.context_files)}
    if why and not row["shown"]:
        where, qualname = str(task.metadata["file"]), str(task.metadata["function"])

        def buggy(label: str) -> bool:
            return label.startswith(where + ":") and label.endswith(" " + qualname)

        repo = resolve_repo(task.repo_url, Path(repos))
        if repo is None:
            raise SystemExit(f"task {task.instance_id}: no repository for {task.repo_url} under {repos}")
        ranked = [label for label, _ in retrieve_functions(repo, task.base_commit, task.problem_statement, k=RANKED)]
        rank = next((i for i, label in enumerate(ranked) if buggy(label)), None)
        row["rank"] = rank
        row["why"] = ("not_ranked" if rank is None else "ranked_beyond" if rank >= prompting.functions
                      else "lines_elsewhere" if any(buggy(label) for label in prompt.context_files)
                      else "cut_by_budget")
    return row


def measure(data: Path, split: str, settings: list[Prompting], workers: int) -> dict[str, Any]:
    from envs.swe.taskset import read_split

    tasks = read_split(data / "tasks", split)
    in_place = {t.instance_id for t in tasks if t.metadata.get("bug_kind") not in REMOVAL_KINDS}
    out: dict[str, Any] = {"split": split, "tasks": len(tasks), "in_place": len(in_place), "settings": []}
    with ProcessPoolExecutor(workers, initializer=fixes._init_worker,
                             initargs=(str(data / "corpus" / "tokenizer"),)) as pool:
        for i, prompting in enumerate(settings):
            t0 = time.perf_counter()
            jobs = [(t, str(data / "tasks" / "repos"), prompting, i == 0) for t in tasks]
            rows = list(pool.map(_one, jobs, chunksize=4))
            tokens = sorted(r["tokens"] for r in rows)
            entry = {**prompting.figures(), "shown": sum(r["shown"] for r in rows),
                     "shown_in_place": sum(r["shown"] for r in rows if r["id"] in in_place),
                     "prompt_tokens_median": tokens[len(tokens) // 2], "prompt_tokens_max": tokens[-1],
                     "functions_mean": round(sum(r["functions"] for r in rows) / len(rows), 2),
                     "seconds": round(time.perf_counter() - t0, 1), "shown_ids": sorted(r["id"] for r in rows
                                                                                          if r["shown"])}
            if i == 0:
                entry["misses"] = dict(Counter(r["why"] for r in rows if not r["shown"]))
            out["settings"].append(entry)
            print(json.dumps({k: v for k, v in entry.items() if k != "shown_ids"}), flush=True)
    first = set(out["settings"][0]["shown_ids"])
    for entry in out["settings"][1:]:
        entry["gained"], entry["lost"] = len(set(entry["shown_ids"]) - first), len(first - set(entry["shown_ids"]))
    return out


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = results["settings"]
    labels = [f"{s['max_prompt_length']} tokens\n{s['context_functions']} functions" for s in settings]
    fig, ax = plt.subplots(figsize=(7, 4))
    x = range(len(settings))
    ax.bar(x, [s["shown_in_place"] for s in settings], label="in-place bug kinds")
    ax.bar(x, [s["shown"] - s["shown_in_place"] for s in settings], bottom=[s["shown_in_place"] for s in settings],
           label="removal kinds")
    for i, s in enumerate(settings):
        ax.text(i, s["shown"] + 2, f"{s['shown']} ({100 * s['shown'] / results['tasks']:.0f} %)", ha="center")
    ax.axhline(results["tasks"], color="grey", lw=0.8, ls="--")
    ax.set_xticks(list(x), labels)
    ax.set_ylabel(f"held-out tasks whose prompt shows the fix (of {results['tasks']})")
    ax.set_ylim(0, results["tasks"] * 1.08)
    ax.legend(loc="lower right")
    ax.set_title("What the single-shot prompt can show, by budget")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=ROOT / ".speedrun", help="holds tasks/ and corpus/tokenizer")
    p.add_argument("--split", default="validation")
    p.add_argument("--settings", default="1792:12,2304:16,3072:24,4096:32",
                   help="BUDGET:FUNCTIONS,... (the first one's misses are explained)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "prompt_fix_shown.json")
    args = p.parse_args()
    results = measure(args.data, args.split, Prompting.settings(args.settings), args.workers)
    results["host"] = {"machine": platform.machine(), "cpus": os.cpu_count()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
