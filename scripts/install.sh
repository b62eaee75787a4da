#!/usr/bin/env bash
# Installs everything leaf-plugins needs on a fresh Debian machine (idempotent), into the
# environment of the `python` first on PATH (or $PYTHON): an activated virtual environment,
# else that interpreter's own site-packages (it says which before installing anything).
# torch is installed first and pinned to the CPU build this machine has on disk; on a GPU
# cluster install your own CUDA build of torch first and this script keeps it
# (LEAF_TORCH_SPEC="" skips the torch step). This package goes in with its training stack and
# its test, eval, TRL, trackers and docs extras; verl in .venv-verl, where this package is installed
# beside verl 0.9.1 (scripts/install_verl_env.sh). docs/installation.md says more.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHON="${PYTHON:-python}"
if ! command -v "$PYTHON" >/dev/null 2>&1; then PYTHON=python3; fi
"$PYTHON" - <<'PY'
import os, sys
if sys.prefix != sys.base_prefix:
    print(f"installing into the virtual environment {sys.prefix} ({sys.executable})")
elif os.environ.get("CONDA_PREFIX") == sys.prefix:
    print(f"installing into the conda environment {sys.prefix} ({sys.executable})")
else:
    print(f"installing into {sys.executable}'s own site-packages: no virtual environment is active")
    if not os.environ.get("CI"):
        print("  a virtual environment keeps leaf-plugins and its dependencies apart (docs/installation.md):\n"
              "  python -m venv .venv && . .venv/bin/activate && bash scripts/install.sh")
PY

if ! command -v espeak-ng >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing espeak-ng (speech for the built-in tasks)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq espeak-ng >/dev/null
  else
    echo "espeak-ng is missing: run 'sudo apt-get install -y espeak-ng' (needed by the built-in spoken tasks)" >&2
  fi
fi

PIP_INSTALL="$PYTHON -m pip --disable-pip-version-check -q install --root-user-action=ignore"
TORCH_SPEC="${LEAF_TORCH_SPEC-torch==2.13.0}"
if [ -n "$TORCH_SPEC" ] && ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
  echo "installing $TORCH_SPEC"
  $PIP_INSTALL "$TORCH_SPEC"
fi
echo "installing leaf-plugins and its dependencies"
$PIP_INSTALL -e ".[train,test,eval,trl,trackers,docs]"
# verl pins a transformers below the training stack's floor: the verl integration is tested in an
# environment of verl's own (.venv-verl), with this package installed there beside verl
bash scripts/install_verl_env.sh
