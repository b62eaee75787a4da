#!/usr/bin/env bash
# Builds .venv-verl, where the verl integration is tested: an ordinary virtual environment in
# which verl 0.9.1 is installed first, as a verl user has it, and then this package with its
# verl and test extras by a plain `pip install` (dependencies resolved, nothing forced), so that
# the tests can check that the install fits beside verl: verl's packages keep their versions
# and `pip check` is clean (tests/test_verl_install.py).
#
# 1. verl's environment (skipped when already built for the same torch and verl): a fresh venv
#    from the interpreter that runs this script (`python` on PATH, or $PYTHON), with
#    LEAF_TORCH_SPEC (default torch==2.13.0, the CPU build this machine has on disk; empty: the
#    torch verl asks for, on Linux a CUDA build of several GB) and verl==0.9.1; `pip freeze`
#    is then kept in $ENV_DIR/verl-freeze.txt.
# 2. this package, editable, with its [verl,test] extras (every run: its metadata may have
#    changed), then `pip check`, whose output is kept in $ENV_DIR/pip-check.txt.
# From scratch, part of the about 4 minutes that install.sh takes on 2 CPU cores, downloads
# aside (a few seconds when built); LEAF_VERL_ENV=DIR builds it elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
if ! command -v "$PYTHON" >/dev/null 2>&1; then PYTHON=python3; fi
ENV_DIR="${LEAF_VERL_ENV:-.venv-verl}"
PY="$ENV_DIR/bin/python"
TORCH_SPEC="${LEAF_TORCH_SPEC-torch==2.13.0}"
VERL_SPEC="verl==0.9.1"
STAMP="$ENV_DIR/.verl-stamp"
WANT="$TORCH_SPEC $VERL_SPEC"
PIP="$PY -m pip --disable-pip-version-check -q install --root-user-action=ignore --no-compile"
if ! { [ -x "$PY" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -f "$ENV_DIR/verl-freeze.txt" ]; }; then
  echo "building the verl environment in $ENV_DIR: $WANT"
  "$PYTHON" -m venv --clear "$ENV_DIR"
  # shellcheck disable=SC2086  # an empty TORCH_SPEC is no argument
  $PIP $TORCH_SPEC "$VERL_SPEC"
  "$PY" -m pip --disable-pip-version-check freeze --all >"$ENV_DIR/verl-freeze.txt"
  echo "$WANT" >"$STAMP"
fi
echo "installing leaf-plugins[verl,test] beside verl in $ENV_DIR"
$PIP -e ".[verl,test]"
if ! out=$("$PY" -W ignore -c "import verl, leaf_plugins.integrations.verl" 2>&1); then
  echo "$out" >&2
  exit 1
fi
if ! "$PY" -m pip --disable-pip-version-check check >"$ENV_DIR/pip-check.txt" 2>&1; then
  echo "pip check in $ENV_DIR reports broken requirements (tests/test_verl_install.py fails):" >&2
  cat "$ENV_DIR/pip-check.txt" >&2
fi
echo "verl environment ready: $ENV_DIR"
