"""One estimator at another git revision and in the working tree, called in turn in one process.

    python benchmarks/compare_revision.py HEAD~1 tree_otb --size 64x8x1024

On a shared machine an estimator's time moves by tens of percent from one run to the
next, more than most code changes gain. Here the other revision's package (``git archive``
into a temporary directory, imported under another name) and the working tree's are
called alternately on the same synthetic batch, and the ratio is taken call by call: a
slow spell hits both sides of a pair. It prints both medians, the median of the per-call
ratios with a 95% bootstrap interval, and how far the two sides' advantages differ.

Both sides run the estimator's three stages directly (boundaries, nodes, advantages),
found through the estimator modules' own ``register_estimators`` hooks; ``NAME`` may carry
parameters as ``NAME:P=V,...`` (``leaf bench``'s ``--estimator`` format), which both
revisions must accept.
"""

from __future__ import annotations

import argparse
import importlib
import io
import pkgutil
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

sys.path.insert(0, str(Path(__file__).parent))
from batches import SIZES, synthetic_batch  # noqa: E402

import leaf_plugins as lp  # noqa: E402
from leaf_plugins.bench.estimator_choice import parse_choice  # noqa: E402
from leaf_plugins.core.errors import ConfigError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def package_at(revision: str, into: Path) -> ModuleType:
    """The ``leaf_plugins`` package of ``revision``, extracted under ``into`` and imported as
    ``leaf_plugins_at_<revision>`` (every ``leaf_plugins`` name in its sources renamed)."""
    name = "leaf_plugins_at_" + re.sub(r"\W", "_", revision)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "leaf_plugins"],
                             capture_output=True, check=False)
    if archive.returncode:
        raise SystemExit(f"git archive {revision}: {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    package = into / name
    (into / "leaf_plugins").rename(package)
    for source in package.rglob("*.py"):
        source.write_text(re.sub(r"\bleaf_plugins\b", name, source.read_text()))
    sys.path.insert(0, str(into))
    return importlib.import_module(name)


def estimator_in(package: ModuleType, name: str) -> object:
    """The estimator ``package``'s own modules register as ``name``."""
    found: dict[str, object] = {}
    estimators = importlib.import_module(f"{package.__name__}.estimators")
    for module_info in pkgutil.iter_modules(estimators.__path__):
        module = importlib.import_module(f"{estimators.__name__}.{module_info.name}")
        hook = getattr(module, "register_estimators", None)
        if callable(hook):
            hook(register=lambda registered, estimator: found.setdefault(registered, estimator))
    if name not in found:
        raise SystemExit(f"{package.__name__} registers no estimator {name!r} (it has {', '.join(sorted(found))})")
    return found[name]


def stage_caller(package: ModuleType, name: str, params: dict, source: lp.RolloutBatch) -> Callable[[], torch.Tensor]:
    """A call of estimator ``name``'s three stages in ``package`` on a copy of ``source``
    built with that package's ``RolloutBatch``."""
    estimator = estimator_in(package, name)
    settings = estimator.parameters(**params)
    batch = package.RolloutBatch(source.tokens, source.lengths, source.group_ids, source.rewards,
                                 surprisal=source.surprisal, logprobs=source.logprobs,
                                 sum_pi_squared=source.sum_pi_squared, vocab_size=source.vocab_size)

    def call() -> torch.Tensor:
        try:
            boundaries = estimator.select_boundaries(batch=batch, params=settings)
            nodes = estimator.retain_nodes(batch=batch, boundaries=boundaries, params=settings)
            return estimator.compute_advantages(batch=batch, nodes=nodes, params=settings)
        finally:
            getattr(batch, "clear_call_cache", lambda: None)()

    return call


def median_interval(values: list[float], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the median of ``values``."""
    generator = torch.Generator().manual_seed(seed)
    samples = torch.tensor(values, dtype=torch.float64)
    picks = torch.randint(0, len(values), (draws, len(values)), generator=generator)
    medians = samples[picks].median(dim=1).values.sort().values
    return float(medians[int(0.025 * draws)]), float(medians[int(0.975 * draws) - 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision", help="a git revision of this repository (HEAD~1, a commit, a tag)")
    parser.add_argument("estimator", help="NAME or NAME:P=V,... of a built-in estimator")
    parser.add_argument("--size", default="64x8x1024", choices=list(SIZES))
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2")
    torch.set_num_threads(args.threads)
    try:
        choice = parse_choice(args.estimator)
    except ConfigError as error:
        raise SystemExit(str(error)) from None
    source = synthetic_batch(*SIZES[args.size])
    with tempfile.TemporaryDirectory() as scratch_dir:
        sides = {args.revision: stage_caller(package_at(args.revision, Path(scratch_dir)), choice.name,
                                             dict(choice.params), source),
                 "working tree": stage_caller(lp, choice.name, dict(choice.params), source)}
        old, new = (call() for call in sides.values())
        difference = float((old - new).abs().max()) / max(float(old.abs().max()), 1e-30)
        for call in sides.values():  # warm up: scratch buffers, caches
            call()
        times: dict[str, list[float]] = {label: [] for label in sides}
        for _ in range(args.rounds):
            for label, call in sides.items():
                started = time.perf_counter()
                call()
                times[label].append(time.perf_counter() - started)
    ratios = [new_time / old_time for old_time, new_time in zip(*times.values())]
    low, high = median_interval(ratios)
    print(f"{choice.label} on {args.size}, {args.threads} threads, {args.rounds} rounds, called in turn")
    print("| code | median ms |\n|---|---:|")
    for label, measured in times.items():
        print(f"| {label} | {statistics.median(measured) * 1e3:.2f} |")
    print(f"working tree / {args.revision}, per call: median {statistics.median(ratios):.3f} "
          f"(95% interval {low:.3f}–{high:.3f})")
    print(f"largest difference of the advantages: {difference:.1e} of their size")


if __name__ == "__main__":
    main()
