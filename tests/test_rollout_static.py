"""The static rollout loop (``rollout/decoding/``) against the Hugging Face model it
reuses: teacher-forced logits, the rollout's statistics for the tokens it sampled, its
sampling distribution (chi-square tests of stated power), the edge cases of the
bookkeeping, and the backend switch. Float32, tiny backbones, LoRA attached and non-zero."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import replace

import numpy as np
import pytest
import torch
from transformers import SuppressTokensLogitsProcessor, TemperatureLogitsWarper, TopPLogitsWarper

from leaf_plugins import ConfigError, get_host
from leaf_plugins.backbones.tiny import seeded_model
from leaf_plugins.core.stages import RolloutRequest
from leaf_plugins.rollout.decoding.family import decoder_family, unsupported_reason
from leaf_plugins.rollout.decoding.kv_buffers import KVBuffers
from leaf_plugins.rollout.decoding.lean_decoder import LeanDecoder
from leaf_plugins.training.lora import attach_lora
from leaf_plugins.rollout.prompt_embedding import embed_prompts
from leaf_plugins.rollout.assembly import audio_token_ids
from leaf_plugins.rollout.sampling import sample_responses
from leaf_plugins.training.teacher_forcing import response_logprobs
from leaf_plugins.rollout.backends import resolve_backend

PROMPTS = ["<|audio|> translate this", "Listen to <|audio|> and answer: who?", "<|audio|> what?"]

# float32 logits of magnitude <= ~10 here; the loop and the Hugging Face forward sum in
# other orders (grouped matmuls instead of SDPA, [N, H] instead of [N, 1, H] products),
# which moved them by at most 1e-5 (measured, also with ATEN_CPU_CAPABILITY=default and
# OMP_NUM_THREADS=1); 1e-4 relative to the largest logit leaves a 10x margin
LOGIT_TOLERANCE = 1e-4
# log-probabilities after a float32 log-softmax over 512 logits: the same spread, at most
# 1e-5 with a machine's default kernels, but up to 9.6e-4 (one token of 144) with
# ATEN_CPU_CAPABILITY=avx2 on an AVX-512 machine, where the decode step's [N, H] products
# and the teacher-forced [N, T, H] ones take different kernels; 2e-3 leaves a 2x margin
# and stays far below what a wrong value moves (a wrong token, temperature or top-p:
# > 0.05)
VALUE_TOLERANCE = 2e-3


@functools.lru_cache(maxsize=None)
def _built(name: str) -> object:
    """The tiny backbone ``name`` as loaded (its offline tokenizer takes a while to build)."""
    return get_host().backbones.get(name).load(seed=0)


def variant(name: str, seed: int = 0, **text_config) -> object:
    """A fresh model of the tiny backbone ``name`` with random weights from ``seed``, its
    text config changed by ``text_config``, with the backbone's processor and tokenizer."""
    loaded = _built(name)
    config = loaded.model.config
    changed = type(config).from_dict({**config.to_dict(), "text_config": {**config.text_config.to_dict(),
                                                                           **text_config}})
    return replace(loaded, model=seeded_model(type(loaded.model), changed, loaded.tokenizer, seed))


def with_adapter(loaded: object) -> torch.nn.Module:
    """LoRA attached as the trainer attaches it, its B matrices made non-zero (a fresh
    adapter is the identity: it would test nothing)."""
    model = attach_lora(loaded, rank=8, alpha=16, dropout=0.0).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    return model


def prompt_inputs(loaded: object, count: int = 3) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(0)
    audios = [(rng.standard_normal(16000 + 4000 * i) * 0.1).astype(np.float32) for i in range(count)]
    return loaded.spec.build_inputs(loaded, PROMPTS[:count], audios)


@pytest.fixture(scope="module", params=["tiny-qwen2-audio", "tiny-granite-speech"])
def setup(request):
    loaded = variant(request.param)
    model = with_adapter(loaded)
    inputs = prompt_inputs(loaded)
    return loaded, model, {**inputs, "inputs_embeds": embed_prompts(model, inputs)}


def model_logits(model: torch.nn.Module, inputs: dict, tokens: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[N, T + 1, V]`` the Hugging Face forward's logits at the prompt's last position
    and after each of ``tokens`` ``[N, T]`` (K rows per prompt, left-padded prompts)."""
    rows = {key: value.repeat_interleave(group_size, dim=0) for key, value in inputs.items() if key != "inputs_embeds"}
    ids = torch.cat([rows.pop("input_ids"), tokens], dim=1)
    mask = torch.cat([rows.pop("attention_mask"), torch.ones_like(tokens)], dim=1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0), **rows).logits
    return logits[:, ids.shape[1] - tokens.shape[1] - 1 :].float()


def lean_logits(model: torch.nn.Module, inputs: dict, tokens: torch.Tensor, group_size: int,
                fold: bool = False) -> torch.Tensor:
    """The same ``[N, T + 1, V]`` logits from the lean decoder: the prefill, then one
    decode step per token of ``tokens`` (``fold``: with the folded projections)."""
    mask = inputs["attention_mask"]
    embeddings = embed_prompts(model, inputs)
    decoder = LeanDecoder(decoder_family(model), fold)
    width = tokens.shape[1]
    with torch.no_grad():
        decoder.prepare_positions(mask.shape[1] + width + 1, embeddings)
        first, keys, values = decoder.prefill(embeddings, mask)
        buffers = KVBuffers.around(keys, values, mask, tokens.shape[0], width)
        positions = mask.sum(dim=1).repeat_interleave(group_size)
        steps = [first.repeat_interleave(group_size, dim=0)]
        for index in range(width):
            steps.append(decoder.step(tokens[:, index], positions + index, torch.tensor([index]), index + 1, buffers))
    return torch.stack(steps, dim=1)


@pytest.mark.parametrize("name, text_config", [
    ("tiny-qwen2-audio", {}),
    ("tiny-granite-speech", {}),
    # Granite Speech 3.3 8B's multipliers; logits_scaling is read by GraniteForCausalLM only,
    # not by the speech model's forward, so the loop must not apply it either
    ("tiny-granite-speech", {"embedding_multiplier": 12.0, "attention_multiplier": 0.0078125,
                             "residual_multiplier": 0.22, "logits_scaling": 16.0}),
    ("tiny-qwen2-audio", {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}),
    ("tiny-qwen2-audio", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 32}}),
    ("tiny-qwen2-audio", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                              "original_max_position_embeddings": 32}}),
    ("tiny-granite-speech", {"num_key_value_heads": 1}),  # 4 query heads per key/value head
    ("tiny-qwen2-audio", {"num_key_value_heads": 4}),  # no grouping (Qwen2-Audio-7B's layout)
])
@pytest.mark.parametrize("fold", [False, True], ids=["projections", "folded"])
def test_lean_decoder_reproduces_the_model_forward(name, text_config, fold):
    loaded = variant(name, **text_config)
    model = with_adapter(loaded)
    inputs = prompt_inputs(loaded)
    group_size, width = 2, 7
    tokens = torch.randint(0, 500, (len(PROMPTS) * group_size, width), generator=torch.Generator().manual_seed(2))
    expected = model_logits(model, inputs, tokens, group_size)
    got = lean_logits(model, inputs, tokens, group_size, fold)
    scale = float(expected.abs().max())
    torch.testing.assert_close(got, expected, rtol=0, atol=LOGIT_TOLERANCE * max(scale, 1.0))
    with torch.no_grad(), model.disable_adapter():  # the reference policy runs the same loop
        torch.testing.assert_close(lean_logits(model, inputs, tokens, group_size, fold),
                                   model_logits(model, inputs, tokens, group_size), rtol=0,
                                   atol=LOGIT_TOLERANCE * max(scale, 1.0))


def sampling_logprobs(logits: torch.Tensor, banned: list[int], temperature: float, top_p: float) -> torch.Tensor:
    """``[..., V]`` log q with transformers' own processors, in ``generate``'s order."""
    flat = logits.reshape(-1, logits.shape[-1])
    scores = SuppressTokensLogitsProcessor(banned)(None, flat)
    if temperature != 1.0:
        scores = TemperatureLogitsWarper(temperature)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return torch.log_softmax(scores, dim=-1).view_as(logits)


@pytest.mark.parametrize("temperature, top_p", [(1.0, 0.9), (0.7, 1.0), (1.3, 0.5)])
def test_rollout_values_are_the_models_for_the_sampled_tokens(setup, temperature, top_p):
    loaded, model, inputs = setup
    torch.manual_seed(3)
    rollout = sample_responses(RolloutRequest(model, loaded, inputs, group_size=4, max_new_tokens=12,
                                              temperature=temperature, top_p=top_p, group_ids=[5, 6, 7]),
                               backend="static")
    batch = rollout.batch
    real = batch.mask
    forced = response_logprobs(model, inputs, batch.tokens, batch.lengths, rollout.prompt_index, temperature)
    torch.testing.assert_close(batch.logprobs, forced.detach(), rtol=0, atol=VALUE_TOLERANCE)
    tokens = torch.where(real, batch.tokens, 0)
    logits = model_logits(model, inputs, tokens, 4)[:, :-1]  # [N, T, V]: the logits each token was sampled from
    policy = torch.softmax(logits / temperature, dim=-1)
    torch.testing.assert_close(batch.sum_pi_squared, torch.where(real, policy.pow(2).sum(-1), 0.0), rtol=1e-5,
                               atol=1e-6)
    sampling = sampling_logprobs(logits, audio_token_ids(loaded), temperature, top_p).gather(2, tokens.unsqueeze(2))
    assert bool(torch.isfinite(sampling.squeeze(2)[real]).all())  # every sample lies in the nucleus, none banned
    torch.testing.assert_close(batch.surprisal, torch.where(real, -sampling.squeeze(2), 0.0), rtol=0,
                               atol=VALUE_TOLERANCE)
    assert batch.group_ids.tolist() == [5] * 4 + [6] * 4 + [7] * 4
    assert batch.vocab_size == logits.shape[-1]
    policy_surprisal = sample_responses(RolloutRequest(model, loaded, inputs, group_size=2, max_new_tokens=5,
                                                       temperature=temperature, top_p=top_p, surprisal_from="policy"),
                                        backend="static")
    assert torch.equal(policy_surprisal.batch.surprisal, -policy_surprisal.batch.logprobs)


def chi_square_p_value(counts: torch.Tensor, probabilities: torch.Tensor, minimum_expected: float = 5.0) -> float:
    """Pearson's goodness-of-fit p-value of ``counts`` against ``probabilities``, the
    categories expected fewer than ``minimum_expected`` times pooled into one; 0 when a
    category of probability 0 was observed."""
    if bool((counts[probabilities == 0] > 0).any()):
        return 0.0
    total = counts.sum()
    expected = probabilities.double() * total
    large = expected >= minimum_expected
    observed = torch.cat([counts[large].double(), counts[~large].double().sum().view(1)])
    wanted = torch.cat([expected[large], expected[~large].sum().view(1)])
    keep = wanted > 0
    statistic = ((observed[keep] - wanted[keep]) ** 2 / wanted[keep]).sum()
    degrees = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(degrees / 2, dtype=torch.float64), statistic / 2))


def rejection_rate(alternative: torch.Tensor, probabilities: torch.Tensor, samples: int, alpha: float,
                   trials: int = 200) -> float:
    """The chi-square test's power: the share of ``trials`` samples of size ``samples``
    from ``alternative`` it rejects at level ``alpha`` (Monte Carlo, fixed seed)."""
    generator = torch.Generator().manual_seed(0)
    rejected = 0
    for _ in range(trials):
        drawn = torch.multinomial(alternative, samples, replacement=True, generator=generator)
        counts = torch.bincount(drawn, minlength=alternative.shape[0])
        rejected += chi_square_p_value(counts, probabilities) < alpha
    return rejected / trials


def test_sampling_distribution_is_the_models_by_chi_square(setup):
    """First tokens against the exact q of the prompt, second tokens against the exact
    marginal Σ_t1 q(t1) q(t2 | t1), each over 4000 rows sampled from one prompt. False
    alarm rate 1e-3 per test; the power against the likely bugs (no top-p, no
    temperature, the second token drawn as if from the first position) is measured by
    Monte Carlo and must be at least 0.99."""
    loaded, model, inputs = setup
    temperature, top_p, rows, alpha = 0.7, 0.9, 4000, 1e-3
    one = {key: value[:1] for key, value in inputs.items()}
    banned = audio_token_ids(loaded)
    torch.manual_seed(11)
    rollout = sample_responses(RolloutRequest(model, loaded, one, group_size=rows, max_new_tokens=2,
                                              temperature=temperature, top_p=top_p), backend="static")
    tokens = rollout.batch.tokens  # [rows, <= 2]
    first_logits = model_logits(model, one, torch.zeros(1, 0, dtype=torch.long), 1)[0, 0]  # [V]
    first = sampling_logprobs(first_logits, banned, temperature, top_p).exp()  # [V]
    vocab = first.shape[0]
    counts = torch.bincount(tokens[:, 0], minlength=vocab)
    assert chi_square_p_value(counts, first) > alpha  # also: nothing outside the nucleus, no audio token
    untempered = sampling_logprobs(first_logits, banned, 1.0, top_p).exp()
    unfiltered = torch.softmax(first_logits / temperature, dim=-1)
    for wrong in (untempered, unfiltered):
        assert rejection_rate(wrong, first, rows, alpha) >= 0.99
    support = torch.nonzero(first > 0).squeeze(1)  # every first token that can be drawn
    conditional = sampling_logprobs(model_logits(model, one, support.unsqueeze(1), len(support))[:, 1], banned,
                                    temperature, top_p).exp()  # [support, V]: q(t2 | t1)
    # rows whose first token was EOS have ended: the others' second token is drawn from
    # Σ_{t1 != EOS} q(t1) q(t2 | t1), renormalised
    weights = torch.where(support == loaded.tokenizer.eos_token_id, 0.0, first[support])
    marginal = (weights.unsqueeze(1) * conditional).sum(dim=0)
    marginal = marginal / marginal.sum()
    continued = rollout.batch.lengths == 2
    second = torch.bincount(tokens[continued, 1], minlength=vocab)
    assert chi_square_p_value(second, marginal) > alpha
    assert rejection_rate(first, marginal, int(continued.sum()), alpha) >= 0.99


@contextlib.contextmanager
def boosted(model: torch.nn.Module, token: int, rows, first_call_only: bool):
    """Inside this block the output head adds 100 to ``token``'s logit in ``rows`` (a
    callable of the head's batch size: which rows), at its first call or every call."""
    calls = []

    def hook(_, args, output):
        calls.append(1)
        if first_call_only and len(calls) > 1:
            return output
        boosted = output.clone()
        boosted[rows(output.shape[0]), ..., token] += 100.0
        return boosted

    handle = model.get_output_embeddings().register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def test_rows_ending_at_their_first_token_and_ragged_ends(setup):
    loaded, model, inputs = setup
    eos = loaded.tokenizer.eos_token_id
    group = 3
    # the first prompt's rows sample EOS first: a prefill projects [P] rows, generate's [N]
    with boosted(model, eos, lambda size: slice(0, 1 if size == len(PROMPTS) else group), first_call_only=True):
        torch.manual_seed(4)
        rollout = sample_responses(RolloutRequest(model, loaded, inputs, group_size=group, max_new_tokens=9),
                                   backend="static")
    batch = rollout.batch
    assert batch.lengths[:group].tolist() == [1] * group and rollout.texts[:group] == [""] * group
    assert batch.tokens[:group, 0].tolist() == [eos] * group
    assert bool((batch.tokens[:group, 1:] == -1).all())
    for row, length in enumerate(batch.lengths.tolist()):  # ragged: EOS ends each row, -1 after it
        assert eos not in batch.tokens[row, : length - 1].tolist()
        assert bool((batch.tokens[row, length:] == -1).all())
        assert length == batch.width or batch.tokens[row, length - 1] == eos
    assert batch.width == int(batch.lengths.max())  # cut to the longest response, as generate returns it
    forced = response_logprobs(model, inputs, batch.tokens, batch.lengths, rollout.prompt_index)
    # the boost changed the first step's logits of those rows only: compare the rest
    torch.testing.assert_close(batch.logprobs[group:], forced.detach()[group:], rtol=0, atol=VALUE_TOLERANCE)


def test_every_row_ending_at_once_gives_empty_responses(setup):
    loaded, model, inputs = setup
    eos = loaded.tokenizer.eos_token_id
    for backend in ("static", "generate"):
        with boosted(model, eos, lambda size: slice(None), first_call_only=True):
            rollout = sample_responses(RolloutRequest(model, loaded, inputs, group_size=2, max_new_tokens=6),
                                       backend=backend)
        assert rollout.batch.width == 1 and rollout.batch.lengths.tolist() == [1] * 6
        assert rollout.texts == [""] * 6 and rollout.batch.tokens[:, 0].tolist() == [eos] * 6


def test_one_new_token(setup):
    loaded, model, inputs = setup
    torch.manual_seed(5)
    rollout = sample_responses(RolloutRequest(model, loaded, inputs, group_size=3, max_new_tokens=1), backend="static")
    batch = rollout.batch
    assert batch.width == 1 and batch.lengths.tolist() == [1] * 9
    forced = response_logprobs(model, inputs, batch.tokens, batch.lengths, rollout.prompt_index)
    torch.testing.assert_close(batch.logprobs, forced.detach(), rtol=0, atol=VALUE_TOLERANCE)


def test_audio_tokens_are_never_sampled_even_when_most_likely(setup):
    loaded, model, inputs = setup
    banned = audio_token_ids(loaded)
    with boosted(model, banned[0], lambda size: slice(None), first_call_only=False):
        torch.manual_seed(6)
        rollout = sample_responses(RolloutRequest(model, loaded, inputs, group_size=4, max_new_tokens=6),
                                   backend="static")
    assert not set(banned) & set(rollout.batch.tokens.flatten().tolist())
    # π (the policy) keeps the audio token: it took almost all the mass, so Σπ² ≈ 1
    assert bool((rollout.batch.sum_pi_squared[rollout.batch.mask] > 0.99).all())


def test_responses_past_the_models_position_limit_behave_as_generate():
    """A prompt whose audio fills the context: the loop, like ``generate`` (no error, no
    warning), continues past ``max_position_embeddings`` with the rotary embedding's own
    values there; the rollout's values are still the model's (teacher forced)."""
    probe = variant("tiny-qwen2-audio")
    inputs = prompt_inputs(probe, count=1)
    limit = inputs["input_ids"].shape[1] + 2
    loaded = variant("tiny-qwen2-audio", max_position_embeddings=limit)
    model = with_adapter(loaded)
    runs = {}
    for backend in ("static", "generate"):
        torch.manual_seed(7)
        runs[backend] = sample_responses(RolloutRequest(model, loaded, inputs, group_size=4, max_new_tokens=10),
                                         backend=backend)
        batch = runs[backend].batch
        assert batch.width > 2  # past the limit
        forced = response_logprobs(model, inputs, batch.tokens, batch.lengths, runs[backend].prompt_index)
        torch.testing.assert_close(batch.logprobs, forced.detach(), rtol=0, atol=VALUE_TOLERANCE)


def test_the_backend_switch():
    loaded = variant("tiny-qwen2-audio")
    assert resolve_backend(loaded.model, None) == "static" and resolve_backend(loaded.model, "generate") == "generate"
    sliding = variant("tiny-qwen2-audio", use_sliding_window=True, sliding_window=8,
                      layer_types=["full_attention", "sliding_attention"])
    reason = unsupported_reason(sliding.model)
    assert "Qwen2AudioForConditionalGeneration" in reason and "sliding-window" in reason
    with pytest.warns(UserWarning, match="sliding-window.*rollout.backend=generate"):
        assert resolve_backend(sliding.model, None) == "generate"
    with pytest.raises(ConfigError, match=r"rollout.backend=static: Qwen2AudioForConditionalGeneration \(text model "
                                          r"type 'qwen2'\) uses sliding-window"):
        resolve_backend(sliding.model, "static")
    with pytest.raises(ConfigError, match="rollout.backend: Unknown rollout backend 'vllm'. Available: generate, static"):
        resolve_backend(loaded.model, "vllm")
    dynamic = variant("tiny-granite-speech", rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0,
                                                              "factor": 2.0})
    assert "RoPE type 'dynamic'" in unsupported_reason(dynamic.model)
    # an unsupported model still rolls out, on generate
    inputs = prompt_inputs(sliding, count=1)
    with pytest.warns(UserWarning):
        rollout = sample_responses(RolloutRequest(sliding.model, sliding, inputs, group_size=2, max_new_tokens=3))
    assert rollout.batch.size == 2


def test_base_weights_stay_bit_identical_through_rollouts_and_updates(tmp_path):
    """The adapter stays attached through the static loop (never merged into the
    weights): after 3 steps of rollouts and updates every base weight is bit-identical,
    and the adapter did change."""
    from leaf_plugins.training.trainer import Trainer
    from training_cases import config, examples, host

    trainer = Trainer(config(tmp_path, "grpo", steps=3, checkpoint_every=10), examples(), host=host())
    assert trainer.engine.manager.get_plugin("defaults:stages").backend == "static"  # the default here
    base = {name: value.detach().clone() for name, value in trainer.policy.named_parameters() if "lora_" not in name}
    adapter = {name: value.detach().clone() for name, value in trainer.policy.named_parameters() if "lora_B" in name}
    metrics = trainer.run()
    assert len(metrics) == 3 and all(m["rollout_seconds"] > 0 for m in metrics)
    after = dict(trainer.policy.named_parameters())
    assert base and all(torch.equal(after[name], value) for name, value in base.items())
    assert any(not torch.equal(after[name], value) for name, value in adapter.items())


def test_projections_are_the_peft_layers_bit_for_bit(setup):
    """The loop's LoRA projections compute what the peft layers compute, bit for bit;
    a layer in any other state (adapter disabled, dropout active in training) is
    called as the module itself."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    from leaf_plugins.rollout.decoding.projections import is_plain_lora, projection

    _, model, _ = setup
    layers = [module for module in model.modules() if isinstance(module, LoraLinear)]
    assert layers and all(is_plain_lora(layer) for layer in layers)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for layer in layers:
            x = torch.randn(5, 7, layer.in_features, generator=generator)
            assert torch.equal(projection(layer)(x), layer(x))
        with model.disable_adapter():
            assert not any(is_plain_lora(layer) for layer in layers)
            assert projection(layers[0]) is layers[0]
    dropping = attach_lora(variant("tiny-granite-speech"), rank=4, alpha=8, dropout=0.1)
    dropout_layers = [module for module in dropping.modules() if isinstance(module, LoraLinear)]
    assert not any(is_plain_lora(layer) for layer in dropout_layers)  # training mode: dropout active
    dropping.eval()
    assert all(is_plain_lora(layer) for layer in dropout_layers)


def test_folded_projections_are_the_peft_layers_and_leave_them_untouched(setup):
    """``fused_linear`` of a layer's query, key and value (LoRA folded into a copy,
    concatenated) gives each peft layer's output to float32 rounding: the fold adds
    ``scaling · B A`` (rank 8, entries ~0.1 · 0.1) to weights of size ~0.02-0.1, one
    rounding of the sum instead of two products and an add, about 1e-7 relative per
    element; 1e-5 of the output's largest element leaves a margin of ~50 across kernel
    paths. The base weights and the adapter stay bit-identical. With the adapter
    disabled nothing is folded, and the base layers concatenate to their own maps."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    from leaf_plugins.rollout.decoding.projections import fused_linear

    _, model, _ = setup
    attention = decoder_family(model).layers[0].self_attn
    layers = [attention.q_proj, attention.k_proj, attention.v_proj]
    assert all(isinstance(layer, LoraLinear) for layer in layers)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    x = torch.randn(5, 7, layers[0].in_features, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        outputs = fused_linear(layers)(x)
        for layer, got in zip(layers, outputs):
            expected = layer(x)
            assert not torch.equal(expected, layer.get_base_layer()(x))  # the adapter changes the output
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-5 * float(expected.abs().max()))
        with model.disable_adapter():
            assert fused_linear(layers) is None  # a disabled adapter is not folded: the layers run as themselves
            plain = fused_linear([layer.get_base_layer() for layer in layers])(x)
            for got, layer in zip(plain, layers):  # one product over the concatenated weights: a kernel may block it
                expected = layer(x)                # differently from three, so rounding, not bits
                torch.testing.assert_close(got, expected, rtol=0, atol=1e-5 * float(expected.abs().max()))
    assert all(torch.equal(value, before[name]) for name, value in model.state_dict().items())


def test_rollout_backend_in_a_run_config(tmp_path):
    from leaf_plugins.training.config import load_train_config

    path = tmp_path / "run.yaml"
    path.write_text("steps: 1\nrollout:\n  backend: vllm\n")
    with pytest.raises(ConfigError, match=rf"{path}:3:3: rollout.backend: Unknown rollout backend 'vllm'. "
                                          rf"Available: generate, static"):
        load_train_config(path)
    path.write_text("steps: 1\n")
    assert load_train_config(path).rollout.backend is None  # static where the model supports it
    assert load_train_config(path, ["rollout.backend=generate"]).rollout.backend == "generate"
