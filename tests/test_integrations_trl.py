"""LeafGRPOTrainer with the real TRL on CPU: a tiny random-weight causal LM, a real reward
function, a few training steps. The advantages that reach TRL's loss are checked against
``leaf_plugins.estimate`` on the same completions, rewards and independently computed
log-probs; ``estimator="grpo"`` reproduces TRL's own GRPOTrainer step for step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import trl  # extra [trl], installed by scripts/install.sh: a missing TRL fails here, never skips
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

import leaf_plugins as lp
from leaf_plugins.core.errors import UnknownNameError
from leaf_plugins.integrations.trl import LeafGRPOConfig, LeafGRPOTrainer

WORDS = "yes no maybe red green blue one two three four".split()
PROMPTS = ["say a colour", "count to three", "answer yes or no", "name a number"]
K = 4
TEMPERATURE = 1.0
RECORDED = ("prompt_ids", "completion_ids", "completion_mask", "advantages")
WEIGHT_ATOL = 1e-7
"""Three SGD steps of lr 1e-2 move a weight by lr x its gradient's float32 rounding (gradients
<= ~1, a few eps32 each): ~1e-8; measured <= 3.7e-9 (ATEN_CPU_CAPABILITY default|avx2 x
OMP_NUM_THREADS 1|4). A wrong sign moves weights by lr x gradient, >= 100x this."""


def tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer trained in-process (no hub)."""
    core = Tokenizer(models.WordLevel(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    special = trainers.WordLevelTrainer(special_tokens=["<pad>", "<eos>", "<unk>"])
    core.train_from_iterator(PROMPTS + [" ".join(WORDS)], special)
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def tiny_model(vocab: int, seed: int = 0) -> Qwen2ForCausalLM:
    """A random-weight Qwen2 whose LM head is scaled up, so sampled completions share prefixes."""
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=False, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    return model


def reward_words(completions: list[str], **kwargs: object) -> list[float]:
    """Fraction of words that are colours, plus 0.5 when the completion is short."""
    scores = []
    for text in completions:
        words = text.split()
        colours = sum(word in {"red", "green", "blue"} for word in words)
        scores.append(colours / max(len(words), 1) + 0.5 * (len(words) <= 3))
    return scores


def config(tmp_path, config_class=LeafGRPOConfig, **extra: object):  # type: ignore[no-untyped-def]
    options = dict(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], save_strategy="no", seed=0,
        per_device_train_batch_size=2 * K, num_generations=K, max_completion_length=6, max_steps=3,
        learning_rate=1e-2, logging_steps=1, temperature=TEMPERATURE, beta=0.0,
    )
    return config_class(**{**options, **extra})


def trainer(tmp_path, trainer_class=LeafGRPOTrainer, config_class=LeafGRPOConfig, **extra):
    tok = tokenizer()
    return trainer_class(
        model=tiny_model(len(tok)), reward_funcs=reward_words, processing_class=tok,
        args=config(tmp_path, config_class, **extra),
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),  # distinct prompts: one group each
    )


def record_losses(run) -> list[dict[str, torch.Tensor]]:  # type: ignore[no-untyped-def]
    """Wrap ``_compute_loss`` to keep its inputs, the loss and the independent scores of
    each completion token by a plain forward pass with full logits at that moment (the
    generation weights: one loss call per generation batch)."""
    seen: list[dict[str, torch.Tensor]] = []
    original = run._compute_loss

    def compute_loss(model, inputs):  # type: ignore[no-untyped-def]
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        width = inputs["completion_ids"].size(1)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits[:, -width - 1:-1].double() / TEMPERATURE
        log_pi = torch.log_softmax(logits, dim=-1)  # [B, C, V]
        loss = original(model, inputs)
        seen.append({
            **{key: inputs[key].detach().clone() for key in RECORDED},
            "logprobs": log_pi.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1),
            "sum_pi_squared": log_pi.mul(2).exp().sum(-1),
            "loss": loss.detach().clone(),
        })
        return loss

    run._compute_loss = compute_loss
    return seen


def expected_advantages(record: dict[str, torch.Tensor], engine: lp.Engine) -> torch.Tensor:
    """The engine's advantages on the recorded batch, built from plain lists (one group per
    distinct prompt, rewards recomputed from the decoded completions)."""
    lengths = record["completion_mask"].sum(dim=1).tolist()
    ids = record["completion_ids"].tolist()
    prompts = [tuple(row) for row in record["prompt_ids"].tolist()]
    group_of = {prompt: index for index, prompt in enumerate(dict.fromkeys(prompts))}
    tok = tokenizer()
    texts = [tok.decode(row[:n], skip_special_tokens=True) for row, n in zip(ids, lengths)]
    batch = lp.RolloutBatch.from_lists(
        [row[:n] for row, n in zip(ids, lengths)], reward_words(texts), [group_of[p] for p in prompts],
        surprisal=[(-record["logprobs"][i, :n]).tolist() for i, n in enumerate(lengths)],
        logprobs=[record["logprobs"][i, :n].tolist() for i, n in enumerate(lengths)],
        sum_pi_squared=[record["sum_pi_squared"][i, :n].tolist() for i, n in enumerate(lengths)],
    )
    return engine.estimate(batch).advantages


class BatchObserver:
    """Keeps every batch the engine estimates."""

    def __init__(self) -> None:
        self.batches: list[lp.RolloutBatch] = []

    @lp.hookimpl
    def on_estimate(self, batch: lp.RolloutBatch, result: lp.EstimateResult) -> None:
        self.batches.append(batch)


def test_leaf_advantages_reaching_the_loss_equal_estimate(tmp_path) -> None:
    run = trainer(tmp_path, estimator="leaf", estimator_params={"fork_budget": 2})
    seen = record_losses(run)
    observer = BatchObserver()
    run.engine.manager.register(observer, name="observer:test")
    run.train()
    assert len(seen) == len(observer.batches) == 3
    for record, batch in zip(seen, observer.batches):
        advantages = record["advantages"]
        assert advantages.shape == record["completion_ids"].shape  # [B, T]: per token
        want = expected_advantages(record, lp.Engine("leaf", {"fork_budget": 2}))
        torch.testing.assert_close(advantages.double(), want.double(), atol=2e-5, rtol=1e-4)
        # the estimator's batch (generation order; the loss sees TRL's shuffle) holds each completion's log-probs
        # as a plain full-logits forward pass computes them, and no sum_pi_squared: leaf does not read it
        assert_scored_as_full_logits(batch, record, ("logprobs",))
        assert batch.sum_pi_squared is None
    # tree credit, not a broadcast: some response gets different credit on different tokens
    assert any(
        bool(((r["advantages"] - r["advantages"][:, :1]).abs() * r["completion_mask"]).amax() > 1e-4) for r in seen
    )


def assert_scored_as_full_logits(batch: lp.RolloutBatch, record: dict[str, torch.Tensor],
                                 fields: tuple[str, ...]) -> None:
    """Every recorded completion has a row of ``batch`` (same tokens) whose ``fields`` equal
    what a plain full-logits forward pass gives."""
    lengths = record["completion_mask"].sum(dim=1)
    for i, length in enumerate(lengths.tolist()):
        same = (batch.lengths == length) & (batch.tokens[:, :length] == record["completion_ids"][i, :length]).all(1)
        assert any(
            all(torch.allclose(getattr(batch, name)[j, :length].double(), record[name][i, :length], atol=2e-5)
                for name in fields)
            for j in same.nonzero().flatten().tolist()
        ), f"completion {i}"


def test_tree_otb_reads_sum_pi_squared_as_full_logits_give_it(tmp_path) -> None:
    run = trainer(tmp_path, estimator="tree_otb", max_steps=1)
    seen = record_losses(run)
    observer = BatchObserver()
    run.engine.manager.register(observer, name="observer:test")
    run.train()
    (record,), (batch,) = seen, observer.batches
    assert_scored_as_full_logits(batch, record, ("logprobs", "sum_pi_squared"))
    want = expected_advantages(record, lp.Engine("tree_otb"))
    torch.testing.assert_close(record["advantages"].double(), want.double(), atol=2e-5, rtol=1e-4)


def count_forward_calls(model: torch.nn.Module) -> list[int]:
    """A one-element counter of ``model``'s forward calls (generation steps, scoring, loss)."""
    calls = [0]
    model.register_forward_pre_hook(lambda module, args: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_grpo_through_the_adapter_reproduces_trl_grpo(tmp_path) -> None:
    # plain SGD, not TRL's default AdamW: Adam divides each gradient by its own running size,
    # so a gradient that is zero in exact arithmetic but float noise (k_proj.bias: a key bias
    # shifts every attention score of a query equally) moves its weight by ~lr per step in a
    # direction the CPU's kernels decide; SGD moves weights by lr × gradient, noise included
    ours = trainer(tmp_path / "leaf", estimator="grpo", estimator_params={"eps": 1e-4}, optim="sgd")  # TRL's eps
    ours_seen = record_losses(ours)
    ours_calls = count_forward_calls(ours.model)
    observer = BatchObserver()
    ours.engine.manager.register(observer, name="observer:test")
    ours.train()
    theirs = trainer(tmp_path / "trl", trainer_class=trl.GRPOTrainer, config_class=trl.GRPOConfig, optim="sgd")
    theirs_seen = record_losses(theirs)
    theirs_calls = count_forward_calls(theirs.model)
    theirs.train()
    # grpo reads no optional per-token field: no scoring pass beyond TRL's own forward calls
    assert ours_calls[0] == theirs_calls[0] > 0
    assert all(b.surprisal is None and b.logprobs is None and b.sum_pi_squared is None for b in observer.batches)
    for mine, reference in zip(ours_seen, theirs_seen, strict=True):
        assert torch.equal(mine["completion_ids"], reference["completion_ids"])
        per_token = reference["advantages"].unsqueeze(1) * reference["completion_mask"]
        # float32 (r - mean) / (std + eps) over groups of 4, |A| <= 1.5: measured <= 1.2e-7
        torch.testing.assert_close(mine["advantages"], per_token, atol=1e-5, rtol=1e-5)
        # a token mean of 48 terms of size <= 1.5, summed in another order (per token vs
        # broadcast): sqrt(48) x eps32 x 1.5 = 1.2e-6 typical; measured <= 1.5e-8
        torch.testing.assert_close(mine["loss"], reference["loss"], atol=1e-6, rtol=1e-5)
    start = tiny_model(len(tokenizer()))
    with torch.no_grad():
        moved = max(float((p - q).abs().max()) for p, q in zip(theirs.model.parameters(), start.parameters()))
    for (name, mine), (_, reference) in zip(ours.model.named_parameters(), theirs.model.named_parameters()):
        torch.testing.assert_close(mine, reference, atol=WEIGHT_ATOL, rtol=0, msg=lambda m, name=name: f"{name}: {m}")
    assert moved > 100 * WEIGHT_ATOL  # the steps moved the weights: a wrong sign would show


def test_unscored_completions_get_no_credit_and_leave_their_group(tmp_path) -> None:
    run = trainer(tmp_path, estimator="leaf", estimator_params={"fork_budget": 1})
    ids = torch.tensor([[3, 4, 5, 1], [3, 4, 1, 0], [3, 6, 1, 0], [3, 4, 5, 1]])  # one group of K = 4
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
    logprobs = -torch.arange(16, dtype=torch.float32).reshape(4, 4) / 10 * mask
    run._rewards_per_func = torch.tensor([[1.0], [0.0], [float("nan")], [0.5]])  # completion 2: unscored
    advantages = run._advantages(ids, mask, logprobs, logprobs.exp() * mask, group_size=K)
    assert bool((advantages[2] == 0).all())
    rows = [0, 1, 3]
    kept = [int(mask[i].sum()) for i in rows]
    batch = lp.RolloutBatch.from_lists([ids[i, :n].tolist() for i, n in zip(rows, kept)], [1.0, 0.0, 0.5], [0, 0, 0],
                                       surprisal=[(-logprobs[i, :n]).tolist() for i, n in zip(rows, kept)])
    want = lp.estimate(batch, "leaf", fork_budget=1).advantages
    torch.testing.assert_close(advantages[rows], want)


def test_stage_override_reaches_the_loss(tmp_path) -> None:
    run = trainer(tmp_path, estimator="leaf", estimator_stages={"select_boundaries": "collision"}, max_steps=1)
    seen = record_losses(run)
    run.train()
    engine = lp.Engine("leaf", {}, {"select_boundaries": "collision"})
    torch.testing.assert_close(seen[0]["advantages"].double(), expected_advantages(seen[0], engine).double(),
                               atol=2e-5, rtol=1e-4)


def test_unknown_estimator_and_plain_config_are_refused(tmp_path) -> None:
    with pytest.raises(UnknownNameError, match="Did you mean.*leaf"):
        trainer(tmp_path, estimator="leef")
    tok = tokenizer()
    with pytest.raises(TypeError, match="LeafGRPOConfig"):
        LeafGRPOTrainer(model=tiny_model(len(tok)), reward_funcs=reward_words, processing_class=tok,
                        args=config(tmp_path, trl.GRPOConfig), train_dataset=Dataset.from_dict({"prompt": PROMPTS}))


@pytest.mark.slow  # a subprocess run of seconds
def test_a_group_split_across_two_processes_is_estimated_whole(tmp_path) -> None:
    script = Path(__file__).resolve().parent / "scripts" / "trl_two_process.py"
    done = subprocess.run(
        # --multi_gpu selects accelerate's torchrun launcher; without CUDA TRL trains on CPU with gloo
        [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
         "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(script), str(tmp_path)],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    for step in zip(*(r["seen"] for r in ranks), strict=True):
        assert all(len(record["completion_ids"]) == K // 2 for record in step)  # half of the group on each rank
        merged = {key: _stack_padded([record[key] for record in step]) for key in step[0] if key != "loss"}
        assert len({tuple(row) for row in merged["prompt_ids"].tolist()}) == 1  # one group, split
        torch.testing.assert_close(merged["advantages"].double(),
                                   expected_advantages(merged, lp.Engine("leaf", {"fork_budget": 2})).double(),
                                   atol=2e-5, rtol=1e-4)


def _stack_padded(parts: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate ``[n_i, T_i, ...]`` tensors along rows, zero-padding dim 1 to the widest."""
    width = max(part.shape[1] for part in parts)
    return torch.cat([torch.nn.functional.pad(part, (0, 0) * (part.dim() - 2) + (0, width - part.shape[1]))
                      for part in parts])

