"""``leaf bench``: benchmarks (``speed``: estimator speed table; ``credit``: credit
quality; ``step``: a training step's time and memory, today's path and the old one;
``rollout``: the two rollout backends against the memory-bandwidth floor)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from leaf_plugins.commands import written_line
from leaf_plugins.core.errors import ConfigError
from leaf_plugins.core.interrupts import interrupt_point

NAME = "bench"
HELP = ("Run benchmarks: 'speed' times estimators (every registered one, or those --estimator names) against "
        "GRPO and the reference; 'credit' measures their credit quality against exact ground truth; "
        "'step' measures a training step's phases and peak memory, old path and new; "
        "'rollout' times both rollout backends against the memory-bandwidth floor.")

SOURCE_ROOT = Path(__file__).resolve().parents[2]
CHOICE_FORMAT = "NAME[:P=V[,P=V]]"
ESTIMATORS_ENV = "LEAF_BENCH_ESTIMATORS"  # the speed suite's estimators: --estimator choices, one per line
THREADS_ENV = "LEAF_BENCH_THREADS"  # the speed suite's torch intra-op thread count (--threads)

ESTIMATOR_HELP = ("an estimator to measure, registered (third-party ones included), with parameters of its own "
                  "(e.g. --estimator grpo --estimator tree_otb:ridge=0.1,shrink=auto); repeatable; default: every "
                  "registered estimator at its defaults")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    speed = sub.add_parser("speed", help="estimator speed: ratios to GRPO and to the slow reference")
    speed.add_argument("--out", type=Path, default=Path("results/speed"), help="directory for JSON, table and plot")
    speed.add_argument("--quick", action="store_true", help="skip the largest batch size")
    speed.add_argument("--repeats", type=int, default=3, metavar="N",
                       help="run the suite N times and combine (median of the runs' medians; default 3)")
    speed.add_argument("--device", default="cpu", metavar="DEVICE",
                       help="where the estimators run, e.g. cuda (each call synchronised; the slow references "
                            "stay on the CPU)")
    speed.add_argument("--threads", type=int, default=1, metavar="N",
                       help="torch's CPU threads for every timed call (default 1: one thread is not slowed by "
                            "another process busy on a second core; the table states the count)")
    speed.add_argument("--estimator", action="append", metavar=CHOICE_FORMAT, dest="estimators",
                       help=ESTIMATOR_HELP)
    speed.set_defaults(bench=run_speed)
    credit = sub.add_parser("credit", help="credit quality against exact values and gradients (tabular task)")
    credit.add_argument("--out", type=Path, default=Path("results/credit"), help="directory for tables and plots")
    credit.add_argument("--quick", action="store_true",
                        help="fewer groups, seeds and steps per regime (still about a minute a regime on 2 busy "
                             "cores, for every regime of the sweep unless --regimes names some: --regimes base "
                             "is a one-regime run)")
    credit.add_argument("--seeds", type=int, help="environments (seeds) per regime for the gradient measures")
    credit.add_argument("--learning-seeds", type=int, metavar="N",
                        help="learning curves per regime, estimator and protocol (default 10)")
    credit.add_argument("--regimes", nargs="+", metavar="NAME",
                        help="run only these regimes (a name that is not one lists them all)")
    credit.add_argument("--held-out", action="store_true",
                        help="run the held-out regimes (settings tree_otb's rule was not chosen on) instead")
    credit.add_argument("--report-set", action="store_true",
                        help="only the report set (regimes never used to choose a rule): tree_otb's paired "
                             "gradient-cosine difference to otb and grpo per regime, written to report-set.md "
                             "(with --regimes: those regimes of any set instead)")
    credit.add_argument("--batch-groups", type=int, metavar="N",
                        help="with --report-set: call the estimators on batches of N groups in every regime")
    credit.add_argument("--learning-rate", type=float, metavar="LR",
                        help="the normalised protocol's shared learning rate (default 0.25)")
    credit.add_argument("--direction-step", type=float, metavar="LENGTH",
                        help="the direction protocol's step length (default 0.25)")
    credit.add_argument("--adam-learning-rate", type=float, metavar="LR",
                        help="the adam protocol's shared learning rate (default 0.05)")
    credit.add_argument("--estimator", action="append", metavar=CHOICE_FORMAT, dest="estimators",
                        help=ESTIMATOR_HELP + "; the exact oracle is always measured")
    credit.set_defaults(bench=run_credit)
    step = sub.add_parser("step", help="one training step's time per phase and peak memory, old path and new")
    step.add_argument("--out", type=Path, default=Path("results/step"), help="directory for JSON, tables and plot")
    step.add_argument("--quick", action="store_true", help="a small run (seconds), e.g. for tests")
    step.add_argument("--old-memory-gb", type=float, default=8.0, metavar="GB",
                      help="skip the old path where its [N, P|T, V] and [K, P+T, V] tensors would exceed this "
                           "(default 8; CPU only: on a GPU the old path runs and a step that runs out of memory is "
                           "reported as such)")
    step.add_argument("--backbone", choices=["qwen2-audio", "granite-speech"], action="append",
                      help="measure only this backbone (repeatable; default both)")
    step.add_argument("--lora-dropout", type=float, nargs="+", metavar="P",
                      help="LoRA dropout of every measured step; several values measure each shape at each "
                           "(e.g. 0 0.05: what keyed dropout costs); default the paper's 0.05")
    step.add_argument("--device", default="cpu", metavar="DEVICE",
                      help="cpu (tiny stand-ins with the real vocabularies) or a CUDA device such as cuda: "
                           "random-weight Qwen2-Audio-7B and Granite Speech 3.3 8B in bf16 at the paper's shape")
    step.set_defaults(bench=run_step)
    rollout = sub.add_parser("rollout", help="ms per generated token of both rollout backends, the bandwidth floor, "
                                             "peak memory and the bf16 rollout/teacher-forced mismatch")
    rollout.add_argument("--out", type=Path, default=Path("results/rollout"), help="directory for JSON and tables")
    rollout.add_argument("--quick", action="store_true", help="a small run (seconds), e.g. for tests")
    rollout.add_argument("--repeats", type=int, metavar="N",
                         help="timed rollouts per backend, alternating backends (median; default 5, 3 on CUDA)")
    rollout.add_argument("--backbone", choices=["qwen2-audio", "granite-speech"], action="append",
                         help="measure only this backbone (repeatable; default both)")
    rollout.add_argument("--device", default="cpu", metavar="DEVICE",
                         help="cpu (the tiny backbones at the demo's shape) or a CUDA device such as cuda: "
                              "random-weight Qwen2-Audio-7B and Granite Speech 3.3 8B in bf16 at the paper's shape")
    rollout.add_argument("--new-tokens", type=int, metavar="T",
                         help="tokens per response on a CUDA device (default 200, the paper's)")
    rollout.add_argument("--profile", action="store_true",
                         help="also split the static decode step's time by operator category (torch.profiler)")
    rollout.set_defaults(bench=run_rollout)


def run(args: argparse.Namespace) -> int:
    return int(args.bench(args))


def run_speed(args: argparse.Namespace) -> int:
    from leaf_plugins.bench.estimator_choice import estimator_choices
    from leaf_plugins.bench.speed import (combine_runs, plot_speed, ratio_spread, read_speed_rows, speed_caption,
                                          speed_table)

    suite = SOURCE_ROOT / "benchmarks" / "test_speed_estimators.py"
    if not suite.exists():
        raise ConfigError(f"the benchmark suite is not here ({suite}): run 'leaf bench speed' from a source checkout")
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be at least 1, got {args.repeats}")
    if args.threads < 1:
        raise ConfigError(f"--threads must be at least 1, got {args.threads}")
    choices = estimator_choices(args.estimators)  # checked here, so that a mistake is one line, not a failed suite
    threads = str(args.threads)  # the suite sets torch's count; OpenMP and MKL start with the same
    environment = os.environ | {"LEAF_BENCH_DEVICE": args.device, THREADS_ENV: threads, "OMP_NUM_THREADS": threads,
                                "MKL_NUM_THREADS": threads}
    if args.estimators:
        environment[ESTIMATORS_ENV] = "\n".join(args.estimators)
    print("estimators:", ", ".join(choice.label for choice in choices), flush=True)
    print(f"threads: {args.threads} (torch's CPU threads in every timed call; --threads)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    runs, reports = [], []
    for run_number in range(1, args.repeats + 1):
        report = args.out / f"speed-{run_number}.json"
        reports.append(report)
        command = [sys.executable, "-m", "pytest", str(suite), "--benchmark-only", f"--benchmark-json={report}", "-q",
                   "-p", "no:cacheprovider", "--benchmark-columns=median,min,rounds"]
        if args.quick:
            command += ["-k", "not 256x16x2048"]
        print(f"run {run_number}/{args.repeats}:", " ".join(command), flush=True)
        done = subprocess.run(command, cwd=SOURCE_ROOT, env=environment)
        if done.returncode != 0:
            return done.returncode
        runs.append(read_speed_rows(report))
    rows = combine_runs(runs)
    if args.device != "cpu":
        import torch

        device = f"{torch.cuda.get_device_name(args.device)} (the references on the CPU)"
    else:
        device = "the CPU"
    table = speed_caption(rows, device) + "\n\n" + speed_table(rows)
    spread = ratio_spread(runs)
    table_path, plot_path = args.out / "speed.md", args.out / "speed.png"
    table_path.write_text(table + "\n\n" + spread + "\n")
    plot_speed(rows, plot_path)
    print("\n" + table + "\n\n" + spread + f"\n\n{written_line([table_path, plot_path, *reports])}")
    return 0


def run_credit(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from leaf_plugins.bench.credit.estimators import ORACLE
    from leaf_plugins.bench.credit.learning import PROTOCOLS
    from leaf_plugins.bench.estimator_choice import EstimatorChoice, estimator_choices
    from leaf_plugins.bench.credit.plots import plot_cosines, plot_learning
    from leaf_plugins.bench.credit.split import paired_report, report_regimes, report_table
    from leaf_plugins.bench.credit.sweep import (
        Settings, held_out_regimes, markdown_table, regimes, run_sweep, write_csv,
    )
    from leaf_plugins.core.errors import suggest

    settings = Settings.quick() if args.quick else Settings()
    for name in ("seeds", "learning_seeds"):
        value = getattr(args, name)
        if value is not None:
            if value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
            settings = replace(settings, **{name: value})
    for name, value in (("learning_rate", args.learning_rate), ("direction_step", args.direction_step),
                        ("adam_learning_rate", args.adam_learning_rate)):
        if value is not None:
            if not value > 0 or value == float("inf"):
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive finite number, got {value}")
            settings = replace(settings, **{name: value})
    # --regimes names any regime of the sweep; with --report-set, any of the report set too
    known = {regime.name: regime for regime in
             regimes() + held_out_regimes() + (report_regimes() if args.report_set else [])}
    for name in args.regimes or []:
        if name not in known:
            raise ConfigError(f"unknown regime {name!r}.{suggest(name, known)} Regimes: {', '.join(known)}")
    if args.report_set:
        chosen = [known[name] for name in args.regimes] if args.regimes else report_regimes()
        if args.batch_groups is not None:
            if args.batch_groups < 1:
                raise ConfigError(f"--batch-groups must be at least 1, got {args.batch_groups}")
            chosen = [replace(regime, batch_groups=args.batch_groups) for regime in chosen]
        reported = estimator_choices(args.estimators) if args.estimators else [EstimatorChoice("tree_otb")]
        if len(reported) != 1:
            raise ConfigError(f"--report-set reports one estimator against otb and grpo; --estimator was given "
                              f"{len(reported)} times")
        table = report_table(paired_report(chosen, reported[0], seeds=settings.seeds, groups=settings.groups))
        args.out.mkdir(parents=True, exist_ok=True)
        report_path = args.out / "report-set.md"
        report_path.write_text(table)
        print("\n" + table + f"\n{written_line([report_path])}")
        return 0
    chosen = [known[name] for name in args.regimes] if args.regimes else held_out_regimes() if args.held_out else None
    estimators = [*estimator_choices(args.estimators), ORACLE] if args.estimators else None
    rows = run_sweep(settings, chosen, estimators)
    args.out.mkdir(parents=True, exist_ok=True)
    table = markdown_table(rows)
    table_path, csv_path = args.out / "credit.md", args.out / "credit.csv"
    cosines_path = args.out / "gradient_cosine.png"
    table_path.write_text(table + "\n")
    write_csv(rows, csv_path)
    plot_cosines(rows, cosines_path)
    curve_paths = [args.out / f"learning_curves_{protocol}.png" for protocol in PROTOCOLS]
    for protocol, curve_path in zip(PROTOCOLS, curve_paths):
        plot_learning(rows, curve_path, protocol)
    print("\n" + table)
    print(f"\n{written_line([table_path, csv_path, cosines_path, *curve_paths])}")
    return 0


def run_step(args: argparse.Namespace) -> int:
    import json

    from dataclasses import replace

    from tqdm import tqdm

    from leaf_plugins.bench.step import (BACKBONE_VOCABULARIES, SIDE_BY_SIDE, StepShape, old_path_bytes, plot_growth,
                                         run_in_process, step_table)
    from leaf_plugins.bench.step_accounting import accounting_table

    if args.quick:
        shapes = [StepShape(path, "granite-speech", 4096, prompts=2, group_size=2, new_tokens=4, audio_seconds=2,
                            device=args.device) for path in ("old", "new")]
    elif args.device != "cpu":  # the real models' shapes, both paths, with and without activation checkpointing
        shapes = [StepShape(path, backbone, vocab, device=args.device, size="paper", activation_checkpointing=recompute)
                  for backbone, vocab in BACKBONE_VOCABULARIES.items() for recompute in (False, True)
                  for path in ("old", "new")]
    else:
        shapes = []
        for backbone, seconds, tokens in SIDE_BY_SIDE:
            for path in ("old", "new"):
                shape = StepShape(path, backbone, BACKBONE_VOCABULARIES[backbone], new_tokens=tokens,
                                  audio_seconds=seconds)
                if path == "new" or old_path_bytes(shape) <= args.old_memory_gb * 1e9:
                    shapes.append(shape)
        shapes += [StepShape("new", backbone, vocab) for backbone, vocab in BACKBONE_VOCABULARIES.items()]
    if args.backbone:
        shapes = [shape for shape in shapes if shape.backbone in args.backbone]
    if args.lora_dropout:
        if not all(0.0 <= p < 1.0 for p in args.lora_dropout):
            raise ConfigError(f"--lora-dropout takes values in [0, 1), got {args.lora_dropout}")
        shapes = [replace(shape, lora_dropout=p) for shape in shapes for p in args.lora_dropout]
    args.out.mkdir(parents=True, exist_ok=True)
    rows, rows_path = [], args.out / "step.json"
    for shape in tqdm(shapes, desc="steps", unit="step"):
        interrupt_point()  # Ctrl-C stops between shapes (the rows measured so far are kept)
        rows.append(run_in_process(shape))
        rows_path.write_text(json.dumps(rows, indent=1))  # kept if a later step is interrupted
    table, accounting = step_table(rows), accounting_table()
    table_path, plot_path = args.out / "step.md", args.out / "step_memory.png"
    table_path.write_text(table + "\n\n" + accounting + "\n")
    plot_growth(rows, plot_path)
    print("\n" + table + "\n\n" + accounting + f"\n\n{written_line([table_path, rows_path, plot_path])}")
    return 0


def run_rollout(args: argparse.Namespace) -> int:
    import json

    from dataclasses import replace

    from leaf_plugins.bench.rollout import (cpu_shapes, cuda_shapes, measure_rollout, mismatch_table, profile_table,
                                            rollout_table)
    from leaf_plugins.bench.step import run_in_process

    if args.repeats is not None and args.repeats < 1:
        raise ConfigError(f"--repeats must be at least 1, got {args.repeats}")
    if args.new_tokens is not None and args.new_tokens < 2:
        raise ConfigError(f"--new-tokens must be at least 2, got {args.new_tokens}")
    on_cpu = args.device == "cpu"
    if on_cpu and args.new_tokens is not None:
        raise ConfigError("--new-tokens applies to a CUDA device (the CPU runs the demo's shape)")
    repeats = args.repeats or (5 if on_cpu else 3)
    shapes = cpu_shapes(repeats, args.quick) if on_cpu else cuda_shapes(args.device, repeats, args.new_tokens or 200)
    shapes = [replace(shape, profile=args.profile) for shape in shapes]
    if args.backbone:
        shapes = [shape for shape in shapes if shape.backbone in args.backbone]
    args.out.mkdir(parents=True, exist_ok=True)
    rows, rows_path = [], args.out / "rollout.json"
    for shape in shapes:
        print(f"measuring {shape.backbone} ({shape.size}) on {shape.device} ...", flush=True)
        rows.append(run_in_process(shape, measure_rollout))  # one process per backbone: both backends inside it
        rows_path.write_text(json.dumps(rows, indent=1))  # kept if a later one is interrupted
    text = rollout_table(rows) + "\n\nbf16 rollout/teacher-forced mismatch:\n\n" + mismatch_table(rows)
    if args.profile:
        text += "\n\nWhere the static decode step's time goes:\n\n" + profile_table(rows)
    table_path = args.out / "rollout.md"
    table_path.write_text(text + "\n")
    print("\n" + text + f"\n\n{written_line([table_path, rows_path])}")
    return 0
