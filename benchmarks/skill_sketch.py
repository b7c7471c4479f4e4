"""A standalone GRPO sketch (no fleet) for choosing the skill demo's task and recipe quickly (issue 21).

    python benchmarks/skill_sketch.py first --lr 3e-4 --prompts 16 --gens 16 --seed 0 [--pre-steps 50] [--steps 300]

Same math as the fleet's recipe with one update per step (the PPO ratio is 1, so the loss is -A * log pi): the tiny
Qwen2 (or `--shape LxH`), pre-trained on the question format with random answers, then GRPO with group-normalised
advantages on a binary reward for the first generated token, AdamW, grad clip 1.0; every 5 steps the greedy
accuracy on 200 held-out questions. Prints one JSON line: the step at which that accuracy first reached 0.8 and its
history. On a GPU a run takes ~20 s (36 runs side by side in ~70 s on one H200); on CPU minutes.

Task kinds: first / last (a digit of a 5-digit list), max (the fleet demo's `digits_max`: largest of 5 digits, the
maximum drawn uniformly first, as envs/digits.py does), pos (the digit at a named position), sum10 ((a + b) mod 10),
max3 (largest of 3 distinct digits: answers skewed to 9), dup (the repeated digit).

`--answer two-lenient|two-strict` (issue 21) samples the token after the digit too and trains both tokens with a
token-mean loss, as the fleet does with a digit + end-of-turn answer: `two-lenient` rewards the digit whatever
follows (the fleet's scoring before the fix: first integer of the completion), `two-strict` only a digit followed
by the end of turn. The history then also carries the validation lists' mean p(end of turn | prompt, greedy
digit). `--base DIR` starts from a format-pretrained folder (e.g. the fleet's
.cache/models/tiny-qwen2-digits_max-format) instead of pre-training here. Options for what was tried:
`--no-normalize` (advantages r - mean), `--dense` (reward 1 - |error| / 9), `--pre-mix` (half of the pre-training
corpus answers "Last digit of" questions correctly: a related skill), `--shape`.

`--stale` (issue 21, the async collapse) samples every batch from the weights one update behind the trained ones,
as the fleet's async mode with `max_trajectory_age_steps: 1` does at most, and weights each token's gradient by
`tis` (the IS weight pi_theta / pi_behaviour clamped to [`--is-min`, `--is-max`]; `--correction icepop|seq-mask-tis|
none` the fleet's other variants, or none; `--trust EPS` instead zeroes the
gradient of a token the update would push further outside [1 - EPS, 1 + EPS] of its behaviour probability, PPO's
clip against pi_behaviour; `--age-mix F` samples a share F of each step's groups from the current weights instead, as
the fleet's async batches mix ages 0 and 1). `--weight-decay` is AdamW's (0 here, 0.01 the fleet's default). Every
step also records the largest change of a sampled token's log-prob that the
update itself made (`move`), and the run stops early once every answer of a step is a format error (`collapsed`).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def task(kind: str, rng: random.Random, n: int = 5) -> tuple[str, int]:
    d = [rng.randrange(10) for _ in range(n)]
    s = " ".join(map(str, d))
    if kind in ("first", "last"):
        return f"{kind.capitalize()} digit of {s}?", d[0] if kind == "first" else d[-1]
    if kind == "max":  # as envs/digits.py: the maximum uniform over 2-9 (MAX_LOWEST), the rest uniform below it
        m = rng.randrange(2, 10)
        d = [rng.randrange(m + 1) for _ in range(n)]
        d[rng.randrange(n)] = m
        return "Largest digit of " + " ".join(map(str, d)) + "?", m
    if kind == "pos":
        k = rng.randrange(n)
        return f"Digit {k + 1} of {s}?", d[k]
    if kind == "sum10":
        return f"({d[0]} + {d[1]}) mod 10?", (d[0] + d[1]) % 10
    if kind == "max3":
        x = rng.sample(range(10), 3)
        return f"Max of {' '.join(map(str, x))}?", max(x)
    if kind == "dup":
        x = rng.sample(range(10), n - 1)
        j = rng.randrange(n - 1)
        x.insert(rng.randrange(n), x[j])
        return f"Twice in {' '.join(map(str, x))}?", x[j]
    raise ValueError(f"unknown task kind {kind!r}")


def make_model(args: argparse.Namespace) -> Path:
    from workshop.tinymodel import ensure_tiny_model, make_qwen2_like

    base = ensure_tiny_model(Path(args.cache) / "tiny-0", seed=0)
    if not args.shape:
        return ensure_tiny_model(Path(args.cache) / f"tiny-{args.seed}", seed=args.seed)
    layers, hidden = map(int, args.shape.split("x"))
    return make_qwen2_like(Path(args.cache) / f"tiny-{args.shape}-{args.seed}", hidden=hidden, layers=layers,
                           heads=max(2, hidden // 64), kv_heads=max(1, hidden // 128), intermediate=3 * hidden,
                           vocab=2048, seed=args.seed, tokenizer_from=base)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--gens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pre-steps", type=int, default=50)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--no-normalize", action="store_true")
    p.add_argument("--dense", action="store_true")
    p.add_argument("--pre-mix", action="store_true")
    p.add_argument("--shape", default="")
    p.add_argument("--cache", default="/tmp/skill-sketch-models")
    p.add_argument("--base", default="", help="a format-pretrained model folder: no pre-training here")
    p.add_argument("--answer", default="one", choices=["one", "two-lenient", "two-strict"])
    p.add_argument("--stale", action="store_true", help="sample from the weights one update behind (async age 1)")
    p.add_argument("--correction", default="tis", choices=["tis", "icepop", "seq-mask-tis", "none"],
                   help="with --stale: loss_fn.truncated_importance_sampling_type (none: no correction)")
    p.add_argument("--is-min", type=float, default=0.0)
    p.add_argument("--is-max", type=float, default=2.0)
    p.add_argument("--trust", type=float, default=0.0, help="with --stale: PPO clip against pi_behaviour")
    p.add_argument("--beta2", type=float, default=0.999)
    p.add_argument("--kl", type=float, default=0.0, help="k3 KL to the base (loss_fn.reference_policy_kl_penalty)")
    p.add_argument("--warmup", type=int, default=0, help="linear lr warm-up over this many steps")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW's (the fleet's default is 0.01)")
    p.add_argument("--eps", type=float, default=1e-8, help="AdamW's epsilon (policy.optimizer.eps)")
    p.add_argument("--age-mix", type=float, default=0.0,
                   help="with --stale: this fraction of each step's groups sampled from the current weights (age 0)")
    args = p.parse_args()
    from transformers import AutoModelForCausalLM

    from fleet.tokenizer import load_tokenizer

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(1)  # one core per sketch: several run side by side
    torch.manual_seed(args.seed)
    path = Path(args.base) if args.base else make_model(args)
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(dev)
    digit_ids = torch.tensor([tok.convert_tokens_to_ids(str(i)) for i in range(10)], device=dev)
    end = tok.convert_tokens_to_ids("<|im_end|>")

    def prompt(q: str) -> list[int]:
        text = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        return list(tok(text, add_special_tokens=False)["input_ids"])

    def last_logits(seqs: list[list[int]], keep: int = 1, net: torch.nn.Module | None = None) -> torch.Tensor:
        """The logits of the last `keep` positions ([n, V], or [n, keep, V]); each distinct sequence is run once
        (a group's answers share their prompt, so this is up to 16x less work)."""
        where: dict[tuple[int, ...], int] = {}
        for x in seqs:
            where.setdefault(tuple(x), len(where))
        uniq = list(where)
        width = max(map(len, uniq))
        ids = torch.tensor([[tok.pad_token_id] * (width - len(s)) + list(s) for s in uniq], device=dev)
        mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in uniq], device=dev)
        out = (net or model)(input_ids=ids, attention_mask=mask, logits_to_keep=keep).logits
        out = out[torch.tensor([where[tuple(x)] for x in seqs], device=dev)]
        return out[:, -1] if keep == 1 else out

    rng = random.Random(args.seed)
    val = [task(args.kind, random.Random(f"val{i}")) for i in range(200)]
    held_out = {q for q, _ in val}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    t0 = time.time()
    for _ in range(0 if args.base else args.pre_steps):  # the format, with answers independent of the question
        seqs = []
        for _ in range(64):
            if args.pre_mix and rng.random() < 0.5:
                q, a = task("last", rng)
            else:
                q, a = task(args.kind, rng)[0], rng.randrange(10)
            seqs.append(prompt(q) + [int(digit_ids[a]), end])
        width = max(map(len, seqs))
        ids = torch.tensor([[tok.pad_token_id] * (width - len(s)) + s for s in seqs], device=dev)
        mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], device=dev)
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()

    def evaluate() -> tuple[float, float]:
        """Greedy accuracy of the first token, and the mean p(end of turn) after that greedy token."""
        with torch.no_grad():
            prompts = [prompt(q) for q, _ in val]
            pred = last_logits(prompts).argmax(-1)
            p_end = torch.softmax(last_logits([x + [int(t)] for x, t in zip(prompts, pred, strict=True)]), -1)[:, end]
        acc = float((pred == digit_ids[torch.tensor([a for _, a in val], device=dev)]).float().mean())
        return acc, float(p_end.mean())

    acc0, _ = evaluate()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, args.beta2),
                            eps=args.eps)
    hist, reach, moves, collapsed, cuts = [], None, [], None, []
    P, G = args.prompts, args.gens
    behind = {k: v.clone() for k, v in model.state_dict().items()}  # the weights one update behind (--stale)

    ref = copy.deepcopy(model).eval() if args.kl else None  # the KL's reference: the base

    def answer_lp(prompts: list[list[int]], sample: torch.Tensor, nxt: torch.Tensor | None,
                  net: torch.nn.Module | None = None) -> torch.Tensor:
        """Per answer, the log-probs of its generated tokens under `net` (`model`): [n, 1] or [n, 2]."""
        if nxt is None:
            return torch.log_softmax(last_logits(prompts, net=net), -1).gather(1, sample[:, None])
        seqs = [x + [int(t)] for x, t in zip(prompts, sample, strict=True)]
        logp = torch.log_softmax(last_logits(seqs, keep=2, net=net), -1)  # one forward: the digit's and the next
        return torch.cat([logp[:, 0].gather(1, sample[:, None]), logp[:, 1].gather(1, nxt[:, None])], 1)

    for step in range(args.steps):
        qs = list(itertools.islice((x for x in iter(lambda: task(args.kind, rng), None) if x[0] not in held_out), P))
        prompts = [prompt(q) for q, _ in qs for _ in range(G)]
        want = digit_ids[torch.tensor([a for _, a in qs for _ in range(G)], device=dev)]
        now = {k: v.clone() for k, v in model.state_dict().items()} if args.stale else {}
        fresh = round(P * args.age_mix) * G if args.stale else len(prompts)  # the first `fresh` answers: age 0

        def sample_answers(part: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
            with torch.no_grad():
                logp = torch.log_softmax(last_logits(part), -1)
                first = torch.multinomial(logp.exp(), 1).squeeze(1)
                lp, second = logp.gather(1, first[:, None]), None
                if args.answer != "one":  # the next token too, trained with a token-mean loss like the fleet's
                    logp = torch.log_softmax(last_logits([x + [int(t)] for x, t in zip(part, first, strict=True)]), -1)
                    second = torch.multinomial(logp.exp(), 1).squeeze(1)
                    lp = torch.cat([lp, logp.gather(1, second[:, None])], 1)
            return first, lp, second

        # Sampling: the current weights, or (--stale) the previous update's for all but the `--age-mix` share.
        parts = [sample_answers(prompts[:fresh])] if fresh else []
        if fresh < len(prompts):
            model.load_state_dict(behind)
            parts.append(sample_answers(prompts[fresh:]))
            model.load_state_dict(now)
        if args.stale:
            behind = now
        sample = torch.cat([x[0] for x in parts])
        gen_lp = torch.cat([x[1] for x in parts])
        nxt = None if args.answer == "one" else torch.cat([x[2] for x in parts if x[2] is not None])
        lps = answer_lp(prompts, sample, nxt)
        if args.dense:
            pos = (sample[:, None] == digit_ids[None]).float()
            got = (pos * torch.arange(10, device=dev)).sum(1)
            right = (want[:, None] == digit_ids[None]).float().argmax(1).float()
            r = torch.where(pos.sum(1) > 0, 1 - (got - right).abs() / 9, torch.zeros_like(got)).view(P, G)
        else:
            right = sample == want
            r = (right & (nxt == end) if args.answer == "two-strict" else right).float().view(P, G)
        adv = r - r.mean(1, keepdim=True)
        if not args.no_normalize:
            std = r.std(1, keepdim=True)
            adv = torch.where(std > 0, adv / (std + 1e-6), torch.zeros_like(adv))
        a = adv.view(-1, 1)
        weight = torch.ones_like(lps)
        if args.stale:
            ratio = (lps.detach() - gen_lp).exp()
            lo, hi = args.is_min, args.is_max
            if args.correction == "tis":
                weight = ratio.clamp(lo, hi)
            elif args.correction == "icepop":  # as trainer/grpo/loss.py: raw weights, zeroed outside [lo, hi]
                weight = ratio * ((ratio >= lo) & (ratio <= hi))
            elif args.correction == "seq-mask-tis":  # raw weights, the answer zeroed when its geometric mean is out
                geo = (lps.detach() - gen_lp).mean(1, keepdim=True).exp()
                weight = ratio * ((geo >= lo) & (geo <= hi))
            else:  # none: stale samples used as if on-policy
                weight = torch.ones_like(ratio)
            if args.trust:  # no push further out of the band around the behaviour probability
                weight = weight * ~(((ratio > 1 + args.trust) & (a > 0)) | ((ratio < 1 - args.trust) & (a < 0)))
        loss = -(a * weight * lps).mean()
        if ref is not None:  # k3 to the base, with current NeMo RL's exp(logp - logp.detach()) factor (the fleet's)
            with torch.no_grad():
                ref_lp = answer_lp(prompts, sample, nxt, ref)
            diff = ref_lp - lps
            k3 = diff.exp() - diff - 1
            loss = loss + args.kl * (k3 * torch.exp(lps - lps.detach())).mean()
        if args.warmup:
            for group in opt.param_groups:
                group["lr"] = args.lr * min(1.0, (step + 1) / args.warmup)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():  # how far this one update moved the sampled tokens
            moves.append(round(float((answer_lp(prompts, sample, nxt) - lps.detach()).abs().max()), 2))
        if nxt is not None:
            cuts.append(round(float((nxt != end).float().mean()), 3))
        if args.answer != "one" and nxt is not None and not bool((nxt == end).any()):
            collapsed = step + 1  # no answer ended its turn: every reward is 0 from here on
            break
        if step % 5 == 4:
            acc, p_end = evaluate()
            hist.append((step + 1, round(acc, 3), round(r.mean().item(), 3), round(p_end, 3)))
            reach = reach or (step + 1 if acc >= 0.8 else None)
            if acc >= 0.95:
                break
    print(json.dumps({**vars(args), "acc0": acc0, "reach_0.8": reach, "collapsed": collapsed, "max_move": max(moves),
                      "first_cut90": next((i + 1 for i, c in enumerate(cuts) if c >= 0.9), None),
                      "max_cut": max(cuts, default=None), "cuts": cuts,
                      "moves": moves, "history": hist, "s": round(time.time() - t0)}))


if __name__ == "__main__":
    main()
