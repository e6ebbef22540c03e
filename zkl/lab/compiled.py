"""What a Triton kernel compiles to for a GPU this machine need not have: registers, spills,
shared memory and the SASS instruction mix (which matrix instruction, which loads).

A kernel that spills registers or loads its tiles through registers instead of asynchronous
copies is slow before it runs; that can be read from the compiler on any machine with
Triton's bundled `ptxas` and `cuobjdump`, which makes a kernel's shape a CPU question and
leaves only its speed to the GPU. Triton's compile entry (`ASTSource`, `GPUTarget`) is the
one its own ahead-of-time tool uses.

    python -m zkl.lab.compiled   # zero mode's attention kernels and the probe's candidates
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

HOPPER = 90
_SASS_OP = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)", re.M)
# SASS ops that load global memory without passing it through registers (cp.async, TMA)
ASYNC_LOADS = ("LDGSTS", "UBLKCP", "UTMALDG")


@dataclass(frozen=True)
class Compiled:
    name: str
    registers: int  # a thread's, as ptxas allocates them
    spill_bytes: int  # a thread's stack frame: its spilled registers (these kernels keep no arrays)
    shared_bytes: int
    ops: dict[str, int] = field(repr=False)

    @property
    def mma(self) -> str:
        """The matrix instruction: HGMMA (Hopper's warpgroup MMA), HMMA (mma.sync) or none."""
        return "HGMMA" if self.ops.get("HGMMA") else "HMMA" if self.ops.get("HMMA") else "none"

    @property
    def async_loads(self) -> int:
        return sum(self.ops.get(op, 0) for op in ASYNC_LOADS)

    def row(self) -> str:
        return (f"{self.name:44} regs {self.registers:3}  spills {self.spill_bytes:5} B  "
                f"shared {self.shared_bytes // 1024:3} KiB  {self.mma:5}  "
                f"async loads {self.async_loads:3}  "
                f"global loads {self.ops.get('LDG', 0):4}")  # fmt: skip


def specialized(
    fn: triton.JITFunction, types: dict[str, str], values: dict[str, int]
) -> tuple[dict, dict, dict]:
    """(signature, constants, attributes) as a launch would specialize `fn`: `types` by
    argument name ("*bf16", "fp32", ...; other arguments i32); a pointer taken as 16-byte
    aligned, an integer from `values` that is 1 made a constant and one divisible by 16 marked
    so (what lets the compiler vectorize and pipeline loads), except where the kernel says
    `do_not_specialize`."""
    sig, constants, attrs = {}, {}, {}
    for p in fn.params:
        if p.is_constexpr:
            sig[p.name] = "constexpr"
            continue
        sig[p.name] = types.get(p.name, "i32")
        if p.do_not_specialize:
            continue
        value = values.get(p.name)
        if sig[p.name].startswith("*") or (value is not None and value % 16 == 0):
            attrs[(p.num,)] = [["tt.divisibility", 16]]
        elif value == 1:
            sig[p.name] = "constexpr"
            constants[(p.num,)] = 1
    return sig, constants, attrs


def _bin(tool: str) -> str:
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool)


def compile_for(
    fn: triton.JITFunction,
    types: dict[str, str],
    constexprs: dict[str, object],
    values: dict[str, int] | None = None,
    num_warps: int = 4,
    fp_fusion: bool = False,
    arch: int = HOPPER,
    name: str | None = None,
) -> Compiled:
    """Compile `fn` for sm_`arch` (no GPU needed) and read the cubin's resource usage and
    SASS."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("zkl.lab.compiled needs Triton's compiler: unset TRITON_INTERPRET")
    sig, constants, attrs = specialized(fn, types, values or {})
    constants.update({(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    source = ASTSource(fn=fn, signature=sig, constexprs=constants, attrs=attrs)
    kernel = triton.compile(
        source,
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": num_warps, "enable_fp_fusion": fp_fusion},
    )
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp, "k.cubin")
        cubin.write_bytes(kernel.asm["cubin"])  # what ptxas made of it with Triton's options
        dump = subprocess.run(
            [_bin("cuobjdump"), "-res-usage", "-sass", str(cubin)],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    usage = re.search(r"REG:(\d+) STACK:(\d+)", dump)
    return Compiled(
        name=name or fn.__name__,
        registers=int(usage.group(1)),
        spill_bytes=int(usage.group(2)),
        shared_bytes=kernel.metadata.shared,
        ops=dict(collections.Counter(_SASS_OP.findall(dump))),
    )


def attention_strides(head_dim: int = 128, heads: int = 12, kv_heads: int = 2,
                      seq: int = 8192) -> dict[str, int]:  # fmt: skip
    """The integer arguments of zkl's attention kernels at the 1.5B's layer: q and the output
    [B, H, T, D] over [B, T, H, D] memory, k and v [B, Hkv, T, D], positions [B, T]."""
    q = {"s_qb": seq * heads * head_dim, "s_qh": head_dim, "s_qt": heads * head_dim}
    kv = {f"s_{t}b": kv_heads * seq * head_dim for t in "kv"}
    kv.update({f"s_{t}h": seq * head_dim for t in "kv"} | {f"s_{t}t": head_dim for t in "kv"})
    o = {"s_ob": seq * heads * head_dim, "s_oh": head_dim, "s_ot": heads * head_dim}
    sizes = {"num_heads": heads, "num_kv_heads": kv_heads, "groups": heads // kv_heads}
    return {**q, **kv, **o, "s_pb": seq, "s_pt": 1, **sizes, "max_chunks": seq // 256}


def attention_report(head_dim: int = 128) -> list[Compiled]:
    """Zero mode's Triton attention kernels at the 1.5B's head dim (bf16): each prefill tile
    candidate and the decode kernels, as sm_90 compiles them."""
    # optional: Triton is a CUDA extra, imported only when a report is asked for
    from zkl.ops.triton import attention_kernels as ak
    from zkl.ops.triton.attention_probe import PREFILL_TILES  # optional, as above

    ptrs = {n: "*bf16" for n in ("q_ptr", "k_ptr", "v_ptr", "out_ptr")}
    ptrs.update(pos_ptr="*i64", rows_ptr="*i64", sinks_ptr="*fp32", qk_scale="fp32")
    ptrs.update(part_m_ptr="*fp32", part_l_ptr="*fp32", part_o_ptr="*fp32")
    common = {"HAS_ROWS": False, "PRECISION": "tf32", "HEAD_DIM": head_dim, "BLOCK_D": head_dim}
    values = attention_strides(head_dim)
    out = []
    interior = [replace(t, interior=True) for t in PREFILL_TILES if not t.nested]
    for tile in (*PREFILL_TILES, *interior, ak.REFERENCE):
        constexprs = {**common, "HAS_SINKS": False, "BLOCK_M": tile.rows,
                      "BLOCK_N": ak.KEY_BLOCK, "CHUNK_KEYS": ak.CHUNK, "STAGES": tile.stages,
                      "NESTED": tile.nested, "INTERIOR": tile.interior}  # fmt: skip
        name = f"prefill {tile.rows}x{ak.KEY_BLOCK} w{tile.warps} s{tile.stages}"
        name += " nested" if tile.nested else " interior" if tile.interior else ""
        out.append(compile_for(ak._prefill_kernel, ptrs, constexprs, values, tile.warps, name=name))
    for rows in (ak.REF_M, 64):
        constexprs = {**common, "HAS_ROWS": True, "BLOCK_M": rows, "BLOCK_N": ak.KEY_BLOCK,
                      "CHUNK_KEYS": ak.CHUNK, "STAGES": 3}  # fmt: skip
        out.append(compile_for(ak._decode_chunks_kernel, ptrs, constexprs, values, ak.REF_WARPS,
                               name=f"decode chunks, {rows} rows"))  # fmt: skip
    constexprs = {"HAS_SINKS": False, "HEAD_DIM": head_dim, "BLOCK_D": 32, "BLOCK_M": ak.REF_M,
                  "CHUNK_KEYS": ak.CHUNK}  # fmt: skip
    out.append(compile_for(ak._combine_kernel, ptrs, constexprs, values, ak.REF_WARPS,
                           name="combine"))  # fmt: skip
    return out


def main() -> None:
    for compiled in attention_report():
        print(compiled.row())


if __name__ == "__main__":
    main()
