"""Read the report's HTML tables back (test helper): {table id: rows of (text, exact value)}."""

from __future__ import annotations

from html.parser import HTMLParser


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)  # repr() of a float, nan and inf included


class _Tables(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[tuple[str, object]]]] = {}
        self._table: str | None = None
        self._row: list[tuple[str, object]] | None = None
        self._cell: list[str] | None = None
        self._value: object = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self._table = attrs.get("id")
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
            value = attrs.get("data-value")
            self._value = _number(value) if value is not None else None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append(("".join(self._cell), self._value))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None


def parse_tables(page: str) -> dict[str, list[dict[str, tuple[str, object]]]]:
    """Each table as a list of {header: (text, value)} rows."""
    parser = _Tables()
    parser.feed(page)
    out = {}
    for table_id, rows in parser.tables.items():
        headers = [text for text, _ in rows[0]]
        out[table_id] = [dict(zip(headers, row)) for row in rows[1:]]
    return out
