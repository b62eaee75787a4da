"""The static loop's captured path (``decoding/cuda_graph.py``, ``static_rollout``):
the step a graph records equals the eager step, captures are reused across rollouts,
the self-check falls back to ``generate``, the model runs in eval mode, FSDP1 is refused,
nested gathering is safe, and the CUDA sort-based top-p draws the reference's tokens.

On the CPU the captured path runs with ``eager_capture`` (replaying runs the recorded
function itself): the static, masked span, the buffers reset in place, the self-check
and the fallback are the CUDA path's, minus the graph. The tests marked ``gpu`` run the
real CUDA graph on tiny backbones in float32 and bf16 (skipped without CUDA)."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_rollout_static import VALUE_TOLERANCE, prompt_inputs, variant, with_adapter
from transformers import TopPLogitsWarper

from leaf_plugins import ConfigError
from leaf_plugins.core.stages import RolloutRequest
from leaf_plugins.rollout.decoding import sampling_step, static_rollout as static_module
from leaf_plugins.rollout.decoding.cuda_graph import CHECK_TOLERANCE, cuda_capture, eager_capture
from leaf_plugins.rollout.decoding.decode_state import DecodeState
from leaf_plugins.rollout.decoding.family import unsupported_reason
from leaf_plugins.rollout.decoding.keyed_draw import keyed_uniforms, response_keys
from leaf_plugins.rollout.decoding.phase_timer import PhaseTimer
from leaf_plugins.rollout.decoding.static_rollout import graph_failure, release_captures, static_rollout
from leaf_plugins.training.lora import attach_lora
from leaf_plugins.rollout.prompt_embedding import embed_prompts
from leaf_plugins.rollout import backends as rollout_backend
from leaf_plugins.training.teacher_forcing import response_logprobs
from leaf_plugins.rollout.backends import resolve_backend

CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
BACKBONES = ["tiny-qwen2-audio", "tiny-granite-speech"]
NEW_TOKENS = 12  # 11 decode steps: 2 warm-up, the checked capture, 8 replays


def prepared(name: str, device: str = "cpu", dtype: torch.dtype = torch.float32, count: int = 3):
    """The tiny backbone with a non-zero LoRA adapter on ``device`` in ``dtype`` and its
    prompts' inputs with their embeddings."""
    loaded = variant(name)
    model = with_adapter(loaded).to(device=device, dtype=dtype)
    inputs = {key: value.to(device) for key, value in prompt_inputs(loaded, count).items()}
    inputs["input_features"] = inputs["input_features"].to(dtype)
    return loaded, model, {**inputs, "inputs_embeds": embed_prompts(model, inputs)}


def rollout(model, loaded, inputs, seed: int, group_size: int = 2, **options):
    torch.manual_seed(seed)
    return static_rollout(RolloutRequest(model, loaded, inputs, group_size, NEW_TOKENS, 1.0, 0.9), **options)


def assert_same_rollout(found, expected, tolerance: float) -> None:
    assert torch.equal(found.batch.tokens, expected.batch.tokens)
    assert torch.equal(found.batch.lengths, expected.batch.lengths)
    for name in ("logprobs", "surprisal", "sum_pi_squared"):
        gap = (getattr(found.batch, name) - getattr(expected.batch, name)).abs().max()
        assert gap <= tolerance, (name, float(gap))


class CountingCapture:
    """A capture that counts its recordings and replays with ``base``."""

    def __init__(self, base=eager_capture) -> None:
        self.base, self.count = base, 0

    def __call__(self, step):
        self.count += 1
        return self.base(step)


@pytest.mark.parametrize("name", BACKBONES)
def test_captured_path_equals_the_eager_loop_on_the_cpu(name):
    """The step the graph records (every slot attended, the unwritten ones masked; the
    prompts left padded to the width bucket; buffers reset in place), replayed, gives the
    eager loop's tokens and values (which attend over the written slots only): masked
    span attention is exact up to float32 summation order."""
    loaded, model, inputs = prepared(name)
    release_captures(model)
    eager = rollout(model, loaded, inputs, seed=3, cuda_graph=False)
    assert inputs["attention_mask"].shape[1] % static_module.WIDTH_BUCKET  # the bucket really pads
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the self-check passes: no fallback warning
        captured = rollout(model, loaded, inputs, seed=3, capture=eager_capture)
    assert graph_failure(model) is None
    assert captured.batch.tokens.shape[1] == NEW_TOKENS or bool((captured.batch.lengths < NEW_TOKENS).all())
    assert_same_rollout(captured, eager, VALUE_TOLERANCE)  # float32 sums over padded widths: see VALUE_TOLERANCE


def test_one_capture_per_model_and_shape_bucket_reused_across_rollouts():
    loaded, model, inputs = prepared("tiny-granite-speech")
    release_captures(model)
    capture = CountingCapture()
    first = rollout(model, loaded, inputs, seed=5, capture=capture)
    again = [rollout(model, loaded, inputs, seed=5, capture=capture) for _ in range(2)]
    assert capture.count == 1
    for found in again:  # the reused buffers and state were reset completely: the same rollout
        assert_same_rollout(found, first, 0.0)
    embeddings, mask = inputs["inputs_embeds"], inputs["attention_mask"]
    assert mask.shape[1] % static_module.WIDTH_BUCKET  # one more column of padding stays in the bucket
    wider = {**inputs, "inputs_embeds": torch.cat([embeddings[:, :1] * 0, embeddings], dim=1),
             "attention_mask": torch.cat([mask[:, :1] * 0, mask], dim=1)}
    assert_same_rollout(rollout(model, loaded, wider, seed=5, capture=capture), first, 0.0)
    assert capture.count == 1
    rollout(model, loaded, inputs, seed=5, group_size=3, capture=capture)  # another shape: captured once more
    assert capture.count == 2
    target = next(parameter for name, parameter in model.named_parameters() if "lora_B" in name)
    target.data = target.data.clone()  # a weight moved (as a re-gathered FSDP2 parameter may): captured again
    rollout(model, loaded, inputs, seed=5, capture=capture)
    assert capture.count == 3
    release_captures(model)


def perturbed(base):
    """A capture whose replay reads other sampling keys than the eager step did (a
    captured graph reading a stale buffer): its samples differ from the eager step's."""

    def capture(step):
        replay = base(step)

        def shifted():
            keys = live_states[-1].keys
            keys.add_(1)
            replay()
            keys.sub_(1)

        return shifted

    return capture


live_states: list[DecodeState] = []  # the decode states rollouts started (recorded by the test that perturbs)


state_device = ["cpu"]


def failing(step):
    raise RuntimeError("operation not permitted when stream is capturing")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[gpu, needs_cuda])])
@pytest.mark.parametrize("how, reason", [("mismatch", "sampled other tokens than the eager step"),
                                         ("error", "could not be captured as a CUDA graph")])
def test_a_failed_self_check_falls_back_to_generate_once(monkeypatch, device, how, reason):
    loaded, model, inputs = prepared("tiny-qwen2-audio", device)
    release_captures(model)
    state_device[0] = device
    calls = []
    generate = static_module.generate_rollout
    monkeypatch.setattr(static_module, "generate_rollout", lambda *args: calls.append(1) or generate(*args))
    base = cuda_capture if device == "cuda" else eager_capture
    start = DecodeState.start
    monkeypatch.setattr(DecodeState, "start", classmethod(
        lambda cls, *args: live_states.append(start(*args)) or live_states[-1]))
    capture = perturbed(base) if how == "mismatch" else failing
    with pytest.warns(UserWarning, match=f"rollout.backend=static: .*{reason}.*use Hugging Face generate"):
        first = rollout(model, loaded, inputs, seed=1, group_size=4, capture=capture)
    assert calls == [1] and reason in graph_failure(model)
    assert first.batch.size == 12 and first.batch.tokens.shape[1] >= 1
    torch.manual_seed(1)  # the seed the loop drew is the one generate draws: the fallback samples the loop's keys
    expected = generate(RolloutRequest(model, loaded, inputs, 4, NEW_TOKENS, 1.0, 0.9))
    assert torch.equal(first.batch.tokens, expected.batch.tokens)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning per model: later rollouts go to generate silently
        rollout(model, loaded, inputs, seed=2, group_size=4, capture=capture)
    assert calls == [1, 1]
    release_captures(model)
    assert graph_failure(model) is None


def test_the_model_runs_in_eval_mode_and_gets_its_modes_back():
    """LoRA dropout 0.5 in train mode would change every projection; inside the rollout
    the model is in eval mode (the same rollout as from an eval-mode model) and on exit
    every module's mode is what it was."""
    loaded = variant("tiny-qwen2-audio")
    model = attach_lora(loaded, rank=8, alpha=16, dropout=0.5)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.1, generator=torch.Generator().manual_seed(2))
    inputs = prompt_inputs(loaded)
    inputs = {**inputs, "inputs_embeds": embed_prompts(model.eval(), inputs)}
    expected = rollout(model, loaded, inputs, seed=4, capture=eager_capture)
    model.train()
    modes = {name: module.training for name, module in model.named_modules()}
    assert any(isinstance(module, torch.nn.Dropout) and module.training for module in model.modules())
    found = rollout(model, loaded, inputs, seed=4, capture=eager_capture)
    assert_same_rollout(found, expected, 0.0)
    assert modes == {name: module.training for name, module in model.named_modules()}
    release_captures(model)


def test_fsdp1_is_refused_with_a_clear_error():
    from torch.distributed.fsdp import FullyShardedDataParallel

    loaded = variant("tiny-qwen2-audio")
    wrapper = FullyShardedDataParallel.__new__(FullyShardedDataParallel)  # the type alone: no process group needed
    torch.nn.Module.__init__(wrapper)
    loaded.model.add_module("fsdp_wrapped", wrapper)
    reason = unsupported_reason(loaded.model)
    assert "FSDP1" in reason and "fully_shard" in reason
    with pytest.raises(ConfigError, match="rollout.backend=static: the model is wrapped in FSDP1"):
        resolve_backend(loaded.model, "static")


def test_gathered_for_generation_is_safe_to_enter_twice(monkeypatch):
    from leaf_plugins.rollout import generation_weights

    events = []

    class Sharded(torch.nn.Linear):
        """Records the FSDP2 calls ``gathered_for_generation`` makes."""

        def unshard(self):
            events.append("unshard")

        def reshard(self):
            events.append("reshard")

        def set_reshard_after_forward(self, value, recurse=True):
            events.append(f"reshard_after_forward={value}")

    monkeypatch.setattr(generation_weights, "FSDPModule", Sharded)  # the type the block looks for
    gathered_for_generation = generation_weights.gathered_for_generation
    model = torch.nn.Sequential(Sharded(2, 2))
    with gathered_for_generation(model):
        assert events == ["reshard_after_forward=False", "unshard"]
        with gathered_for_generation(model):
            pass
        assert events == ["reshard_after_forward=False", "unshard"]  # the inner block neither gathers nor reshards
    assert events == ["reshard_after_forward=False", "unshard", "reshard", "reshard_after_forward=True"]
    with gathered_for_generation(model):  # and a later block gathers again
        pass
    assert events[4:] == ["reshard_after_forward=False", "unshard", "reshard", "reshard_after_forward=True"]


@pytest.mark.parametrize("temperature, top_p", [(1.0, 0.9), (0.7, 0.5), (1.3, 0.95)])
def test_sort_based_top_p_draws_the_reference_tokens_given_the_same_keys(monkeypatch, temperature, top_p):
    """The sampler with CUDA's ``torch.sort`` (forced on the CPU) and with numpy's sort
    draws the same tokens as an inverse transform of transformers' ``TopPLogitsWarper``
    distribution with the same keyed uniforms (a loop over the vocabulary), and writes
    the same log q."""
    rows, vocab, banned = 64, 1000, [3, 17]
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 3
    scaled = logits / temperature
    scaled[:, banned] = float("-inf")
    reference_q = torch.softmax(TopPLogitsWarper(top_p)(None, scaled.clone()), dim=-1)  # [N, V]
    keys = response_keys(9, range(rows // 4), 4)  # [N]
    uniforms = keyed_uniforms(keys, 0).double()
    expected = []
    for row in range(rows):  # the first token whose cumulative probability exceeds u · total
        cumulative, total = 0.0, float(reference_q[row].double().sum())
        for token, probability in enumerate(reference_q[row].double().tolist()):
            cumulative += probability
            if cumulative > float(uniforms[row]) * total:
                expected.append(token)
                break
    expected = torch.tensor(expected)
    found = {}
    for sort in ("numpy", "torch"):
        if sort == "torch":
            monkeypatch.setattr(sampling_step, "_sorted_values", lambda scores: torch.sort(scores, dim=-1).values)
        sampler = sampling_step.SamplingStep(temperature, top_p, banned, vocab, eos_token_id=vocab - 1,
                                             pad_token_id=0, device=torch.device("cpu"))
        state = DecodeState.start(torch.full((rows,), 5), 2, pad_token_id=0, keys=keys)
        sampler(logits, state)
        found[sort] = state
        # float32 cumulative sums against float64 ones: a token differs only where u lands within
        # their rounding (about 1e-7) of a boundary, which these 64 rows do not
        assert torch.equal(state.generated[:, 0], expected), sort
        expected_log_q = reference_q.gather(1, expected[:, None]).log()[:, 0]
        # float32 softmax over 1000 entries of the same scores: rounding only
        assert torch.allclose(state.sampling_logprobs[:, 0], expected_log_q, atol=1e-5)
    assert torch.equal(found["numpy"].sampling_logprobs, found["torch"].sampling_logprobs)


def test_unset_backend_on_cuda_is_generate_until_static_is_made_the_default(monkeypatch):
    loaded = variant("tiny-qwen2-audio")
    assert resolve_backend(loaded.model, None) == "static"  # the CPU
    monkeypatch.setattr(rollout_backend, "_on_cuda", lambda model: True)
    assert resolve_backend(loaded.model, None) == "generate"
    assert resolve_backend(loaded.model, "static") == "static"  # opt-in
    monkeypatch.setattr(rollout_backend, "STATIC_BY_DEFAULT_ON_CUDA", True)
    assert resolve_backend(loaded.model, None) == "static"


def test_phase_timer_marks_prefill_capture_and_decode():
    loaded, model, inputs = prepared("tiny-granite-speech")
    release_captures(model)
    timers = [PhaseTimer(torch.device("cpu")) for _ in range(2)]
    results = [rollout(model, loaded, inputs, seed=6, capture=eager_capture, timer=timer) for timer in timers]
    first, second = (timer.milliseconds() for timer in timers)
    assert set(first) == {"prefill", "capture", "decode"} and set(second) == {"prefill", "decode"}
    assert min(first.values()) > 0 and min(second.values()) > 0
    steps = results[1].batch.tokens.shape[1] - 1  # every decode step ran (no row ended early) or fewer
    assert timers[1].decode_steps >= steps and timers[0].decode_steps == timers[1].decode_steps - 3


# on a GPU ---------------------------------------------------------------------------------------------------


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", BACKBONES)
def test_cuda_graph_equals_the_eager_step_on_the_same_buffers(name, dtype):
    """The CUDA graph's replays against the very function they recorded, run eagerly
    (``eager_capture``) over the same buffers with the same random draws: the same
    tokens, log-probabilities within the self-check's tolerance."""
    loaded, model, inputs = prepared(name, "cuda", dtype)
    release_captures(model)
    capture = CountingCapture(cuda_capture)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graphed = rollout(model, loaded, inputs, seed=7, capture=capture)
        again = rollout(model, loaded, inputs, seed=7, capture=capture)
    assert capture.count == 1 and graph_failure(model) is None
    release_captures(model)
    eager = rollout(model, loaded, inputs, seed=7, capture=eager_capture)
    assert_same_rollout(graphed, eager, CHECK_TOLERANCE)
    assert_same_rollout(again, graphed, 0.0)  # a reused capture replays the same rollout
    release_captures(model)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", BACKBONES)
def test_cuda_rollout_logprobs_against_teacher_forcing(name, dtype):
    """|Δ log π| between the graphed rollout and the teacher-forced pass. float32: the
    CPU's bound (``VALUE_TOLERANCE``) times 10 for the GPU's other summation orders
    (cuBLAS split reductions, no TF32: PyTorch keeps float32 matmuls exact by default);
    bf16: every product rounds to 8 bits of mantissa in a different order in the two
    passes, and the rollout folds the LoRA into bf16 weights where the teacher-forced pass
    runs peft's float32 adapter; an H100 measured means of 0.021-0.040 and maxima up to
    0.30 (docs/rollout.md), so a mean above 0.1 or a single token off by more than 1.0 is
    a bug, not rounding."""
    loaded, model, inputs = prepared(name, "cuda", dtype)
    release_captures(model)
    found = rollout(model, loaded, inputs, seed=8, group_size=4)
    assert graph_failure(model) is None
    batch = found.batch
    rows = torch.arange(batch.size) // 4
    forced = torch.cat([response_logprobs(model, {key: value[row:row + 1] for key, value in inputs.items()},
                                          batch.tokens[rows == row].cuda(), batch.lengths[rows == row].cuda(),
                                          torch.zeros(4, dtype=torch.long, device="cuda")).float().cpu()
                        for row in range(3)])
    delta = (forced - batch.logprobs)[batch.mask].abs()
    print(f"{name} {dtype}: |Δ log π| mean {float(delta.mean()):.5f} max {float(delta.max()):.5f} "
          f"over {delta.numel()} tokens")
    if dtype == torch.float32:
        assert float(delta.max()) <= 10 * VALUE_TOLERANCE
    else:
        assert float(delta.mean()) <= 0.1 and float(delta.max()) <= 1.0
    release_captures(model)
