"""Training: the policy loss (and, as it grows, rollout, LoRA and the trainer loop)."""
