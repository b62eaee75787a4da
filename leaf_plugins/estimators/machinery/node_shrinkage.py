"""Empirical-Bayes shrinkage of node values, learnt from the other groups of the batch.

A retained node ``v`` with ``n_v`` members and mean reward ``m_v`` estimates its true
value ``μ_v`` with noise of variance ``σ² / n_v`` (``σ²`` the spread of one reward about
its node's value). If node values scatter about their parent's with variance ``τ²``, the
posterior mean of ``μ_v`` weighs the parent by ``s = σ² / τ²`` pseudo-responses: the
``shrink`` of ``tree_baselines``. Both moments come from the *other* groups (so that a
group's baseline stays free of its own rewards):

* ``σ² = Σ_v Σ_{i∈v} (r_i − m_v)² / Σ_v (n_v − 1)`` (pooled within-node variance);
* ``τ² = max(0, Σ_v [(m_v − m_p(v))² − σ² (1/n_v − 1/n_p(v))] / M)`` over the ``M``
  nodes, ``p(v)`` the node's parent (the group for a first node); ``σ² (1/n_v − 1/n_p)``
  is the noise part of ``(m_v − m_p)²`` since ``v``'s members are among ``p``'s.

Where the others have no node with two members, or no spread, the fixed ``fallback``
weight is used; where ``τ² = 0`` (nodes no more different than noise) ``s = MAX_SHRINK``.
"""

from __future__ import annotations

import torch

from leaf_plugins.core.batch import RolloutBatch, group_sum
from leaf_plugins.core.tree import Nodes
from leaf_plugins.estimators.machinery.group_stats import group_std, per_response, pooled_std, root_values
from leaf_plugins.estimators.parameters import TreeRLOOParams

__all__ = ["auto_shrink", "node_shrink", "group_scale", "MAX_SHRINK", "FALLBACK_SHRINK"]

MAX_SHRINK = 1e6
"""The prior weight where node values vary no more than noise: the parent's value, in effect."""

FALLBACK_SHRINK = 4.0
"""``shrink: auto``'s weight where the other groups say nothing (``shrink``'s default)."""


def node_shrink(batch: RolloutBatch, nodes: Nodes, params: TreeRLOOParams) -> float | torch.Tensor:
    """The ``shrink`` of ``params``: its number, or ``[N]`` learnt weights for ``"auto"``."""
    if params.shrink == "auto":
        return auto_shrink(batch, nodes, FALLBACK_SHRINK)
    return float(params.shrink)


@torch.inference_mode()
def auto_shrink(batch: RolloutBatch, nodes: Nodes, fallback: float) -> torch.Tensor:
    """``[N]`` float64 prior weight ``s`` of each response's group (see the module)."""
    layout = batch.groups
    fixed = torch.full((batch.size,), float(fallback), dtype=torch.float64, device=batch.device)  # [N]
    if not nodes.count or layout.count < 2:
        return fixed
    rewards = batch.rewards.double()  # [N]
    path = nodes.path  # [N, D]
    on_path = path >= 0
    node = path.clamp(min=0)
    members = nodes.size.double().take(node)  # [N, D] n_v of each path entry
    means = nodes.value.double().take(node)  # [N, D] m_v
    group_size = per_response(layout.sizes, layout).double().unsqueeze(1)  # [N, 1]
    group_mean = per_response(group_sum(rewards, layout), layout).unsqueeze(1) / group_size  # [N, 1]
    parent_members = torch.cat([group_size, members[:, :-1]], dim=1)  # [N, D] n_p(v)
    parent_means = torch.cat([group_mean, means[:, :-1]], dim=1)  # [N, D] m_p(v)
    weight = on_path.double() / members  # [N, D] 1/n_v: a node's members sum to one node
    per_entry = torch.stack([
        (rewards.unsqueeze(1) - means).square(),  # within-node squares, summed over members
        (members - 1) * weight,  # n_v − 1 per node
        (means - parent_means).square() * weight,  # (m_v − m_p)² per node
        (1 / members - 1 / parent_members) * weight,  # noise share of that square, per σ²
        weight,  # nodes
    ]).mul_(on_path).sum(dim=2)  # [5, N]
    per_group = group_sum(per_entry.T, layout)  # [G, 5]
    others = per_response(per_group.sum(dim=0) - per_group, layout)  # [N, 5] every group but this one
    within, dof, squares, noise, count = others.unbind(dim=1)
    sigma2 = within / dof.clamp(min=1e-300)  # [N]
    tau2 = ((squares - sigma2 * noise) / count.clamp(min=1e-300)).clamp(min=0)  # [N]
    learnt = torch.where(tau2 > 0, sigma2 / tau2.clamp(min=1e-300), MAX_SHRINK).clamp(max=MAX_SHRINK)
    usable = (dof > 0) & (count > 0) & (sigma2 > 0)
    return torch.where(usable, learnt, fixed)


def group_scale(batch: RolloutBatch, params: TreeRLOOParams) -> torch.Tensor:
    """``[G]`` float64 divisor of the advantages: GRPO's ``max(std, std_floor) + eps``
    (sample std of the group's rewards) for ``scale="group_std"``; the same with the
    batch's within-group std pooled over its groups, one divisor for every group, for
    ``"batch_std"``; 1 for ``"none"``.

    ``batch_std`` keeps the advantages in units of the batch's reward spread, as GRPO's
    are, without weighing one group against another: the batch gradient keeps its
    direction, only its length changes from batch to batch. (With advantages in reward
    units, their size falls as a group's rewards draw together during training, and an
    optimizer with a long memory of past gradient sizes, as Adam's second moment, takes
    ever smaller steps.)

    Where ``max(std, std_floor)`` is 0 (an all-equal group; under ``batch_std``, a batch
    of all-equal groups) the divisor is ``inf``: the advantages are 0, as GRPO's, not
    ``(r − b) / eps`` for a baseline ``b`` that is not the group's mean (``tree_otb``'s)."""
    if params.scale == "none":
        return torch.ones(batch.groups.count, dtype=torch.float64, device=batch.device)
    rewards = batch.rewards.double()
    means = root_values(batch).double()  # [G]
    if params.scale == "batch_std":
        spread = pooled_std(rewards, batch.groups, means).clamp(min=params.std_floor).expand(batch.groups.count)
    else:
        spread = group_std(rewards, batch.groups, means).clamp(min=params.std_floor)  # [G]
    return torch.where(spread > 0, spread + params.eps, torch.inf)
