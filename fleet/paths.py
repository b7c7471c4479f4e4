"""Where locally made artefacts live, and the names of the tiny models. One place, used by every process; turning a
name into a model (and making it on first use) is `workshop.resolve.resolve_model`."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL_NAME = "tiny-qwen2"
TINY_VLM_NAME = "tiny-qwen2-vl"


def cache_dir() -> Path:
    """Models and task sets made on this machine: $GRPO_FLEET_CACHE, else `.cache/` in the checkout."""
    return Path(os.environ.get("GRPO_FLEET_CACHE", ROOT / ".cache"))


def tiny_model_dir() -> Path:
    return cache_dir() / "models" / TINY_MODEL_NAME


def run_dir(configured: str) -> Path:
    """The run directory; relative paths are relative to the current directory."""
    return Path(configured).resolve()
