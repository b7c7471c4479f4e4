"""Screenshots as model inputs, the same way on the rollout and the trainer side (the computer-use path).

A trajectory carries each screenshot as its PNG bytes and the span of its placeholder run (`<|image_pad|>` x N) in
the token sequence. Both sides turn the bytes into pixel values with one function, `ImageCodec.pixel_inputs` (PIL
decode, RGB, the model's own image processor), so the trainer's forward sees exactly the pixels the engine saw;
`tests/unit/workshop/test_vision.py` holds that. N follows from the image size and the processor's patch/merge sizes
(`num_tokens`): 224x224 with Qwen2-VL's 14 px patches merged 2x2 is 64.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def decode_png(png: bytes) -> Any:
    """A PIL RGB image from PNG bytes (errors name the cause: a trajectory's image is not a PNG)."""
    from PIL import Image

    if not png.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError(f"image of {len(png)} bytes is not a PNG")
    with Image.open(io.BytesIO(png)) as im:
        return im.convert("RGB")


def placeholder_runs(ids: Sequence[int], token_id: int) -> list[tuple[int, int]]:
    """(start, length) of every maximal run of `token_id` in `ids`."""
    runs: list[tuple[int, int]] = []
    start = -1
    for i, t in enumerate(ids):
        if t == token_id and start < 0:
            start = i
        elif t != token_id and start >= 0:
            runs.append((start, i - start))
            start = -1
    if start >= 0:
        runs.append((start, len(ids) - start))
    return runs


def collapse_placeholders(ids: Sequence[int], token_id: int) -> list[int]:
    """`ids` with each run of `token_id` cut to one token: vLLM's prompt form (it expands each placeholder itself
    from the image, to the same N tokens; handed an expanded run it would expand its first token again)."""
    return [t for i, t in enumerate(ids) if t != token_id or i == 0 or ids[i - 1] != token_id]


@dataclass(frozen=True)
class PixelInputs:
    pixel_values: Any  # torch.Tensor [patches, C * temporal * patch * patch]
    image_grid_thw: Any  # torch.Tensor [images, 3] long


class ImageCodec:
    """A multimodal processor's image side: placeholder token, tokens per image, pixel values from PNG bytes."""

    def __init__(self, processor: Any) -> None:
        ip = getattr(processor, "image_processor", None)
        token = getattr(processor, "image_token", None)
        if ip is None or token is None:
            raise ValueError(f"{type(processor).__name__} is not a multimodal processor (no image processor or image "
                             "token): the computer-use path needs a Qwen2-VL-family model folder")
        self.processor = processor
        self.image_processor = ip
        self.tokenizer = processor.tokenizer
        self.image_token_id = int(self.tokenizer.convert_tokens_to_ids(token))
        self.merge = int(getattr(ip, "merge_size", 2))

    def num_tokens(self, width: int, height: int) -> int:
        """Placeholder tokens of one image of this size (after the processor's resize to whole patches)."""
        patches = self.image_processor.get_number_of_image_patches(height, width, {})
        return int(patches) // (self.merge * self.merge)

    def pixel_inputs(self, pngs: Sequence[bytes]) -> PixelInputs:
        """The model's image inputs for these PNGs, in order (one image processor call: deterministic)."""
        images = [decode_png(p) for p in pngs]
        out = self.image_processor(images=images, return_tensors="pt")
        return PixelInputs(out["pixel_values"], out["image_grid_thw"])

    def tokens_per_image(self, grid_thw: Any) -> list[int]:
        return [int(t * h * w) // (self.merge * self.merge) for t, h, w in grid_thw.tolist()]
