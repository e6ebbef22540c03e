"""The MoE decode step on a GPU: where its time goes, and the grouped GEMM's tiles.

    python -m zkl.lab.grouped_tiles OUT_DIR [OVERRIDE ...]  (default: the 30B-A3B cut)

Writes OUT_DIR/profile_moe_b64_{zero,default}.txt (one eager decode step at batch 64) and
OUT_DIR/grouped_tiles.json: at the cut's expert shapes (fused gate/up and down, the rows of
64 tokens x top-8 routed by a random router), each candidate tile's time as one CUDA-graph
replay, whether its bits are the fixed tile's, and a per-expert cuBLAS loop for scale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from zkl.lab.bench_cuda import profile_decode_step
from zkl.lab.timing import graph_time
from zkl.lab.workload import MODES
from zkl.models.build import build_model
from zkl.models.moe import group_by_expert
from zkl.ops.triton import gemm
from zkl.ops.triton.grouped_gemm import grouped_gemm
from zkl.run.compose import compose

CANDIDATES = (
    (64, 64, 128, 4, 4),
    (64, 32, 256, 4, 4),
    (64, 128, 64, 4, 4),
    (64, 16, 256, 4, 4),
    (32, 64, 128, 4, 4),
    (16, 64, 128, 4, 4),
    (16, 128, 128, 4, 4),
    (16, 64, 256, 4, 3),
)


def tiles(cfg, tokens: int) -> dict[str, float]:
    g = torch.Generator(device="cuda").manual_seed(0)
    experts, top_k = cfg.moe.num_experts, cfg.moe.num_experts_per_tok
    top_i = torch.rand(tokens, experts, device="cuda", generator=g).topk(top_k).indices
    _, offsets = group_by_expert(top_i, experts)
    rows = tokens * top_k
    out: dict[str, float] = {}
    hidden, inter = cfg.hidden_size, cfg.moe.intermediate_size
    for name, k, n in (("gate_up", hidden, 2 * inter), ("down", inter, hidden)):
        x = torch.randn(rows, k, device="cuda", generator=g).to(torch.bfloat16)
        ws = [(torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
              for _ in range(experts)]  # fmt: skip
        reference = grouped_gemm(x, ws, offsets, gemm.fixed_config(k, n, torch.bfloat16))
        label = f"b{tokens}/{name}_K{k}_N{n}"
        out[f"{label}/chosen"] = "x".join(map(str, gemm.config_for(rows, k, n, torch.bfloat16)))
        bounds = offsets.tolist()
        loop = graph_time(lambda: [x[a:b] @ w.t() for w, a, b in zip(ws, bounds, bounds[1:])])  # noqa: B023 - timed here
        out[f"{label}/cublas_loop_us"] = 1e6 * loop
        for config in CANDIDATES:
            key = f"{label}/{'x'.join(map(str, config))}"
            try:
                seconds = graph_time(lambda c=config: grouped_gemm(x, ws, offsets, c))  # noqa: B023
                same = torch.equal(grouped_gemm(x, ws, offsets, config), reference)
            except Exception as exc:  # noqa: BLE001 - a tile that does not compile is a row
                out[f"{key}/error"] = repr(exc)[:200]
                continue
            out[f"{key}/us"] = 1e6 * seconds
            out[f"{key}/bitwise_fixed"] = float(same)
            weight_bytes = n * k * 2 * int((offsets[1:] > offsets[:-1]).sum())
            out[f"{key}/weight_tb_s"] = weight_bytes / seconds / 1e12
    return out


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    overrides = sys.argv[2:] or ["model=qwen3_30b_a3b", "model.num_hidden_layers=4"]
    cfg = compose([*overrides, "task.name=residue", "device=cuda"]).model
    result = {**tiles(cfg, 64), **tiles(cfg, 16), **tiles(cfg, 256)}
    (out_dir / "grouped_tiles.json").write_text(json.dumps(result, indent=1))
    for key, value in result.items():
        print(f"{key:55} {value:.4g}" if isinstance(value, float) else f"{key:55} {value}")
    model = build_model(cfg, torch.bfloat16, seed=0, device="cuda")
    for mode, fixes in MODES.items():
        table = profile_decode_step(model, 64, fixes)
        (out_dir / f"profile_moe_b64_{mode}.txt").write_text(table)


if __name__ == "__main__":
    main()
