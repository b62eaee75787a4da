#!/usr/bin/env bash
# Builds .venv-floor: every direct dependency at the lowest version pyproject.toml declares
# (constraints/floor.txt), torch at the local CPU build, and this package installed editable
# (its entry points register the built-in plugins). A plain venv, not --system-site-packages:
# what the tests import must be the floors, never the newer versions installed beside.
# Idempotent: rebuilt only when constraints/floor.txt or the torch pin changed (1-3 min).
# LEAF_FLOOR_ENV=DIR builds it elsewhere; LEAF_TORCH_SPEC picks the torch build, as in install.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
ENV_DIR="${LEAF_FLOOR_ENV:-.venv-floor}"
PY="$ENV_DIR/bin/python"
TORCH_SPEC="${LEAF_TORCH_SPEC:-torch==2.13.0}"
STAMP="$ENV_DIR/.floor-stamp"
WANT="$(cat constraints/floor.txt; echo "$TORCH_SPEC")"
if [ -x "$PY" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$PY" -c "import leaf_plugins" >/dev/null 2>&1; then
  # this package again, without its dependencies: its entry points may have changed since the build
  "$PY" -m pip --disable-pip-version-check -q install --root-user-action=ignore --no-deps -e .
  echo "floor environment ready: $ENV_DIR"
  exit 0
fi
echo "building the floor environment in $ENV_DIR"
rm -rf "$ENV_DIR"
BASE_PYTHON="$(python -c 'import sys; print(sys.base_prefix)')/bin/python3"
"$BASE_PYTHON" -m venv "$ENV_DIR"
"$PY" -m pip --disable-pip-version-check -q install --root-user-action=ignore --no-compile \
  --constraint constraints/floor.txt "$TORCH_SPEC" -e ".[train,test]"
"$PY" -m pip --disable-pip-version-check -q check
echo "$WANT" >"$STAMP"
echo "floor environment ready: $ENV_DIR"
