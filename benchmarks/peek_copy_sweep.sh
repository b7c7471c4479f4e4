#!/bin/bash
# Issue 17: which GRPO recipe, if any, teaches the tiny model `peek` (copy the digit its `read` call returned)?
# benchmarks/lookup_copy.py --env peek (the agent loop's own episode code, scoring and observation masks; a
# standalone loss, no fleet) on one GPU, several recipes at once. Results: benchmarks/results/peek_copy_gpu_sweep.json
# (docs/performance.md, "peek: a recipe sweep on a GPU").
#
# Run on a machine with a GPU, torch and transformers, from the repository root, with the generated gRPC code
# (`python -m fleet.protogen`) and this project's other imports (pydantic, grpcio, redis: `pip install -e .`), and
# the peek base in .cache/models (`python benchmarks/peek_learn.py` builds it, or lookup_copy.py does):
#   OUT=/tmp/peek_sweep bash benchmarks/peek_copy_sweep.sh
set -u
OUT=${OUT:-/tmp/peek_sweep}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD
BASE=.cache/models/tiny-qwen2-peek-format  # 150 steps x 64 episodes at lr 2e-3, random answers (the fleet demo's)

base() {  # base DIR STEPS LR ECHO_FRAC: another pre-training of the format (workshop/pretrain.py), on CPU
    python3 -c "import sys, pathlib, torch; torch.set_num_threads(4); sys.path.insert(0, 'benchmarks'); import lookup_copy
lookup_copy.peek_base(pathlib.Path('$1'), $2, 64, $3, 0.0, $4)"
}
run() {  # run NAME ARGS...: one GRPO run, greedy held-out success every 10 steps
    local name=$1; shift
    python3 benchmarks/lookup_copy.py --env peek --device cuda --eval-every 10 --out "$OUT/$name.json" \
        --plot "$OUT/$name.png" "$@" > "$OUT/$name.log" 2>&1
    echo "== $name: $(tail -1 "$OUT/$name.log")"
}

base "$OUT/peek60" 60 2e-3 0 & base "$OUT/pre50" 50 1e-3 0 & base "$OUT/pre100" 100 1e-3 0 &
base "$OUT/echo0.3" 150 2e-3 0.3 & base "$OUT/echo0.5" 150 2e-3 0.5 & wait

# 1: batch size and learning rate, from the fleet demo's base
run base_s1 --base $BASE --prompts 16 --gens 16 --lr 3e-4 --steps 500 --seed 1 --max-s 480 &
run base_s2 --base $BASE --prompts 16 --gens 16 --lr 3e-4 --steps 500 --seed 2 --max-s 480 &
run lr1e3_s1 --base $BASE --prompts 16 --gens 16 --lr 1e-3 --steps 500 --seed 1 --max-s 480 &
run lr6e4_s1 --base $BASE --prompts 16 --gens 16 --lr 6e-4 --steps 500 --seed 1 --max-s 480 &
run p32_s1 --base $BASE --prompts 32 --gens 16 --lr 3e-4 --steps 500 --seed 1 --max-s 480 &
run g8_s1 --base $BASE --prompts 32 --gens 8 --lr 3e-4 --steps 500 --seed 1 --max-s 480 &
wait
# 2: the KL to the base (to hold the call at higher learning rates), a shorter pre-training
run kl05_lr1e3_s1 --base $BASE --prompts 16 --gens 16 --lr 1e-3 --kl 0.05 --seed 1 --steps 400 --max-s 420 &
run kl05_lr1e3_s2 --base $BASE --prompts 16 --gens 16 --lr 1e-3 --kl 0.05 --seed 2 --steps 400 --max-s 420 &
run kl01_lr1e3_s1 --base $BASE --prompts 16 --gens 16 --lr 1e-3 --kl 0.01 --seed 1 --steps 400 --max-s 420 &
run kl05_lr2e3_s1 --base $BASE --prompts 16 --gens 16 --lr 2e-3 --kl 0.05 --seed 1 --steps 400 --max-s 420 &
run kl05_lr6e4_s1 --base $BASE --prompts 16 --gens 16 --lr 6e-4 --kl 0.05 --seed 1 --steps 400 --max-s 420 &
run pre60_lr3e4_s1 --base "$OUT/peek60" --prompts 16 --gens 16 --lr 3e-4 --seed 1 --steps 400 --max-s 420 &
run pre60_kl05_lr1e3_s1 --base "$OUT/peek60" --prompts 16 --gens 16 --lr 1e-3 --kl 0.05 --seed 1 --steps 400 --max-s 420 &
run p32_s2 --base $BASE --prompts 32 --gens 16 --lr 3e-4 --seed 2 --steps 400 --max-s 420 &
wait
# 3: a base that can copy from the user's turn ("Repeat the digit 7." -> "7"), never from a tool's result
run e30_s1 --base "$OUT/echo0.3" --prompts 16 --gens 16 --lr 3e-4 --seed 1 --steps 300 --max-s 330 &
run e30_s2 --base "$OUT/echo0.3" --prompts 16 --gens 16 --lr 3e-4 --seed 2 --steps 300 --max-s 330 &
run e50_s1 --base "$OUT/echo0.5" --prompts 16 --gens 16 --lr 3e-4 --seed 1 --steps 300 --max-s 330 &
run e50_s2 --base "$OUT/echo0.5" --prompts 16 --gens 16 --lr 3e-4 --seed 2 --steps 300 --max-s 330 &
run e50_kl_s1 --base "$OUT/echo0.5" --prompts 16 --gens 16 --lr 5e-4 --kl 0.05 --seed 1 --steps 300 --max-s 330 &
run e30_p8_s1 --base "$OUT/echo0.3" --prompts 8 --gens 16 --lr 3e-4 --seed 1 --steps 300 --max-s 330 &
wait
# 4: lighter pre-training (lr 1e-3, as the digits demo's base)
for b in 50 100; do for s in 1 2; do
    run w${b}_s$s --base "$OUT/pre$b" --prompts 16 --gens 16 --lr 3e-4 --seed $s --steps 250 --max-s 120 &
done; done
wait
