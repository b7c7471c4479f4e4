"""The tiny model learns to use a tool through the fleet: `lookup` episodes (envs/lookup.py), agent mode's loop.

    .venv/bin/python benchmarks/agent_bench.py learn [--steps 40] [--pretrain-steps 300] [--tool-frac 0.25]

1. **Format pre-training** (local, a few minutes on one core): the random-weight tiny Qwen2 is fine-tuned on
   episodes rendered token-exactly as the fleet will render them (`ChatFormat`: prompt, turns, observation tokens;
   loss on the model's turns only), of two kinds: a fraction `--tool-frac` *look the value up, then answer it*,
   the rest *answer a guess at once*. It learns the tool-call syntax of both tools and how to copy a tool result
   into an answer, but mostly (75% by default) to skip the tool: its reward starts at about `tool_frac`.
   Without it a 3.7M-parameter random model would not emit a parsable 40-token JSON call in minutes.
2. **GRPO through the fleet** (`grpo-fleet up --config examples/configs/lookup_learn.yaml`, the pre-trained
   folder as `policy.model_name`): embedded Redis, replay buffer, one vLLM rollout worker running the episodes
   (LocalToolRunner), the torchrun trainer with observation tokens masked out of the loss. A guess is right 1 time
   in 90, so the reward can only rise by calling `lookup` with the question's key and answering what it returned.
3. Reward and success rate (the right value) per step -> docs/img/lookup_learning.png and
   benchmarks/results/lookup_learn.json.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from trainer.metrics import read_jsonl  # noqa: E402

CONFIG = ROOT / "examples/configs/lookup_learn.yaml"
RESULTS = ROOT / "benchmarks/results/lookup_learn.json"
PLOT = ROOT / "docs/img/lookup_learning.png"


def call_text(name: str, **arguments: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def format_example(fmt: Any, env: Any, task: Any, use_tool: bool, rng: random.Random) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of one episode exactly as the fleet's loop would assemble it."""
    prompt = env.build_prompt(task, fmt.tok, 4096).token_ids
    end = min(fmt.end_ids)
    ids, mask = list(prompt), [0] * len(prompt)

    def turn(text: str) -> None:
        out = fmt.encode(text) + [end]
        ids.extend(out)
        mask.extend([1] * len(out))

    if use_tool:
        turn(call_text("lookup", key=task.metadata["key"]))
        obs = fmt.observation_ids([str(task.metadata["answer"])], turn_closed=True)
        ids.extend(obs)
        mask.extend([0] * len(obs))
        turn(call_text("answer", value=str(task.metadata["answer"])))
    else:
        turn(call_text("answer", value=str(rng.randint(10, 99))))
    return ids, mask


def pretrain(out: Path, steps: int, tool_frac: float, batch: int = 32, lr: float = 2e-3, seed: int = 1234,
             lookup: Any = None) -> dict[str, Any]:
    """Fine-tune the random tiny model on the format; returns what it measured (loss, seconds, copy accuracy).
    `lookup`: the `env.lookup` settings (default ones)."""
    import torch
    from transformers import AutoModelForCausalLM

    from envs.agent.chat import ChatFormat
    from envs.lookup import LookupEnvironment, make_lookup_tasks
    from fleet.tokenizer import load_tokenizer
    from workshop.resolve import resolve_model

    if lookup is None:
        from fleet.config.env import LookupEnvConfig

        lookup = LookupEnvConfig()
    torch.manual_seed(seed)
    torch.set_num_threads(1)  # one core: the other fleets (and other people) need the rest
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base = resolve_model("tiny-qwen2")
    tok = load_tokenizer(base)
    model: Any = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model = model.to(device)
    fmt, env, rng = ChatFormat(tok), LookupEnvironment(), random.Random(seed)
    # Tasks from another seed than the fleet run's (grpo.seed): the pre-training never sees a training table.
    tasks = make_lookup_tasks(seed, "pretrain", steps * batch, lookup)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.1, 1 - s / steps))
    t0, losses = time.monotonic(), []
    model.train()
    for step in range(steps):
        rows = [format_example(fmt, env, tasks[step * batch + i], rng.random() < tool_frac, rng) for i in range(batch)]
        width = max(len(r[0]) for r in rows)
        ids = torch.tensor([r[0] + [0] * (width - len(r[0])) for r in rows], device=device)
        mask = torch.tensor([r[1] + [0] * (width - len(r[1])) for r in rows], dtype=torch.float32, device=device)
        logits = model(input_ids=ids).logits[:, :-1]  # right padding: causal attention never sees it
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                                reduction="none").view(batch, -1)
        loss = (nll * mask[:, 1:]).sum() / mask[:, 1:].sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 100 == 0 or step == steps - 1:
            print(f"[pretrain] step {step} loss {loss:.4f} ({time.monotonic() - t0:.0f} s)", flush=True)
    seconds = time.monotonic() - t0
    model.eval()
    acc = token_accuracy(model, fmt, env, device, lookup)
    out.mkdir(parents=True, exist_ok=True)
    model.cpu().save_pretrained(out)
    tok.save_pretrained(out)
    stats = {"steps": steps, "batch": batch, "lr": lr, "tool_frac": tool_frac, "device": device, "seconds": seconds,
            "loss_first": losses[0], "loss_last": sum(losses[-10:]) / min(10, len(losses)), **acc}
    (out / "pretrain.json").write_text(json.dumps(stats, indent=1) + "\n")
    return stats


def token_accuracy(model: Any, fmt: Any, env: Any, device: str, lookup: Any, n: int = 128) -> dict[str, float]:
    """Teacher-forced on look-up episodes of fresh tasks: P(the first turn calls lookup), and how often the argmax
    is the question's key in the call and the looked-up value in the answer (the copies the task needs)."""
    import torch

    from envs.lookup import make_lookup_tasks

    rng = random.Random(7)
    tasks = make_lookup_tasks(99, "probe", n, lookup)
    rows = [format_example(fmt, env, t, True, rng) for t in tasks]
    width = max(len(r[0]) for r in rows)
    ids = torch.tensor([r[0] + [0] * (width - len(r[0])) for r in rows], device=device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    lo, key_digit, values = fmt.encode(' "lo')[-1], [], []
    tool_p, key_ok, value_ok = [], 0, 0
    for b, (row, mask) in enumerate(rows):
        turn = [i for i in range(1, len(row)) if mask[i]]
        first = next(i for i in turn if row[i] == lo)  # the token that decides: lookup or answer
        tool_p.append(float(torch.softmax(logits[b, first - 1], -1)[lo]))
        key_digit = [i for i in turn if fmt.decode([row[i - 1]]) == "k" and fmt.decode([row[i]]).isdigit()]
        values = [i for i in turn[len(turn) // 2:] if fmt.decode([row[i]]).isdigit()]
        key_ok += all(int(logits[b, i - 1].argmax()) == row[i] for i in key_digit)
        value_ok += all(int(logits[b, i - 1].argmax()) == row[i] for i in values)
    return {"p_lookup_first": sum(tool_p) / n, "key_copied": key_ok / n, "value_copied": value_ok / n}


async def evaluate(model_dir: Path, n: int, temperature: float = 1.0, seed: int = 99) -> dict[str, float]:
    """Episodes of the model on `n` fresh tasks through the agent loop (HF engine): success and tool-use rates."""
    from envs.agent.chat import ChatFormat
    from envs.lookup import LookupEnvironment, make_lookup_tasks
    from fleet.config import MasterConfig
    from fleet.config.env import LookupEnvConfig
    from fleet.tokenizer import load_tokenizer
    from rollout.agent.episode import EpisodeLimits, run_episode
    from rollout.engine import make_engine
    from rollout.engine.base import SamplingSpec

    cfg = MasterConfig()
    cfg.policy.generation.backend = "hf"
    engine = make_engine(cfg.policy, str(model_dir), seed=cfg.grpo.seed)
    await engine.start()
    fmt, env = ChatFormat(load_tokenizer(model_dir)), LookupEnvironment()
    right = used = 0
    try:
        for i, task in enumerate(make_lookup_tasks(seed, "eval", n, LookupEnvConfig())):
            tools = env.episode_tools(env.task_to_payload(task))
            await run_episode(engine.generate, fmt, tools, env.build_prompt(task, fmt.tok, 4096).token_ids,
                              SamplingSpec(temperature=temperature, max_new_tokens=64),
                              EpisodeLimits(max_turns=3, max_new_tokens_per_turn=64), f"e{i}")
            right += tools.answer == str(task.metadata["answer"])
            used += bool(tools.lookups)
    finally:
        await engine.stop()
    return {"success": right / n, "tool_use": used / n, "n": n}


def plot(steps: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    xs = [s["step"] + 1 for s in steps]
    axes[0].plot(xs, [s["reward"] for s in steps], color="tab:blue", label="reward")
    axes[0].plot(xs, [s["resolved"] for s in steps], color="tab:green", linestyle="--",
                 label="success rate (the right value)")
    axes[0].set_ylabel("training reward / success rate")
    axes[1].plot(xs, [s["turns"] for s in steps], color="tab:orange", label="turns per episode (1 = a guess)")
    axes[1].plot(xs, [s["tool_error_rate"] for s in steps], color="tab:red", linestyle=":",
                 label="tool-call error rate")
    for ax in axes:
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    import argparse

    from async_bench import run_fleet

    ap = argparse.ArgumentParser(description="the lookup tool-use demo: pre-train the format, GRPO through the fleet")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--pretrain-steps", type=int, default=600)
    ap.add_argument("--pretrain-batch", type=int, default=16)
    ap.add_argument("--pretrain-lr", type=float, default=3e-3)
    ap.add_argument("--tool-frac", type=float, default=0.4)
    ap.add_argument("--model-dir", type=Path, default=ROOT / ".cache/models/tiny-qwen2-lookup")
    ap.add_argument("--skip-pretrain", action="store_true", help="use --model-dir as it is")
    ap.add_argument("--work", type=Path, default=ROOT / "runs/bench_lookup")
    ap.add_argument("--timeout-s", type=float, default=1800)
    ap.add_argument("overrides", nargs="*", help="config overrides for the fleet run (key=value)")
    args = ap.parse_args(argv)
    result: dict[str, Any] = {"config": str(CONFIG.relative_to(ROOT)), "steps": args.steps,
                              "overrides": args.overrides}
    if not args.skip_pretrain:
        from fleet.config import load_config

        lookup = load_config(str(CONFIG)).env.lookup  # the tasks the fleet run trains on, from another seed
        result["pretrain"] = pretrain(args.model_dir, args.pretrain_steps, args.tool_frac, batch=args.pretrain_batch,
                                      lr=args.pretrain_lr, lookup=lookup)
        print(json.dumps(result["pretrain"]), flush=True)
    elif (meta := args.model_dir / "pretrain.json").exists():
        result["pretrain"] = json.loads(meta.read_text())
    args.work.mkdir(parents=True, exist_ok=True)
    run = run_fleet("lookup", args.work, args.steps, [f"policy.model_name={args.model_dir}", *args.overrides], CONFIG,
                    args.timeout_s)
    records = read_jsonl(args.work / "lookup/logs/metrics.jsonl")
    agent = {r["step"]: r for r in records if "agent/turns_mean" in r}
    for s in run["steps"]:
        r = agent.get(s["step"], {})
        s["turns"], s["tool_error_rate"] = r.get("agent/turns_mean", 0.0), r.get("agent/tool_error_rate", 0.0)
        s["token_mult_prob_error"] = r.get("loss/token_mult_prob_error")  # engine vs trainer log-probs (1.0: equal)
    result["run"] = {k: run[k] for k in ("wall_s", "step_s", "final_reward", "final_resolved", "steps")}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    plot(run["steps"], PLOT, "tiny Qwen2 (format pre-trained) learning to use the lookup tool through the fleet")
    first, last = run["steps"][:3], run["steps"][-5:]
    print(f"reward {sum(s['reward'] for s in first) / len(first):.2f} (first 3 steps) -> "
          f"{sum(s['reward'] for s in last) / len(last):.2f} (last 5); wrote {RESULTS} and {PLOT}")


if __name__ == "__main__":
    main()
