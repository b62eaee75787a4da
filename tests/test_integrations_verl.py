"""leaf-plugins estimators inside the real verl on CPU.

verl 0.9.1 pins transformers<5.11, below the training stack's floor, so the tests run in an
environment of verl's own (.venv-verl: verl 0.9.1, then leaf-plugins[verl,test] installed
beside it by a plain pip install; scripts/install_verl_env.sh, which scripts/install.sh runs;
tests/test_verl_install.py checks that install). Under the project's interpreter this file
has one test: it runs this same file with the verl environment's Python and requires every
check to pass there (none skipped). Under that Python the checks run directly.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VERL_PYTHON = Path(os.environ.get("LEAF_VERL_ENV", ROOT / ".venv-verl")) / "bin" / "python"
CONFIG_DIR = ROOT / "configs" / "verl"

if importlib.util.find_spec("verl") is None:

    @pytest.mark.slow  # a subprocess run of seconds
    def test_verl_checks_pass_in_the_verl_environment() -> None:
        assert VERL_PYTHON.exists(), f"no verl environment at {VERL_PYTHON}: run bash scripts/install_verl_env.sh"
        run = subprocess.run(
            [str(VERL_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore", str(Path(__file__))],
            cwd=ROOT, capture_output=True, text=True, timeout=600,
        )
        summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-2000:]
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
        assert "passed" in summary and "skipped" not in summary and "deselected" not in summary, summary

else:
    import verl

    LOADED_BY_IMPORT_VERL = "leaf_plugins.integrations.verl" in sys.modules  # through the verl.plugins entry point

    import numpy as np
    import torch
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.ppo import core_algos, ray_trainer
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    import leaf_plugins as lp
    from leaf_plugins.core.errors import ConfigError
    from leaf_plugins.core.plugins import get_estimator_host
    from leaf_plugins.integrations import verl as leaf_verl

    PAD = 0
    # two prompts x K = 4; responses share prefixes so that tree credit differs from GRPO's
    RESPONSES = [
        [5, 6, 7, 8, 2], [5, 6, 9, 2], [5, 6, 7, 3, 3, 2], [4, 2],
        [7, 7, 7, 2], [7, 8, 2], [7, 7, 9, 9, 2], [7, 8, 8, 2],
    ]
    REWARDS = [1.0, 0.0, 0.5, 0.0, 0.2, 0.9, 0.4, 0.7]
    UIDS = ["prompt-b"] * 4 + ["prompt-a"] * 4  # verl's uids are strings, in any order

    def _logprobs(seed: int) -> list[list[float]]:
        generator = torch.Generator().manual_seed(seed)
        return [(-torch.rand(len(row), generator=generator) * 3).tolist() for row in RESPONSES]

    def dataproto(sum_pi_squared: bool = False) -> DataProto:
        """A batch as verl's trainer holds it before compute_advantage: right-padded responses,
        the reward on each response's last token, old log-probs, prompt uids."""
        width = max(map(len, RESPONSES)) + 2
        n = len(RESPONSES)
        responses = torch.full((n, width), PAD, dtype=torch.int64)
        mask = torch.zeros(n, width, dtype=torch.int64)
        rewards = torch.zeros(n, width)
        old = torch.zeros(n, width)
        square = torch.zeros(n, width)
        for i, (row, lps) in enumerate(zip(RESPONSES, _logprobs(0))):
            responses[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
            rewards[i, len(row) - 1] = REWARDS[i]
            old[i, : len(row)] = torch.tensor(lps)
            square[i, : len(row)] = torch.tensor(lps).exp().square() + 0.01
        tensors = {"responses": responses, "response_mask": mask, "token_level_rewards": rewards, "old_log_probs": old}
        if sum_pi_squared:
            tensors["sum_pi_squared"] = square
        return DataProto.from_dict(tensors=tensors, non_tensors={"uid": np.array(UIDS, dtype=object)})

    def expected(name: str, sum_pi_squared: torch.Tensor | None = None, stages: dict[str, str] | None = None,
                 **params: object) -> torch.Tensor:
        """``estimate()`` on the same responses, built from plain lists (with the real
        tokens of a right-padded ``sum_pi_squared [N, W]``, if given)."""
        lps = _logprobs(0)
        squares = None if sum_pi_squared is None else [
            sum_pi_squared[i, : len(row)].tolist() for i, row in enumerate(RESPONSES)]
        batch = lp.RolloutBatch.from_lists(RESPONSES, REWARDS, [1] * 4 + [0] * 4,
                                           surprisal=[[-x for x in row] for row in lps], logprobs=lps,
                                           sum_pi_squared=squares)
        return lp.estimate(batch, name, stages, **params).advantages

    def test_every_estimator_is_a_verl_estimator_and_verls_own_names_stay() -> None:
        ours = leaf_verl.leaf_estimators()
        verl_names = {member.value for member in core_algos.AdvantageEstimator}
        for name in get_estimator_host().estimators.names():  # verl's environment has no training stack
            fn = core_algos.get_adv_estimator_fn(name)
            assert (name in ours) == (name not in verl_names), name
            assert hasattr(fn, "leaf_estimator") == (name not in verl_names), name
        assert {"leaf", "collision", "full_tree"} <= set(ours)
        assert core_algos.get_adv_estimator_fn("grpo") is core_algos.compute_grpo_outcome_advantage

    def test_plugin_is_loaded_by_import_verl_through_the_entry_point() -> None:
        assert verl.__version__ == "0.9.1"
        assert LOADED_BY_IMPORT_VERL, "import verl did not load leaf_plugins.integrations.verl (verl.plugins)"
        assert ray_trainer.compute_advantage is leaf_verl.compute_advantage

    @pytest.mark.parametrize(("name", "params"), [("leaf", {"fork_budget": 2}), ("leaf", {"fork_budget": 1}),
                                                  ("collision", {}), ("full_tree", {})])
    def test_verls_compute_advantage_gives_estimate(name: str, params: dict) -> None:
        config = OmegaConf.create({"adv_estimator": name, "leaf_plugins": params})
        # called as verl's trainer calls it
        data = ray_trainer.compute_advantage(dataproto(), adv_estimator=name, gamma=1.0, lam=1.0, num_repeat=4,
                                             norm_adv_by_std_in_grpo=True, config=config)
        want = torch.zeros_like(data.batch["advantages"])
        estimated = expected(name, **params)
        want[:, : estimated.shape[1]] = estimated
        torch.testing.assert_close(data.batch["advantages"], want, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(data.batch["returns"], want)
        assert bool((data.batch["advantages"] * (1 - data.batch["response_mask"])).eq(0).all())

    @pytest.mark.parametrize("name", ["otb", "tree_rloo", "tree_otb"])
    def test_variance_aware_estimators_read_verls_sum_pi_squared(name: str) -> None:
        data = ray_trainer.compute_advantage(dataproto(sum_pi_squared=True), adv_estimator=name, num_repeat=4,
                                             config=OmegaConf.create({"adv_estimator": name}))
        want = torch.zeros_like(data.batch["advantages"])
        estimated = expected(name, sum_pi_squared=dataproto(sum_pi_squared=True).batch["sum_pi_squared"])
        want[:, : estimated.shape[1]] = estimated
        torch.testing.assert_close(data.batch["advantages"], want, atol=1e-6, rtol=1e-6)

    def _random_policy_batch(seed: int) -> tuple[lp.RolloutBatch, list[float], list[str]]:
        """Ragged groups of 1-5 responses (some all-equal, some with ties in the longest
        length, some empty), tokens, rewards and a consistent policy: log π of a sampled
        token and Σπ² of random softmaxes, from flat to near-deterministic."""
        generator = torch.Generator().manual_seed(seed)

        def uniform() -> float:
            return float(torch.rand((), generator=generator))

        def integer(low: int, high: int) -> int:
            return int(torch.randint(low, high, (), generator=generator))

        tokens, rewards, group_ids, logprobs, squares = [], [], [], [], []
        width = integer(1, 12)
        for group in range(integer(1, 5)):
            shared = uniform() if uniform() < 0.2 else None  # an all-equal group
            for _ in range(integer(1, 6)):
                draw = uniform()
                length = width if draw < 0.3 else 0 if draw < 0.4 else integer(1, width + 1)
                sharpness = 6 * uniform()  # 0: a flat policy, 6: near-deterministic
                policy = torch.log_softmax(torch.randn(length, 6, generator=generator) * sharpness, dim=-1)  # [L, V]
                sampled = torch.randint(0, 6, (length, 1), generator=generator)
                tokens.append(torch.randint(0, 5, (length,), generator=generator).tolist())
                rewards.append(shared if shared is not None else uniform())
                group_ids.append(group)
                logprobs.append(policy.gather(1, sampled).squeeze(1).tolist())
                squares.append(policy.exp().square().sum(dim=1).tolist())
        batch = lp.RolloutBatch.from_lists(tokens, rewards, group_ids, logprobs=logprobs, sum_pi_squared=squares)
        return batch, rewards, [f"prompt-{group}" for group in group_ids]

    @pytest.mark.parametrize("seed", range(40))
    def test_otb_equals_verls_own_optimal_token_baseline(seed: int) -> None:
        """``otb`` against verl's ``compute_optimal_token_baseline_advantage`` itself (the
        reward on each response's last token, as verl's trainer holds it), not against our
        reading of it."""
        batch, rewards, uids = _random_policy_batch(seed)
        token_rewards = torch.zeros(batch.tokens.shape, dtype=torch.float64)
        ended = batch.lengths > 0  # [N]: an empty response has no token to hold its reward
        token_rewards[ended, batch.lengths[ended] - 1] = torch.tensor(rewards).double()[ended]
        theirs, _ = core_algos.compute_optimal_token_baseline_advantage(
            token_rewards, batch.mask.double(), np.array(uids, dtype=object),
            batch.logprobs.double(), batch.sum_pi_squared.double())
        ours = lp.estimate(batch, "otb").advantages.double()
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)

    def _estimated_batch(name: str, stages: dict[str, str] | None,
                         data: DataProto) -> tuple[lp.RolloutBatch, DataProto]:
        """The batch verl's wrapped ``compute_advantage`` hands the engine of ``name`` (with
        ``fork_budget`` 2 and the ``stages``), and the data it returns."""
        seen = []

        class Observer:
            @lp.hookimpl
            def on_estimate(self, batch, result):  # type: ignore[no-untyped-def]
                seen.append(batch)

        config = OmegaConf.create({"leaf_plugins": {"fork_budget": 2, "stages": stages or {}}})
        original = leaf_verl._engine
        leaf_verl._engine = lambda name, options: lp.Engine(name, {"fork_budget": 2}, options.get("stages"),
                                                            observers=[Observer()])
        try:
            done = ray_trainer.compute_advantage(data, name, 1.0, 1.0, 1, True, config)
        finally:
            leaf_verl._engine = original
        return seen[0], done

    def test_stage_overrides_and_sum_pi_squared_pass_through() -> None:
        config = OmegaConf.create({"leaf_plugins": {"fork_budget": 2, "stages": {"select_boundaries": "collision"}}})
        engine = leaf_verl._engine("tree_otb", leaf_verl._options(config))
        assert engine.manager.has_plugin("stage:select_boundaries:collision")
        batch, data = _estimated_batch("tree_otb", {"select_boundaries": "collision"}, dataproto(sum_pi_squared=True))
        source = dataproto(sum_pi_squared=True).batch
        torch.testing.assert_close(batch.sum_pi_squared, source["sum_pi_squared"][:, : batch.width])
        torch.testing.assert_close(batch.logprobs, source["old_log_probs"][:, : batch.width])
        want = lp.estimate(batch, "tree_otb", {"select_boundaries": "collision"}, fork_budget=2).advantages
        torch.testing.assert_close(data.batch["advantages"][:, : batch.width], want)

    def test_only_the_fields_the_estimator_requires_enter_its_batch() -> None:
        batch, _ = _estimated_batch("leaf", None, dataproto(sum_pi_squared=True))  # leaf reads surprisal only
        assert batch.sum_pi_squared is None
        torch.testing.assert_close(batch.surprisal, -dataproto().batch["old_log_probs"][:, : batch.width])
        bare, _ = _estimated_batch("leaf", {"select_boundaries": "collision"}, dataproto(sum_pi_squared=True))
        assert bare.surprisal is None and bare.logprobs is None and bare.sum_pi_squared is None
        with pytest.raises(ConfigError, match=r"estimator 'tree_otb' requires sum_pi_squared \(its compute_advantages "
                                              r"reads it\).*calculate_sum_pi_squared=true"):
            ray_trainer.compute_advantage(dataproto(), "tree_otb", 1.0, 1.0, 1, True, OmegaConf.create({}))

    def test_registry_call_without_response_tokens_explains_the_fix() -> None:
        data = dataproto()
        fn = core_algos.get_adv_estimator_fn("leaf")
        with pytest.raises(ConfigError, match="response tokens.*use_v1=false"):
            fn(token_level_rewards=data.batch["token_level_rewards"], response_mask=data.batch["response_mask"],
               index=data.non_tensor_batch["uid"], config=None)

    def test_bad_parameters_and_nan_rewards_are_refused() -> None:
        with pytest.raises(ConfigError, match="fork_budget"):
            ray_trainer.compute_advantage(dataproto(), adv_estimator="leaf",
                                          config=OmegaConf.create({"leaf_plugins": {"fork_budget": -1}}))
        data = dataproto()
        data.batch["token_level_rewards"][3, 1] = float("nan")
        with pytest.raises(ValueError, match="rewards of response 3"):
            ray_trainer.compute_advantage(data, adv_estimator="leaf", config=None)

    def test_grpo_stays_verls_own() -> None:
        ours = ray_trainer.compute_advantage(dataproto(), adv_estimator="grpo", config=OmegaConf.create({}))
        theirs, _ = core_algos.compute_grpo_outcome_advantage(
            dataproto().batch["token_level_rewards"], dataproto().batch["response_mask"], np.array(UIDS, dtype=object))
        torch.testing.assert_close(ours.batch["advantages"], theirs)

    @pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.yaml")), ids=lambda p: p.name)
    def test_example_config_loads_and_validates_with_verl(path: Path) -> None:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            config = compose(path.stem)
        validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
        name = config.algorithm.adv_estimator
        assert hasattr(core_algos.get_adv_estimator_fn(name), "leaf_estimator")
        assert not need_critic(config)
        leaf_verl._engine(name, leaf_verl._options(config.algorithm))  # the estimator parameters validate

    def test_command_line_overrides_reach_the_estimator() -> None:
        overrides = ["algorithm.adv_estimator=collision", "algorithm.leaf_plugins.fork_budget=1",
                     "+algorithm.leaf_plugins.stages.select_boundaries=leaf"]
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            config = compose("grpo_leaf_qwen2_5_3b", overrides=overrides)
        options = leaf_verl._options(config.algorithm)
        assert options == {"fork_budget": 1, "stages": {"select_boundaries": "leaf"}}
        data = ray_trainer.compute_advantage(dataproto(), adv_estimator=config.algorithm.adv_estimator,
                                             config=config.algorithm)
        want = torch.zeros_like(data.batch["advantages"])
        estimated = expected("collision", stages={"select_boundaries": "leaf"}, fork_budget=1)
        want[:, : estimated.shape[1]] = estimated
        torch.testing.assert_close(data.batch["advantages"], want)
