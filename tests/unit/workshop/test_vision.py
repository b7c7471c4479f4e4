"""The tiny VLM, its processor without torchvision, and screenshots -> pixel values the same way on both sides."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from workshop.tinymodel import ensure_tiny_model
from workshop.tinyvlm import MAX_PIXELS, ensure_tiny_vlm, is_vision_model, load_processor
from workshop.vision import ImageCodec, collapse_placeholders, decode_png, placeholder_runs


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("m")
    return ensure_tiny_vlm(root / "tiny-qwen2-vl", tokenizer_from=ensure_tiny_model(root / "tiny-qwen2"))


def _png(seed: int, size: tuple[int, int] = (224, 224)) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray((rng.random((size[1], size[0], 3)) * 255).astype("uint8")).save(buf, format="PNG")
    return buf.getvalue()


def test_tiny_vlm_loads_with_auto_processor_and_a_224_screenshot_is_64_tokens(vlm: Path) -> None:
    proc = load_processor(vlm)
    codec = ImageCodec(proc)
    assert is_vision_model(vlm)
    assert codec.num_tokens(224, 224) == 64
    assert proc.image_processor.size["longest_edge"] == MAX_PIXELS
    text = proc.apply_chat_template([{"role": "user", "content": "hi"},
                                     {"role": "tool", "content": [{"type": "image"}]}],
                                    add_generation_prompt=True, tokenize=False)
    enc = proc(text=[text], images=[decode_png(_png(0))], return_tensors="pt")
    assert int((enc["input_ids"] == codec.image_token_id).sum()) == 64
    assert enc["image_grid_thw"].tolist() == [[1, 16, 16]]


def test_same_png_bytes_give_identical_pixel_values(vlm: Path) -> None:
    # The rollout side and the trainer side each load the processor and decode the trajectory's bytes.
    a, b = ImageCodec(load_processor(vlm)), ImageCodec(load_processor(vlm))
    pngs = [_png(1), _png(2, (280, 168))]
    pa, pb = a.pixel_inputs(pngs), b.pixel_inputs(pngs)
    assert torch.equal(pa.pixel_values, pb.pixel_values)
    assert pa.image_grid_thw.tolist() == [[1, 16, 16], [1, 12, 20]]
    assert a.tokens_per_image(pa.image_grid_thw) == [64, 60]
    assert a.num_tokens(280, 168) == 60


def test_a_text_only_model_folder_is_not_a_vision_model(vlm: Path, tmp_path: Path) -> None:
    text_only = ensure_tiny_model(vlm.parent / "tiny-qwen2")
    assert not is_vision_model(text_only)
    with pytest.raises(ValueError, match="not a multimodal processor"):
        from fleet.tokenizer import load_tokenizer

        ImageCodec(load_tokenizer(text_only))


def test_placeholder_runs_and_collapse() -> None:
    ids = [5, 9, 9, 9, 6, 9, 9, 7]
    assert placeholder_runs(ids, 9) == [(1, 3), (5, 2)]
    assert collapse_placeholders(ids, 9) == [5, 9, 6, 9, 7]
    assert placeholder_runs([9, 9], 9) == [(0, 2)]


def test_decode_png_refuses_other_bytes() -> None:
    with pytest.raises(ValueError, match="not a PNG"):
        decode_png(b"GIF89a....")
