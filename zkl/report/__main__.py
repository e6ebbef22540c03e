"""`python -m zkl.report DIR [DIR ...]`: one static HTML page comparing the runs under DIRs.

DIRs are sweep directories (Hydra multirun roots) or run directories. Writes `report.html`
(opens offline) and `report.md` (the same tables, for a PR comment) into the first DIR unless
`--out` says where; `--wandb` also saves a W&B Report of the runs' groups (online only).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from zkl.console import say
from zkl.report import page, wandb_report
from zkl.report.contents import markdown
from zkl.report.runs import discover


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zkl.report", description=__doc__)
    parser.add_argument("dirs", nargs="+", help="sweep or run directories")
    parser.add_argument("--out", help="the HTML file (default: DIR/report.html)")
    parser.add_argument("--title", default="zkl comparison report")
    parser.add_argument("--wandb", action="store_true", help="also save a W&B Report (online)")
    parser.add_argument("--entity", help="W&B entity (default: the runs' tracking.wandb.entity)")
    parser.add_argument("--project", help="W&B project (default: the runs' tracking.wandb.project)")
    args = parser.parse_args(argv)
    try:
        sources = discover(args.dirs)
    except FileNotFoundError as err:
        say(f"zkl.report: {err}")
        return 2
    if not (sources.runs or sources.bench or sources.cert):
        say(f"zkl.report: no runs under {', '.join(args.dirs)}")
        return 2
    flat = sources.runs[0].flat if sources.runs else {}
    entity = args.entity or flat.get("tracking.wandb.entity")
    if args.wandb and not entity:  # W&B's own error names neither key
        say(
            "zkl.report: --wandb needs a W&B entity (a user or team name) and these runs name "
            "none: pass --entity NAME, or run them with tracking.wandb.entity=NAME."
        )
        return 2
    out = Path(args.out) if args.out else Path(args.dirs[0]) / "report.html"
    if out.is_dir():
        out = out / "report.html"
    try:
        page.write(out, page.render(sources, args.title, args.dirs))
        out.with_suffix(".md").write_text(markdown(sources, args.title))
    except OSError as err:
        where = "--out" if args.out else "the first DIR (or pass --out)"
        say(
            f"zkl.report: cannot write {err.filename or out} ({err.strerror or err}); "
            f"choose a writable {where}."
        )
        return 2
    print(f"{out}\n{out.with_suffix('.md')}")
    if args.wandb:
        project = args.project or flat.get("tracking.wandb.project") or "zkl"
        try:
            print(wandb_report.publish(wandb_report.build(sources, entity, project, args.title)))
        except Exception as err:  # offline, not logged in, no such project, ...
            say(f"zkl.report: could not save the W&B Report ({err}).")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
