"""leaf-plugins installs beside verl: in the verl environment (.venv-verl, built by
scripts/install_verl_env.sh: verl 0.9.1 first, then a plain ``pip install -e .[verl,test]``),
every package verl's install put there keeps its version (transformers among them), ``pip
check`` is clean, and verl's own registry lookup ``get_adv_estimator_fn("leaf")`` computes
the advantages ``estimate()`` computes here, loading no backbone, task or training code of
leaf-plugins (that its own import chain needs no training stack at all:
tests/test_core_without_training_stack.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

import leaf_plugins as lp

ROOT = Path(__file__).resolve().parents[1]
VERL_ENV = Path(os.environ.get("LEAF_VERL_ENV", ROOT / ".venv-verl"))
VERL_PYTHON = VERL_ENV / "bin" / "python"

# two prompts x K = 3; shared prefixes, so that LEAF's credit differs from GRPO's
RESPONSES = [[5, 6, 7, 2], [5, 6, 9, 9, 2], [4, 2], [7, 7, 2], [7, 8, 8, 2], [7, 7, 3, 2]]
REWARDS = [1.0, 0.0, 0.5, 0.2, 0.9, 0.4]
UIDS = ["b", "b", "b", "a", "a", "a"]
LOGPROBS = [[-0.1, -2.5, -0.3, -0.2], [-0.1, -2.5, -1.7, -0.4, -0.2], [-3.0, -0.1],
            [-0.2, -1.9, -0.1], [-0.2, -2.2, -0.6, -0.1], [-0.2, -1.9, -2.8, -0.3]]

pytestmark = pytest.mark.slow  # subprocesses of verl's Python (seconds each)


def verl_python(code: str) -> subprocess.CompletedProcess:
    assert VERL_PYTHON.exists(), f"no verl environment at {VERL_ENV}: run bash scripts/install_verl_env.sh"
    return subprocess.run([str(VERL_PYTHON), "-W", "ignore", "-c", textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def freeze(lines: str) -> dict[str, str]:
    """``name -> version`` of ``pip freeze`` output (editable installs left out)."""
    pins = {}
    for line in lines.splitlines():
        if "==" in line and not line.startswith(("#", "-e")):
            name, version = line.split("==", 1)
            pins[name.lower().replace("_", "-")] = version.strip()
    return pins


def test_installing_leaf_plugins_kept_every_version_verl_installed():
    before = freeze((VERL_ENV / "verl-freeze.txt").read_text())
    assert VERL_PYTHON.exists(), f"no verl environment at {VERL_ENV}: run bash scripts/install_verl_env.sh"
    run = subprocess.run([str(VERL_PYTHON), "-m", "pip", "--disable-pip-version-check", "freeze", "--all"],
                         capture_output=True, text=True, timeout=120)
    after = freeze(run.stdout)
    assert before["verl"] == "0.9.1"
    assert after["transformers"] == before["transformers"], "installing leaf-plugins moved verl's transformers"
    changed = {name: (version, after.get(name)) for name, version in before.items() if after.get(name) != version}
    assert changed == {}, f"installing leaf-plugins changed verl's packages (before, after): {changed}"
    shown = subprocess.run([str(VERL_PYTHON), "-m", "pip", "--disable-pip-version-check", "show", "leaf-plugins"],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "Location: " in shown.stdout, shown.stderr  # installed there


def test_pip_check_is_clean_in_the_verl_environment():
    run = subprocess.run([str(VERL_PYTHON), "-m", "pip", "--disable-pip-version-check", "check"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_verls_registry_lookup_computes_our_advantages_and_loads_only_the_estimators():
    run = verl_python(f"""
        import json, sys
        import numpy as np
        import torch
        from verl.trainer.ppo import core_algos  # `import verl` loads leaf-plugins through verl.plugins

        responses, rewards, logprobs = {RESPONSES!r}, {REWARDS!r}, {LOGPROBS!r}
        width = max(map(len, responses)) + 1  # right padding, as verl holds it
        tokens = torch.zeros(len(responses), width, dtype=torch.int64)
        mask = torch.zeros(len(responses), width, dtype=torch.int64)
        token_rewards = torch.zeros(len(responses), width)
        old = torch.zeros(len(responses), width)
        for i, row in enumerate(responses):
            tokens[i, :len(row)] = torch.tensor(row)
            mask[i, :len(row)] = 1
            token_rewards[i, len(row) - 1] = rewards[i]
            old[i, :len(row)] = torch.tensor(logprobs[i])
        fn = core_algos.get_adv_estimator_fn("leaf")
        advantages, returns = fn(token_level_rewards=token_rewards, response_mask=mask,
                                 index=np.array({UIDS!r}, dtype=object), config=None,
                                 responses=tokens, old_log_probs=old)
        assert torch.equal(advantages, returns)
        print("OUT=" + json.dumps({{
            "estimator": fn.__name__, "advantages": advantages.tolist(),
            "modules": sorted(m for m in sys.modules if m.startswith("leaf_plugins.")),
        }}))
    """)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("OUT="))[len("OUT="):])
    assert out["estimator"] == "leaf_plugins_leaf"
    batch = lp.RolloutBatch.from_lists(RESPONSES, REWARDS, [1, 1, 1, 0, 0, 0],
                                       surprisal=[[-x for x in row] for row in LOGPROBS], logprobs=LOGPROBS)
    ours = lp.estimate(batch, "leaf").advantages  # [N, T]
    theirs = torch.tensor(out["advantages"])  # [N, T + 1]: verl's padding
    # the same estimator on the same torch build in two processes: measured equal; 1e-6 leaves
    # room for float32 sums reordered by another thread count, far below an advantage's scale (~1)
    torch.testing.assert_close(theirs[:, : ours.shape[1]], ours, atol=1e-6, rtol=1e-6)
    assert theirs[:, ours.shape[1]:].eq(0).all()
    assert any(len(set(row[: len(tokens)])) > 1 for row, tokens in zip(ours.tolist(), RESPONSES))  # tree credit
    loaded = {module.split(".")[1] for module in out["modules"]}
    assert loaded == {"core", "estimators", "integrations"}, out["modules"]

