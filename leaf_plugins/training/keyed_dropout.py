"""LoRA dropout whose masks depend on what a token is, never on the batch it is in.

peft draws LoRA's dropout masks from torch's generator, one tensor per forward pass: a
row's mask then depends on which rows share its micro-batch and in which order they
come, so ``optim.micro_batch_prompts``, the process count and the shares would change
what is trained. Here every mask element is a hash of the token's key and the feature's
index, and the token's key is a hash of

* the run's seed, the step and the update's pass (``row_keys``),
* the prompt's group id for a position of the prompt, or the group id and the
  response's index k for a position of a response,
* the token's position in its sequence (its position id, so left padding does not
  move it).

A prompt's positions get the same masks in all of its K rows, as in the shared-prefix
pass that runs the prompt once (``teacher_forcing.py``), so that pass and the full pass
drop the same units. Each LoRA layer has its own salt (a hash of its module name), so
the query, key and value projections of one input draw independent masks.

``install_keyed_dropout`` replaces peft's ``nn.Dropout`` modules of an adapter with
``KeyedDropout``. A teacher-forced pass that has keys sets them for each forward
(``set_token_keys``); they stay set through its backward pass, where activation
checkpointing recomputes the layers with the same masks. A forward in training mode
without keys (another trainer of the model, such as TRL's) draws from torch's generator
as ``nn.Dropout`` does.

The hash is the rollout's splitmix64 (``rollout/decoding/keyed_draw.py``). One 64-bit
hash of (token, group of 4 features) gives the four features their 16-bit uniforms, read
as the hash's four 16-bit fields in memory order (the same on every little-endian
machine, which all of torch's builds are), and an element is kept where its uniform is
at least ``ceil(p · 2^16)``: the drop probability is p rounded up to a multiple of 2^-16.
A quarter of the elements are hashed, and the rest is one comparison of int16 fields.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch

from leaf_plugins.rollout.decoding.keyed_draw import mix64

__all__ = ["KeyedDropout", "RowKeys", "row_keys", "token_keys", "set_token_keys", "install_keyed_dropout"]

_FIELDS_PER_WORD = 4  # 16-bit uniforms per 64-bit hash
_FIELD_VALUES = 1 << 16
_current: list[torch.Tensor | None] = [None]  # [B, S] int64 keys of the tokens of the latest keyed forward


@dataclass(frozen=True)
class RowKeys:
    """The dropout keys of a micro-batch's sequences before positions are mixed in."""

    prompts: torch.Tensor  # [P] int64, one per prompt row of the pass's inputs
    responses: torch.Tensor  # [N] int64, one per response row


def _words(*values: int) -> torch.Tensor:
    """One int64 word hashed from the integers ``values`` (each through splitmix64)."""
    word = torch.zeros((), dtype=torch.int64)
    for value in values:
        word = mix64(word ^ mix64(torch.tensor(value, dtype=torch.int64)))
    return word


def row_keys(seed: int, step: int, pass_number: int, group_ids: torch.Tensor,
             prompt_index: torch.Tensor, prompts: int) -> RowKeys:
    """The keys of one pass's rows.

    :param step: the training step (1-based); ``pass_number``: the pass over its rollout
        (0-based; π_old's teacher-forced pass uses the first pass's keys).
    :param group_ids: ``[N]`` each response's group id (its prompt's).
    :param prompt_index: ``[N]`` each response's prompt row (in ``[0, prompts)``); the
        K responses of a prompt are consecutive rows, k counted from the first.
    """
    group_ids = group_ids.to(torch.int64).cpu()
    prompt_index = prompt_index.to(torch.int64).cpu()
    rows = torch.arange(group_ids.numel())
    starts = torch.ones_like(group_ids, dtype=torch.bool)
    starts[1:] = group_ids[1:] != group_ids[:-1]
    within = rows - torch.cummax(torch.where(starts, rows, torch.zeros_like(rows)), dim=0).values  # [N] k
    groups = mix64(_words(seed, step, pass_number) ^ mix64(group_ids))  # [N]
    prompt_groups = torch.zeros(prompts, dtype=torch.int64).scatter(0, prompt_index, groups)  # [P]
    return RowKeys(prompts=mix64(prompt_groups), responses=mix64(groups + 1 + within))


def token_keys(rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``[R, W]`` int64 keys of the tokens of ``R`` sequences with ``[R]`` keys ``rows``
    at ``[R, W]`` position ids ``positions``."""
    return mix64(rows.to(positions.device).unsqueeze(1) ^ mix64(positions.to(torch.int64)))


def set_token_keys(keys: torch.Tensor | None) -> None:
    """The ``[B, S]`` token keys of the next forward pass (None: the masks come from
    torch's generator). They stay set until the next call, through the pass's backward."""
    _current[0] = keys


class KeyedDropout(torch.nn.Module):
    """Dropout with probability ``p`` whose mask element for token t and feature h is a
    hash of t's key (``set_token_keys``), h and this layer's ``salt``."""

    def __init__(self, p: float, salt: int) -> None:
        super().__init__()
        self.p = p
        self.salt = salt
        # kept where the field, read as a signed int16, is at least this (ceil(p·2^16) − 2^15)
        self._keep_from = math.ceil(p * _FIELD_VALUES) - _FIELD_VALUES // 2
        self._words: dict[tuple[int, torch.device], torch.Tensor] = {}

    def extra_repr(self) -> str:
        return f"p={self.p}, salt={self.salt}"

    def _feature_words(self, words: int, device: torch.device) -> torch.Tensor:
        """``[W]`` int64 words of this layer's groups of 4 features (cached per count and device)."""
        cached = self._words.get((words, device))
        if cached is None:
            base = mix64(torch.tensor(self.salt, dtype=torch.int64))
            cached = mix64(base + torch.arange(words, dtype=torch.int64)).to(device)
            self._words[(words, device)] = cached
        return cached

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, S, H]
        if not self.training or self.p == 0.0:
            return x
        keys = _current[0]
        if keys is None:
            return torch.nn.functional.dropout(x, self.p, training=True)
        if tuple(keys.shape) != tuple(x.shape[:-1]):
            raise RuntimeError(f"keyed dropout: token keys of shape {tuple(keys.shape)} for an input of shape "
                               f"{tuple(x.shape)}: the keys were set for another forward pass")
        width = x.shape[-1]
        words = -(-width // _FIELDS_PER_WORD)
        hashes = mix64(keys.to(x.device).unsqueeze(-1) ^ self._feature_words(words, x.device))  # [B, S, W]
        fields = hashes.view(torch.int16)[..., :width]  # [B, S, H]: four uniforms per hash, offset by 2^15
        keep = fields >= self._keep_from  # [B, S, H]
        return x * keep * (1.0 / (1.0 - self.p))


def install_keyed_dropout(model: torch.nn.Module) -> int:
    """Replace the ``nn.Dropout`` of every LoRA layer of ``model`` (a peft model) with a
    ``KeyedDropout`` of the same probability, salted with a hash of the layer's name;
    return how many were replaced."""
    replaced = 0
    for name, module in model.named_modules():
        dropouts = getattr(module, "lora_dropout", None)
        if not isinstance(dropouts, torch.nn.ModuleDict):
            continue
        for adapter, dropout in dropouts.items():
            if isinstance(dropout, torch.nn.Dropout):
                digest = hashlib.sha256(f"{name}.{adapter}".encode()).digest()
                dropouts[adapter] = KeyedDropout(dropout.p, int.from_bytes(digest[:8], "little", signed=True))
                replaced += 1
    return replaced
