#!/usr/bin/env bash
# Builds .venv-verl: verl 0.9.1 beside this package, in its own environment because verl pins
# transformers<5.11 and tensordict<=0.10 (the project keeps its newer transformers). The venv sees the
# system's packages (torch, leaf-plugins' dependencies) and adds only verl's own (about 45 s; idempotent).
# pip then reports that leaf-plugins requires transformers>=5.15 (its floor): expected, since the
# estimators and the verl integration run on verl's 5.10, while `leaf train` and the backbones do not.
# LEAF_VERL_ENV=DIR builds it elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
ENV_DIR="${LEAF_VERL_ENV:-.venv-verl}"
PY="$ENV_DIR/bin/python"
if [ -x "$PY" ] && "$PY" -c "import verl, leaf_plugins.integrations.verl" >/dev/null 2>&1; then
  echo "verl environment ready: $ENV_DIR"
  exit 0
fi
echo "building the verl environment in $ENV_DIR"
BASE_PYTHON="$(python -c 'import sys; print(sys.base_prefix)')/bin/python3"
"$BASE_PYTHON" -m venv --system-site-packages "$ENV_DIR"
# verl's ray_trainer also imports cachetools, uvicorn and fastapi, which verl 0.9.1 does not declare
"$PY" -m pip --disable-pip-version-check -q install --root-user-action=ignore --no-compile \
  "verl==0.9.1" "transformers>=5.5.3,!=5.6.0,<5.11" cachetools uvicorn fastapi
"$PY" -m pip --disable-pip-version-check -q install --root-user-action=ignore --no-deps -e .
if ! out=$("$PY" -W ignore -c "import verl, leaf_plugins.integrations.verl" 2>&1); then
  echo "$out" >&2
  exit 1
fi
echo "verl environment ready: $ENV_DIR"
