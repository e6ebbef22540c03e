"""The named fixes (docs/design.md section 4) and the one scoped switch that turns them on.

Every mismatch source is a registry entry with a stable name, its cause and its remedy, and
what else is known of it: the run that can expose it (`python -m zkl.cert cert.ablate=true`),
the layers its source lives in, why the CPU shows nothing of it, the state a generator
without it carries across refits (which a checkpoint does not hold), and whether without it a
colocated generator keeps a copy of the weights of its own (the memory estimate counts it).
Code that has a fast path and an invariant path asks `is_enabled(name)` (the kernels ask
through `zkl.ops`' table, which names each op's fix); the trainer and the generator run
inside the same `enabled(...)` scope, so a sweep can turn one fix off (`fixes.<name>=false`)
and attribute the gap to that source. The set of fixes on is a `zkl.switch.Switch`, the
mechanism behind every process-wide switch.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from zkl.switch import Switch


@dataclass(frozen=True)
class Exposure:
    """The run that can expose a fix's source (its ablation's mode, zkl/cert/ablation.py): the
    step-0 schedules, or with `refits` GRPO steps (at least two) with updates and refits; in
    `precision` and with `kv` mode where set, else the bed's."""

    refits: bool = False
    precision: str | None = None
    kv: str | None = None


STEP0 = Exposure()
# a prefix cache and quantized weights that outlive a refit
REFITS = Exposure(refits=True, precision="mxfp8", kv="persist")


@dataclass(frozen=True)
class Stale:
    """State a generator without the fix keeps from older weights across a refit: `what` it
    is, in a run whose config `key` is not `free` (a checkpoint does not save it, so such a
    run cannot resume bitwise: zkl/state/resume.py)."""

    what: str
    key: str
    free: str


@dataclass(frozen=True)
class Fix:
    name: str
    cause: str
    remedy: str
    test: str  # the test that shows the mismatch with the fix off and zero with it on
    exposure: Exposure = STEP0
    layer: str | None = None  # the layer kind its source lives in (moe, mamba); None: every model
    # measured on the CPU: why turning it off shows nothing there (`{hidden_size}` and
    # the other model numbers are the model's)
    cpu_silent: str = ""
    stale: Stale | None = None
    # off, a colocated generator holds a copy of the weights of its own (the refit casts them)
    off_copies_weights: bool = False


FIXES: dict[str, Fix] = {}


def register(name: str, cause: str, remedy: str, test: str, **known: Any) -> Fix:
    """Add fix `name`; `known`: the rest of its record (`Fix`)."""
    if name in FIXES:
        raise KeyError(f"fix {name!r} is registered twice")
    FIXES[name] = Fix(name, cause, remedy, test, **known)
    return FIXES[name]


register(
    "batch_invariant_gemm",
    "the GEMM kernel and its K-reduction order (split-K on a GPU) are chosen by the row count M",
    "CPU: every GEMM runs on fixed 16-row tiles; CUDA: one Triton tile config walking K in "
    "order; a row's result never depends on M",
    "tests/ops/test_ops.py::test_gemm_rows_independent_of_batch",
    # on this CPU bf16 GEMM rows depend on the row count only for some shapes, fp32 ones for more
    exposure=Exposure(precision="fp32"),
)
register(
    "batch_invariant_reductions",
    "norm / softmax-sum reductions may split a row differently by shape",
    "CPU: row sums are a fixed pairwise tree of elementwise adds; CUDA: one program per row",
    "tests/ops/test_ops.py::test_rms_norm_reduction_order",
    cpu_silent="the CPU splits a row sum by shape only for rows of about 65,536 elements on "
    "several threads; this model's norm rows have {hidden_size}",
)
register(
    "attention_fixed_split",
    "decode attention (1 query vs the cache) reduces keys in another order than prefill",
    "KV goes to the cache first; one kernel walks keys in fixed blocks from position 0",
    "tests/ops/test_ops.py::test_attention_decode_equals_prefill",
)
register(
    "logprob_path",
    "the generator computes logprobs of the logits / temperature (unfiltered: top-k / top-p "
    "shape only the sampling) in the model dtype",
    "one shared fp32 log-softmax of raw logits / temperature for generator and trainer",
    "tests/generation/test_generation.py::test_logprob_path_fix",
)
register(
    "moe_combine_order",
    "expert outputs are added in dispatch order, in the activation dtype, with a bf16 router",
    "fp32 router, stable top-k tie-break, fp32 combine per token in top-k slot order",
    "tests/ops/test_ops.py::test_moe_combine_independent_of_dispatch_order",
    layer="moe",
    cpu_silent="the CPU adds expert outputs in one fixed dispatch order on both paths",
)
register(
    "mamba_chunked_decode",
    "prefill and training run the chunked SSD scan, decode the one-step recurrence on a "
    "state cached in the model dtype",
    "decode re-runs the chunk-scan math over the buffered partial chunk from an fp32 "
    "chunk-boundary state, committing the state when the chunk fills",
    "tests/models/test_mamba.py::test_mamba_chunked_decode_fix",
    layer="mamba",
)
register(
    "kv_invalidate_on_refit",
    "prefix-cache KV computed with old weights is reused after a refit",
    "cache entries carry the weight version; a lookup only hits the current version",
    "tests/rl/test_rl.py::test_stale_prefix_cache_after_refit",
    exposure=REFITS,
    stale=Stale("stale prefix cache", key="kv.mode", free="recompute"),
)
register(
    "refit_exactness",
    "refit converts every tensor to the generator dtype (fp32 norms/router become bf16)",
    "refit copies exactly the tensors the trainer's forward used, bit for bit, all or nothing",
    "tests/rl/test_rl.py::test_refit_exactness",
    exposure=REFITS,
    off_copies_weights=True,
)
register(
    "quantized_weight_refresh",
    "the generator's cached quantized weights keep their pre-refit values",
    "every refit drops the cache, so weights are re-quantized from the refitted values",
    "tests/precision/test_precision.py::test_stale_quantized_weights_after_refit",
    exposure=REFITS,
    stale=Stale("stale quantized weights", key="precision.linear_quant", free="none"),
)

# The `fixes` config group: one `fixes.<name>` key a registered fix, built from the registry
# so a new fix gets its key by being registered.
FixesConfig = dataclasses.make_dataclass(
    "FixesConfig",
    [
        (name, bool | None, dataclasses.field(default=None, metadata={"help": fix.cause}))
        for name, fix in FIXES.items()
    ],
)
FixesConfig.__module__ = __name__
FixesConfig.__doc__ = "null: follow `zero_train_gen_mismatch`; true/false: force one fix."

_ACTIVE: Switch[frozenset[str]] = Switch("fixes", frozenset())


def resolve(zero_train_gen_mismatch: bool, overrides: Mapping[str, bool | None]) -> frozenset[str]:
    """The set of fixes on: the master switch, then each non-null `fixes.<name>` override."""
    unknown = set(overrides) - set(FIXES)
    if unknown:
        raise ValueError(f"fixes.{sorted(unknown)[0]} is not a known fix; known: {sorted(FIXES)}.")
    on = set(FIXES) if zero_train_gen_mismatch else set()
    for name, value in overrides.items():
        if value is True:
            on.add(name)
        elif value is False:
            on.discard(name)
    return frozenset(on)


def from_config(cfg) -> frozenset[str]:
    """The fixes a config turns on: its master switch, then its `fixes.<name>` overrides.

    Takes the typed ZklConfig or a DictConfig read back from a run's config.yaml.
    """
    fixes = cfg.fixes
    overrides = dict(fixes.items()) if hasattr(fixes, "items") else vars(fixes)
    return resolve(cfg.zero_train_gen_mismatch, overrides)


@contextlib.contextmanager
def enabled(names: Iterable[str]) -> Iterator[frozenset[str]]:
    """Turn exactly `names` on for the duration of the block; the previous set comes back."""
    names = frozenset(names)
    unknown = names - set(FIXES)
    if unknown:
        raise ValueError(f"unknown fixes {sorted(unknown)}")
    with _ACTIVE.scoped(names):
        yield names


def is_enabled(name: str) -> bool:
    if name not in FIXES:
        raise KeyError(f"unknown fix {name!r}")
    return name in _ACTIVE.get()


def active() -> frozenset[str]:
    return _ACTIVE.get()


def label(on: Iterable[str]) -> str:
    """A name for a set of fixes, fit for folders and W&B groups: `all_fixes`, `no_fixes`,
    `minus_<a>+<b>` (those off) or, when fewer are on than off, `only_<a>+<b>`."""
    on = set(on)
    off = [name for name in FIXES if name not in on]
    if not off:
        return "all_fixes"
    if not on:
        return "no_fixes"
    if len(on) < len(off):
        return "only_" + "+".join(name for name in FIXES if name in on)
    return "minus_" + "+".join(off)
