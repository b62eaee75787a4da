"""The shared-prefix teacher-forced pass (each prompt once, its keys and values selected
for its K rows) against the full pass (every row over its own prompt copy): the same
log-probabilities and the same gradients of the LoRA parameters, on both tiny families,
with ragged and empty responses, rows out of prompt order and a temperature; with LoRA
dropout on and keyed (the same units dropped in both passes); and which pass runs, with
how many forward calls whatever the responses' width."""

from __future__ import annotations

import pytest
import torch

from leaf_plugins.training.activation_checkpointing import enable_activation_checkpointing
from leaf_plugins.rollout.prompt_embedding import embed_prompts
from leaf_plugins.training.keyed_dropout import install_keyed_dropout, row_keys
from leaf_plugins.training.lora import attach_lora
from leaf_plugins.training.teacher_forcing import response_logprobs, shares_prefix
from test_rollout_static import prompt_inputs, variant, with_adapter

# log-probabilities of magnitude <= ~10: the two passes attend over the same keys but in
# kernels of other shapes ([N, L+T] rows against [P, L] then [N, T] over a cache), which
# moved them by at most 6.7e-6 (measured with the default kernels, ATEN_CPU_CAPABILITY=avx2
# and =default, 1 and 2 threads, several adapters); 7e-5 leaves a 10x margin
VALUE_TOLERANCE = 7e-5
# gradients of magnitude 8 to 100, the sum over rows taken in another order: at most
# 2.9e-6 of the largest apart (same settings); 3e-5 of the largest leaves a 10x margin
GRADIENT_TOLERANCE = 3e-5

# 3 prompts × 3 rows, listed out of prompt order; lengths ragged: full, 1, 0 (an empty
# response), …
PROMPT_INDEX = torch.tensor([2, 0, 1, 0, 2, 1, 0, 1, 2])
LENGTHS = torch.tensor([7, 1, 3, 0, 6, 2, 7, 5, 4])


@pytest.fixture(scope="module", params=["tiny-qwen2-audio", "tiny-granite-speech"])
def setup(request):
    loaded = variant(request.param)
    torch.manual_seed(0)  # the adapter's A matrices
    model = with_adapter(loaded).train()
    inputs = prompt_inputs(loaded)
    return model, {**inputs, "inputs_embeds": embed_prompts(model, inputs)}


@pytest.fixture
def family(setup, request) -> str:
    """The tiny backbone of ``setup``."""
    return request.node.callspec.params["setup"]


def responses(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """``[N, width]`` random text-token ids, ``-1`` after each row's length."""
    tokens = torch.randint(5, 200, (len(lengths), width), generator=torch.Generator().manual_seed(0))
    return torch.where(torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1), tokens, -1)


def values_and_gradients(model, inputs, tokens, lengths, shared: bool, keys=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``[N, T]`` log-probabilities and the flattened gradient of a weighted sum of them."""
    model.zero_grad()
    values = response_logprobs(model, inputs, tokens, lengths, PROMPT_INDEX, temperature=0.7, shared_prefix=shared,
                               dropout_keys=keys)
    weights = torch.linspace(0.5, 2.0, tokens.numel()).view(tokens.shape)  # every position counts differently
    (values * weights).sum().backward()
    gradient = torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])
    return values.detach(), gradient


@pytest.mark.parametrize("width", [7, 1])
def test_shared_prefix_pass_equals_the_full_pass(setup, width):
    model, inputs = setup
    lengths = LENGTHS.clamp(max=width)
    tokens = responses(lengths, width)
    full, full_gradient = values_and_gradients(model, inputs, tokens, lengths, shared=False)
    shared, shared_gradient = values_and_gradients(model, inputs, tokens, lengths, shared=True)
    torch.testing.assert_close(shared, full, rtol=0, atol=VALUE_TOLERANCE)
    assert bool((shared[lengths == 0] == 0).all()) and bool((full < 0)[tokens >= 0].all())
    scale = float(full_gradient.abs().max())
    assert scale > 1.0  # the adapter's A and B both receive gradient (B is non-zero)
    torch.testing.assert_close(shared_gradient, full_gradient, rtol=0, atol=GRADIENT_TOLERANCE * scale)


def test_keyed_dropout_drops_the_same_units_in_both_passes(setup, family):
    """With dropout on, both passes key a prompt's positions by the prompt alone and a
    response's by the response: the same masks, so the same values and gradients, and
    other values than without dropout."""
    model, inputs = setup
    dropped = attach_lora(variant(family), rank=8, alpha=16, dropout=0.3).train()
    assert install_keyed_dropout(dropped) > 0
    dropped.load_state_dict(model.state_dict(), strict=False)  # the same non-zero adapter
    group_ids = torch.tensor([7, 5, 6, 5, 7, 6, 5, 6, 7])  # each row's prompt's group id, as PROMPT_INDEX
    keys = row_keys(3, 2, 0, group_ids, PROMPT_INDEX, prompts=3)
    tokens = responses(LENGTHS, 7)
    full, full_gradient = values_and_gradients(dropped, inputs, tokens, LENGTHS, shared=False, keys=keys)
    shared, shared_gradient = values_and_gradients(dropped, inputs, tokens, LENGTHS, shared=True, keys=keys)
    plain, _ = values_and_gradients(model, inputs, tokens, LENGTHS, shared=True)
    torch.testing.assert_close(shared, full, rtol=0, atol=VALUE_TOLERANCE)
    scale = float(full_gradient.abs().max())
    torch.testing.assert_close(shared_gradient, full_gradient, rtol=0, atol=GRADIENT_TOLERANCE * scale)
    assert float((full - plain).abs().max()) > 100 * VALUE_TOLERANCE  # the masks did drop units


class ForwardCounter:
    """Counts the forward calls of a module (a pre-hook)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.calls = 0
        self.handle = module.register_forward_pre_hook(self.count)

    def count(self, *_: object) -> None:
        self.calls += 1


@pytest.mark.parametrize("width", [7, 2, 1])
def test_each_pass_makes_the_same_forward_calls_whatever_the_width(setup, width):
    """Under FSDP2 every forward call gathers the sharded weights with the other
    processes: a micro-batch of one-token responses makes the calls a wide one makes."""
    model, inputs = setup
    lengths = LENGTHS.clamp(max=width)
    counter = ForwardCounter(model.base_model.model)
    try:
        for shared, calls in ((True, 2), (False, 1)):
            counter.calls = 0
            with torch.no_grad():
                response_logprobs(model, inputs, responses(lengths, width), lengths, PROMPT_INDEX, shared_prefix=shared)
            assert counter.calls == calls, (shared, width)
    finally:
        counter.handle.remove()


def test_which_pass_runs(setup):
    model, inputs = setup
    counter = ForwardCounter(model.base_model.model)
    try:
        with torch.no_grad():  # left to decide: shared where it saves work, full for one response per prompt
            response_logprobs(model, inputs, responses(LENGTHS, 7), LENGTHS, PROMPT_INDEX)
            assert counter.calls == 2
            counter.calls = 0
            response_logprobs(model, inputs, responses(LENGTHS[:3], 7), LENGTHS[:3], torch.arange(3))
            assert counter.calls == 1  # the warm start's one reference per prompt: nothing shared
    finally:
        counter.handle.remove()
    assert shares_prefix(model)


def test_checkpointed_layers_recording_gradients_take_the_full_pass():
    model = with_adapter(variant("tiny-qwen2-audio")).train()
    enable_activation_checkpointing(model)
    assert not shares_prefix(model)  # transformers drops the cache there
    with torch.no_grad():
        assert shares_prefix(model)  # the reference pass runs the layers plainly
    model.eval()
    assert shares_prefix(model)
