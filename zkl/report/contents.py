"""Every table of the report, in page order, and `report.md` made of the same list: the page
and the Markdown (a PR comment, the W&B Report's text) can never differ by a table.

The order is the page's: the winners and the Treatments table open it (what a reader of a
comparison asks first), then the common settings, the grid, the runs, what failed, the
ablation, the throughput and the certification.
"""

from __future__ import annotations

from zkl.report import treatments
from zkl.report.naming import Arms, arms_of
from zkl.report.runs import Sources
from zkl.report.summary import summary_markdown, winners_table
from zkl.report.tables import (
    Table,
    ablation,
    ablation_table,
    bench_table,
    cert_table,
    failed_table,
    grid_table,
    md_escape,
    runs_table,
    settings_table,
    skipped_table,
)

OPENING = ("winners", "treatments")  # the tables of the page's first screen


def all_tables(sources: Sources, arms: Arms | None = None) -> list[tuple[str, Table]]:
    """(id, table) of every table the report shows, in page order."""
    arms = arms or arms_of(sources.runs)
    candidates: list[tuple[str, Table | None]] = []
    if len(arms.runs) > 1:
        candidates.append(("winners", winners_table(arms)))
    treated = treatments.arms(sources, arms)
    if treated:
        candidates.append(("treatments", treatments.treatment_table(treated, arms)))
    candidates += [
        ("settings", settings_table(sources.runs)),
        ("grid", grid_table(sources.runs)),
        ("runs", runs_table(sources.runs) if sources.runs else None),
        ("failed", failed_table(sources.runs)),
        ("skipped", skipped_table(sources)),
    ]
    data = ablation(sources.runs)
    candidates.append(("ablation", ablation_table(data) if data else None))
    candidates += [("bench", bench_table(sources.bench)), ("cert", cert_table(sources.cert))]
    return [(table_id, table) for table_id, table in candidates if table is not None]


def markdown(sources: Sources, title: str) -> str:
    """The page's sentences and every one of its tables, for a PR comment."""
    arms = arms_of(sources.runs)
    parts = [f"## {md_escape(title)}"] + ([summary_markdown(arms)] if sources.runs else [])
    parts += [t.to_markdown() for _, t in all_tables(sources, arms)]
    return "\n\n".join(parts) + "\n"
