"""The speedrun's single-shot prompt: one token budget and one code context for the whole pipeline.

Every stage builds the same prompt: the SFT pairs made here and on the GPU host (`fixes.py`), GRPO's fleet
(`data.train.*`, and so its validation split), the held-out diagnosis (`report.py`), and the base is pre-trained on
rows of `max_prompt_length + MAX_NEW` tokens, the positions it will be asked to read. So the setting is read once,
from the environment, by every process of a pipeline (`benchmarks/swe_speedrun.sh` passes it on):

  SPEEDRUN_MAX_PROMPT          prompt budget in tokens (default 1792)
  SPEEDRUN_CONTEXT_FUNCTIONS   most ranked functions a prompt shows (`data.*.context_functions`, default 12)

A larger budget shows more held-out fixes at all: `benchmarks/prompt_fix_shown.py` measures how many.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.swe.retrieval import TOP_K_FUNCTIONS

MAX_NEW = 256
"""Tokens an answer may take (GRPO's `--max-new-tokens`, the SFT targets' cap)."""
DEFAULT_MAX_PROMPT = 1792
_LIMITS = {"SPEEDRUN_MAX_PROMPT": (256, 32768), "SPEEDRUN_CONTEXT_FUNCTIONS": (1, 256)}


@dataclass(frozen=True)
class Prompting:
    max_prompt_length: int = DEFAULT_MAX_PROMPT
    context: str = "bm25_functions"
    functions: int = TOP_K_FUNCTIONS

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Prompting:
        values = {}
        for name, (lo, hi) in _LIMITS.items():
            raw = environ.get(name, "").strip()
            if not raw:
                continue
            try:
                value = int(raw)
            except ValueError:
                raise SystemExit(f"{name}={raw!r}: not a whole number of tokens/functions") from None
            if not lo <= value <= hi:
                raise SystemExit(f"{name}={value}: outside [{lo}, {hi}]")
            values[name] = value
        return cls(max_prompt_length=values.get("SPEEDRUN_MAX_PROMPT", DEFAULT_MAX_PROMPT),
                   functions=values.get("SPEEDRUN_CONTEXT_FUNCTIONS", TOP_K_FUNCTIONS))

    @classmethod
    def settings(cls, spec: str) -> list[Prompting]:
        """`BUDGET:FUNCTIONS,...` (a benchmark's list of settings; FUNCTIONS defaults to 12), checked as the
        environment's variables are."""
        out = []
        for item in spec.split(","):
            budget, _, functions = item.partition(":")
            out.append(cls.from_env({"SPEEDRUN_MAX_PROMPT": budget, "SPEEDRUN_CONTEXT_FUNCTIONS": functions}))
        return out

    @classmethod
    def from_figures(cls, figures: Mapping[str, Any]) -> Prompting:
        """The setting a results file or an SFT pair records (`figures`); one made before it was recorded carries
        none of it and was made with the defaults."""
        default = cls()
        return cls(int(figures.get("max_prompt_length", default.max_prompt_length)),
                   str(figures.get("context", default.context)),
                   int(figures.get("context_functions", default.functions)))

    @property
    def row_tokens(self) -> int:
        """A pre-training row, an SFT pair, a GRPO sequence: the prompt and its answer."""
        return self.max_prompt_length + MAX_NEW

    def build(self, task: Any, tokenizer: Any, repos_root: Path) -> Any:
        """`envs.swe.prompt.build_prompt` with this budget and context (a `PromptResult`)."""
        from envs.swe.prompt import build_prompt

        return build_prompt(task, tokenizer, self.max_prompt_length, self.context, repos_root=repos_root,
                            functions=self.functions)

    def overrides(self) -> list[str]:
        """The fleet's config keys for it (the validation split copies the training source's)."""
        return [f"data.train.context={self.context}", f"data.train.max_prompt_length={self.max_prompt_length}",
                f"data.train.context_functions={self.functions}",
                f"policy.max_total_sequence_length={self.row_tokens}"]

    def figures(self) -> dict[str, Any]:
        """What a results file records of it (an SFT pair's file and row too: `check_pairs`)."""
        return {"max_prompt_length": self.max_prompt_length, "context": self.context,
                "context_functions": self.functions}

    def check_pairs(self, rows: list[dict[str, Any]], source: Path) -> None:
        """Refuse SFT pairs made for another prompt: their prompts would not be the ones GRPO builds."""
        for row in rows:
            made = Prompting.from_figures(row)
            if made != self:
                raise SystemExit(f"{source}: its SFT pairs were made for prompts {made.figures()}, this run builds "
                                 f"{self.figures()} (SPEEDRUN_MAX_PROMPT, SPEEDRUN_CONTEXT_FUNCTIONS): make them "
                                 "again with this setting (`swe_speedrun.py fixes`)")

    def check_model(self, model_dir: Path) -> None:
        """Refuse a model with fewer positions than a prompt and its answer (it was pre-trained for a smaller
        budget, and positions it never saw are noise to it), and a speedrun's own model (`SPEEDRUN.txt`: its
        positions are its rows) made for another budget: SFT taught it prompts of that length."""
        import json

        config = json.loads((model_dir / "config.json").read_text())
        positions = int(config.get("max_position_embeddings", 0))
        if positions < self.row_tokens:
            raise SystemExit(f"{model_dir}: {positions} positions, fewer than this run's prompts and answers "
                             f"({self.max_prompt_length} + {MAX_NEW}; SPEEDRUN_MAX_PROMPT): pre-train a base with "
                             f"this budget, or run with the one it was made for ({positions - MAX_NEW})")
        if (model_dir / "SPEEDRUN.txt").is_file() and positions != self.row_tokens:
            raise SystemExit(f"{model_dir}: a speedrun model made for prompts of {positions - MAX_NEW} tokens, this "
                             f"run builds {self.max_prompt_length} (SPEEDRUN_MAX_PROMPT): set it to "
                             f"{positions - MAX_NEW}")
