"""The trainer's forward with screenshots: the same bytes give the log-probs transformers computes for the whole
sequence with its own processor output, image tokens are masked out of the loss, and packing is off for them."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from trainer_groups import group, traj

from fleet.config.policy import PolicyConfig
from fleet.contracts.groups import Trajectory
from trainer.batch import build_step_batch, plan_rank
from trainer.dist import Dist, DistEnv
from trainer.model import build_policy, forward_logprobs
from trainer.vlm import attach_image_codec
from workshop.resolve import resolve_model
from workshop.tinyvlm import load_processor
from workshop.vision import ImageCodec, placeholder_runs

OBS = -1


@pytest.fixture(scope="module")
def vlm() -> str:
    return resolve_model("tiny-qwen2-vl")


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    arr = (np.random.default_rng(seed).random((224, 224, 3)) * 255).astype("uint8")
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def _episode(codec: ImageCodec, seed: int) -> tuple[list[int], Trajectory]:
    """prompt | observation (screenshot) | generated | observation (screenshot) | generated"""
    tok = codec.tokenizer
    enc = lambda t: list(tok(t, add_special_tokens=False)["input_ids"])  # noqa: E731
    obs = enc("<|im_start|>user\n<tool_response>\n<|vision_start|>") + [codec.image_token_id] * 64 + \
        enc("<|vision_end|>\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    gen1, gen2 = enc("click 1 2"), enc("done")
    resp = obs + gen1 + obs + gen2
    versions = [OBS] * len(obs) + [3] * len(gen1) + [OBS] * len(obs) + [4] * len(gen2)
    runs = placeholder_runs(resp, codec.image_token_id)
    pngs = [_png(seed), _png(seed + 1)]
    episode = traj(resp, [0.0 if v == OBS else -1.0 for v in versions], versions, float(seed % 2), "submitted",
                   observation_spans=[(0, len(obs)), (len(obs) + len(gen1), len(obs))],
                   images=[(p, s, n) for p, (s, n) in zip(pngs, runs, strict=True)])
    return enc("<|im_start|>user\nclick the button<|im_end|>\n<|im_start|>assistant\n"), episode


def test_vlm_logprobs_match_transformers_and_image_tokens_are_masked(vlm: str) -> None:
    codec = ImageCodec(load_processor(vlm))
    prompt, t0 = _episode(codec, 0)
    _, t1 = _episode(codec, 5)
    batch = build_step_batch([group("g", prompt, [t0, t1], min_version=3)], 4, leave_one_out=False,
                             normalize=False, max_len=1024)
    [[mb]] = plan_rank(batch, global_batch=2, micro_batch=2, rank=0, world=1, row_tokens=1024, packing=True)
    assert mb.packed.input_ids.shape[0] == 2, "one sample per row when images are in the micro-batch"
    assert len(mb.packed.images) == 4
    image_slots = torch.tensor(t0.response_token_ids) == codec.image_token_id
    assert mb.mask[0, : len(t0.response_token_ids)][image_slots].eq(0).all(), "image tokens are never trained"
    assert mb.mask[0].sum() == sum(v != OBS for v in t0.token_versions), "only generated tokens are trained"

    dist = Dist(DistEnv(0, 1, 0), torch.device("cpu"), timeout_s=60)
    policy = build_policy(PolicyConfig(model_name=vlm), vlm, dist)
    attach_image_codec([policy], vlm, vlm)
    with torch.no_grad():
        ours = forward_logprobs(policy, mb.packed, torch.device("cpu"))[0, : len(t0.response_token_ids)]
        # transformers' own path: its processor's pixel values, its M-RoPE, full logits
        ids = torch.tensor([prompt + t0.response_token_ids])
        px = codec.image_processor(images=[Image.open(io.BytesIO(im.png)) for im in t0.images], return_tensors="pt")
        logits = policy.lm(input_ids=ids, pixel_values=px["pixel_values"], image_grid_thw=px["image_grid_thw"],
                           mm_token_type_ids=(ids == codec.image_token_id).int()).logits
        ref = logits[0, len(prompt) - 1 : -1].log_softmax(-1).gather(1, ids[0, len(prompt):, None])[:, 0]
    trained = mb.mask[0, : len(t0.response_token_ids)] > 0
    assert torch.allclose(ours[trained], ref[trained], atol=1e-5)
    dist.close()


def test_a_cut_never_splits_an_image_run(vlm: str) -> None:
    codec = ImageCodec(load_processor(vlm))
    prompt, t = _episode(codec, 0)
    second = t.images[1].start
    batch = build_step_batch([group("g", prompt, [t], min_version=3)], 4, leave_one_out=False, normalize=False,
                             max_len=len(prompt) + second + 10)
    s = batch.samples[0]
    assert len(s.response_ids) == second and len(s.images) == 1


def test_pushed_weights_carry_the_checkpoint_names_the_engine_serves(vlm: str) -> None:
    from rollout.engine.base import checkpoint_weight_spec, validate_weights
    from trainer.model import iter_full_state

    dist = Dist(DistEnv(0, 1, 0), torch.device("cpu"), timeout_s=60)
    policy = build_policy(PolicyConfig(model_name=vlm), vlm, dist)
    spec, aliases = checkpoint_weight_spec(vlm, "float32")
    pushed = dict(iter_full_state(policy))
    assert any(n.startswith("visual.") for n in pushed), "the vision tower is pushed too: the whole model as served"
    assert len(validate_weights(spec, pushed, aliases)) == len(spec)
    dist.close()
