"""Under 2 processes (gloo, CPU): a tiny backbone with LoRA, its decoder layers sharded
with FSDP2, generates the same responses as before sharding, on both rollout backends;
``gathered_for_generation`` all-gathers the weights once per rollout instead of per
layer and token (``generate``), and the static loop gathers them once itself even
without it; with the root sharded too (accelerate's wrapping), the rollout and the
teacher-forced pass still give the unsharded values, and its gradient (the shared-prefix
pass: two forward calls before one backward) the unsharded gradient.

Usage: python -m torch.distributed.run --nproc_per_node 2 fsdp_generation.py OUTPUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard import _fsdp_param_group

from leaf_plugins import get_host
from leaf_plugins.core.stages import RolloutRequest
from leaf_plugins.rollout.generation_weights import gathered_for_generation
from leaf_plugins.training.lora import attach_lora
from leaf_plugins.rollout.prompt_embedding import language_model_of
from leaf_plugins.rollout.sampling import sample_responses
from leaf_plugins.training.teacher_forcing import response_logprobs


def main(output: Path) -> None:
    dist.init_process_group("gloo")
    backbone = get_host().backbones.get("tiny-qwen2-audio")

    def build():
        torch.manual_seed(0)
        loaded = backbone.load(seed=0)
        return loaded, attach_lora(loaded, rank=4, alpha=8, dropout=0.0).eval()

    loaded, model = build()
    rng = np.random.default_rng(0)
    inputs = backbone.build_inputs(loaded, ["<|audio|> translate this"] * 2,
                                   [(rng.standard_normal(16000) * 0.1).astype(np.float32) for _ in range(2)])

    def rollout(backend):
        torch.manual_seed(1)
        return sample_responses(RolloutRequest(model, loaded, inputs, group_size=2, max_new_tokens=6), backend=backend)

    backends = ("generate", "static")
    unsharded = {backend: rollout(backend) for backend in backends}

    def forced():
        batch = unsharded["generate"].batch
        with torch.no_grad():
            return response_logprobs(model, inputs, batch.tokens, batch.lengths, unsharded["generate"].prompt_index)

    unsharded_forced = forced()

    def gradient():
        """The LoRA gradient of a weighted sum of the teacher-forced log π (the shared-prefix
        pass: two forward calls before one backward), gathered to full tensors."""
        batch = unsharded["generate"].batch
        model.train()
        model.zero_grad()
        values = response_logprobs(model, inputs, batch.tokens, batch.lengths, unsharded["generate"].prompt_index)
        (values * torch.linspace(0.5, 2.0, values.numel()).view(values.shape)).sum().backward()
        model.eval()
        return {name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
                for name, p in model.named_parameters() if p.grad is not None}

    unsharded_gradient = gradient()
    for layer in language_model_of(model).layers:
        fully_shard(layer)
    gathers = []
    original = _fsdp_param_group.foreach_all_gather

    def counting(*args, **kwargs):
        gathers.append(1)
        return original(*args, **kwargs)

    _fsdp_param_group.foreach_all_gather = counting
    results = {}
    for backend in backends:
        gathers.clear()
        with gathered_for_generation(model):
            once = rollout(backend)
        gathered = len(gathers)
        gathers.clear()
        per_forward = rollout(backend)
        results[backend] = {"once": once.batch, "per_forward": per_forward.batch, "gathers_once": gathered,
                            "gathers_per_forward": len(gathers), "unsharded": unsharded[backend].batch}
    loaded, model = build()  # FSDP2 cannot wrap the root after a forward: a fresh copy, root wrapped too
    for layer in language_model_of(model).layers:
        fully_shard(layer)
    fully_shard(model)
    for backend in backends:
        with gathered_for_generation(model):
            results[backend]["root_sharded"] = rollout(backend).batch
    torch.save({"backends": results, "forced": forced(), "unsharded_forced": unsharded_forced,
                "gradient": gradient(), "unsharded_gradient": unsharded_gradient,
                "sharded_modules": len(language_model_of(model).layers)},
               output / f"rank{dist.get_rank()}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
