#!/usr/bin/env bash
# The mismatch treatments on one GPU, one call: fp16 at the 1.5B shape (zero mode, 10 steps,
# every step exactly 0; default mode in fp16 beside bf16), routing replay on the Qwen3-30B-A3B
# cut (default mode with and without replay, and zero mode with it), then the treatments
# sweep's dense arms at the 1.5B shape, 20 steps an arm, and its report (the MoE arms are
# the replay runs above).
#   OUT=/some/dir bash scripts/gpu_treatments.sh   (RUN_S, SWEEP_S bound the stages)
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
Q="tracking.wandb.mode=disabled tracking.progress=false checkpoint.save=false"
DENSE="device=cuda model=qwen2_5_1_5b task.name=residue engine.max_batch_size=64 rl.lr=1e-4"
MOE="device=cuda model=qwen3_30b_a3b model.num_hidden_layers=4 task.name=residue engine.max_batch_size=64"
bash scripts/gpu_env.sh "$OUT"
while read -r name overrides; do
  timeout "${RUN_S:-200}" python3 -m zkl $Q $overrides rl.steps=10 \
    hydra.run.dir="$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "$name rc=$?" >> "$OUT/$name.log"
done <<RUNS
fp16_zero $DENSE +precision=fp16
fp16_default $DENSE +precision=fp16 zero_train_gen_mismatch=false
bf16_default $DENSE zero_train_gen_mismatch=false
moe_default $MOE zero_train_gen_mismatch=false rl.record_routes=true
moe_default_replay $MOE zero_train_gen_mismatch=false rl.routing_replay=true
moe_zero_replay $MOE rl.routing_replay=true
RUNS
timeout "${SWEEP_S:-600}" python3 -m zkl -m --config-dir sweeps --config-name mismatch_treatments \
  $Q $DENSE rl.steps=20 rl.val_every=5 hydra.sweep.dir="$OUT/treatments" \
  'hydra.sweeper.params.+treatment=zero,default,token_tis,token_mis,seq_tis,seq_mis,geo_mis,icepop,fp16_default,fp16_zero' \
  > "$OUT/treatments.log" 2>&1
echo "sweep rc=$?" >> "$OUT/treatments.log"
python3 -m zkl.report "$OUT/treatments" >> "$OUT/treatments.log" 2>&1
