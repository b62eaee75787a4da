"""The O(N·T) rollout and the shared-audio, response-only teacher forcing against the
straightforward reference path (K copies of the audio, [N, T, V] logits kept, full log-softmax)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from leaf_plugins import get_host
from leaf_plugins.bench.step_reference import response_logprobs_full_vocabulary, sample_responses_k_copies
from leaf_plugins.core.stages import RolloutRequest
from leaf_plugins.rollout.prompt_embedding import embed_prompts
from leaf_plugins.rollout.sampling import sample_responses
from leaf_plugins.training.teacher_forcing import response_logprobs

GRADIENT_TOLERANCE = 1e-5
"""Of a float32 gradient tensor, relative to its largest element (see its use)."""
PROMPTS = ["<|audio|> translate this", "Listen to <|audio|> and answer: who?", "<|audio|> what?"]


@pytest.fixture(scope="module", params=["tiny-qwen2-audio", "tiny-granite-speech"])
def setup(request):
    backbone = get_host().backbones.get(request.param)
    loaded = backbone.load(seed=0)
    loaded.model.eval()
    rng = np.random.default_rng(0)
    audios = [(rng.standard_normal(16000 + 4000 * i) * 0.1).astype(np.float32) for i in range(3)]
    return loaded, backbone.build_inputs(loaded, PROMPTS, audios)


@pytest.mark.parametrize("temperature, surprisal_from", [(1.0, "sampling"), (0.7, "sampling"), (0.7, "policy")])
def test_same_tokens_and_values_as_the_k_copies_path(setup, temperature, surprisal_from):
    """The ``generate`` backend (both paths sample through ``generate``, so the same seed
    gives the same tokens; the static loop is tested in test_rollout_static.py)."""
    loaded, inputs = setup
    request = RolloutRequest(loaded.model, loaded, inputs, group_size=5, max_new_tokens=12, temperature=temperature,
                             top_p=0.9, surprisal_from=surprisal_from, group_ids=[7, 8, 9])
    torch.manual_seed(3)
    new = sample_responses(request, backend="generate")
    torch.manual_seed(3)
    old = sample_responses_k_copies(loaded.model, loaded, inputs, group_size=5, max_new_tokens=12,
                                    temperature=temperature, top_p=0.9, surprisal_from=surprisal_from,
                                    group_ids=[7, 8, 9])
    assert torch.equal(new.batch.tokens, old.batch.tokens) and torch.equal(new.batch.lengths, old.batch.lengths)
    assert new.texts == old.texts and torch.equal(new.prompt_index, old.prompt_index)
    assert new.batch.vocab_size == old.batch.vocab_size
    for field in ("logprobs", "surprisal", "sum_pi_squared"):
        torch.testing.assert_close(getattr(new.batch, field), getattr(old.batch, field), rtol=0, atol=1e-6)


def test_sum_pi_squared_from_a_teacher_forced_forward_pass(setup):
    """Σ_v π(v)² recomputed from the full logits of each sampled sequence (policy
    distribution: logits / temperature, no top-p), independently of generate."""
    loaded, inputs = setup
    torch.manual_seed(4)
    rollout = sample_responses(RolloutRequest(loaded.model, loaded, inputs, group_size=2, max_new_tokens=6,
                                              temperature=0.8))
    batch = rollout.batch
    for row in range(batch.tokens.shape[0]):
        prompt = int(rollout.prompt_index[row])
        length = int(batch.lengths[row])
        ids = torch.cat([inputs["input_ids"][prompt], batch.tokens[row, :length]]).unsqueeze(0)
        mask = torch.cat([inputs["attention_mask"][prompt], torch.ones(length, dtype=torch.long)]).unsqueeze(0)
        extra = {key: value[prompt : prompt + 1] for key, value in inputs.items()
                 if key not in ("input_ids", "attention_mask")}
        with torch.no_grad():
            logits = loaded.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0),
                                  **extra).logits[0]
        width = inputs["input_ids"].shape[1]
        probabilities = torch.softmax(logits[width - 1 : width - 1 + length] / 0.8, dim=-1)  # [length, V]
        torch.testing.assert_close(batch.sum_pi_squared[row, :length], probabilities.pow(2).sum(-1), rtol=1e-4,
                                   atol=1e-6)
        assert bool((batch.sum_pi_squared[row, length:] == 0).all())


def test_audio_is_encoded_once_per_prompt(setup):
    loaded, inputs = setup
    model = loaded.model
    encoder = getattr(model.model, "audio_tower", None) or model.model.encoder
    calls = []
    handle = encoder.register_forward_hook(lambda module, args, output: calls.append(args[0].shape[0]))
    try:
        embeddings = embed_prompts(model, inputs)
        torch.manual_seed(0)
        shared = {**inputs, "inputs_embeds": embeddings}
        rollout = sample_responses(RolloutRequest(model, loaded, shared, group_size=4, max_new_tokens=4))
        response_logprobs(model, shared, rollout.batch.tokens, rollout.batch.lengths, rollout.prompt_index)
    finally:
        handle.remove()
    assert calls == [len(PROMPTS)]  # one batch of 3 clips, not 3 × 4, and nothing after


def test_teacher_forcing_values_and_gradients_equal_the_full_vocabulary_path(setup):
    loaded, inputs = setup
    model = loaded.model
    torch.manual_seed(5)
    rollout = sample_responses(RolloutRequest(model, loaded, inputs, group_size=3, max_new_tokens=10, temperature=0.9))
    batch = rollout.batch
    weights = torch.randn(batch.tokens.shape, generator=torch.Generator().manual_seed(0))
    results = []
    for forced in (response_logprobs, response_logprobs_full_vocabulary):
        model.zero_grad()
        values = forced(model, inputs, batch.tokens, batch.lengths, rollout.prompt_index, 0.9)
        (values * weights).sum().backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        results.append((values.detach(), grads))
    model.zero_grad()
    (new, new_grads), (old, old_grads) = results
    # float32 log-probs up to |7|, each a log-softmax over the vocabulary after the layers'
    # reductions: 1e-5 is 12 eps32 at that size; measured <= 1.4e-6 (ATEN_CPU_CAPABILITY
    # default|avx2 x OMP_NUM_THREADS 1|4)
    torch.testing.assert_close(new, old, rtol=0, atol=1e-5)
    # against generate's values (a KV cache, one position at a time): measured <= 6.9e-6
    torch.testing.assert_close(new, batch.logprobs, rtol=0, atol=1e-4)  # and the rollout's own values
    # the language model's layers (what LoRA trains); the embedding table (tied to the
    # head here) and the audio side are frozen in training and get no gradient from the new path
    language_model = {name for name in old_grads if "language_model.layers." in name}
    assert language_model and language_model <= new_grads.keys()
    for name in language_model:
        # each element sums ~9 rows x 60 positions of products whose size is the tensor's largest
        # gradient (up to ~100), not the element's own (small elements are cancellations): the
        # bound scales with the tensor's max, 1e-5 x max = 84 eps32, ~3x sqrt(540) eps; measured
        # <= 8.9e-7 x max (default|avx2 x 1|4 threads; 1.5e-5 absolute on an Intel Xeon)
        scale = float(old_grads[name].abs().max())
        torch.testing.assert_close(new_grads[name], old_grads[name], rtol=0, atol=GRADIENT_TOLERANCE * scale,
                                   msg=lambda m, name=name: f"{name}: {m}")
