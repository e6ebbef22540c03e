#!/usr/bin/env bash
# Megatron engine acceptance on one GPU (docs/megatron.md), one call of about 8 minutes.
# Prepared before: megatron-core 0.19.2 + hydra wheels on PYTHONPATH (Transformer Engine too
# for ENGINE=transformer_engine | inference_optimized: scripts/stage_te.sh).
#   OUT=/some/dir [ENGINE=megatron_local] bash scripts/gpu_megatron.sh
# inference_optimized is a dedicated generator's engine: its beds take +layout=dedicated.
# Every command is bounded by `timeout`; its log is "$OUT/<name>.log" and its exit code a
# line of "$OUT/summary.txt".
set -u
OUT=${OUT:-gpu_megatron_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
Q="tracking.wandb.mode=disabled tracking.progress=false"
ENGINE=${ENGINE:-megatron_local}
M="engine=$ENGINE device=cuda"
[ "$ENGINE" = inference_optimized ] && M="$M +layout=dedicated"
BEDS="cert.models=[tiny_dense,tiny_moe]"

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "=== $(date +%T) $name: $*" >> "$OUT/summary.txt"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "rc=$? $name" >> "$OUT/summary.txt"
}

step env 30 python3 -c "import sys, torch, megatron.core as m; print(sys.version, torch.__version__, m.__version__, torch.cuda.get_device_name())"
[ "$ENGINE" = megatron_local ] || step te 15 python3 -c "import torch, transformer_engine as te, transformer_engine.pytorch; print('transformer_engine', te.__version__)"
# the must-shows first (a shared, time-boxed call may cut the tail): zero and default mode at
# step 0, 10 GRPO steps colocated, the peer check, dedicated on one GPU (CUDA IPC)
step cert_zero_step0 45 python3 -m zkl.cert $Q $M $BEDS hydra.run.dir="$OUT/cert_zero_step0"
step cert_default_step0 45 python3 -m zkl.cert $Q $M $BEDS zero_train_gen_mismatch=false hydra.run.dir="$OUT/cert_default_step0"
step cert_zero_10 60 python3 -m zkl.cert $Q $M $BEDS cert.steps=10 hydra.run.dir="$OUT/cert_zero_10"
step peer 45 python3 scripts/megatron_peer.py "$ENGINE"
[ "$ENGINE" = inference_optimized ] || step cert_dedicated_10 150 python3 -m zkl.cert $Q $M $BEDS "cert.layouts=[dedicated]" cert.steps=10 hydra.run.dir="$OUT/cert_dedicated_10"
step pytest 90 python3 -m pytest -m gpu -q -rfE tests/megatron/test_megatron.py tests/megatron/test_megatron_gpu.py
# the experiment entry point: default vs zero mode, MoE, 3 steps (metrics.jsonl per run)
step zkl_moe_default 30 python3 -m zkl $Q $M model=tiny_moe rl.steps=3 zero_train_gen_mismatch=false hydra.run.dir="$OUT/zkl_moe_default"
step zkl_moe_zero 30 python3 -m zkl $Q $M model=tiny_moe rl.steps=3 hydra.run.dir="$OUT/zkl_moe_zero"
cat "$OUT/summary.txt"
