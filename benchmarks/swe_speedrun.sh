#!/usr/bin/env bash
# SWE learning from nothing (benchmarks/swe_speedrun.py) on the lent H200, in consecutive calls while it stays warm:
#
#   here:   bash benchmarks/gpu_fleet_swe.sh prepare && .venv/bin/python benchmarks/swe_speedrun.py prepare
#   there:  bash benchmarks/swe_speedrun.sh pretrain      # carry [".whl", ".gpu", "grpofleet", ".speedrun"]
#           bash benchmarks/swe_speedrun.sh grpo sync     # same machine, models kept under /tmp/speedrun
#           bash benchmarks/swe_speedrun.sh grpo async
#
# Each call copies its figures (JSON) to $OUT; the models stay in /tmp/speedrun (too large to send back, and only
# needed there).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benchmarks/lent_gpu_env.sh
source benchmarks/lent_gpu_env.sh
OUT=${OUT:-/tmp/speedrun-out}
WORK=/tmp/speedrun
mkdir -p "$OUT" "$WORK"
stage=${1:-}
shift || true
case "$stage" in
  pretrain)
    python3 benchmarks/swe_speedrun.py pretrain --out "$WORK" "$@" 2>&1 | grep -v "^ \|Writing\|Loading"
    cp "$WORK"/pretrain.json "$WORK"/sft.json "$OUT"/ ;;
  grpo)
    mode=${1:-sync}
    shift || true
    python3 benchmarks/swe_speedrun.py grpo --mode "$mode" --model "$WORK/models/sft" --out "$WORK" "$@" 2>&1 \
      | grep -v "^ " | tail -40
    cp "$WORK/grpo_$mode.json" "$OUT"/ ;;
  *) echo "usage: $0 pretrain|grpo sync|async [overrides]" >&2; exit 2 ;;
esac
