"""Estimators timed alternately on one synthetic batch: ratios to GRPO on a busy machine.

``leaf bench speed`` runs each estimator's rounds back to back, so on a machine shared
with other jobs a burst of load lands on one estimator and not on the other. Here every
round calls each estimator once, in turn, and the process's CPU time is measured as
well as the wall-clock time (CPU time is what the call costs, whatever else runs).

    python benchmarks/alternate_speed.py --size 64x8x1024 grpo tree_otb tree_otb:tree_weight=1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from batches import SIZES, synthetic_batch  # noqa: E402

import leaf_plugins as lp  # noqa: E402
from leaf_plugins.bench.estimator_choice import parse_choice  # noqa: E402
from leaf_plugins.core.errors import ConfigError  # noqa: E402


def engine_of(spec: str) -> lp.Engine:
    """``name`` or ``name:param=value,param=value`` (``leaf bench``'s ``--estimator`` format)."""
    try:
        return parse_choice(spec).engine()
    except ConfigError as error:
        raise SystemExit(str(error)) from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("estimators", nargs="+", help="name or name:param=value,... (the first is the reference)")
    parser.add_argument("--size", default="64x8x1024", choices=list(SIZES))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batch = synthetic_batch(*SIZES[args.size])
    engines = {spec: engine_of(spec) for spec in args.estimators}
    for engine in engines.values():
        engine.estimate(batch)  # warm up (scratch buffers, caches)
    cpu = {spec: [] for spec in engines}
    wall = {spec: [] for spec in engines}
    for _ in range(args.rounds):
        for spec, engine in engines.items():
            started_cpu, started_wall = time.process_time(), time.perf_counter()
            engine.estimate(batch)
            cpu[spec].append(time.process_time() - started_cpu)
            wall[spec].append(time.perf_counter() - started_wall)
    reference = args.estimators[0]
    print(f"{args.size}, {args.threads} threads, {args.rounds} alternating rounds; medians")
    print("| estimator | CPU ms | × first (CPU) | wall ms | × first (wall) |\n|---|---:|---:|---:|---:|")
    for spec in engines:
        c, w = statistics.median(cpu[spec]), statistics.median(wall[spec])
        print(f"| {spec} | {c * 1e3:.1f} | {c / statistics.median(cpu[reference]):.1f} | {w * 1e3:.1f} | "
              f"{w / statistics.median(wall[reference]):.1f} |")


if __name__ == "__main__":
    main()
