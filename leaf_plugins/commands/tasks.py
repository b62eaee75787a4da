"""``leaf tasks``: build the built-in spoken tasks, or show the examples of any task (to
check local data paths: ``leaf tasks show librisqa --split test librisqa_dir=... librispeech_dir=...``).
The ``key=value`` pairs after the task's name are its parameters (``task.options`` in a
run config), each value read as YAML as an override is, and checked as a config's are."""

from __future__ import annotations

import argparse
import time
from typing import Any

from leaf_plugins.core.config import parse_overrides
from leaf_plugins.core.errors import ConfigError
from leaf_plugins.core.parameters import configured
from leaf_plugins.core.plugins import get_host
from leaf_plugins.core.task import SPLITS

NAME = "tasks"
HELP = "Build the built-in spoken tasks, or show a task's examples and filtered-row counts."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    build = sub.add_parser("build", help="build (or find in the cache) a built-in spoken task")
    build.add_argument("target", nargs="+", metavar="NAME [key=value ...]",
                       help="spoken-qa or spoken-translation, then more of its parameters (validation_size=…)")
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--size", type=int, default=320, help="examples in all splits")
    build.add_argument("--cache-dir", help="cache root (default $LEAF_CACHE_DIR/tasks or ~/.cache/leaf-plugins/tasks)")
    show = sub.add_parser("show", help="print examples of a split: id, duration, prompt, reference")
    show.add_argument("target", nargs="+", metavar="NAME [key=value ...]",
                      help="a registered task, then its parameters right after it, "
                           "e.g. librisqa prepared=/data/librisqa")
    show.add_argument("--split", default="train", choices=SPLITS)
    show.add_argument("--limit", type=int, default=5, help="examples to print")


def run(args: argparse.Namespace) -> int:
    name, options = args.target[0], parse_pairs(args.target[1:])
    registered = get_host().tasks.get(name)
    if args.action == "build":
        if not hasattr(registered, "build"):
            raise ConfigError(f"task {name!r} reads local data and has nothing to build; "
                              f"use 'leaf tasks show {name} key=value ...'")
        options.update(seed=args.seed, size=args.size, **({"cache_dir": args.cache_dir} if args.cache_dir else {}))
        build = configured("task", name, registered, options).build()
        sizes = ", ".join(f"{split} {count}" for split, count in build.sizes.items())
        state = f"built in {build.seconds:.1f} s" if build.built else "found in the cache"
        print(f"{name}: {sum(build.sizes.values())} examples ({sizes}) {state}: {build.directory}")
        return 0
    start = time.perf_counter()
    examples = configured("task", name, registered, options).load(args.split)
    filtered: dict[str, int] = getattr(examples, "filtered", {})
    source = getattr(examples, "source", "")
    print(f"{name}/{args.split}: {len(examples)} examples{f' from {source}' if source else ''} "
          f"({time.perf_counter() - start:.1f} s)")
    detail = ", ".join(f"{reason}: {count}" for reason, count in filtered.items())
    print(f"filtered rows: {sum(filtered.values())}{f' ({detail})' if detail else ''}")
    for index in range(min(args.limit, len(examples))):
        example = examples[index]
        print(f"\n[{example.id}] {example.duration:.2f} s\n  prompt:    {example.prompt!r}\n  reference: {example.reference!r}")
    return 0


def parse_pairs(pairs: list[str]) -> dict[str, Any]:
    """``["size=8", "json=a.json,b.json"]`` -> ``{"size": 8, "json": "a.json,b.json"}``:
    each value read as YAML, as a config override's is (the task's parameters then check
    the types)."""
    for pair in pairs:
        key, separator, _ = pair.partition("=")
        if not separator or not key.strip():
            raise ConfigError(f"task parameters are key=value pairs, got {pair!r}")
    settings, errors = parse_overrides(pairs)
    if errors:  # a value that is not YAML
        raise ConfigError("; ".join(errors))
    return {key.strip(): value for key, value, _ in settings}
