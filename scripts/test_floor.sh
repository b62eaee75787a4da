#!/usr/bin/env bash
# Runs the tests that exercise the dependencies' APIs in the floor environment (.venv-floor:
# every direct dependency at its declared minimum; scripts/install_floor_env.sh builds it).
# Extra arguments go to pytest. FLOOR_TESTS below is the one list of what runs there: add a
# test file to it when it calls transformers, peft, accelerate, datasets or another dependency
# in a new way.
set -euo pipefail
cd "$(dirname "$0")/.."
FLOOR_TESTS=(
  tests/test_packaging.py
  # backbones and their model layouts, feature extractors, built-in adapters
  tests/test_backbones_granite.py
  tests/test_backbones_qwen2_audio.py
  # rollout: generate, teacher forcing, shared prompt embeddings
  tests/test_rollout.py
  tests/test_rollout_shared_audio.py
  tests/test_rollout_static.py
  tests/test_rollout_capture.py
  tests/test_rollout_fold.py
  tests/test_selected_logprobs.py
  tests/test_teacher_forcing.py  # the cache keyword: past_key_values (5.15) or cache (5.2x)
  # training: LoRA (peft), accelerate, activation checkpointing, checkpoints and resume
  tests/test_training_lora.py
  tests/test_training_loss.py
  tests/test_loss_aggregation.py
  tests/test_training_distributed.py
  tests/test_training_resume.py
  tests/test_training_finite.py
  tests/test_training_hooks.py
  tests/test_training_cli.py
  tests/test_training_warm_start.py
  # datasets, soundfile, ruamel.yaml, pluggy, sacrebleu, matplotlib
  tests/test_tasks_prepared.py
  tests/test_tasks_sources.py
  tests/test_config_yaml.py
  tests/test_core_plugins.py
  tests/test_core_parameters.py
  tests/test_plugins_stages.py
  tests/test_evaluation_text_metrics.py
  tests/test_forkability_log.py
)
bash scripts/install_floor_env.sh
PY="${LEAF_FLOOR_ENV:-.venv-floor}/bin/python"
"$PY" -c 'import torch, transformers, peft, accelerate, datasets
print("floor environment: torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__,
      "accelerate", accelerate.__version__, "datasets", datasets.__version__)'
PYTHONPATH="$PWD" "$PY" -m pytest -q -p no:cacheprovider "${FLOOR_TESTS[@]}" "$@"
