"""How the step's token losses are summed into one number: weights per token that do not
depend on how the step is cut into micro-batches or processes.

Each aggregation is a normaliser over the *whole step* (every process's rows), so a
micro-batch contributes its weighted sum and the step's gradient is the sum of the
micro-batches' gradients, whatever their number or sizes:

* ``token_mean`` (the paper's Eq. 1, default): every response token of the step weighs
  ``1 / (response tokens of the step)``;
* ``sequence_mean`` (the original GRPO, GSPO): each response's token mean, then the mean
  over the step's responses: ``1 / (|o_i| · responses)``;
* ``sequence_sum``: each response's token sum, then the mean over the step's responses:
  ``1 / responses``;
* ``constant`` (Dr. GRPO): ``1 / (responses · max_new_tokens)``, a normaliser that does
  not depend on the lengths sampled.

verl's names for the four (its ``loss_agg_mode``), ``token-mean``, ``seq-mean-token-mean``,
``seq-mean-token-sum`` and ``seq-mean-token-sum-norm``, are accepted as well (a
``max_new_tokens`` normaliser being verl's default ``loss_scale_factor`` of the last).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["LOSS_AGGREGATIONS", "VERL_AGGREGATIONS", "StepTotals", "token_weights"]

VERL_AGGREGATIONS = {"token-mean": "token_mean", "seq-mean-token-mean": "sequence_mean",
                     "seq-mean-token-sum": "sequence_sum", "seq-mean-token-sum-norm": "constant"}
"""verl's ``loss_agg_mode`` names -> ours."""

LOSS_AGGREGATIONS = ("token_mean", "sequence_mean", "sequence_sum", "constant", *VERL_AGGREGATIONS)


@dataclass(frozen=True)
class StepTotals:
    """Counts over the whole step (all processes)."""

    tokens: int  # response tokens
    sequences: int  # responses


def token_weights(lengths: torch.Tensor, width: int, totals: StepTotals, aggregation: str,
                  max_new_tokens: int) -> torch.Tensor:
    """``[n, width]`` float32 weight of each response token of some of the step's rows
    (0 on padding); summed over all rows of the step they give 1 for ``token_mean`` and
    ``sequence_mean``.

    :param lengths: ``[n]`` response lengths of these rows.
    """
    if aggregation not in LOSS_AGGREGATIONS:
        raise ValueError(f"loss_aggregation must be one of {LOSS_AGGREGATIONS}, got {aggregation!r}")
    aggregation = VERL_AGGREGATIONS.get(aggregation, aggregation)
    mask = (torch.arange(width, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)).float()  # [n, width]
    if aggregation == "token_mean":
        return mask / max(totals.tokens, 1)
    if aggregation == "sequence_mean":
        return mask / (lengths.clamp(min=1).float().unsqueeze(1) * max(totals.sequences, 1))
    if aggregation == "sequence_sum":
        return mask / max(totals.sequences, 1)
    return mask / (max(totals.sequences, 1) * max_new_tokens)
