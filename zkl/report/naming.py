"""The arms of a comparison and their names: one rule for the summary, the tables and every
legend, and one order, which gives each arm its style (zkl/report/style.py).

The arms are the runs that logged a step. In a treatment comparison (runs that log the
`rollout_corr/` diagnostics under at least two treatments) an arm is named by its treatment,
derived from its config: the precision, the MoE model, zero or default mode, the correction
(`rl.correction.mode`) and routing replay, e.g. `default+token_tis`, `fp16 zero`,
`tiny_moe default+replay`. Arms that share a treatment add the values of the axes that tell
them apart (`zero seed=1`). Any other comparison names a run by its values on the sweep's
axes (zkl/report/axes.py: `tiny_moe mxfp8 kv=persist all_fixes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zkl.report.axes import label, labels, sweep_axes
from zkl.report.runs import Run
from zkl.report.style import Style, style
from zkl.report.tables import ordered

DIAGNOSTICS_PREFIX = "rollout_corr/"


def treatment(run: Run) -> str:
    """`[precision ][moe model ]zero|default[+correction][+replay]` from the run's config."""
    f = run.flat
    parts = []
    if f.get("precision.name", "bf16") != "bf16":
        parts.append(str(f["precision.name"]))
    if f.get("model.moe.num_experts"):
        parts.append(str(f.get("model.name")))
    mode = "zero" if f.get("zero_train_gen_mismatch", True) else "default"
    if f.get("rl.correction.mode", "none") != "none":
        mode += f"+{f['rl.correction.mode']}"
        if f.get("rl.correction.behavior") == "sampled":
            mode += "(sampled)"
    if f.get("rl.routing_replay"):
        mode += "+replay"
    return " ".join([*parts, mode])


def logs_diagnostics(run: Run) -> bool:
    return bool(run.rows) and any(k.startswith(DIAGNOSTICS_PREFIX) for k in run.rows[0])


def compares_treatments(runs: list[Run]) -> bool:
    """The runs log the off-policy diagnostics under two treatments or more."""
    return len({treatment(r) for r in runs if r.config and logs_diagnostics(r)}) > 1


@dataclass
class Arms:
    runs: list[Run]  # the runs that logged a step, in the report's one order
    names: dict[str, str]  # run name -> arm name (a run that is no arm: its run name)
    by_treatment: bool
    styles: dict[str, Style] = field(init=False)

    def __post_init__(self) -> None:
        self.styles = {r.name: style(i) for i, r in enumerate(self.runs)}

    def name(self, run: Run) -> str:
        return self.names.get(run.name, run.name)

    def style(self, run: Run) -> Style:
        return self.styles.get(run.name) or style(len(self.runs))


def arms_of(runs: list[Run]) -> Arms:
    """The arms, their names and their order (see the module's docstring)."""
    logged = [r for r in runs if r.rows]
    if compares_treatments(runs):
        names = _treatment_names([r for r in logged if r.config])
        names |= {r.name: r.name for r in logged if not r.config}
        order = sorted(logged, key=lambda r: (names[r.name], r.name))
        return Arms(order, names, by_treatment=True)
    axes = sweep_axes(runs)
    named = labels(runs, axes)
    return Arms(ordered(logged, axes), {r.name: named[r.name] for r in logged}, False)


def _treatment_names(runs: list[Run]) -> dict[str, str]:
    """Each run's treatment; runs sharing one add the axes that differ among them, and the
    run's name where nothing does."""
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(treatment(r), []).append(r)
    out = {}
    for name, group in groups.items():
        if len(group) == 1:
            out[group[0].name] = name
            continue
        axes = sweep_axes(group)
        texts = {r.name: " ".join(x for x in (name, label(r, axes)) if x) for r in group}
        for r in group:
            repeated = list(texts.values()).count(texts[r.name]) > 1
            out[r.name] = f"{texts[r.name]} ({r.name})" if repeated else texts[r.name]
    return out
