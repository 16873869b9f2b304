"""The report's document model (``Table``, ``Figure``, ``Section``), the ``Canvas`` figures are saved
on, and the two renderers (Markdown and self-contained HTML).

Design decisions:

- A report is a list of sections holding blocks: a paragraph (``str``, with ``**bold**`` and
  `` `code` ``), an ``Alert`` (a warning: a quoted "**Warning:**" line in Markdown, a red-bordered
  box in HTML), a ``Table`` or a ``Figure``. It is built once and rendered twice, so the Markdown and
  the HTML can never disagree.
- Markdown tables go through ``evolm.markdown.table``, the one table writer (cells formatted by
  ``evolm.markdown.fmt``); HTML cells use the same ``fmt``.
- The HTML embeds each figure's PNG as a base64 data URI, so the page is one self-contained file.
- Figures are drawn with matplotlib's object API on the Agg canvas (``matplotlib.figure.Figure``),
  never pyplot state; ``Canvas`` gives each figure a unique file name under ``<out>/figures``.
- A leaf: this module imports nothing from ``evolm.analysis`` or from the rest of ``evolm.report``,
  so every analysis module can import it to build its own section.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolm.markdown import fmt, table

COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
          "tab:cyan", "tab:gray"]
"""The series colours, in order, of every multi-series report figure (a report gives each run one of them
and uses it in every figure)."""
EXTRA_COLORS = ["#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5", "#c7c7c7"]
"""The light shades of the palette (matplotlib's tab20), for a figure with more series than ``COLORS``."""


def pick_colour(owner: str, figure: dict[str, str], page: dict[str, str], palette: list[str] = COLORS) -> str:
    """The colour of ``owner``'s curves in one figure: the colour it had in earlier figures (``page``) unless another
    owner of this figure (``figure``) already has it, else the first colour of ``palette`` this figure has not used;
    both maps are updated. Once a figure has used the whole palette it cycles it."""
    if owner not in figure:
        taken = set(figure.values())
        preferred = page.get(owner)
        free = [c for c in palette if c not in taken]
        figure[owner] = preferred if preferred and preferred not in taken else (free[0] if free else palette[len(figure) % len(palette)])
        page.setdefault(owner, figure[owner])
    return figure[owner]


BASE_COLOR = "black"
"""The colour of a base model's curve shared by every run (dashed)."""


@dataclass
class Table:
    columns: list[str]
    rows: list[list[Any]]
    caption: str = ""


@dataclass
class Figure:
    name: str
    title: str
    caption: str = ""


@dataclass
class Alert:
    """A warning shown above a section's numbers (an all-zero analysis, too few problems)."""

    text: str


@dataclass
class Section:
    title: str
    blocks: list = field(default_factory=list)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "x"


class Canvas:
    """Saves figures under ``<out>/figures`` with unique names."""

    def __init__(self, out: Path):
        self.dir = out / "figures"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.names: set[str] = set()

    def name(self, stem: str) -> str:
        base = _slug(stem)
        name, i = base, 2
        while name in self.names:
            name, i = f"{base}-{i}", i + 1
        self.names.add(name)
        return name

    def path(self, name: str) -> Path:
        return self.dir / f"{name}.png"

    def figure(self, width: float = 7.0, height: float = 4.0):
        from matplotlib.figure import Figure as MplFigure  # local: matplotlib is slow to import, only drawing needs it

        return MplFigure(figsize=(width, height), dpi=110, layout="constrained")

    def save(self, fig, stem: str, title: str, caption: str = "") -> Figure:
        name = self.name(stem)
        fig.savefig(self.path(name))
        return Figure(name, title, caption)


def integer_x(ax) -> None:
    """Integer ticks on the x axis (updates, steps)."""
    from matplotlib.ticker import MaxNLocator  # local: matplotlib is slow to import, only drawing needs it

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def passk_axes(ax, k_max: int) -> list[int]:
    """The pass@k axes every report draws: k on a base-2 log axis with ticks at the powers of two up to
    ``k_max``, pass@k linear from 0 to 1. Returns the ticks."""
    ticks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if k <= k_max]
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(k) for k in ticks])
    ax.minorticks_off()
    ax.set_xlabel("k (samples, log scale)")
    ax.set_ylabel("pass@k")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    return ticks


# -- rendering -----------------------------------------------------------------------------------------


def render_markdown(title: str, sections: list[Section], files: list[str] | None, note: str, figures: str = "figures") -> str:
    """The Markdown page; images are linked as ``<figures>/<name>.png``, relative to the page; ``files`` is listed
    last under "Files read" (None: no such section, e.g. a page whose files another page lists)."""
    lines = [f"# {title}", "", note, ""]
    for sec in sections:
        lines += [f"## {sec.title}", ""]
        for b in sec.blocks:
            if isinstance(b, str):
                lines += [b, ""]
            elif isinstance(b, Alert):
                lines += [f"> **Warning:** {b.text}", ""]
            elif isinstance(b, Figure):
                alt = b.title.replace("[", "(").replace("]", ")")
                lines += [f"![{alt}]({figures}/{b.name}.png)", ""]
                if b.caption:
                    lines += [f"*{b.caption}*", ""]
            elif isinstance(b, Table):
                if b.caption:
                    lines += [f"*{b.caption}*", ""]
                lines.append(table(b.columns, b.rows))  # ends with a newline: a blank line follows
    if files is not None:
        lines += ["## Files read", ""] + [f"- `{f}`" for f in files] + [""]
    return "\n".join(lines)


def _inline_html(text: str) -> str:
    text = html.escape(text)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", text)


CSS = """body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{border-bottom:2px solid #ccc}h2{margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:0.6em 0 1.4em;font-size:0.85em}th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}figure{margin:1em 0}img{max-width:100%}
figcaption,.caption{color:#555;font-size:0.85em}code{background:#f4f4f4;padding:0 3px}
.tablewrap{overflow-x:auto}.warning{border:2px solid #c0392b;background:#fdecea;padding:0.5em 0.8em;border-radius:4px}"""


def render_html(title: str, sections: list[Section], files: list[str], note: str, figure_dir: Path) -> str:
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
           f"<style>{CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1>", f"<p>{_inline_html(note)}</p>"]
    toc = "".join(f"<li><a href='#s{i}'>{html.escape(s.title)}</a></li>" for i, s in enumerate(sections))
    out.append(f"<ul>{toc}<li><a href='#files'>Files read</a></li></ul>")
    for i, sec in enumerate(sections):
        out.append(f"<h2 id='s{i}'>{html.escape(sec.title)}</h2>")
        for b in sec.blocks:
            if isinstance(b, str):
                out.append(f"<p>{_inline_html(b)}</p>")
            elif isinstance(b, Alert):
                out.append(f"<p class='warning'><strong>Warning:</strong> {_inline_html(b.text)}</p>")
            elif isinstance(b, Figure):
                data = base64.b64encode((figure_dir / f"{b.name}.png").read_bytes()).decode()
                cap = html.escape(b.title + (f" ({b.caption})" if b.caption else ""))
                out.append(f"<figure><img alt='{html.escape(b.title)}' src='data:image/png;base64,{data}'>"
                           f"<figcaption>{cap}</figcaption></figure>")
            elif isinstance(b, Table):
                if b.caption:
                    out.append(f"<p class='caption'>{_inline_html(b.caption)}</p>")
                head = "".join(f"<th>{html.escape(str(c))}</th>" for c in b.columns)
                body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(c))}</td>" for c in row) + "</tr>" for row in b.rows)
                out.append(f"<div class='tablewrap'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")
    out.append("<h2 id='files'>Files read</h2><ul>" + "".join(f"<li><code>{html.escape(f)}</code></li>" for f in files) + "</ul>")
    out.append("</body></html>")
    return "\n".join(out)
