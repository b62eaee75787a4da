"""``leaf bench rollout``: both rollout backends side by side, in one process per
backbone: milliseconds per generated token (one decode step of all N rows), peak
memory, the memory-bandwidth floor and the ratio to it; then the bf16 rollout/teacher-
forced mismatch of each backend.

The floor is what one decode step must read at least, divided by a bandwidth measured
here (a large tensor read once): the weights the step uses (the decoder layers with
their LoRA adapters, the final norm, the output head; not the audio encoder nor the
embedding table, of which a step reads N rows) plus the mean KV cache of the standard
layout (every row holds its prompt's keys and values, padding included, and the tokens
generated so far: ``L + T/2`` positions on average). The static
loop's shared-prefix layout reads less (the prompt's keys and values once per prompt);
that figure is reported beside it.

On the CPU: the built-in tiny backbones (the demo's ``tiny-qwen2-audio`` and
``tiny-granite-speech``, float32) at the demo's shape: 6 prompts × K = 8, 48 new tokens,
clips as long as the demo task's first six training clips, LoRA rank 64; the peak is the
resident set (sampled every millisecond) above the one before the rollout. With
``--device cuda``: random-weight Qwen2-Audio-7B and Granite Speech 3.3 8B from their
published configs in bf16, built directly on the GPU (``backbones``' ``random_*``
builders), the paper's shape (6 × 8, 30 s clips, T = 200 unless told, LoRA rank 64);
the peak is the CUDA allocator's above the memory allocated before the rollout. Random
weights rarely sample EOS, so rows run to T.

The static backend's phases are timed apart (CUDA events on a GPU, ``PhaseTimer``):
the prefill (with the first sample), the capture (two warm-up steps, the self-check
and the capture, timed on the first rollout, which the timed ones reuse) and the
decode steps after it, reported per step against the floor. With ``profile`` the
static decode step's device time is split by operator category (``torch.profiler``,
eager steps: a rollout of ``2 + PROFILE_STEPS`` tokens minus one of 2).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["RolloutShape", "DEMO_CLIP_SECONDS", "cpu_shapes", "cuda_shapes", "measure_bandwidth", "decode_bytes",
           "measure_rollout", "measure_mismatch", "rollout_table", "mismatch_table", "MISMATCH_EPSILON",
           "profile_decode_step", "profile_table", "PROFILE_STEPS"]

DEMO_CLIP_SECONDS = (2.24, 1.49, 2.17, 1.61, 1.74, 1.96)
"""The demo's first six training clips (``spoken-translation``, size 560, seed 0), in seconds."""

BACKENDS = ("generate", "static")
MISMATCH_EPSILON = 0.2  # the clip range of the paper's loss
PROFILE_STEPS = 8
PROMPT = "<|audio|> translate the audio from english to german"


@dataclass(frozen=True)
class RolloutShape:
    """One measured configuration (both backends run it)."""

    backbone: str  # "qwen2-audio" or "granite-speech"
    device: str = "cpu"
    size: str = "tiny"  # "tiny": the built-in tiny backbone, float32; "paper": the real config, random weights, bf16
    prompts: int = 6
    group_size: int = 8
    new_tokens: int = 48
    clip_seconds: tuple[float, ...] = DEMO_CLIP_SECONDS
    lora_rank: int = 64
    repeats: int = 5  # timed rollouts per backend, alternating backends; the median is reported
    profile: bool = False  # also split the static decode step's device time by operator category


def cpu_shapes(repeats: int, quick: bool = False) -> list[RolloutShape]:
    """The demo's shape on both tiny backbones (or a few-second version for tests)."""
    if quick:
        return [RolloutShape("qwen2-audio", prompts=2, group_size=2, new_tokens=4, clip_seconds=(1.0, 1.5),
                             lora_rank=4, repeats=1)]
    return [RolloutShape(backbone, repeats=repeats) for backbone in ("qwen2-audio", "granite-speech")]


def cuda_shapes(device: str, repeats: int, new_tokens: int = 200, profile: bool = False) -> list[RolloutShape]:
    """The paper's shape on both real-size backbones (``new_tokens`` per response)."""
    return [RolloutShape(backbone, device=device, size="paper", new_tokens=new_tokens, clip_seconds=(30.0,) * 6,
                         repeats=repeats, profile=profile) for backbone in ("qwen2-audio", "granite-speech")]


def measure_bandwidth(device: str, gigabytes: float | None = None) -> float:
    """Bytes per second of reading one large float32 tensor (``sum``), best of 5: 0.5 GB
    on the CPU, 4 GB on a GPU (well beyond the caches)."""
    size = gigabytes or (4.0 if torch.device(device).type == "cuda" else 0.5)
    values = torch.ones(int(size * 1e9) // 4, dtype=torch.float32, device=device)
    best = float("inf")
    for _ in range(6):  # the first read warms up
        _synchronise(device)
        started = time.perf_counter()
        values.sum()
        _synchronise(device)
        best = min(best, time.perf_counter() - started)
    return values.numel() * 4 / best


def _synchronise(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def decode_bytes(model: Any, prompts: int, rows: int, prompt_width: int, new_tokens: int) -> dict[str, float]:
    """What one decode step reads at least, in bytes: ``weights`` (decoder layers with
    LoRA, final norm, output head, each tensor once), ``kv_standard`` (the mean KV cache
    of the standard layout), ``kv_shared`` (the mean of what the shared-prefix layout
    reads over the written slots) and ``kv_shared_graph`` (over all slots, as the
    captured CUDA graph does)."""
    from leaf_plugins.rollout.decoding.family import decoder_family

    family = decoder_family(model)
    seen: dict[int, int] = {}
    for module in (*family.layers, family.decoder.norm, family.head):
        for parameter in module.parameters():
            seen[parameter.data_ptr()] = parameter.numel() * parameter.element_size()
    element = next(iter(family.head.parameters())).element_size()
    per_position = 2 * len(family.layers) * family.kv_heads * family.head_dim * element  # keys and values
    mean_generated = new_tokens / 2
    return {
        "weights": float(sum(seen.values())),
        "kv_standard": per_position * rows * (prompt_width + mean_generated),
        "kv_shared": per_position * (prompts * prompt_width + rows * mean_generated),
        "kv_shared_graph": per_position * (prompts * prompt_width + rows * (new_tokens - 1)),
    }


def _load(shape: RolloutShape, dtype: torch.dtype | None = None) -> Any:
    from leaf_plugins.backbones.granite_speech import random_granite_speech_3_3_8b, tiny_granite_speech
    from leaf_plugins.backbones.qwen2_audio import random_qwen2_audio_7b, tiny_qwen2_audio

    if shape.size == "paper":
        build = random_qwen2_audio_7b if shape.backbone == "qwen2-audio" else random_granite_speech_3_3_8b
        return build(0, shape.device, torch.bfloat16)
    loaded = tiny_qwen2_audio(0) if shape.backbone == "qwen2-audio" else tiny_granite_speech(0)
    loaded.model.to(device=shape.device, dtype=dtype or torch.float32)
    return loaded


def _prepared(shape: RolloutShape, dtype: torch.dtype | None = None) -> tuple[Any, Any, dict[str, torch.Tensor]]:
    """The backbone, its model with a LoRA adapter attached as the trainer attaches it
    (in eval mode, as during a rollout) and the prompts' inputs with their embeddings."""
    from leaf_plugins.training.lora import attach_lora
    from leaf_plugins.rollout.prompt_embedding import with_prompt_embeddings

    loaded = _load(shape, dtype)
    model = attach_lora(loaded, rank=shape.lora_rank, alpha=2 * shape.lora_rank, dropout=0.05).eval()
    rng = np.random.default_rng(0)
    clips = [shape.clip_seconds[i % len(shape.clip_seconds)] for i in range(shape.prompts)]
    audios = [(rng.standard_normal(int(16000 * seconds)) * 0.1).astype(np.float32) for seconds in clips]
    inputs = loaded.spec.build_inputs(loaded, [PROMPT] * shape.prompts, audios)
    inputs = {key: value.to(shape.device) for key, value in inputs.items()}
    return loaded, model, with_prompt_embeddings(model, inputs)


def measure_rollout(shape: RolloutShape) -> dict[str, Any]:
    """Both backends at ``shape`` in this process: per backend the median milliseconds
    per generated token and the peak memory above the model; the static backend's
    phases; the floor's bytes and the measured bandwidth; then the bf16 mismatch of each
    backend (``measure_mismatch``) and, with ``shape.profile``, the decode step's profile."""
    from leaf_plugins.bench.step import run_in_process
    from leaf_plugins.rollout.decoding.phase_timer import PhaseTimer
    from leaf_plugins.core.stages import RolloutRequest
    from leaf_plugins.rollout.decoding.static_rollout import graph_failure, static_folds, static_rollout
    from leaf_plugins.rollout.sampling import sample_responses

    torch.manual_seed(0)
    loaded, model, inputs = _prepared(shape)
    cuda = torch.device(shape.device).type == "cuda"
    rows = shape.prompts * shape.group_size
    request = RolloutRequest(model, loaded, inputs, shape.group_size, shape.new_tokens, 1.0, 0.9)

    def rollout(backend: str, seed: int, timer: PhaseTimer | None = None) -> Any:
        torch.manual_seed(seed)
        if backend == "static":
            return static_rollout(request, timer=timer)
        return sample_responses(request, backend)

    first = PhaseTimer(torch.device(shape.device))
    for backend in BACKENDS:  # warm-up: first-call costs (allocator, kernels, the capture) are not the rollout's
        rollout(backend, 0, first if backend == "static" else None)
    fallback = graph_failure(model)
    folded = static_folds(model)
    timings: dict[str, list[float]] = {backend: [] for backend in BACKENDS}
    phases: dict[str, list[float]] = {"prefill_ms": [], "decode_ms_per_step": []}
    peaks: dict[str, int] = {}
    widths: dict[str, list[int]] = {backend: [] for backend in BACKENDS}
    for repeat in range(shape.repeats):
        for backend in BACKENDS:
            if cuda:
                torch.cuda.synchronize(shape.device)
                torch.cuda.reset_peak_memory_stats(shape.device)
                before = torch.cuda.memory_allocated(shape.device)
            timer = PhaseTimer(torch.device(shape.device)) if backend == "static" and fallback is None else None
            started = time.perf_counter()
            result = rollout(backend, repeat + 1, timer)
            _synchronise(shape.device)
            seconds = time.perf_counter() - started
            timings[backend].append(1000 * seconds / result.batch.width)
            widths[backend].append(result.batch.width)
            if timer is not None:
                found = timer.milliseconds()
                phases["prefill_ms"].append(found["prefill"])
                if timer.decode_steps:
                    phases["decode_ms_per_step"].append(found["decode"] / timer.decode_steps)
            if cuda:
                peaks[backend] = max(peaks.get(backend, 0), torch.cuda.max_memory_allocated(shape.device) - before)
    if not cuda:  # the resident set keeps what an earlier rollout freed: each backend's peak in a fresh process
        peaks = {backend: run_in_process(shape, peak_resident_memory, backend) for backend in BACKENDS}
    bandwidth = measure_bandwidth(shape.device)
    reads = decode_bytes(model, shape.prompts, rows, inputs["attention_mask"].shape[1], shape.new_tokens)
    first_phases = first.milliseconds() if fallback is None else {}
    result = {
        **asdict(shape),
        "device_name": torch.cuda.get_device_name(shape.device) if cuda else "CPU",
        "versions": {"torch": torch.__version__, "transformers": _version("transformers"), "peft": _version("peft")},
        "prompt_width": int(inputs["attention_mask"].shape[1]),
        "ms_per_token": {backend: float(np.median(values)) for backend, values in timings.items()},
        "static_phases": {
            **{name: float(np.median(values)) if values else None for name, values in phases.items()},
            "capture_ms": first_phases.get("capture"),
        },
        "static_fallback": fallback,
        "static_folded": folded,
        "widths": widths,
        "peak_above_model": peaks,
        "bandwidth": bandwidth,
        "bytes": reads,
    }
    # the paper models already run in bf16; the tiny ones are measured again as a bf16 copy
    result["mismatch"] = measure_mismatch(shape, *((loaded, model, inputs) if shape.size == "paper"
                                                   else _prepared(shape, torch.bfloat16)))
    if shape.profile:
        result["profile"] = profile_decode_step(model, loaded, inputs, shape.group_size)
    return result


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "absent"


PROFILE_CATEGORIES = (
    ("weight matmuls (2-D: projections, LoRA, head)", ("aten::mm", "aten::addmm")),
    ("attention matmuls (batched)", ("aten::bmm", "aten::baddbmm")),
    ("sort (top-p)", ("aten::sort",)),
    ("softmax, log-softmax", ("aten::_softmax", "aten::_log_softmax")),
    ("copies and casts", ("aten::copy_", "aten::clone", "aten::_to_copy")),
    ("indexing, concatenation", ("aten::index_copy_", "aten::cat", "aten::index", "aten::gather", "aten::roll",
                                 "aten::repeat_interleave")),
    ("reductions (argmin, sum, mean)", ("aten::argmin", "aten::sum", "aten::mean", "aten::max", "aten::all")),
)
"""Operator categories of the profile: each operator's own device time (its kernels)."""

KERNEL_CATEGORIES = (
    ("float32 SIMT GEMM (no tensor cores)", ("simt",)),
    ("tensor-core GEMM", ("nvjet", "gemm", "cutlass", "xmma", "cublas")),
    ("softmax", ("softmax",)),
    ("sort", ("sort", "radix")),
    ("reductions", ("reduce",)),
    ("copies and casts", ("copy",)),
    ("indexing", ("index", "gather", "scatter", "cat")),
    ("elementwise", ("elementwise", "vectorized")),
)
"""Kernel categories by name (the first match wins)."""


def _category(name: str) -> str:
    for category, names in PROFILE_CATEGORIES:
        if name in names:
            return category
    return "elementwise and other"


def _kernel_category(name: str) -> str:
    lowered = name.lower()
    for category, parts in KERNEL_CATEGORIES:
        if any(part in lowered for part in parts):
            return category
    return "other kernels"


def _summed(per_step: dict[str, float], categorise: Any) -> dict[str, float]:
    found: dict[str, float] = {}
    for name, ms in per_step.items():
        found[categorise(name)] = found.get(categorise(name), 0.0) + ms
    return found


def profile_decode_step(model: Any, loaded: Any, inputs: dict[str, torch.Tensor], group_size: int,
                        steps: int = PROFILE_STEPS) -> dict[str, Any]:
    """Milliseconds of device time per static decode step (CPU time on the CPU), by
    operator category (``PROFILE_CATEGORIES``: each operator's own kernels) and, on a
    GPU, by kernel category (``KERNEL_CATEGORIES``), the largest operators, and the
    step's device time with the LoRA adapter disabled: eager rollouts
    (``cuda_graph=False``) of ``2 + steps`` and of 2 tokens are profiled and subtracted,
    so the prefill and the first sample cancel out."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from leaf_plugins.core.stages import RolloutRequest
    from leaf_plugins.rollout.decoding.static_rollout import static_rollout

    device = inputs["attention_mask"].device
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])

    def times(new_tokens: int) -> tuple[dict[str, float], dict[str, float]]:
        """(operator, kernel) milliseconds of one eager rollout of ``new_tokens``."""
        torch.manual_seed(0)
        with profile(activities=activities) as profiler:
            static_rollout(RolloutRequest(model, loaded, inputs, group_size, new_tokens, 1.0, 0.9), cuda_graph=False)
            _synchronise(str(device))
        operators: dict[str, float] = {}
        kernels: dict[str, float] = {}
        for event in profiler.key_averages():
            if event.device_type == DeviceType.CPU:  # an operator: its own kernels' device time
                micros = event.self_device_time_total if cuda else event.self_cpu_time_total
                operators[event.key] = operators.get(event.key, 0.0) + micros / 1000
            else:  # a kernel (or a device-side runtime event)
                kernels[event.key] = kernels.get(event.key, 0.0) + event.self_device_time_total / 1000
        return operators, kernels

    def per_step() -> tuple[dict[str, float], dict[str, float]]:
        (short_ops, short_kernels), (long_ops, long_kernels) = times(2), times(2 + steps)
        return ({name: (ms - short_ops.get(name, 0.0)) / steps for name, ms in long_ops.items()},
                {name: (ms - short_kernels.get(name, 0.0)) / steps for name, ms in long_kernels.items()})

    times(2)  # warm-up
    operators, kernels = per_step()
    found: dict[str, Any] = {
        "steps": steps, "clock": "device" if cuda else "cpu",
        "categories": _summed(operators, _category),
        "kernel_categories": _summed(kernels, _kernel_category),
        "top_operators": [[name, ms] for name, ms in sorted(operators.items(), key=lambda item: -item[1])[:10]],
        "total_ms_per_step": sum(operators.values()),
    }
    disable = getattr(model, "disable_adapter", None)
    if disable is not None:
        with disable():
            without, _ = per_step()
        found["total_ms_per_step_without_adapter"] = sum(without.values())
    return found


def peak_resident_memory(shape: RolloutShape, backend: str) -> int:
    """The largest resident set above the one before, over one rollout of ``backend``
    at ``shape`` (the model and inputs prepared first), sampled every millisecond."""
    from leaf_plugins.bench.step import MemorySampler
    from leaf_plugins.core.stages import RolloutRequest
    from leaf_plugins.rollout.sampling import sample_responses

    loaded, model, inputs = _prepared(shape)
    with MemorySampler() as sampler:
        before = sampler.rss()
        with sampler.phase(backend):
            torch.manual_seed(1)
            sample_responses(RolloutRequest(model, loaded, inputs, shape.group_size, shape.new_tokens, 1.0, 0.9),
                             backend)
    return sampler.peaks[backend] - before


def measure_mismatch(shape: RolloutShape, loaded: Any, model: Any, inputs: dict[str, torch.Tensor]
                     ) -> dict[str, dict[str, float]]:
    """Per backend, over one rollout at ``shape`` of the bf16 ``model``: the max and mean
    of ``|log π_teacher-forced − log π_rollout|`` over the response tokens and the share
    of tokens whose ratio ``exp(Δ)`` leaves ``[1 − ε, 1 + ε]``. The adapter's B matrices
    are drawn first (std 0.02): attached fresh, the adapter is the identity."""
    from leaf_plugins.core.stages import RolloutRequest
    from leaf_plugins.rollout.sampling import sample_responses
    from leaf_plugins.training.teacher_forcing import response_logprobs

    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator).to(parameter) * 0.02)
    found = {}
    for backend in BACKENDS:
        torch.manual_seed(0)
        rollout = sample_responses(RolloutRequest(model, loaded, inputs, shape.group_size, shape.new_tokens, 1.0, 0.9),
                                   backend)
        batch = rollout.batch
        forced = []
        with torch.no_grad():
            for prompt in range(shape.prompts):  # one prompt's K rows at a time: bounded logits memory
                rows = torch.nonzero(rollout.prompt_index == prompt).squeeze(1)
                local = {key: value[prompt : prompt + 1] for key, value in inputs.items()}
                forced.append(response_logprobs(model, local, batch.tokens[rows], batch.lengths[rows],
                                                torch.zeros(len(rows), dtype=torch.long)).float().cpu())
        delta = (torch.cat(forced) - batch.logprobs)[batch.mask]
        ratio = delta.exp()
        outside = (ratio < 1 - MISMATCH_EPSILON) | (ratio > 1 + MISMATCH_EPSILON)
        found[backend] = {"tokens": int(delta.numel()), "max": float(delta.abs().max()),
                          "mean": float(delta.abs().mean()), "outside": float(outside.float().mean())}
    return found


def _size(value: float) -> str:
    """Bytes as GB, or MB below 1 GB."""
    return f"{value / 1e9:.2f} GB" if value >= 1e9 else f"{value / 1e6:.1f} MB"


def rollout_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per backbone and backend, ms per generated token (the whole rollout over
    its width), × the floor, tokens per second, the speed-up over ``generate``, peak
    memory; the static backend's prefill, capture and per-step decode (× the floor); then
    each backbone's floor arithmetic."""
    lines = ["| backbone | device | rows × new tokens | backend | ms per token | × floor | tokens/s | "
             "speed-up over generate | decode step ms (× floor) | prefill ms | capture ms | "
             "peak memory above the model |", "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    notes = []
    for row in rows:
        reads, bandwidth = row["bytes"], row["bandwidth"]
        floor = 1000 * (reads["weights"] + reads["kv_standard"]) / bandwidth
        shared_floor = 1000 * (reads["weights"] + reads["kv_shared"]) / bandwidth
        shape = f"{row['prompts']}×{row['group_size']} × {row['new_tokens']}"
        rows_decoded = row["prompts"] * row["group_size"]
        phases = row.get("static_phases") or {}
        for backend in BACKENDS:
            ms = row["ms_per_token"][backend]
            speedup = row["ms_per_token"]["generate"] / ms
            step, prefill, capture = (phases.get(name) if backend == "static" else None
                                      for name in ("decode_ms_per_step", "prefill_ms", "capture_ms"))
            step_text = f"{step:.2f} ({step / floor:.1f}×)" if step is not None else "–"
            if backend == "static" and row.get("static_fallback"):
                step_text = "fell back to generate"
            lines.append(f"| {row['backbone']} ({row['size']}) | {row['device_name']} | {shape} | {backend} | {ms:.2f} | "
                         f"{ms / floor:.1f}× | {rows_decoded * 1000 / ms:.0f} | {speedup:.2f}× | {step_text} | "
                         f"{_ms(prefill)} | {_ms(capture)} | {_size(row['peak_above_model'][backend])} |")
        notes.append(f"- {row['backbone']} ({row['size']}, prompt width {row['prompt_width']}): weights read per step "
                     f"{_size(reads['weights'])}, mean KV cache of the standard layout {_size(reads['kv_standard'])} "
                     f"(the shared-prefix layout reads {_size(reads['kv_shared'])} over the written slots, "
                     f"{_size(reads['kv_shared_graph'])} as the CUDA graph does); measured bandwidth "
                     f"{bandwidth / 1e9:.1f} GB/s; floor {floor:.3f} ms per token ({shared_floor:.3f} ms with the "
                     f"shared-prefix reads)")
        if row.get("static_fallback"):
            notes.append(f"  - the static backend fell back to generate: {row['static_fallback']}")
        elif row.get("static_folded") is not None:
            notes.append("  - static: the projections ran " + ("folded (LoRA folded into a copy of the weights, "
                         "q/k/v and gate/up concatenated)" if row["static_folded"] else "unfolded (the adapter as peft "
                                                                                       "runs it)"))
    return "\n".join(lines + [""] + notes)


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def profile_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: each profiled backbone's static decode step by operator category."""
    lines = []
    for row in rows:
        found = row.get("profile")
        if not found:
            continue
        total = found["total_ms_per_step"]
        lines += [f"{row['backbone']} ({row['size']}, {row['device_name']}): eager decode step, {total:.2f} ms of "
                  f"{found['clock']} time per step ({found['steps']} steps)", "",
                  "| category | ms per step | share |", "|---|---:|---:|"]
        for category, ms in sorted(found["categories"].items(), key=lambda item: -item[1]):
            lines.append(f"| {category} | {ms:.3f} | {100 * ms / total if total else 0:.0f}% |")
        kernels = found.get("kernel_categories") or {}
        if kernels:
            kernel_total = sum(kernels.values())
            lines += ["", "| kernel category | ms per step | share |", "|---|---:|---:|"]
            for category, ms in sorted(kernels.items(), key=lambda item: -item[1]):
                lines.append(f"| {category} | {ms:.3f} | {100 * ms / kernel_total if kernel_total else 0:.0f}% |")
        lines += ["", "largest operators: " + ", ".join(f"{name} {ms:.3f} ms" for name, ms in found["top_operators"])]
        if found.get("total_ms_per_step_without_adapter") is not None:
            lines += ["", f"the same step with the LoRA adapter disabled: "
                          f"{found['total_ms_per_step_without_adapter']:.2f} ms"]
        lines.append("")
    return "\n".join(lines)


def mismatch_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: the bf16 rollout/teacher-forced mismatch per backbone and backend."""
    lines = [f"| backbone | backend | response tokens | max abs Δ log π | mean abs Δ log π | ratio outside "
             f"[{1 - MISMATCH_EPSILON:g}, {1 + MISMATCH_EPSILON:g}] |", "|---|---|---:|---:|---:|---:|"]
    for row in rows:
        for backend, found in row["mismatch"].items():
            lines.append(f"| {row['backbone']} ({row['size']}, bf16) | {backend} | {found['tokens']} | "
                         f"{found['max']:.4f} | {found['mean']:.4f} | {100 * found['outside']:.2f}% |")
    return "\n".join(lines)
