#!/usr/bin/env bash
# The CUDA acceptance runs (issue: zkl on CUDA), in stages, each logging under $OUT (or ./gpu_out).
#   bash scripts/gpu_acceptance.sh STAGE
# smoke:  GPU tests, tiny cert beds, a 3-step qwen2_5_1_5b run (timings and peak memory)
# beds:   step-0 + 10-step cert beds of every model, bf16 and mxfp8, both kv modes; default mode
# final:  on the final code: GPU tests, the remaining big-bed runs, the hybrid rows (issue 13)
# remaining: what the 2026-12-03 runs left (GPU tests, Nemotron 10 steps, the hybrid bench,
#         megatron MoE dedicated, default mode on the 1.5B's other beds)
# extra:  dedicated on one GPU (1.5B), ablation on the 1.5B shape, CPU vs CUDA comparison
# two:    on nvidia-h200-x2, the generator on the second GPU (layout.backend=nccl): the
#         multi-GPU tests, 10-step 1.5B beds, default mode, refit GB/s against the NCCL peak
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
Q="tracking.wandb.mode=disabled tracking.progress=false"
BIG="checkpoint.save=false device=cuda task.name=residue engine.max_batch_size=64 sampling.max_new_tokens=16 rl.lr=1e-4"
M15="model=qwen2_5_1_5b"
M30="model=qwen3_30b_a3b model.num_hidden_layers=4"
log() { echo "=== $(date +%T) $*"; }
zkl() { local dir=$1; shift; log "zkl $*"; timeout 600 python3 -m zkl $Q "$@" hydra.run.dir="$dir"; }
cert() { local dir=$1; shift; log "cert $*"; timeout 600 python3 -m zkl.cert $Q "$@" hydra.run.dir="$dir"; }

case "${1:-smoke}" in
smoke)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  log pytest; timeout 420 python3 -m pytest -m gpu -q -rfE tests 2>&1 | tail -40
  cert /tmp/c_tiny device=cuda
  zkl /tmp/r15 $BIG $M15 rl.steps=3
  python3 -c "import json;[print({k:v for k,v in json.loads(l).items() if not k.startswith('loss/')}) for l in open('/tmp/r15/metrics.jsonl')]"
  ;;
beds)
  timeout 90 python3 -m pytest -m gpu -q -rfE tests/test_gpu.py -k dedicated 2>&1 | tail -5
  cert /tmp/c_tiny10 device=cuda cert.steps=10
  cert /tmp/c15 $BIG $M15 "cert.models=[qwen2_5_1_5b]"
  cert /tmp/c15_10 $BIG $M15 "cert.models=[qwen2_5_1_5b]" cert.steps=10
  cert /tmp/c30 $BIG $M30 "cert.models=[qwen3_30b_a3b]"
  cert /tmp/c30_10 $BIG $M30 "cert.models=[qwen3_30b_a3b]" cert.steps=10
  ;;
parallel)  # three streams side by side on one H200: tiny, 1.5B, 30B-A3B cut to 4 layers
  B15="$BIG rl.prompts_per_step=4 $M15 cert.models=[qwen2_5_1_5b]"
  B30="$BIG rl.prompts_per_step=4 $M30 cert.models=[qwen3_30b_a3b]"
  ( cert /tmp/a1 device=cuda cert.steps=10; cert /tmp/a2 device=cuda zero_train_gen_mismatch=false
    log compare; python3 scripts/compare_devices.py --out /tmp/compare_devices.json ) > "$OUT/A.log" 2>&1 &
  ( cert /tmp/b1 $B15; cert /tmp/b2 $B15 cert.steps=10; cert /tmp/b3 $B15 "cert.layouts=[dedicated]" cert.steps=10
    cert /tmp/b4 $B15 zero_train_gen_mismatch=false
    cert /tmp/b5 $B15 "cert.precisions=[bf16]" "cert.kv=[recompute]" cert.ablate=true ) > "$OUT/B.log" 2>&1 &
  ( cert /tmp/c1 $B30; cert /tmp/c2 $B30 cert.steps=10; cert /tmp/c3 $B30 zero_train_gen_mismatch=false ) > "$OUT/C.log" 2>&1 &
  for _ in $(seq "${BUDGET_S:-530}"); do [ -z "$(jobs -rp)" ] && break; sleep 1; done
  pkill -f zkl.cert; pkill -f compare_devices; sleep 3
  python3 - "$OUT/cert_all.jsonl" <<'PY'
import glob, json, sys
with open(sys.argv[1], "w") as out:
    for path in sorted(glob.glob("/tmp/*/cert.jsonl")):
        for line in open(path):
            out.write(json.dumps({"run": path.split("/")[2], **json.loads(line)}) + "\n")
PY
  cp /tmp/compare_devices.json "$OUT/" 2>/dev/null; nvidia-smi --query-gpu=memory.used --format=csv
  ;;
finish)  # what `parallel` had no time for: the 1.5B ablation, default mode on the big beds
  B15="$BIG rl.prompts_per_step=4 $M15 cert.models=[qwen2_5_1_5b] cert.precisions=[bf16] cert.kv=[recompute]"
  B30="$BIG rl.prompts_per_step=4 $M30 cert.models=[qwen3_30b_a3b] cert.precisions=[bf16] cert.kv=[recompute]"
  ( cert /tmp/e1 $B15 cert.ablate=true ) > "$OUT/E.log" 2>&1 &
  ( cert /tmp/f1 $B15 zero_train_gen_mismatch=false; cert /tmp/f2 $B30 zero_train_gen_mismatch=false
    cert /tmp/f3 $BIG rl.prompts_per_step=4 $M30 cert.models=[qwen3_30b_a3b] cert.precisions=[mxfp8] cert.kv=[persist] cert.steps=10
  ) > "$OUT/F.log" 2>&1 &
  for _ in $(seq "${BUDGET_S:-170}"); do [ -z "$(jobs -rp)" ] && break; sleep 1; done
  pkill -f zkl.cert; sleep 2
  ;;
final)  # on the final code: GPU tests (graphs on too), the remaining big beds, the hybrid rows
  # (issue 13), 1.5B beds with graphs on (issue 11) and the megatron engine (issue 12), as five
  # processes side by side; the logs and every cert.jsonl go into "$OUT/final.tgz".
  B15="$BIG rl.prompts_per_step=4 $M15 cert.models=[qwen2_5_1_5b]"
  B30="$BIG rl.prompts_per_step=4 $M30 cert.models=[qwen3_30b_a3b]"
  NH="model=nemotron3_nano_30b_a3b model.num_hidden_layers=3 model.hybrid_override_pattern=M*E"
  BNH="$BIG rl.prompts_per_step=4 $NH cert.models=[nemotron3_nano_30b_a3b]"
  ALL="cert.precisions=[bf16,mxfp8] cert.kv=[recompute,persist]"
  TH="device=cuda model=tiny_hybrid cert.models=[tiny_hybrid]"
  W=/tmp/final; mkdir -p $W
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  ( log pytest; timeout 330 python3 -m pytest -m gpu -q -rfE tests --ignore=tests/test_megatron_gpu.py 2>&1 | tail -40
    [ -n "${G1_KV:-}" ] && cert /tmp/g1 $B15 cert.precisions=[bf16] cert.kv=[$G1_KV] cert.steps=10 engine.cuda_graphs=on
  ) > $W/A.log 2>&1 &
  ( cert /tmp/h1 $TH $ALL; cert /tmp/h2 $TH $ALL cert.steps=10
    cert /tmp/h3 $TH zero_train_gen_mismatch=false; cert /tmp/h4 $TH cert.ablate=true
    log bench; timeout 120 python3 -m zkl.bench $Q device=cuda model=tiny_hybrid hydra.run.dir=/tmp/hb
  ) > $W/H.log 2>&1 &
  ( cert /tmp/n1 $BNH $ALL; cert /tmp/n2 $BNH cert.precisions=[bf16] cert.kv=[recompute,persist] cert.steps=10
  ) > $W/N.log 2>&1 &
  # one big bed at a time here, so the five streams fit the GPU's memory together
  ( cert /tmp/d1 $B15 cert.layouts=[dedicated] cert.precisions=[mxfp8] cert.kv=[persist] cert.steps=10
    cert /tmp/c1 $B30 cert.precisions=[mxfp8] cert.kv=[persist] cert.steps=10
    cert /tmp/b1 $B15 cert.precisions=[bf16] cert.kv=[recompute] cert.ablate=true
    [ -n "${DEFAULT_BEDS:-}" ] && cert /tmp/d2 $B15 $ALL zero_train_gen_mismatch=false
  ) > $W/B.log 2>&1 &
  ( OUT=$W/megatron bash scripts/gpu_megatron.sh ) > $W/M.log 2>&1 &
  for _ in $(seq "${BUDGET_S:-520}"); do [ -z "$(jobs -rp)" ] && break; sleep 1; done
  pkill -f zkl.cert; pkill -f zkl.bench; pkill -f pytest; pkill -f gpu_megatron; sleep 3
  for d in /tmp/*/; do [ -f "$d/cert.jsonl" ] && cp "$d/cert.jsonl" "$W/$(basename "$d").cert.jsonl"; done
  cp /tmp/hb/*.json "$W/" 2>/dev/null
  nvidia-smi --query-gpu=memory.used --format=csv > $W/nvidia_smi.txt
  tar czf "$OUT/final.tgz" -C $W .
  grep -h "zkl.cert \[\|passed\|failed\|error" $W/*.log | grep -v '\.\.\.$' | cut -c1-230
  cat $W/megatron/summary.txt 2>/dev/null
  ;;
remaining)  # what 2026-12-03 left for issues 11-13, about 6 minutes; then scripts/gpu_speed.sh
  NH="model=nemotron3_nano_30b_a3b model.num_hidden_layers=3 model.hybrid_override_pattern=M*E"
  BNH="$BIG rl.prompts_per_step=4 $NH cert.models=[nemotron3_nano_30b_a3b]"
  B15="$BIG rl.prompts_per_step=4 $M15 cert.models=[qwen2_5_1_5b]"
  MEG="engine=megatron_local device=cuda cert.models=[tiny_moe] cert.layouts=[dedicated]"
  W=/tmp/remaining; mkdir -p $W
  ( log pytest; timeout 330 python3 -m pytest -m gpu -q -rfE tests 2>&1 | tail -40 ) > $W/A.log 2>&1 &
  ( cert /tmp/n2 $BNH cert.precisions=[bf16] cert.kv=[recompute,persist] cert.steps=10
  ) > $W/N.log 2>&1 &
  ( cert /tmp/n3 $BNH cert.precisions=[mxfp8] cert.kv=[recompute,persist] cert.steps=10
  ) > $W/N3.log 2>&1 &
  ( log bench; timeout 150 python3 -m zkl.bench $Q device=cuda model=tiny_hybrid hydra.run.dir=/tmp/hb
    cert /tmp/m1 $MEG cert.steps=10
    cert /tmp/d2 $B15 cert.precisions=[bf16,mxfp8] cert.kv=[recompute,persist] zero_train_gen_mismatch=false
  ) > $W/H.log 2>&1 &
  for _ in $(seq "${BUDGET_S:-400}"); do [ -z "$(jobs -rp)" ] && break; sleep 1; done
  pkill -f zkl.cert; pkill -f zkl.bench; pkill -f pytest; sleep 3
  for d in /tmp/*/; do [ -f "$d/cert.jsonl" ] && cp "$d/cert.jsonl" "$W/$(basename "$d").cert.jsonl"; done
  cp /tmp/hb/bench.json "$W/hybrid_bench.json" 2>/dev/null
  tar czf "$OUT/remaining.tgz" -C $W .
  grep -h "zkl.cert \[\|passed\|failed\|error\|ratio" $W/*.log | grep -v '\.\.\.$' | cut -c1-230
  ;;
extra)
  cert /tmp/d_tiny device=cuda zero_train_gen_mismatch=false
  cert /tmp/d15 $BIG $M15 "cert.models=[qwen2_5_1_5b]" zero_train_gen_mismatch=false
  cert /tmp/d30 $BIG $M30 "cert.models=[qwen3_30b_a3b]" zero_train_gen_mismatch=false
  cert /tmp/ded15 $BIG $M15 "cert.models=[qwen2_5_1_5b]" "cert.layouts=[dedicated]"
  cert /tmp/ded15_10 $BIG $M15 "cert.models=[qwen2_5_1_5b]" "cert.layouts=[dedicated]" cert.steps=10
  cert /tmp/ab15 $BIG $M15 "cert.models=[qwen2_5_1_5b]" "cert.precisions=[bf16]" "cert.kv=[recompute]" cert.ablate=true
  cert /tmp/ab15_2 $BIG $M15 "cert.models=[qwen2_5_1_5b]" "cert.precisions=[mxfp8]" "cert.kv=[persist]" cert.ablate=true cert.steps=2
  log compare; timeout 120 python3 scripts/compare_devices.py --out "$OUT/compare_devices.json"
  ;;
two)
  nvidia-smi -L
  log pytest; timeout 240 python3 -m pytest -m gpu -q -rfE tests/test_multi_gpu.py 2>&1 | tail -20
  N="+layout=dedicated layout.backend=nccl device=cuda:0 $M15 cert.models=[qwen2_5_1_5b]"
  cert /tmp/n15 $BIG $N cert.precisions=[bf16,mxfp8] cert.kv=[recompute,persist] cert.steps=10
  cert /tmp/n15d $BIG $N cert.steps=2 zero_train_gen_mismatch=false
  log bench; timeout 300 python3 -m zkl.bench $Q $BIG $N hydra.run.dir=/tmp/nb
  cp /tmp/n15/cert.jsonl "$OUT/n15.jsonl"; cp /tmp/n15d/cert.jsonl "$OUT/n15d.jsonl"
  cp /tmp/nb/bench.json "$OUT/bench_nccl.json"
  ;;
esac
