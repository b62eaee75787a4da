"""Estimator-owned parameters: any estimator's dataclass is checked the same way
(types from its hints, unknown names, ``__post_init__``), borrowed stages get their own
estimator's dataclass, and the former declarations get a clear message."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

import pytest

import leaf_plugins as lp
from leaf_plugins.core.errors import ConfigError, PluginLoadError
from leaf_plugins.core.plugins import PluginHost

CORE = Path(lp.__file__).resolve().parent / "core"


@dataclass(frozen=True)
class MixParams:
    gain: float = field(default=0.5, metadata={"help": "how much of the reward to keep"})
    rounds: int = 1
    mode: Literal["mean", "max"] = "mean"
    cap: float | Literal["auto"] = "auto"
    limit: Optional[int] = None
    verbose: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.gain <= 1:
            raise ValueError(f"gain must lie in [0, 1], got {self.gain!r}")
        if self.rounds > 3 and self.mode == "max":
            raise ValueError("more than 3 rounds need mode mean")
        if self.limit is not None and self.limit < 0:
            raise ValueError("must not be negative")


@dataclass(frozen=True)
class CutParams:
    gain: float = field(default=0.5, metadata={"help": "how much of the reward to keep"})
    cut: int = 2


@dataclass(frozen=True)
class ClashParams:
    gain: float = 0.9  # the same name as MixParams', another default


class Recording:
    """Records the params each stage receives; GRPO's work otherwise."""

    def __init__(self, parameters: object, seen: list) -> None:
        self.parameters = parameters
        self.seen = seen

    @lp.hookimpl
    def select_boundaries(self, batch, params):
        self.seen.append(("select_boundaries", params))
        return lp.Boundaries.empty(batch.groups.count, batch.device)

    @lp.hookimpl
    def retain_nodes(self, batch, boundaries, params):
        self.seen.append(("retain_nodes", params))
        return lp.estimate(batch, "grpo").nodes

    @lp.hookimpl
    def compute_advantages(self, batch, nodes, params):
        self.seen.append(("compute_advantages", params))
        return lp.estimate(batch, "grpo").advantages


def host_with(**estimators: object) -> PluginHost:
    class Register:
        @lp.hookimpl
        def register_estimators(self, register):
            for name, estimator in estimators.items():
                register(name, estimator)

    return PluginHost.discover(extra_plugins=[("test-estimators", Register())], strict=True)


def small_batch() -> lp.RolloutBatch:
    return lp.RolloutBatch.from_lists([[1, 2], [3], [4, 5]], [1.0, 0.0, 0.5], [0, 0, 0], surprisal=[[1, 1], [1], [1, 1]])


def test_the_hooks_receive_an_instance_of_the_estimators_own_dataclass():
    seen: list = []
    host = host_with(mix=Recording(MixParams, seen))
    engine = lp.Engine("mix", {"gain": 1, "mode": "max", "cap": 2, "limit": 3}, host=host)
    engine.estimate(small_batch())
    want = MixParams(gain=1.0, mode="max", cap=2.0, limit=3)
    assert [params for _, params in seen] == [want] * 3
    assert type(seen[0][1].gain) is float and type(seen[0][1].cap) is float  # an int given for a float is converted


@pytest.mark.parametrize("params, message", [
    ({"gian": 0.1}, "estimator 'mix' has no parameter 'gian'. Did you mean 'gain'? Its parameters: cap, gain, limit, "
                    "mode, rounds, verbose"),
    ({"rounds": True}, "rounds must be an integer, got True"),
    ({"rounds": 1.5}, "rounds must be an integer, got 1.5"),
    ({"gain": "half"}, "gain must be a number, got 'half'"),
    ({"gain": float("nan")}, "gain must be a number, got nan"),
    ({"gain": 2}, "gain must lie in [0, 1], got 2.0"),
    ({"mode": "maximum"}, "mode must be one of mean, max; got 'maximum'. Did you mean 'max'?"),
    ({"cap": "autom"}, "cap must be a number or 'auto', got 'autom'. Did you mean 'auto'?"),
    ({"limit": "none"}, "limit must be an integer or null, got 'none'"),
    ({"limit": -1}, "limit=-1: must not be negative"),  # a message without the name gets it
    ({"verbose": "yes"}, "verbose must be true or false, got 'yes'"),
    ({"rounds": 4, "mode": "max"}, "more than 3 rounds need mode mean"),  # a combination: each value alone is fine
])
def test_a_bad_value_names_the_parameter_what_it_must_be_and_what_it_got(params, message):
    host = host_with(mix=Recording(MixParams, []))
    with pytest.raises(ConfigError) as error:
        lp.Engine("mix", params, host=host)
    assert str(error.value) == message


def test_every_problem_is_reported_together():
    host = host_with(mix=Recording(MixParams, []))
    with pytest.raises(ConfigError) as error:
        lp.Engine("mix", {"gian": 0.1, "rounds": "two", "mode": "min"}, host=host)
    assert str(error.value) == ("estimator 'mix' has no parameter 'gian'. Did you mean 'gain'? Its parameters: cap, gain, "
                                "limit, mode, rounds, verbose; rounds must be an integer, got 'two'; mode must be one "
                                "of mean, max; got 'min'")


def test_a_borrowed_stage_gets_the_borrowed_estimators_dataclass_from_the_same_params():
    seen: list = []
    host = host_with(mix=Recording(MixParams, seen), cut=Recording(CutParams, seen))
    engine = lp.Engine("mix", {"gain": 0.25, "cut": 5, "mode": "max"}, {"select_boundaries": "cut"}, host=host)
    engine.estimate(small_batch())
    assert seen == [("select_boundaries", CutParams(gain=0.25, cut=5)),
                    ("retain_nodes", MixParams(gain=0.25, mode="max")),
                    ("compute_advantages", MixParams(gain=0.25, mode="max"))]
    with pytest.raises(ConfigError, match=r"estimator 'mix' has no parameter 'cutt'\. Did you mean 'cut'\?"):
        lp.Engine("mix", {"cutt": 5}, {"select_boundaries": "cut"}, host=host)
    with pytest.raises(ConfigError, match="has no parameter 'cut'"):  # not borrowed: not accepted
        lp.Engine("mix", {"cut": 5}, host=host)


def test_two_involved_dataclasses_that_declare_a_name_differently_are_refused():
    host = host_with(mix=Recording(MixParams, []), clash=Recording(ClashParams, []))
    with pytest.raises(ConfigError) as error:
        lp.Engine("mix", {}, {"retain_nodes": "clash"}, host=host)
    assert str(error.value) == (
        "estimators 'mix' and 'clash' both declare parameter 'gain', differently (mix: float = 0.5; clash: float = "
        "0.9): a stage borrowed from one cannot share the other's 'gain'")


def test_the_built_ins_that_share_a_stage_share_its_parameters():
    """collision's boundaries under tree_otb read the same B; tree_otb's scale differs from tree_rloo's."""
    engine = lp.Engine("tree_otb", {"fork_budget": 3}, {"select_boundaries": "collision"})
    assert engine.params.fork_budget == 3 and engine.params.scale == "batch_std"
    with pytest.raises(ConfigError, match="estimators 'tree_otb' and 'tree_rloo' both declare parameter 'scale'"):
        lp.Engine("tree_otb", {}, {"compute_advantages": "tree_rloo"})


def test_an_estimator_without_parameters_takes_none():
    estimator = Recording(None, [])
    del estimator.parameters
    host = host_with(plain=estimator)
    engine = lp.Engine("plain", host=host)
    assert engine.params == lp.NoParameters()
    with pytest.raises(ConfigError, match="estimator 'plain' has no parameter 'x'"):
        lp.Engine("plain", {"x": 1}, host=host)


@pytest.mark.parametrize("declared", [frozenset(), frozenset({"fork_budget", "gain"}), ()])
def test_parameters_that_are_not_a_dataclass_are_refused_when_the_estimator_registers(declared):
    with pytest.raises(PluginLoadError, match=r"estimator 'old' from extra cannot run: `parameters` must be a "
                                              r"@dataclass class whose fields are its parameters"):
        host_with(old=Recording(declared, []))


def test_core_holds_no_built_in_estimators_parameter():
    names = ["fork_budget", "min_group", "horizon", "terms", "normalize", "std_floor", "eps", "shrink", "scale",
             "own_share", "prefix_mean", "ridge", "tree_weight"]
    text = "\n".join(path.read_text() for path in sorted(CORE.glob("*.py")))
    found = [name for name in names if re.search(rf"\b{name}\b", text)]
    assert found == []


def test_leaf_plugins_lists_parameters(monkeypatch, capsys):
    from leaf_plugins.cli import main
    from leaf_plugins.commands import plugins

    host = host_with(mix=Recording(MixParams, []))
    monkeypatch.setattr(plugins, "get_host", lambda: host)
    assert main(["plugins", "--kind", "estimator"]) == 0
    lines = capsys.readouterr().out.splitlines()
    mix = next(i for i, line in enumerate(lines) if line.split()[:3] == ["estimator", "mix", "extra"])
    assert lines[mix + 1].split() == ["gain:", "float", "=", "0.5", "how", "much", "of", "the", "reward", "to", "keep"]
    assert lines[mix + 2].strip() == "rounds: int = 1"
    assert lines[mix + 3].strip() == "mode: 'mean' | 'max' = 'mean'"
    assert lines[mix + 4].strip() == "cap: float | 'auto' = 'auto'"
    assert lines[mix + 5].strip() == "limit: int | null = null"
    assert any(line.split()[:2] == ["estimator", "leaf"] for line in lines)  # the others are listed as ever
