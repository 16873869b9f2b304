"""``evolm report``: one page a person would rather look at than the JSON, from run, sweep, eval and
analysis directories.

    evolm report runs/es runs/grpo runs/es/analysis runs/sweep-sigma --label base-vs-es=runs/es --out report

Writes ``<out>/report.md`` (figures as ``figures/*.png``), ``<out>/report.html`` (self-contained: the
same PNGs embedded as base64 data URIs, tables as HTML) and ``<out>/report.json`` (every table's
numbers, the figure list and the files read).

Where things are:

- ``read``: classify and read the inputs through one ``Reader`` that records every file it opens
  (run directories through the ``RunDir`` read side); the report ends with that list.
- ``document``: ``Table``, ``Figure``, ``Section``, the ``Canvas`` figures are saved on, and the
  Markdown and HTML renderers. The document is built once and rendered twice, so the two can never
  disagree; every plotted number also appears in a table.
- ``sections``: the run sections (runs, held-out pass@k, probe, training reward, cost, and the budget
  each run spent, with the curves drawn against the quantity runs are matched on, ``--match``);
  ``sweeps``: a section per sweep with its ablations (``evolm.analysis.ablations``);
  ``checks``: the warnings above a section whose numbers are all zero or measured on too few problems.
- Each analysis draws its own section, next to its computation: ``report_section(entries, canvas)``
  in ``evolm.analysis.<kind>`` for every kind in ``read.ANALYSIS_KINDS`` (``sections.ANALYSIS_SECTIONS``).
- ``evolm report --study CLAIMS``: the reproduction study's page (``docs/REPRODUCTION.md``): a one-screen summary,
  one row per claim with its verdict, scale and declaration, a few lines per claim, and a page per claim under
  ``docs/study/page/``. ``study`` is a package with one module per job: ``claims`` (the file), ``stats``
  (intervals), ``verdicts``, ``measure`` (tests, premises, claims), ``words``, ``summary``, ``figures`` and ``page``
  (``build_study``; ``reproduction`` re-exports it).

Design decisions:

- Every number shown comes from a file. Nothing is recomputed from weights or re-sampled; the few
  derived numbers (pass@k curves from per-problem n and c, smoothed curves, the sweep ablations) are
  pure functions of what was read.
- The document model (``evolm.document``: tables, figures, sections, the two renderers) is a leaf the
  analysis modules share with this package, so each analysis draws its own section without importing
  the report: ``report`` imports ``analysis``, never the other way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from evolm.errors import UserError
from evolm.document import Canvas, Figure, Table, render_html, render_markdown
from evolm.report.read import Reader, gather
from evolm.report.reproduction import build_study
from evolm.report.sections import ANALYSIS_SECTIONS, analysis_sections, budget_section, cost_section, passk_section, probe_section, reward_section, runs_section
from evolm.runs import MATCH_FIELDS
from evolm.analysis.ablations import BAND, BAND_MODE, WINDOW
from evolm.report.sweeps import sweep_sections
from evolm.runs import atomic_write_json, atomic_write_text

__all__ = ["ANALYSIS_SECTIONS", "ReportResult", "build_report", "build_study"]


@dataclass
class ReportResult:
    out: Path
    markdown: Path
    html: Path
    json: Path
    figures: list[Path]


def build_report(paths: list[str], out: str | Path, labels: dict[str, str] | None = None, title: str = "evolm report",
                 window: int = WINDOW, band: float = BAND, band_mode: str = BAND_MODE, reference=None,
                 match: str = "updates") -> ReportResult:
    """Read the inputs, draw the figures, and write report.md, report.html and report.json into ``out``.

    ``labels`` maps input paths to names (``--label NAME=PATH``); ``window``, ``band``, ``band_mode`` and
    ``reference`` set the sweep ablations (``evolm.analysis.ablations``); ``match`` is the quantity runs are
    compared on (updates, sequences, tokens, seconds): the x-axis of the training curves and the budget table's
    matched column.
    """
    if match not in MATCH_FIELDS:
        raise UserError(f"--match must be one of {', '.join(MATCH_FIELDS)} (got '{match}')")
    if window < 1:
        raise UserError(f"--window must be >= 1 (got {window})")
    if band < 0 or band_mode not in ("relative", "absolute"):
        raise UserError("--band must be >= 0 and --band-mode relative or absolute")
    labels = {str(Path(p).resolve()): name for p, name in (labels or {}).items()}
    paths = list(dict.fromkeys(list(paths) + [p for p in (labels or {}) if p not in {str(Path(x).resolve()) for x in paths}]))
    if not paths:
        raise UserError("evolm report needs at least one run, sweep, eval or analysis directory")
    for p in paths:
        if not Path(p).exists():
            raise UserError(f"{p} does not exist")
    reader = Reader()
    src = gather(paths, labels, reader)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    canvas = Canvas(out)
    for old in canvas.dir.glob("*.png"):  # a re-run must not leave figures the new report does not list
        old.unlink()
    sections = [s for s in (runs_section(src), passk_section(src, canvas), probe_section(src, canvas, match),
                            reward_section(src, canvas, match), cost_section(src), budget_section(src, match)) if s is not None]
    sections += sweep_sections(src, canvas, window, band, band_mode, reference)
    sections += analysis_sections(src, canvas)
    if not sections:
        raise UserError("none of the inputs has anything to report (no training records, evaluations, sweeps or analyses)")
    note = (f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')} by `evolm report` from {len(reader.files)} files "
            "(listed at the end); every number below is read from them or computed from them by a documented pure "
            "function.")
    figures = [b for s in sections for b in s.blocks if isinstance(b, Figure)]
    atomic_write_text(out / "report.md", render_markdown(title, sections, reader.files, note))
    atomic_write_text(out / "report.html", render_html(title, sections, reader.files, note, canvas.dir))
    data = {"title": title, "inputs": [str(p) for p in paths], "files_read": reader.files,
            "figures": [f"figures/{f.name}.png" for f in figures],
            "sections": [{"title": s.title, "tables": [{"columns": b.columns, "rows": b.rows, "caption": b.caption}
                                                         for b in s.blocks if isinstance(b, Table)],
                          "figures": [f"figures/{b.name}.png" for b in s.blocks if isinstance(b, Figure)]} for s in sections]}
    atomic_write_json(out / "report.json", data)
    return ReportResult(out, out / "report.md", out / "report.html", out / "report.json",
                        [canvas.path(f.name) for f in figures])
