#!/usr/bin/env bash
# Certify zkl on CUDA (python -m zkl.cert), in stages, each logging under $OUT (or ./gpu_out).
#   bash scripts/gpu_cert.sh STAGE
# smoke:     GPU tests, tiny cert beds, a 3-step qwen2_5_1_5b run (timings and peak memory)
# beds:      step-0 + 10-step cert beds of the tiny models, the 1.5B and the 30B-A3B cut,
#            bf16 and mxfp8, both kv modes
# default:   the same beds in default mode (every fix off: the contrast, never zero)
# dedicated: the 1.5B with its generator in a process of its own on the same GPU (CUDA IPC)
# ablate:    each fix off in turn on the 1.5B shape (what each fix contributes)
# hybrid:    the Nemotron cut (one layer of each kind) and tiny_hybrid, every precision and kv
#            mode, step-0 and 10 steps, and tiny_hybrid's bench
# compare:   the tiny CPU default and the same run on CUDA side by side
# nccl:      on nvidia-h200-x2, the generator on the second GPU (layout.transport=nccl): the
#            multi-GPU tests, 10-step 1.5B beds, default mode, refit GB/s against the NCCL peak
# Each stage fits one device call (10 minutes); the megatron engine has scripts/gpu_megatron.sh.
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
Q="tracking.wandb.mode=disabled tracking.progress=false"
BIG="checkpoint.save=false device=cuda task.name=residue scheduler.max_batch_size=64 sampling.max_new_tokens=16 rl.lr=1e-4"
M15="model=qwen2_5_1_5b"
M30="model=qwen3_30b_a3b model.num_hidden_layers=4"
NH="model=nemotron3_nano_30b_a3b model.num_hidden_layers=3 model.hybrid_override_pattern=M*E"
ALL="cert.precisions=[bf16,mxfp8] cert.kv=[recompute,persist]"
log() { echo "=== $(date +%T) $*"; }
zkl() { local dir=$1; shift; log "zkl $*"; timeout 600 python3 -m zkl $Q "$@" hydra.run.dir="$dir"; }
cert() {
  local dir=$1; shift; log "cert $*"
  timeout 600 python3 -m zkl.cert $Q "$@" hydra.run.dir="$dir"
  cp "$dir/cert.jsonl" "$OUT/$(basename "$dir").cert.jsonl" 2>/dev/null
}
bash scripts/gpu_env.sh "$OUT"

case "${1:-smoke}" in
smoke)
  log pytest; timeout 420 python3 -m pytest -m gpu -q -rfE tests 2>&1 | tail -40
  cert /tmp/c_tiny device=cuda
  zkl /tmp/r15 $BIG $M15 rl.steps=3
  python3 -c "import json;[print({k:v for k,v in json.loads(l).items() if not k.startswith('loss/')}) for l in open('/tmp/r15/metrics.jsonl')]"
  ;;
beds)
  cert /tmp/c_tiny10 device=cuda cert.steps=10
  cert /tmp/c15 $BIG $M15 "cert.models=[qwen2_5_1_5b]"
  cert /tmp/c15_10 $BIG $M15 "cert.models=[qwen2_5_1_5b]" cert.steps=10
  cert /tmp/c30 $BIG $M30 "cert.models=[qwen3_30b_a3b]"
  cert /tmp/c30_10 $BIG $M30 "cert.models=[qwen3_30b_a3b]" cert.steps=10
  ;;
default)
  cert /tmp/d_tiny device=cuda zero_train_gen_mismatch=false
  cert /tmp/d15 $BIG $M15 "cert.models=[qwen2_5_1_5b]" $ALL zero_train_gen_mismatch=false
  cert /tmp/d30 $BIG $M30 "cert.models=[qwen3_30b_a3b]" zero_train_gen_mismatch=false
  ;;
dedicated)
  timeout 90 python3 -m pytest -m gpu -q -rfE tests/ops/test_gpu.py -k dedicated 2>&1 | tail -5
  cert /tmp/ded15 $BIG $M15 "cert.models=[qwen2_5_1_5b]" "cert.layouts=[dedicated]"
  cert /tmp/ded15_10 $BIG $M15 "cert.models=[qwen2_5_1_5b]" "cert.layouts=[dedicated]" cert.steps=10
  ;;
ablate)
  cert /tmp/ab15 $BIG $M15 "cert.models=[qwen2_5_1_5b]" "cert.precisions=[bf16]" "cert.kv=[recompute]" cert.ablate=true
  cert /tmp/ab15_2 $BIG $M15 "cert.models=[qwen2_5_1_5b]" "cert.precisions=[mxfp8]" "cert.kv=[persist]" cert.ablate=true cert.steps=2
  ;;
hybrid)
  BNH="$BIG rl.prompts_per_step=4 $NH cert.models=[nemotron3_nano_30b_a3b]"
  TH="device=cuda model=tiny_hybrid cert.models=[tiny_hybrid]"
  cert /tmp/h1 $TH $ALL; cert /tmp/h2 $TH $ALL cert.steps=10
  cert /tmp/h3 $TH zero_train_gen_mismatch=false; cert /tmp/h4 $TH cert.ablate=true
  cert /tmp/n1 $BNH $ALL; cert /tmp/n2 $BNH $ALL cert.steps=10
  log bench; timeout 150 python3 -m zkl.bench $Q device=cuda model=tiny_hybrid hydra.run.dir=/tmp/hb
  cp /tmp/hb/bench.json "$OUT/hybrid_bench.json" 2>/dev/null
  ;;
compare)
  log compare; timeout 120 python3 scripts/compare_devices.py --out "$OUT/compare_devices.json"
  ;;
nccl)
  nvidia-smi -L
  log pytest; timeout 240 python3 -m pytest -m gpu -q -rfE tests/layouts/test_multi_gpu.py 2>&1 | tail -20
  N="+layout=dedicated layout.transport=nccl device=cuda:0 $M15 cert.models=[qwen2_5_1_5b]"
  cert /tmp/n15 $BIG $N $ALL cert.steps=10
  cert /tmp/n15d $BIG $N cert.steps=2 zero_train_gen_mismatch=false
  log bench; timeout 300 python3 -m zkl.bench $Q $BIG $N hydra.run.dir=/tmp/nb
  cp /tmp/nb/bench.json "$OUT/bench_nccl.json" 2>/dev/null
  ;;
*)
  echo "unknown stage ${1}; one of smoke beds default dedicated ablate hybrid compare nccl" >&2
  exit 2
  ;;
esac
