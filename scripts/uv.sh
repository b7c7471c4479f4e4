#!/usr/bin/env bash
# Sourced by scripts/setup.sh and scripts/lock.sh: sets UV (a uv binary) and UV_ARGS (the host's pip index settings
# as uv arguments, scripts/pip_to_uv.py). uv is the pinned release, bootstrapped with pip into the user cache once
# (about 3 s) and shared by every clone after that; UV=/path/to/uv uses another.
UV_VERSION=0.13.9
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ -z "${UV:-}" ]; then
  UV_HOME=${XDG_CACHE_HOME:-$HOME/.cache}/grpo-fleet/uv-$UV_VERSION
  UV=$UV_HOME/bin/uv
  if [ ! -x "$UV" ]; then
    echo "[setup] bootstrapping uv $UV_VERSION with pip into $UV_HOME"
    rm -rf "$UV_HOME.tmp"
    "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-warn-script-location \
      --target "$UV_HOME.tmp" "uv==$UV_VERSION" 2>&1 | grep -v "^WARNING: Location" || true
    [ -x "$UV_HOME.tmp/bin/uv" ] || { echo "[setup] could not install uv==$UV_VERSION with pip" >&2; exit 1; }
    rm -rf "$UV_HOME" && mv "$UV_HOME.tmp" "$UV_HOME"
  fi
fi
# The system trust store (and SSL_CERT_FILE), where a host keeps the extra CA certificates its pip uses.
export UV_NATIVE_TLS=1
mapfile -t UV_ARGS < <("$PY" scripts/pip_to_uv.py)
# The lock pins the CPU torch build (torch==X+cpu), which PyPI does not carry: a host whose pip configuration does
# not find it (this one's does, through /opt/wheels) names the PyTorch CPU index:
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu make setup
if [ -n "${TORCH_INDEX_URL:-}" ]; then UV_ARGS+=(--extra-index-url "$TORCH_INDEX_URL"); fi
