"""Rollout: sampling with log-probabilities and surprisal, and teacher forcing."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from leaf_plugins import get_host
from leaf_plugins.core.stages import RolloutRequest
from leaf_plugins.rollout.assembly import audio_token_ids
from leaf_plugins.rollout.sampling import sample_responses
from leaf_plugins.training.teacher_forcing import response_logprobs

PROMPTS = ["<|audio|> translate this", "Listen to <|audio|> and answer: who?", "<|audio|> what?"]


@pytest.fixture(scope="module")
def setup():
    backbone = get_host().backbones.get("tiny-qwen2-audio")
    loaded = backbone.load(seed=0)
    loaded.model.eval()
    rng = np.random.default_rng(0)
    audios = [(rng.standard_normal(16000 + 4000 * i) * 0.1).astype(np.float32) for i in range(3)]
    return backbone, loaded, backbone.build_inputs(loaded, PROMPTS, audios)


@pytest.fixture(scope="module")
def rollout(setup):
    _, loaded, inputs = setup
    torch.manual_seed(0)
    return sample_responses(RolloutRequest(loaded.model, loaded, inputs, group_size=6, max_new_tokens=20,
                                           temperature=1.0, top_p=0.9, group_ids=[10, 20, 30]))


def test_layout_eos_and_padding(setup, rollout):
    _, loaded, _ = setup
    batch = rollout.batch
    assert batch.tokens.shape[0] == 18 and batch.groups.sizes.tolist() == [6, 6, 6]
    assert batch.group_ids.tolist() == [10] * 6 + [20] * 6 + [30] * 6
    assert rollout.prompt_index.tolist() == [0] * 6 + [1] * 6 + [2] * 6
    eos = loaded.tokenizer.eos_token_id
    for row, length in zip(batch.tokens.tolist(), batch.lengths.tolist()):
        assert all(token == -1 for token in row[length:])
        assert eos not in row[: length - 1]  # generation stops at the first EOS ...
        if length < batch.width:
            assert row[length - 1] == eos  # ... which belongs to the response
    banned = set(audio_token_ids(loaded))
    assert not banned & set(batch.tokens.flatten().tolist())
    assert len(rollout.texts) == 18
    # the bound the estimators hash with is the width of the logits the ids were sampled
    # from (a model may have more embeddings than its tokenizer has tokens)
    assert batch.vocab_size == loaded.model.get_output_embeddings().weight.shape[0]
    assert int(batch.tokens.max()) < batch.vocab_size


def test_surprisal_sources(setup, rollout):
    real = rollout.batch.mask
    logprobs, surprisal = rollout.batch.logprobs, rollout.batch.surprisal
    assert bool((logprobs[real] <= 0).all()) and bool((logprobs[~real] == 0).all())
    # top-p renormalises over the nucleus: a sampled token is at least as likely there
    assert bool((surprisal[real] <= -logprobs[real] + 1e-5).all())
    assert bool((surprisal[real] >= 0).all())
    _, loaded, inputs = setup
    torch.manual_seed(1)
    policy = sample_responses(RolloutRequest(loaded.model, loaded, inputs, group_size=2, max_new_tokens=8,
                                             surprisal_from="policy"))
    assert torch.allclose(policy.batch.surprisal, -policy.batch.logprobs)
    with pytest.raises(ValueError, match="surprisal_from"):
        sample_responses(RolloutRequest(loaded.model, loaded, inputs, group_size=2, surprisal_from="raw"))


@pytest.mark.parametrize("backend", ["static", "generate"])
def test_a_request_computes_the_statistics_it_names(setup, backend):
    _, loaded, inputs = setup
    everything = RolloutRequest(loaded.model, loaded, inputs, group_size=2, max_new_tokens=4)
    texts_only = replace(everything, fields=frozenset())
    assert everything.computes("sum_pi_squared") and everything.computes("entropy")  # None: every statistic
    assert not texts_only.computes("sum_pi_squared")
    assert replace(everything, fields=frozenset({"sum_pi_squared"})).computes("sum_pi_squared")
    torch.manual_seed(2)
    full = sample_responses(everything, backend)
    torch.manual_seed(2)
    bare = sample_responses(texts_only, backend)
    assert full.batch.sum_pi_squared is not None and bare.batch.sum_pi_squared is None
    assert torch.equal(full.batch.tokens, bare.batch.tokens)  # the same draws either way


def test_teacher_forcing_reproduces_the_sampled_logprobs(setup, rollout):
    _, loaded, inputs = setup
    batch = rollout.batch
    with torch.no_grad():
        forced = response_logprobs(loaded.model, inputs, batch.tokens, batch.lengths, rollout.prompt_index)
    assert torch.allclose(forced, batch.logprobs, atol=1e-4)


def test_teacher_forcing_matches_a_one_response_at_a_time_reference(setup, rollout):
    """The batched, left-padded computation against single unpadded prompts."""
    backbone, loaded, inputs = setup
    batch = rollout.batch
    with torch.no_grad():
        forced = response_logprobs(loaded.model, inputs, batch.tokens, batch.lengths, rollout.prompt_index)
        for row in (0, 7, 17):
            prompt = int(rollout.prompt_index[row])
            keep = inputs["attention_mask"][prompt].bool()
            single = {"input_ids": inputs["input_ids"][prompt][keep].unsqueeze(0),
                      "attention_mask": torch.ones(1, int(keep.sum()), dtype=torch.long),
                      "input_features": inputs["input_features"][prompt : prompt + 1],
                      "feature_attention_mask": inputs["feature_attention_mask"][prompt : prompt + 1]}
            response = batch.tokens[row, : batch.lengths[row]]
            ids = torch.cat([single["input_ids"], response.unsqueeze(0)], dim=1)
            logits = loaded.model(input_ids=ids, attention_mask=torch.ones_like(ids),
                                  input_features=single["input_features"],
                                  feature_attention_mask=single["feature_attention_mask"]).logits[0]
            start = single["input_ids"].shape[1]
            expected = [torch.log_softmax(logits[start - 1 + t], -1)[token].item()
                        for t, token in enumerate(response.tolist())]
            assert forced[row, : len(expected)].tolist() == pytest.approx(expected, abs=1e-4)


def test_teacher_forcing_is_differentiable(setup, rollout):
    _, loaded, inputs = setup
    batch = rollout.batch
    forced = response_logprobs(loaded.model, inputs, batch.tokens[:2], batch.lengths[:2], rollout.prompt_index[:2])
    forced.sum().backward()
    grads = [p.grad for p in loaded.model.parameters() if p.grad is not None]
    assert grads and any(bool(g.abs().sum() > 0) for g in grads)
    loaded.model.zero_grad()
