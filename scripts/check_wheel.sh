#!/usr/bin/env bash
# The wheel as a user installs it: built from this checkout, installed into a fresh virtual
# environment, and run from a directory outside the checkout, where Python cannot import the
# checkout's zkl/ by accident. The environment sees the system's site-packages (torch is not
# downloaded again), but zkl itself must come from the wheel: the script checks zkl.__file__.
# Runs the entry points with tiny settings: one GRPO step, the step-0 certificate, a small
# bench, --help's groups, and a sweep of the installed sweeps through zkl's local launcher. Exit 1 at the first failure.
#   bash scripts/check_wheel.sh   # 50-80 s of CPU time on the 2-core machine (3-6 min wall beside other jobs)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH
export WANDB_MODE=disabled WANDB_SILENT=true

staged=$([[ -e "$repo/build" ]] && echo kept || echo made)
python -m pip wheel -q --no-deps --no-build-isolation -w "$work/dist" "$repo"
[[ $staged == kept ]] || rm -rf "$repo/build"  # setuptools' staging folder, made just now
python -m venv --system-site-packages "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install -q --disable-pip-version-check -c "$repo/constraints/cpu.txt" \
  "$work"/dist/zkl-*.whl
mkdir "$work/run" && cd "$work/run"

where="$("$py" -c 'import zkl; print(zkl.__file__)')"
case "$where" in
  "$work/venv/"*) echo "check_wheel: zkl from the wheel ($where)" ;;
  *) echo "check_wheel: zkl imported from $where, not the wheel" >&2 && exit 1 ;;
esac

tiny=(tracking.progress=false rl.prompts_per_step=2 rl.samples_per_prompt=2)
step() { echo "check_wheel: $*" && "$@"; }
step "$py" -m zkl rl.steps=1 "${tiny[@]}"
step "$py" -m zkl.cert "${tiny[@]}"
step "$py" -m zkl.bench "${tiny[@]}"
echo "check_wheel: $py -m zkl --help"
help="$("$py" -m zkl --help)"
for group in model precision layout engine kv task; do
  grep -q "^  $group: " <<<"$help" || { echo "check_wheel: --help lists no $group options" >&2; exit 1; }
done
sweeps="$("$py" -m zkl.sweeps)"
# Through the wheel's own submitit launcher (hydra_plugins/zkl_launchers): each job's line back.
echo "check_wheel: $py -m zkl -m --config-dir $sweeps --config-name fix_ablation hydra/launcher=local ..."
lines="$("$py" -m zkl -m --config-dir "$sweeps" --config-name fix_ablation hydra/launcher=local \
  +ablate=none,logprob_path precision=bf16 rl.steps=1 "${tiny[@]}")"
jobs=(multirun/fix_ablation/*/[0-9])
[[ ${#jobs[@]} == 2 && -s ${jobs[0]}/metrics.jsonl && -s ${jobs[1]}/metrics.jsonl ]] || {
  echo "check_wheel: the sweep left ${#jobs[@]} jobs, not 2 with metrics" >&2
  exit 1
}
[[ $(grep -c "^1 step in .*: gen_kl_error" <<<"$lines") == 2 ]] || {
  echo "check_wheel: the sweep printed no result line for each of its 2 jobs" >&2
  exit 1
}
echo "check_wheel: passed"
