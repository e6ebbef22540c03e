#!/usr/bin/env bash
# What a device run ran on, into $1/env.txt: the time, the commit and a hash of zkl's sources
# (the copy's .git can be older than its files), the GPU and driver, torch, CUDA, Triton and
# transformers. Called by the scripts/gpu_*.sh stages:  bash scripts/gpu_env.sh "$OUT"
{
  date -u +%FT%TZ
  git rev-parse HEAD 2>/dev/null
  echo "zkl sources sha256 $(find zkl -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  python3 -c "import transformers; print('transformers', transformers.__version__)" 2>&1
} > "$1/env.txt" 2>&1
