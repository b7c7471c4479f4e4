#!/usr/bin/env bash
# SWE learning from nothing (benchmarks/swe_speedrun.py) on the lent H200, in consecutive calls while it stays warm
# (it is given back 30 s after a call ends: issue the next call at once):
#
#   here:   bash benchmarks/gpu_fleet_swe.sh prepare && .venv/bin/python benchmarks/swe_speedrun.py prepare
#           .venv/bin/python benchmarks/swe_speedrun.py fixes --corpus-fixes 0 --sft-tasks DIR  # optional
#   there:  bash benchmarks/swe_speedrun.sh stash         # carry [".speedrun/corpus", ".speedrun/fixes"]
#           bash benchmarks/swe_speedrun.sh base          # carry [".whl", ".gpu/deb", "grpofleet", ".speedrun/sdists"]
#           bash benchmarks/swe_speedrun.sh sft           # the same machine: models and tasks stay in /tmp
#           bash benchmarks/swe_speedrun.sh grpo sync
#           bash benchmarks/swe_speedrun.sh grpo async
#
# The corpus and the SFT examples travel in a call of their own: with the wheels (25 MB) and the tree (15 MB) they
# would pass the 64 MiB a call may carry. What a call leaves in /tmp stays while the machine is warm.
# `base`: the task set is built there (16 cores: `grpo-fleet data build`, 14 sandbox workers, from the carried sdists)
# while the GPU pre-trains. `sft`: SFT examples cut from half of its training functions, the corpus's fixes made
# there (`fixes`, one process per core), any carried ones, and the base fine-tuned on them. Each call copies its
# figures (JSON) to $OUT; models stay in /tmp/speedrun (too large to send back). Every call stays under the 600 s a
# call may run.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/speedrun-out}
WORK=/tmp/speedrun
DATA=/tmp/speedrun-data
mkdir -p "$OUT" "$WORK" "$DATA"
stage=${1:-}
shift || true
if [ "$stage" = stash ]; then
  rm -rf "$DATA/corpus" "$DATA/fixes" && cp -r .speedrun/corpus "$DATA/" && du -sh "$DATA/corpus"
  if [ -d .speedrun/fixes ]; then cp -r .speedrun/fixes "$DATA/" && du -sh "$DATA/fixes"; fi
  exit 0
fi
# shellcheck source=benchmarks/lent_gpu_env.sh
source benchmarks/lent_gpu_env.sh
quiet() { grep --line-buffered -v "^ \|Writing\|Loading" || true; }
case "$stage" in
  base)
    [ -f "$DATA/corpus/train.jsonl.xz" ] || cp -r .speedrun/corpus "$DATA/"
    rm -rf "$DATA/tasks"
    (timeout "${BUILD_TIMEOUT:-420}" python3 -m launch.cli data build --recipe benchmarks/speedrun/tasks.yaml --out "$DATA/tasks" \
       --max-per-repo "${MAX_PER_REPO:-48}" --workers 14 --cache-dir .speedrun/sdists > "$WORK/build.log" 2>&1; \
     echo "task build exited $?" >> "$WORK/build.log") &
    python3 benchmarks/swe_speedrun.py pretrain --data "$DATA" --out "$WORK" "$@" 2>&1 | quiet
    cp "$WORK"/pretrain.json "$OUT"/
    wait
    grep "tasks from\|task build exited\|Error" "$WORK/build.log" > "$OUT/build.log" || true
    tail -3 "$WORK/build.log" ;;
  sft)
    python3 benchmarks/swe_speedrun.py sft-examples --data "$DATA" --out "$WORK" 2>&1 | quiet
    cp "$WORK"/sft_examples.json "$OUT"/
    # The corpus's fixes are made here (16 cores: ~1 min) unless they were carried.
    if [ ! -f "$DATA/fixes/corpus.jsonl.xz" ]; then
      python3 benchmarks/swe_speedrun.py fixes --data "$DATA" --out "$WORK" --corpus-fixes "${CORPUS_FIXES:-8000}" \
        2>&1 | quiet
      cp "$WORK"/fixes.json "$OUT"/
    fi
    python3 benchmarks/swe_speedrun.py sft --data "$DATA" --out "$WORK" "$@" 2>&1 | quiet
    cp "$WORK"/sft.json "$OUT"/ ;;
  grpo)
    mode=${1:-sync}
    shift || true
    python3 benchmarks/swe_speedrun.py grpo --mode "$mode" --data "$DATA" --model "$WORK/models/sft" \
      --out "$WORK" "$@" 2>&1 | grep -v "^ " | tail -40
    cp "$WORK/grpo_$mode.json" "$OUT"/ ;;
  *) echo "usage: $0 stash|base|sft|grpo sync|async [options]" >&2; exit 2 ;;
esac
