#!/usr/bin/env bash
# The dense 1.5B's CUDA benchmark on one GPU, in one call of at most ~9 minutes: the GPU tests
# (graphs on), then the CUDA benchmark table (zkl.bench) with a profile of one decode step per
# mode.   OUT=/some/dir bash scripts/gpu_bench.sh
# Everything lands under $OUT: env.txt, pytest_gpu.log, bench.log, bench/bench.json,
# bench/profile_decode_b64_{zero,default}.txt. Each stage is bounded by `timeout`.
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT/bench"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
Q="tracking.wandb.mode=disabled tracking.progress=false"
bash scripts/gpu_env.sh "$OUT"
# per file, so a copy whose total hash differs from the checkout's shows which file differs
find zkl -name '*.py' | LC_ALL=C sort | xargs sha256sum > "$OUT/sources.sha256"

if [ -z "${SKIP_TESTS:-}" ]; then  # SKIP_TESTS=1: the GPU tests ran in an earlier call
  echo "=== $(date +%T) pytest -m gpu" > "$OUT/pytest_gpu.log"
  timeout 200 python3 -m pytest -m gpu -q -rfE tests >> "$OUT/pytest_gpu.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_gpu.log"
fi

echo "=== $(date +%T) zkl.bench" > "$OUT/bench.log"
timeout "${BENCH_S:-330}" python3 -m zkl.bench $Q device=cuda model=qwen2_5_1_5b task.name=residue \
  hydra.run.dir=/tmp/bench >> "$OUT/bench.log" 2>&1
echo "bench rc=$? $(date +%T)" >> "$OUT/bench.log"
cp /tmp/bench/*.json /tmp/bench/*.txt "$OUT/bench/" 2>/dev/null
