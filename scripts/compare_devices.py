"""Run the same experiment on the CPU and on CUDA and say how far the two agree.

    python scripts/compare_devices.py [OVERRIDE ...]   (default: the tiny CPU default, 3 steps)

Both runs start from bitwise-equal weights (zkl's seeded init is device-independent) and
draw from the same counter-based sampler, so they differ only where the kernels round
differently. Prints, per step, the share of samples whose tokens are identical and the
largest |logprob(CPU) - logprob(CUDA)| over tokens whose whole prefix is identical, and
writes the same as JSON (`--out FILE`). Zero mismatch is a per-device guarantee
(docs/design.md section 3); this measures the cross-device difference, it does not require zero.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from zkl.rl.loop import run
from zkl.run.compose import compose
from zkl.run.validate import check_run


def _tokens(run_dir: Path) -> dict[tuple[int, int], dict]:
    records = [json.loads(line) for line in (run_dir / "tokens.jsonl").read_text().splitlines()]
    return {(r["step"], r["sample"]): r for r in records}


def compare(overrides: list[str]) -> list[dict]:
    base = ["tracking.wandb.mode=disabled", "tracking.progress=false", "tracking.dump_tokens=all"]
    base += ["rl.steps=3", *overrides]
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for device in ("cpu", "cuda"):
            cfg = compose([*base, f"device={device}"])
            run(cfg, Path(tmp) / device, task=check_run(cfg))
            out[device] = _tokens(Path(tmp) / device)
    rows = []
    for step in sorted({s for s, _ in out["cpu"]}):
        keys = [k for k in out["cpu"] if k[0] == step]
        same, max_diff, compared = 0, 0.0, 0
        for k in keys:
            a, b = out["cpu"][k], out["cuda"][k]
            same += a["response"] == b["response"]
            for i, (ta, tb) in enumerate(zip(a["response"], b["response"])):
                if ta != tb:
                    break
                for side in ("lp_gen", "lp_train"):
                    max_diff = max(max_diff, abs(a[side][i] - b[side][i]))
                compared += 1
        rows.append(
            {
                "step": step,
                "samples": len(keys),
                "identical_responses": same,
                "tokens_compared": compared,
                "max_abs_logprob_diff_cpu_vs_cuda": max_diff,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = compare(args.overrides)
    for r in rows:
        print(json.dumps(r))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
