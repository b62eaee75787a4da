"""The update step: gradient-norm clipping, the learning-rate schedule, weight decay,
several updates per rollout in mini-batches, and their resume."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from leaf_plugins.training.lora import lora_state
from leaf_plugins.training.optimization import schedule_factor
from leaf_plugins.training.step_metrics import reproducible
from leaf_plugins.training.trainer import Trainer
from test_training_resume import CrashAt
from training_cases import config, examples, host

ADAM_EPSILON = 1e-8  # torch's AdamW default


def test_the_schedules_are_the_documented_lines_and_cosine():
    linear = [schedule_factor(step, 6, "linear", 3) for step in range(1, 7)]
    # float64 quotients of small integers (and one cosine): within a few ulps of 1 (2.2e-16)
    assert linear == pytest.approx([1 / 3, 2 / 3, 1, 3 / 4, 2 / 4, 1 / 4], abs=1e-15)
    assert [schedule_factor(step, 4, "constant", 2) for step in range(1, 5)] == [0.5, 1.0, 1.0, 1.0]
    cosine = [schedule_factor(step, 5, "cosine", 0) for step in range(1, 6)]
    assert cosine == pytest.approx([(1 + math.cos(math.pi * s / 6)) / 2 for s in range(1, 6)], abs=1e-15)
    assert all(0 < factor <= 1 for factor in linear + cosine)  # no step trains at a rate of 0
    with pytest.raises(ValueError, match="lr_schedule must be one of constant, linear, cosine"):
        schedule_factor(1, 3, "step", 0)


def train(output_dir, steps: int = 1, estimator: str = "grpo", plugins=(), **optim) -> tuple[Trainer, list[dict], dict]:
    """A run of the trainer tests' settings with ``optim`` changed; its trainer, its logged
    metrics and its adapter before training."""
    settings = config(output_dir, estimator, steps=steps)
    settings.optim = dataclasses.replace(settings.optim, **optim)
    trainer = Trainer(settings, examples(), plugins=plugins, host=host())
    start = lora_state(trainer.policy)
    trainer.run()
    lines = (trainer.output_dir / "metrics.jsonl").read_text().splitlines()
    return trainer, [json.loads(line) for line in lines], start


def largest_move(trainer: Trainer, start: dict) -> float:
    end = lora_state(trainer.policy)
    return max(float((end[name] - start[name]).abs().max()) for name in start)


def test_clipping_to_a_tiny_norm_leaves_the_adapter_and_a_huge_one_moves_it_by_the_learning_rate(tmp_path):
    learning_rate = 3e-2
    tiny, tiny_metrics, start = train(tmp_path / "tiny", max_grad_norm=1e-9)
    # Adam's first step is lr·g/(|g| + ε) entry by entry; with the whole gradient's norm at
    # 1e-9, every |g| <= 1e-9 = ε/10, so no entry moves by more than lr/11
    assert largest_move(tiny, start) <= learning_rate * 1e-9 / (1e-9 + ADAM_EPSILON) * (1 + 1e-5)
    huge, huge_metrics, _ = train(tmp_path / "huge", max_grad_norm=1e9)
    # with |g| >> ε the first step moves each entry by lr·g/(|g| + ε) ≈ ±lr; the largest
    # |g| here is far above ε (measured 8e-8 below lr on AVX2 and AVX-512, 1 and 2
    # threads): 1e-3 leaves room for a gradient whose largest entry is 1e4·ε
    assert largest_move(huge, start) == pytest.approx(learning_rate, rel=1e-3)
    # grad_norm is the norm before clipping: the same gradient in both runs
    assert tiny_metrics[0]["grad_norm"] == huge_metrics[0]["grad_norm"] > 1e-9
    unclipped, _, _ = train(tmp_path / "unclipped")  # max_grad_norm unset: not clipped at all
    for name, value in lora_state(unclipped.policy).items():
        assert torch.equal(value, lora_state(huge.policy)[name]), name  # a clip by a factor of 1 changes no bit


def test_the_clipped_gradient_has_the_norm_asked_for(tmp_path):
    """One optimizer step of SGD-like size is not observable through Adam, so the clip is
    checked on the gradient itself: after the update, the gradient left in the parameters
    is the clipped one."""
    trainer, metrics, _ = train(tmp_path / "run", max_grad_norm=1e-3)
    grads = [p.grad for p in trainer.policy.parameters() if p.requires_grad and p.grad is not None]
    norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
    assert metrics[0]["grad_norm"] > 1e-3
    # torch scales by max_norm / (norm + 1e-6); float32 gradients and a norm summed in
    # another order: measured 7e-8 relative, 1e-5 is a hundred times float32's rounding
    assert norm == pytest.approx(1e-3 * metrics[0]["grad_norm"] / (metrics[0]["grad_norm"] + 1e-6), rel=1e-5)


def test_a_linear_schedule_with_warmup_rises_to_step_3_and_falls_to_step_6(tmp_path):
    _, metrics, _ = train(tmp_path / "run", steps=6, lr_schedule="linear", warmup_steps=3)
    rates = [m["learning_rate"] for m in metrics]
    # the rate is a float64 product of the learning rate and the factor: a few ulps apart
    assert rates == pytest.approx([3e-2 * f for f in (1 / 3, 2 / 3, 1, 3 / 4, 2 / 4, 1 / 4)], rel=1e-12)
    assert rates[0] < rates[1] < rates[2] > rates[3] > rates[4] > rates[5]
    assert all(math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0 for m in metrics)  # logged at every step


def test_a_second_pass_over_the_rollout_clips_and_one_teacher_forced_pass_never_does(tmp_path):
    _, twice, _ = train(tmp_path / "twice", steps=2, updates_per_rollout=2, learning_rate=0.2)
    assert all(m["clip_fraction"] > 0 for m in twice)
    # one update with π_old from the update's own pass: every ratio is exactly 1
    _, once, _ = train(tmp_path / "once", steps=2, learning_rate=0.2, old_logprobs="teacher_forced")
    assert [m["clip_fraction"] for m in once] == [0.0, 0.0]


def test_weight_decay_pulls_an_untouched_adapter_towards_zero(tmp_path):
    """AdamW's decay is decoupled: an entry of zero gradient shrinks by exactly (1 - lr·λ)
    a step. LoRA's B starts at zero and A at random values; with a clip of 1e-30 the
    gradients vanish (each Adam step is below 1e-30 / ε · lr), so A only decays."""
    trainer, _, start = train(tmp_path / "run", steps=2, max_grad_norm=1e-30, weight_decay=0.5)
    end = lora_state(trainer.policy)
    for name in (name for name in start if "lora_A" in name):
        # two float32 multiplications by (1 - lr·λ) and Adam steps of at most 3e-24: measured
        # 1.9e-7 relative, within two float32 roundings (1.2e-7 each)
        torch.testing.assert_close(end[name], start[name] * (1 - 3e-2 * 0.5) ** 2, rtol=1e-6, atol=1e-12)


def test_mini_batches_split_the_step_into_optimizer_steps_that_each_normalise_their_share(tmp_path):
    """Two mini-batches of 2 prompts: 2 optimizer steps a pass, each the mean over its own
    prompts' tokens, whatever the micro-batch size (1 or 2 prompts: the same updates)."""
    one, metrics, start = train(tmp_path / "one", steps=2, mini_batches=2, micro_batch_prompts=1)
    two, _, _ = train(tmp_path / "two", steps=2, mini_batches=2, micro_batch_prompts=2)
    whole, _, _ = train(tmp_path / "whole", steps=2)
    moved = largest_move(one, start)
    # micro-batching only reorders float32 sums (about 1e-7 of the gradient); Adam turns
    # that into up to ~1e-4 of a step on entries whose gradient is near its ε
    apart = max(float((lora_state(one.policy)[k] - lora_state(two.policy)[k]).abs().max()) for k in start)
    assert apart <= 1e-3 * moved
    differs = max(float((lora_state(one.policy)[k] - lora_state(whole.policy)[k]).abs().max()) for k in start)
    assert differs > 0.05 * moved  # two optimizer steps a pass are not one
    assert all(math.isfinite(m["grad_norm"]) for m in metrics)


def test_resume_is_bit_identical_with_a_schedule_several_updates_and_mini_batches(tmp_path):
    optim = dict(updates_per_rollout=2, mini_batches=2, max_grad_norm=0.5, lr_schedule="cosine", warmup_steps=1,
                 weight_decay=0.01)
    straight, straight_metrics, _ = train(tmp_path / "straight", steps=4, estimator="leaf", **optim)
    with pytest.raises(RuntimeError):  # a crash after step 3: the rerun resumes from step 2's checkpoint
        train(tmp_path / "resumed", steps=4, estimator="leaf", plugins=[CrashAt(3)], **optim)
    resumed, resumed_metrics, _ = train(tmp_path / "resumed", steps=4, estimator="leaf", **optim)
    for name, value in lora_state(straight.policy).items():
        assert torch.equal(value, lora_state(resumed.policy)[name]), name
    assert [reproducible(m) for m in resumed_metrics] == [reproducible(m) for m in straight_metrics]
    state = torch.load(tmp_path / "resumed" / "checkpoint-00000004" / "state.pt", weights_only=False)
    assert state["scheduler"]["last_epoch"] == 4


def test_raising_steps_plans_the_rest_of_the_schedule_over_the_new_total(tmp_path):
    train(tmp_path / "run", steps=4, lr_schedule="linear")
    _, metrics, _ = train(tmp_path / "run", steps=6, lr_schedule="linear")
    rates = [m["learning_rate"] for m in metrics]
    # steps 1-4 as trained (over 4 steps), steps 5-6 from the schedule over 6 steps (float64
    # products of the learning rate and the factor: a few ulps apart)
    assert rates == pytest.approx([3e-2 * f for f in (4 / 5, 3 / 5, 2 / 5, 1 / 5, 2 / 7, 1 / 7)], rel=1e-12)
