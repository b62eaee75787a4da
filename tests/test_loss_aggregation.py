"""The step's loss does not depend on how the step is cut: one micro-batch, three, or
two processes (tests/test_training_distributed.py) give the same gradient, which is the
gradient of the aggregation computed over the whole step by hand."""

from __future__ import annotations

import pytest
import torch

from leaf_plugins.training.aggregation import StepTotals, token_weights
from leaf_plugins.training.lora import reference_policy
from leaf_plugins.training.teacher_forcing import response_logprobs
from leaf_plugins.training.trainer import Trainer
from training_cases import config, examples, fixed_step, host, step_gradient

PROMPTS = 3


def test_token_weights_by_hand():
    lengths = torch.tensor([2, 1])  # two of the step's rows; the step has 10 tokens in 4 responses
    totals = StepTotals(tokens=10, sequences=4)
    for aggregation, verl, expected in [("token_mean", "token-mean", [[0.1, 0.1, 0], [0.1, 0, 0]]),
                                        ("sequence_mean", "seq-mean-token-mean", [[1 / 8, 1 / 8, 0], [1 / 4, 0, 0]]),
                                        ("sequence_sum", "seq-mean-token-sum", [[1 / 4, 1 / 4, 0], [1 / 4, 0, 0]]),
                                        ("constant", "seq-mean-token-sum-norm", [[1 / 20, 1 / 20, 0], [1 / 20, 0, 0]])]:
        torch.testing.assert_close(token_weights(lengths, 3, totals, aggregation, 5), torch.tensor(expected))
        torch.testing.assert_close(token_weights(lengths, 3, totals, verl, 5), torch.tensor(expected))
    with pytest.raises(ValueError, match="loss_aggregation must be one of"):
        token_weights(lengths, 3, totals, "mean", 5)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    run = config(tmp_path_factory.mktemp("aggregation"), "grpo", steps=1)
    run.rollout.prompts_per_step, run.rollout.group_size, run.rollout.max_new_tokens = PROMPTS, 4, 8
    return Trainer(run, examples(PROMPTS), host=host())


def by_hand(trainer, aggregation: str, old_logprobs: str = "rollout") -> dict[str, torch.Tensor]:
    """The aggregation written out over the whole step in one pass; π_old from the rollout
    or, with ``old_logprobs="teacher_forced"``, the pass itself (detached)."""
    data = fixed_step(trainer, examples(PROMPTS))
    rollout, batch, advantages = data.rollout, data.whole, data.advantages
    optim, inputs = trainer.config.optim, data.context.inputs
    mask = batch.mask
    with torch.no_grad(), reference_policy(trainer.policy):
        reference = response_logprobs(trainer.policy, inputs, batch.tokens, batch.lengths, rollout.prompt_index)
    trainer.optimizer.zero_grad()
    current = response_logprobs(trainer.policy, inputs, batch.tokens, batch.lengths, rollout.prompt_index)
    ratio = torch.exp(current - (current.detach() if old_logprobs == "teacher_forced" else batch.logprobs))
    clipped = ratio.clamp(1 - optim.clip_epsilon, 1 + optim.clip_epsilon)
    surrogate = torch.minimum(ratio * advantages, clipped * advantages)
    k3 = torch.exp(reference - current) - (reference - current) - 1
    per_token = (-surrogate + optim.kl_coefficient * k3) * mask
    if aggregation == "token_mean":
        loss = per_token.sum() / mask.sum()
    elif aggregation == "sequence_mean":
        loss = (per_token.sum(1) / batch.lengths).mean()
    else:
        loss = per_token.sum() / (batch.size * trainer.config.rollout.max_new_tokens)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in trainer.policy.named_parameters() if p.requires_grad}
    trainer.optimizer.zero_grad()
    return grads


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean", "constant"])
def test_one_and_three_micro_batches_give_the_step_gradient(trainer, aggregation):
    expected = by_hand(trainer, aggregation)
    assert any(bool(g.abs().sum() > 0) for g in expected.values())
    for micro_batch_prompts in (PROMPTS, 1):
        trainer.config.optim.loss_aggregation = aggregation
        trainer.config.optim.micro_batch_prompts = micro_batch_prompts
        got = step_gradient(trainer, examples(PROMPTS))
        for name in expected:
            # the same sums in another order (per micro-batch, then added): float32 rounding at the
            # scale of the tensor's largest element (cancellations make small elements relatively
            # worse); 1e-5 x max = 84 eps32, measured <= 1.3e-6 x max (default|avx2 x 1|4 threads)
            scale = float(expected[name].abs().max())
            torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-5 * scale,
                                       msg=lambda m, name=name: f"{name}: {m}")
    lengths = fixed_step(trainer, examples(PROMPTS)).whole.lengths
    assert len(set(lengths.tolist())) > 1  # the groups differ in length: a per-micro-batch mean would differ


def test_teacher_forced_old_logprobs_take_pi_old_from_the_update_pass(trainer):
    """``optim.old_logprobs: teacher_forced``: the ratio is exactly 1 (π_old is the pass's
    own detached log π), so no token clips and the gradient is that of A·log π plus the KL
    term; the fixed step's rollout log π are 0.1 off, so the default gives another one."""
    expected = by_hand(trainer, "token_mean", old_logprobs="teacher_forced")
    from_rollout = by_hand(trainer, "token_mean")
    trainer.config.optim.loss_aggregation, trainer.config.optim.micro_batch_prompts = "token_mean", 1
    trainer.config.optim.old_logprobs = "teacher_forced"
    try:
        got = step_gradient(trainer, examples(PROMPTS))
    finally:
        trainer.config.optim.old_logprobs = "rollout"
    differs = False
    for name in expected:
        # the reordered float32 sums' bound, as above: measured <= 4.4e-7 x max (default|avx2 x 1|4 threads)
        scale = float(expected[name].abs().max())
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-5 * scale,
                                   msg=lambda m, name=name: f"{name}: {m}")
        # ratio e^0.1 against 1: the gradients differ by 0.105 x max (measured), 10x this threshold
        differs |= bool((from_rollout[name] - expected[name]).abs().max() > 1e-2 * scale)
    assert differs


def test_activation_checkpointing_gives_the_same_gradient(tmp_path):
    """Also run in the floor environment (scripts/test_floor.sh): the transformers API
    that turns checkpointing on was renamed inside the supported range."""
    from leaf_plugins.training.activation_checkpointing import activation_checkpointing_enabled

    run = config(tmp_path, "grpo", steps=1)
    run.rollout.prompts_per_step, run.rollout.group_size, run.rollout.max_new_tokens = PROMPTS, 4, 8
    run.optim.activation_checkpointing = True
    checkpointed = Trainer(run, examples(PROMPTS), host=host())
    assert activation_checkpointing_enabled(checkpointed.policy)
    plain = Trainer(config(tmp_path / "plain", "grpo", steps=1), examples(PROMPTS), host=host())
    plain.config.rollout = run.rollout
    plain.config.optim.micro_batch_prompts = checkpointed.config.optim.micro_batch_prompts = 1
    got, expected = step_gradient(checkpointed, examples(PROMPTS)), step_gradient(plain, examples(PROMPTS))
    for name in expected:
        # the recomputation repeats the same kernels on the same inputs: measured 0 difference
        # (default|avx2 x 1|4 threads); the bound of a reordered float32 sum (above) as margin
        scale = float(expected[name].abs().max())
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-5 * scale,
                                   msg=lambda m, name=name: f"{name}: {m}")
