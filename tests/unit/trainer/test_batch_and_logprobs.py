"""Batch construction, the split across ranks and micro-batches, packing, and the fused chunked log-prob."""

from __future__ import annotations

import pytest
import torch
from trainer_groups import group, traj

from fleet.contracts.groups import ScoredGroup
from trainer.batch import build_step_batch, plan_rank
from trainer.grpo import compute_advantages
from trainer.logprobs import linear_logprobs, pack, unpack


def _group(gid: str, rewards: list[float], lengths: list[int], version: int = 0, prompt: int = 5) -> ScoredGroup:
    trajs = [traj(list(range(3, 3 + n)), [-1.0] * n, [version] * n, r) for r, n in zip(rewards, lengths,
                                                                                         strict=True)]
    return group(gid, list(range(10, 10 + prompt)), trajs, version)


def test_advantages_come_from_compute_advantages_per_group() -> None:
    groups = [_group("a", [1, 0, 0, 1], [3, 4, 5, 6]), _group("b", [1, 1, 1, 1], [2, 2, 2, 2], version=2)]
    batch = build_step_batch(groups, 3, leave_one_out=True, normalize=True, max_len=64)
    want = compute_advantages(torch.tensor([[1.0, 0, 0, 1], [1, 1, 1, 1]]), leave_one_out=True, normalize=True)
    assert [s.advantage for s in batch.samples] == pytest.approx(want.flatten().tolist())
    assert batch.ages == [3, 1] and batch.stats["data/zero_std_groups_frac"] == 0.5


def test_overlong_samples_are_clipped_and_bad_logprob_counts_masked() -> None:
    g = _group("a", [1, 0], [10, 3], prompt=8)
    g.trajectories[1].generation_logprobs = [-1.0]  # 1 logprob for 3 tokens: a contract violation
    batch = build_step_batch([g], 0, leave_one_out=True, normalize=True, max_len=12)
    assert [len(s.response_ids) for s in batch.samples] == [4, 3]
    assert [s.valid for s in batch.samples] == [True, False]
    [[mb]] = plan_rank(batch, global_batch=2, micro_batch=2, rank=0, world=1, row_tokens=16, packing=True)
    assert mb.mask.sum().item() == 4  # the invalid sample trains nothing


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_sample_lands_on_exactly_one_rank_with_equal_micro_batch_counts(world: int) -> None:
    groups = [_group(str(i), [i % 2, 1, 0, 0.5], [1 + (7 * i + j) % 13 for j in range(4)]) for i in range(6)]
    for k, t in enumerate(t for g in groups for t in g.trajectories):
        t.response_token_ids[0] = 1000 + k  # a marker token per sample (no other token is >= 1000)
    batch = build_step_batch(groups, 0, leave_one_out=True, normalize=True, max_len=64)
    plans = [plan_rank(batch, global_batch=12, micro_batch=2, rank=r, world=world, row_tokens=64, packing=True)
             for r in range(world)]
    assert len({len(p) for p in plans}) == 1 and len(plans[0]) == 2  # 24 samples / 12 = 2 optimizer updates
    for minibatch in range(2):
        assert len({len(p[minibatch]) for p in plans}) == 1  # same number of micro-batches on every rank
    markers = [int(t) for p in plans for mini in p for mb in mini if not mb.dummy
               for t in mb.packed.targets.tolist() if t >= 1000]
    assert sorted(markers) == list(range(1000, 1024))
    counts = [sum(mb.packed.num_samples for mb in p[0] if not mb.dummy) for p in plans]
    assert max(counts) - min(counts) <= 1
    again = plan_rank(batch, global_batch=12, micro_batch=2, rank=0, world=world, row_tokens=64, packing=True)
    assert torch.equal(again[0][0].packed.input_ids, plans[0][0][0].packed.input_ids)  # deterministic


def test_packing_restarts_positions_and_continues_them_through_padding() -> None:
    # Lengths 4, 2, 4 into rows of 6, first fit decreasing: row 0 = samples 0 and 1, row 1 = sample 2 + 2 pads.
    p = pack([[1, 2], [3], [4, 5, 6]], [[7, 8], [9], [10]], row_tokens=6, packing=True)
    assert p.input_ids.tolist() == [[1, 2, 7, 8, 3, 9], [4, 5, 6, 10, 0, 0]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 4, 5]]
    assert p.gather_index.tolist() == [1, 2, 4, 8] and p.targets.tolist() == [7, 8, 9, 10]
    assert p.padded_tokens == 2


@pytest.mark.parametrize("chunk", [1, 4, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("save_bytes", [0, 8 * 50 * 4, 1 << 30], ids=["recompute", "part-saved", "saved"])
def test_fused_logprobs_match_float64_log_softmax(chunk: int, temperature: float, save_bytes: int) -> None:
    torch.manual_seed(0)
    h = torch.randn(23, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 50, (23,))
    got = linear_logprobs(h.float(), w.float(), t, temperature=temperature, chunk=chunk)
    ref = torch.log_softmax(h @ w.T / temperature, -1).gather(1, t[:, None]).squeeze(1)
    torch.testing.assert_close(got.double(), ref, atol=1e-5, rtol=1e-5)
    hf, wf = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    g = torch.randn(23, dtype=torch.float64)
    out = linear_logprobs(hf, wf, t, temperature=temperature, chunk=chunk, save_bytes=save_bytes)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    gh, gw = torch.autograd.grad(out, (hf, wf), g.float())
    rh, rw = torch.autograd.grad(ref, (h, w), g)
    torch.testing.assert_close(gh.double(), rh, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gw.double(), rw, atol=1e-5, rtol=1e-5)


def test_saved_and_recomputed_logit_gradients_agree_under_bf16_autocast() -> None:
    """The GPU path: fp32 masters, bf16 matmuls under autocast. Saving the logit gradient in the forward pass must
    give the recomputing backward's gradients up to bf16 rounding."""
    torch.manual_seed(1)
    h = torch.randn(40, 32)
    w = torch.randn(300, 32) * 0.1
    t = torch.randint(0, 300, (40,))
    g = torch.randn(40)
    grads = []
    for save_bytes in (0, 16 * 300 * 2, 1 << 30):
        hf, wf = h.clone().requires_grad_(), w.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = linear_logprobs(hf, wf, t, chunk=16, save_bytes=save_bytes)
        grads.append(torch.autograd.grad(out, (hf, wf), g))
    for gh, gw in grads[1:]:
        assert gh.dtype == torch.float32 and gw.dtype == torch.float32
        torch.testing.assert_close(gh, grads[0][0], atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(gw, grads[0][1], atol=2e-2, rtol=2e-2)


def test_no_logit_gradient_is_saved_without_grad() -> None:
    h = torch.randn(8, 4, requires_grad=True)
    w = torch.randn(10, 4, requires_grad=True)
    with torch.no_grad():
        out = linear_logprobs(h, w, torch.zeros(8, dtype=torch.long), save_bytes=1 << 30)
    assert out.grad_fn is None


def test_unpack_places_values_in_the_padded_response_layout() -> None:
    p = pack([[1], [2, 3]], [[4, 5, 6], [7]], row_tokens=8, packing=True)
    out = unpack(torch.arange(4, dtype=torch.float32) + 1, p)
    assert out.shape == (2, 3)
    assert sorted(out[out != 0].tolist()) == [1.0, 2.0, 3.0, 4.0]
