"""Per-token advantages of right-padded framework tensors through a leaf-plugins engine.

TRL and verl hold responses as ``[N, T]`` tensors padded on the right with a mask; this
module turns them into a ``RolloutBatch`` (whose estimated advantages come back in the
same ``[N, T]`` layout). Both adapters share it so that they estimate exactly alike.
"""

from __future__ import annotations

from typing import Mapping

import torch

from leaf_plugins.core.batch import PAD_TOKEN, RolloutBatch

__all__ = ["padded_batch"]


def padded_batch(
    tokens: torch.Tensor,  # [N, T] int: response token ids, anything on padding
    mask: torch.Tensor,  # [N, T] bool/int: 1 on the response's tokens (a prefix of each row)
    rewards: torch.Tensor,  # [N] float: one scalar reward per response
    group_ids: torch.Tensor,  # [N] int: responses of one prompt share an id
    logprobs: torch.Tensor | None = None,  # [N, T] float: log pi_old of each sampled token
    sum_pi_squared: torch.Tensor | None = None,  # [N, T] float: sum_v pi_old(v)^2 per position
    vocab_size: int | None = None,
    extra: Mapping[str, torch.Tensor] | None = None,  # name -> [N, T] float: further per-token fields
) -> RolloutBatch:
    """The ``RolloutBatch`` of right-padded framework tensors (on the tensors' device).

    A response's length is the position after its last masked-in token; positions before
    it count as the response even where ``mask`` is 0 (tool output inside a multi-turn
    response), so prefixes are compared over every token the policy saw. Surprisal is
    ``-logprobs``. ``extra`` fields become ``RolloutBatch.extra`` (0 on padding, as the
    others). Non-finite rewards or per-token values raise, naming the field and the first
    bad row.
    """
    mask = mask.bool()
    n, width = tokens.shape
    positions = torch.arange(1, width + 1, device=tokens.device)  # [T]
    lengths = (mask * positions).amax(dim=1) if width else torch.zeros(n, dtype=torch.int64)  # [N]
    real = positions.unsqueeze(0) <= lengths.unsqueeze(1)  # [N, T]
    _require_finite("rewards", rewards, None)
    floats = {}
    fields = {"logprobs": logprobs, "sum_pi_squared": sum_pi_squared,
              **{f"extra[{name!r}]": value for name, value in (extra or {}).items()}}
    for name, value in fields.items():
        if value is not None:
            _require_finite(name, value, real)
            floats[name] = torch.where(real, value.float(), 0.0)  # [N, T]
    return RolloutBatch(
        tokens=torch.where(real, tokens.long(), PAD_TOKEN),
        lengths=lengths.long(),
        group_ids=group_ids.long(),
        rewards=rewards.float(),
        surprisal=None if logprobs is None else -floats["logprobs"],
        logprobs=floats.get("logprobs"),
        sum_pi_squared=floats.get("sum_pi_squared"),
        vocab_size=vocab_size,
        extra={name: floats[f"extra[{name!r}]"] for name in (extra or {})},
    )


def _require_finite(name: str, value: torch.Tensor, where: torch.Tensor | None) -> None:
    bad = ~torch.isfinite(value.float())
    if where is not None:
        bad &= where
    if bool(bad.any()):
        row = int(bad.reshape(bad.shape[0], -1).any(dim=1).nonzero()[0])
        shown = value[row].tolist()
        raise ValueError(f"{name} of response {row} is not finite ({shown}): "
                         "a NaN/inf reward or log-prob cannot be given credit")
