"""The study's pass@k figures as small multiples: one panel per task and comparison, a handful of series each.

A claim's figure has one panel per comparison its tests make: a run's change (its base dashed, the trained model
solid), or a comparison of evaluation files on one problem set (a base or uncompressed model dashed, the others
solid). Panels holding the same files are drawn once; evaluations without samples (greedy only) are left to the
tables. The legend sits under each panel, outside the data; the k axis is logarithmic (base 2), the band the 95%
bootstrap interval of the mean over problems (repeated problems pooled).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evolm.document import BASE_COLOR, COLORS, Canvas, Figure, passk_axes
from evolm.metrics import pass_at_k_problem
from evolm.report.study.claims import ClaimTest
from evolm.report.study.measure import ClaimOutcome, Outcome, task_report
from evolm.report.study.stats import bootstrap_curve, pooled_problems
from evolm.report.study.verdicts import GATED, NOT_RUN

COLUMNS = 4
"""Panels per row."""
PANEL = (2.7, 2.5)
"""Width and height of one panel, inches (the legend below it included)."""


@dataclass
class Panel:
    """One comparison: its files (path, task, dashed, label) and a title (which says when a run lost its task)."""

    title: str
    series: list[tuple[Path, str, bool, str]]
    """(file, task, dashed, label) per series."""


def passk_matrix(report: dict) -> np.ndarray:
    """Problems × k: each distinct problem's unbiased pass@k for k = 1 .. the smallest n (rows of a repeated
    problem pooled)."""
    problems = pooled_problems(report)
    k_max = min(int(p["n"]) for p in problems)
    return np.array([[pass_at_k_problem(int(p["n"]), int(p["c"]), k) for k in range(1, k_max + 1)] for p in problems])


METHOD_COLOURS = {"es": "tab:blue", "grpo": "tab:orange", "pipeline": "tab:green", "null": "tab:gray"}
"""One colour per method in every panel (a base is black and dashed); further seeds of a method in one panel
keep its colour with another line style, a method's uncompressed model its colour dashed."""
SEED_STYLES = ("-", "-.", ":", (0, (5, 1)))


def method_of(path: Path) -> str:
    """The method behind an evaluation file: its run directory's ``run.json`` kind, else read from its path
    (``k32/grpo-s1``, ``analyses/q2/compression/es_int4.json``, ``matched/c9-...``)."""
    run = path.parent / "run.json"
    if path.name in ("eval_before.json", "eval_after.json") and run.exists():
        try:
            import json

            return json.loads(run.read_text()).get("kind") or ""
        except (OSError, ValueError):
            return ""
    name = path.parent.name if path.name in ("eval.json", "eval_before.json", "eval_after.json") else path.stem
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    if "control" not in words and ("pipeline" in words or any(w.startswith("c9") for w in words)):
        return "pipeline"
    return next((w for w in words if w in ("es", "grpo", "null")), "")


def _is_base(path: Path) -> bool:
    name = path.parent.name if path.name == "eval.json" else path.stem
    return path.name == "eval_before.json" or name == "base" or name.endswith(("-base", "_base", "_none"))


def _short(path: Path, data: Path) -> str:
    """A series label: ``c1c2-es`` (its eval_after.json), ``c1c2-es before``, ``grpo-s1`` (k32/grpo-s1/eval.json),
    ``es_int4`` (an analysis's file)."""
    rel = path.relative_to(data) if path.is_relative_to(data) else path
    if rel.name == "eval_before.json":
        return f"{rel.parent.name} before"
    return rel.parent.name if rel.name in ("eval.json", "eval_after.json") else rel.stem


def panels_of(test: ClaimTest, r: Outcome, data: Path) -> list[Panel]:
    """The panels of one change or compare test (none for the other kinds or a test that did not run)."""
    if test.kind not in ("change", "compare", "contrast") or r.verdict == NOT_RUN:
        return []
    if test.kind == "contrast":  # a gap on each of two problem sets: a panel per set
        return [Panel(Path(x).parts[0], [(data / x, "", False, _short(data / x, data)), (data / y, "", False, _short(data / y, data))])
                for x, y in ((test.a, test.b), (test.c, test.d))]
    note = f" ({r.verdict})" if r.verdict in GATED else ""
    dropped = {s["label"] for s in r.seeds if s.get("dropped")}
    if test.kind == "change":
        return [Panel(f"{run}{' (left out)' if run in dropped else note}",
                      [(data / run / "eval_before.json", test.task, True, "before"),
                       (data / run / "eval_after.json", test.task, False, "after")])
                for run in [test.run] + test.seeds]
    files = [test.a_base, test.b_base] + [test.a] + test.a_seeds + [test.b] + test.b_seeds
    series = [(data / f, test.task, _is_base(data / f), _short(data / f, data) + (" (left out)" if f in dropped else ""))
              for f in dict.fromkeys(f for f in files if f)]
    return [Panel((test.name or f"{test.metric}: {_short(data / test.b, data)} vs {_short(data / test.a, data)}") + note, series)]


def claim_figure(o: ClaimOutcome, data: Path, read, canvas: Canvas) -> Figure | None:
    """The small-multiple pass@k figure of one claim (None when none of its tests has sampled evaluations)."""
    panels: list[Panel] = []
    seen: set[frozenset] = set()
    for t, r in zip(o.claim.test, o.tests):
        for p in panels_of(t, r, data):
            key = frozenset(str(f) for f, *_ in p.series)
            if key not in seen:
                seen.add(key)
                panels.append(p)
    drawable = []
    for p in panels:
        curves = []
        for f, task, dashed, label in p.series:
            report = task_report(read(f), f, task)
            if not all("n" in q for q in pooled_problems(report)):
                continue  # greedy only: in the table
            last = _short(f, data)
            base_model = f.name == "eval_before.json" or last == "base" or last.startswith("base_") or last.endswith(("_base", "-base"))
            curves.append((report, dashed, label, "" if base_model else method_of(f)))
        if curves:
            drawable.append((p, curves))
    if not drawable:
        return None
    rows = math.ceil(len(drawable) / COLUMNS)
    cols = min(COLUMNS, len(drawable))
    fig = canvas.figure(PANEL[0] * cols, PANEL[1] * rows)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[len(drawable):]:
        ax.set_visible(False)
    for ax, (p, curves) in zip(axes.flat, drawable):
        spare, used = iter(c for c in COLORS if c not in METHOD_COLOURS.values()), {}
        k_top = 1
        for report, dashed, label, method in curves:
            m = passk_matrix(report)
            mean, lo, hi = bootstrap_curve(m)
            ks = list(range(1, m.shape[1] + 1))
            k_top = max(k_top, ks[-1])
            colour = BASE_COLOR if not method else METHOD_COLOURS.get(method) or next(spare)
            style = "--" if dashed else SEED_STYLES[used.get(colour, 0) % len(SEED_STYLES)]
            used[colour] = used.get(colour, 0) + 1
            ax.plot(ks, mean, linestyle=style, color=colour, lw=1.4, label=label)
            ax.fill_between(ks, lo, hi, color=colour, alpha=0.12, lw=0)
        passk_axes(ax, k_top)
        ax.set_xlabel("k (log scale)", fontsize=7)
        ax.set_ylabel("pass@k", fontsize=7)
        ax.tick_params(labelsize=6.5)
        task = (curves[0][0].get("task") or "").split(":")[0]
        ax.set_title(_wrap(f"{task}: {p.title}" if task else p.title), fontsize=7.5)
        wide = max(len(label) for _, _, label, _ in curves) > 16
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=1 if wide else 2, frameon=False)
    return canvas.save(fig, f"passk-{o.claim.id}", f"held-out pass@k: {o.claim.id}",
                       "one panel per comparison; dashed: base (or uncompressed) model, solid: trained; "
                       "bands: 95% bootstrap intervals over problems")


def _wrap(text: str, width: int = 38) -> str:
    """``text`` broken into lines of at most ``width`` characters (panel titles)."""
    words, lines, line = text.split(), [], ""
    for w in words:
        if line and len(line) + 1 + len(w) > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    return "\n".join(lines + [line])
