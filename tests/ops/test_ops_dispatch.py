"""`zkl.ops`' table and its one rule: every op's four forms run and agree, and turning a fix
off changes exactly the ops the table assigns to that fix.

The CUDA forms run on the device where there is one, else in Triton's interpreter on CPU
tensors (tiny fp32/fp16 shapes: the interpreter's bf16 `tl.dot` is wrong, docs/design.md
section 3). Agreement here is within a tolerance: the forms differ in reduction order by
design; the bitwise claims of each fix are made by the fix's own test.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable

import pytest
import torch

from tests.conftest import INTERPRETED, rope_tables
from zkl import invariance, ops
from zkl.generation.slots import SlotState

# What docs/design.md section 4 promises; the table must assign exactly this.
GOVERNED = {
    "batch_invariant_gemm": {"linear", "grouped_linear"},
    "batch_invariant_reductions": {"rms_norm", "add_rms_norm", "softmax", "token_logprobs"},
    "attention_fixed_split": {"attention"},
}
# The ops whose CPU reference is torch's own kernel in both cells (measured row-invariant).
ONE_CPU_FORM = {"softmax", "token_logprobs"}
CELLS = ("cpu_fast", "cpu_invariant", "cuda_fast", "cuda_invariant")


def _cuda_forms_device() -> str | None:
    """Where the CUDA forms run here: the GPU, the interpreter on the CPU, or nowhere."""
    if importlib.util.find_spec("triton") is None:
        return None
    if torch.cuda.is_available():
        return "cuda"
    return "cpu" if INTERPRETED else None


def _randn(*shape, dtype=torch.float32, device="cpu", seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + len(shape) * 7 + sum(shape))
    return torch.randn(*shape, generator=g).to(device, dtype)


# Each example builds fresh seeded inputs on `device` in `dtype`, runs `form`, and returns
# what the op produced (its outputs, or the tensors it updates in place).


def _linear(form, dtype, device):
    x, w, b = (
        _randn(5, 32, dtype=dtype, device=device),
        _randn(24, 32, dtype=dtype, device=device),
        _randn(24, dtype=dtype, device=device),
    )
    return [form(x, w, b)]


def _grouped_linear(form, dtype, device):
    weights = [_randn(24, 32, dtype=dtype, device=device, seed=e) for e in range(3)]
    x = _randn(8, 32, dtype=dtype, device=device)
    offsets = torch.tensor([0, 3, 3, 8], device=device)  # an empty group in the middle
    return [form(x, weights, offsets)]


def _rms_norm(form, dtype, device):
    x = _randn(3, 4, 48, dtype=dtype, device=device)
    return [
        form(x, torch.rand(48, generator=torch.Generator().manual_seed(1)).to(device) + 0.5, 1e-6)
    ]


def _add_rms_norm(form, dtype, device):
    x, delta = (
        _randn(3, 4, 48, dtype=dtype, device=device),
        _randn(3, 4, 48, dtype=dtype, device=device, seed=1),
    )
    return list(form(x, delta, torch.ones(48, device=device) * 1.5, 1e-6))


def _softmax(form, dtype, device):
    return [form(_randn(6, 10, dtype=dtype, device=device))]


def _token_logprobs(form, dtype, device):
    logits = _randn(2, 3, 40, dtype=dtype, device=device)
    tokens = torch.tensor([[1, 39, 7], [0, 5, 22]], device=device)
    return [form(logits, tokens, 0.7)]


def _attention(form, dtype, device):
    """A whole prefill (queries are the keys) and a decode step over cache rows."""
    q, k, v = (
        _randn(2, h, 5, 16, dtype=dtype, device=device, seed=s) for s, h in enumerate((4, 2, 2))
    )
    whole = form(q, k, v, torch.arange(5, device=device).expand(2, 5))
    q1 = _randn(2, 4, 1, 16, dtype=dtype, device=device, seed=3)
    cache_k, cache_v = (_randn(3, 2, 20, 16, dtype=dtype, device=device, seed=s) for s in (4, 5))
    q_pos, rows = torch.tensor([[7], [12]], device=device), torch.tensor([2, 0], device=device)
    return [whole, form(q1, cache_k, cache_v, q_pos, rows)]


def _rope(device):
    rope = rope_tables(16, 64, 10000.0)
    positions = torch.arange(5).expand(3, 5) + torch.tensor([[0], [7], [30]])
    return rope.cos.to(device), rope.sin.to(device), positions.to(device)


def _rotary(form, dtype, device):
    q, k = (
        _randn(3, 5, 4, 16, dtype=dtype, device=device),
        _randn(3, 5, 2, 16, dtype=dtype, device=device, seed=1),
    )
    return list(form(q, k, *_rope(device)))


def _rotary_into_cache(form, dtype, device):
    q, k, v = (
        _randn(3, 5, h, 16, dtype=dtype, device=device, seed=s) for s, h in enumerate((4, 2, 2))
    )
    cache_k, cache_v = (
        torch.full((4, 2, 48, 16), 7.0, dtype=dtype, device=device) for _ in range(2)
    )
    slots = torch.tensor([3, 0, 2], device=device)
    return [form(q, k, v, *_rope(device), cache_k, cache_v, slots), cache_k, cache_v]


def _silu_mul(form, dtype, device):
    return [
        form(
            _randn(3, 40, dtype=dtype, device=device),
            _randn(3, 40, dtype=dtype, device=device, seed=1),
        )
    ]


def _gumbel_argmax(form, dtype, device):
    """One row (the interpreter runs the kernel's 64 programs a row one by one), a seed past
    2^32 and a temperature divided in the pass."""
    scores = _randn(1, 50, dtype=dtype, device=device) * 3
    seeds, counters = torch.tensor([2**40 + 3], device=device), torch.tensor([5], device=device)
    return [form(scores, seeds, counters, torch.tensor([0.7], device=device))]


def _commit_samples(form, dtype, device):
    state = SlotState(6, 4, torch.device(device))
    state.done[:] = torch.tensor([False, True, False, False, False, True])
    state.count[:] = torch.tensor([0, 2, 3, 1, 4, 0])
    state.max_new[:] = torch.tensor([4, 4, 4, 2, 6, 4])
    rows = torch.tensor([4, 0, 1, 3, 2], device=device)
    tokens = torch.tensor([5, 9, 8, 2, 3], device=device)
    logprobs = torch.tensor([-0.5, -1.5, -2.5, -3.5, -4.5], device=device)
    form(state, rows, tokens, logprobs, 9)
    return [state.token, state.pos, state.count, state.done, state.out_tokens, state.out_logprobs]


def _ssd_commit_rows_(form, dtype, device):
    """The state is fp32 in every recipe; `dtype` does not apply."""
    chunk, heads, width, depth = 6, 3, 10, 12
    state = _randn(5, heads, width, depth, device=device)
    B = _randn(4, 1, chunk, heads, depth, device=device, seed=1)
    cum = -torch.rand(4, 1, chunk, heads, generator=torch.Generator().manual_seed(2)).cumsum(2)
    xdt = _randn(4, 1, chunk, heads, width, device=device, seed=3)
    slots, full = (
        torch.tensor([3, 0, 4, 1], device=device),
        torch.tensor([True, False, True, True], device=device),
    )
    form(state, slots, full, B, cum.to(device), xdt)
    return [state]


EXAMPLES: dict[str, Callable] = {
    "linear": _linear,
    "grouped_linear": _grouped_linear,
    "rms_norm": _rms_norm,
    "add_rms_norm": _add_rms_norm,
    "softmax": _softmax,
    "token_logprobs": _token_logprobs,
    "attention": _attention,
    "rotary": _rotary,
    "rotary_into_cache": _rotary_into_cache,
    "silu_mul": _silu_mul,
    "gumbel_argmax": _gumbel_argmax,
    "commit_samples": _commit_samples,
    "ssd_commit_rows_": _ssd_commit_rows_,
}


def test_every_op_in_the_table_has_an_example_and_a_public_function():
    assert set(EXAMPLES) == set(ops.TABLE)
    for name in ops.TABLE:
        assert callable(getattr(ops, name)), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_each_of_the_four_forms_runs_and_agrees_with_the_cpu_fast_form(name, dtype):
    cuda_device = _cuda_forms_device()
    if cuda_device is None:
        pytest.skip("the CUDA forms need Triton (a GPU or TRITON_INTERPRET=1)")
    op = ops.TABLE[name]
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    with torch.no_grad():
        want = EXAMPLES[name](op.cpu_fast, dtype, "cpu")
        for cell in CELLS[1:]:
            if getattr(op, cell) == getattr(op, CELLS[CELLS.index(cell) - 1]):
                continue  # the cell beside it holds the same form: it ran already
            device = cuda_device if cell.startswith("cuda") else "cpu"
            got = EXAMPLES[name](getattr(op, cell), dtype, device)
            assert len(got) == len(want), cell
            for out, ref in zip(got, want):
                assert out.shape == ref.shape and out.dtype == ref.dtype, (cell, out.shape)
                torch.testing.assert_close(out.cpu(), ref, **tol, msg=f"{name} {cell}")


def _picks(fixes) -> dict[tuple[str, str], Callable]:
    """The form `ops.dispatch` picks for every op on each device under `fixes`."""
    with invariance.enabled(fixes):
        return {
            (name, device): ops.dispatch(name, device == "cuda")
            for name in ops.TABLE
            for device in ("cpu", "cuda")
        }


def test_the_table_assigns_each_fix_its_ops():
    assigned = {
        fix: {n for n, op in ops.TABLE.items() if op.fix == fix} for fix in invariance.FIXES
    }
    assert {fix: names for fix, names in assigned.items() if names} == GOVERNED
    for name, op in ops.TABLE.items():  # an op without a fix: one form per device, stated
        assert op.fix is not None or (
            op.cpu_fast is op.cpu_invariant and op.cuda_fast == op.cuda_invariant
        )
        cells = {cell: getattr(op, cell) for cell in CELLS}
        if op.fix is not None:  # on CUDA every governed op has two forms
            assert cells["cuda_fast"] != cells["cuda_invariant"], name
            assert (cells["cpu_fast"] is cells["cpu_invariant"]) == (name in ONE_CPU_FORM), name


def test_turning_a_fix_off_changes_exactly_the_ops_the_table_assigns_to_it():
    everything = set(invariance.FIXES)
    all_on, all_off = _picks(everything), _picks(set())
    for (name, device), form in all_on.items():
        op = ops.TABLE[name]
        assert form == op.form(device == "cuda", op.fix is not None)
        assert all_off[name, device] == op.form(device == "cuda", False)
    for fix in invariance.FIXES:
        governed = GOVERNED.get(fix, set())
        one_off, only_this = _picks(everything - {fix}), _picks({fix})
        for device in ("cpu", "cuda"):
            expected = governed - ONE_CPU_FORM if device == "cpu" else governed
            changed = {n for (n, d) in all_on if d == device and one_off[n, d] != all_on[n, d]}
            assert changed == expected, (fix, device)
            alone = {n for (n, d) in all_off if d == device and only_this[n, d] != all_off[n, d]}
            assert alone == expected, (fix, device)


@pytest.mark.parametrize("fixed", [True, False], ids=["fixes_on", "fixes_off"])
def test_each_public_op_runs_the_form_dispatch_picks(fixed, monkeypatch):
    """Every public op of `zkl.ops` reads its own table row and the device of its tensors:
    with recording forms in every cell, CPU tensors run the CPU cell of the fix state."""
    ran: list[tuple[str, str]] = []

    def recorder(name: str, cell: str, real: Callable) -> Callable:
        def form(*args, **kwargs):
            ran.append((name, cell))
            return real(*args, **kwargs)

        return form

    for name, op in ops.TABLE.items():
        if op.fix is None:  # one recorder per device, in both of its cells
            cpu, cuda = recorder(name, "cpu", op.cpu_fast), recorder(name, "cuda", op.cuda_fast)
            forms = {
                "cpu_fast": cpu,
                "cpu_invariant": cpu,
                "cuda_fast": cuda,
                "cuda_invariant": cuda,
            }
        else:
            forms = {cell: recorder(name, cell, getattr(op, cell)) for cell in CELLS}
        monkeypatch.setitem(ops.TABLE, name, dataclasses.replace(op, **forms))
    with invariance.enabled(invariance.FIXES if fixed else ()), torch.no_grad():
        for name, example in EXAMPLES.items():
            ran.clear()
            example(getattr(ops, name), torch.float32, "cpu")
            fix = ops.TABLE[name].fix
            want = "cpu" if fix is None else ("cpu_invariant" if fixed else "cpu_fast")
            assert set(ran) == {(name, want)}, (name, ran)
