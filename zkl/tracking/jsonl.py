"""The one reader of the run's .jsonl files (metrics, tokens, cert rows): tolerant of what a
killed writer leaves (a torn last line) and of damage (blank or non-JSON lines), which each
caller then judges: the report lists them, a resume drops them, the loop refuses them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NOT_JSON: Any = object()  # `Line.record` of a line that does not parse


@dataclass
class Line:
    number: int  # 1-based, in the file
    text: str  # without its newline
    record: Any  # the parsed value, or NOT_JSON

    @property
    def is_object(self) -> bool:
        return isinstance(self.record, dict)


@dataclass
class Jsonl:
    lines: list[Line]  # every complete (newline-ended) line that is not blank, in order
    blank: int  # blank lines left out
    torn: Line | None  # the text after the last newline, if any: a writer killed mid-line


def _line(number: int, text: str) -> Line:
    try:
        record = json.loads(text)
    except ValueError:
        record = NOT_JSON
    return Line(number, text, record)


def read_jsonl(path: str | Path) -> Jsonl:
    """`path`'s lines, each parsed; an absent file reads as empty. Bytes that are not UTF-8
    are replaced (the line then fails to parse or holds U+FFFD), never an error."""
    path = Path(path)
    text = path.read_bytes().decode("utf-8", "replace") if path.is_file() else ""
    parts = text.split("\n")
    tail = parts.pop()  # "" when the file ends with a newline
    lines = [_line(n, t) for n, t in enumerate(parts, 1) if t.strip()]
    blank = sum(1 for t in parts if not t.strip())
    return Jsonl(lines, blank, _line(len(parts) + 1, tail) if tail else None)
