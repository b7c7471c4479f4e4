"""The in-process peer of the skill demo (issue 35): TRL's `GRPOTrainer` on the fleet's own digits recipe, or
(`--task arith`) on the arith demo's.

    python benchmarks/trl_peer.py --seed 1 [--steps 200] [--work /tmp/skill-compare]
    python benchmarks/trl_peer.py --task arith --seed 1 --steps 80 --target 0.2 \
        --set grpo.val_period=10 --set grpo.val_at_start=true --set grpo.max_val_samples=200 \
        --set grpo.val_temperature=1.0          # as `skill_demo.py compare --task arith` runs it

One process, CPU, HF `generate`: the same base model (`skill_demo.py pretrain`: `tiny-qwen2-digits_max-format`), the
same questions (`envs/digits.py`, the fleet's training and validation split), the same score (`score_digit` through
`reward_from_verdict`, the function the fleet's workers call), and every number of the recipe read from
`examples/configs/digits_skill.yaml` through the fleet's config loader, so the two cannot drift apart: prompts x
generations per step, new tokens, temperature, lr, AdamW eps/betas/weight decay, gradient clip, the k3 KL's beta, the
ratio clip, per-group std normalisation, one optimizer update per batch, a constant learning rate. What the peer
does its own way is the point of the comparison: TRL's loss ("dapo": token mean over the batch, as
`loss_fn.token_level_loss`), its advantage epsilon (1e-4 against 1e-6), Bessel's std in both.

Validation is the fleet's: greedy answers to the 200 held-out lists every `grpo.val_period` steps and before the
first, scored FULL or not. Times count from the first step's start (the fleet's from its first weights push) and
include validation, as the fleet's do. The run writes RUN/logs/metrics.jsonl in the fleet's record layout
(`reward/mean`, `timing/step_s`, `val/accuracy`, `val/step`, `time`), so `skill_demo.summarize` reads both.

`--task arith` reads `examples/configs/arith_learn.yaml` instead, and the environment from its
`data.train.dataset_name` (`environment`): `envs/arith.py`'s `make_arith_tasks` with the config's `env.arith`
(operands, ops, number of tasks, answer format), `score_answer` through `reward_from_verdict` with arith's reward
settings (pass_rate: 0.5 for a number, 1 for the right one), and the fleet's base model, `tiny-qwen2` with random
weights, through the fleet's resolver (`workshop.resolve`). New tokens (64), lr (1e-3), KL (none: no reference model),
prompts x generations (8 x 8) are that config's. The fleet's TIS correction of stale samples has no counterpart: the
peer is on-policy. Validation samples when `grpo.val_temperature` > 0 (arith's comparison: see skill_demo.py).

TRL is not a dependency of the project: `ensure_trl` installs the pinned wheels (no dependencies: the project's
torch, transformers and datasets are the ones compared) into .cache/peer-site the first time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PEER_SITE = ROOT / ".cache/peer-site"
PINS = ("trl==1.16.0", "accelerate==1.15.0")
CONFIG = ROOT / "examples/configs/digits_skill.yaml"
# `--task`: the recipe whose environment, base model and numbers the peer runs (the environment is read from the
# config's data.train.dataset_name).
CONFIGS = {"digits_max": CONFIG, "arith": ROOT / "examples/configs/arith_learn.yaml"}


def ensure_trl() -> None:
    """Make TRL importable from PEER_SITE, installing the pinned wheels there first if needed."""
    marker = PEER_SITE / ".pins"
    if not (marker.is_file() and marker.read_text() == " ".join(PINS)):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target",
                        str(PEER_SITE), *PINS], check=True)
        marker.write_text(" ".join(PINS))
    sys.path.insert(0, str(PEER_SITE))


def recipe(overrides: list[str], task: str = "digits_max") -> Any:
    from fleet.config.loader import load_config

    return load_config(CONFIGS[task], overrides)


Score = Callable[[int, str, bool], Any]


def environment(cfg: Any, seed: int) -> tuple[str, list[Any], list[Any], Score]:
    """The recipe's environment as the fleet builds it for data seed `seed` (grpo.seed, as the fleet's loader gets
    it): its name (for `env.reward_settings`), the training and validation tasks (the first `grpo.max_val_samples`
    of the validation split), and the score of an answer `(expected, text, truncated) -> ScoreResult`."""
    name, g = cfg.data.train.dataset_name, cfg.grpo
    if name in ("digits", "digits_max"):
        from envs.digits import make_digits_tasks, score_digit

        kind = {"digits": "first", "digits_max": "max"}[name]
        # Training never holds a validation list.
        train = make_digits_tasks(seed, "train", 20000, kind)
        val = make_digits_tasks(seed, "validation", g.max_val_samples or 200, kind)
        return "digits", train, val, lambda expected, text, truncated: score_digit(expected, text,
                                                                                   truncated=truncated)
    if name == "arith":
        from envs.arith import make_arith_tasks, score_answer

        a = cfg.env.arith
        train = make_arith_tasks(seed, "train", a.num_tasks, a.max_operand, tuple(a.ops), a.answer_format)
        if cfg.data.train.max_samples is not None:
            train = train[:cfg.data.train.max_samples]
        # `load_arith_dataset`'s validation split (a tenth of num_tasks, at most 200), of which validation asks the
        # first grpo.max_val_samples.
        n_val = max(1, min(200, a.num_tasks // 10))
        val = make_arith_tasks(seed, "validation", n_val, a.max_operand, tuple(a.ops), a.answer_format)
        val = val[:g.max_val_samples]
        # The scorer has no use for truncation (only the answer's first number, or its tag, counts).
        return "arith", train, val, lambda expected, text, truncated: score_answer(expected, text, a.answer_format)
    raise SystemExit(f"trl_peer: no peer for data.train.dataset_name={name!r} (digits, digits_max, arith)")


def model_path(cfg: Any) -> Path:
    """The fleet's base model: a path in this checkout, or `tiny-qwen2` (random weights, made on first use by the
    fleet's own resolver, in the cache the fleet reads)."""
    from workshop.resolve import resolve_model

    return ROOT / resolve_model(cfg.policy.model_name)


def run(seed: int, steps: int, out: Path, overrides: list[str], threads: int, target: float = 0.8,
        stop_after: int = 2, bias_correction_kl: bool = False, task: str = "digits_max") -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    ensure_trl()
    import warnings

    warnings.filterwarnings("ignore", message="TRL currently supports vLLM")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from fleet.tokenizer import load_tokenizer
    from sandbox_client.reward import reward_from_verdict

    cfg = recipe([f"grpo.seed={seed}", *overrides], task)
    p, g, lf = cfg.policy, cfg.grpo, cfg.loss_fn
    env_name, train, val, score = environment(cfg, seed)
    tok = load_tokenizer(model_path(cfg))
    model = AutoModelForCausalLM.from_pretrained(model_path(cfg), dtype=torch.float32)

    def as_prompt(question: str) -> str:
        return chat_prompt(tok, question)

    dataset = Dataset.from_list([{"prompt": as_prompt(t.problem_statement), "answer": int(t.metadata["answer"])}
                                 for t in train])
    eos = tok.eos_token_id
    clock: dict[str, float] = {}

    def reward(prompts: list[str], completions: list[str], completion_ids: list[list[int]], answer: list[int],
               **_: Any) -> list[float]:
        scores = [score(a, text, eos not in ids)
                  for a, text, ids in zip(answer, completions, completion_ids, strict=True)]
        rewards = [reward_from_verdict(s.verdict, *cfg.env.reward_settings(env_name)) for s in scores]
        clock["reward"] = sum(rewards) / len(rewards)  # one call per step: the batch this step trains on
        return rewards

    (out / "logs").mkdir(parents=True, exist_ok=True)
    metrics_path = out / "logs/metrics.jsonl"
    metrics_path.unlink(missing_ok=True)

    def write(rec: dict[str, Any]) -> None:
        with metrics_path.open("a") as f:
            f.write(json.dumps(rec) + "\n")

    val_prompts = [as_prompt(t.problem_statement) for t in val]
    val_answers = [int(t.metadata["answer"]) for t in val]

    @torch.no_grad()
    def validate(m: torch.nn.Module) -> float:
        """Answers to the held-out tasks (greedy unless grpo.val_temperature > 0), scored as the fleet's validation
        scores them (FULL or not)."""
        was_training = m.training
        m.eval()
        enc = tok(val_prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        # grpo.val_temperature: 0 (the default, digits) is greedy; arith's comparison samples at 1 (skill_demo.py).
        sampling = ({"do_sample": True, "temperature": g.val_temperature, "top_k": 0, "top_p": 1.0}
                    if g.val_temperature > 0 else {"do_sample": False})
        gen = m.generate(**enc, max_new_tokens=p.generation.max_new_tokens, eos_token_id=eos,
                         pad_token_id=tok.pad_token_id, **sampling)  # type: ignore[operator]
        right = 0
        for row, expected in zip(gen[:, enc["input_ids"].shape[1]:].tolist(), val_answers, strict=True):
            text = str(tok.decode(row, skip_special_tokens=True))
            right += score(expected, text, eos not in row).verdict.resolution == "FULL"
        if was_training:
            m.train()
        return right / len(val_answers)

    class Record(TrainerCallback):
        """Step times, the training reward, and validation every val_period steps, in the fleet's layout."""

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == 0 and g.val_at_start and "val0" not in clock:
                clock["val0"] = validate(kw["model"])
                write({"step": 0, "time": time.time(), "val/step": 0, "val/accuracy": clock["val0"]})
            clock["step_start"] = time.time()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            now = time.time()
            step = state.global_step  # steps trained so far
            write({"step": step - 1, "time": now, "reward/mean": clock.get("reward", float("nan")),
                   "timing/step_s": now - clock["step_start"]})
            if g.val_period and step % g.val_period == 0:
                acc = validate(kw["model"])
                write({"step": step - 1, "time": time.time(), "val/step": step, "val/accuracy": acc})
                # As skill_demo stops a fleet: `stop_after` more validation rounds once the target is reached.
                if acc >= target and "reached" not in clock:
                    clock["reached"] = step
                if "reached" in clock and step - clock["reached"] >= stop_after * g.val_period:
                    control.should_training_stop = True

    args = GRPOConfig(
        output_dir=str(out / "trl"), seed=seed, data_seed=seed, use_cpu=True, bf16=False, report_to=[],
        save_strategy="no", logging_steps=1, max_steps=steps, disable_tqdm=True,
        per_device_train_batch_size=g.num_prompts_per_step * g.num_generations_per_prompt,
        gradient_accumulation_steps=1, num_generations=g.num_generations_per_prompt, num_iterations=1,
        max_completion_length=p.generation.max_new_tokens, temperature=p.generation.temperature, top_p=1.0,
        top_k=0, learning_rate=p.optimizer.lr, lr_scheduler_type="constant_with_warmup",
        warmup_steps=p.optimizer.warmup_steps, weight_decay=p.optimizer.weight_decay,
        adam_beta1=p.optimizer.betas[0], adam_beta2=p.optimizer.betas[1], adam_epsilon=p.optimizer.eps,
        max_grad_norm=p.max_grad_norm, beta=lf.reference_policy_kl_penalty, epsilon=lf.ratio_clip_min,
        epsilon_high=lf.ratio_clip_max, scale_rewards="group" if g.normalize_rewards else "none",
        loss_type="dapo", remove_unused_columns=False, dataloader_num_workers=0,
        use_bias_correction_kl=bias_correction_kl,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tok,
                          callbacks=[Record()])
    t_start = time.time()
    trainer.train()
    summary = {"system": "trl", "seed": seed, "steps": steps, "wall_s": time.time() - t_start,
               "versions": {"trl": _version("trl"), "accelerate": _version("accelerate"),
                            "transformers": _version("transformers"), "torch": torch.__version__},
               "threads": threads, "overrides": overrides, "use_bias_correction_kl": bias_correction_kl,
               **({"task": task} if task != "digits_max" else {})}
    (out / "peer.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def chat_prompt(tok: Any, question: str) -> str:
    """The prompt text the fleet's environments build (`build_prompt`: the user turn through the chat template)."""
    text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                   add_generation_prompt=True)
    return str(text)


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--work", default="/tmp/skill-compare")
    ap.add_argument("--name", default=None, help="run folder under --work (default trl-s<seed>)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="torch threads (default: every core, as a one-process trainer would use them)")
    ap.add_argument("--target", type=float, default=0.8)
    ap.add_argument("--after", type=int, default=2, help="validation rounds to run once --target is reached")
    ap.add_argument("--bias-correction-kl", action="store_true",
                    help="TRL's use_bias_correction_kl: the KL times the ratio, whose value is 1 with one update per "
                         "batch, so its gradient is the fleet's (loss_fn.kl_score_function_gradient): beta (logp - "
                         "logp_ref) per token instead of k3's own, beta (1 - p_ref / p)")
    ap.add_argument("--task", default="digits_max", choices=sorted(CONFIGS),
                    help="the recipe: digits_max (examples/configs/digits_skill.yaml) or arith "
                         "(examples/configs/arith_learn.yaml)")
    ap.add_argument("--set", action="append", default=[], help="a recipe override, e.g. grpo.val_period=5")
    a = ap.parse_args()
    out = Path(a.work) / (a.name or f"trl-s{a.seed}")
    print(json.dumps(run(a.seed, a.steps, out, a.set, a.threads, a.target, a.after, a.bias_correction_kl, a.task)))


if __name__ == "__main__":
    main()
