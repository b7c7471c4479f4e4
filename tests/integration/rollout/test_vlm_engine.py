"""vLLM CPU serving the tiny Qwen2-VL with screenshots from token ids: the log-probs of what it generates are
transformers' own for the same bytes (placeholder runs as the trajectory holds them), a push of the whole VLM under
the trainer's checkpoint names changes what it serves, and it never samples a vision token."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from rollout.engine.base import SamplingSpec
from workshop.resolve import resolve_model
from workshop.tinyvlm import load_processor
from workshop.vision import ImageCodec

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray((np.random.default_rng(seed).random((224, 224, 3)) * 255).astype("uint8")).save(buf, "PNG")
    return buf.getvalue()


async def test_vllm_serves_screenshots_like_transformers_and_takes_vlm_pushes() -> None:
    from transformers import AutoModelForImageTextToText

    from rollout.engine.vllm_engine import VllmEngine

    path = resolve_model("tiny-qwen2-vl")
    codec = ImageCodec(load_processor(path))
    tok, pad = codec.tokenizer, codec.image_token_id
    enc = lambda t: list(tok(t, add_special_tokens=False)["input_ids"])  # noqa: E731
    obs = enc("<|vision_start|>") + [pad] * 64 + enc("<|vision_end|>")
    prompt = enc("<|im_start|>user\nclick it") + obs + enc("<|im_end|>\n<|im_start|>assistant\n") + obs
    pngs = [_png(0), _png(1)]
    engine = VllmEngine(path, max_model_len=1024, max_images_per_prompt=2)
    await engine.start()
    try:
        spec = SamplingSpec(max_new_tokens=12, seed=1)
        gen = await engine.generate("a", prompt, spec, images=pngs)
        assert gen.prompt_len == len(prompt) and len(gen.token_ids) == 12
        assert not set(gen.token_ids) & {pad, codec.image_token_id + 1}, "vision tokens are never sampled"

        lm = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
        px = codec.pixel_inputs(pngs)
        ids = torch.tensor([prompt + gen.token_ids])
        with torch.no_grad():
            logits = lm(input_ids=ids, pixel_values=px.pixel_values, image_grid_thw=px.image_grid_thw,
                        mm_token_type_ids=(ids == pad).int()).logits[0, len(prompt) - 1 : -1]
        ref = logits.log_softmax(-1).gather(1, torch.tensor(gen.token_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(gen.logprobs), ref, atol=1e-3), (gen.logprobs, ref.tolist())

        # The trainer's push: every tensor, checkpoint names; zeroing the vision tower must change the answer.
        from trainer.vlm import checkpoint_names

        names = checkpoint_names(lm)
        pushed = {names.get(k, k): (torch.zeros_like(v) if ".visual." in k else v)
                  for k, v in lm.state_dict().items() if k != "lm_head.weight"}
        stats = await engine.update_weights(1, pushed, in_flight=True, reset_cache=False, epoch=1)
        assert stats.version == 1
        again = await engine.generate("b", prompt, SamplingSpec(max_new_tokens=12, seed=1), images=pngs)
        assert set(again.token_versions) == {1}
        assert again.logprobs[0] != pytest.approx(gen.logprobs[0], abs=1e-4), "the vision tower was reloaded"
    finally:
        await engine.stop()
