"""Where zero mode's Triton prefill loses to SDPA, and what the spec itself costs (CUDA).

    python scripts/attention_spec_probe.py [--out attention_spec.json]

At the 1.5B's attention layer (12 query / 2 KV heads, d 128, bf16), 2 x 8k and 1 x 16k causal
forwards, every kernel timed side by side with SDPA's flash:
- `zkl/…`: `attention_kernels.prefill` as zero mode runs it (chunks of 256 keys merged in order)
  and with one chunk (a single online softmax), per candidate tile (`…i`: `Tile.interior`,
  the blocks every query of the tile sees run unmasked);
- `plain/…`: a causal flash forward written as fast Triton kernels are (masks on the diagonal
  block only, P.V accumulated inside the MMA, contraction on): what Triton reaches here;
- `fma_…`: the same kernel computing zero mode's spec (separate P.V, one `fma` a step, no
  contraction), with and without the spec's chunk merge: what the spec's rules cost;
- `mma_…`: the spec with P.V accumulated inside the MMA (one register tile fewer).
`fma` is checked bit for bit against `zkl` at the same tile and chunk (the interior blocks'
masks are identities, so an unmasked interior must give the same bits). Then decode at b1 8k,
b1 32k and b16 32k: zkl's (with a profile of its two kernels), its combine unrolled, 512-key
chunks, flash-decoding's parallel combine, and the one-chunk spec's blocks in parallel
(`attention_candidates.decode_prefix`, checked against the one-chunk prefill's rows). The
candidates: scripts/attention_candidates.py.
"""

from __future__ import annotations

import argparse
import json

import torch
from attention_candidates import FORWARD_MODES, decode_prefix, decode_with, forward

from zkl.lab.bench_attention import HEAD_DIM, HEADS, KV_HEADS, _fastest, _qkv, _sdpa_forms
from zkl.lab.timing import cuda_time, graph_time
from zkl.ops.triton.attention_default import default_chunk
from zkl.ops.triton.attention_kernels import CHUNK, KEY_BLOCK, Tile, decode, prefill
from zkl.ops.triton.gemm import sm_count


def decode_profile() -> dict[str, object]:
    """zkl's decode at b1/b16 against SDPA (graph-timed), and its kernels' device time."""

    out: dict[str, object] = {}
    for batch, ctx in ((1, 8192), (1, 32768), (16, 32768)):
        out.update(_decode_shape(batch, ctx))
    out.update(_prefix_bits())
    return out


def _prefix_bits(seq: int = 4096) -> dict[str, object]:
    """Queries of one sequence decoded alone by `decode_prefix` against the one-chunk
    prefill's rows at two tiles, bit for bit (the device's MMA kinds decide)."""
    q, k, v = _qkv(1, seq, seed=5)
    pos = torch.arange(seq, device="cuda").expand(1, seq)
    at = torch.arange(0, seq, 7, device="cuda")
    q_dec = q[0, :, at].unsqueeze(2).transpose(0, 1)
    slots = torch.zeros(len(at), dtype=torch.long, device="cuda")
    out: dict[str, object] = {}
    for tile in (Tile(128, 8, 3), Tile(64, 4, 3)):
        want = prefill(q, k, v, pos, tile=tile, chunk=1 << 30)[0, :, at].transpose(0, 1)
        for rows in (64, 16):
            got = decode_prefix(q_dec, k, v, at.view(-1, 1), slots, rows_per_program=rows)
            same = (got[:, :, 0] == want).all(dim=-1)  # [n, H]: whole rows equal
            name = f"prefix_bits/prefill{tile.rows}w{tile.warps}_decode{rows}"
            out[f"{name}/rows_equal"] = f"{int(same.sum())} of {same.numel()}"
    return out


def _decode_shape(batch: int, ctx: int) -> dict[str, object]:
    from torch.profiler import ProfilerActivity, profile

    out: dict[str, object] = {}
    g = torch.Generator(device="cuda").manual_seed(ctx)
    q = torch.randn(batch, 1, HEADS, HEAD_DIM, device="cuda", generator=g).bfloat16()
    q = q.transpose(1, 2)
    k, v = (torch.randn(batch, KV_HEADS, ctx, HEAD_DIM, device="cuda", generator=g).bfloat16()
            for _ in range(2))  # fmt: skip
    pos = torch.full((batch, 1), ctx - 1, device="cuda")
    rows = torch.arange(batch, device="cuda")
    _, sdpa = _fastest(_sdpa_forms(q.contiguous(), k, v, False), graph_time)
    key = f"decode/b{batch}/ctx{ctx}"
    out[f"{key}/sdpa_us"] = sdpa * 1e6
    for r in (16, 64):
        t = graph_time(lambda r=r: decode(q, k, v, pos, rows, rows_per_program=r))
        out[f"{key}/zkl_rows{r}_us"] = t * 1e6
        out[f"{key}/zkl_rows{r}_over_sdpa_speed"] = sdpa / t
    ref = decode(q, k, v, pos, rows, rows_per_program=64)
    for unroll in (1, 8, 16, 32):  # 1: the loads one chunk at a time
        args = (q, k, v, pos, rows, "unrolled")
        t = graph_time(lambda a=args, u=unroll: decode_with(*a, unroll=u))
        out[f"{key}/zkl_unrolled{unroll}_over_sdpa_speed"] = sdpa / t
        same = torch.equal(decode_with(*args, unroll=unroll), ref)
        out[f"{key}/zkl_unrolled{unroll}_equal_zkl"] = bool(same)
    # a spec of 512-key chunks: half the merges, half the decode programs
    t = graph_time(lambda: decode_with(q, k, v, pos, rows, "unrolled", chunk=512, unroll=16))
    out[f"{key}/chunk512_unrolled16_over_sdpa_speed"] = sdpa / t
    for unroll in (16, 32):  # the one-chunk spec, its blocks in parallel
        t = graph_time(lambda u=unroll: decode_prefix(q, k, v, pos, rows, unroll=u))
        out[f"{key}/onechunk_prefix_unroll{unroll}_over_sdpa_speed"] = sdpa / t
    chunk = default_chunk(batch, KV_HEADS, ctx, sm_count(q.device))
    t = graph_time(lambda: decode(q, k, v, pos, rows, chunk=chunk, fp_fusion=True))
    out[f"{key}/default_triton_over_sdpa_speed"] = sdpa / t
    for c in sorted({chunk, 256, 512, 1024}):
        t = graph_time(lambda c=c: decode_with(q, k, v, pos, rows, "parallel", chunk=c,
                                               rows_per_program=16, fp_fusion=True))  # fmt: skip
        out[f"{key}/default_parallel_chunk{c}_over_sdpa_speed"] = sdpa / t
    try:  # where the decode's time goes, kernel by kernel
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                decode(q, k, v, pos, rows, rows_per_program=64)
            torch.cuda.synchronize()
        for ev in prof.key_averages():
            if "kernel" in ev.key:
                out[f"{key}/kernel/{ev.key[:40]}_us"] = ev.device_time_total / 5
    except (AttributeError, RuntimeError) as exc:
        out[f"{key}/kernel/error"] = repr(exc)[:200]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="attention_spec.json")
    args = parser.parse_args()
    out: dict[str, object] = {"device": torch.cuda.get_device_name()}
    parts = [lambda: _forward_shape(2, 8192), lambda: _forward_shape(1, 16384), decode_profile]
    for part in parts:  # each part's rows saved as they come: a time bound keeps the others
        out.update(part())
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    for name, value in out.items():
        print(f"{name:60} {value:.4g}" if isinstance(value, float) else f"{name:60} {value}")


def _forward_shape(batch: int, seq: int) -> dict[str, object]:
    out: dict[str, object] = {}
    q, k, v = _qkv(batch, seq, seed=seq)
    pos = torch.arange(seq, device="cuda").expand(batch, seq)
    forms = _sdpa_forms(q.contiguous(), k, v, True)
    _, sdpa = _fastest(forms, lambda f: cuda_time(f, repeats=10))
    flops = 4 * batch * HEADS * HEAD_DIM * seq * seq / 2
    key = f"T{seq}"
    out[f"{key}/sdpa_tflops"] = flops / sdpa / 1e12
    rows: dict[str, object] = {}
    tiles = (Tile(128, 8, 3), Tile(128, 8, 3, nested=True), Tile(64, 4, 3),
             Tile(128, 8, 3, interior=True), Tile(64, 4, 3, interior=True))  # fmt: skip
    for tile in tiles:
        name = f"{tile.rows}w{tile.warps}{'n' if tile.nested else 'i' if tile.interior else 'f'}"
        chunks = ((CHUNK, "chunk256"), (512, "chunk512"), (1 << 30, "onechunk"))
        for chunk, cname in chunks[::2] if tile.interior else chunks:
            rows[f"zkl/{name}/{cname}"] = lambda t=tile, c=chunk: prefill(
                q, k, v, pos, tile=t, chunk=c
            )
    for bm, bn, warps, stages in ((128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 4, 3),
                                  (64, 64, 4, 3), (128, 128, 8, 3)):  # fmt: skip
        for mode in FORWARD_MODES:
            for chunk in (0,) if mode == "plain" else (0, CHUNK, 512):
                if chunk and (bn > KEY_BLOCK):
                    continue
                kind = f"{mode}_chunk{chunk}" if chunk else f"{mode}_onechunk"
                rows[f"{kind}/{bm}x{bn}w{warps}s{stages}"] = (
                    lambda a=(bm, bn, warps, stages, mode, chunk): forward(q, k, v, *a)
                )
    results = {}
    for name, fn in rows.items():
        try:
            t = cuda_time(fn, repeats=10)
            results[name] = fn()
            out[f"{key}/{name}/over_sdpa_speed"] = sdpa / t
            out[f"{key}/{name}/tflops"] = flops / t / 1e12
        except Exception as exc:  # noqa: BLE001 - a tile this build refuses is a row too
            out[f"{key}/{name}/error"] = repr(exc)[:200]
        print(name, out.get(f"{key}/{name}/over_sdpa_speed"), flush=True)
    ref = forms["repeat"]().float()
    for name, res in results.items():
        out[f"{key}/{name}/max_abs_vs_sdpa"] = (res.float() - ref).abs().max().item()
    pairs = [("fma_chunk256/128x64w8s3", "zkl/128w8f/chunk256"),
             ("fma_onechunk/128x64w8s3", "zkl/128w8f/onechunk"),
             ("fma_chunk256/64x64w4s3", "zkl/64w4f/chunk256"),
             ("fma_chunk512/128x64w8s3", "zkl/128w8f/chunk512"),
             ("zkl/128w8n/chunk256", "zkl/128w8f/chunk256"),
             ("zkl/128w8i/chunk256", "zkl/128w8f/chunk256"),
             ("zkl/128w8i/onechunk", "zkl/128w8f/onechunk"),
             ("zkl/64w4i/chunk256", "zkl/64w4f/chunk256")]  # fmt: skip
    for a, b in pairs:
        if a in results and b in results:
            out[f"{key}/equal/{a}=={b}"] = bool(torch.equal(results[a], results[b]))
    del results
    torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    main()
