"""The in-process peer of the skill demo (issue 35): TRL's `GRPOTrainer` on the fleet's own digits recipe.

    python benchmarks/trl_peer.py --seed 1 [--steps 200] [--work /tmp/skill-compare]

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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PEER_SITE = ROOT / ".cache/peer-site"
PINS = ("trl==1.16.0", "accelerate==1.15.0")
CONFIG = ROOT / "examples/configs/digits_skill.yaml"


def ensure_trl() -> None:
    """Make TRL importable from PEER_SITE, installing the pinned wheels there first if needed."""
    marker = PEER_SITE / ".pins"
    if not (marker.is_file() and marker.read_text() == " ".join(PINS)):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target",
                        str(PEER_SITE), *PINS], check=True)
        marker.write_text(" ".join(PINS))
    sys.path.insert(0, str(PEER_SITE))


def recipe(overrides: list[str]) -> Any:
    from fleet.config.loader import load_config

    return load_config(CONFIG, overrides)


def run(seed: int, steps: int, out: Path, overrides: list[str], threads: int, target: float = 0.8,
        stop_after: int = 2, bias_correction_kl: bool = False) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    ensure_trl()
    import warnings

    warnings.filterwarnings("ignore", message="TRL currently supports vLLM")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from envs.digits import make_digits_tasks, score_digit
    from sandbox_client.reward import reward_from_verdict

    cfg = recipe([f"grpo.seed={seed}", *overrides])
    p, g, lf = cfg.policy, cfg.grpo, cfg.loss_fn
    kind = {"digits": "first", "digits_max": "max"}[cfg.data.train.dataset_name]
    model_path = ROOT / p.model_name
    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)

    def as_prompt(question: str) -> str:
        text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                       add_generation_prompt=True)
        return str(text)

    # The fleet's task sets: the data seed is grpo.seed (as the fleet's loader gets it), training never holds a
    # validation list.
    train = make_digits_tasks(seed, "train", 20000, kind)
    val = make_digits_tasks(seed, "validation", g.max_val_samples or 200, kind)
    dataset = Dataset.from_list([{"prompt": as_prompt(t.problem_statement), "answer": int(t.metadata["answer"])}
                                 for t in train])
    eos = tok.eos_token_id
    clock: dict[str, float] = {}

    def reward(prompts: list[str], completions: list[str], completion_ids: list[list[int]], answer: list[int],
               **_: Any) -> list[float]:
        scores = [score_digit(a, text, truncated=eos not in ids)
                  for a, text, ids in zip(answer, completions, completion_ids, strict=True)]
        rewards = [reward_from_verdict(s.verdict, *cfg.env.reward_settings("digits")) for s in scores]
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
        """Greedy answers to the held-out lists, scored as the fleet's validation scores them (FULL or not)."""
        was_training = m.training
        m.eval()
        enc = tok(val_prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        gen = m.generate(**enc, max_new_tokens=p.generation.max_new_tokens, do_sample=False, eos_token_id=eos,
                         pad_token_id=tok.pad_token_id)  # type: ignore[operator]
        right = 0
        for row, expected in zip(gen[:, enc["input_ids"].shape[1]:].tolist(), val_answers, strict=True):
            text = tok.decode(row, skip_special_tokens=True)
            right += score_digit(expected, text, truncated=eos not in row).verdict.resolution == "FULL"
        if was_training:
            m.train()
        return right / len(val_answers)

    class Record(TrainerCallback):  # type: ignore[misc]
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
               "threads": threads, "overrides": overrides, "use_bias_correction_kl": bias_correction_kl}
    (out / "peer.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


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
    ap.add_argument("--set", action="append", default=[], help="a digits_skill.yaml override, e.g. grpo.val_period=5")
    a = ap.parse_args()
    out = Path(a.work) / (a.name or f"trl-s{a.seed}")
    print(json.dumps(run(a.seed, a.steps, out, a.set, a.threads, a.target, a.after, a.bias_correction_kl)))


if __name__ == "__main__":
    main()
