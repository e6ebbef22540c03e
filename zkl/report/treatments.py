"""The report's treatment grouping: runs of `sweeps/mismatch_treatments.yaml` (or any runs
that log the `rollout_corr/` diagnostics) grouped by mismatch treatment, one arm each.

A treatment is derived from a run's config: the precision, the MoE model, zero or default
mode, the correction (`rl.correction.mode`) and routing replay, e.g. `default+token_tis`,
`fp16 zero`, `tiny_moe default+replay`. Per step, every arm: reward, val/accuracy,
gen_kl_error and the diagnostics; the table: final accuracy, mean mismatch and step time.
"""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from zkl.report.runs import KL, Run, Sources
from zkl.report.tables import Cell, Table, cell

DIAGNOSTICS = (
    "rollout_corr/k3_kl",
    "rollout_corr/chi2_token",
    "rollout_corr/chi2_seq",
    "rollout_corr/eff_sample_size",
    "rollout_corr/log_ppl_abs_diff",
    "rollout_corr/ppl_ratio",
    "rollout_corr/masked_fraction",
    "rollout_corr/ratio_min",
    "rollout_corr/ratio_max",
)
TIMING = ("timing/gen_s", "timing/score_s", "timing/update_s", "timing/refit_s")
COLUMNS = [
    "treatment",
    "run",
    "steps",
    "val/accuracy final",
    "val/reward final",
    "reward final",
    "reward mean (last 20)",
    "gen_kl_error mean",
    "k3_kl mean",
    "chi2_token mean",
    "eff_sample_size mean",
    "masked_fraction mean",
    "routes differing (tokens)",
    "step time s",
]


def treatment(run: Run) -> str:
    """`[precision ][moe model ]zero|default[+correction][+replay]` from the run's config."""
    f = run.flat
    parts = []
    if f.get("precision.name", "bf16") != "bf16":
        parts.append(str(f["precision.name"]))
    if f.get("model.num_experts") or f.get("model.n_routed_experts"):
        parts.append(str(f.get("model.name")))
    mode = "zero" if f.get("zero_train_gen_mismatch", True) else "default"
    if f.get("rl.correction.mode", "none") != "none":
        mode += f"+{f['rl.correction.mode']}"
        if f.get("rl.correction.behavior") == "sampled":
            mode += "(sampled)"
    if f.get("rl.routing_replay"):
        mode += "+replay"
    return " ".join([*parts, mode])


def arms(sources: Sources) -> list[Run]:
    """The runs of a treatment comparison, in a fixed order; [] when this is not one."""
    runs = [
        r for r in sources.runs if r.rows and any(k.startswith("rollout_corr/") for k in r.rows[0])
    ]
    if len({treatment(r) for r in runs}) < 2:
        return []
    return sorted(runs, key=lambda r: (treatment(r), r.name))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _step_time(run: Run) -> float | None:
    times = [sum(row.get(k, 0.0) for k in TIMING) for row in run.rows if TIMING[0] in row]
    return _mean(times)


def treatment_table(runs: list[Run]) -> Table:
    table = Table("Treatments", list(COLUMNS))
    for run in runs:
        val = run.series("val/accuracy")
        val_reward = run.series("val/reward")
        reward = run.series("reward/mean")
        routes = run.series("routing/token_mismatch_frac")
        values: list[Any] = [
            len(run.rows),
            val[-1] if val else None,
            val_reward[-1] if val_reward else None,
            reward[-1] if reward else None,
            _mean(reward[-20:]),
            _mean(run.series(KL)),
            _mean(run.series("rollout_corr/k3_kl")),
            _mean(run.series("rollout_corr/chi2_token")),
            _mean(run.series("rollout_corr/eff_sample_size")),
            _mean(run.series("rollout_corr/masked_fraction")),
            _mean(routes),
            _step_time(run),
        ]
        table.rows.append([Cell(treatment(run)), Cell(run.name), *map(cell, values)])
    table.note = (
        "One arm a row: val/accuracy at the last validation, means over every step; routes "
        "differing: the share of tokens whose experts the trainer's router would change "
        "(MoE arms that record routes); step time: generation + scoring + update + refit."
    )
    return table


def step_figure(runs: list[Run], key: str, zero_band) -> go.Figure:
    """`key` per step for every arm; gen_kl_error and the diagnostics on the report's
    zero-band axes (exact zeros kept), reward and val/accuracy on a linear axis."""
    series = []
    for run in runs:
        points = run.points(key)
        series.append(
            (f"{treatment(run)} ({run.name})", [x for x, _ in points], [y for _, y in points])
        )
    if key in ("reward/mean", "val/accuracy", "val/reward") or key.endswith(
        ("ratio_min", "ratio_max", "ppl_ratio", "eff_sample_size")
    ):
        fig = go.Figure()
        for name, xs, ys in series:
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=html.escape(name)))
        fig.update_layout(title=f"{key} per step, every treatment", xaxis_title="step",
                          yaxis_title=key, margin={"l": 70, "r": 20, "t": 50, "b": 50})  # fmt: skip
        return fig
    return zero_band(f"{key} per step, every treatment", series, "step", key)


def figures(runs: list[Run], zero_band) -> list[tuple[str, go.Figure]]:
    """(div id, figure) for reward, val/accuracy, gen_kl_error and each diagnostic."""
    keys = (
        "reward/mean",
        "val/accuracy",
        "val/reward",
        KL,
        "routing/token_mismatch_frac",
        *DIAGNOSTICS,
    )
    out = []
    for key in keys:
        if any(run.series(key) for run in runs):
            div = "treatment-" + key.replace("/", "-").replace("_", "-")
            out.append((div, step_figure(runs, key, zero_band)))
    return out
