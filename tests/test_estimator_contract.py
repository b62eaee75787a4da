"""The estimator contract: only ``compute_advantages`` is required (the engine supplies no
boundaries and root-only nodes), estimators that cannot run (or implement hooks other
than the estimator stages) are refused when they register, ``requires`` declares what an
estimator reads, and ``RolloutBatch.extra`` carries further per-token fields."""

from __future__ import annotations

import math
import re
import sys
import types
from pathlib import Path

import pytest
import torch

import leaf_plugins as lp
from leaf_plugins.core.batch import PER_TOKEN_FIELDS
from leaf_plugins.core.errors import ConfigError, NonFiniteError, PluginLoadError, UnknownNameError
from leaf_plugins.core.plugins import PluginHost
from leaf_plugins.core.tree import root_only_nodes
from leaf_plugins.integrations.padded import padded_batch

REPO = Path(__file__).resolve().parents[1]
BUILTINS = ("grpo", "leaf", "collision", "full_tree", "otb", "tree_rloo", "tree_otb")


class CentredReward:
    """r_i minus its group's mean reward, on every token (compute_advantages alone)."""

    parameters = lp.NoParameters
    requires = ()

    @lp.hookimpl
    def compute_advantages(self, batch, nodes, params):  # type: ignore[no-untyped-def]
        advantage = batch.rewards - nodes.root_value[batch.groups.index]  # [N]
        return torch.where(batch.mask, advantage.unsqueeze(1), 0.0)  # [N, T]


class ValueBaseline:
    """r_i minus a per-token value estimate from the batch's extra field ``value``."""

    parameters = lp.NoParameters
    requires = ("value",)

    @lp.hookimpl
    def compute_advantages(self, batch, nodes, params):  # type: ignore[no-untyped-def]
        return torch.where(batch.mask, batch.rewards.unsqueeze(1) - batch.extra["value"], 0.0)  # [N, T]


class Undeclared:
    """Declares no requires."""

    parameters = lp.NoParameters

    @lp.hookimpl
    def compute_advantages(self, batch, nodes, params):  # type: ignore[no-untyped-def]
        return torch.zeros(batch.tokens.shape)


def plugin(**estimators: object) -> object:
    """A plugin object registering ``estimators`` by name."""

    class Plugin:
        @lp.hookimpl
        def register_estimators(self, register):  # type: ignore[no-untyped-def]
            for name, estimator in estimators.items():
                register(name, estimator)

    return Plugin()


def host_with(strict: bool = True, **estimators: object) -> PluginHost:
    return PluginHost.discover(extra_plugins=[("contract-test", plugin(**estimators))], strict=strict)


def two_groups(**fields: object) -> lp.RolloutBatch:
    """Group 0: three responses (rewards 1, 0, 0.5: mean 0.5); group 1: two (2, 4: mean 3)."""
    return lp.RolloutBatch.from_lists([[1, 2, 3], [1, 4], [5], [2, 2], [3]], [1.0, 0.0, 0.5, 2.0, 4.0],
                                      [0, 0, 0, 1, 1], **fields)


def policy_batch(seed: int = 0) -> lp.RolloutBatch:
    """Two groups of four with shared prefixes and every built-in per-token field, consistent
    with one distribution per token: π of the sampled token p, the rest spread over four
    other tokens, so Σπ² = p² + (1 - p)² / 4."""
    generator = torch.Generator().manual_seed(seed)
    tokens = [[1, 2, 3, 4], [1, 2, 5], [1, 6, 3, 3, 2], [7], [2, 2, 2], [2, 2, 3, 1], [2, 4], [2, 2, 2, 5]]
    probabilities = [torch.rand(len(row), generator=generator) * 0.8 + 0.15 for row in tokens]
    return lp.RolloutBatch.from_lists(
        tokens, torch.rand(len(tokens), generator=generator).tolist(), [0] * 4 + [1] * 4,
        surprisal=[(-p.log()).tolist() for p in probabilities],
        logprobs=[p.log().tolist() for p in probabilities],
        sum_pi_squared=[(p * p + (1 - p) ** 2 / 4).tolist() for p in probabilities],
    )


def keep_only(batch: lp.RolloutBatch, names: tuple[str, ...]) -> lp.RolloutBatch:
    """``batch`` without the optional per-token fields not in ``names``."""
    return lp.RolloutBatch(batch.tokens, batch.lengths, batch.group_ids, batch.rewards,
                           **{name: getattr(batch, name) for name in PER_TOKEN_FIELDS if name in names})


# ---------------------------------------------------------------- optional stages
def test_compute_advantages_alone_gets_no_boundaries_and_the_group_means():
    host = host_with(centred=CentredReward())
    result = lp.Engine("centred", host=host).estimate(two_groups())
    assert result.boundaries == [[], []] and result.nodes == [[], []]
    assert result.node_table.root_value.tolist() == [0.5, 3.0]
    # by hand: 1 - .5, 0 - .5, .5 - .5 on group 0; 2 - 3, 4 - 3 on group 1; 0 on padding
    assert result.advantages.tolist() == [[0.5, 0.5, 0.5], [-0.5, -0.5, 0.0], [0.0, 0.0, 0.0],
                                          [-1.0, -1.0, 0.0], [1.0, 0.0, 0.0]]


def test_root_only_nodes_gives_each_group_its_mean_reward_and_no_node():
    shuffled = lp.RolloutBatch.from_lists([[1], [2], [3], [4], [5]], [1.0, 2.0, 4.0, 8.0, 16.0], [7, 3, 7, 3, 7])
    nodes = root_only_nodes(shuffled)  # groups numbered by ascending id: 3 -> 0, 7 -> 1
    assert nodes.root_value.tolist() == [5.0, 7.0] and nodes.count == 0
    assert nodes.path.shape == (5, 0) and nodes.root_value.dtype == torch.float32


def test_borrowed_stages_replace_the_defaults():
    host = host_with(centred=CentredReward())
    batch = policy_batch()
    leaf = lp.Engine("leaf", {"fork_budget": 1}, host=host).estimate(batch)
    borrowed = lp.Engine("centred", {"fork_budget": 1}, {"select_boundaries": "leaf", "retain_nodes": "leaf"},
                         host=host).estimate(batch)
    assert borrowed.boundaries == leaf.boundaries and borrowed.nodes == leaf.nodes
    assert any(borrowed.nodes)  # the batch has nodes to compare
    boundaries_only = lp.Engine("centred", {"fork_budget": 1}, {"select_boundaries": "leaf"}, host=host)
    result = boundaries_only.estimate(batch)
    assert result.boundaries == leaf.boundaries and result.nodes == [[], []]  # retain_nodes: the default
    assert boundaries_only.requires == ("surprisal",)  # leaf's boundaries read it; centred reads nothing
    with pytest.raises(ConfigError, match="estimator 'centred' does not implement stage 'select_boundaries'"):
        lp.Engine("grpo", stages={"select_boundaries": "centred"}, host=host)


# ---------------------------------------------------------------- refusal at registration
class NoAdvantages:
    """Boundaries but no advantages."""

    parameters = lp.NoParameters

    @lp.hookimpl
    def select_boundaries(self, batch, params):  # type: ignore[no-untyped-def]
        return lp.Boundaries.empty(batch.groups.count, batch.device)


class Undecorated:
    """A compute_advantages that is not a hookimpl."""

    parameters = lp.NoParameters

    def compute_advantages(self, batch, nodes, params):  # type: ignore[no-untyped-def]
        return torch.zeros(batch.tokens.shape)


class NotCallable(CentredReward):
    """A retain_nodes that is not a method."""

    retain_nodes = "root"


class WithALoss(CentredReward):
    """An estimator that would also replace the run's loss and observe its start."""

    @lp.hookimpl
    def compute_loss(self, context, logprobs, old_logprobs, reference_logprobs, advantages, mask, weights):  # type: ignore[no-untyped-def]
        return None

    @lp.hookimpl
    def on_run_start(self, model, optimizer, config, output_dir):  # type: ignore[no-untyped-def]
        pass


def declaring(**attributes: object) -> object:
    return type("Declaring", (CentredReward,), attributes)()


@pytest.mark.parametrize("estimator, reason", [
    (NoAdvantages(), "it has no compute_advantages stage"),
    (Undecorated(), "its compute_advantages is not a stage hook: make it a method decorated with "
                    "@leaf_plugins.hookimpl"),
    (NotCallable(), "its retain_nodes is not a stage hook"),
    (declaring(requires="logprobs"), r"its requires \(every stage\) must be a tuple of per-token field names"),
    (declaring(requires=("tokens",)), r"names a field every batch has \(tokens\)"),
    (declaring(requires={"select_boundary": ("surprisal",)}), "unknown stage 'select_boundary'"),
    (WithALoss(), "it implements compute_loss, on_run_start, which an estimator does not \\(it implements the "
                  "estimator stages select_boundaries, retain_nodes, compute_advantages alone\\): put them in a stage "
                  "plugin that a run names in plugins:"),
    (declaring(parameters={"scale"}), "`parameters` must be a @dataclass class"),
])
def test_an_estimator_that_cannot_run_is_refused_when_it_registers(estimator, reason):
    with pytest.raises(PluginLoadError, match=f"estimator 'broken' from extra cannot run: .*{reason}"):
        host_with(broken=estimator)
    with pytest.warns(UserWarning, match="skipped plugin 'contract-test': estimator 'broken' from extra cannot run"):
        host = host_with(strict=False, broken=estimator, centred=CentredReward())
    assert "centred" in host.estimators and "broken" not in host.estimators  # its neighbour still registers
    with pytest.raises(UnknownNameError, match=f"estimator 'broken' from extra cannot run: .*{reason}"):
        host.estimators.get("broken")  # what Engine and the run config's check ask


# ---------------------------------------------------------------- requires
EXPECTED = {  # read off each estimator's code: which optional fields its stages touch
    "grpo": (),
    "leaf": ("surprisal",),
    "collision": (),
    "full_tree": (),
    "otb": ("logprobs", "sum_pi_squared"),
    "tree_rloo": ("surprisal",),
    "tree_otb": ("surprisal", "logprobs", "sum_pi_squared"),
}


@pytest.mark.parametrize("name", BUILTINS)
def test_builtins_declare_what_they_read_and_that_is_all_they_need(name):
    engine = lp.Engine(name)
    assert engine.requires == EXPECTED[name]
    full = policy_batch()
    stripped = keep_only(full, engine.requires)
    torch.testing.assert_close(engine.estimate(stripped).advantages, engine.estimate(full).advantages, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["leaf", "otb", "tree_otb"])
def test_a_missing_required_field_names_the_field_and_the_estimator(name):
    engine = lp.Engine(name)
    for missing in engine.requires:
        batch = keep_only(policy_batch(), tuple(f for f in engine.requires if f != missing))
        with pytest.raises(ConfigError, match=f"estimator '{name}' requires the per-token field '{missing}' "
                                              r"\(its (select_boundaries|compute_advantages) reads it\)"):
            engine.estimate(batch)


def test_groups_never_leak_into_each_other():
    # the spec's invariant, for every built-in at its defaults (tree_otb's fitted weight learns from the whole call)
    batch = policy_batch(3)
    for name in BUILTINS:
        if name == "tree_otb":
            continue
        engine = lp.Engine(name)
        whole = engine.estimate(batch).advantages
        for group in (0, 1):
            rows = (batch.group_ids == group).nonzero().squeeze(1)
            part = engine.estimate(batch.select(rows)).advantages
            torch.testing.assert_close(part, whole[rows, :part.shape[1]], rtol=0, atol=0, msg=name)


def test_requires_follows_the_borrowed_stages():
    assert lp.Engine("otb", stages={"select_boundaries": "leaf"}).requires == ("surprisal", "logprobs",
                                                                                 "sum_pi_squared")
    assert lp.Engine("leaf", stages={"select_boundaries": "collision"}).requires == ()  # leaf's own is not used


def test_an_undeclared_estimator_is_given_every_field():
    host = host_with(undeclared=Undeclared())
    engine = lp.Engine("undeclared", host=host)
    assert engine.requires == PER_TOKEN_FIELDS
    assert engine.estimate(two_groups()).advantages.shape == (5, 3)  # nothing is checked for it


# ---------------------------------------------------------------- extra per-token fields
def test_an_estimator_reads_an_extra_field_it_requires():
    host = host_with(valued=ValueBaseline())
    engine = lp.Engine("valued", host=host)
    assert engine.requires == ("value",)
    value = [[0.5, 0.25, 0.0], [1.0, 2.0], [0.5], [1.5, 2.5], [3.0]]
    result = engine.estimate(two_groups(extra={"value": value}))
    # r - value per token, by hand
    assert result.advantages.tolist() == [[0.5, 0.75, 1.0], [-1.0, -2.0, 0.0], [0.0, 0.0, 0.0],
                                          [0.5, -0.5, 0.0], [1.0, 0.0, 0.0]]
    with pytest.raises(ConfigError, match=r"estimator 'valued' requires the per-token field 'value' \(its "
                                          r"compute_advantages reads it\), but the batch has no value: pass it as "
                                          r"RolloutBatch.from_lists\(\.\.\., extra=\{'value': \.\.\.\}\)"):
        engine.estimate(two_groups())
    with pytest.raises(ConfigError, match=r"no value \(its extra fields: values\)"):
        engine.estimate(two_groups(extra={"values": value}))


def test_extra_fields_are_validated_like_the_built_in_ones():
    good = torch.zeros(2, 3)
    tokens, lengths = torch.tensor([[1, 2, 3], [4, -1, -1]]), torch.tensor([3, 1])
    ids, rewards = torch.tensor([0, 0]), torch.tensor([1.0, 0.0])

    def build(extra):  # type: ignore[no-untyped-def]
        return lp.RolloutBatch(tokens, lengths, ids, rewards, extra=extra)

    assert build({"value": good}).extra["value"] is good
    with pytest.raises(ValueError, match=r"extra\['value'\] must be \[N, T\]=\[2, 3\], got \(2, 2\)"):
        build({"value": torch.zeros(2, 2)})
    with pytest.raises(ValueError, match=r"extra\['value'\] must be a floating-point tensor"):
        build({"value": torch.zeros(2, 3, dtype=torch.int64)})
    with pytest.raises(ValueError, match="extra field names must be identifiers other than the batch's own"):
        build({"logprobs": good})
    bad = good.clone()
    bad[1, 0] = math.nan
    with pytest.raises(NonFiniteError, match=r"extra\['value'\] of response 1 \(group id 0, token 0\) is nan"):
        build({"value": bad})
    with pytest.raises(ValueError, match=r"extra\['value'\]\[1\] has 2 values for a response of 1 tokens"):
        lp.RolloutBatch.from_lists([[1, 2], [3]], [0.0, 1.0], [0, 0], extra={"value": [[1.0, 2.0], [3.0, 4.0]]})


def test_extra_fields_travel_with_the_batch():
    batch = two_groups(extra={"value": [[1.0, 2.0, 3.0], [4.0, 5.0], [6.0], [7.0, 8.0], [9.0]]})
    picked = batch.select(torch.tensor([4, 0]))
    assert picked.extra["value"].tolist() == [[9.0, 0.0, 0.0], [1.0, 2.0, 3.0]]
    assert batch.to("cpu").extra["value"].tolist() == batch.extra["value"].tolist()
    assert batch.with_rewards(torch.zeros(5)).extra["value"] is batch.extra["value"]
    assert batch.token_field("value") is batch.extra["value"] and batch.token_field("logprobs") is None
    # the adapters' padded tensors: padding zeroed (a NaN there is never read), tokens kept
    values = torch.tensor([[1.0, 2.0, math.nan], [3.0, math.nan, math.nan]])
    padded = padded_batch(torch.tensor([[5, 6, 0], [7, 0, 0]]), torch.tensor([[1, 1, 0], [1, 0, 0]]),
                          torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), extra={"value": values})
    assert padded.extra["value"].tolist() == [[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match=r"extra\['value'\] of response 0 is not finite"):
        padded_batch(torch.tensor([[5, 6]]), torch.tensor([[1, 1]]), torch.tensor([1.0]), torch.tensor([0]),
                     extra={"value": torch.tensor([[1.0, math.inf]])})


# ---------------------------------------------------------------- the guide's example
def test_the_guides_shrunk_example_runs_as_written(monkeypatch):
    guide = (REPO / "docs" / "plugins.md").read_text()
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", guide, re.S) if "class Shrunk" in block]
    module = types.ModuleType("shrunk_example")
    monkeypatch.setitem(sys.modules, module.__name__, module)  # dataclasses looks the module up
    exec(compile(code, "docs/plugins.md (An estimator and its parameters)", "exec", dont_inherit=True),
         module.__dict__)
    host = host_with(shrunk=module.Shrunk())
    result = lp.Engine("shrunk", {"shrink": 0.5}, host=host).estimate(two_groups())
    # r - 0.5 x group mean: group 0 mean 0.5, group 1 mean 3
    assert result.advantages.tolist() == [[0.75, 0.75, 0.75], [-0.25, -0.25, 0.0], [0.25, 0.0, 0.0],
                                          [0.5, 0.5, 0.0], [2.5, 0.0, 0.0]]


# ---------------------------------------------------------------- training computes what is required
class EstimatedBatches:
    """Keeps every batch the run's estimator receives."""

    def __init__(self) -> None:
        self.batches: list[lp.RolloutBatch] = []

    @lp.hookimpl
    def on_estimate(self, batch, result):
        self.batches.append(batch)


@pytest.mark.parametrize("backend", ["static", "generate"])
def test_a_training_rollout_computes_sum_pi_squared_only_for_an_estimator_that_reads_it(tmp_path, backend):
    """grpo reads no per-token statistic, otb reads Σπ²: the same step sampled for both
    gives otb a Σπ² in (0, 1] on every response token and grpo none, with the same
    tokens and log-probabilities (the statistic is not drawn from)."""
    from training_cases import config, examples, host

    from leaf_plugins.training.trainer import Trainer

    seen = {}
    for estimator in ("grpo", "otb"):
        settings = config(tmp_path / estimator, estimator, steps=1)
        settings.rollout.backend = backend
        observer = EstimatedBatches()
        Trainer(settings, examples(), plugins=[observer], host=host()).run()
        (seen[estimator],) = observer.batches
    assert seen["grpo"].sum_pi_squared is None
    reading = seen["otb"].sum_pi_squared[seen["otb"].mask]
    assert bool(((reading > 0) & (reading <= 1 + 1e-6)).all())  # Σ_v π(v)² of a distribution
    assert torch.equal(seen["grpo"].tokens, seen["otb"].tokens)
    assert torch.equal(seen["grpo"].logprobs, seen["otb"].logprobs)


class BareBackend:
    """A backend that gives surprisal and log-probs only (no Σπ², no extra field)."""

    produces = ()

    def sample(self, request):  # type: ignore[no-untyped-def]
        raise AssertionError("a run refused before its model loads never samples")


class RegistersBareBackend:
    @lp.hookimpl
    def register_rollout_backends(self, register):  # type: ignore[no-untyped-def]
        register("bare", BareBackend())


def test_a_run_whose_backend_cannot_give_what_its_estimator_reads_is_refused_in_its_check(tmp_path):
    """Before the model loads (``leaf train --check``, a study's check, ``Trainer``): the
    field, the estimator and stage that read it, and the backend are named, at the place
    that chose the backend."""
    from leaf_plugins.studies.config import load_study
    from leaf_plugins.training.config import load_train_config

    host = PluginHost.discover(extra_plugins=[("bare-backend", RegistersBareBackend())], strict=True)
    run = tmp_path / "run.yaml"
    run.write_text("steps: 1\nestimator: {name: otb}\nrollout:\n  backend: bare\n")
    with pytest.raises(ConfigError) as caught:
        load_train_config(run, host=host)
    assert (f"{run}:4:3: estimator 'otb' requires the per-token field 'sum_pi_squared' (its compute_advantages reads "
            f"it), which rollout backend 'bare' does not produce (it produces surprisal, logprobs)") in str(caught.value)
    load_train_config(run, ["estimator.name=leaf"], host=host)  # leaf reads surprisal alone: the backend gives it
    load_train_config(run, ["rollout.backend=static"], host=host)  # the built-ins give Σπ²
    study = tmp_path / "study.yaml"
    study.write_text("output_dir: out\nbase: {steps: 1, rollout: {backend: bare}}\n"
                     "grid: {estimator.name: [leaf, otb]}\nseeds: [0]\n")
    with pytest.raises(ConfigError, match=r"variation 'estimator=otb': estimator 'otb' requires the per-token field "
                                          r"'sum_pi_squared'"):
        load_study(study, host=host)
