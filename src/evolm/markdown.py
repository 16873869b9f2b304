"""Markdown tables, the one writer every table in evolm goes through (eval.md, sweep.md, reports).

Design decisions:

- ``table(columns, rows)`` writes a GitHub-flavoured pipe table; each cell goes through a formatter
  (``fmt`` by default) and has ``|`` escaped and newlines folded, so no value can break the table.
- ``fmt`` is the house style for numbers in tables: None -> empty, floats with 4 significant digits,
  booleans as yes/no, lists joined with commas. Callers that want a fixed number of decimals pass
  strings they formatted themselves (strings are written as they are).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence


def fmt(v: Any) -> str:
    """A table cell: None -> empty, floats with 4 significant digits, booleans yes/no, lists joined."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(fmt(x) for x in v)
    return str(v)


def cell(v: Any, formatter: Callable[[Any], str] = fmt) -> str:
    return formatter(v).replace("|", "\\|").replace("\n", " ")


def table(columns: Sequence[Any], rows: Sequence[Sequence[Any]], formatter: Callable[[Any], str] = fmt) -> str:
    """A Markdown pipe table (ends with a newline)."""
    lines = ["| " + " | ".join(cell(c, formatter) for c in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(c, formatter) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def shown_path(path) -> str:
    """A path as a report shows it: relative to the working directory when it lies inside it (a report
    of committed files then names them as the repository does, not by one machine's absolute path)."""
    from pathlib import Path

    p = Path(path).resolve()
    try:
        return str(p.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
