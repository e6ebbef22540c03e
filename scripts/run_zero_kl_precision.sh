#!/usr/bin/env bash
# Launch a zkl sweep on a Slurm cluster through submitit, then write its comparison report.
# Copy this file and edit the settings below for your cluster (or set them in the
# environment); arguments are extra Hydra overrides for every job, e.g.
#   scripts/run_zero_kl_precision.sh                       # the whole precision matrix
#   scripts/run_zero_kl_precision.sh model=tiny_dense rl.steps=20
#   PARTITION=gpu ACCOUNT=team SWEEP=gpu_matrix LAUNCHER=slurm_gpu \
#     scripts/run_zero_kl_precision.sh +layout=colocated
# No cluster at hand: `bash scripts/slurm_local_cluster.sh` (as root) starts one on this machine.
set -euo pipefail

SWEEP=${SWEEP:-precision_matrix}       # a file of sweeps/ (without .yaml)
LAUNCHER=${LAUNCHER:-slurm}            # conf/hydra/launcher/: slurm | slurm_gpu | local
PARTITION=${PARTITION:-}               # empty: the cluster's default partition
ACCOUNT=${ACCOUNT:-}                   # empty: your default account
TIME_MIN=${TIME_MIN:-60}               # Slurm time limit per job; the run requeues past it
SWEEP_DIR=${SWEEP_DIR:-multirun/$SWEEP/$(date +%Y-%m-%d_%H-%M-%S)}
WANDB_MODE=${WANDB_MODE:-offline}      # offline | online | disabled

REPO=$(cd "$(dirname "$0")/.." && pwd)
args=(
  "hydra/launcher=$LAUNCHER"
  "hydra.sweep.dir=$SWEEP_DIR"
  "hydra.launcher.timeout_min=$TIME_MIN"
  "tracking.wandb.mode=$WANDB_MODE"
)
[[ -n "$PARTITION" ]] && args+=("hydra.launcher.partition=$PARTITION")
[[ -n "$ACCOUNT" ]] && args+=("hydra.launcher.account=$ACCOUNT")

status=0
python -m zkl -m --config-dir "$REPO/sweeps" --config-name "$SWEEP" "${args[@]}" "$@" || status=$?
# The report also shows the jobs that failed, with their error.
python -m zkl.report "$SWEEP_DIR"
exit "$status"
