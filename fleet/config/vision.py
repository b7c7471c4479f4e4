"""The computer-use path's cross-section rules, checked when the config loads: before any model or processor.

The path is selected by the `computer_use` dataset (training or validation). It needs a Qwen2-VL-family model
folder (read from its `config.json`, nothing loaded), a processor folder with an image processor, and the vLLM
engine (the transformers engine has no image inputs). Hub ids cannot be checked offline and are let through: their
processor load names them if they are text-only.
"""

from __future__ import annotations

import json
from pathlib import Path

from fleet.config.env import DataConfig
from fleet.config.policy import PolicyConfig

COMPUTER_USE = "computer_use"
VLM_MODEL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl"})
TINY_VLM, TINY_TEXT = "tiny-qwen2-vl", "tiny-qwen2"


def uses_computer_use(data: DataConfig) -> bool:
    val = data.validation
    return data.train.dataset_name == COMPUTER_USE or (val is not None and val.dataset_name == COMPUTER_USE)


def _model_type(name: str) -> str | None:
    """The model type of a folder's config.json; None where it cannot be known offline (a hub id, not made yet)."""
    if name == TINY_TEXT:
        return "qwen2"
    if name == TINY_VLM:
        return "qwen2_vl"
    cfg = Path(name) / "config.json"
    if not cfg.is_file():
        return None
    data = json.loads(cfg.read_text())
    return str(data.get("model_type")) if "vision_config" in data else f"{data.get('model_type')} (text only)"


def check_computer_use(p: PolicyConfig, data: DataConfig) -> None:
    """The rules above, for the `policy` section of a run whose `data` section selects the path."""
    if not uses_computer_use(data):
        return
    kind = _model_type(p.model_name)
    if kind is not None and kind not in VLM_MODEL_TYPES:
        raise ValueError(f"policy.model_name={p.model_name!r} is a text-only model ({kind}), but "
                         f"data.train.dataset_name={COMPUTER_USE} needs a vision-language model (Qwen2-VL / "
                         f"Qwen2.5-VL); set policy.model_name={TINY_VLM} or a Qwen2-VL folder")
    tok = p.tokenizer.name
    if tok is not None and Path(tok).is_dir() and not (Path(tok) / "preprocessor_config.json").is_file():
        raise ValueError(f"policy.tokenizer.name={tok!r} has no preprocessor_config.json: the computer-use path "
                         "loads the model's multimodal processor (AutoProcessor) from it; unset it to use the "
                         "model folder's")
    if p.generation.backend != "vllm":
        raise ValueError(f"policy.generation.backend={p.generation.backend} cannot serve images; the computer-use "
                         "path (data.train.dataset_name=computer_use) needs policy.generation.backend=vllm")
