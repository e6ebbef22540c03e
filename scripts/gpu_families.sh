#!/usr/bin/env bash
# The Llama, Mistral and gpt-oss families on one GPU: for each real shape cut (Llama and
# Mistral to 4 layers, gpt-oss to 2: what fits an 80 GB GPU with AdamW), 10 GRPO steps in
# zero mode with CUDA graphs on in every layout x KV mode of ARMS (every step must be exactly
# 0; the log's last line says so), then zero vs default generation (bench's short table);
# last, the GPU tests named in TESTS (the families' logits against transformers on the GPU,
# the sink and window kernels).
#   OUT=/some/dir bash scripts/gpu_families.sh
#   FAMILIES="gpt_oss" STAGES="runs" ARMS="colocated:persist dedicated:recompute" to narrow it;
#   RUN_S, BENCH_S, TESTS_S bound each command.
set -uo pipefail
OUT=${OUT:-gpu_out}
FAMILIES=${FAMILIES:-"llama mistral gpt_oss"}
STAGES=${STAGES:-"runs bench tests"}
ARMS=${ARMS:-"colocated:recompute colocated:persist dedicated:recompute dedicated:persist"}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
Q="tracking.wandb.mode=disabled tracking.progress=false checkpoint.save=false"
R="device=cuda task.name=residue scheduler.cuda_graphs=on scheduler.max_batch_size=64 rl.lr=1e-4"
bash scripts/gpu_env.sh "$OUT"
# the model overrides of a family: windows of 32 (Mistral, gpt-oss) shorter than the prompts
cut() {
  case $1 in
    llama) echo "model=llama3_1_8b model.num_hidden_layers=4" ;;
    mistral) echo "model=mistral_7b model.num_hidden_layers=4 model.sliding_window=32" ;;
    gpt_oss) echo "model=gpt_oss_20b model.num_hidden_layers=2 model.sliding_window=32 model.layer_types=[sliding_attention,full_attention]" ;;
  esac
}
for name in $FAMILIES; do
  overrides=$(cut "$name")
  if [[ " $STAGES " == *" runs "* ]]; then
    for arm in $ARMS; do
      layout=${arm%%:*} kv=${arm##*:}
      log="$OUT/${name}_${layout}_${kv}.log"
      timeout "${RUN_S:-240}" python3 -m zkl $Q $R $overrides rl.steps=10 "+layout=$layout" \
        "kv=$kv" hydra.run.dir="$OUT/${name}_${layout}_${kv}" > "$log" 2>&1
      echo "$name $layout $kv run rc=$?" >> "$log"
    done
  fi
  if [[ " $STAGES " == *" bench "* ]]; then
    timeout "${BENCH_S:-240}" python3 -m zkl.bench $Q device=cuda task.name=residue $overrides \
      hydra.run.dir=/tmp/bench_$name > "$OUT/bench_$name.log" 2>&1
    echo "$name bench rc=$?" >> "$OUT/bench_$name.log"
    cp /tmp/bench_$name/bench.json "$OUT/bench_$name.json" 2>/dev/null
  fi
done
if [[ " $STAGES " == *" tests "* ]]; then
  timeout "${TESTS_S:-300}" python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
    ${TESTS:-tests/models/test_gpu_families.py tests/ops/test_sinks.py tests/ops/test_window_attention.py} \
    > "$OUT/pytest_families.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_families.log"
fi
