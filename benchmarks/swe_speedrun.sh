#!/usr/bin/env bash
# SWE learning from nothing (benchmarks/swe_speedrun.py) on the lent H200, in consecutive calls while it stays warm
# (it is given back 30 s after a call ends: issue the next call at once):
#
#   here:   bash benchmarks/gpu_fleet_swe.sh prepare && .venv/bin/python benchmarks/swe_speedrun.py prepare
#           .venv/bin/python benchmarks/swe_speedrun.py fixes --corpus-fixes 0 --sft-tasks DIR  # optional
#   there:  bash benchmarks/swe_speedrun.sh stash   # carry [".speedrun/corpus"] (+ ".speedrun/fixes", and
#                                                   # ".speedrun/tasks" or ".speedrun/tasks.tar.xz")
#           bash benchmarks/swe_speedrun.sh base          # carry [".whl", ".gpu/deb", "grpofleet", ".speedrun/sdists"]
#                                                         # (+ ".speedrun/tasks" where stash had no room for it)
#           bash benchmarks/swe_speedrun.sh sft           # the same machine: models and tasks stay in /tmp
#           bash benchmarks/swe_speedrun.sh grpo both     # sync and async side by side, or `grpo sync|async`
#           bash benchmarks/swe_speedrun.sh probe [W ...] # after stash: gold patches at W runners (--pool's choice)
#   or      bash benchmarks/swe_speedrun.sh model         # base then sft in one call (~8 min; one call less to lose
#                                                         # to the 30 s idle release), when everything CPU-side travels
#
# The corpus (and optionally SFT examples or a task set made here) travels in a call of its own: with the wheels
# (25 MB) and the tree (15 MB) it would pass the 64 MiB a call may carry. What a call leaves in /tmp stays while the
# machine is warm. `base`: while the GPU pre-trains, the CPUs build the task set (16 cores: `grpo-fleet data build`,
# 14 sandbox workers, from the carried sdists) unless it was carried, then make the corpus's fixes (`fixes`, 12
# processes). `sft`: SFT examples cut from half of the task set's training functions, with the corpus's fixes and
# any carried ones, and the base fine-tuned on them. Each call copies its figures (JSON) to $OUT; models stay in
# /tmp/speedrun (too large to send back). Every call stays under the 600 s a call may run.
# The prompt (SPEEDRUN_MAX_PROMPT tokens, default 1792; SPEEDRUN_CONTEXT_FUNCTIONS, default 12) is one setting for
# the whole pipeline, from the base's row length to GRPO (speedrun/prompting.py): set it in every call, and make the
# SFT pairs made here with it (`fixes --sft-tasks`); a base made for a smaller budget is refused.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/speedrun-out}
WORK=${SPEEDRUN_WORK:-/tmp/speedrun}
DATA=/tmp/speedrun-data
mkdir -p "$OUT" "$WORK" "$DATA"
stage=${1:-}
shift || true
# The task set as `tar -cJf .speedrun/tasks.tar.xz -C .speedrun tasks` (14 MB -> 2 MB): the tree grew to 31 MB with
# the committed results, and tree + corpus + task set no longer fit the 64 MiB a call carries.
unpack_tasks() {
  if [ -f .speedrun/tasks.tar.xz ]; then
    rm -rf "$DATA/tasks" && tar -xJf .speedrun/tasks.tar.xz -C "$DATA" && du -sh "$DATA/tasks"
  fi
}
if [ "$stage" = stash ]; then
  rm -rf "$DATA/corpus" "$DATA/fixes" "$DATA/tasks" && cp -r .speedrun/corpus "$DATA/" && du -sh "$DATA/corpus"
  for d in fixes tasks; do  # optional: SFT examples made here, a task set built here
    if [ -d ".speedrun/$d" ]; then cp -r ".speedrun/$d" "$DATA/" && du -sh "$DATA/$d"; fi
  done
  if [ ! -d .speedrun/tasks ]; then unpack_tasks; fi
  python3 --version
  exit 0
fi
# `start` and `watch` run beside a pipeline at work: they must not source lent_gpu_env.sh, which reinstalls the
# wheels and the tests' interpreter that its fleet is using.
case "$stage" in
  # The whole GPU part as one process that outlives the calls (`setsid`): stash, model, then `grpo` with the options
  # given, its --timeout and --max-train-s set when it starts so that it ends PIPELINE_SECONDS after `start`. Calls
  # then only `watch` it, so no stage is cut at a call's 600 s, and a fleet restarts no more (a resumed call paid
  # ~90 s to start again and a slow first validation round). The 30 s idle release still holds: issue each `watch`
  # call at once. `start` copies the tree first: the next call's copy of the tree must not change it underneath.
  #   call 1: SFT_FROM_TRAIN=0 ... bash benchmarks/swe_speedrun.sh start sync $GRPO --pool 14 && \
  #           bash benchmarks/swe_speedrun.sh watch 560        # carry what `stash` and `model` need
  #   then:   bash benchmarks/swe_speedrun.sh watch 585        # carry nothing; until the pipeline is done
  # `watch` also sends the SFT model back in parts. A later session starts from them instead of making a model:
  # `model_parts.py spread` puts them in one folder per call; carry .speedrun/model-up/1 with the wheels, the
  # tokenizer and the task set, then each next folder in a call of its own, and start in the last one with
  # MODEL_PARTS=".speedrun/model-up/*".
  start)
    rm -rf "$WORK/pipeline".* "$WORK-repo" "$WORK-out" && cp -a . "$WORK-repo"
    seconds=${PIPELINE_SECONDS:-1530}
    date +%s > "$WORK/pipeline.start"
    PIPELINE_DEADLINE=$(( $(date +%s) + seconds )) OUT=$WORK-out \
      setsid -f bash "$WORK-repo/benchmarks/swe_speedrun.sh" pipeline "$@" \
      > "$WORK/pipeline.log" 2>&1 < /dev/null
    echo "pipeline started: ends by $seconds s from now; log $WORK/pipeline.log"
    exit 0 ;;
  pipeline) trap 'echo "$?" > "$WORK/pipeline.done"' EXIT ;;  # `watch` stops waiting, however it ends
  # Waits up to N s (or until the pipeline is done), then brings back what it has written: one archive in $OUT.
  watch)
    end=$(( SECONDS + ${1:-560} ))
    while [ ! -f "$WORK/pipeline.done" ] && [ "$SECONDS" -lt "$end" ]; do sleep 5; done
    # What the pipeline wrote in $WORK and its reports in $WORK-out, with the fleet's metrics and its processes'
    # logs (when the rollout worker was ready, what the trainer waited for), all small.
    files=$(cd "$(dirname "$WORK")" && w=$(basename "$WORK") \
            && find "$w" "$w-out" -maxdepth 1 -type f -size -20M 2>/dev/null
            find "$w/runs" \( -name metrics.jsonl -o -path "*/processes/*.log" \) -size -20M 2>/dev/null || true)
    # GNU tar exits 1 when a file changed while it read it (the fleet's logs grow as it runs): the archive is whole
    # and the rest of `watch` (the model's parts, the log's tail) must still run, as set -e would not let it.
    # shellcheck disable=SC2086
    tar -cJf "$OUT/speedrun.tar.xz" -C "$(dirname "$WORK")" $files || [ "$?" -eq 1 ]
    echo "$(( $(date +%s) - $(cat "$WORK/pipeline.start") )) s since start; done: $(cat "$WORK/pipeline.done" 2>/dev/null || echo no)"
    # The SFT model in parts (benchmarks/speedrun/model_parts.py), four a call once SFT has written its figures, so
    # that a later session starts GRPO from it (`MODEL_PARTS`); MODEL_BACK=0 sends none.
    if [ "${MODEL_BACK:-1}" != 0 ] && [ -f "$WORK/sft.json" ] && [ -d "$WORK/models/sft" ]; then
      [ -f "$WORK/model-parts/manifest.json" ] \
        || python3 benchmarks/speedrun/model_parts.py pack --model "$WORK/models/sft" --out "$WORK/model-parts" \
             ${MODEL_PART_BYTES:+--part-bytes "$MODEL_PART_BYTES"}
      touch "$WORK/model-parts/sent" && cp "$WORK/model-parts/manifest.json" "$OUT/"
      n=0
      for part in "$WORK"/model-parts/part-*; do
        if [ "$n" -lt 4 ] && ! grep -qx "${part##*/}" "$WORK/model-parts/sent"; then
          cp "$part" "$OUT/" && echo "${part##*/}" >> "$WORK/model-parts/sent" && n=$(( n + 1 ))
        fi
      done
      echo "model parts sent: $(wc -l < "$WORK/model-parts/sent") of $(ls "$WORK"/model-parts/part-* | wc -l)"
    fi
    tail -n 25 "$WORK/pipeline.log"
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader || true
    exit 0 ;;
esac
# shellcheck source=benchmarks/lent_gpu_env.sh
source benchmarks/lent_gpu_env.sh
# The tests' interpreter (lent_gpu_env.sh): builds and fleets grade with the pytest the carried task set was made with.
TEST_PYTHON_ARG=${GRPO_FLEET_TEST_PYTHON:+--python $GRPO_FLEET_TEST_PYTHON}
# Context lines of an SFT diff (git diff -U<N>): fewer lines to copy exactly; the corpus's fixes made here must match.
DIFF_CONTEXT=${DIFF_CONTEXT:-1}
quiet() { grep --line-buffered -v "^ \|Writing\|Loading" || true; }
# The gold and empty patches of `rows` training tasks, `workers` at a time (`data validate`, every run counted: no
# tree cache), with the wall time of the whole batch: $WORK/sandbox_probe_<workers>.{json,log}.
probe_sandbox() {
    local workers=$1 rows=$2 start=$EPOCHREALTIME
    timeout 150 python3 -m launch.cli data validate --gold "$rows" --workers "$workers" \
      --out "$WORK/sandbox_probe_$workers.json" data.train.dataset_name=swe_embedded \
      data.train.data_path="$DATA/tasks" ${GRPO_FLEET_TEST_PYTHON:+sandbox.python=$GRPO_FLEET_TEST_PYTHON} \
      > "$WORK/sandbox_probe_$workers.log" 2>&1 || true
    echo "sandbox probe: $rows tasks at $workers at a time in $(python3 -c "print(round($EPOCHREALTIME - $start, 1))") s" \
      >> "$WORK/sandbox_probe_$workers.log"
}
base() {
    [ -f "$DATA/corpus/train.jsonl.xz" ] || cp -r .speedrun/corpus "$DATA/"
    for d in fixes tasks; do  # what `stash` had no room for may travel with this call
      if [ -d ".speedrun/$d" ] && [ ! -e "$DATA/$d" ]; then cp -r ".speedrun/$d" "$DATA/"; fi
    done
    # The CPUs' part, while the GPU pre-trains: the task set (unless it was carried), then the corpus's fixes.
    (if [ ! -f "$DATA/tasks/train.jsonl" ]; then
       timeout $(( ${BUILD_SECONDS:-420} + 120 )) python3 -m launch.cli data build \
         --recipe benchmarks/speedrun/tasks.yaml --out "$DATA/tasks" --max-per-repo "${MAX_PER_REPO:-48}" \
         --workers 14 --cache-dir .speedrun/sdists --max-seconds "${BUILD_SECONDS:-420}" ${TEST_PYTHON_ARG} > "$WORK/build.log" 2>&1
       echo "task build exited $?" >> "$WORK/build.log"
     fi
     if [ ! -f "$DATA/fixes/corpus.jsonl.xz" ]; then
       python3 benchmarks/swe_speedrun.py fixes --data "$DATA" --out "$WORK" --workers 12 \
         --corpus-fixes "${CORPUS_FIXES:-8000}" --per-file "${PER_FILE:-2}" --diff-context "$DIFF_CONTEXT" \
         > "$WORK/fixes.log" 2>&1
     fi
     # Then the SFT task set (sft.yaml), larger than the one built on two cores: `sft` makes examples of it.
     if [ "${SFT_PER_REPO:-0}" -gt 0 ] && [ ! -f "$DATA/sft-tasks/train.jsonl" ]; then
       # --max-seconds: what is accepted by then is written (a killed build would leave nothing); `timeout` only
       # guards against a hang past it.
       timeout $(( ${SFT_BUILD_SECONDS:-300} + 120 )) python3 -m launch.cli data build \
         --recipe benchmarks/speedrun/sft.yaml --out "$DATA/sft-tasks" --max-per-repo "$SFT_PER_REPO" --workers 14 \
         --cache-dir .speedrun/sdists --max-seconds "${SFT_BUILD_SECONDS:-300}" ${TEST_PYTHON_ARG} > "$WORK/sft-build.log" 2>&1
       echo "sft task build exited $?" >> "$WORK/sft-build.log"
     fi
     # What one sandbox run costs on this host beside a busy GPU (the fleet's steps wait for verdicts): the gold and
     # empty patches of training tasks at each of PROBE_COUNTS runners (PROBE_ROWS tasks at 12, in proportion).
     if [ "${PROBE_ROWS:-0}" -gt 0 ]; then
       for workers in ${PROBE_COUNTS:-2 12}; do probe_sandbox "$workers" $(( PROBE_ROWS * workers / 12 )); done
     fi) &
    python3 benchmarks/swe_speedrun.py pretrain --data "$DATA" --out "$WORK" "$@" 2>&1 | quiet
    cp "$WORK"/pretrain.json "$OUT"/
    wait
    for log in build sft-build; do
      if [ -f "$WORK/$log.log" ]; then
        grep "tasks from\|task build exited\|built \|Error" "$WORK/$log.log" > "$OUT/$log.log" || true
      fi
    done
    if [ -f "$WORK/fixes.json" ]; then cp "$WORK/fixes.json" "$OUT"/; fi
    for f in "$WORK"/sandbox_probe_*.json; do if [ -f "$f" ]; then cp "$f" "$OUT"/; fi; done
    grep -h "one sandbox run" "$WORK"/sandbox_probe_*.log 2>/dev/null || true
    tail -3 "$WORK/fixes.log" 2>/dev/null || true
}

sft() {
    # SFT_FROM_TRAIN: the share of the GRPO training repositories' functions whose bugs become SFT examples (GRPO
    # then trains on the rest). 0 leaves those repositories' paths as unseen as the held-out ones (the eighth run).
    python3 benchmarks/swe_speedrun.py sft-examples --data "$DATA" --out "$WORK" --diff-context "$DIFF_CONTEXT" \
      --sft-from-train "${SFT_FROM_TRAIN:-0.5}" 2>&1 | quiet
    cp "$WORK"/sft_examples.json "$OUT"/
    if [ -f "$DATA/sft-tasks/train.jsonl" ]; then  # built by `base`
      python3 benchmarks/swe_speedrun.py fixes --data "$DATA" --out "$WORK" --corpus-fixes 0 \
        --sft-tasks "$DATA/sft-tasks" --name sft_tasks_built --diff-context "$DIFF_CONTEXT" 2>&1 | quiet
      cp "$WORK"/fixes.json "$OUT"/sft_tasks_built.json
    fi
    python3 benchmarks/swe_speedrun.py sft --data "$DATA" --out "$WORK" "$@" 2>&1 | quiet
    cp "$WORK"/sft.json "$OUT"/
}

grpo_fleets() {  # sync, async, or both side by side (one call; swe_speedrun.py splits the sandbox's runners)
    local mode=${1:-both} status=0 log=/dev/null
    shift || true
    # One fleet writes to the pipe; side by side, each fleet writes its own grpo_<mode>.log.
    if [ "$mode" != both ]; then log=$OUT/grpo_$mode.log; fi
    # Reports and logs straight into $OUT: a call that runs out of time while the reports are diagnosed still
    # brings back what the fleets wrote (`diagnose --finish` completes them anywhere). The runs stay in
    # $WORK/runs with a checkpoint, for a later `grpo --resume` call while the machine is warm.
    python3 benchmarks/swe_speedrun.py grpo --mode "$mode" --data "$DATA" --model "${MODEL:-$WORK/models/sft}" \
      --out "$OUT" --run-root "$WORK/runs" "$@" 2>&1 | tee "$log" | grep -v "^ " | tail -40 || status=$?
    if [ "$mode" = both ]; then
      for m in sync async; do if [ -f "$OUT/grpo_$m.log" ]; then grep -v "^ " "$OUT/grpo_$m.log" | tail -15; fi; done
    fi
    return "$status"
}

case "$stage" in
  base) base "$@" ;;
  sft) sft "$@" ;;
  # One call of ~8 min: pre-training and SFT sized to fit it (the fourth run's figures: 240 s, then 2 epochs).
  model) base --pretrain-seconds "${PRETRAIN_SECONDS:-240}" "$@" \
           && sft --sft-epochs "${SFT_EPOCHS:-2}" --task-weight "${TASK_WEIGHT:-3}" --sft-seconds "${SFT_SECONDS:-180}" ;;
  # How many runners the GPU host's cores carry (the fleets' `--pool`): the same PROBE_ROWS tasks at each count
  # (default 8 12 14 16), after `stash` (the task set) on the same warm machine; carry [".whl", ".gpu/deb"].
  probe)
    counts=("$@")
    [ "${#counts[@]}" -gt 0 ] || counts=(8 12 14 16)
    for workers in "${counts[@]}"; do probe_sandbox "$workers" "${PROBE_ROWS:-144}"; done
    for f in "$WORK"/sandbox_probe_*; do cp "$f" "$OUT"/; done
    grep -h "one sandbox run\|sandbox probe:" "$WORK"/sandbox_probe_*.log ;;
  grpo) grpo_fleets "$@" ;;
  pipeline)
    if [ -n "${MODEL_PARTS:-}" ]; then  # an SFT model an earlier session sent back (`watch`), carried in parts
      # shellcheck disable=SC2086
      bash "$0" stash && python3 benchmarks/speedrun/model_parts.py join --parts $MODEL_PARTS --out "$WORK/models/sft"
    else
      bash "$0" stash && bash "$0" model
    fi
    # `start model`: a session that spends its budget on the base (a long PRETRAIN_SECONDS over the corpus and its
    # `corpus-more` parts) and sends it back through `watch`; GRPO runs from it in the next sessions.
    if [ "${1:-}" = model ]; then exit 0; fi
    left=$(( PIPELINE_DEADLINE - $(date +%s) ))
    overhead=${GRPO_OVERHEAD_S:-170}  # the fleet's start, the first and last validation rounds, the checkpoint
    if [ "$left" -lt $(( overhead + 60 )) ]; then
      echo "pipeline: $left s left for grpo, under its ${overhead} s of start and validation" >&2; exit 3
    fi
    echo "pipeline: grpo with $left s, training $(( left - overhead )) s"
    # --timeout 30 s early: the fleet is then given 60 s to stop and report.
    grpo_fleets "$@" --timeout "$(( left - 30 ))" --max-train-s "$(( left - overhead ))" ;;
  *) echo "usage: $0 stash|base|sft|model|probe [workers ...]|grpo|start sync|async|both|model [options]|watch [seconds]" >&2
     exit 2 ;;
esac
