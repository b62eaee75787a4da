"""``leaf eval``: score prediction files (text metrics over N runs, absolute judges, tail risk,
pairwise A/B) and put a set of runs into the paper's master table."""

from __future__ import annotations

import argparse
import csv
import json
from dataclasses import replace
from pathlib import Path

from leaf_plugins.commands import require_training_stack, written_line
from leaf_plugins.core.errors import ConfigError

NAME = "eval"
HELP = ("'generate' samples N prediction runs of a trained run (the paper's decoding) into prediction files; "
        "evaluate prediction files (JSONL: prediction, reference[, id, question, score]): 'metrics' averages "
        "BLEU/ROUGE/METEOR/BERTScore/length over N sampled runs, 'tail' gives CVaR and threshold fractions "
        "with bootstrap CIs, 'da' and 'likert' grade each item with an LLM judge (GEMBA-DA 0-100, Prometheus "
        "Likert 1-5), 'pairwise' runs an LLM judge on two systems in both orders, 'report' gives the paper's master "
        "table of a set of run directories.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="evaluation", required=True, metavar="EVALUATION")
    generate = sub.add_parser("generate", help="sample N prediction runs from a run's checkpoint over a task split")
    generate.add_argument("config", type=Path, metavar="RUN.yaml", help="the run config (backbone, task, rollout.backend; a "
                          "plugin it names in plugins: with a rollout hook samples), or a run directory: its "
                          "config.yaml, and its newest checkpoint samples")
    generate.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="run-config overrides")
    generate.add_argument("--checkpoint", type=Path, metavar="RUN_DIR",
                          help="run directory whose newest checkpoint samples (default: the config's output_dir if "
                               "it has one, else the starting model)")
    generate.add_argument("--split", default="test")
    generate.add_argument("--limit", type=int, help="only the first N examples")
    generate.add_argument("--runs", type=int, default=3, help="sampled decoding runs (default 3)")
    generate.add_argument("--temperature", type=float, default=0.9)
    generate.add_argument("--top-p", type=float, default=0.9)
    generate.add_argument("--max-new-tokens", type=int, default=200)
    generate.add_argument("--batch-prompts", type=int, default=8)
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("--out", type=Path, default=Path("results/predictions"), help="directory for the files")
    generate.set_defaults(evaluate=run_generate)
    metrics = sub.add_parser("metrics", help="text metrics averaged over N prediction runs")
    metrics.add_argument("--predictions", type=Path, nargs="+", required=True, metavar="RUN.jsonl",
                         help="one file per sampled run of the same items")
    metrics.add_argument("--metrics", nargs="+", metavar="NAME", help="subset of bleu rouge1 rouge2 rougeL meteor "
                         "bertscore_f1 length (default: all)")
    metrics.add_argument("--bertscore-model", default="roberta-large", help="hub id or local directory")
    metrics.add_argument("--bertscore-layers", type=int, help="layer for a model bert-score does not know")
    tail = sub.add_parser("tail", help="mean, CVaR@alpha and fraction below a threshold with bootstrap CIs")
    source = tail.add_mutually_exclusive_group(required=True)
    source.add_argument("--scores", type=Path, metavar="ITEMS.csv",
                        help="a per-item judge file (da_items.csv from leaf eval da: the paper's tail analysis)")
    source.add_argument("--predictions", type=Path, metavar="FILE.jsonl", help="a prediction file with a score field")
    tail.add_argument("--score-key", default="score", help="the per-item score field of --predictions")
    tail.add_argument("--alphas", type=float, nargs="+", default=[0.10, 0.25])
    tail.add_argument("--threshold", type=float, default=50.0)
    tail.add_argument("--resamples", type=int, default=1000)
    pairwise = sub.add_parser("pairwise", help="A/B judging in both orders with an HF causal LM")
    pairwise.add_argument("--judge", required=True, help="hub id or local directory of the judge model")
    pairwise.add_argument("--x", type=Path, required=True, metavar="X.jsonl", help="predictions of system X")
    pairwise.add_argument("--y", type=Path, required=True, metavar="Y.jsonl", help="predictions of system Y")
    pairwise.add_argument("--x-name", default="X")
    pairwise.add_argument("--y-name", default="Y")
    pairwise.add_argument("--template", choices=("judgelm", "prometheus"), default="judgelm")
    pairwise.add_argument("--max-new-tokens", type=int, default=128)
    pairwise.add_argument("--batch-size", type=int, default=8)
    pairwise.add_argument("--device", default="cpu")
    graders = [_add_grading(sub, name) for name in PROTOCOL_NAMES]
    report = sub.add_parser("report", help="the paper's master table (text metrics, Likert, DA) of run directories")
    report.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR",
                        help="directories holding predictions-run*.jsonl and what scored them")
    report.add_argument("--names", nargs="+", metavar="NAME", help="row names (default: the directories)")
    report.add_argument("--out", type=Path, default=Path("results/eval"), help="directory for report.md/.csv")
    report.set_defaults(evaluate=run_report)
    for command in (metrics, tail, pairwise, *graders):
        command.add_argument("--prediction-key", default="prediction")
        command.add_argument("--reference-key", default="reference")
        command.add_argument("--out", type=Path, default=Path("results/eval"), help="directory for the tables")
    metrics.set_defaults(evaluate=run_metrics)
    tail.set_defaults(evaluate=run_tail)
    pairwise.set_defaults(evaluate=run_pairwise)


PROTOCOL_NAMES = ("da", "likert")
GRADING_HELP = {
    "da": "GEMBA-DA 0-100 per item with an HF causal LM: N samples at temperature T (default 5 at 0.7, the "
          "paper's), item score = mean of the parsable ones",
    "likert": "Prometheus absolute grading, Likert 1-5 ([RESULT] n) per item with an HF causal LM (default greedy, "
              "one judgment, the paper's)",
}


def _add_grading(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    from leaf_plugins.evaluation.grading import PROTOCOLS

    defaults = PROTOCOLS[name].decoding
    command = sub.add_parser(name, help=GRADING_HELP[name])
    command.add_argument("--judge", required=True, help="hub id or local directory of the judge (a causal LM)")
    command.add_argument("--predictions", type=Path, required=True, metavar="RUN.jsonl",
                         help="a prediction file (leaf eval generate, a study run)")
    command.add_argument("--samples", type=int, default=defaults.samples,
                         help=f"judgments per item (default {defaults.samples})")
    command.add_argument("--temperature", type=float, default=defaults.temperature,
                         help=f"sampling temperature, 0 = greedy (default {defaults.temperature:g})")
    command.add_argument("--top-p", type=float, default=1.0)
    command.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
    command.add_argument("--task", choices=("qa", "translation"), default="qa",
                         help="the prompt's wording (DA) or rubric (Likert) (default qa)")
    if name == "da":
        command.add_argument("--source-lang", default="English")
        command.add_argument("--target-lang", default="German")
    else:
        command.add_argument("--rubric", type=Path, metavar="RUBRIC.txt",
                             help="a rubric file ('[criteria]' then 'Score 1:' ... 'Score 5:' lines) instead of the "
                                  "task's")
    command.add_argument("--limit", type=int, help="only the first N items")
    command.add_argument("--batch-size", type=int, default=8, help="prompts per generate call")
    command.add_argument("--device", default="cpu")
    command.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    command.add_argument("--seed", type=int, default=0)
    command.add_argument("--no-chat-template", action="store_true",
                         help="send the plain prompt even when the judge has a chat template")
    command.add_argument("--question-key", default="question")
    command.set_defaults(evaluate=run_grading, protocol=name)
    return command


def run(args: argparse.Namespace) -> int:
    return int(args.evaluate(args))


def _write_table(out: Path, stem: str, header: tuple[str, ...], rows: list[tuple]) -> list[Path]:
    """Write ``rows`` under ``header`` to ``out/STEM.md`` (Markdown) and ``out/STEM.csv``,
    print the Markdown table, and return the two paths."""
    out.mkdir(parents=True, exist_ok=True)
    markdown, table_csv = out / f"{stem}.md", out / f"{stem}.csv"
    with table_csv.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    table = "\n".join(lines)
    markdown.write_text(table + "\n")
    print(table + "\n")
    return [markdown, table_csv]


def run_generate(args: argparse.Namespace) -> int:
    require_training_stack()
    import torch
    from accelerate import PartialState

    from leaf_plugins.evaluation.predictions import write_predictions
    from leaf_plugins.core.processes import group_rank
    from leaf_plugins.evaluation.sampling import Sampling, load_policy, run_to_sample, sample_predictions
    from leaf_plugins.core.plugins import get_host
    from leaf_plugins.training.config import load_train_config, task_examples
    from leaf_plugins.training.run_config import check_same_backbone, run_config_path
    from leaf_plugins.training.stage_plugins import rollout_stage

    config = load_train_config(run_config_path(args.config), args.overrides)
    # under `accelerate launch` or torchrun: the process group the processes share the sampling over (gloo on CPU)
    PartialState(cpu=not torch.cuda.is_available())
    run_dir = run_to_sample(config.output_dir, args.checkpoint)
    if run_dir is not None:
        check_same_backbone(run_dir, config)
    examples = task_examples(config.task, args.split)[: args.limit]
    policy = load_policy(config.backbone, run_dir)
    sampling = Sampling(args.runs, args.temperature, args.top_p, args.max_new_tokens, args.batch_prompts, args.seed,
                        config.rollout.backend, config.rollout.backend_params, rollout_stage(config, get_host()))
    runs = sample_predictions(policy, examples, sampling)
    if group_rank()[0] != 0:  # every process sampled its share; the first writes the whole evaluation
        return 0
    paths = write_predictions(args.out, examples, runs)
    print(f"{len(examples)} examples x {args.runs} runs from {run_dir or 'the starting model'}: "
          f"{' '.join(str(path) for path in paths)}")
    print(f"score them: leaf eval metrics --predictions {' '.join(str(path) for path in paths)}")
    return 0


def run_metrics(args: argparse.Namespace) -> int:
    from leaf_plugins.evaluation.predictions import read_predictions
    from leaf_plugins.evaluation.text_metrics import METRICS, RunAverage, average_runs, evaluate_texts

    runs = []
    for path in args.predictions:
        items = read_predictions(path, args.prediction_key, args.reference_key)
        runs.append(evaluate_texts(items.predictions, items.references, args.metrics or METRICS,
                                   args.bertscore_model, args.bertscore_layers))
    rows = []
    for name, value in average_runs(runs).items():
        if isinstance(value, RunAverage):
            rows.append((name, f"{value.mean:.2f}", f"{value.std:.2f}", f"{value.low:.2f}", f"{value.high:.2f}",
                         value.runs))
        else:
            rows.append((name, str(value), "", "", "", len(runs)))
    header = ("metric", "mean", "std over runs", "min", "max", "runs")
    print(written_line(_write_table(args.out, "metrics", header, rows)))
    return 0


def run_tail(args: argparse.Namespace) -> int:
    from leaf_plugins.evaluation.grading import read_item_scores
    from leaf_plugins.evaluation.predictions import read_predictions
    from leaf_plugins.evaluation.tail_risk import tail_risk_report

    if args.scores is not None:
        ids, found = read_item_scores(args.scores)
        scores = [score for score in found if score is not None]
        if not scores:
            raise ConfigError(f"{args.scores}: no item has a parsable judgment; nothing to analyse")
        if len(scores) < len(ids):
            print(f"{len(ids) - len(scores)} of {len(ids)} items of {args.scores} have no parsable judgment: "
                  "left out of the tail analysis")
    else:
        scores = read_predictions(args.predictions, args.prediction_key, args.reference_key,
                                  score_key=args.score_key).scores
    report = tail_risk_report(scores, args.alphas, args.threshold, args.resamples)
    rows = [(name, f"{e.value:.4g}", f"{e.low:.4g}", f"{e.high:.4g}") for name, e in report.items()]
    header = ("statistic", f"value (N={len(scores)})", "95% CI low", "95% CI high")
    print(written_line(_write_table(args.out, "tail_risk", header, rows)))
    return 0


def run_grading(args: argparse.Namespace) -> int:
    from leaf_plugins.evaluation.grading import grade, grade_items, summary_rows, write_grades
    from leaf_plugins.evaluation.judge_model import JudgeDecoding, load_judge
    from leaf_plugins.evaluation.predictions import read_predictions

    found = read_predictions(args.predictions, args.prediction_key, args.reference_key, args.question_key)
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {args.limit}")
    items = grade_items(found)[: args.limit]
    extra = ({"source_lang": args.source_lang, "target_lang": args.target_lang} if args.protocol == "da" else
             {"rubric": args.rubric.read_text() if args.rubric else None})
    decoding = JudgeDecoding(samples=args.samples, temperature=args.temperature, top_p=args.top_p,
                             max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, seed=args.seed,
                             chat_template=not args.no_chat_template)  # checked here, before a large judge is loaded
    judge = load_judge(args.judge, args.device, args.dtype)
    grades = grade(judge, items, args.protocol, decoding, kind=args.task, **extra)
    paths = write_grades(grades, args.out)
    print("\n".join(f"{label}: {value}" for label, value in summary_rows(grades)))
    print(written_line(paths))
    return 0


def run_report(args: argparse.Namespace) -> int:
    from leaf_plugins.evaluation.report import read_run, render

    if args.names and len(args.names) != len(args.runs):
        raise ConfigError(f"{len(args.names)} --names for {len(args.runs)} run directories")
    missing = [str(path) for path in args.runs if not path.is_dir()]
    if missing:
        raise ConfigError(f"not a directory: {', '.join(missing)}")
    rows = [read_run(path, name) for path, name in zip(args.runs, args.names or [None] * len(args.runs))]
    text, markdown, table = render(rows, args.out)
    print(text + "\n" + written_line([markdown, table]))
    return 0


def run_pairwise(args: argparse.Namespace) -> int:
    from leaf_plugins.evaluation.judge import PAIRWISE_DECODING, PairItem, judge_pairs
    from leaf_plugins.evaluation.pairwise import OUTCOMES
    from leaf_plugins.evaluation.predictions import read_predictions

    x = read_predictions(args.x, args.prediction_key, args.reference_key)
    y = read_predictions(args.y, args.prediction_key, args.reference_key)
    y_by_id = dict(zip(y.ids, y.predictions))
    missing = [item for item in x.ids if item not in y_by_id]
    if missing:
        raise ConfigError(f"{len(missing)} ids of {args.x} are not in {args.y} (first: {missing[0]!r}); "
                          "both files must hold the same items")
    items = [PairItem(q, r, p, y_by_id[i]) for i, p, r, q in zip(x.ids, x.predictions, x.references, x.questions)]
    decoding = replace(PAIRWISE_DECODING, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
    judged = judge_pairs(args.judge, items, template=args.template, decoding=decoding, device=args.device)
    rows = [(label, value) for label, value in judged.summary.rows(args.x_name, args.y_name)]
    rows.append(("pairs", str(judged.summary.pairs)))
    written = _write_table(args.out, "pairwise", ("statistic", "value [95% CI]"), rows)
    outputs = args.out / "pairwise_outputs.jsonl"  # the judge's outputs
    with outputs.open("w") as handle:
        for item, first, second, code in zip(x.ids, judged.outputs_x_first, judged.outputs_y_first,
                                             judged.codes.tolist()):
            record = {"id": item, "x_first": first, "y_first": second, "outcome": OUTCOMES[code]}
            handle.write(json.dumps(record) + "\n")
    print(written_line([*written, outputs]))
    return 0
