"""Where locally made artefacts live, and how config names resolve to them. One place, used by every process."""

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


def resolve_model(name: str, *, create: bool = True) -> str:
    """`policy.model_name` -> a loadable path. The name `tiny-qwen2` means the locally made tiny model (made here on
    first use when `create`); anything else is returned unchanged (an HF folder or hub id)."""
    if name == TINY_VLM_NAME:
        return _resolve_tiny_vlm(create)
    if name != TINY_MODEL_NAME:
        return name
    path = tiny_model_dir()
    if create and not (path / "config.json").exists():
        from fleet.tinymodel import ensure_tiny_model

        ensure_tiny_model(path)
    return str(path)


def _resolve_tiny_vlm(create: bool) -> str:
    """`tiny-qwen2-vl`: the locally made tiny Qwen2-VL (fleet/tinyvlm.py), with tiny-qwen2's tokenizer."""
    path = cache_dir() / "models" / TINY_VLM_NAME
    if create and not (path / "config.json").exists():
        from fleet.tinyvlm import ensure_tiny_vlm

        ensure_tiny_vlm(path, tokenizer_from=Path(resolve_model(TINY_MODEL_NAME)))
    return str(path)


def run_dir(configured: str) -> Path:
    """The run directory; relative paths are relative to the current directory."""
    return Path(configured).resolve()
