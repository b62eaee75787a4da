"""``leaf bench``: benchmarks (``speed``: estimator speed table)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from leaf_plugins.core.errors import ConfigError

NAME = "bench"
HELP = "Run benchmarks: 'speed' times every estimator at three batch sizes against GRPO and the reference."

SOURCE_ROOT = Path(__file__).resolve().parents[2]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    speed = sub.add_parser("speed", help="estimator speed: ratios to GRPO and to the slow reference")
    speed.add_argument("--out", type=Path, default=Path("results/speed"), help="directory for JSON, table and plot")
    speed.add_argument("--quick", action="store_true", help="skip the largest batch size")
    speed.set_defaults(bench=run_speed)


def run(args: argparse.Namespace) -> int:
    return int(args.bench(args))


def run_speed(args: argparse.Namespace) -> int:
    from leaf_plugins.bench.speed import plot_speed, read_speed_rows, speed_table

    suite = SOURCE_ROOT / "benchmarks" / "test_speed_estimators.py"
    if not suite.exists():
        raise ConfigError(f"the benchmark suite is not here ({suite}): run 'leaf bench speed' from a source checkout")
    args.out.mkdir(parents=True, exist_ok=True)
    report = args.out / "speed.json"
    command = [sys.executable, "-m", "pytest", str(suite), "--benchmark-only", f"--benchmark-json={report}", "-q",
               "-p", "no:cacheprovider", "--benchmark-columns=median,rounds"]
    if args.quick:
        command += ["-k", "not 256x16x2048"]
    print("running:", " ".join(command), flush=True)
    done = subprocess.run(command, cwd=SOURCE_ROOT)
    if done.returncode != 0:
        return done.returncode
    rows = read_speed_rows(report)
    table = speed_table(rows)
    (args.out / "speed.md").write_text(table + "\n")
    plot_speed(rows, args.out / "speed.png")
    print("\n" + table + f"\n\nwritten: {args.out / 'speed.md'}, {args.out / 'speed.png'}, {report}")
    return 0
