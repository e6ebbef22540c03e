"""The GEMM rows of the CUDA bench: the invariant Triton GEMM against cuBLAS at the model's
shapes, and each candidate tile's speed and bits: the data behind
`zkl.ops.triton.gemm.config_for`."""

from __future__ import annotations

import torch

from zkl.lab.timing import graph_time
from zkl.lab.workload import TRAIN_LEN, TRAIN_SEQS
from zkl.ops.triton.gemm import config_for, fixed_config, gemm


def gemm_shapes(cfg) -> list[tuple[str, int, int]]:
    """(name, K, N) of the model's Linear layers."""
    h, d = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    return [
        ("qkv", h, q + 2 * kv),
        ("o_proj", q, h),
        ("gate_up", h, 2 * cfg.intermediate_size),
        ("down", cfg.intermediate_size, h),
        ("lm_head", h, cfg.vocab_size),
    ]


# Tile configs (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) timed beside the one M picks, each
# checked bitwise against the fixed tile: the data behind `zkl.ops.triton.gemm.config_for`.
TILE_CANDIDATES = (
    (128, 256, 64, 8, 3),
    (128, 128, 128, 8, 3),
    (128, 128, 64, 8, 4),
    (64, 128, 64, 4, 4),
    (64, 64, 128, 4, 4),
    (64, 32, 256, 4, 4),
    (64, 16, 256, 4, 4),
    (64, 64, 64, 4, 4),
)


def gemm_rows(cfg, configs=TILE_CANDIDATES) -> dict[str, float]:
    """The invariant GEMM vs cuBLAS at 4096^3 and the model's train and decode shapes, and at
    each shape every candidate tile: its speed over cuBLAS and whether its bits are the
    fixed tile's. One pass: the inputs and the cuBLAS timing serve every config."""
    shapes = [("4096^3", 4096, 4096, 4096)]
    for m, label in ((TRAIN_SEQS * TRAIN_LEN, "train"), (64, "decode64"), (256, "decode256")):
        shapes += [(f"{label}/{name}_M{m}_K{k}_N{n}", m, k, n) for name, k, n in gemm_shapes(cfg)]
    out: dict[str, float] = {}
    for label, m, k, n in shapes:
        out.update(gemm_at(label, m, k, n, configs))
    return out


def gemm_at(label: str, m: int, k: int, n: int, configs=TILE_CANDIDATES) -> dict[str, float]:
    """`gemm/<label>/…`: TFLOP/s of the invariant GEMM (the tile M picks) and of cuBLAS, their
    ratio, and whether its bits are the fixed tile's (bf16); `tiles/<label>/<config>/…`: each
    candidate tile's speed over cuBLAS and its bits vs the fixed tile."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    w_t = w.t()
    reference = gemm(x, w, config=fixed_config(k, n, torch.bfloat16))
    ours = graph_time(lambda: gemm(x, w))
    cublas = graph_time(lambda: torch.mm(x, w_t))
    flops = 2.0 * m * k * n
    out = {
        f"gemm/{label}/zkl_tflops": flops / ours / 1e12,
        f"gemm/{label}/cublas_tflops": flops / cublas / 1e12,
        f"gemm/{label}/zkl_over_cublas": cublas / ours,
        f"gemm/{label}/zkl_bitwise_fixed": float(torch.equal(gemm(x, w), reference)),
        f"gemm/{label}/tile": "x".join(map(str, config_for(m, k, n, torch.bfloat16))),
    }
    for config in configs:
        key = f"tiles/{label}/{'x'.join(map(str, config))}"
        try:
            seconds = graph_time(lambda c=config: gemm(x, w, config=c))
            same = torch.equal(gemm(x, w, config=config), reference)
        except Exception as exc:  # noqa: BLE001 - e.g. a tile too big for shared memory
            out[f"{key}/error"] = type(exc).__name__
            continue
        out[f"{key}/over_cublas"] = cublas / seconds
        out[f"{key}/bitwise_equal"] = float(same)
    return out
