#!/bin/bash
# Issue 21: which recipe leaves chance level soonest, and most reliably across seeds, on the skill demo's task
# (`digits_max`, largest digit 2-9) from the fleet's own base model? benchmarks/skill_sketch.py (the fleet's loss
# with one update per step, the strict digit + end-of-turn answer, a k3 KL to the base) on one GPU, 8 seeds per
# recipe side by side. Results: benchmarks/results/skill_recipe_sweep.json (docs/performance.md, "A recipe sweep
# of the skill demo on a GPU").
#
# Needs torch and transformers and the base in .cache/models (`python benchmarks/skill_demo.py pretrain`):
#   OUT=/tmp/skill_sweep bash benchmarks/skill_recipe_sweep.sh              # recipes (sync-like)
#   OUT=/tmp/skill_variants SET=variants bash benchmarks/skill_recipe_sweep.sh  # IS corrections (async-like)
#   OUT=/tmp/skill_isolate SET=isolate SEEDS="$(seq -s' ' 1 16)" bash benchmarks/skill_recipe_sweep.sh
# (results/skill_recipe_sweep.json, skill_variant_sweep.json)
set -u
OUT=${OUT:-/tmp/skill_sweep}
mkdir -p "$OUT"
BASE=.cache/models/tiny-qwen2-digits_max-format
SEEDS=${SEEDS:-1 2 3 4 5 6 7 8}
STEPS=${STEPS:-300}

declare -A RECIPES
if [[ ${SET:-recipes} == recipes ]]; then  # sync-like: one update per step on fresh samples
    RECIPES=(
        [lr3e-4_p16g16_kl05]="--lr 3e-4 --prompts 16 --gens 16 --kl 0.05"  # the fleet demo's recipe
        [lr3e-4_p32g8_kl05]="--lr 3e-4 --prompts 32 --gens 8 --kl 0.05"
        [lr5e-4_p16g16_kl05]="--lr 5e-4 --prompts 16 --gens 16 --kl 0.05"
        [lr1e-3_p16g16_kl05]="--lr 1e-3 --prompts 16 --gens 16 --kl 0.05"
        [lr1e-3_p16g16_kl05_warm20]="--lr 1e-3 --prompts 16 --gens 16 --kl 0.05 --warmup 20"
        [lr3e-4_p16g16_kl01]="--lr 3e-4 --prompts 16 --gens 16 --kl 0.01"
        [lr3e-4_p16g16_kl05_b99]="--lr 3e-4 --prompts 16 --gens 16 --kl 0.05 --beta2 0.99"
        [lr3e-4_p16g16_kl05_stale]="--lr 3e-4 --prompts 16 --gens 16 --kl 0.05 --stale"  # async, age 1, tis [0, 2]
    )
elif [[ $SET == variants ]]; then  # SET=variants: async (samples one update behind), the IS corrections with and without the KL
    R="--lr 3e-4 --prompts 16 --gens 16 --stale"
    RECIPES=(
        [stale_tis_kl05]="$R --kl 0.05 --correction tis --is-min 0 --is-max 2"  # the fleet demo's defaults
        [stale_icepop_kl05]="$R --kl 0.05 --correction icepop --is-min 0.5 --is-max 2"
        [stale_seqmask_kl05]="$R --kl 0.05 --correction seq-mask-tis --is-min 0.5 --is-max 2"
        [stale_none_kl05]="$R --kl 0.05 --correction none"
        [stale_tis_kl0]="$R --correction tis --is-min 0 --is-max 2"
        [stale_icepop_kl0]="$R --correction icepop --is-min 0.5 --is-max 2"
        [stale_seqmask_kl0]="$R --correction seq-mask-tis --is-min 0.5 --is-max 2"
        [stale_none_kl0]="$R --correction none"
    )
elif [[ $SET == kl ]]; then  # SET=kl: the KL's strength, sync-like and async-like
    R="--lr 3e-4 --prompts 16 --gens 16"
    RECIPES=(
        [kl05]="$R --kl 0.05" [kl10]="$R --kl 0.1" [kl20]="$R --kl 0.2"
        [stale_kl05]="$R --kl 0.05 --stale" [stale_kl10]="$R --kl 0.1 --stale" [stale_kl20]="$R --kl 0.2 --stale"
    )
elif [[ $SET == isolate ]]; then  # SET=isolate: the fleet's async differences from the sketch, one at a time
    R="--lr 3e-4 --prompts 16 --gens 16 --kl 0.05 --correction tis --is-min 0 --is-max 2"
    RECIPES=(
        [stale]="$R --stale" [stale_wd01]="$R --stale --weight-decay 0.01"
        [stale_mix50]="$R --stale --age-mix 0.5" [stale_wd01_mix50]="$R --stale --weight-decay 0.01 --age-mix 0.5"
        [sync_wd01]="$R --weight-decay 0.01"
    )
elif [[ $SET == step ]]; then  # SET=step: what bounds one update's move (async-like): Adam's eps and beta2, the lr
    R="--lr 3e-4 --prompts 16 --gens 16 --kl 0.05 --correction tis --is-min 0 --is-max 2 --stale"
    RECIPES=(
        [stale_eps1e-6]="$R --eps 1e-6" [stale_eps1e-5]="$R --eps 1e-5" [stale_eps1e-4]="$R --eps 1e-4"
        [stale_b2_099]="$R --beta2 0.99" [stale_lr2e-4]="$R --lr 2e-4"
    )
elif [[ $SET == eps ]]; then  # SET=eps: Adam's eps, the one that did best in SET=step, on more seeds and sync too
    R="--lr 3e-4 --prompts 16 --gens 16 --kl 0.05 --correction tis --is-min 0 --is-max 2"
    RECIPES=(
        [stale]="$R --stale" [stale_eps1e-5]="$R --stale --eps 1e-5" [stale_eps1e-4]="$R --stale --eps 1e-4"
        [sync_eps1e-4]="$R --eps 1e-4"
    )
fi
run() {  # run NAME SEED: one sketch, its JSON line in $OUT/NAME_sSEED.json
    python3 benchmarks/skill_sketch.py max --base $BASE --answer two-strict --steps "$STEPS" --seed "$2" \
        ${RECIPES[$1]} > "$OUT/$1_s$2.json" 2> "$OUT/$1_s$2.log"
}
for name in "${!RECIPES[@]}"; do
    for s in $SEEDS; do
        while (( $(jobs -rp | wc -l) >= ${PAR:-32} )); do wait -n; done
        run "$name" "$s" &
    done
done
wait
python3 - "$OUT" <<'PY'
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
rows: dict[str, list] = {}
for f in sorted(out.glob("*_s*.json")):
    try:
        r = json.loads(f.read_text())
    except json.JSONDecodeError:
        print(f"{f.name}: no result ({f.with_suffix('.log').read_text()[-300:]!r})")
        continue
    rows.setdefault(f.stem.rsplit("_s", 1)[0], []).append(r)
summary = {}
for name, rs in sorted(rows.items()):
    reach = [r["reach_0.8"] for r in sorted(rs, key=lambda r: r["seed"])]
    hit = [x for x in reach if x is not None]
    summary[name] = {"seeds": [r["seed"] for r in sorted(rs, key=lambda r: r["seed"])], "reach_0.8": reach,
                     "median_of_reached": statistics.median(hit) if hit else None, "reached": f"{len(hit)}/{len(reach)}",
                     "collapsed": [r["collapsed"] for r in rs if r["collapsed"]],
                     "final_acc": [r["history"][-1][1] if r["history"] else None for r in sorted(rs, key=lambda r: r["seed"])]}
    print(f"{name:32s} collapsed {len(summary[name]['collapsed'])}  reached {summary[name]['reached']}  median {summary[name]['median_of_reached']}  {reach}")
(out / "summary.json").write_text(json.dumps({"summary": summary, "runs": rows}))
PY
