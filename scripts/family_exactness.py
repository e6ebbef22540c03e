"""GRPO from a tiny transformers checkpoint alone (`model.checkpoint=DIR`), across layouts, KV
modes and precisions: the train/gen mismatch of every step, which zero mode keeps at 0.

    python scripts/family_exactness.py --families llama mistral gpt_oss --steps 10 --out DIR

Each family's checkpoint is written by transformers' `save_pretrained`
(scripts/make_hf_checkpoint.py, tiny shape, its family's features on) with a BPE tokenizer
trained on tests/testdata/arith_train.jsonl. The runs pass the checkpoint and the matrix's
groups and nothing else, so they use the default `add` task, whose shaped reward varies
inside a group even for a random model: every step's update changes the weights. One
markdown row a run: the largest `max_abs_logprob_diff` and `gen_kl_error` over the steps and
how many steps trained (`optim/update_norm > 0` and some tensor changed).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "testdata"
# (layout, kv, precision): all 8, each next one as unlike the runs before it as can be
MATRIX = [
    ("colocated", "recompute", "bf16"),
    ("dedicated", "persist", "mxfp8"),
    ("colocated", "persist", "bf16"),
    ("dedicated", "recompute", "mxfp8"),
    ("colocated", "recompute", "mxfp8"),
    ("dedicated", "persist", "bf16"),
    ("colocated", "persist", "mxfp8"),
    ("dedicated", "recompute", "bf16"),
]


def write_checkpoint(out: Path, family: str) -> Path:
    spec = importlib.util.spec_from_file_location(
        "make_hf", REPO / "scripts" / "make_hf_checkpoint.py"
    )
    make_hf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_hf)
    if not (out / "config.json").is_file():
        out.mkdir(parents=True, exist_ok=True)
        make_hf.write_model(out, family, "tiny", seed=0, max_shard_size=None)
        make_hf.write_tokenizer(out, make_hf.corpus_lines(str(DATA / "arith_train.jsonl")), 320)
    return out


def overrides(checkpoint: Path, layout: str, kv: str, precision: str, steps: int) -> list[str]:
    return [
        f"model.checkpoint={checkpoint}",
        f"layout={layout}",
        f"kv={kv}",
        f"precision={precision}",
        f"rl.steps={steps}",
        "tracking.wandb.mode=disabled",
    ]


def main() -> None:
    from zkl.rl.loop import run
    from zkl.run.compose import compose
    from zkl.run.validate import check_run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=["llama", "mistral", "gpt_oss"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--start", type=int, default=0, help="skip the first START configs")
    args = parser.parse_args()
    print(
        "| family | layout | kv | precision | steps | max_abs_logprob_diff | gen_kl_error "
        "| steps trained | reward first / last |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    checkpoints = {f: write_checkpoint(args.out / f"ckpt_{f}", f) for f in args.families}
    for (layout, kv, precision), family in itertools.product(MATRIX[args.start :], args.families):
        name = f"{family}_{layout}_{kv}_{precision}"
        cfg = compose(overrides(checkpoints[family], layout, kv, precision, args.steps))
        rows = run(cfg, args.out / name, task=check_run(cfg))
        diff = max(r["train/max_abs_logprob_diff"] for r in rows)
        kl = max(r["train/gen_kl_error"] for r in rows)
        trained = sum(r["optim/update_norm"] > 0 and r["weights/changed_tensors"] > 0 for r in rows)
        reward = f"{rows[0]['reward/mean']:.3f} / {rows[-1]['reward/mean']:.3f}"
        print(
            f"| {family} | {layout} | {kv} | {precision} | {len(rows)} | {diff} | {kl} "
            f"| {trained} | {reward} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
