#!/usr/bin/env bash
# FSDP2 runs on GPUs (zkl/distributed), in stages, each logging under $OUT (or ./gpu_out).
#   bash scripts/gpu_fsdp.sh one     # nvidia-h200: world size 1 through the FSDP
#                                    # path beside today's single-process path, 1.5B shape,
#                                    # 10 steps each: both exactly zero, step time <= 1.05x
#   bash scripts/gpu_fsdp.sh multi   # nvidia-h200-x2/x4/x8: the multi-GPU tests,       
#                                    # then every world size 2..GPUs through torchrun: 10 steps
#                                    # bf16 and mxfp8, both kv modes, exactly zero; default mode
#                                    # non-zero; step-0 rollouts against world size 1; tokens/s
#                                    # per GPU; on 8 GPUs the full-depth Qwen3-30B-A3B bed
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0); every other variable of the caller is kept.
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false NCCL_NVLS_ENABLE=0
Q="tracking.progress=false checkpoint.save=false"
COMMON="device=cuda model=qwen2_5_1_5b task.name=residue tracking.wandb.mode=disabled"
BIG="$COMMON scheduler.max_batch_size=64 sampling.max_new_tokens=16 rl.lr=1e-4"
log() { echo "=== $(date +%T) $*"; }
zkl() { local dir=$1; shift; log "zkl $*"; timeout 600 python3 -m zkl $Q "$@" hydra.run.dir="$dir"; }
ranks() { local n=$1 dir=$2; shift 2; log "torchrun x$n zkl $*"
  timeout 600 torchrun --standalone --nproc-per-node "$n" -m zkl $Q trainer.world_size="$n" \
    "$@" hydra.run.dir="$dir"; }
summary() {  # dirs...: zero at every step, mean step time (steps 1..), tokens/s per GPU
  python3 - "$@" <<'PY'
import json, sys
for d in sys.argv[1:]:
    try:
        rows = [json.loads(x) for x in open(f"{d}/metrics.jsonl")]
        cfg = open(f"{d}/config.yaml").read()
    except OSError as err:
        print(json.dumps({"run": d, "error": str(err)})); continue
    ws = next((int(x.split(":")[1]) for x in cfg.splitlines() if x.strip().startswith("world_size:")), 1)
    late = rows[1:] or rows
    step_s = [sum(r[k] for k in r if k.startswith("timing/")) for r in late]
    mean = sum(step_s) / len(step_s)
    tokens = sum(r["gen/response_tokens"] for r in late) / len(late)
    print(json.dumps({"run": d, "world_size": ws, "steps": len(rows),
        "zero_every_step": all(r["train/max_abs_logprob_diff"] == 0.0 for r in rows),
        "max_abs_logprob_diff": max(r["train/max_abs_logprob_diff"] for r in rows),
        "changed_tensors_min": min(r["weights/changed_tensors"] for r in rows),
        "step_s": mean, "gen_tokens_per_s_per_gpu": tokens / mean / ws,
        "peak_gpu_mem_gb": max(r.get("perf/peak_gpu_mem_gb", 0) for r in rows),
        "timing_s": {k: round(sum(r[k] for r in late) / len(late), 4)
                     for k in late[0] if k.startswith("timing/")}}))
PY
}

case "${1:-one}" in
one)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  zkl /tmp/fsdp_single $BIG rl.steps=10
  zkl /tmp/fsdp_ws1 $BIG rl.steps=10 trainer.fsdp=true
  summary /tmp/fsdp_single /tmp/fsdp_ws1 | tee "$OUT/one.jsonl"
  python3 - "$OUT/one.jsonl" <<'PY' | tee "$OUT/one_verdict.txt"
import json, sys
single, fsdp = [json.loads(x) for x in open(sys.argv[1])]
ratio = fsdp["step_s"] / single["step_s"]
print(f"fsdp ws1 / single-process step time: {ratio:.3f} (bar 1.05); zero every step: "
      f"single {single['zero_every_step']}, fsdp {fsdp['zero_every_step']}")
PY
  cp /tmp/fsdp_single/metrics.jsonl "$OUT/single_metrics.jsonl"
  cp /tmp/fsdp_ws1/metrics.jsonl "$OUT/fsdp_ws1_metrics.jsonl"
  ;;
multi)
  GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
  nvidia-smi --query-gpu=name,memory.total --format=csv
  log pytest; timeout 600 python3 -m pytest -m gpu -q -rfE tests/distributed/test_fsdp_gpu.py 2>&1 | tail -30
  zkl /tmp/m_ws1 $BIG rl.steps=10 tracking.dump_tokens=all
  dirs=(/tmp/m_ws1)
  for n in 2 4 8; do
    [ "$n" -le "$GPUS" ] || continue
    for p in bf16 mxfp8; do for kv in recompute persist; do
      ranks "$n" "/tmp/m_ws${n}_${p}_${kv}" $BIG +precision=$p kv=$kv rl.steps=10 \
        tracking.dump_tokens=all
      dirs+=("/tmp/m_ws${n}_${p}_${kv}")
    done; done
    ranks "$n" "/tmp/m_ws${n}_default" $BIG rl.steps=3 zero_train_gen_mismatch=false
    dirs+=("/tmp/m_ws${n}_default")
  done
  summary "${dirs[@]}" | tee "$OUT/multi.jsonl"
  python3 - /tmp/m_ws1 /tmp/m_ws*_bf16_recompute <<'PY' | tee "$OUT/step0_rollouts.txt"
import json, sys
def step0(d):
    return [r for r in map(json.loads, open(f"{d}/tokens.jsonl")) if r["step"] == 0]
ref = step0(sys.argv[1])
for d in sys.argv[2:]:
    print(d, "step-0 rollouts bitwise equal to world size 1's:", step0(d) == ref)
PY
  if [ "$GPUS" -ge 8 ]; then  # the full-depth bed (48 layers); docs/distributed.md's plan
    python3 scripts/memory_plan.py model=qwen3_30b_a3b trainer.world_size=8 trainer.offload=true \
      task.name=residue scheduler.max_batch_size=64 | tee "$OUT/plan_30b.txt"
    ranks 8 /tmp/m_30b device=cuda model=qwen3_30b_a3b task.name=residue tracking.wandb.mode=disabled \
      trainer.offload=true scheduler.max_batch_size=64 sampling.max_new_tokens=16 rl.lr=1e-4 rl.steps=6
    summary /tmp/m_30b | tee "$OUT/30b.jsonl"
  elif [ "$GPUS" -ge 4 ]; then  # the deepest cut the estimate says fits on 4
    for layers in 48 32 24 16; do
      if python3 scripts/memory_plan.py model=qwen3_30b_a3b model.num_hidden_layers=$layers \
          trainer.world_size=4 trainer.offload=true task.name=residue scheduler.max_batch_size=64 \
          | tee "$OUT/plan_30b_$layers.txt" | awk '/per GPU/ {exit !($3 < 130)}'; then
        ranks 4 /tmp/m_30b device=cuda model=qwen3_30b_a3b model.num_hidden_layers=$layers \
          task.name=residue tracking.wandb.mode=disabled trainer.offload=true scheduler.max_batch_size=64 \
          sampling.max_new_tokens=16 rl.lr=1e-4 rl.steps=6
        summary /tmp/m_30b | tee "$OUT/30b.jsonl"; break
      fi
    done
  fi
  ;;
*) echo "usage: $0 one|multi" >&2; exit 2 ;;
esac
