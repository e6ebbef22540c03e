"""What each fix contributes: `python -m zkl.cert cert.ablate=true` turns one fix off at a time.

A fix can only show where its source of mismatch is exercised, so each runs in the mode its
registry entry says can expose it (`zkl.invariance.Fix.exposure`): the kernel fixes on the
step-0 schedules (batches that change size and mix prompt lengths); `batch_invariant_gemm`
in fp32; the refit fixes in a run of at least two steps with kv=persist and precision=mxfp8.
Every row names its mode and is judged against all fixes on in that same mode; a fix that
shows nothing says why where its entry knows (`layer`, `cpu_silent`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from zkl import invariance
from zkl.cert.schema import CertRunConfig
from zkl.device import resolve_device
from zkl.run.compose import with_group_option

LAYER_WORDS = {"moe": "MoE", "mamba": "Mamba"}  # a fix's `layer`, as a sentence names it


@dataclass(frozen=True)
class Mode:
    """How a run is certified: step-0 schedules or N GRPO steps, and what it changes."""

    steps: int = 0  # 0: step-0 schedules; N: N GRPO steps with updates and refits
    precision: str | None = None  # None: the bed's own
    kv: str | None = None

    def __str__(self) -> str:
        parts = ["step0" if self.steps == 0 else f"steps{self.steps}"]
        parts += [p for p in (self.precision, self.kv and f"kv_{self.kv}") if p]
        return "-".join(parts)


def mode_for(fix: str, cert_steps: int) -> Mode:
    """The mode that can expose `fix` (its entry's `exposure`)."""
    exposure = invariance.FIXES[fix].exposure
    steps = max(2, cert_steps) if exposure.refits else 0
    return Mode(steps=steps, precision=exposure.precision, kv=exposure.kv)


def in_mode(bed: CertRunConfig, mode: Mode) -> CertRunConfig:
    cfg = bed
    if mode.precision:
        cfg = with_group_option(cfg, "precision", mode.precision)
    if mode.kv:
        cfg = with_group_option(cfg, "kv", mode.kv)
    return dataclasses.replace(cfg, cert=dataclasses.replace(cfg.cert, steps=mode.steps))


def variants(bed: CertRunConfig) -> list[tuple[str, Mode, CertRunConfig, CertRunConfig]]:
    """(fix, mode, all of the bed's fixes in that mode, the same with `fix` off) per fix on."""
    out = []
    for fix in invariance.FIXES:
        if fix in invariance.from_config(bed):
            mode = mode_for(fix, bed.cert.steps)
            reference = in_mode(bed, mode)
            off = dataclasses.replace(reference.fixes, **{fix: False})
            out.append((fix, mode, reference, dataclasses.replace(reference, fixes=off)))
    return out


def why_no_effect(fix: str, cfg: CertRunConfig) -> str | None:
    """The known reason `fix` cannot show in this run, if there is one: the model has none of
    the layers its source lives in, or (measured on the CPU; on CUDA none is claimed)
    the CPU computes its source one way on both paths."""
    entry = invariance.FIXES[fix]
    if entry.layer and not cfg.model.has_layer(entry.layer):
        return f"{cfg.model.name} has no {LAYER_WORDS[entry.layer]} layer"
    if resolve_device(cfg.device).type != "cpu" or not entry.cpu_silent:
        return None
    return entry.cpu_silent.format_map(vars(cfg.model))


def verdict(fix: str, cfg: CertRunConfig, row: dict[str, Any], reference: dict[str, Any]) -> str:
    """What turning `fix` off did in `row`, against all fixes on in the same mode."""
    if not reference["passed"]:
        return "unattributable: all fixes on is not exact in this mode"
    if row["train/max_abs_logprob_diff"] != 0.0:
        return "contributes error"
    if row["reasons"]:
        return f"inconclusive: {row['reasons'][0]}"
    reason = why_no_effect(fix, cfg)
    return f"no effect: {reason}" if reason else "no effect in this mode"
