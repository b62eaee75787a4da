"""Reference-based text metrics of the paper: BLEU, ROUGE-1/2/L, METEOR, BERTScore-F1
and mean prediction length, each on a 0–100 scale except the length (whitespace tokens).

A metric whose package or data is missing is returned as ``Unavailable`` (it prints as
"unavailable" with the command that installs it, never as a number).
"""

from __future__ import annotations

import importlib.util
import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from sacrebleu.metrics import BLEU

__all__ = [
    "Unavailable",
    "RunAverage",
    "METRICS",
    "corpus_bleu",
    "sentence_bleu",
    "rouge",
    "meteor",
    "bertscore_f1",
    "mean_length",
    "evaluate_texts",
    "average_runs",
]

METRICS = ("bleu", "rouge1", "rouge2", "rougeL", "meteor", "bertscore_f1", "length")
"""Metric names in report order."""

ROUGE_INSTALL = "pip install rouge-score"
METEOR_INSTALL = "pip install nltk && python -m nltk.downloader wordnet omw-1.4"
BERTSCORE_INSTALL = "pip install bert-score"


@dataclass(frozen=True)
class Unavailable:
    """A metric that could not be computed: why, and the command that makes it work."""

    metric: str
    reason: str
    install: str

    def __str__(self) -> str:
        return f"unavailable ({self.reason}; install: {self.install})"

    def __format__(self, spec: str) -> str:  # f"{x:.2f}" prints the message, never a number
        return str(self)



def _check(predictions: Sequence[str], references: Sequence[str]) -> None:
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if not predictions:
        raise ValueError("no predictions to score")
    for name, texts in (("predictions", predictions), ("references", references)):
        for row, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValueError(f"{name}[{row}] is {type(text).__name__}, expected a string")


def corpus_bleu(predictions: Sequence[str], references: Sequence[str], lowercase: bool = True) -> float:
    """Corpus BLEU (sacrebleu, 13a tokenizer, one reference per item), 0–100.

    ``lowercase=True`` (the default) is the case-insensitive score used for reporting.
    """
    _check(predictions, references)
    return float(BLEU(lowercase=lowercase).corpus_score(list(predictions), [list(references)]).score)


def sentence_bleu(predictions: Sequence[str], references: Sequence[str], lowercase: bool = True) -> list[float]:
    """Per-item sentence BLEU (sacrebleu, effective order), 0–100."""
    _check(predictions, references)
    metric = BLEU(lowercase=lowercase, effective_order=True)
    return [float(metric.sentence_score(p, [r]).score) for p, r in zip(predictions, references)]


def rouge(
    predictions: Sequence[str], references: Sequence[str], use_stemmer: bool = False
) -> dict[str, float | Unavailable]:
    """Mean ROUGE-1/2/L F-measure × 100 (``rouge-score`` package: lowercased, non-
    alphanumerics dropped; ROUGE-L is sentence-level LCS)."""
    _check(predictions, references)
    names = ("rouge1", "rouge2", "rougeL")
    if importlib.util.find_spec("rouge_score") is None:
        return {name: Unavailable(name, "package rouge-score is not installed", ROUGE_INSTALL) for name in names}
    from rouge_score.rouge_scorer import RougeScorer

    scorer = RougeScorer(list(names), use_stemmer=use_stemmer)
    totals = dict.fromkeys(names, 0.0)
    for prediction, reference in zip(predictions, references):
        scores = scorer.score(reference, prediction)
        for name in names:
            totals[name] += scores[name].fmeasure
    return {name: 100.0 * total / len(predictions) for name, total in totals.items()}


def meteor(predictions: Sequence[str], references: Sequence[str]) -> float | Unavailable:
    """Mean METEOR × 100 (nltk ``meteor_score`` with WordNet synonyms; texts lowercased
    and split on whitespace)."""
    _check(predictions, references)
    if importlib.util.find_spec("nltk") is None:
        return Unavailable("meteor", "package nltk is not installed", METEOR_INSTALL)
    from nltk.corpus import wordnet
    from nltk.translate.meteor_score import meteor_score

    try:
        wordnet.ensure_loaded()
    except LookupError:
        return Unavailable("meteor", "nltk's WordNet data is not downloaded", METEOR_INSTALL)
    total = sum(
        meteor_score([reference.lower().split()], prediction.lower().split(), wordnet=wordnet)
        for prediction, reference in zip(predictions, references)
    )
    return 100.0 * total / len(predictions)


def bertscore_f1(
    predictions: Sequence[str],
    references: Sequence[str],
    model: str = "roberta-large",
    num_layers: int | None = None,
    batch_size: int = 32,
) -> float | Unavailable:
    """Mean BERTScore-F1 × 100 (``bert-score`` package, no baseline rescaling).

    :param model: a Hugging Face model id or a local directory. The default is
        bert-score's English model; without a hub connection pass a local copy.
    :param num_layers: the layer whose embeddings are compared (bert-score's table gives
        it for known model ids; required for a local path).
    """
    _check(predictions, references)
    if importlib.util.find_spec("bert_score") is None:
        return Unavailable("bertscore_f1", "package bert-score is not installed", BERTSCORE_INSTALL)
    from bert_score import score

    try:
        _, _, f1 = score(list(predictions), list(references), model_type=model, num_layers=num_layers,
                         batch_size=batch_size, verbose=False)
    except (OSError, KeyError, ValueError) as error:
        return Unavailable(
            "bertscore_f1",
            f"model {model!r} could not be loaded ({type(error).__name__}: {str(error).splitlines()[0][:160]})",
            f"{BERTSCORE_INSTALL}, then pass a local model directory and its layer (--bertscore-model PATH "
            "--bertscore-layers N)",
        )
    return 100.0 * float(f1.mean())


def mean_length(predictions: Sequence[str]) -> float:
    """Mean prediction length in whitespace-separated tokens (``str.split``)."""
    if not predictions:
        raise ValueError("no predictions to measure")
    return sum(len(text.split()) for text in predictions) / len(predictions)


def evaluate_texts(
    predictions: Sequence[str],
    references: Sequence[str],
    metrics: Iterable[str] = METRICS,
    bertscore_model: str = "roberta-large",
    bertscore_layers: int | None = None,
) -> dict[str, float | Unavailable]:
    """The chosen ``metrics`` (names from ``METRICS``) of one prediction run."""
    chosen = list(metrics)
    unknown = [name for name in chosen if name not in METRICS]
    if unknown:
        from leaf_plugins.core.errors import ConfigError, suggest

        raise ConfigError(f"unknown metric {unknown[0]!r}.{suggest(unknown[0], METRICS)} Metrics: {', '.join(METRICS)}")
    out: dict[str, float | Unavailable] = {}
    if "bleu" in chosen:
        out["bleu"] = corpus_bleu(predictions, references)
    if any(name.startswith("rouge") for name in chosen):
        out.update({k: v for k, v in rouge(predictions, references).items() if k in chosen})
    if "meteor" in chosen:
        out["meteor"] = meteor(predictions, references)
    if "bertscore_f1" in chosen:
        out["bertscore_f1"] = bertscore_f1(predictions, references, bertscore_model, bertscore_layers)
    if "length" in chosen:
        out["length"] = mean_length(predictions)
    return {name: out[name] for name in METRICS if name in out}


@dataclass(frozen=True)
class RunAverage:
    """A metric averaged over N sampled prediction runs."""

    mean: float
    std: float  # sample standard deviation over runs (0 for one run)
    low: float  # smallest run
    high: float  # largest run
    runs: int

    def __str__(self) -> str:
        return f"{self.mean:.2f} ± {self.std:.2f} (n={self.runs})"

    def __format__(self, spec: str) -> str:
        return f"{format(self.mean, spec)} ± {format(self.std, spec)}" if spec else str(self)


def average_runs(runs: Sequence[Mapping[str, float | Unavailable]]) -> dict[str, RunAverage | Unavailable]:
    """Mean, sample std and range of each metric over N runs (one mapping per run).

    A metric unavailable in any run is unavailable in the average.
    """
    if not runs:
        raise ValueError("no runs to average")
    names = [name for name in runs[0]]
    out: dict[str, RunAverage | Unavailable] = {}
    for name in names:
        values = []
        for index, run in enumerate(runs):
            if name not in run:
                raise ValueError(f"run {index} has no metric {name!r} (run 0 has it)")
            values.append(run[name])
        missing = next((value for value in values if isinstance(value, Unavailable)), None)
        if missing is not None:
            out[name] = missing
            continue
        floats = [float(value) for value in values]
        spread = statistics.stdev(floats) if len(floats) > 1 else 0.0
        out[name] = RunAverage(statistics.fmean(floats), spread, min(floats), max(floats), len(floats))
    return out
