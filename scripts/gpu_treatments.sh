#!/usr/bin/env bash
# The mismatch treatments at real widths on one GPU, one call: the dense 1.5B in bf16 zero
# mode, bf16 default and fp16 default; the Qwen3-30B-A3B cut (2 layers: what fits an 80 GB
# GPU with AdamW) in default mode with its routes recorded, with routing replay, and with
# token_tis beside the recorded routes. STEPS GRPO steps an arm (64 rollouts of at most
# NEW tokens, graphs on), then a table of each arm's mean gen_kl_error, largest logprob
# difference, route mismatch and step time (treatments.txt).
#   OUT=/some/dir bash scripts/gpu_treatments.sh   (STEPS, NEW, RUN_S; ARMS names a subset)
set -uo pipefail
OUT=${OUT:-gpu_out}
STEPS=${STEPS:-20}
NEW=${NEW:-128}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
Q="tracking.wandb.mode=disabled tracking.progress=false checkpoint.save=false"
COMMON="device=cuda task.name=residue scheduler.max_batch_size=64 scheduler.cuda_graphs=on rl.lr=1e-4
  rl.num_minibatches=4 rl.score_micro_batch=16 sampling.max_new_tokens=$NEW rl.steps=$STEPS"
DENSE="model=qwen2_5_1_5b"
MOE="model=qwen3_30b_a3b model.num_hidden_layers=2 zero_train_gen_mismatch=false"
bash scripts/gpu_env.sh "$OUT"
while read -r name overrides; do
  [[ -n "${ARMS:-}" && " $ARMS " != *" $name "* ]] && continue
  timeout "${RUN_S:-90}" python3 -m zkl $Q $COMMON $overrides hydra.run.dir="$OUT/$name" \
    > "$OUT/$name.log" 2>&1
  echo "$name rc=$?" >> "$OUT/$name.log"
done <<RUNS
bf16_zero $DENSE
bf16_default $DENSE zero_train_gen_mismatch=false
fp16_default $DENSE +precision=fp16 zero_train_gen_mismatch=false
moe_default $MOE rl.record_routes=true
moe_default_replay $MOE rl.routing_replay=true
moe_default_token_tis $MOE rl.record_routes=true rl.correction.mode=token_tis
RUNS
python3 - "$OUT" > "$OUT/treatments.txt" 2>&1 <<'PY'
import json, statistics, sys
from pathlib import Path
print("| arm | steps | gen_kl_error mean | steps exactly 0 | max abs logprob diff | routes differing (tokens) | step s (median) |")
print("|---|---|---|---|---|---|---|")
for metrics in sorted(Path(sys.argv[1]).glob("*/metrics.jsonl")):
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    if not rows:
        continue
    kl = [r["train/gen_kl_error"] for r in rows]
    routes = [r["routing/token_mismatch_frac"] for r in rows if "routing/token_mismatch_frac" in r]
    step = [sum(v for k, v in r.items() if k.startswith("timing/")) for r in rows]
    print(f"| {metrics.parent.name} | {len(rows)} | {statistics.mean(kl):.3g} | "
          f"{sum(k == 0.0 for k in kl)} | {max(r['train/max_abs_logprob_diff'] for r in rows):.3g} | "
          f"{f'{100 * statistics.mean(routes):.2f}%' if routes else ''} | {statistics.median(step):.2f} |")
PY
