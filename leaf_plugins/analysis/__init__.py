"""Analyses of rollouts: forkability of LEAF boundaries, rollout logs, plots."""
