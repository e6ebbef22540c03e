#!/usr/bin/env bash
# Megatron engine acceptance on one GPU (docs/megatron.md); each stage fits one device call.
# Prepared before: megatron-core 0.19.2 + hydra wheels on PYTHONPATH (Transformer Engine too
# for ENGINE=transformer_engine | inference_optimized: scripts/stage_te.sh).
#   OUT=/some/dir [ENGINE=megatron_local] [STAGES="cert extra"] bash scripts/gpu_megatron.sh
# Stages:
#   cert   zero mode at step 0 and over 10 GRPO steps in both KV modes, colocated and dedicated;
#          default mode at step 0 (non-zero, as it must be)
#   extra  the peer check (megatron vs native vs transformers), the engine's GPU tests, and the
#          experiment entry point on the MoE bed in both modes
#   big    the 1.5B shape and the Qwen3-30B-A3B cut: 10 GRPO steps each, and the peer check
#   bench  zkl.bench on the 1.5B for native and each megatron engine, one call (a bench cut by
#          its bound keeps the rows it measured: batch 64 and the train step come first)
# inference_optimized is a dedicated generator's engine: its beds take +layout=dedicated.
# Every command is bounded by `timeout`; its log is "$OUT/<name>.log" and its exit code a
# line of "$OUT/summary.txt". A stage's bounds, with the two checks before it, add to <= 540 s.
# BOUND_SCALE=N multiplies every bound, for stages run side by side on one GPU.
set -u
OUT=${OUT:-gpu_megatron_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
Q="tracking.wandb.mode=disabled tracking.progress=false"
ENGINE=${ENGINE:-megatron_local}
STAGES=${STAGES:-"cert extra"}
M="engine=$ENGINE device=cuda"
[ "$ENGINE" = inference_optimized ] && M="$M +layout=dedicated"
BEDS="cert.models=[tiny_dense,tiny_moe]"
BOTH_KV="cert.kv=[recompute,persist]"
RL="task.name=residue rl.steps=10 rl.prompts_per_step=4 sampling.max_new_tokens=16 checkpoint.save=false"
CUT="model=qwen3_30b_a3b model.num_hidden_layers=2"

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "=== $(date +%T) $name: $*" >> "$OUT/summary.txt"
  timeout "$((limit * ${BOUND_SCALE:-1}))" "$@" > "$OUT/$name.log" 2>&1
  echo "rc=$? $name" >> "$OUT/summary.txt"
}

step env 30 python3 -c "import sys, torch, megatron.core as m; print(sys.version, torch.__version__, m.__version__, torch.cuda.get_device_name())"
[ "$ENGINE" = megatron_local ] || step te 15 python3 -c "import torch, transformer_engine as te, transformer_engine.pytorch; print('transformer_engine', te.__version__)"
for stage in $STAGES; do
  case $stage in
    cert)
      step cert_zero_step0 75 python3 -m zkl.cert $Q $M $BEDS hydra.run.dir="$OUT/cert_zero_step0"
      step cert_default_step0 75 python3 -m zkl.cert $Q $M $BEDS zero_train_gen_mismatch=false hydra.run.dir="$OUT/cert_default_step0"
      step cert_zero_10 160 python3 -m zkl.cert $Q $M $BEDS $BOTH_KV cert.steps=10 hydra.run.dir="$OUT/cert_zero_10"
      [ "$ENGINE" = inference_optimized ] || step cert_dedicated_10 170 python3 -m zkl.cert $Q $M $BEDS $BOTH_KV "cert.layouts=[dedicated]" cert.steps=10 hydra.run.dir="$OUT/cert_dedicated_10"
      ;;
    extra)
      step peer 75 python3 scripts/megatron_peer.py "$ENGINE"
      step pytest 180 python3 -m pytest -m gpu -q -rfE tests/megatron/test_megatron_gpu.py -k "$ENGINE"
      step zkl_moe_default 60 python3 -m zkl $Q $M model=tiny_moe rl.steps=3 zero_train_gen_mismatch=false hydra.run.dir="$OUT/zkl_moe_default"
      step zkl_moe_zero 60 python3 -m zkl $Q $M model=tiny_moe rl.steps=3 hydra.run.dir="$OUT/zkl_moe_zero"
      ;;
    big)
      step dense_1_5b_10 150 python3 -m zkl $Q $M model=qwen2_5_1_5b $RL hydra.run.dir="$OUT/dense_1_5b_10"
      step moe_cut_10 120 python3 -m zkl $Q $M $CUT $RL hydra.run.dir="$OUT/moe_cut_10"
      step peer_big 180 python3 scripts/megatron_peer.py "$ENGINE" --model "model=qwen2_5_1_5b" --model "$CUT"
      ;;
    bench)
      B="python3 -m zkl.bench $Q device=cuda model=qwen2_5_1_5b task.name=residue"
      step bench_native 120 $B engine=native hydra.run.dir="$OUT/bench_native"
      step bench_megatron_local 120 $B engine=megatron_local hydra.run.dir="$OUT/bench_megatron_local"
      step bench_transformer_engine 120 $B engine=transformer_engine hydra.run.dir="$OUT/bench_transformer_engine"
      step bench_inference_optimized 120 $B engine=inference_optimized +layout=dedicated hydra.run.dir="$OUT/bench_inference_optimized"
      ;;
  esac
done
cat "$OUT/summary.txt"
