"""TRL's GRPO trainer with per-token advantages from any registered leaf-plugins estimator.

``LeafGRPOTrainer`` is TRL's ``GRPOTrainer`` (generation, rewards, the clipped loss,
accelerate/DeepSpeed, vLLM) with one change: after TRL has generated and scored a batch,
the advantages that reach the loss are ``[B, T]`` per-token advantages from
``leaf_plugins.estimate`` on the completion ids (EOS included, right-padded as TRL pads
them), the weighted sum of the reward functions, groups of ``num_generations`` (gathered
from every process, so a group split across processes is estimated whole) and the
policy's own per-token log-probs at the generation weights (surprisal = -log-prob),
with Σ_v π(v)² from the same fused LM head for the variance-aware estimators. Only what
the estimator requires (``Engine.requires``) is computed: for ``grpo`` no extra forward
pass runs, for ``leaf`` one without Σπ².
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass, field
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.grpo_trainer import add_fused_lm_head, is_peft_model

from leaf_plugins.core.batch import PER_TOKEN_FIELDS
from leaf_plugins.core.engine import Engine
from leaf_plugins.core.errors import ConfigError
from leaf_plugins.integrations.padded import padded_batch

__all__ = ["LeafGRPOConfig", "LeafGRPOTrainer"]

FORWARD_KEYS = (
    "pixel_values", "image_grid_thw", "pixel_attention_mask", "spatial_shapes", "image_sizes",
    "token_type_ids", "mm_token_type_ids", "image_position_ids",
)
"""Multimodal inputs TRL returns from generation and passes back to the model's forward."""


@dataclass
class LeafGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus the leaf-plugins estimator that computes the advantages.

    TRL's own advantage options (``scale_rewards``, ``multi_objective_aggregation``) do not
    apply: the estimator normalises (``estimator_params``, e.g. ``eps=1e-4`` for TRL's
    epsilon with ``estimator="grpo"``).
    """

    estimator: str = field(default="leaf", metadata={"help": "A registered leaf-plugins estimator name."})
    estimator_params: dict[str, Any] | None = field(
        default=None, metadata={"help": "Estimator parameters, e.g. {'fork_budget': 2}."}
    )
    estimator_stages: dict[str, str] | None = field(
        default=None, metadata={"help": "Stage overrides, e.g. {'select_boundaries': 'collision'}."}
    )


class LeafGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose loss uses per-token advantages from a leaf-plugins estimator.

    Use it exactly like TRL's class, with ``args=LeafGRPOConfig(..., estimator="leaf",
    estimator_params={"fork_budget": 2})``. When the estimator requires them, one extra
    no-grad forward pass per generation batch scores the completions with the policy
    (TRL's fused LM head, no ``[B, T, V]`` logits kept) for the log-probs (surprisal) and,
    only for an estimator that reads it, Σπ².
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        if not isinstance(config, LeafGRPOConfig):
            raise TypeError(f"LeafGRPOTrainer needs args=LeafGRPOConfig(...), got {type(config).__name__}: "
                            "LeafGRPOConfig adds the estimator, estimator_params and estimator_stages fields")
        if config.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError("LeafGRPOTrainer gives the estimator the weighted sum of the reward functions; "
                             f"multi_objective_aggregation={config.multi_objective_aggregation!r} is not supported")
        self.engine = Engine(config.estimator, config.estimator_params or {}, config.estimator_stages or None)
        unknown = [name for name in self.engine.requires if name not in PER_TOKEN_FIELDS]
        if unknown:
            raise ConfigError(f"estimator {config.estimator!r} requires the per-token field(s) {', '.join(unknown)}, "
                              f"which LeafGRPOTrainer does not compute (it computes {', '.join(PER_TOKEN_FIELDS)})")
        super().__init__(*args, **kwargs)
        self._rewards_per_func: torch.Tensor | None = None
        self._sum_sq_record: list[torch.Tensor] | None = None
        self._add_scoring_head()

    def _add_scoring_head(self) -> None:
        """Route the policy's fused-head calls made while ``_sum_sq_record`` is a list to a
        fused head that also returns log Σ_v π(v)², and record that field; every other
        call (loss, reference, generation) keeps TRL's own head."""
        base = self.model.get_base_model() if is_peft_model(self.model) else self.model
        trl_forward = base.forward
        vars(base).pop("forward", None)  # back to the class's forward, which add_fused_lm_head wraps again
        add_fused_lm_head(base, temperature=self.temperature, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32,
                          outputs=("log_probs", "log_sum_sq_probs"))
        scoring_forward = base.forward

        @functools.wraps(type(base).forward)
        def forward(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            record = self._sum_sq_record
            if record is None or not kwargs.get("fused_lm_head"):
                return trl_forward(*args, **kwargs)
            outputs = scoring_forward(*args, **kwargs)
            record.append(outputs.log_sum_sq_probs)  # [b, L-1]
            return outputs

        base.forward = types.MethodType(forward, base)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # type: ignore[no-untyped-def]
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rewards_per_func = rewards_per_func  # [B_global, F], gathered from every process
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        training = self.model.training
        group_size = self.num_generations if training else self.num_generations_eval
        chunk = self.args.per_device_train_batch_size if training else self.args.per_device_eval_batch_size
        requires = set(self.engine.requires)
        logprobs = sum_pi_squared = None
        if requires & {"surprisal", "logprobs", "sum_pi_squared"}:
            logprobs, sum_pi_squared = self._score_completions(output, chunk, "sum_pi_squared" in requires)  # [B, C]
        local_rows, local_width = output["completion_ids"].shape
        ids, mask, logprobs, sum_pi_squared = (
            None if value is None else self.accelerator.gather(self.accelerator.pad_across_processes(value, dim=1))
            for value in (output["completion_ids"], output["completion_mask"], logprobs, sum_pi_squared)
        )  # [B_global, C_max] each
        output["advantages"] = self._advantages(ids, mask, logprobs, sum_pi_squared, group_size)[
            self.accelerator.process_index * local_rows:(self.accelerator.process_index + 1) * local_rows, :local_width
        ]  # [B, C]
        return output

    def _score_completions(self, output: dict[str, Any], chunk: int,
                           sum_squares: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[B, C]`` log π_old of each completion token and, with ``sum_squares``, ``[B, C]``
        Σ_v π_old(v)² (else None), from one no-grad pass of the policy (temperature-scaled,
        as TRL's loss scores it)."""
        width = output["completion_ids"].size(1)
        self._sum_sq_record = [] if sum_squares else None
        try:
            with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
                logprobs, _, _ = self._get_per_token_logps_and_entropies(
                    self.model,
                    torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1),
                    torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1),
                    width,
                    batch_size=chunk,
                    num_images=output.get("num_images"),
                    num_tiles=output.get("num_tiles"),
                    **{key: output[key] for key in FORWARD_KEYS if key in output},
                )
            record = self._sum_sq_record
            sum_pi_squared = None if record is None else torch.cat([part[:, -width:] for part in record]).float().exp()
        finally:
            self._sum_sq_record = None
        return logprobs.float(), sum_pi_squared  # [B, C], [B, C] or None

    def _advantages(
        self,
        ids: torch.Tensor,  # [N, T]
        mask: torch.Tensor,  # [N, T]
        logprobs: torch.Tensor | None,  # [N, T], None when the estimator reads no log-prob
        sum_pi_squared: torch.Tensor | None,  # [N, T], None when the estimator does not read it
        group_size: int,
    ) -> torch.Tensor:
        """``[N, T]`` advantages of the gathered generation batch; 0 for a completion that no
        reward function scored (TRL's rule), which also leaves its group's baseline."""
        rewards_per_func = self._rewards_per_func  # [N, F]
        assert rewards_per_func is not None
        weights = self.reward_weights.to(rewards_per_func.device)  # [F]
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)  # [N]
        scored = ~torch.isnan(rewards_per_func).all(dim=1)  # [N]
        group_ids = torch.arange(ids.size(0), device=ids.device) // group_size  # [N]
        batch = padded_batch(ids, mask, rewards, group_ids, logprobs, sum_pi_squared)
        if bool(scored.all()):
            return self.engine.estimate(batch).advantages.float()
        rows = scored.nonzero().squeeze(1)  # [M]
        advantages = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
        advantages[rows] = self.engine.estimate(batch.select(rows)).advantages.float()
        return advantages
