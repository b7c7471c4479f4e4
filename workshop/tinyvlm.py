"""A local vision-language model for the computer-use path: nothing here downloads anything.

`ensure_tiny_vlm` makes `tiny-qwen2-vl`: a randomly initialised `Qwen2VLForConditionalGeneration` (the tiny-qwen2
text shape, a 2-block vision tower) with the tiny-qwen2 tokenizer plus Qwen2-VL's vision special tokens, a chat
template that renders images and tools the way Qwen2-VL / Qwen2.5 do, and a preprocessor config whose pixel bounds
make a 224x224 screenshot exactly 64 image tokens (16x16 patches of 14 px, merged 2x2). The folder loads with
`AutoProcessor` in transformers and serves in vLLM. Built atomically like tiny-qwen2.

The image processor is the PIL/numpy one (`Qwen2VLImageProcessorPil`): torchvision is not installed beside the CPU
torch (docs/computer-use.md, "policy"), and `processor_config.json` names that class so `AutoProcessor` never reaches
for the torchvision backend. Real Qwen2-VL / Qwen2.5-VL folders load through `load_processor` the same way.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from workshop.tinymodel import ENDOFTEXT, IM_END, TINY_VOCAB_SIZE, _build_atomically, _save_tokenizer, _token_id

logger = logging.getLogger(__name__)

VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"
VISION_TOKENS = [VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]
PATCH, MERGE = 14, 2
# 224x224 -> 16x16 patches -> 8x8 merged = 64 tokens; a smaller page is scaled up to at least 56x56 (4 tokens).
MIN_PIXELS, MAX_PIXELS = 56 * 56, 224 * 224

# Qwen2-VL's rendering of image parts and Qwen2.5's tool block and tool-response turns, in one template.
VLM_CHAT_TEMPLATE = (
    "{% macro render(content) %}"
    "{% if content is string %}{{ content }}"
    "{% else %}{% for part in content %}"
    "{% if part['type'] == 'image' or 'image' in part %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% endmacro %}"
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ render(messages[0]['content']) }}"
    "{% else %}You are a helpful assistant.{% endif %}"
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}"
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n"
    "{% elif messages[0]['role'] == 'system' %}"
    "<|im_start|>system\n{{ render(messages[0]['content']) }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ render(message['content']) }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% elif message['role'] != 'system' or not loop.first %}"
    "<|im_start|>{{ message['role'] }}\n{{ render(message['content']) }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _vlm_tokenizer(tokenizer_from: Path | None) -> Any:
    from fleet.tokenizer import load_tokenizer
    from workshop.tinymodel import _train_tokenizer

    tok = load_tokenizer(tokenizer_from) if tokenizer_from else _train_tokenizer(TINY_VOCAB_SIZE)
    tok.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tok.chat_template = VLM_CHAT_TEMPLATE
    return tok


def _save_vlm(out: Path, tok: Any, *, seed: int, hidden: int, layers: int, heads: int, kv_heads: int,
              intermediate: int, vision_dim: int, vision_depth: int, vision_heads: int) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    eos, pad = _token_id(tok, IM_END), _token_id(tok, ENDOFTEXT)
    head_dim = hidden // heads
    # M-RoPE splits the rotary half-dimension into (temporal, height, width) sections, Qwen2-VL's 1:1.5:1.5.
    t = head_dim // 2 // 4
    section = [t, (head_dim // 2 - t) // 2, head_dim // 2 - t - (head_dim // 2 - t) // 2]
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tok), "hidden_size": hidden, "intermediate_size": intermediate,
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "eos_token_id": eos, "pad_token_id": pad,
            "bos_token_id": None, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                       "mrope_section": section},
        },
        vision_config={
            "depth": vision_depth, "embed_dim": vision_dim, "hidden_size": hidden, "num_heads": vision_heads,
            "mlp_ratio": 2, "patch_size": PATCH, "spatial_merge_size": MERGE, "temporal_patch_size": 2,
        },
        image_token_id=_token_id(tok, IMAGE_PAD), video_token_id=_token_id(tok, VIDEO_PAD),
        vision_start_token_id=_token_id(tok, VISION_START), vision_end_token_id=_token_id(tok, VISION_END),
        tie_word_embeddings=True, dtype="float32",
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(config)  # float32, as the config says
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)
    model.save_pretrained(out, safe_serialization=True)


def _save_processor(out: Path, tok: Any) -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    images = Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=PATCH,
                                      merge_size=MERGE, temporal_patch_size=2)
    images.save_pretrained(out)  # preprocessor_config.json: what AutoProcessor and vLLM read
    (out / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2VLProcessor"}, indent=2) + "\n")
    _save_tokenizer(tok, out)  # the generic fast class, as tiny-qwen2; chat_template.jinja beside it


def ensure_tiny_vlm(path: Path, *, seed: int = 0, tokenizer_from: Path | None = None) -> Path:
    """Make the tiny Qwen2-VL model + processor at `path` unless it exists; return `path`.

    Text: tiny-qwen2's shape (hidden 256, 4 layers, 4 heads, 2 KV heads, MLP 768, tied embeddings); vision: 2 blocks,
    width 64, 2 heads; ~4M parameters, float32. `tokenizer_from` reuses a tiny-qwen2 folder's tokenizer (saves the
    ~3 s BPE training); the vision tokens are added after its 2048 ids either way.
    """

    def build(out: Path) -> None:
        tok = _vlm_tokenizer(tokenizer_from)
        _save_processor(out, tok)
        _save_vlm(out, tok, seed=seed, hidden=256, layers=4, heads=4, kv_heads=2, intermediate=768,
                  vision_dim=64, vision_depth=2, vision_heads=2)

    return _build_atomically(path, build)


def is_vision_model(path: str | Path) -> bool:
    """Whether a model folder is a Qwen2-VL-family vision-language model (read from config.json, no model load)."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return False
    data = json.loads(cfg.read_text())
    return "vision_config" in data and data.get("model_type") in VLM_MODEL_TYPES


VLM_MODEL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl"})


def load_processor(path: str | Path) -> Any:
    """The multimodal processor of a Qwen2-VL / Qwen2.5-VL folder (the tiny one or a real one), with the PIL image
    backend so no torchvision is needed; the same call on the trainer and the rollout side."""
    from transformers import AutoProcessor

    from workshop import vlm_compat

    vlm_compat.install()
    return AutoProcessor.from_pretrained(str(path))


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.INFO)
    t0 = time.perf_counter()
    print(ensure_tiny_vlm(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-qwen2-vl")),
          f"{time.perf_counter() - t0:.1f}s")
