"""A stage plugin for runs on several processes (``plugins: [fault_plugin]``, with this
directory on ``PYTHONPATH``), written as a package outside the repository would be:

* its ``rollout`` wrapper cuts every response of the step's first prompt to one token
  (a policy that ends at once), on whichever process samples that prompt;
* its ``score_rollouts`` scores the share of vowels in each response (a reward the tiny
  random models can improve on);
* with ``LEAF_TEST_FAIL_RANK=r`` and ``LEAF_TEST_FAIL_STEP=s`` in the environment, its
  ``score_rollouts`` raises on process r at step s;
* with ``LEAF_TEST_GROUP_IDS=local`` its rollout numbers its groups 0…P−1 on every
  process, and with ``LEAF_TEST_EXTRA_FIELD=r`` it adds a per-token field on process r
  only: the two mistakes the gather refuses.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from leaf_plugins import hookimpl


@hookimpl(wrapper=True)
def rollout(context):
    result = yield
    batch = result.batch
    if context.first_prompt == 0:
        first = result.prompt_index == 0  # [N] the step's first prompt's responses
        lengths = torch.where(first, torch.ones_like(batch.lengths), batch.lengths)
        real = torch.arange(batch.width).unsqueeze(0) < lengths.unsqueeze(1)  # [N, T]
        fields = {name: torch.where(real, getattr(batch, name), 0.0) for name in ("surprisal", "logprobs",
                                                                               "sum_pi_squared")
                  if getattr(batch, name) is not None}
        batch = dataclasses.replace(batch, tokens=torch.where(real, batch.tokens, -1), lengths=lengths, **fields)
        texts = [context.loaded.tokenizer.decode(batch.tokens[row, :1].tolist(), skip_special_tokens=True)
                 if bool(first[row]) else text for row, text in enumerate(result.texts)]
        result = dataclasses.replace(result, batch=batch, texts=texts)
    if os.environ.get("LEAF_TEST_GROUP_IDS") == "local":
        result = dataclasses.replace(result, batch=dataclasses.replace(batch, group_ids=result.prompt_index.clone()))
    if os.environ.get("LEAF_TEST_EXTRA_FIELD") == os.environ.get("RANK", "0"):
        extra = {**result.batch.extra, "confidence": torch.zeros(result.batch.tokens.shape)}
        result = dataclasses.replace(result, batch=dataclasses.replace(result.batch, extra=extra))
    return result


@hookimpl
def score_rollouts(context, rollout):
    if (os.environ.get("LEAF_TEST_FAIL_RANK") == os.environ.get("RANK", "0")
            and str(context.step) == os.environ.get("LEAF_TEST_FAIL_STEP")):
        raise RuntimeError(f"the scorer's service is unreachable from process {os.environ.get('RANK', '0')}")
    return torch.tensor([sum(c in "aeiou" for c in text) / max(len(text), 1) for text in rollout.texts])
