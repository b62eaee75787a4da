"""Listing plugins and checking a run config import no model code: ``leaf plugins`` and
``leaf train CONFIG --check`` read names and parameter schemas, so the backbones and tasks
register without importing transformers, peft or datasets (which take seconds to import).

Each command runs in a fresh interpreter, which then reports the heavy modules it imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL_MODULES = ("transformers", "peft", "datasets")
REPORT = """
import json, sys
from leaf_plugins.cli import main
status = main({argv!r})
print("IMPORTED=" + json.dumps({{"status": status, "heavy": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def imported_by(*argv: str) -> dict:
    """The exit status of ``leaf ARGV`` and which of ``MODEL_MODULES`` it imported."""
    code = REPORT.format(argv=list(argv), heavy=MODEL_MODULES)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("IMPORTED="))
    return json.loads(line.removeprefix("IMPORTED="))


@pytest.mark.parametrize("argv", [("plugins",), ("train", "configs/runs/tiny-qwen2-audio.yaml", "--check"),
                                  ("train", "configs/runs/tiny-granite-speech.yaml", "--check")],
                         ids=["plugins", "train-check-qwen2-audio", "train-check-granite-speech"])
def test_listing_and_checking_import_no_model_code(argv):
    assert imported_by(*argv) == {"status": 0, "heavy": []}


def test_the_backbones_still_build_their_models():
    """The imports moved into the functions that need them: the tiny backbones still load."""
    from leaf_plugins.backbones.granite_features import TorchGraniteSpeechFeatureExtractor
    from leaf_plugins.backbones.granite_speech import TINY as GRANITE
    from leaf_plugins.backbones.qwen2_audio import TINY as QWEN

    for spec in (QWEN, GRANITE):
        loaded = spec.load(seed=0)
        assert loaded.model.config.get_text_config().hidden_size == 48
    assert isinstance(GRANITE.load(seed=0).processor.audio_processor, TorchGraniteSpeechFeatureExtractor)
