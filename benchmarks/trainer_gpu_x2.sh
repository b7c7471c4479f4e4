#!/usr/bin/env bash
# The trainer GPU measurements of docs/performance.md ("Trainer throughput on GPU"), on a 2-GPU host:
# 1-GPU variants two at a time (one per GPU, each process alone on its GPU), then FSDP2 over both GPUs.
# Writes JSON and logs to $OUT (default ./gpu-out). Needs torch with CUDA and transformers.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
B="benchmarks/trainer_gpu_bench.py --mask all"  # every response token trained, as when these rows were measured
run1() {  # GPU, output name, bench args...
  local gpu=$1 name=$2; shift 2
  CUDA_VISIBLE_DEVICES=$gpu torchrun --standalone --nproc-per-node=1 $B --out "$OUT/$name.json" "$@"
}
(
  run1 0 trainer_gpu_1x --batch-sizes 4,1 --profile
  run1 0 trainer_gpu_1x_before --batch-sizes 4 --saved-grad-gb 0 --sync-clip
) > "$OUT/log_gpu0.txt" 2>&1 &
g0=$!
(
  run1 1 trainer_gpu_1x_b8 --batch-sizes 8
  run1 1 trainer_gpu_1x_recompute --batch-sizes 4 --saved-grad-gb 0
) > "$OUT/log_gpu1.txt" 2>&1 &
g1=$!
wait $g0 $g1
torchrun --standalone --nproc-per-node=2 $B --batch-sizes 1,4 --out "$OUT/trainer_gpu_2x_fsdp2.json" \
  > "$OUT/log_fsdp2.txt" 2>&1
grep -h '^{' "$OUT"/log_*.txt
