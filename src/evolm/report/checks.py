"""Warnings a report shows above a section whose numbers cannot carry a claim: all-zero results (the
trained weights equal the base, every pass@k is 0) and measurements on too few problems.

Design decisions:

- Pure functions of what was read (an analysis result dict, an evaluation summary); each returns
  plain sentences, which the report renders as visible warning blocks (``evolm.document.Warning``) at
  the top of the section, in the Markdown and the HTML alike.
- "Too few" is ``MIN_PROBLEMS`` = 20 problems: below it one problem moves an accuracy by more than 5
  points, so a before/after difference of a problem or two is noise. The threshold is a reading aid,
  not a test; the section still shows every number.
"""

from __future__ import annotations

from typing import Iterable

MIN_PROBLEMS = 20
"""Fewer problems than this get a "too few to support a claim" warning."""


def _few(count, what: str) -> list[str]:
    if count is None or count >= MIN_PROBLEMS:
        return []
    return [f"{what} measured on only {count} problem{'s' if count != 1 else ''}: one problem is "
            f"{1 / max(count, 1):.2f} of an accuracy, too few to support a claim (use at least {MIN_PROBLEMS})."]


def _evaluation_size(result: dict) -> int | None:
    setup = result.get("evaluation") or result.get("setup") or {}
    for key in ("num_examples", "num_prompts"):
        if isinstance(setup.get(key), int):
            return setup[key]
    return result.get("num_prompts") if isinstance(result.get("num_prompts"), int) else None


def analysis_warnings(kind: str, result: dict) -> list[str]:
    """Warnings for one ``<kind>.json`` result (pure)."""
    out: list[str] = []
    models = result.get("models") or {}
    if kind == "drift":
        zero = [label for label, m in models.items() if not m.get("distance")]
        if zero:
            out.append(f"all-zero drift for {', '.join(zero)}: the weights equal the base (no update was applied, or "
                       "--trained points at the base); the bars say nothing about where training moves weights.")
    elif kind == "localisation":
        zero = sorted({label for label, per_k in models.items() for loc in per_k.values() if not loc.get("max_abs_delta")})
        if zero:
            out.append(f"all-zero update for {', '.join(zero)}: every |Δ| is 0, so the top-k coordinates are arbitrary "
                       "ties and their counts mean nothing.")
    elif kind == "sparsity":
        zero = [label for label, m in models.items() if not m.get("num_nonzero")]
        if zero:
            out.append(f"all-zero update for {', '.join(zero)}: no coordinate changed, so there is no sparsity to measure.")
    elif kind == "update_variance":
        estimators = result.get("estimators") or {}
        idle = [name for name, e in estimators.items() if "applied" not in (e.get("status") or ["applied"])]
        if idle:
            out.append(f"no update was applied for {', '.join(idle)} (every member scored the same): the spread is of "
                       "zero vectors.")
    elif kind == "diversity":
        if not result.get("population") and not result.get("center"):
            out.append("all-zero coverage: neither the population nor the centre solved any problem, so the gap and the "
                       "divergence carry no information.")
    if kind in ("sparsity", "compression", "diversity"):
        out += _few(_evaluation_size(result), "the re-evaluation is")
    return out


def passk_warnings(curves: Iterable[tuple[str, str, list[float], dict]]) -> list[str]:
    """Warnings for the pass@k section: every curve all zero, and curves on too few problems (pure)."""
    curves = list(curves)
    out: list[str] = []
    if curves and all(not any(c[2]) for c in curves):
        out.append("every pass@k below is 0: no model solved any problem, so the curves cannot separate the models.")
    small = sorted({(c[3].get("problems"), c[1]) for c in curves if isinstance(c[3].get("problems"), int)
                    and c[3]["problems"] < MIN_PROBLEMS})
    for count, task in small:
        out += _few(count, f"{task} is")
    return out


__all__ = ["MIN_PROBLEMS", "analysis_warnings", "passk_warnings"]
