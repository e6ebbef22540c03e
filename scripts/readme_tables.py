"""Regenerate the README's measured tables on this machine (`--check`: exit 1 if a verdict drifted).

The table is the fix ablation of the default bed, `python -m zkl.cert cert.ablate=true`
(tiny_dense, bf16, colocated, kv=recompute): each fix off in turn, in the mode that can
expose it. This script runs it, then rewrites the table between the README's
`<!-- ablation:start -->` and `<!-- ablation:end -->` markers. Numbers depend on the
machine; the verdicts ("contributes error" / "no effect") are the claim, so `--check`
compares those alone (and that every fix is listed, and all fixes on pass in each mode).
`--from CERT_JSONL` renders or checks an ablation already run instead of running one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- ablation:start -->", "<!-- ablation:end -->"
COMMAND = ["-m", "zkl.cert", "cert.ablate=true", "tracking.wandb.mode=disabled"]
HEADER = "| fix off | mode | max abs diff | result |\n|---|---|---|---|"


def measure() -> list[dict]:
    """The rows of cert.jsonl of a fresh `python -m zkl.cert cert.ablate=true`."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, *COMMAND, f"hydra.run.dir={tmp}"]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"python {' '.join(COMMAND)} failed:\n{done.stderr[-2000:]}")
        return read(Path(tmp) / "cert.jsonl")


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _number(value: float) -> str:
    return "0" if value == 0.0 else f"{value:.3g}"


def render(results: list[dict]) -> str:
    """The Markdown table of the ablation rows: one per fix turned off."""
    lines = [HEADER]
    for r in results:
        if r.get("fix"):
            diff = _number(r["train/max_abs_logprob_diff"])
            lines.append(f"| `{r['fix']}` | {r['mode']} | {diff} | {r['result']} |")
    return "\n".join(lines)


def verdict(result: str) -> str:
    """'contributes error' or 'no effect' (a reason after the colon aside)."""
    return result.split(":", 1)[0].strip()


def measured_verdicts(results: list[dict]) -> dict[str, str]:
    out = {r["fix"]: verdict(r["result"]) for r in results if r.get("fix")}
    failed = sorted({r["mode"] for r in results if not r.get("fix") and not r.get("passed")})
    if failed:
        out["(all fixes on)"] = f"not exactly 0 in {', '.join(failed)}"
    return out


def readme_verdicts(text: str) -> dict[str, str]:
    """{fix: verdict} as the README's table states them."""
    table = _between(text)
    out = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        out[cells[0].strip("`")] = verdict(cells[3])
    return out


def drift(text: str, results: list[dict]) -> list[str]:
    """One line per fix whose verdict differs between the README and `results`."""
    stated, measured = readme_verdicts(text), measured_verdicts(results)
    return [
        f"{fix}: README says {stated.get(fix, '(not listed)')!r}, measured "
        f"{measured.get(fix, '(not measured)')!r}"
        for fix in sorted(set(stated) | set(measured))
        if stated.get(fix) != measured.get(fix)
    ]


def _between(text: str) -> str:
    head, start, rest = text.partition(START)
    table, end, _ = rest.partition(END)
    if not start or not end:
        raise SystemExit(f"README.md lacks the {START} ... {END} markers")
    return table.strip()


def updated(text: str, results: list[dict]) -> str:
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{render(results)}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a verdict drifted")
    parser.add_argument("--from", dest="source", help="a cert.jsonl of cert.ablate=true")
    args = parser.parse_args(argv)
    results = read(Path(args.source)) if args.source else measure()
    readme = ROOT / "README.md"
    text = readme.read_text()
    if args.check:
        lines = drift(text, results)
        for line in lines:
            print(line, file=sys.stderr)
        if lines:
            print(
                "README.md's ablation verdicts drifted: python scripts/readme_tables.py",
                file=sys.stderr,
            )
        return 1 if lines else 0
    readme.write_text(updated(text, results))
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
