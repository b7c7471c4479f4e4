"""The training step is the gradient of ONE big batch, however it is cut: micro-batches, packing, data-parallel ranks.

Tolerances: everything runs in float32 and summation order differs between layouts, so gradients agree to ~1e-6
relative (measured: <= 1.1e-6 of each tensor's largest entry). AdamW's first update is lr * g / (|g| + eps): with the
default eps = 1e-8 it is ~lr * sign(g), which turns float noise on coordinates whose gradient is ~0 into differences
of a few % of lr. These tests therefore use eps = 1e-3 (the update stays linear in g for the gradients here), so the
parameters after the update must agree to 2.5e-7 absolute: two float32 ulps of the RMSNorm weights (~1.0, spacing
1.2e-7), 4e-4 of lr = 1e-3. The grad norm and the loss metrics must agree to 1e-5 relative.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

import pytest
import torch
from trainer_groups import group, traj

from fleet.config import MasterConfig
from fleet.contracts.groups import ScoredGroup
from trainer.batch import StepBatch, build_step_batch
from trainer.dist import Dist, DistEnv
from trainer.model import build_policy, iter_full_state
from trainer.step import StepRunner, make_optimizer

PARAM_ATOL = 2.5e-7


def synthetic_groups(seed: int, n_groups: int = 4, g: int = 4, vocab: int = 2048,
                     version: int = 0) -> list[ScoredGroup]:
    """Random prompts/responses of varied lengths, binary rewards, recorded logprobs near the model's."""
    rng = random.Random(seed)
    groups = []
    for i in range(n_groups):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(5, 40))]
        trajs = []
        for _ in range(g):
            n = rng.randint(1, 30)
            trajs.append(traj([rng.randrange(3, vocab) for _ in range(n)],
                              [-7.6 + rng.uniform(-0.3, 0.3) for _ in range(n)], [version] * n,
                              float(rng.random() < 0.5), "stop"))
        groups.append(group(f"0:{i}", prompt, trajs, version, 0))
    return groups


def make_batch(cfg: MasterConfig, seed: int = 0) -> StepBatch:
    groups = synthetic_groups(seed, cfg.grpo.num_prompts_per_step, cfg.grpo.num_generations_per_prompt)
    return build_step_batch(groups, 0, leave_one_out=True, normalize=True,
                            max_len=cfg.policy.max_total_sequence_length)


def train_once(cfg: MasterConfig, dist: Dist, batch: StepBatch) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    policy = build_policy(cfg.policy, cfg.policy.model_name, dist)
    opt, sched = make_optimizer(policy, cfg.policy.optimizer)
    runner = StepRunner(cfg.policy, cfg.grpo, cfg.loss_fn, dist, policy, None, opt, sched)
    metrics = runner.run(batch)
    params = {n: t.detach().clone() for n, t in iter_full_state(policy)}
    return params, metrics


def single() -> Dist:
    return Dist(DistEnv(0, 1, 0), torch.device("cpu"), timeout_s=60)


def assert_same_update(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= PARAM_ATOL, f"parameters differ by {worst}"


IS = ("policy.optimizer.eps=1.0e-3", "loss_fn.use_importance_sampling_correction=true",
      "loss_fn.truncated_importance_sampling_type=tis",
      "loss_fn.truncated_importance_sampling_ratio=2.0")


def test_micro_batching_and_packing_equal_one_big_batch(make_cfg) -> None:  # type: ignore[no-untyped-def]
    big = make_cfg("policy.train_micro_batch_size=16", "policy.sequence_packing=false", *IS)
    batch = make_batch(big)
    ref, ref_m = train_once(big, single(), batch)
    for variant in (("policy.train_micro_batch_size=2",), ("policy.train_micro_batch_size=4",
                                                           "policy.sequence_packing=true")):
        cfg = make_cfg(*variant, *IS)
        got, m = train_once(cfg, single(), batch)
        assert_same_update(ref, got)
        assert m["loss/loss"] == pytest.approx(ref_m["loss/loss"], rel=1e-5, abs=1e-7)
        assert m["loss/is_ratio_max"] == pytest.approx(ref_m["loss/is_ratio_max"], rel=1e-5)
        assert m["train/grad_norm"] == pytest.approx(ref_m["train/grad_norm"], rel=1e-5)


def test_several_optimizer_minibatches_per_step(make_cfg) -> None:  # type: ignore[no-untyped-def]
    cfg = make_cfg("policy.train_global_batch_size=8", "policy.train_micro_batch_size=4")
    params, m = train_once(cfg, single(), make_batch(cfg))
    assert m["train/optimizer_updates"] == 2.0
    assert m["train/old_logprobs_from_forward"] == 0.0  # the second update needs pi_old from before the first
    assert all(torch.isfinite(p).all() for p in params.values())


def test_one_update_per_step_takes_old_logprobs_from_the_training_forward(make_cfg) -> None:  # type: ignore[no-untyped-def]
    # The same update as a separate no-grad recomputation of pi_old, with the recompute pass skipped.
    cfg = make_cfg("policy.train_micro_batch_size=4", *IS)
    batch = make_batch(cfg)
    reused, m = train_once(cfg, single(), batch)
    assert m["train/old_logprobs_from_forward"] == 1.0 and m["train/optimizer_updates"] == 1.0
    policy = build_policy(cfg.policy, cfg.policy.model_name, single())
    opt, sched = make_optimizer(policy, cfg.policy.optimizer)
    runner = StepRunner(cfg.policy, cfg.grpo, cfg.loss_fn, single(), policy, None, opt, sched)
    plan = runner.plan(batch)
    runner.recompute(plan)
    ref_m = runner._update(plan[0])
    assert_same_update({n: t.detach().clone() for n, t in iter_full_state(policy)}, reused)
    assert m["loss/is_ratio_max"] == pytest.approx(ref_m["loss/is_ratio_max"], rel=1e-5)
    assert m["loss/loss"] == pytest.approx(ref_m["loss/loss"], rel=1e-5, abs=1e-7)


def test_old_logprobs_equal_plain_hf_forward(make_cfg) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    cfg = make_cfg("policy.train_micro_batch_size=4")
    batch = make_batch(cfg, seed=3)
    dist = single()
    policy = build_policy(cfg.policy, cfg.policy.model_name, dist)
    opt, sched = make_optimizer(policy, cfg.policy.optimizer)
    runner = StepRunner(cfg.policy, cfg.grpo, cfg.loss_fn, dist, policy, None, opt, sched)
    plan = runner.plan(batch)
    runner.recompute(plan)
    hf = AutoModelForCausalLM.from_pretrained(cfg.policy.model_name, dtype=torch.float32).eval()
    order = sorted(range(len(batch.samples)), key=lambda i: (-batch.samples[i].length, i))  # plan_rank's order
    mbs = [mb for mini in plan for mb in mini]
    checked = 0
    for k, mb in enumerate(mbs):
        for j, idx in enumerate(order[k * 4 : (k + 1) * 4]):
            s = batch.samples[idx]
            with torch.no_grad():
                logits = hf(torch.tensor([s.prompt_ids + s.response_ids])).logits[0].float()
            ref = logits.log_softmax(-1)[len(s.prompt_ids) - 1 : -1].gather(1, torch.tensor(s.response_ids)[:, None])
            assert mb.old_logprobs is not None
            got = mb.old_logprobs[j, : len(s.response_ids)]
            torch.testing.assert_close(got, ref[:, 0], atol=2e-5, rtol=1e-5)
            checked += 1
    assert checked == len(batch.samples)


# -- two processes (gloo, FSDP2) vs one ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, world: int, port: int, cfg_json: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    cfg = MasterConfig.model_validate_json(cfg_json)
    dist = Dist(DistEnv(rank, world, rank), torch.device("cpu"), timeout_s=120)
    try:
        params, metrics = train_once(cfg, dist, make_batch(cfg))
        if rank == 0:
            torch.save({"params": params, "metrics": metrics}, out)
    finally:
        dist.close()


@pytest.mark.slow
def test_two_gloo_processes_give_the_same_update_as_one(make_cfg, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import torch.multiprocessing as mp

    cfg = make_cfg("policy.train_micro_batch_size=2", *IS)
    ref, ref_m = train_once(cfg, single(), make_batch(cfg))
    out = tmp_path / "rank0.pt"
    mp.spawn(_rank_main, args=(2, _free_port(), cfg.model_dump_json(), str(out)), nprocs=2, join=True)
    got = torch.load(out)
    assert_same_update(ref, got["params"])
    for k in ("loss/loss", "loss/pg_loss", "loss/token_mult_prob_error", "loss/sampling_importance_ratio",
              "train/grad_norm"):
        assert got["metrics"][k] == pytest.approx(ref_m[k], rel=1e-5, abs=1e-7), k
    assert got["metrics"]["perf/train_tokens"] == ref_m["perf/train_tokens"]


@pytest.mark.parametrize("max_norm", [0.05, 1e6, None])
def test_fused_clip_step_equals_clip_then_step(max_norm: float | None) -> None:
    """The device-side clip + skip of a fused AdamW (one GPU) is clip_grad_norm_ followed by step()."""
    from trainer.step import fused_clip_step

    torch.manual_seed(0)
    ref = [torch.randn(7, 5, requires_grad=True), torch.randn(3, requires_grad=True)]
    got = [p.detach().clone().requires_grad_() for p in ref]
    opt_ref = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1)
    opt_got = torch.optim.AdamW(got, lr=1e-2, weight_decay=0.1, fused=True)
    for _ in range(3):
        grads = [torch.randn_like(p) for p in ref]
        for p, q, g in zip(ref, got, grads, strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        n_ref = torch.nn.utils.clip_grad_norm_(ref, max_norm if max_norm is not None else float("inf"))
        opt_ref.step()
        n_got = fused_clip_step(opt_got, got, max_norm)
        assert float(n_got) == pytest.approx(float(n_ref), rel=1e-6)
        for p, q in zip(ref, got, strict=True):
            torch.testing.assert_close(q, p, atol=1e-6, rtol=1e-6)
    assert not hasattr(opt_got, "grad_scale") and not hasattr(opt_got, "found_inf")
    # A non-finite gradient norm changes nothing, not even the step count.
    before = [q.detach().clone() for q in got]
    steps = [opt_got.state[q]["step"].item() for q in got]
    got[0].grad = torch.full_like(got[0], float("nan"))
    got[1].grad = torch.ones_like(got[1])
    assert not torch.isfinite(fused_clip_step(opt_got, got, max_norm))
    assert all(torch.equal(q, b) for q, b in zip(got, before, strict=True))
    assert [opt_got.state[q]["step"].item() for q in got] == steps


def test_step_with_a_fused_optimizer_equals_the_plain_one(make_cfg) -> None:  # type: ignore[no-untyped-def]
    """StepRunner's one-process fused path (no host sync before the update; CUDA uses it) vs the plain path."""
    cfg = make_cfg("policy.train_micro_batch_size=4", "policy.max_grad_norm=0.01", *IS)
    batch = make_batch(cfg)
    ref, ref_m = train_once(cfg, single(), batch)
    dist = single()
    policy = build_policy(cfg.policy, cfg.policy.model_name, dist)
    plain, plain_sched = make_optimizer(policy, cfg.policy.optimizer)
    d = plain.defaults
    opt = torch.optim.AdamW(policy.parameters(), lr=d["lr"], betas=d["betas"], eps=d["eps"],
                            weight_decay=d["weight_decay"], fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, plain_sched.lr_lambdas[0])
    m = StepRunner(cfg.policy, cfg.grpo, cfg.loss_fn, dist, policy, None, opt, sched).run(batch)
    assert_same_update(ref, {n: t.detach().clone() for n, t in iter_full_state(policy)})
    assert m["train/grad_norm"] == pytest.approx(ref_m["train/grad_norm"], rel=1e-5)
    assert m["loss/loss"] == pytest.approx(ref_m["loss/loss"], rel=1e-5, abs=1e-7)
