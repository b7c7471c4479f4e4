"""The speedrun's figure: pre-training loss, GRPO's training reward, answer outcomes, held-out verdicts, and why the
held-out answers fail (`speedrun/diagnose.py`, where the run logged them).

    python benchmarks/speedrun/plot.py benchmarks/results/swe_speedrun docs/img/swe_speedrun.png
    # a run that started from an earlier session's model: that session's folder gives the pre-training and the mode
    # this run did not train, both from the same base
    python benchmarks/speedrun/plot.py RESULTS OUT.png --with EARLIER_RESULTS
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _find(name: str, results: Path, also: Path | None) -> Path:
    """`results/name`, or `also/name` where this run has none (a run from an earlier session's model)."""
    path = results / name
    return also / name if also is not None and not path.is_file() and (also / name).is_file() else path


def main(results: Path, out: Path, also: Path | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 5, figsize=(25, 4.2))
    pre = json.loads(_find("pretrain.json", results, also).read_text())
    ax[0].plot([p["tokens"] / 1e6 for p in pre["curve"]], [p["loss"] for p in pre["curve"]])
    ax[0].set(xlabel="tokens (M)", ylabel="loss (nats/token)",
              title=f"pre-training: {pre['params'] / 1e6:.0f}M params, {pre['tokens_per_s'] / 1e3:.0f}k tok/s, "
                    f"{pre['heldout_bits_per_byte']:.2f} bits/byte held out")
    resolved_ax = ax[3].twinx()
    for mode, style in (("sync", "-"), ("async", "--")):
        path = _find(f"grpo_{mode}.json", results, also)
        if not path.is_file():
            continue
        run = json.loads(path.read_text())
        steps = [s["step"] for s in run["per_step"]]
        ax[1].plot(steps, [s["reward_mean"] for s in run["per_step"]], style, color="C0", label=f"reward ({mode})")
        if all(s.get("zero_std_groups_frac") is not None for s in run["per_step"]):
            ax[1].plot(steps, [1.0 - s["zero_std_groups_frac"] for s in run["per_step"]], style, color="C4",
                       label=f"groups with signal ({mode})")
        for kind, color in (("format_error", "C3"), ("not_applied", "C1"), ("no", "C2"), ("full", "C0")):
            ax[2].plot(steps, [s["outcome"].get(kind, 0.0) for s in run["per_step"]], style, color=color,
                       label=f"{kind} ({mode})")
        val = run["validation"]
        vsteps = [v["val/step"] for v in val]
        for kind, color in (("no_patch", "C3"), ("patch_not_applied", "C1"), ("tests_failed", "C2")):
            ax[3].plot(vsteps, [v[f"val/verdict/{kind}"] / v["val/tasks"] for v in val], style + "o", color=color,
                       label=f"{kind} ({mode})")
        # Resolves are a few tasks in hundreds: counted on their own axis, with the change's 95% interval (paired
        # bootstrap over tasks, `report.heldout_changes`) around each round when the report has it.
        held = run.get("heldout") or [{"step": v["val/step"], "resolved": v["val/verdict/resolved"]} for v in val]
        first = held[0]["resolved"]
        err = [[h["resolved"] - (first + h["change_ci95"][0] * h["tasks"]) for h in held],
               [first + h["change_ci95"][1] * h["tasks"] - h["resolved"] for h in held]] \
            if all("change_ci95" in h for h in held) else None
        resolved_ax.errorbar([h["step"] for h in held], [h["resolved"] for h in held], yerr=err, fmt=style + "s",
                             color="C0", capsize=3, label=f"resolved ({mode})")
    _diagnosis(ax[4], results, also)
    ax[1].set(xlabel="GRPO step", ylabel="mean reward / share of groups",
              title="training reward; groups whose rewards differ")
    ax[2].set(xlabel="GRPO step", ylabel="share of answers", title="training answers by outcome")
    ax[3].set(xlabel="GRPO step", ylabel="share of held-out tasks",
              title=f"held-out repos, greedy ({int(val[0]['val/tasks'])} tasks)")
    resolved_ax.set_ylabel("held-out tasks resolved (95% interval of the change)", color="C0")
    resolved_ax.set_ylim(bottom=0)
    resolved_ax.legend(fontsize=7, loc="center right")
    for a in ax[1:]:
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=90)


def _diagnosis(ax: Any, results: Path, also: Path | None) -> None:
    """Held-out answers by diagnosis kind, first and last round of each mode, side by side."""
    kinds = ["format", "path", "invented_elsewhere", "invented_from_prompt", "whitespace", "scattered", "anchored"]
    bars: list[tuple[str, dict[str, int], dict[str, int]]] = []
    for mode in ("sync", "async"):
        path = _find(f"grpo_{mode}.json", results, also)
        diag = json.loads(path.read_text()).get("diagnosis", []) if path.is_file() else []
        for r in (diag[:1] + diag[-1:]) if len(diag) > 1 else diag:
            bars.append((f"{mode} step {r['step']}", r["kinds"], r["gold"]))
    if not bars:
        ax.set_axis_off()
        return
    width = 0.8 / len(bars)
    for i, (label, counts, gold) in enumerate(bars):
        ax.bar([k + i * width for k in range(len(kinds))], [counts.get(k, 0) for k in kinds], width,
               label=f"{label} (no-op {gold.get('no_op', 0)})")
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(kinds))], [k.replace("_", "\n") for k in kinds],
                  fontsize=7)
    ax.set(ylabel="held-out answers", title="why held-out diffs fail (diagnose.py)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--with", dest="also", type=Path, default=None,
                        help="an earlier run's results: its pretrain.json and the GRPO mode missing here")
    args = parser.parse_args()
    main(args.results, args.out, args.also)
