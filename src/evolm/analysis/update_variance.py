"""The spread of the ES update estimate: R independent update samples at fixed weights and prompts
(``evolm analyze update-variance``), one-point against antithetic at equal evaluation budget.

Drawing the samples needs the ES engine and lives there (``evolm.es.measure.update_samples``); this
module turns them into numbers, and into the report's section.

Definitions: ``update_spread(U)`` for R update samples (rows of U, K coordinates each) gives the mean
pairwise cosine similarity ``mean_{r<r'} <u_r, u_r'> / (|u_r| |u_r'|)`` (zero vectors are left out),
the per-coordinate variance ``mean_c var_r(U[r, c])`` (ddof = 1), and ``relative_variance = mean_c
var_r / mean_c mean_r U²``: 0 when every repeat gives the same update, about 1 when the repeats share
no direction (pure noise).

Design decisions:

- A pure function of the sample matrix (float64 NumPy), so it is unit-tested on planted vectors.
- The report section (``report_section``) lives here, next to the computation: per estimator the
  evaluations and directions per update, the cosine statistics, the variances and how many repeats
  applied an update, beside ``plots.plot_update_variance``.
"""

from __future__ import annotations

import math

import numpy as np

from evolm.analysis import plots
from evolm.document import Canvas, Section, Table


def update_spread(vectors) -> dict:
    """Statistics of R update samples (rows of ``vectors``): see the module docstring."""
    u = np.asarray(vectors, dtype=np.float64)
    if u.ndim != 2 or u.shape[0] < 2:
        raise ValueError(f"update_spread needs at least 2 update samples as rows (got shape {u.shape})")
    r = u.shape[0]
    norms = np.linalg.norm(u, axis=1)
    nonzero = norms > 0
    cos = np.full((r, r), np.nan)
    idx = np.flatnonzero(nonzero)
    if idx.size:
        unit = u[idx] / norms[idx, None]
        cos[np.ix_(idx, idx)] = unit @ unit.T
    pairs = [cos[i, j] for i in range(r) for j in range(i + 1, r) if nonzero[i] and nonzero[j]]
    var = u.var(axis=0, ddof=1)
    mean_sq = float((u ** 2).mean())
    mean_vec = u.mean(axis=0)
    return {
        "repeats": r, "coordinates": int(u.shape[1]), "nonzero_repeats": int(nonzero.sum()),
        "mean_pairwise_cosine": float(np.mean(pairs)) if pairs else None,
        "std_pairwise_cosine": float(np.std(pairs)) if pairs else None,
        "cosine_matrix": [[None if math.isnan(x) else float(x) for x in row] for row in cos],
        "mean_coordinate_variance": float(var.mean()),
        "mean_square": mean_sq,
        "relative_variance": float(var.mean() / mean_sq) if mean_sq > 0 else None,
        "mean_update_norm": float(norms.mean()),
        "norm_of_mean_update": float(np.linalg.norm(mean_vec)),
    }


# -- report --------------------------------------------------------------------------------------------

REPORT_TEXT = ("The spread of R independent ES update estimates at fixed weights and prompts, per estimator at "
               "equal evaluation budget (`evolm analyze update-variance`).")


def report_table(result: dict) -> Table:
    """One row per estimator: budget, cosine statistics, variances, mean update norm and repeats applied."""
    rows = [[name, e.get("evaluations_per_update"), e.get("directions_per_update"), e["mean_pairwise_cosine"],
             e.get("std_pairwise_cosine"), e["relative_variance"], e["mean_coordinate_variance"], e["mean_update_norm"],
             f"{list(e.get('status', [])).count('applied')}/{e['repeats']}"]
            for name, e in result["estimators"].items()]
    return Table(["estimator", "evaluations / update", "directions", "mean pairwise cosine", "std", "relative variance",
                  "mean coordinate variance", "mean ‖update‖ (subset)", "applied"], rows)


def report_section(entries, canvas: Canvas) -> Section:
    """The report section of ``update_variance.json`` inputs: ``entries`` are ``(label, directory, result)``."""
    return plots.report_section("update_variance", REPORT_TEXT, entries, canvas, plots.plot_update_variance, report_table)
