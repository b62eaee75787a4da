"""Analyses of rollouts: forkability of LEAF boundaries (``forkability``), its tables and plots."""
