"""A W&B Report of a sweep's runs, built with wandb-workspaces (saving it needs W&B online).

The runs are selected by their W&B group (sweeps set `tracking.wandb.group` to the sweep's
name and time; otherwise RunLog derives one from the config axes). `build` only makes the
spec, which tests inspect offline; `publish` saves it to W&B.
"""

from __future__ import annotations

from typing import Any

from zkl.report.contents import markdown
from zkl.report.runs import KL, Sources

PANEL_METRICS = [KL, "train/max_abs_logprob_diff", "train/bitwise_equal_frac", "reward/mean"]


def groups(sources: Sources) -> list[str]:
    return sorted({r.wandb_group for r in sources.runs if r.wandb_group})


def build(sources: Sources, entity: str, project: str, title: str) -> Any:
    """The report: one run set per W&B group, per-step and final panels, the tables."""
    import wandb_workspaces.reports.v2 as wr

    runsets = [
        wr.Runset(entity=entity, project=project, name=g, filters=f"Group = '{g}'")
        for g in groups(sources)
    ]
    panels = [
        wr.LinePlot(title=f"{KL} per step (log)", x="Step", y=[KL], log_y=True),
        *(wr.LinePlot(title=m, x="Step", y=[m]) for m in PANEL_METRICS[1:]),
        wr.BarPlot(title=f"final {KL}", metrics=[KL], orientation="h"),
        wr.RunComparer(diff_only="split"),
    ]
    blocks = [
        wr.H1(title),
        wr.P(f"{len(sources.runs)} runs; metrics.jsonl of each run is the source of truth."),
        wr.PanelGrid(runsets=runsets, panels=panels),
        wr.MarkdownBlock(markdown(sources, title)),
    ]
    return wr.Report(project=project, entity=entity, title=title, blocks=blocks)


def publish(report: Any) -> str:
    """Save the report to W&B (online, logged in); returns its URL."""
    report.save()
    return report.url
