"""Keyed sampling: a response's tokens depend on its key (seed, group id, k) and its
logits, not on the batch it is sampled in, on either rollout backend."""

from __future__ import annotations

import pytest
import torch
from test_rollout_static import prompt_inputs, variant, with_adapter

from leaf_plugins.core.stages import RolloutRequest
from leaf_plugins.rollout.decoding.decode_state import DecodeState
from leaf_plugins.rollout.decoding.keyed_draw import draw, keyed_uniforms, mix64, response_keys
from leaf_plugins.rollout.decoding.sampling_step import SamplingStep
from leaf_plugins.rollout.prompt_embedding import embed_prompts
from leaf_plugins.rollout.sampling import sample_responses
from leaf_plugins.rollout.token_stats import TokenStatistics


def test_mix64_is_splitmix64s_finaliser():
    """Against splitmix64 written with Python's unbounded integers, masked to 64 bits."""
    mask = (1 << 64) - 1

    def reference(word: int) -> int:
        z = (word + 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    words = [0, 1, 2, 12345, (1 << 63) - 1, -1, -(1 << 63), 0x0123456789ABCDEF]
    found = mix64(torch.tensor(words, dtype=torch.int64)).tolist()
    assert [value & mask for value in found] == [reference(word & mask) for word in words]


def test_keys_depend_on_seed_group_and_index_only():
    keys = response_keys(3, [10, 11, 12], 4)  # [12]
    assert keys.unique().numel() == 12
    alone = torch.cat([response_keys(3, [group], 4) for group in (10, 11, 12)])
    assert torch.equal(keys, alone)  # the same keys one prompt at a time
    assert torch.equal(response_keys(3, [12, 10], 4), torch.cat([keys[8:], keys[:4]]))  # in any order
    assert not torch.equal(response_keys(4, [10, 11, 12], 4), keys)


def test_uniforms_are_uniform_and_keyed():
    """200,000 draws: every 24-bit value lies in [0, 1 - 2^-24]; the mean, variance and
    decile counts are those of U(0, 1) within 5 standard errors (a false alarm about 1e-6)."""
    keys = response_keys(0, range(1000), 200)  # [200000]
    uniforms = keyed_uniforms(keys, 7).double()
    assert float(uniforms.min()) >= 0.0 and float(uniforms.max()) <= 1 - 2**-24
    n = uniforms.numel()
    assert abs(float(uniforms.mean()) - 0.5) < 5 * (1 / 12 / n) ** 0.5
    assert abs(float(uniforms.var()) - 1 / 12) < 5 * (1 / 180 / n) ** 0.5  # Var of (U - 1/2)^2 is 1/180
    counts = torch.histc(uniforms, bins=10, min=0.0, max=1.0)
    assert float((counts - n / 10).abs().max()) < 5 * (n * 0.1 * 0.9) ** 0.5
    assert torch.equal(keyed_uniforms(keys[:5], 7), uniforms[:5].float())
    # another column, another draw: the two columns' uniforms are uncorrelated
    other = keyed_uniforms(keys, torch.tensor([8])).double()
    assert abs(float(torch.corrcoef(torch.stack([uniforms, other]))[0, 1])) < 5 / n**0.5


def test_draw_takes_the_first_token_whose_cumulative_probability_exceeds_the_target():
    generator = torch.Generator().manual_seed(0)
    probabilities = torch.softmax(torch.randn(32, 50, generator=generator) * 2, dim=-1)
    probabilities[:, ::3] = 0.0  # tokens outside the distribution
    keys = response_keys(5, range(8), 4)
    tokens = draw(probabilities, keys, 3)
    uniforms = keyed_uniforms(keys, 3).double()
    for row in range(32):
        values = probabilities[row].double()
        target = float(uniforms[row]) * float(values.sum())
        expected = next(v for v in range(50) if float(values[: v + 1].sum()) > target)
        assert int(tokens[row]) == expected
    assert bool((probabilities.gather(1, tokens.unsqueeze(1)) > 0).all())


def test_the_largest_uniform_times_any_total_stays_below_it():
    """The largest uniform, 1 - 2^-24, times float32 totals over many binades and
    mantissas: the product is below the total, so the last token with a positive
    probability is drawn rather than an index past the vocabulary."""
    generator = torch.Generator().manual_seed(1)
    totals = torch.rand(100_000, generator=generator) * torch.pow(2.0, torch.randint(-20, 4, (100_000,),
                                                                                     generator=generator).float())
    totals = torch.cat([totals, torch.pow(2.0, torch.arange(-20, 4).float())])  # powers of two too
    assert bool(((1 - 2**-24) * totals < totals).all())
    probabilities = torch.tensor([[0.0, 0.0, 0.25, 0.75, 0.0, 0.0]])  # tokens 4 and 5 impossible
    keys = torch.zeros(1 << 22, dtype=torch.int64)
    largest = int(keyed_uniforms(keys, torch.arange(1 << 22)).argmax())  # a column whose uniform is near 1
    assert float(keyed_uniforms(keys[:1], largest)) > 1 - 2**-20
    assert int(draw(probabilities, keys[:1], largest)) == 3


@pytest.mark.parametrize("backend", ["static", "generate"])
def test_a_prompts_responses_do_not_depend_on_the_batch_it_is_sampled_in(backend):
    """Three prompts in one batch, and each alone (other left padding, other batch
    shapes): the same tokens; the values within float32 rounding of other shapes. One
    thread, so that the rounding is the same from run to run on a machine: a token parts
    only where a keyed uniform lands within that rounding (about 1e-6) of a token
    boundary, which these 120 draws do not (none in 6,000 such draws on the built-in task)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _compare_batch_and_alone(backend)
    finally:
        torch.set_num_threads(threads)


def _compare_batch_and_alone(backend: str) -> None:
    loaded = variant("tiny-qwen2-audio")
    model = with_adapter(loaded)
    inputs = prompt_inputs(loaded)
    inputs = {**inputs, "inputs_embeds": embed_prompts(model, inputs)}
    whole = sample_responses(RolloutRequest(model, loaded, inputs, group_size=4, max_new_tokens=10,
                                            group_ids=[30, 31, 32], seed=9), backend=backend)
    for prompt in range(3):
        one = {key: value[prompt : prompt + 1] for key, value in inputs.items()}
        real = one["attention_mask"].bool().any(dim=0)
        one = {key: value[:, real] if key in ("input_ids", "attention_mask", "inputs_embeds") else value
               for key, value in one.items()}  # its own width: no left padding
        alone = sample_responses(RolloutRequest(model, loaded, one, group_size=4, max_new_tokens=10,
                                                group_ids=[30 + prompt], seed=9), backend=backend)
        rows = slice(4 * prompt, 4 * prompt + 4)
        width = alone.batch.width
        assert torch.equal(alone.batch.tokens, whole.batch.tokens[rows, :width])
        assert bool((whole.batch.tokens[rows, width:] == -1).all())
        # float32 logits of a batch of 1 against a batch of 3 with padding: rounding of other shapes
        torch.testing.assert_close(alone.batch.logprobs, whole.batch.logprobs[rows, :width], rtol=0, atol=1e-5)


@pytest.mark.parametrize("temperature, top_p", [(1.0, 0.9), (0.7, 0.5), (1.3, 1.0)])
def test_both_backends_draw_the_same_token_from_the_same_logits(temperature, top_p):
    """The static loop's ``SamplingStep`` and the ``generate`` backend's ``TokenStatistics``
    (which returns scores allowing one token) given the same logits and keys: the same
    token in every row, and the same log q of it. (Through the models the two backends'
    logits differ in the last bits, so there a token can part where a uniform lands within
    that rounding of a boundary.)"""
    rows, vocab, banned = 64, 1000, [3, 17]
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(1)) * 3
    keys = response_keys(4, range(rows // 8), 8)  # [N]
    sampler = SamplingStep(temperature, top_p, banned, vocab, eos_token_id=vocab - 1, pad_token_id=0,
                           device=torch.device("cpu"))
    state = DecodeState.start(torch.full((rows,), 5), 2, pad_token_id=0, keys=keys)
    sampler(logits, state)
    statistics = TokenStatistics(temperature, top_p, banned, torch.device("cpu"), keys)
    allowed = statistics(torch.zeros(rows, 1, dtype=torch.int64), logits.clone())  # [N, V]: 0 at the token
    tokens = allowed.argmax(dim=-1)
    assert bool((allowed.isfinite().sum(dim=-1) == 1).all())
    assert torch.equal(state.generated[:, 0], tokens)
    recorded = statistics.finish(tokens)
    # the same scores through transformers' warpers and through the sort-based filter: rounding only
    torch.testing.assert_close(recorded["sampling_logprobs"][:, 0], state.sampling_logprobs[:, 0], rtol=0,
                               atol=1e-5)
