"""Image inputs of a vision-language model in vLLM (the computer-use path).

The engine gets the prompt token-exact, each screenshot's placeholder run already expanded to its N tokens (as the
trajectory and the trainer hold it). vLLM expands a placeholder itself from the image, so the prompt it gets has
each run cut to one token: it expands it again to the same N tokens (checked against transformers in
tests/integration/rollout/test_vlm_engine.py). Handed an expanded run, it would expand its first token again.

Weight pushes of a VLM load through vLLM's `reload_weights` (load mode "reload", also on CPU): it maps a Qwen2-VL's
checkpoint names itself, and the packed/plain CPU layouts handle decoder layers only, not a vision tower. After a
load the engine resets vLLM's encoder cache (scheduler and worker): `reload_weights` clears only the worker's, so
the next request whose image the scheduler believed cached would fail ("Encoder cache miss"), and vision embeddings
of the old weights must not serve new requests anyway. Prefix blocks are salted per version as for text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workshop.vision import collapse_placeholders, decode_png, placeholder_runs


def image_token_id(model_path: str | Path) -> int:
    """The image placeholder token of a vision-language model folder (its config.json)."""
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    if "image_token_id" not in cfg:
        raise ValueError(f"{model_path} is not a vision-language model (no image_token_id in config.json)")
    return int(cfg["image_token_id"])


def image_inputs(model_path: str | Path, max_images: int,
                 engine_kwargs: dict[str, Any]) -> tuple[int | None, dict[int, float] | None]:
    """(image token, logit bias) of a VLM served with up to `max_images` images per prompt ((None, None) when 0),
    its engine arguments added to `engine_kwargs`: screenshots only, no video (its processor needs torchvision,
    workshop/vlm_compat.py). The bias bans the vision tokens from sampling: a generated `<|image_pad|>` would read as
    an image placeholder in the next turn's context (a random-weight model emits them). Log-probs stay raw (before
    any bias), so pi_gen is the model's; the banned tokens' mass is what the IS weights then miss."""
    if max_images <= 0:
        return None, None
    engine_kwargs["limit_mm_per_prompt"] = {"image": max_images, "video": 0}
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    keys = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    return image_token_id(model_path), {int(cfg[k]): -100.0 for k in keys if k in cfg}


def image_prompt(prompt: list[int], images: Sequence[bytes], token_id: int | None) -> dict[str, Any]:
    """The prompt's image part for vLLM: each placeholder run cut to one token, and the decoded screenshots."""
    if token_id is None:
        raise ValueError("images given to an engine started without image inputs (max_images_per_prompt=0)")
    runs = placeholder_runs(prompt, token_id)
    if len(runs) != len(images):
        raise ValueError(f"{len(images)} images for {len(runs)} image placeholder runs in the prompt")
    return {"prompt_token_ids": collapse_placeholders(prompt, token_id),
            "multi_modal_data": {"image": [decode_png(png) for png in images]}}
