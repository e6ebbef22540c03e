#!/usr/bin/env bash
# The RL shapes on one GPU, one call: the RL-shaped bench (the whole GRPO step at 4k-token
# prompts and 4k-token responses, 64 rollouts, zero vs default, with its memory), then a
# long-context run of the dense 1.5B (8k prompts, 8k responses, zero mode, graphs on, 3 steps:
# every step must be exactly 0). Both keep one layer's activations at a time
# (trainer.activation_checkpointing) and prefill 2048 tokens of a row at a time, so they fit
# an 80 GB GPU. The tail stage is the RL tail without activation checkpointing: the 1.5B with
# 6,000-token prompts, 6 rollouts, 300 new tokens, graphs on, the update one sequence a
# backward (rl.update_micro_batch=1), 3 steps, each step's peak beside its memory plan (both GB).
#   OUT=/some/dir bash scripts/gpu_rl_shapes.sh   (BENCH_S, LONG_S, TAIL_S bound the stages;
#   STAGES="bench long tail" narrows it)
set -uo pipefail
OUT=${OUT:-gpu_out}
STAGES=${STAGES:-"bench long tail"}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
Q="tracking.wandb.mode=disabled tracking.progress=false checkpoint.save=false"
FIT="trainer.activation_checkpointing=true scheduler.prefill_chunk=2048"
bash scripts/gpu_env.sh "$OUT"
if [[ " $STAGES " == *" bench "* ]]; then
  timeout "${BENCH_S:-330}" python3 -m zkl.bench $Q $FIT device=cuda model=qwen2_5_1_5b \
    bench.workload=rl "bench.step_shapes=[${STEP_SHAPE:-4096x4096x64}]" "bench.gen_shapes=[${GEN_SHAPES:-}]" \
    hydra.run.dir=/tmp/bench_rl > "$OUT/bench_rl.log" 2>&1
  echo "bench rc=$?" >> "$OUT/bench_rl.log"
  cp /tmp/bench_rl/*.json "$OUT/" 2>/dev/null
fi
if [[ " $STAGES " == *" long "* ]]; then
  # residue prompts are a 32-token prefix and a tail: 32 + 8160 = 8192 tokens
  timeout "${LONG_S:-230}" python3 -m zkl $Q $FIT device=cuda model=qwen2_5_1_5b task.name=residue \
    task.min_prompt_len=8160 task.max_prompt_len=8160 sampling.max_new_tokens=8192 \
    sampling.ignore_eos=true rl.steps=3 rl.prompts_per_step=2 rl.samples_per_prompt=8 \
    scheduler.max_batch_size=16 scheduler.cuda_graphs=on rl.score_micro_batch=2 rl.num_minibatches=16 \
    rl.lr=1e-4 hydra.run.dir="$OUT/long_8k_8k" > "$OUT/long_8k_8k.log" 2>&1
  echo "long run rc=$?" >> "$OUT/long_8k_8k.log"
fi
if [[ " $STAGES " == *" tail "* ]]; then
  TAIL="model=qwen2_5_1_5b task.name=residue task.min_prompt_len=5968 task.max_prompt_len=5968
    sampling.max_new_tokens=300 sampling.ignore_eos=true rl.prompts_per_step=1
    rl.samples_per_prompt=6 scheduler.max_batch_size=6 scheduler.cuda_graphs=on
    rl.update_micro_batch=1 rl.steps=3 rl.lr=1e-4"
  python3 scripts/memory_plan.py $TAIL > "$OUT/tail_6k.log" 2>&1
  timeout "${TAIL_S:-240}" python3 -m zkl $Q device=cuda $TAIL hydra.run.dir="$OUT/tail_6k" \
    >> "$OUT/tail_6k.log" 2>&1
  echo "tail run rc=$?" >> "$OUT/tail_6k.log"
  python3 -c "import json; [print(f'step {r[\"step\"]} peak {r[\"perf/peak_gpu_mem_gb\"] * 2**30 / 1e9:.1f} GB')
    for r in map(json.loads, open('$OUT/tail_6k/metrics.jsonl')) if 'perf/peak_gpu_mem_gb' in r]" \
    >> "$OUT/tail_6k.log" 2>&1  # the metric is GiB; the plan above is GB
fi
