"""Does the tiny model learn to copy a tool's result (issue 17)? Format pre-training, then GRPO on success only.

    .venv/bin/python benchmarks/agent_bench.py copy --from-model .cache/models/tiny-qwen2-lookup \
        --base .cache/models/tiny-qwen2-lookup-random --pre2-steps 60 --steps 80 [--lr 3e-4] [--max-s 600]

1. **Base** (`workshop/pretrain.py`): `tiny-qwen2` trained on `lookup` episodes rendered as the agent loop renders
   them (the prompt, a `lookup` call with the question's key, the observation, an `answer` call) whose answer is a
   **random** digit, independent of the observation: it knows the format and not the copy (greedy success on
   held-out episodes at chance, 1/10). Two stages, each folder reused: the first (120 steps of 32 at lr 3e-3 from
   tiny-qwen2, or `--from-model`), then `--pre2-steps` of 16 from it. From tiny-qwen2 alone, 270 steps (11 min on
   this loaded machine) still left the 40-token calls unparsable, so the recorded run starts its first stage from
   agent_learn.py's format model (docs/performance.md says what that model saw) and the random answers of stage two
   bring it to chance.
2. **GRPO** on `--prompts` x `--gens` episodes a step, run by the agent loop itself (`run_episode`: the tool-call
   parser, `LookupTools`, token-exact trajectories, observation tokens masked out of the loss), each turn of all
   episodes decoded as one padded batch; reward 1 for the right value (`score_tools` FULL), else 0; group-normalised
   advantages, a token-mean loss over generated tokens, one AdamW update a step (the fleet's sync recipe: ratio 1).
3. Every `--eval-every` steps, greedy success on 200 held-out episodes (tasks of another seed; with one key a greedy
   episode is a function of the looked-up value, so this is the rate over the ten values, weighted as drawn).

`--env peek` (envs/peek.py, the fleet demo's environment: examples/configs/peek_learn.yaml, benchmarks/peek_learn.py)
runs the same loop on `peek` episodes (~12 generated tokens, `<tool_call>` as single tokens, the answer as text),
from `peek_base`: `tiny-qwen2` pre-trained `--pre-steps` of `--pre-batch` on peek episodes with random answers.

The environment is `examples/configs/lookup_learn.yaml`'s: one key, one-digit values (a one-token copy). Result:
benchmarks/results/lookup_copy.json; plot: docs/img/agent_lookup_copy.png (`--out`, `--plot`). In the recorded
runs success stayed at chance (docs/performance.md, "Agent mode"). Why not through the fleet: at the
fleet's 16 s per step on this shared 2-core machine, the ~100 steps the copy needs are half an hour; this loop runs
the same episode code and the same loss on one core in minutes (docs/performance.md, "Agent mode").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks/results/lookup_copy.json"
PLOT = ROOT / "docs/img/agent_lookup_copy.png"
LIMITS = {"max_turns": 2, "max_total_tokens": 256, "max_new_tokens_per_turn": 56}  # lookup_learn.yaml's budgets
PEEK_LIMITS = {"max_turns": 2, "max_total_tokens": 96, "max_new_tokens_per_turn": 16}  # peek_learn.yaml's


def lookup_cfg() -> Any:
    from fleet.config.env import LookupEnvConfig

    return LookupEnvConfig(num_keys=1, table_size=1, max_value=9)


def make_tasks(env: str, seed: int, split: str, n: int) -> list[Any]:
    if env == "peek":
        from envs.peek import make_peek_tasks

        return make_peek_tasks(seed, split, n)
    from envs.lookup import make_lookup_tasks

    return make_lookup_tasks(seed, split, n, lookup_cfg())


def format_corpus(seed: int) -> Iterator[list[dict[str, str]]]:
    """Episodes with the right lookup and a random answer: the chat renders to the loop's exact tokens."""
    from agent_learn import call_text

    from envs.lookup import COMPACT_TOOLS, SYSTEM_PROMPT, make_lookup_tasks

    rng = random.Random(seed)
    system = SYSTEM_PROMPT + COMPACT_TOOLS.format(tools="")  # what ChatFormat.prompt_ids writes for this template
    for i in range(1 << 30):
        task = make_lookup_tasks(seed + i, "pretrain", 1, lookup_cfg())[0]
        yield [{"role": "system", "content": system}, {"role": "user", "content": task.problem_statement},
               {"role": "assistant", "content": call_text("lookup", key=task.metadata["key"])},
               {"role": "tool", "content": str(task.metadata["answer"])},
               {"role": "assistant", "content": call_text("answer", value=str(rng.randrange(10)))}]


class BatchGenerate:
    """`generate` for `run_episode`: once every live episode waits for its next turn, all are decoded as one
    left-padded batch (positions from 0 per row, as the engines do); log-probs are raw (`log_softmax` of the
    logits)."""

    def __init__(self, model: Any, end_ids: set[int], pad_id: int, episodes: int, seed: int) -> None:
        import torch

        self.model, self.end_ids, self.pad_id, self.live = model, end_ids, pad_id, episodes
        self.pending: list[tuple[str, list[int], Any, asyncio.Future[Any]]] = []
        self.dev = next(model.parameters()).device
        self.gen = torch.Generator(self.dev).manual_seed(seed)

    async def __call__(self, rid: str, context: list[int], spec: Any, **_: Any) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending.append((rid, list(context), spec, fut))
        self._flush()
        return await fut

    def finished(self) -> None:
        self.live -= 1
        self._flush()

    def _flush(self) -> None:
        if not self.pending or len(self.pending) < self.live:
            return
        from rollout.engine.base import Generation

        batch, self.pending = self.pending, []
        outs = self._decode([c for _, c, _, _ in batch], [s.max_new_tokens for _, _, s, _ in batch],
                            batch[0][2].temperature)
        for (rid, ctx, _, fut), (toks, lps, finish) in zip(batch, outs, strict=True):
            fut.set_result(Generation(rid, toks, lps, [0] * len(toks), finish, len(ctx)))

    def _decode(self, contexts: list[list[int]], limits: list[int], temperature: float) -> list[tuple[Any, ...]]:
        import torch

        width, n = max(map(len, contexts)), len(contexts)
        ids = torch.tensor([[self.pad_id] * (width - len(c)) + c for c in contexts], device=self.dev)
        mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts], device=self.dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        toks: list[list[int]] = [[] for _ in range(n)]
        lps: list[list[float]] = [[] for _ in range(n)]
        done = [False] * n
        ends = torch.tensor(sorted(self.end_ids), device=self.dev)
        with torch.no_grad():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
            for _ in range(max(limits)):
                logits = out.logits[:, -1].float()
                logp = torch.log_softmax(logits, -1)
                if temperature == 0:
                    nxt = logits.argmax(-1)
                else:
                    nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=self.gen)[:, 0]
                picked, lp, ended = nxt.tolist(), logp.gather(1, nxt[:, None])[:, 0].tolist(), torch.isin(nxt, ends)
                for i in range(n):
                    if not done[i]:
                        toks[i].append(picked[i])
                        lps[i].append(lp[i])
                        done[i] = bool(ended[i]) or len(toks[i]) >= limits[i]
                if all(done):
                    break
                mask = torch.cat([mask, torch.ones(n, 1, dtype=mask.dtype, device=self.dev)], 1)
                pos = pos[:, -1:] + 1
                out = self.model(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos,
                                 past_key_values=out.past_key_values, use_cache=True)
        return [(t, lp, "stop" if t and t[-1] in self.end_ids else "length") for t, lp in zip(toks, lps, strict=True)]


async def play(model: Any, fmt: Any, tasks: list[Any], gens: int, temperature: float,
               seed: int) -> list[dict[str, Any]]:
    """`gens` episodes of each task through the agent loop: rows of (ids, loss mask, reward, group, what happened)."""
    from envs.registry import make_environment
    from rollout.agent.episode import EpisodeLimits, run_episode
    from rollout.engine.base import SamplingSpec

    peek = tasks[0].env_name == "peek"
    env, limits = make_environment(tasks[0].env_name), EpisodeLimits(**(PEEK_LIMITS if peek else LIMITS))
    batch = BatchGenerate(model, fmt.end_ids, fmt.tok.pad_token_id, len(tasks) * gens, seed)
    spec = SamplingSpec(max_new_tokens=limits.max_new_tokens_per_turn, temperature=temperature)

    async def one(task: Any, group: int, i: int) -> dict[str, Any]:
        payload = env.task_to_payload(task)
        tools = env.episode_tools(payload)
        prompt = env.build_prompt(task, fmt.tok, 4096).token_ids
        try:
            ep = await run_episode(batch, fmt, tools, prompt, spec, limits, f"{group}/{i}")
        finally:
            batch.finished()
        verdict = env.score_tools(payload, tools).verdict  # type: ignore[attr-defined]
        return {"ids": list(prompt) + ep.token_ids, "mask": [0] * len(prompt) + ep.loss_mask(), "group": group,
                "logprobs": [0.0] * len(prompt) + ep.logprobs,
                "reward": 1.0 if verdict.resolution == "FULL" else 0.0, "answered": tools.answer is not None,
                "looked_up": bool(tools.peeks if peek else tools.lookups), "tool_errors": ep.tool_errors,
                "tool_calls": ep.tool_calls, "turns": ep.turns}

    return list(await asyncio.gather(*[one(t, g, i) for g, t in enumerate(tasks) for i in range(gens)]))


def grpo_step(model: Any, opt: Any, rows: list[dict[str, Any]], pad_id: int, ref: Any = None,
              beta: float = 0.0) -> float:
    """One AdamW update on the token-mean policy-gradient loss, plus `beta` x the fleet's k3 KL to `ref` (NeMo RL's
    current gradient: `beta (logp - logp_ref)` per generated token, `trainer/grpo/loss.py`)."""
    import torch

    dev = next(model.parameters()).device
    rewards = torch.tensor([r["reward"] for r in rows], device=dev)
    groups = torch.tensor([r["group"] for r in rows], device=dev)
    adv = torch.zeros_like(rewards)
    for g in groups.unique():
        sel = groups == g
        std = rewards[sel].std()
        adv[sel] = (rewards[sel] - rewards[sel].mean()) / (std + 1e-6) if std > 0 else 0.0
    if not bool(adv.any()):
        return 0.0  # no group with reward spread: no update (the fleet's grpo.skip_update_without_signal)
    width = max(len(r["ids"]) for r in rows)
    ids = torch.tensor([r["ids"] + [pad_id] * (width - len(r["ids"])) for r in rows], device=dev)
    mask = torch.tensor([r["mask"] + [0] * (width - len(r["mask"])) for r in rows], dtype=torch.float32,
                        device=dev)[:, 1:]
    logits = model(input_ids=ids).logits[:, :-1].float()  # right padding: causal attention never sees it
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    loss = -(adv[:, None] * logp * mask).sum() / mask.sum()
    if ref is not None and beta > 0:
        with torch.no_grad():
            ref_lp = torch.log_softmax(ref(input_ids=ids).logits[:, :-1].float(), -1).gather(
                -1, ids[:, 1:, None])[..., 0]
        log_ratio = (ref_lp - logp).clamp(-20, 20)
        k3 = (log_ratio.exp() - log_ratio - 1).clamp(max=10) * (logp - logp.detach()).exp()
        loss = loss + beta * (k3 * mask).sum() / mask.sum()
    opt.zero_grad()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(norm)


def peek_base(out: Path, steps: int, batch: int, lr: float, direct_frac: float = 0.0, echo_frac: float = 0.0,
              copy_frac: float = 0.0) -> Path:
    """The `peek` base: `tiny-qwen2` (random weights) with `<tool_call>` / `</tool_call>` added as single tokens,
    pre-trained on peek episodes with random answers (`envs.peek.format_corpus`): the format at chance level."""
    import functools

    from envs.peek import TOOL_TOKENS
    from envs.peek import format_corpus as peek_corpus
    from workshop.pretrain import ensure_format_model

    extra = (f"-echo{echo_frac:g}" if echo_frac else "") + (f"-copy{copy_frac:g}" if copy_frac else "")
    corpus = functools.partial(peek_corpus, direct_frac=direct_frac, echo_frac=echo_frac, copy_frac=copy_frac)
    return ensure_format_model(out, corpus, name=f"peek-episodes-random-answer-direct{direct_frac:g}{extra}",
                               steps=steps, batch=batch, lr=lr, extra_tokens=TOOL_TOKENS)


def peek_tooluse_base(out: Path, copy_steps: int = 200, rare_steps: int = 60, direct_frac: float = 0.95) -> Path:
    """The tool-use base: it copies the tool's result when it reads, and seldom reads. Two stages, each folder
    reused: `copy_steps` x 64 episodes that read and answer the result, then `rare_steps` x 64 from it in which
    `direct_frac` answer at once with a guess: a guess is a format error in `peek`, so GRPO has to teach the call.
    Both at lr 3e-4: at 2e-3 (the format base's) 500 steps of copies left the answer independent of the tool's
    result; at 3e-4 it was exact by step 150 (docs/performance.md, "peek")."""
    import functools

    from envs.peek import TOOL_TOKENS
    from envs.peek import format_corpus as peek_corpus
    from workshop.pretrain import ensure_format_model

    copy = ensure_format_model(out.with_name(out.name + "-stage1"), functools.partial(peek_corpus, copy_frac=1.0),
                               name="peek-episodes-copied-answer", steps=copy_steps, batch=64, lr=3e-4,
                               extra_tokens=TOOL_TOKENS)
    rare = functools.partial(peek_corpus, direct_frac=direct_frac, copy_frac=1.0)
    return ensure_format_model(out, rare, name=f"peek-episodes-direct{direct_frac:g}-copied-answer", steps=rare_steps,
                               batch=64, lr=3e-4, seed=1, init=copy)


def evaluate(model: Any, fmt: Any, tasks: list[Any]) -> dict[str, float]:
    """Greedy rates over `tasks`. A greedy episode depends only on (key, value), so each distinct pair is played
    once and weighted by how often it occurs: exact, and ~20x cheaper than playing all 200."""
    weight: dict[tuple[str, int], int] = {}
    first: dict[tuple[str, int], Any] = {}
    for t in tasks:
        pair = (t.metadata.get("key", ""), int(t.metadata["answer"]))
        weight[pair] = weight.get(pair, 0) + 1
        first.setdefault(pair, t)
    rows = asyncio.run(play(model, fmt, list(first.values()), 1, 0.0, 0))
    n = len(tasks)
    w = list(weight.values())
    return {k: sum(c * r[field] for c, r in zip(w, rows, strict=True)) / n
            for k, field in (("success", "reward"), ("looked_up", "looked_up"), ("answered", "answered"))}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from envs.agent.chat import ChatFormat
    from fleet.tokenizer import load_tokenizer
    from workshop.pretrain import ensure_format_model

    torch.set_num_threads(args.threads)  # one core: the machine is shared
    torch.manual_seed(args.seed)
    if args.env == "peek":
        base = peek_base(args.base, args.pre_steps, args.pre_batch, args.pre_lr, args.direct_frac, args.echo_frac,
                         args.copy_frac)
    else:  # two stages (each folder reused): 120 x 32 left the 40-token calls half-formed (not parsable)
        stage1 = args.from_model or ensure_format_model(
            args.base.with_name(args.base.name + "-1"), format_corpus, steps=args.pre_steps,
            name="lookup-episodes-random-answer", batch=args.pre_batch, lr=args.pre_lr)
        base = ensure_format_model(args.base, format_corpus, name="lookup-episodes-random-answer",
                                   steps=args.pre2_steps, batch=16, lr=args.pre_lr, seed=1, init=stage1)
    tok = load_tokenizer(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).to(args.device)
    fmt = ChatFormat(tok)
    held_out = make_tasks(args.env, 99, "heldout", 200)
    train = make_tasks(args.env, args.seed, "train", args.steps * args.prompts)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    ref = None
    if args.kl > 0:  # the frozen base, as the fleet's reference policy
        ref = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).to(args.device).eval()
    t0 = time.monotonic()
    history = [{"step": 0, "t": 0.0, **evaluate(model, fmt, held_out)}]
    print(json.dumps(history[-1]), flush=True)
    train_log = []
    for step in range(args.steps):
        model.eval()
        rows = asyncio.run(play(model, fmt, train[step * args.prompts:(step + 1) * args.prompts], args.gens, 1.0,
                                args.seed * 100003 + step))
        model.train()
        norm = grpo_step(model, opt, rows, tok.pad_token_id, ref, args.kl)
        n = len(rows)
        train_log.append({"step": step + 1, "reward": sum(r["reward"] for r in rows) / n, "grad_norm": norm,
                          "tool_error_rate": sum(r["tool_errors"] for r in rows) / max(1, sum(r["tool_calls"]
                                                                                            for r in rows)),
                          "turns": sum(r["turns"] for r in rows) / n})
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            model.eval()
            history.append({"step": step + 1, "t": round(time.monotonic() - t0, 1), **evaluate(model, fmt, held_out)})
            print(json.dumps({**history[-1], "train_reward": train_log[-1]["reward"]}), flush=True)
        if time.monotonic() - t0 > args.max_s:
            print(f"stopped at step {step + 1}: --max-s {args.max_s:g} reached", flush=True)
            break
    return {"args": {k: str(v) for k, v in vars(args).items()}, "seconds": round(time.monotonic() - t0, 1),
            "chance": 0.1, "held_out": history, "train": train_log}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    h, tr = result["held_out"], result["train"]
    ax.plot([x["step"] for x in h], [x["success"] for x in h], marker="o", color="tab:green",
            label="held-out success, greedy (200 episodes)")
    ax.plot([x["step"] for x in tr], [x["reward"] for x in tr], color="tab:blue", alpha=0.4,
            label="training reward (binary: the right value)")
    ax.axhline(result["chance"], color="grey", linestyle=":", label="chance (a guess)")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    a = result["args"]
    ax.set_title(f"tiny Qwen2, lookup: GRPO on success only from a random-answer base\nlr {a['lr']}, "
                 f"{a['prompts']}x{a['gens']} episodes/step, {result['seconds']:.0f} s on one CPU core", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", choices=["lookup", "peek"], default="lookup")
    ap.add_argument("--direct-frac", type=float, default=0.0,
                    help="peek: share of the base's pre-training episodes that answer without the tool")
    ap.add_argument("--echo-frac", type=float, default=0.0,
                    help="peek: share of the base's pre-training chats that copy a digit from the user (no tool)")
    ap.add_argument("--copy-frac", type=float, default=0.0,
                    help="peek: share of the base's reading episodes that answer the tool's result")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--gens", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-4, help="1e-3 broke the call format within 5 steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kl", type=float, default=0.0,
                    help="beta of the k3 KL to the base (loss_fn.reference_policy_kl_penalty)")
    ap.add_argument("--pre-steps", type=int, default=120)
    ap.add_argument("--pre-batch", type=int, default=32)
    ap.add_argument("--pre-lr", type=float, default=3e-3)
    ap.add_argument("--pre2-steps", type=int, default=150, help="second stage, batch 16, from the first")
    ap.add_argument("--from-model", type=Path, default=None,
                    help="a model folder as the first stage (e.g. agent_learn.py's .cache/models/tiny-qwen2-lookup)")
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu (the demo), or cuda to try recipes quickly")
    ap.add_argument("--max-s", type=float, default=600.0, help="stop after this many seconds of GRPO")
    ap.add_argument("--base", type=Path, default=ROOT / ".cache/models/tiny-qwen2-lookup-format")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--plot", type=Path, default=PLOT)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.plot)
    h = result["held_out"]
    print(f"held-out greedy success {h[0]['success']:.2f} -> {h[-1]['success']:.2f} (best "
          f"{max(x['success'] for x in h):.2f}) in {result['seconds']:.0f} s; wrote {args.out} and {args.plot}")


if __name__ == "__main__":
    main()
