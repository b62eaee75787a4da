"""leaf-plugins estimators inside other RL frameworks.

``leaf_plugins.integrations.trl`` (extra ``[trl]``): ``LeafGRPOConfig`` and ``LeafGRPOTrainer``,
TRL's GRPO trainer with per-token advantages from any registered estimator.
``leaf_plugins.integrations.verl`` (extra ``[verl]``): every registered estimator as a verl
advantage estimator (``algorithm.adv_estimator=leaf``). See docs/integrations.md.
"""
