"""What it costs every process to see the whole step: ``whole_step.gather_rollout`` of
each process's share of a step, timed under ``torchrun`` (gloo on the CPU, NCCL on GPUs).

    torchrun --nproc_per_node 3 benchmarks/gather_cost.py --prompts 6 --group-size 8 --tokens 200

Each process holds its share of ``prompts`` (``prompt_share``) with K responses of
``tokens`` tokens, every per-token field set and one text per response; rank 0 prints
the median and the spread of ``--rounds`` gathers, and the bytes each process receives.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from leaf_plugins.core.batch import RolloutBatch
from leaf_plugins.core.stages import Rollout
from leaf_plugins.training.whole_step import gather_rollout, prompt_share


def share_rollout(share: range, group_size: int, tokens: int) -> tuple[Rollout, torch.Tensor]:
    """A synthetic rollout of the prompts ``share``: random tokens of random lengths."""
    generator = torch.Generator().manual_seed(share.start)
    rows = len(share) * group_size
    lengths = torch.randint(tokens // 2, tokens + 1, (rows,), generator=generator)  # [n]
    real = torch.arange(tokens).unsqueeze(0) < lengths.unsqueeze(1)  # [n, T]
    values = torch.rand(rows, tokens, generator=generator) * real  # [n, T]
    batch = RolloutBatch(tokens=torch.where(real, torch.randint(0, 150_000, (rows, tokens), generator=generator), -1),
                         lengths=lengths, group_ids=torch.arange(share.start, share.stop).repeat_interleave(group_size),
                         rewards=torch.zeros(rows), surprisal=values, logprobs=-values, sum_pi_squared=values,
                         vocab_size=156_032)
    texts = ["a response of about forty words " * 8] * rows
    return Rollout(batch, torch.arange(len(share)).repeat_interleave(group_size), texts), torch.rand(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    share = prompt_share(args.prompts, rank, world)
    rollout, rewards = share_rollout(share, args.group_size, args.tokens)
    times = []
    for _ in range(args.rounds + 3):  # 3 warm-up rounds
        dist.barrier()
        started = time.perf_counter()
        whole = gather_rollout(rollout, rewards, share, device)
        times.append(time.perf_counter() - started)
    times = times[3:]
    rows, width = whole.rollout.batch.size, whole.rollout.batch.width
    received = rows * (width + 3) * 8 + rows * (1 + 3 * width) * 4  # the integer and float tables
    if rank == 0:
        print(f"{world} processes ({'NCCL' if cuda else 'gloo'}), {args.prompts} prompts x K={args.group_size} x "
              f"{args.tokens} tokens: gather median {statistics.median(times) * 1e3:.2f} ms "
              f"(min {min(times) * 1e3:.2f}, max {max(times) * 1e3:.2f}), {received / 1e6:.2f} MB of tables")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
