"""The static loop's folded projections (``decoding/projections.py``) in the model's
dtype and the rule that decides where they are used (``static_rollout.folds_by_default``):
a bf16 model with peft's float32 adapter, as the trainer builds it on a GPU.

- the folded bf16 maps equal the peft layers' outputs within the bf16 roundings each
  side makes, and the folded weight is ``W + s·B A`` rounded once;
- the base weights and the adapter are bit-identical after folding and refolding;
- a kept fold is written again, in place, from weights updated in place;
- on CUDA the fold is made only when its bytes leave the margin free, with one warning
  otherwise (the device's memory is stubbed, so this runs on the CPU);
- the captured step over folded bf16 weights equals the eager one.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from test_rollout_capture import assert_same_rollout, rollout
from test_rollout_static import prompt_inputs, variant, with_adapter

from leaf_plugins.rollout.decoding import static_rollout as static_module
from leaf_plugins.rollout.decoding.cuda_graph import eager_capture
from leaf_plugins.rollout.decoding.family import decoder_family
from leaf_plugins.rollout.decoding.lean_decoder import fold_bytes
from leaf_plugins.rollout.decoding.projections import fused_linear
from leaf_plugins.rollout.decoding.static_rollout import folds_by_default, release_captures
from leaf_plugins.rollout.prompt_embedding import embed_prompts

BF16_UNIT_ROUNDOFF = 2.0 ** -8
"""bf16 keeps 8 significant bits: rounding to nearest moves a value by at most 2^-8 of it."""


def bf16_model(name: str = "tiny-granite-speech") -> torch.nn.Module:
    """The tiny backbone in bf16 with a non-zero LoRA adapter attached afterwards, as the
    trainer attaches it (peft keeps the adapter in float32)."""
    loaded = variant(name)
    loaded.model.to(torch.bfloat16)
    model = with_adapter(loaded)
    adapter = next(parameter for name, parameter in model.named_parameters() if "lora_A" in name)
    assert adapter.dtype == torch.float32
    return model


def layer_groups(model: torch.nn.Module) -> list[list[torch.nn.Module]]:
    layer = decoder_family(model).layers[0]
    attention, mlp = layer.self_attn, layer.mlp
    return [[attention.q_proj, attention.k_proj, attention.v_proj], [mlp.gate_proj, mlp.up_proj], [attention.o_proj]]


@pytest.mark.parametrize("name", ["tiny-granite-speech", "tiny-qwen2-audio"])
def test_bf16_folded_maps_equal_the_peft_layers_and_leave_the_weights_untouched(name):
    model = bf16_model(name)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for group in layer_groups(model):
            folded = fused_linear(group)
            x = torch.randn(6, group[0].in_features, generator=generator).to(torch.bfloat16)  # [6, in]
            start = 0
            for layer, got in zip(group, folded(x)):
                base = layer.get_base_layer()
                down, up = layer.lora_A["default"].weight.double(), layer.lora_B["default"].weight.double()
                exact = base.weight.double() + layer.scaling["default"] * up @ down  # [out, in]
                weight = folded.weight[start : start + base.out_features].double()
                start += base.out_features
                # the folded weight is W + s·B A rounded once to bf16 (the float32 sum's own
                # error, ~2^-24 of it, is far inside the bound)
                assert bool(((weight - exact).abs() <= BF16_UNIT_ROUNDOFF * exact.abs() * (1 + 2 ** -10)).all())
                expected = layer(x).double()  # peft: bf16 base product + float32 adapter, cast back to bf16
                # Both are within four bf16 roundings of x·(W + s·B A)ᵀ, each at most 2^-8 of
                # S = |x|·|W + s·B A|ᵀ: the folded weight's rounding and its output's; peft's
                # base product's rounding and its sum's. float32 accumulation adds ~2^-24 S.
                bound = 4 * BF16_UNIT_ROUNDOFF * (x.double().abs() @ exact.abs().T)
                if base.bias is not None:
                    bound = bound + 4 * BF16_UNIT_ROUNDOFF * base.bias.double().abs()
                assert bool(((got.double() - expected).abs() <= bound).all())
                # the bound is tight enough to see the adapter: the base layer alone breaks it
                assert not bool(((base(x).double() - expected).abs() <= bound).all())
            folded.refresh()  # refolding writes the copy again and reads the weights only
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())


def test_a_kept_fold_is_written_again_in_place_from_updated_weights():
    model = bf16_model()
    group = layer_groups(model)[0]
    folded = fused_linear(group)
    address = folded.weight.data_ptr()
    with torch.no_grad():
        for layer in group:  # an optimizer step, in place
            layer.lora_B["default"].weight.mul_(-2.0)
        folded.refresh()
    fresh = fused_linear(group)
    assert folded.weight.data_ptr() == address  # a captured graph keeps reading the same tensor
    assert torch.equal(folded.weight, fresh.weight)


def test_fold_bytes_are_the_projection_weights_of_every_layer():
    """Counted by hand from the config: every projection is adapted, so each layer keeps
    a copy of q, k, v, o, gate, up and down (and Qwen2's q/k/v biases) in bf16; the
    largest float32 sum while folding is the largest projection."""
    for name in ("tiny-granite-speech", "tiny-qwen2-audio"):
        model = bf16_model(name)
        family = decoder_family(model)
        text = model.config.text_config
        hidden, inter, layers = text.hidden_size, text.intermediate_size, text.num_hidden_layers
        query = text.num_attention_heads * family.head_dim
        kv = text.num_key_value_heads * family.head_dim
        qkv_bias = query + 2 * kv if family.layers[0].self_attn.q_proj.get_base_layer().bias is not None else 0
        per_layer = hidden * (query + 2 * kv) + qkv_bias + query * hidden + 3 * hidden * inter
        kept, transient = fold_bytes(family)
        assert kept == layers * per_layer * 2
        assert transient == max(hidden * query, hidden * inter) * 4


def test_cuda_folds_only_when_the_copy_leaves_the_margin_free(monkeypatch):
    model = bf16_model()
    family = decoder_family(model)
    kept, transient = fold_bytes(family)
    total = 100 * kept
    margin = int(static_module.FOLD_MARGIN_FRACTION * total)
    free = [kept + transient + margin]
    monkeypatch.setattr(static_module, "_device_memory", lambda device: (free[0], total))
    cuda = torch.device("cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert folds_by_default(family, cuda)
    free[0] -= 1
    with pytest.warns(UserWarning, match=r"folded projections need .* GiB .* run unfolded"):
        assert not folds_by_default(family, cuda)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one notice per model
        assert not folds_by_default(family, cuda)
    assert not folds_by_default(family, torch.device("cpu"))  # the CPU does not fold bf16


@pytest.mark.parametrize("name", ["tiny-granite-speech", "tiny-qwen2-audio"])
def test_captured_step_over_folded_bf16_weights_equals_the_eager_one(name):
    """The captured path (eager_capture on the CPU) and the eager loop, both folded in
    bf16: the same function over the same buffers and the same weights copy, so the same
    tokens and log-probabilities up to the masked span's summation order, which in bf16
    attention scores rounds differently: within the self-check's tolerance. A capture
    reused after the adapter is updated in place refolds: it gives the fresh eager
    rollout of the updated weights."""
    from leaf_plugins.rollout.decoding.cuda_graph import CHECK_TOLERANCE

    loaded = variant(name)
    loaded.model.to(torch.bfloat16)
    model = with_adapter(loaded)
    inputs = prompt_inputs(loaded)
    inputs["input_features"] = inputs["input_features"].to(torch.bfloat16)
    inputs = {**inputs, "inputs_embeds": embed_prompts(model, inputs)}
    release_captures(model)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    eager = rollout(model, loaded, inputs, seed=3, cuda_graph=False, fold=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback
        captured = rollout(model, loaded, inputs, seed=3, capture=eager_capture, fold=True)
    assert static_module._captures[model] and next(iter(static_module._captures[model].values())).decoder.folded
    assert_same_rollout(captured, eager, CHECK_TOLERANCE)
    with torch.no_grad():
        for key, parameter in model.named_parameters():
            if "lora_B" in key:
                parameter.mul_(-1.5)
    updated_eager = rollout(model, loaded, inputs, seed=3, cuda_graph=False, fold=True)
    updated = rollout(model, loaded, inputs, seed=3, capture=eager_capture, fold=True)
    assert not torch.equal(updated_eager.batch.logprobs, eager.batch.logprobs)
    assert_same_rollout(updated, updated_eager, CHECK_TOLERANCE)
    release_captures(model)
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items()
               if "lora_B" not in key)
