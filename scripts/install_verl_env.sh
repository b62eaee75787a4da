#!/usr/bin/env bash
# Builds .venv-verl: verl 0.9.1 beside this package, in its own environment because verl pins
# transformers<5.11 and tensordict<=0.10 (the project keeps its newer transformers).
#
# It is built beside the interpreter that runs this script (`python` on PATH, or $PYTHON): the
# new environment sees that interpreter's packages (torch, leaf-plugins' dependencies) through a
# .pth file, whether it is a virtual environment or the system's, and adds only verl's own
# (about 45 s, a few hundred MB; idempotent). torch is pinned to the version already installed,
# so pip never downloads a second torch; where none is installed it installs verl's (on Linux a
# CUDA build, several GB). pip then reports that leaf-plugins requires transformers>=5.15 (its
# floor): expected, since the estimators and the verl integration run on verl's 5.10, while
# `leaf train` and the backbones do not.
# LEAF_VERL_ENV=DIR builds it elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
ENV_DIR="${LEAF_VERL_ENV:-.venv-verl}"
PY="$ENV_DIR/bin/python"
if [ -x "$PY" ] && "$PY" -c "import verl, leaf_plugins.integrations.verl" >/dev/null 2>&1; then
  # this package again, without its dependencies: its entry points may have changed since the build
  "$PY" -m pip --disable-pip-version-check -q install --root-user-action=ignore --no-deps -e .
  echo "verl environment ready: $ENV_DIR"
  exit 0
fi
# the site-packages directories of the running interpreter (a venv's own, plus the system's when
# it was made with --system-site-packages), and its torch version, if any
SITE_DIRS="$("$PYTHON" -c 'import site; print("\n".join(site.getsitepackages()))')"
TORCH_VERSION="$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)"
BESIDE="$("$PYTHON" -c 'import sys; print(sys.prefix)')"
if [ -n "$TORCH_VERSION" ]; then
  echo "building the verl environment in $ENV_DIR beside $BESIDE (its torch $TORCH_VERSION is used)"
else
  echo "building the verl environment in $ENV_DIR beside $BESIDE (no torch there: pip downloads the one verl asks for)"
fi
"$PYTHON" -m venv --clear "$ENV_DIR"
VENV_SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
{
  echo "# the packages of the interpreter that built this environment, after this environment's own"
  while IFS= read -r dir; do
    [ -d "$dir" ] && echo "import site; site.addsitedir('$dir')"
  done <<< "$SITE_DIRS"
} > "$VENV_SITE/_leaf_base_environment.pth"
CONSTRAINTS="$ENV_DIR/constraints.txt"
if [ -n "$TORCH_VERSION" ]; then echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"; else : > "$CONSTRAINTS"; fi
# verl's ray_trainer also imports cachetools, uvicorn and fastapi, which verl 0.9.1 does not declare
"$PY" -m pip --disable-pip-version-check -q install --root-user-action=ignore --no-compile -c "$CONSTRAINTS" \
  "verl==0.9.1" "transformers>=5.5.3,!=5.6.0,<5.11" cachetools uvicorn fastapi
"$PY" -m pip --disable-pip-version-check -q install --root-user-action=ignore --no-deps -e .
if ! out=$("$PY" -W ignore -c "import verl, leaf_plugins.integrations.verl" 2>&1); then
  echo "$out" >&2
  exit 1
fi
echo "verl environment ready: $ENV_DIR"
