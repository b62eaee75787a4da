"""``leaf bench step``: one training step's time per phase and peak memory, the trainer's
own path and the straightforward reference path (``bench/step_reference.py``) side by
side.

The trainer's path is what a run calls: the prompts' embeddings, the rollout backend,
the reward, ``Engine.estimate``, then the trainer's update (``update_policy``: the
reference and policy passes, backward and the optimizer step, micro-batched as a run
with ``optim.micro_batch_prompts: 1``), on the model as the trainer prepares it (LoRA
rank 64 with keyed dropout at the paper's 0.05, activation checkpointing where asked).

On the CPU the backbones are the built-in tiny ones with the real models' vocabularies
(156,032 for Qwen2-Audio, 49,160 for Granite Speech 3.3), hidden size 48, 30 s clips,
6 prompts × K = 8; a sampler thread reads the process's resident memory every
millisecond, so each phase's peak is the largest resident set seen while it ran. On a GPU
(``--device cuda``) they are random-weight models of the real size (the published
Qwen2-Audio-7B and Granite Speech 3.3 8B configs, bf16), and each phase's peak is the CUDA
allocator's. Each (path, backbone, response length) runs in a fresh process.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

__all__ = ["StepShape", "PHASES", "BACKBONE_VOCABULARIES", "SIDE_BY_SIDE", "old_path_bytes", "measure",
           "run_in_process", "step_table", "plot_growth"]

PHASES = ("encode", "generate", "score", "estimate", "update")
"""``encode``: the prompts' embeddings, audio encoded once per prompt (the trainer's path
only: the old path encodes inside every pass); ``update``: the reference and policy
passes, the backward passes and the optimizer step."""

BACKBONE_VOCABULARIES = {"qwen2-audio": 156_032, "granite-speech": 49_160}

AUDIO_SLOTS_PER_SECOND = {"qwen2-audio": 25, "granite-speech": 10}

SIDE_BY_SIDE = (("qwen2-audio", 3, 5), ("qwen2-audio", 3, 10), ("granite-speech", 30, 10), ("granite-speech", 30, 25))
"""(backbone, clip seconds, T) measured on both paths where the old one fits; the new
path also runs at the paper's shape (30 s, T = 200)."""

REFERENCE_TEXT = "the cat sat on the mat near the small red house"


@dataclass(frozen=True)
class StepShape:
    """What one measured step looks like."""

    path: str  # "new" (today's) or "old" (bench/step_reference.py)
    backbone: str  # a key of BACKBONE_VOCABULARIES
    vocab_size: int
    prompts: int = 6
    group_size: int = 8
    new_tokens: int = 200
    audio_seconds: int = 30
    device: str = "cpu"
    size: str = "tiny"  # "tiny" (hidden 48, the real vocabulary) or "paper" (the real model, random weights)
    activation_checkpointing: bool = False  # optim.activation_checkpointing
    lora_dropout: float = 0.05  # lora.dropout (the paper's; keyed by each row on the trainer's path)


def old_path_bytes(shape: StepShape) -> int:
    """A generous estimate of the old path's largest float32 tensors at ``shape``: the
    prefill's ``[N, P, V]`` logits (Qwen2-Audio's forward has no ``logits_to_keep``), six
    ``[N, T, V]`` in the rollout, and five ``[K, P + T, V]`` in a teacher-forced pass."""
    prompt = AUDIO_SLOTS_PER_SECOND[shape.backbone] * shape.audio_seconds + 20
    rows = shape.prompts * shape.group_size
    return 4 * shape.vocab_size * (rows * prompt + 6 * rows * shape.new_tokens
                                   + 5 * shape.group_size * (prompt + shape.new_tokens))


class MemorySampler:
    """Resident set size of this process, sampled every millisecond in a thread; ``phase``
    records each named block's seconds and its peak bytes."""

    def __init__(self) -> None:
        self._page = 4096
        self.current_peak = 0
        self.seconds: dict[str, float] = {}
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def rss(self) -> int:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * self._page

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.current_peak = max(self.current_peak, self.rss())
            time.sleep(0.001)

    def __enter__(self) -> "MemorySampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.current_peak = self.rss()
        started = time.perf_counter()
        yield
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started
        self.peaks[name] = max(self.peaks.get(name, 0), self.current_peak, self.rss())


class CudaPhases:
    """The CUDA allocator's memory per phase: ``phase`` records each named block's seconds
    (the device synchronised at both ends) and the most memory allocated while it ran;
    ``rss`` is the memory allocated now (the name shared with ``MemorySampler``)."""

    def __init__(self, device: str) -> None:
        self.device = torch.device(device)
        self.seconds: dict[str, float] = {}
        self.peaks: dict[str, int] = {}

    def rss(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def __enter__(self) -> "CudaPhases":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        started = time.perf_counter()
        try:
            yield
        finally:  # an out-of-memory phase is still recorded, with what it reached
            torch.cuda.synchronize(self.device)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started
            self.peaks[name] = max(self.peaks.get(name, 0), torch.cuda.max_memory_allocated(self.device))


def _load(shape: StepShape) -> Any:
    from leaf_plugins.backbones.granite_speech import random_granite_speech_3_3_8b, tiny_granite_speech
    from leaf_plugins.backbones.qwen2_audio import random_qwen2_audio_7b, tiny_qwen2_audio

    if shape.size == "paper":
        build = random_qwen2_audio_7b if shape.backbone == "qwen2-audio" else random_granite_speech_3_3_8b
        return build(0, shape.device, torch.bfloat16)
    if shape.backbone == "qwen2-audio":
        loaded = tiny_qwen2_audio(0, clip_seconds=shape.audio_seconds, vocab_size=shape.vocab_size)
    else:
        loaded = tiny_granite_speech(0, vocab_size=shape.vocab_size)
    loaded.model.to(shape.device)
    return loaded


def measure(shape: StepShape) -> dict[str, Any]:
    """One training step at ``shape`` in this process: seconds and peak bytes per phase
    (resident set on the CPU, the CUDA allocator's on a GPU), the bytes before the step,
    and the step's overall peak; a step that runs out of device memory returns what it
    measured so far and ``out_of_memory``, the phase it failed in."""
    from leaf_plugins.training.activation_checkpointing import enable_activation_checkpointing
    from leaf_plugins.training.keyed_dropout import install_keyed_dropout
    from leaf_plugins.training.lora import attach_lora

    torch.manual_seed(0)
    loaded = _load(shape)
    model = attach_lora(loaded, rank=64, alpha=128, dropout=shape.lora_dropout)
    if shape.path == "new":
        install_keyed_dropout(model)  # as the trainer prepares the model
    if shape.activation_checkpointing:
        enable_activation_checkpointing(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, weight_decay=0.0)
    rng = np.random.default_rng(0)
    audios = [(rng.standard_normal(16000 * shape.audio_seconds) * 0.1).astype(np.float32)
              for _ in range(shape.prompts)]
    inputs = loaded.spec.build_inputs(loaded, ["<|audio|> translate the audio from english to german"] * shape.prompts,
                                      audios)
    inputs = {key: value.to(shape.device) for key, value in inputs.items()}
    model.eval()
    cuda = torch.device(shape.device).type == "cuda"
    recorder = CudaPhases(shape.device) if cuda else MemorySampler()
    where = {**asdict(shape), "device_name": torch.cuda.get_device_name(shape.device) if cuda else "CPU",
             "before": recorder.rss()}
    step = _reference_step if shape.path == "old" else _trainer_step
    try:
        return where | step(shape, model, loaded, optimizer, inputs, recorder)
    except torch.OutOfMemoryError:  # the old path at the paper's shapes: where it ran out is the result
        return where | {"seconds": recorder.seconds, "peaks": recorder.peaks, "peak": max(recorder.peaks.values()),
                        "out_of_memory": next(reversed(recorder.seconds)), "response_tokens": 0, "width": 0}


def _scored(rollout: Any, device: str) -> Any:
    """The rollout's batch with every response scored against ``REFERENCE_TEXT`` by the
    run's default reward (sentence BLEU)."""
    from leaf_plugins import get_host

    reward = get_host().rewards.get("sentence_bleu")
    scores = reward(rollout.texts, [REFERENCE_TEXT] * len(rollout.texts))
    return rollout.batch.with_rewards(torch.tensor(scores, dtype=torch.float32, device=rollout.batch.device))


def _trainer_step(shape: StepShape, model: Any, loaded: Any, optimizer: torch.optim.Optimizer,
                  inputs: dict[str, torch.Tensor], recorder: Any) -> dict[str, Any]:
    """The step a run makes: ``seconds``, ``peaks`` and ``peak`` as ``measure`` returns them."""
    from accelerate import Accelerator

    from leaf_plugins.core.engine import Engine
    from leaf_plugins.core.stages import RolloutRequest, StepContext
    from leaf_plugins.rollout.prompt_embedding import with_prompt_embeddings
    from leaf_plugins.rollout.sampling import sample_responses
    from leaf_plugins.training.config import LoraSettings, OptimConfig, RolloutConfig, TrainConfig
    from leaf_plugins.training.trainer import DefaultStages
    from leaf_plugins.training.update import Learner, StepData, update_policy

    config = TrainConfig(rollout=RolloutConfig(group_size=shape.group_size, prompts_per_step=shape.prompts,
                                               max_new_tokens=shape.new_tokens),
                         optim=OptimConfig(learning_rate=1e-5, micro_batch_prompts=1,
                                           activation_checkpointing=shape.activation_checkpointing),
                         lora=LoraSettings(rank=64, alpha=128, dropout=shape.lora_dropout))
    accelerator = Accelerator(cpu=torch.device(shape.device).type != "cuda")
    learner = Learner(model, model, optimizer, accelerator, DefaultStages(None, "static", None).compute_loss,
                      Path("."))
    engine = Engine("leaf", {}, {})
    with recorder as sampler:
        with sampler.phase("encode"):
            inputs = with_prompt_embeddings(model, inputs)
        with sampler.phase("generate"):
            rollout = sample_responses(RolloutRequest(model, loaded, inputs, shape.group_size, shape.new_tokens, 1.0,
                                                      0.9, fields=frozenset(engine.requires)))
        with sampler.phase("score"):
            batch = _scored(rollout, shape.device)
        with sampler.phase("estimate"):
            advantages = engine.estimate(batch).advantages
        context = StepContext(1, model, loaded, [None] * shape.prompts, inputs, config)  # the examples are not read
        everything = torch.ones_like(rollout.prompt_index, dtype=torch.bool)  # [N] no group dropped
        model.train()
        with sampler.phase("update"):  # one process: its rows are the whole step
            update_policy(learner, StepData(context, rollout, advantages.cpu(), everything, batch, rollout.prompt_index,
                                            everything, (tuple(range(shape.prompts)),)))
        peak = max(sampler.peaks.values())
    return {"seconds": sampler.seconds, "peaks": sampler.peaks, "peak": peak, "response_tokens": int(batch.lengths.sum()),
            "width": batch.width}


def _reference_step(shape: StepShape, model: Any, loaded: Any, optimizer: torch.optim.Optimizer,
                    inputs: dict[str, torch.Tensor], recorder: Any) -> dict[str, Any]:
    """The straightforward step of ``bench/step_reference.py``: ``seconds``, ``peaks`` and
    ``peak`` as ``measure`` returns them."""
    from leaf_plugins.bench.step_reference import response_logprobs_full_vocabulary, sample_responses_k_copies
    from leaf_plugins.core.engine import Engine
    from leaf_plugins.training.lora import reference_policy
    from leaf_plugins.training.loss import policy_loss

    engine = Engine("leaf", {}, {})
    with recorder as sampler:
        with sampler.phase("generate"):
            rollout = sample_responses_k_copies(model, loaded, inputs, shape.group_size, shape.new_tokens, 1.0, 0.9)
        with sampler.phase("score"):
            batch = _scored(rollout, shape.device)
        with sampler.phase("estimate"):
            advantages = engine.estimate(batch).advantages
        model.train()
        optimizer.zero_grad()
        with sampler.phase("update"):
            for prompt in range(shape.prompts):  # one prompt a micro-batch, each its own token mean
                rows = torch.nonzero(rollout.prompt_index.cpu() == prompt).squeeze(1)  # the batch lives on the host
                local = {key: value[prompt : prompt + 1] for key, value in inputs.items()}
                index = torch.zeros(len(rows), dtype=torch.long)
                tokens, lengths, mask = batch.tokens[rows], batch.lengths[rows], batch.mask[rows].to(shape.device)
                with torch.no_grad(), reference_policy(model):
                    reference = response_logprobs_full_vocabulary(model, local, tokens, lengths, index)
                current = response_logprobs_full_vocabulary(model, local, tokens, lengths, index)
                loss = policy_loss(current, batch.logprobs[rows].to(shape.device), reference,
                                   advantages[rows].to(shape.device), mask)
                (loss.loss / shape.prompts).backward()
                del current, loss
            optimizer.step()
        peak = max(sampler.peaks.values())
    return {"seconds": sampler.seconds, "peaks": sampler.peaks, "peak": peak, "response_tokens": int(batch.lengths.sum()),
            "width": batch.width}


def _child(function: Callable[..., Any], arguments: tuple, queue: Any) -> None:
    queue.put(function(*arguments))


def run_in_process(shape: Any, function: Callable[..., Any] = measure, *more: Any) -> Any:
    """``function(shape, *more)`` (default: ``measure(shape)``) in a fresh process, so that
    no earlier run's memory counts."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(function, (shape, *more), queue))
    process.start()
    process.join()
    if process.exitcode != 0:
        raise RuntimeError(f"the step at {shape} failed in its process (exit code {process.exitcode})")
    return queue.get()


def _gb(value: float) -> str:
    return f"{value / 1e9:.2f}"


SAME_SHAPE = ("backbone", "audio_seconds", "new_tokens", "activation_checkpointing", "lora_dropout")
"""Fields two measured steps share to be compared in a ratio."""


def step_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: seconds per phase, the step's total, and its peak memory above the
    loaded model (GB), one row per measured step (a step that ran out of device memory
    says in which phase); then old/new ratios at equal shapes. The peak is the resident
    set on the CPU and the CUDA allocator's on a GPU (named above the table)."""
    on_gpu = any(row.get("device", "cpu") != "cpu" for row in rows)
    header = ("| backbone (V) | audio s | T | path | " + " | ".join(PHASES)
              + f" | step s | peak above model GB | {'peak allocated GB' if on_gpu else 'peak RSS GB'} |\n"
              "|---|---|---|---|" + "---|" * len(PHASES) + "---|---|---|")
    devices = sorted({row.get("device_name", "CPU") for row in rows})
    dropouts = {row.get("lora_dropout") for row in rows}
    lines = ([f"Measured on {', '.join(devices)}; weights "
              + ("bf16, the real models' shapes (random weights)." if on_gpu else "float32, tiny stand-ins.") + "\n"]
             if on_gpu else []) + [header]
    for row in rows:
        phases = " | ".join(f"{row['seconds'][p]:.2f}" if p in row["seconds"] else "–" for p in PHASES)
        failed = row.get("out_of_memory")
        total = f"out of memory in {failed}" if failed else f"{sum(row['seconds'].values()):.1f}"
        above = f"> {_gb(row['peak'] - row['before'])}" if failed else _gb(row["peak"] - row["before"])
        path = (row["path"] + (" + checkpointing" if row.get("activation_checkpointing") else "")
                + (f", dropout {row['lora_dropout']:g}" if len(dropouts) > 1 else ""))
        lines.append(f"| {row['backbone']} ({row['vocab_size']:,}) | {row['audio_seconds']} | {row['new_tokens']} | "
                     f"{path} | {phases} | {total} | {above} | {_gb(row['peak'])} |")
    ratios = []
    for new in (r for r in rows if r["path"] == "new"):
        for old in (r for r in rows if r["path"] == "old" and not r.get("out_of_memory")):
            if all(old.get(key) == new.get(key) for key in SAME_SHAPE):
                ratios.append(f"- {new['backbone']}, {new['audio_seconds']} s, T = {new['new_tokens']}"
                              + (f", dropout {new['lora_dropout']:g}" if len(dropouts) > 1 else "") + ": old/new step time "
                              f"{sum(old['seconds'].values()) / sum(new['seconds'].values()):.1f}×, peak memory above "
                              f"the model {(old['peak'] - old['before']) / max(new['peak'] - new['before'], 1):.1f}×")
    for row in (r for r in rows if r["path"] == "new" and r.get("lora_dropout") and not r.get("out_of_memory")):
        for plain in (r for r in rows if r["path"] == "new" and r.get("lora_dropout") == 0
                      and not r.get("out_of_memory")):
            if all(plain.get(key) == row.get(key) for key in SAME_SHAPE if key != "lora_dropout"):
                ratios.append(f"- {row['backbone']}, {row['audio_seconds']} s, T = {row['new_tokens']}: keyed dropout "
                              f"{row['lora_dropout']:g}/no dropout step time "
                              f"{sum(row['seconds'].values()) / sum(plain['seconds'].values()):.2f}×, peak memory "
                              f"above the model {(row['peak'] - row['before']) / max(plain['peak'] - plain['before'], 1):.2f}×")
    return "\n".join(lines + ([""] + ratios if ratios else []))


def plot_growth(rows: list[dict[str, Any]], path: Path) -> None:
    """Peak step memory above the model against T, one line per (backbone, path)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for backbone in BACKBONE_VOCABULARIES:
        for path_name, style in (("old", "--o"), ("new", "-s")):
            points = sorted((r["new_tokens"], (r["peak"] - r["before"]) / 1e9) for r in rows
                            if r["backbone"] == backbone and r["path"] == path_name)
            if points:
                label = f"{backbone} (V={BACKBONE_VOCABULARIES[backbone]:,}), {path_name}"
                axis.plot(*zip(*points), style, label=label)
    axis.set_xlabel("response tokens T (6 prompts × K = 8; clip length in the table)")
    axis.set_ylabel("peak step memory above the model (GB)")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
