"""The trainer's forward over a computer-use micro-batch: screenshots in, the decoder's hidden states out.

A row's screenshots come as the PNG bytes the engine was given (the trajectory carries them); `ImageCodec` turns
them into pixel values with the same processor the rollout side used (workshop/vision.py), so pi_theta and pi_old see
the pixels pi_gen saw and the IS correction covers the tokens generated after an image too. Positions are Qwen2-VL's
M-RoPE (temporal, height, width per token), computed by the model from the image grid and the placeholder tokens:
rows hold one sample each (sequence packing is off for micro-batches with images: the model's position rule sees a
row as one sequence). Image tokens are observation tokens: the loss masks them out (trainer/batch.py).
"""

from __future__ import annotations

from typing import Any

import torch

from workshop.vision import ImageCodec


def vision_hidden(lm: Any, codec: ImageCodec | None, input_ids: torch.Tensor,
                  images: tuple[bytes, ...]) -> torch.Tensor:
    """Last hidden states [R, L, H] of a Qwen2-VL-family `lm` over `input_ids` with `images` in placeholder order."""
    if codec is None:
        raise ValueError("a micro-batch with images reached a policy without an image processor "
                         "(policy.model_name is not a vision-language model)")
    px = codec.pixel_inputs(images)
    placeholders = input_ids == codec.image_token_id
    expected = sum(codec.tokens_per_image(px.image_grid_thw))
    if int(placeholders.sum()) != expected:
        raise ValueError(f"{int(placeholders.sum())} image placeholder tokens for {len(images)} images of "
                         f"{expected} tokens: the trajectory's images do not match its tokens")
    vision_dtype = next(lm.model.visual.parameters()).dtype
    out = lm.model(input_ids=input_ids, pixel_values=px.pixel_values.to(input_ids.device, vision_dtype),
                   image_grid_thw=px.image_grid_thw.to(input_ids.device), mm_token_type_ids=placeholders.int(),
                   use_cache=False)
    return out.last_hidden_state


def attach_image_codec(modules: list[Any], model_path: str, processor_path: str) -> None:
    """Give the policy (and reference) modules of a vision-language `model_path` the processor's image side, loaded
    from `processor_path` (`policy.tokenizer.name` or the model folder: the rollout workers load the same one)."""
    from workshop.tinyvlm import is_vision_model, load_processor

    if not is_vision_model(model_path):
        return
    codec = ImageCodec(load_processor(processor_path))
    for m in modules:
        if m is not None:
            m.image_codec = codec


def checkpoint_names(lm: Any) -> dict[str, str]:
    """Module name -> checkpoint name of a vision-language `lm` (empty for other models): transformers 5 nests a
    Qwen2-VL's decoder under `model.language_model.` and its vision tower under `model.visual.`, and saves them
    as `model.` and `visual.`, the names the rollout engine serves. Derived with transformers' own reverse rename
    (what `save_pretrained` applies), over placeholders, so no tensor is touched."""
    if getattr(lm.config, "vision_config", None) is None:
        return {}
    from transformers.core_model_loading import revert_weight_conversion

    marks = {k: torch.empty(0) for k in lm.state_dict()}
    back = {id(v): k for k, v in marks.items()}
    return {back[id(v)]: k for k, v in revert_weight_conversion(lm, marks).items() if id(v) in back}
