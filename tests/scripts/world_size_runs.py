"""Under ``torchrun`` / ``accelerate launch`` (or as one plain process): short runs of
every built-in estimator, a run whose poisoned groups are dropped, a run of several
clipped updates per rollout on a schedule ("updates"), one of two prompts a
micro-batch ("micro_batches") and one of the current recipes' settings at once
("recipe": dynamic sampling over flat groups, clip-higher, GSPO's sequence ratio, k2 in
the reward, an entropy bonus, TIS, the overlong penalty, a reward list), on 7 prompts a
step (uneven shares on 2 and 3 processes) with LoRA dropout on; rank 0 saves each run's
metrics, its rollout log and its first and final adapter, every rank its adapter's checksum.

Usage: torchrun --nproc_per_node N world_size_runs.py OUTPUT_DIR [ESTIMATOR ...]
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from leaf_plugins.training.config import EstimatorConfig, LoraSettings, OptimConfig, RolloutConfig, TrainConfig  # noqa: E402
from leaf_plugins.training.lora import lora_state  # noqa: E402
from leaf_plugins.training.trainer import Trainer  # noqa: E402
from test_training_finite import poisoned_examples, poisoned_host  # noqa: E402

ESTIMATORS = ("grpo", "leaf", "collision", "full_tree", "otb", "tree_rloo", "tree_otb")
POISONED = {2, 8, 5}  # examples whose reward is NaN in the run "dropped": step 1 samples 2 and 8 at its last two
# positions (the whole share of the third of 3 processes), step 2 samples 5 at its last
FLAT = set(range(0, 16, 2))  # examples whose rewards are all 0 in the run "recipe": dynamic sampling samples more


def settings(output: Path, estimator: str, reward: str = "vowel_share") -> TrainConfig:
    return TrainConfig(
        output_dir=str(output), seed=3, steps=2, checkpoint_every=2, log_rollouts=True, reward=reward, threads=1,
        estimator=EstimatorConfig(name=estimator),
        rollout=RolloutConfig(group_size=4, prompts_per_step=7, max_new_tokens=8),
        optim=OptimConfig(learning_rate=3e-2, micro_batch_prompts=1),
        lora=LoraSettings(rank=8, alpha=16, dropout=0.1),  # dropout on: its masks must not depend on the shares
    )


def main(output: Path, estimators: list[str]) -> None:
    runs = {name: settings(output / name, name) for name in estimators}
    if "updates" in estimators:  # two passes of two mini-batches, clipped, on a warmup and cosine schedule
        runs["updates"] = settings(output / "updates", "leaf")
        runs["updates"].optim = OptimConfig(learning_rate=3e-2, micro_batch_prompts=1, updates_per_rollout=2,
                                            mini_batches=2, max_grad_norm=0.5, lr_schedule="cosine",
                                            warmup_steps=1, weight_decay=0.01)
    if "micro_batches" in estimators:  # two prompts a micro-batch, cut at other places by the shares: keyed dropout
        runs["micro_batches"] = settings(output / "micro_batches", "leaf")
        runs["micro_batches"].optim = OptimConfig(learning_rate=3e-2, micro_batch_prompts=2)
    if "recipe" in estimators:  # rounds of prompts keyed like the first: every process samples what one does
        runs["recipe"] = dataclasses.replace(
            settings(output / "recipe", "leaf", "flat_on_poison"), reward=[{"name": "flat_on_poison", "weight": 2.0}],
            rollout=RolloutConfig(group_size=4, prompts_per_step=7, max_new_tokens=8, dynamic_sampling=True,
                                  max_sampling_rounds=3, overlong="penalty", overlong_buffer=4),
            optim=OptimConfig(learning_rate=3e-2, micro_batch_prompts=1, clip_epsilon_high=0.28,
                              importance_sampling_level="sequence", kl_in="reward", kl_estimator="k2",
                              entropy_coefficient=0.001, rollout_correction="tis"))
    if "dropped" in estimators:
        runs["dropped"] = dataclasses.replace(settings(output / "dropped", "leaf", "nan_on_poison"),
                                              nonfinite_rewards="drop_group")
    for name, config in runs.items():
        poisoned = POISONED if name == "dropped" else FLAT if name == "recipe" else set()
        trainer = Trainer(config, poisoned_examples(poisoned), host=poisoned_host())
        start = lora_state(trainer.policy)
        trainer.run()
        state = lora_state(trainer.policy)
        rank = trainer.accelerator.process_index
        checksum = sum(float(value.double().sum()) for value in state.values())
        (output / name / f"checksum-{rank}.json").write_text(json.dumps(checksum))
        if trainer.accelerator.is_main_process:
            torch.save({"start": start, "end": state}, output / name / "adapter.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:] or [*ESTIMATORS, "dropped", "updates", "micro_batches", "recipe"])
