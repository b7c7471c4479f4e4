"""How config names resolve to locally made models: `tiny-qwen2` and `tiny-qwen2-vl` are made on first use, in any
process (`fleet/paths.py` says where they live)."""

from __future__ import annotations

from pathlib import Path

from fleet.paths import TINY_MODEL_NAME, TINY_VLM_NAME, cache_dir, tiny_model_dir


def resolve_model(name: str, *, create: bool = True) -> str:
    """`policy.model_name` -> a loadable path. The name `tiny-qwen2` means the locally made tiny model (made here on
    first use when `create`); anything else is returned unchanged (an HF folder or hub id)."""
    if name == TINY_VLM_NAME:
        return _resolve_tiny_vlm(create)
    if name != TINY_MODEL_NAME:
        return name
    path = tiny_model_dir()
    if create and not (path / "config.json").exists():
        from workshop.tinymodel import ensure_tiny_model

        ensure_tiny_model(path)
    return str(path)


def _resolve_tiny_vlm(create: bool) -> str:
    """`tiny-qwen2-vl`: the locally made tiny Qwen2-VL (workshop/tinyvlm.py), with tiny-qwen2's tokenizer."""
    path = cache_dir() / "models" / TINY_VLM_NAME
    if create and not (path / "config.json").exists():
        from workshop.tinyvlm import ensure_tiny_vlm

        ensure_tiny_vlm(path, tokenizer_from=Path(resolve_model(TINY_MODEL_NAME)))
    return str(path)
