"""Markdown tables: every table the commands print or write goes through `markdown_table`."""

from __future__ import annotations

from typing import Sequence


def markdown_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    """A GitHub markdown table: one header row, a rule, one line per row (cells as given, str())."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
