"""Regenerate the README's map of the package from the tree (`--check`: exit 1 if stale).

The map is each module directly in `zkl/` and each of its packages, with the first sentence
of its docstring (and a package's modules), so the README cannot drift from the code: a
moved module or a changed docstring fails the test that runs this with `--check`.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- map:start -->", "<!-- map:end -->"


def first_sentence(path: Path) -> str:
    """The docstring's first sentence, on one line ('' when the file has none)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def entries(package: Path) -> list[str]:
    """One line per module directly in `package`, then one per subpackage with its modules."""
    lines = []
    for module in sorted(package.glob("*.py")):
        if module.name != "__init__.py":
            lines.append(f"- `{module.name}` — {first_sentence(module)}")
    for sub in sorted(p for p in package.iterdir() if (p / "__init__.py").exists()):
        names = sorted(m.stem for m in sub.glob("*.py") if m.name != "__init__.py")
        names += sorted(f"{s.name}/" for s in sub.iterdir() if (s / "__init__.py").exists())
        listed = ", ".join(f"`{n}`" for n in names)
        lines.append(f"- `{sub.name}/` — {first_sentence(sub / '__init__.py')} ({listed})")
    return lines


def render(root: Path = ROOT) -> str:
    body = "\n".join(entries(root / "zkl"))
    return f"{START}\n{body}\n{END}"


def updated_readme(root: Path = ROOT) -> tuple[str, str]:
    """(the README as it is, the README with a fresh map)."""
    text = (root / "README.md").read_text()
    head, start, rest = text.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise SystemExit(f"README.md lacks the {START} ... {END} markers")
    return text, head + render(root) + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the map is stale")
    args = parser.parse_args(argv)
    old, new = updated_readme()
    if args.check:
        if old != new:
            print("README.md's map is stale: run python scripts/readme_map.py", file=sys.stderr)
            return 1
        return 0
    (ROOT / "README.md").write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
