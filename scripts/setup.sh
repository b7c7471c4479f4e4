#!/usr/bin/env bash
# Creates .venv and installs everything grpo-fleet needs, from nothing. Idempotent; re-run after pulling.
# With uv (scripts/uv.sh bootstraps it) and the lock requirements/cpu.txt: about a minute from a fresh clone when
# the wheels are in uv's cache (~/.cache/uv), most of it compiling bytecode. Each step that can take more than a
# few seconds prints a line; the apt steps run only for what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$SECONDS
step() { echo "[setup] $* ($((SECONDS - T0)) s)"; }

source scripts/uv.sh
if [ ! -x .venv/bin/python ]; then
  step "creating .venv with $($PY --version) (uv $UV_VERSION)"
  # --seed: pip in the venv, for `grpo-fleet data build` (launch/data/sdist.py downloads sdists with it).
  "$UV" venv -q --seed --python "$PY" .venv
fi
export VIRTUAL_ENV=$PWD/.venv UV_PYTHON=$PWD/.venv/bin/python

# No CUDA here: the lock of the `cpu` extra (vLLM's CPU build, the CPU torch wheel); with CUDA, the `gpu` extra,
# resolved at install time (no lock: no machine here can resolve vLLM's CUDA build).
EXTRA=cpu
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then EXTRA=gpu; fi
# Bytecode is compiled at install: PYTHONDONTWRITEBYTECODE is set on these machines, so without it every test
# process would compile torch, vLLM and transformers again when it imports them.
if [ "$EXTRA" = cpu ]; then
  step "installing the locked packages (requirements/cpu.txt: $(grep -c '==' requirements/cpu.txt)) and compiling bytecode"
  "$UV" pip sync -q --compile-bytecode "${UV_ARGS[@]}" requirements/cpu.txt
  # PyPI's torchvision/torchaudio/torchcodec break imports next to the CPU torch build ("operator torchvision::nms
  # does not exist"). The lock leaves them out (scripts/lock.sh); a venv made by an older set-up may hold them.
  "$UV" pip uninstall -q torchvision torchaudio torchcodec 2>/dev/null || true
else
  step "installing grpo-fleet[gpu,dev] (resolved now: no lock for CUDA machines)"
  "$UV" pip install -q --compile-bytecode "${UV_ARGS[@]}" -r pyproject.toml --extra gpu --extra dev
fi

# swebench 4.1 beside swebench 5, for the tests only: they compare our derivation of princeton-nlp rows' eval
# scripts with 4.1's own make_test_spec (envs/swe/harnesses/swebench.py). Not importable from the package.
if [ ! -f .venv/opt/swebench-4.1/swebench/__init__.py ]; then
  step "installing swebench 4.1 (reference harness for the tests) into .venv/opt/swebench-4.1"
  "$UV" pip install -q --no-deps "${UV_ARGS[@]}" --target .venv/opt/swebench-4.1 swebench==4.1.0
fi
# Likewise swesmith 0.0.9, whose repo profiles the SWE-smith harness reproduces (envs/swe/harnesses/swesmith.py).
if [ ! -d .venv/opt/swesmith-0.0.9/swesmith/profiles ]; then
  step "installing swesmith 0.0.9 (reference harness for the tests) into .venv/opt/swesmith-0.0.9"
  "$UV" pip install -q --no-deps "${UV_ARGS[@]}" --target .venv/opt/swesmith-0.0.9 swesmith==0.0.9
fi

# Generated before the editable install, which maps the packages that exist when it runs (grpofleet/ among them).
.venv/bin/python -m fleet.protogen
"$UV" pip install -q --no-deps "${UV_ARGS[@]}" -e .

apt_install() {  # apt_install PKG...: root + apt only; the index is refreshed only when an install fails
  step "installing $* (apt)"
  apt-get install -y -q --no-install-recommends "$@" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "$@" >/dev/null; }
}
CAN_APT=0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then CAN_APT=1; fi
# The sandbox runs tests inside bubblewrap and applies patches with SWE-bench's chain (git, then GNU patch). Image
# tasks (services/sandbox/images): skopeo + umoci pull and unpack images; the tests also build images (debootstrap),
# push them to a registry on loopback (docker-registry) and run the Docker runtime (docker.io). Computer use
# (services/sandbox/computer): Debian's headless Chromium.
MISSING=()
for pair in bwrap:bubblewrap patch:patch skopeo:skopeo umoci:umoci docker-registry:docker-registry dockerd:docker.io \
    debootstrap:debootstrap; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || MISSING+=("${pair#*:}")
done
if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/lib/chromium/chromium ]; then MISSING+=(chromium); fi
if [ ${#MISSING[@]} -gt 0 ]; then
  if [ "$CAN_APT" = 1 ]; then
    apt_install "${MISSING[@]}"
  else
    echo "[setup] WARNING: missing ${MISSING[*]}: the sandbox (bubblewrap), image tasks and computer use" \
      "(and their tests) need them; install them with apt as root" >&2
  fi
fi
touch .venv/.installed
step "done: $(.venv/bin/python -c 'import torch, vllm; print("torch", torch.__version__, "vllm", vllm.__version__)')"
