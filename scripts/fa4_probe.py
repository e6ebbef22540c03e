"""Does flash-attn-4 keep zkl's attention contract on this GPU? (prefill == decode == batched).

zkl's invariant attention must give a query's output bits as a function of its position and
its keys alone (docs/design.md section 3). This probe asks flash-attn-4's Hopper kernels the
same questions zkl's own Triton kernel answers, at the 1.5B's heads (12 q / 2 kv, d 128, bf16):

  prefill   row p of one causal prefill over T keys == a one-query decode over keys 0..p;
  split     the same, both sides run split over keys with one fixed `seqlen_k_per_split`;
  batch     64 ragged one-query decodes in one varlen call == each alone;
  window    a sliding window (gpt-oss: 128) and learnable sinks, prefill == decode.

Each line printed is one JSON object: the check, T, how many probed rows differ, the first
differing position and the largest difference. Run on the device (one call):

    python scripts/fa4_probe.py --out $OUT/fa4_probe.jsonl [--lengths 2048,8192,32768]

Needs CUDA and `flash-attn-4` (the `[fa4]` extra); nothing here runs on the CPU.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

HEADS_Q, HEADS_KV, HEAD_DIM = 12, 2, 128
BLOCK = 128  # FA4's key tile on Hopper at d 128: probe rows on both sides of its edges


def probe_positions(length: int, count: int, seed: int) -> list[int]:
    """Rows around every tile edge near the start and end, plus seeded random rows."""
    edges = [e + d for e in range(BLOCK, length, BLOCK) for d in (-2, -1, 0, 1)]
    picked = set(edges[:64] + edges[-64:] + [0, 1, length - 1])
    gen = torch.Generator().manual_seed(seed)
    picked.update(torch.randint(0, length, (count,), generator=gen).tolist())
    return sorted(p for p in picked if 0 <= p < length)


def verdict(check: str, length: int, rows: list[int], full: torch.Tensor, alone: list) -> dict:
    """Compare row p of the full call with the p-th alone call, bit for bit."""
    diffs = [
        (p, (full[i].float() - a.float()).abs().max().item())
        for i, (p, a) in enumerate(zip(rows, alone))
        if not torch.equal(full[i], a)
    ]
    return {
        "check": check,
        "T": length,
        "rows": len(rows),
        "differ": len(diffs),
        "first": diffs[0][0] if diffs else None,
        "max_abs": max((d for _, d in diffs), default=0.0),
    }


def qkv(length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = lambda h: (1, length, h, HEAD_DIM)  # noqa: E731  # [B, T, H, D]
    q = torch.randn(shape(HEADS_Q), generator=gen, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(shape(HEADS_KV), generator=gen, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(shape(HEADS_KV), generator=gen, device="cuda", dtype=torch.bfloat16)
    return q, k, v


def output(result) -> torch.Tensor:
    """FA4 returns `out` or `(out, lse)` depending on `return_lse`; the probe wants `out`."""
    return result[0] if isinstance(result, tuple) else result


def prefill_vs_decode(fa4, length: int, rows: list[int], **kw) -> tuple[torch.Tensor, list]:
    """Row p of a causal prefill, and a one-query call over keys 0..p, for every probed p."""
    q, k, v = qkv(length, seed=length)
    full = output(fa4.flash_attn_func(q, k, v, causal=True, **kw))
    alone = [
        output(
            fa4.flash_attn_func(q[:, p : p + 1], k[:, : p + 1], v[:, : p + 1], causal=True, **kw)
        )[0, 0]
        for p in rows
    ]
    return full[0, rows], alone


def varlen(fa4, q, k, v, lengths_q, lengths_k, **kw) -> torch.Tensor:
    """One varlen call over packed sequences: q [total_q, H, D], k/v [total_k, Hkv, D]."""
    cu_q = torch.tensor(
        [0, *torch.tensor(lengths_q).cumsum(0).tolist()], device="cuda", dtype=torch.int32
    )
    cu_k = torch.tensor(
        [0, *torch.tensor(lengths_k).cumsum(0).tolist()], device="cuda", dtype=torch.int32
    )
    return output(
        fa4.flash_attn_varlen_func(
            q,
            k,
            v,
            cu_seqlens_q=cu_q,
            cu_seqlens_k=cu_k,
            max_seqlen_q=max(lengths_q),
            max_seqlen_k=max(lengths_k),
            causal=True,
            **kw,
        )
    )


def split_check(fa4, length: int, rows: list[int], per_split: int) -> dict:
    """Prefill and decode both split over keys in chunks of `per_split` keys (varlen API)."""
    q, k, v = qkv(length, seed=length + 1)
    splits = -(-length // per_split)
    kw = {"num_splits": splits, "seqlen_k_per_split": per_split}
    full = varlen(fa4, q[0], k[0], v[0], [length], [length], **kw)[rows]
    alone = [
        varlen(fa4, q[0, p : p + 1], k[0, : p + 1], v[0, : p + 1], [1], [p + 1], **kw)[0]
        for p in rows
    ]
    return verdict(f"split{per_split}", length, rows, full, alone)


def batch_check(fa4, context: int, batch: int) -> dict:
    """`batch` ragged one-query decodes in one call == each alone."""
    gen = torch.Generator().manual_seed(context)
    lengths = torch.randint(context // 2, context + 1, (batch,), generator=gen).tolist()
    q, k, v = qkv(sum(lengths), seed=context + 2)
    starts = torch.tensor([0, *lengths]).cumsum(0).tolist()
    q_rows = torch.stack([q[0, s + n - 1] for s, n in zip(starts, lengths)])  # [B, H, D]
    together = varlen(fa4, q_rows, k[0], v[0], [1] * batch, lengths)
    alone = [
        varlen(fa4, q_rows[i : i + 1], k[0, s : s + n], v[0, s : s + n], [1], [n])[0]
        for i, (s, n) in enumerate(zip(starts, lengths))
    ]
    return verdict(f"batch{batch}", context, list(range(batch)), together, alone)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--lengths", default="1024,4096,8192,32768")
    parser.add_argument("--random-rows", type=int, default=200)
    parser.add_argument("--per-split", type=int, default=4096)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("fa4_probe: needs a CUDA device")
    try:
        import flash_attn.cute as fa4
    except ImportError as exc:
        sys.exit(f"fa4_probe: flash-attn-4 is not importable ({exc}); install the [fa4] extra")
    results = []
    sinks = torch.randn(HEADS_Q, device="cuda", dtype=torch.float32)
    for length in [int(t) for t in args.lengths.split(",")]:
        rows = probe_positions(length, args.random_rows, seed=length)
        full, alone = prefill_vs_decode(fa4, length, rows, num_splits=1)
        results.append(verdict("prefill", length, rows, full, alone))
        results.append(split_check(fa4, length, rows, args.per_split))
        full, alone = prefill_vs_decode(
            fa4, length, rows, window_size=(127, 0), learnable_sink=sinks
        )
        results.append(verdict("window128+sinks", length, rows, full, alone))
    results.append(batch_check(fa4, 4096, 64))
    with open(args.out, "w") as out:
        for row in results:
            line = json.dumps(row)
            print(line)
            out.write(line + "\n")
    return 0 if all(r["differ"] == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
