#!/usr/bin/env bash
# The static rollout's GPU check (scripts/gpu_check.py): the CUDA tests, then
# `leaf bench rollout --device cuda --profile` on random-weight Granite Speech 3.3 8B and
# Qwen2-Audio-7B, one summary. Run from the repository root with the package importable.
# usage: scripts/gpu_check.sh OUT_DIR [more gpu_check.py options, e.g. --device cpu for a dry run]
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUT_DIR [options]}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 scripts/gpu_check.py --out "$out" "$@" 2>&1 | tee "$out/log.txt"
