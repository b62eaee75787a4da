"""The model's linear layers as the decode loop calls them, LoRA adapters attached.

A peft LoRA ``Linear`` computes ``base(x) + lora_B(lora_A(dropout(x))) · scaling``, but
each call also runs peft's bookkeeping (adapter state, argument checks, dtype casts,
five module calls): on the CPU, at the tiny backbones' sizes, 50–100 µs of Python per
layer against 10–20 µs per small matrix product, more than half of a decode step. The loop
runs tens of thousands of steps with the adapter state fixed, so it settles that state
once per rollout: ``projection`` returns a function computing the same tensors with the
same operations in the same order (bit-identical, tested) straight from the layer's own
weights, for a LoRA layer in the plain state the loop runs in; any other layer (peft in
another state or variant, a quantised base, hooks) is called as the module itself.
The adapter stays attached either way: nothing is merged into the base weights.

Where a decode step is per-operator overhead (the CPU, small models), ``fused_linear``
goes further: it computes the layer's one linear map ``W + Σ scaling · B A`` once per
rollout into a *copy* (float32 sums, the base weights untouched) and concatenates the
maps that read the same input (query, key and value; gate and up), so a LoRA layer's
five operations become one matrix product shared with its neighbours. The result
differs from the adapter's own order of operations by float rounding only (tested).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

__all__ = ["projection", "is_plain_lora", "folded_map", "folded_linear", "fused_linear"]


def _has_hooks(*modules: torch.nn.Module) -> bool:
    return any(module._forward_hooks or module._forward_pre_hooks for module in modules)


def is_plain_lora(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a peft LoRA ``Linear`` whose forward is exactly
    ``base(x) + Σ_active lora_B(lora_A(x)) · scaling``: adapters enabled and not merged,
    plain LoRA (no DoRA or other variant), dropout inactive, a plain ``nn.Linear`` base,
    no hooks on any of its modules."""
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:
        return False
    if type(module) is not LoraLinear or module.disable_adapters or module.merged:
        return False
    base = module.get_base_layer()
    if type(base) is not torch.nn.Linear or _has_hooks(module, base):
        return False
    variants = getattr(module, "lora_variant", {})
    for adapter in module.active_adapters:
        if adapter not in module.lora_A:
            continue
        dropout = module.lora_dropout[adapter]
        if adapter in variants or getattr(module, "use_dora", {}).get(adapter, False):
            return False
        inactive = isinstance(dropout, torch.nn.Identity) or (
            type(dropout) is torch.nn.Dropout and (not dropout.training or dropout.p == 0))
        if not inactive:
            return False
        if _has_hooks(module.lora_A[adapter], module.lora_B[adapter], dropout):
            return False
    return True


def projection(module: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``module``'s forward as a function, LoRA's bookkeeping settled once (see above).
    The weights are read now: build it where they are in place for the whole rollout
    (inside ``gathered_for_generation`` under FSDP2)."""
    if not is_plain_lora(module):
        return module
    base = module.get_base_layer()
    weight, bias = base.weight, base.bias
    cast = getattr(module, "cast_input_dtype_enabled", True)
    adapters = [(module.lora_A[name].weight, module.lora_A[name].bias, module.lora_B[name].weight,
                 module.lora_B[name].bias, module.scaling[name])
                for name in module.active_adapters if name in module.lora_A]

    def forward(x: torch.Tensor) -> torch.Tensor:
        result = F.linear(x, weight, bias)
        dtype = result.dtype
        for a_weight, a_bias, b_weight, b_bias, scaling in adapters:
            if cast and x.dtype != a_weight.dtype:
                x = x.to(dtype=a_weight.dtype)
            result = result + F.linear(F.linear(x, a_weight, a_bias), b_weight, b_bias) * scaling
        return result if result.dtype == dtype else result.to(dtype)

    return forward


def folded_map(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``(weight [out, in], bias [out] or None)`` of the one linear map ``module``
    applies: a plain ``nn.Linear``'s own tensors, or for a plain LoRA layer
    (``is_plain_lora``) a new tensor ``W + Σ_active scaling · B A`` summed in float32 and
    rounded once to ``W``'s dtype, with the base's bias; None for anything else (an
    adapter with biases included)."""
    if type(module) is torch.nn.Linear and not _has_hooks(module):
        return module.weight, module.bias
    if not is_plain_lora(module):
        return None
    base = module.get_base_layer()
    total = base.weight.detach().to(torch.float32, copy=True)  # [out, in]
    for name in module.active_adapters:
        if name not in module.lora_A:
            continue
        down, up = module.lora_A[name], module.lora_B[name]
        if down.bias is not None or up.bias is not None:
            return None
        total.addmm_(up.weight.float(), down.weight.float(), alpha=module.scaling[name])
    return total.to(base.weight.dtype), base.bias


def folded_linear(module: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``module``'s forward as one product over its folded map (``folded_map``); None
    when it cannot be folded."""
    found = folded_map(module)
    if found is None:
        return None
    weight, bias = found
    return lambda x: F.linear(x, weight, bias)


def fused_linear(modules: list[torch.nn.Module]) -> Callable[[torch.Tensor], list[torch.Tensor]] | None:
    """One matrix product for ``modules`` that all read the same input: a function
    returning their outputs (views of one ``[.., Σ out]`` tensor, in order), from their
    folded maps (``folded_map``) concatenated once; None when one of them cannot be
    folded."""
    maps = [folded_map(module) for module in modules]
    if any(found is None for found in maps):
        return None
    weight = torch.cat([found[0] for found in maps]) if len(maps) > 1 else maps[0][0]  # [Σ out, in]
    sizes = [found[0].shape[0] for found in maps]
    biases = [found[1] for found in maps]
    bias = None if all(b is None for b in biases) else torch.cat(
        [torch.zeros(size, dtype=weight.dtype, device=weight.device) if b is None else b for b, size in zip(biases, sizes)])

    def forward(x: torch.Tensor) -> list[torch.Tensor]:
        return list(F.linear(x, weight, bias).split(sizes, dim=-1))

    return forward
