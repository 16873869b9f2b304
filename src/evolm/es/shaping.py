"""Fitness shaping: pure functions with one signature, ``shape(fitness: np.ndarray) -> np.ndarray``.

They are interchangeable (``SHAPINGS[name]``) and each is unit-tested on arrays. The input is the
vector of N member fitnesses (finite; the engine refuses non-finite fitness before shaping); the
output has the same length and is what weights each member's noise in the update.

- ``zscore``: ``(f - mean(f)) / std(f)`` with the population standard deviation (``ddof=0``, as
  ``np.std`` in Qiu et al.'s code). When every member scores the same (std below 1e-12) there is no
  signal and the result is all zeros (the engine logs a zero update). Overflow-safe: fitnesses
  beyond ``RESCALE_ABOVE`` in magnitude (whose squares or sums would overflow float64, e.g. 1e308)
  are divided by the largest magnitude first; z-scores do not depend on the scale, and ordinary
  rewards never take that branch, so their results stay bit for bit what they were.
- ``centered_rank`` (Salimans et al. 2017): ranks mapped linearly onto [-0.5, 0.5]; tied fitnesses
  share their average rank, so ties get equal weight and all-equal fitness gives zeros.
- ``none``: the raw fitness, unnormalised (the "no normalisation" ablation of "Understanding Evolution
  Strategies for LLM Reasoning", arXiv 2608.27351; not centred, so
  the mean reward scales the sum of the noise directions).
"""

from __future__ import annotations

from typing import Callable

import numpy as np


RESCALE_ABOVE = 1e100
"""zscore divides fitnesses by their largest magnitude when it exceeds this (sums of squares stay finite)."""


def zscore(fitness: np.ndarray) -> np.ndarray:
    f = np.asarray(fitness, dtype=np.float64)
    peak = float(np.max(np.abs(f))) if f.size else 0.0
    if peak > RESCALE_ABOVE:
        f = f / peak
    std = f.std(ddof=0)
    if std < 1e-12:
        return np.zeros_like(f)
    return (f - f.mean()) / std


def centered_rank(fitness: np.ndarray) -> np.ndarray:
    f = np.asarray(fitness, dtype=np.float64)
    n = len(f)
    if n < 2:
        return np.zeros_like(f)
    order = np.argsort(f, kind="stable")
    ranks = np.empty(n, dtype=np.float64)
    ranks[order] = np.arange(n, dtype=np.float64)
    for value in np.unique(f):  # average rank within ties
        tied = f == value
        if tied.sum() > 1:
            ranks[tied] = ranks[tied].mean()
    return ranks / (n - 1) - 0.5


def none(fitness: np.ndarray) -> np.ndarray:
    return np.asarray(fitness, dtype=np.float64).copy()


SHAPINGS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "zscore": zscore,
    "centered_rank": centered_rank,
    "none": none,
}
