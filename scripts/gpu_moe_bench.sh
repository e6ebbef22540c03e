#!/usr/bin/env bash
# The MoE and hybrid benchmarks on one GPU, one call: the CUDA table of the Qwen3-30B-A3B cut (generation zero vs
# default with graphs at batch 16/64/256, peak memory, the train step, the roofline over the
# experts read), then the dense 1.5B's
# decode step at batch 64 in the same call (the MoE step's yardstick), then the Nemotron cut
# (one layer of each kind) with graphs on: 10 GRPO steps, and its bench (zero vs default);
# last, the GPU tests named in TESTS.
#   OUT=/some/dir bash scripts/gpu_moe_bench.sh   (TESTS_S, BENCH_S, DENSE_S, HYBRID_S bound stages;
#   STAGES="moe dense hybrid" by default, any of them)
set -uo pipefail
OUT=${OUT:-gpu_out}
STAGES=${STAGES:-"moe dense hybrid"}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
Q="tracking.wandb.mode=disabled tracking.progress=false"
bash scripts/gpu_env.sh "$OUT"
wants() { [[ " $STAGES " == *" $1 "* ]]; }
wants moe && {
timeout "${BENCH_S:-300}" python3 -m zkl.bench $Q device=cuda model=qwen3_30b_a3b \
  model.num_hidden_layers=4 task.name=residue hydra.run.dir=/tmp/bench_moe > "$OUT/bench_moe.log" 2>&1
echo "bench rc=$?" >> "$OUT/bench_moe.log"
cp /tmp/bench_moe/bench.json "$OUT/bench_moe.json" 2>/dev/null
}
wants dense && {
timeout "${DENSE_S:-120}" python3 - > "$OUT/dense_b64.log" 2>&1 <<'PY'
import json, torch
from zkl.lab.bench_cuda import _generation_rows
from zkl.lab.roofline import copy_bandwidth
from zkl.models.build import build_model
from zkl.run.compose import compose
cfg = compose(["model=qwen2_5_1_5b", "task.name=residue", "device=cuda"]).model
model = build_model(cfg, torch.bfloat16, seed=0, device="cuda")
out = {}
_generation_rows(out, model, 64, copy_bandwidth())
print(json.dumps(out, indent=1))
PY
echo "dense rc=$?" >> "$OUT/dense_b64.log"
}
wants hybrid && {
NH="model=nemotron3_nano_30b_a3b model.num_hidden_layers=3 model.hybrid_override_pattern=M*E"
NHRUN="$Q $NH device=cuda task.name=residue scheduler.cuda_graphs=on checkpoint.save=false"
timeout "${HYBRID_S:-90}" python3 -m zkl $NHRUN rl.steps=10 rl.prompts_per_step=4 \
  sampling.max_new_tokens=16 hydra.run.dir=/tmp/nh10 > "$OUT/nemotron_10.log" 2>&1
echo "nemotron run rc=$?" >> "$OUT/nemotron_10.log"
python3 -c "import json;[print({k:v for k,v in json.loads(l).items() if 'logprob' in k or 'kl' in k or 'peak' in k or k=='step'}) for l in open('/tmp/nh10/metrics.jsonl')]" >> "$OUT/nemotron_10.log" 2>&1
timeout "${HYBRID_S:-90}" python3 -m zkl.bench $NHRUN rl.prompts_per_step=8 rl.samples_per_prompt=8 scheduler.max_batch_size=64 \
  sampling.max_new_tokens=64 hydra.run.dir=/tmp/nhbench > "$OUT/nemotron_bench.log" 2>&1
echo "nemotron bench rc=$?" >> "$OUT/nemotron_bench.log"
}
if [ -n "${TESTS:-}" ]; then  # last: the figures come back even if the tests run out of time
  timeout "${TESTS_S:-200}" python3 -m pytest -m gpu -q -rfE -p no:cacheprovider $TESTS \
    > "$OUT/pytest_gpu.log" 2>&1; echo "pytest rc=$?" >> "$OUT/pytest_gpu.log"
fi
