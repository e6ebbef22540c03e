#!/usr/bin/env bash
# A dataset run on one GPU: a transformers-written checkpoint of the Qwen2.5-1.5B shape (random
# weights, written by save_pretrained in shards with an index) and its own BPE tokenizer,
# a dataset task (tests/testdata arithmetic word problems, chat template on), 10 GRPO steps on
# device=cuda, no model group named: every step must be exactly zero and val/accuracy logged.
# The reward is tests/helpers/user_rewards.py's ShapedMathTask (a user task class): 1.0 for the right
# answer, else a share of ids in a residue class, so a random-weight model's rewards differ
# inside a group and every step really changes the weights the next rollout uses.
#   bash scripts/gpu_dataset.sh                # logs and the run directory under $OUT
# Offline. Wheels it needs beyond torch and transformers (>= 5): hydra-core, omegaconf,
# submitit, hydra-submitit-launcher, safetensors, tqdm, tokenizers, datasets (with pyarrow,
# pandas, dill, multiprocess, xxhash, fsspec, huggingface-hub), math-verify (with
# latex2sympy2_extended, sympy). wandb is not imported (tracking.wandb.mode=disabled).
# The CPU equivalent (tests/data/test_dataset_task.py::test_the_gpu_script_on_the_cpu):
#   SHAPE=tiny DEVICE=cpu STEPS=2 OUT=/tmp/x bash scripts/gpu_dataset.sh
# EXTRA="key=value ..." appends overrides to the run; SHARD sets the shard size (default 1GB).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
SHAPE=${SHAPE:-qwen2_5_1_5b}
DEVICE=${DEVICE:-cuda}
STEPS=${STEPS:-10}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:$PWD/tests/helpers${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
log() { echo "=== $(date +%T) $*" | tee -a "$OUT/gpu_dataset_run.log"; }

python3 -c "import torch, transformers, tokenizers, datasets, math_verify, hydra; \
print('torch', torch.__version__, 'transformers', transformers.__version__, \
'cuda', torch.cuda.is_available())" 2>&1 | tee -a "$OUT/gpu_dataset_run.log"

CKPT=$OUT/ckpt_$SHAPE
log "checkpoint $CKPT ($SHAPE, qwen2)"
python3 scripts/make_hf_checkpoint.py "$CKPT" --shape "$SHAPE" --family qwen2 --device "$DEVICE" \
  --corpus tests/testdata/arith_train.jsonl --tokenizer-vocab 512 --max-shard-size "${SHARD:-1GB}" \
  2>&1 | tail -2 | tee -a "$OUT/gpu_dataset_run.log"
ls -la "$CKPT" | tee -a "$OUT/gpu_dataset_run.log"

RUN=$OUT/run_$SHAPE
rm -rf "$RUN"
log "python -m zkl model.checkpoint=$CKPT task=dataset ($STEPS steps, device=$DEVICE)"
timeout 900 python3 -m zkl model.checkpoint="$CKPT" task=dataset \
  task.path=tests/testdata/arith_train.jsonl task.val_path=tests/testdata/arith_val.jsonl \
  task.prompt_key=question task.chat_template=true task._target_=user_rewards:ShapedMathTask \
  rl.steps="$STEPS" rl.val_every=5 rl.lr=1e-4 sampling.max_new_tokens=16 scheduler.max_batch_size=64 checkpoint.save=false \
  device="$DEVICE" tracking.wandb.mode=disabled tracking.progress=false \
  hydra.run.dir="$RUN" ${EXTRA:-} 2>&1 | tee -a "$OUT/gpu_dataset_run.log"

log "check: every step exactly zero, val/accuracy logged"
python3 - "$RUN" "$STEPS" <<'PY' 2>&1 | tee -a "$OUT/gpu_dataset_run.log"
import json, sys
run, steps = sys.argv[1], int(sys.argv[2])
rows = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
config = open(f"{run}/config.yaml").read()
for r in rows:
    print({k: r[k] for k in ("step", "train/gen_kl_error", "train/max_abs_logprob_diff",
                             "reward/mean", "val/accuracy", "val/reward") if k in r})
zero = all(r["train/max_abs_logprob_diff"] == 0.0 and r["train/gen_kl_error"] == 0.0 for r in rows)
val = [r["val/accuracy"] for r in rows if "val/accuracy" in r]
changed = all(r["weights/changed_tensors"] > 0 for r in rows)
ok = len(rows) == steps and zero and changed and len(val) >= 2 and "family: qwen2" in config
print(f"steps={len(rows)} exactly_zero={zero} every_update_changed_weights={changed} "
      f"val_rows={len(val)} -> {'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
