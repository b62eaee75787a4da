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

``fused_linear`` goes further: it computes the layer's one linear map
``W + Σ scaling · B A`` once per rollout into a *copy* (summed in float32, rounded once
to the base weights' dtype; the base weights untouched) and concatenates the maps that
read the same input (query, key and value; gate and up), so a LoRA layer's five
operations (with peft's float32 adapter on a bf16 model: a cast, two float32 products,
a scaling, an add and a cast back) become one matrix product shared with its
neighbours. The result differs from the adapter's own order of operations by rounding
only: float32 rounding for a float32 model, one rounding of the folded weight to the
model's dtype otherwise (tested). Where the loop folds is ``static_rollout``'s rule.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

__all__ = ["projection", "is_plain_lora", "folded_map", "folded_linear", "fused_linear", "FoldedProjection",
           "fold_copy_bytes"]


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


def _foldable(module: torch.nn.Module) -> bool:
    """Whether ``folded_map`` folds ``module``: a plain ``nn.Linear`` without hooks, or
    a plain LoRA layer whose adapters have no biases."""
    if type(module) is torch.nn.Linear:
        return not _has_hooks(module)
    if not is_plain_lora(module):
        return False
    return all(module.lora_A[name].bias is None and module.lora_B[name].bias is None
               for name in module.active_adapters if name in module.lora_A)


def _fold_into(module: torch.nn.Module, out: torch.Tensor) -> None:
    """Write ``module``'s one linear map into ``out`` ``[out, in]`` (``_foldable``): a
    plain layer's weight copied; a LoRA layer's ``W + Σ_active scaling · B A`` summed in
    float32 and rounded once to ``out``'s dtype (the copy's cast rounds to nearest, as
    ``.to`` does). Reads the weights, never writes them."""
    if type(module) is torch.nn.Linear:
        out.copy_(module.weight)
        return
    total = module.get_base_layer().weight.detach().to(torch.float32, copy=True)  # [out, in]
    for name in module.active_adapters:
        if name in module.lora_A:
            total.addmm_(module.lora_B[name].weight.float(), module.lora_A[name].weight.float(),
                         alpha=module.scaling[name])
    out.copy_(total)


def _base(module: torch.nn.Module) -> torch.nn.Linear:
    return module if type(module) is torch.nn.Linear else module.get_base_layer()


def folded_map(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``(weight [out, in], bias [out] or None)`` of the one linear map ``module``
    applies: a plain ``nn.Linear``'s own tensors, or for a plain LoRA layer
    (``is_plain_lora``) a new tensor ``W + Σ_active scaling · B A`` summed in float32 and
    rounded once to ``W``'s dtype, with the base's bias; None for anything else (an
    adapter with biases included)."""
    if not _foldable(module):
        return None
    if type(module) is torch.nn.Linear:
        return module.weight, module.bias
    base = module.get_base_layer()
    weight = torch.empty_like(base.weight, requires_grad=False)
    _fold_into(module, weight)
    return weight, base.bias


def fold_copy_bytes(modules: list[torch.nn.Module]) -> int:
    """Bytes of the copy ``FoldedProjection`` keeps for ``modules``: their weights (and
    biases) in the base weights' dtype, 0 for one plain ``nn.Linear`` (its own tensors
    are read) or when they cannot be folded (they run as themselves)."""
    if not all(_foldable(module) for module in modules):
        return 0
    if len(modules) == 1 and type(modules[0]) is torch.nn.Linear:
        return 0
    bases = [_base(module) for module in modules]
    biases = any(base.bias is not None for base in bases)
    return sum((base.weight.numel() + (base.out_features if biases else 0)) * base.weight.element_size()
               for base in bases)


class FoldedProjection:
    """One matrix product for ``modules`` that all read the same input, over their
    folded maps (``folded_map``) concatenated into a copy kept here. ``refresh`` writes
    the maps again, in place, from the modules' current weights (a captured graph keeps
    reading the same tensors): call it once per rollout, after any update of the
    weights. One plain ``nn.Linear`` reads its own tensors (no copy)."""

    def __init__(self, modules: list[torch.nn.Module], single: bool = False) -> None:
        """:param single: call returns the one output tensor rather than a list."""
        self.modules = modules
        self.single = single
        bases = [_base(module) for module in modules]
        self.sizes = [base.out_features for base in bases]
        self.copies = fold_copy_bytes(modules) > 0
        if not self.copies:  # one plain nn.Linear: its own weight and bias
            self.weight, self.bias = bases[0].weight, bases[0].bias
            return
        first = bases[0].weight
        self.weight = torch.empty(sum(self.sizes), first.shape[1], dtype=first.dtype, device=first.device)  # [Σ out, in]
        with_bias = any(base.bias is not None for base in bases)
        self.bias = torch.empty(sum(self.sizes), dtype=first.dtype, device=first.device) if with_bias else None
        self.refresh()

    @classmethod
    def of(cls, modules: list[torch.nn.Module], single: bool = False) -> "FoldedProjection | None":
        """The folded product of ``modules``, or None when one of them cannot be folded."""
        return cls(modules, single) if all(_foldable(module) for module in modules) else None

    @property
    def nbytes(self) -> int:
        """Bytes of the copy held (0 when reading a layer's own tensors)."""
        if not self.copies:
            return 0
        return self.weight.numel() * self.weight.element_size() + (
            0 if self.bias is None else self.bias.numel() * self.bias.element_size())

    @torch.no_grad()
    def refresh(self) -> None:
        """Write every module's folded map into the kept copy, in place."""
        if not self.copies:
            return
        start = 0
        for module, size in zip(self.modules, self.sizes):
            _fold_into(module, self.weight[start : start + size])
            if self.bias is not None:
                bias = _base(module).bias
                if bias is None:
                    self.bias[start : start + size].zero_()
                else:
                    self.bias[start : start + size].copy_(bias)
            start += size

    def __call__(self, x: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        result = F.linear(x, self.weight, self.bias)  # [.., Σ out]
        return result if self.single else list(result.split(self.sizes, dim=-1))


def folded_linear(module: torch.nn.Module) -> FoldedProjection | None:
    """``module``'s forward as one product over its folded map (``FoldedProjection``
    returning one tensor); None when it cannot be folded."""
    return FoldedProjection.of([module], single=True)


def fused_linear(modules: list[torch.nn.Module]) -> FoldedProjection | None:
    """One matrix product for ``modules`` that all read the same input: a callable
    returning their outputs (views of one ``[.., Σ out]`` tensor, in order), from their
    folded maps (``folded_map``) concatenated once into a copy; None when one of them
    cannot be folded."""
    return FoldedProjection.of(modules)
