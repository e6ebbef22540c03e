"""The report's treatment comparison: runs of `sweeps/mismatch_treatments.yaml` (or any runs
that log the `rollout_corr/` diagnostics under two treatments or more), one arm each, named
by treatment (zkl/report/naming.py).

The table: one arm a row, with its final accuracy, mean mismatch and step time. The figures:
the diagnostics per step for every arm (reward, val/accuracy and gen_kl_error are the
page's figures of every run, drawn above these). A signed diagnostic (chi2, the ratio's
bounds) goes on a linear axis; the others on the zero-band axes, where exact zeros are kept.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from zkl.report.figures import Curve, line_figure, zero_band_figure
from zkl.report.naming import Arms, arms_of, compares_treatments, logs_diagnostics, treatment
from zkl.report.runs import KL, Run, Sources
from zkl.report.summary import mean, step_time
from zkl.report.tables import Cell, Table, cell

__all__ = ["arms", "figures", "treatment", "treatment_table"]

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
# Drawn on a linear axis: signed by definition (chi2 = E[rho^2] - 1) or centred on 1.
LINEAR = ("val/reward", "rollout_corr/chi2_token", "rollout_corr/chi2_seq",
          "rollout_corr/eff_sample_size", "rollout_corr/ppl_ratio", "rollout_corr/ratio_min",
          "rollout_corr/ratio_max")  # fmt: skip
COLUMNS = [
    "arm",
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


def arms(sources: Sources, named: Arms | None = None) -> list[Run]:
    """The runs of a treatment comparison, in the arms' order; [] when this is not one."""
    if not compares_treatments(sources.runs):
        return []
    named = named or arms_of(sources.runs)
    return [r for r in named.runs if logs_diagnostics(r)]


def treatment_table(runs: list[Run], named: Arms) -> Table:
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
            mean(reward[-20:]),
            mean(run.series(KL)),
            mean(run.series("rollout_corr/k3_kl")),
            mean(run.series("rollout_corr/chi2_token")),
            mean(run.series("rollout_corr/eff_sample_size")),
            mean(run.series("rollout_corr/masked_fraction")),
            mean(routes),
            step_time(run),
        ]
        table.rows.append([Cell(named.name(run)), Cell(run.name), *map(cell, values)])
    table.note = (
        "One arm a row: val/accuracy at the last validation, means over every step; routes "
        "differing: the share of tokens whose experts the trainer's router would change "
        "(MoE arms that record routes); step time: generation + scoring + update + refit."
    )
    return table


def step_figure(runs: list[Run], named: Arms, key: str) -> go.Figure:
    """`key` per step for every arm that logged it, in the arm's style."""
    curves = []
    for run in runs:
        points = run.points(key)
        if points:
            xs, ys = [x for x, _ in points], [y for _, y in points]
            curves.append(Curve(named.name(run), xs, ys, named.style(run)))
    title = f"{key} per step, every arm"
    if key in LINEAR:
        return line_figure(title, curves, "step", key)
    return zero_band_figure(title, curves, "step", key)


def figures(runs: list[Run], named: Arms) -> list[tuple[str, go.Figure]]:
    """(div id, figure) for val/reward, the routes differing and each diagnostic."""
    out = []
    for key in ("val/reward", "routing/token_mismatch_frac", *DIAGNOSTICS):
        if any(run.series(key) for run in runs):
            div = "treatment-" + key.replace("/", "-").replace("_", "-")
            out.append((div, step_figure(runs, named, key)))
    return out
