#!/usr/bin/env bash
# The GPU tests on one GPU, then (stages attn, eager) the attention rows against SDPA's flash
# and where an eager decode step goes; stage spec (not in the default list) probes zero mode's
# Triton attention kernels (scripts/attention_spec_probe.py).
#   OUT=/some/dir STAGES="tests attn eager" bash scripts/gpu_tests.sh
# The whole `-m gpu` run took 496 s on an H200; its log ends with the 40 slowest tests, which
# say how to split it over two calls (TESTS="tests/ops tests/models" and the rest, say).
set -uo pipefail
OUT=${OUT:-gpu_out}
STAGES=${STAGES:-"tests attn eager"}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
bash scripts/gpu_env.sh "$OUT"
for stage in $STAGES; do
  case $stage in
    tests)
      timeout "${TESTS_S:-560}" python3 -m pytest -m gpu -q -rfE --durations=40 -p no:cacheprovider ${TESTS:-tests} \
        > "$OUT/pytest_gpu.log" 2>&1; echo "pytest rc=$?" >> "$OUT/pytest_gpu.log" ;;
    attn)
      timeout "${ATTN_S:-150}" python3 -c "
import json, zkl.lab.bench_attention as b
from zkl.lab.timing import format_table
r = {**b.forward_rows(), **b.decode_rows()}
print(format_table(r)); json.dump(r, open('$OUT/attention.json', 'w'), indent=1)
" > "$OUT/attention.log" 2>&1; echo "attn rc=$?" >> "$OUT/attention.log" ;;
    spec)  # where zero mode's Triton attention loses to SDPA, and candidate kernels' bits
      timeout "${SPEC_S:-420}" python3 scripts/attention_spec_probe.py --out "$OUT/attention_spec.json" \
        > "$OUT/attention_spec.log" 2>&1; echo "spec rc=$?" >> "$OUT/attention_spec.log" ;;
    eager)
      timeout "${EAGER_S:-120}" python3 -m zkl.lab.profile_eager > "$OUT/eager.log" 2>&1
      echo "eager rc=$?" >> "$OUT/eager.log" ;;
  esac
done
