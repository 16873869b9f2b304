"""The ES update, from member fitnesses to ``theta += scale * sum_d c_d * eps_d``.

This file holds all of the update's arithmetic except the final tensor loop (``ParamSet.apply_update``,
which adds ``scale * sum_d c_d * eps_d`` to each selected parameter, accumulating in float32).

Estimators (N = population, the number of scored members):

- ``one_point`` (Qiu et al. 2025): N independent directions eps_i, member i scores theta + sigma eps_i,
  ``c_i = shaped_i``.  Update ``theta += alpha / N * sum_i shaped_i * eps_i``.
- ``antithetic`` (two-point): N/2 directions, member 2d scores theta + sigma eps_d and member 2d+1
  scores theta - sigma eps_d; ``c_d = shaped_2d - shaped_2d+1``. Update
  ``theta += alpha / N * sum_d (shaped_+ - shaped_-) eps_d`` — exactly the one-point formula applied
  to the N members with directions (eps_d, -eps_d), hence algebraically the two-point zeroth-order
  estimator that "Understanding Evolution Strategies for LLM Reasoning" (2026, arXiv 2608.27351)
  compares with one-point ES.

``scale = alpha / N`` (Qiu et al. fold the textbook ``1/sigma`` into alpha) or ``alpha / (N sigma)``
when ``divide_by_sigma`` is set; the choice is a config field and is logged with every update.

Degenerate fitness never reaches the weights: a non-finite fitness (NaN, inf, or a reward function
that raised) skips the update (``status="skipped"``); so does a non-finite coefficient or step scale,
or a step whose size ``|scale| * sum_d |c_d|`` exceeds ``MAX_STEP`` (only absurd rewards under
``shaping = "none"`` get there). All-equal fitness shapes to zeros under zscore and centred rank
(``status="zero"``), and a zero update is not applied at all. ``ParamSet.apply_update`` adds the last
guard: it never writes a non-finite value into the weights (the update is then skipped too).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from evolm.es.shaping import SHAPINGS


def member_layout(estimator: str, population: int) -> list[tuple[int, int]]:
    """``(direction, sign)`` of each member: one_point -> (i, +1); antithetic -> (d, +1), (d, -1)."""
    if estimator == "one_point":
        return [(i, +1) for i in range(population)]
    if estimator == "antithetic":
        if population % 2:
            raise ValueError("antithetic ES needs an even population")
        return [(i // 2, +1 if i % 2 == 0 else -1) for i in range(population)]
    raise ValueError(f"unknown estimator '{estimator}'")


def one_point(shaped: np.ndarray) -> np.ndarray:
    """Coefficient per direction for the one-point estimator: the shaped fitness itself."""
    return np.asarray(shaped, dtype=np.float64).copy()


def antithetic(shaped: np.ndarray) -> np.ndarray:
    """Coefficient per direction for the antithetic estimator: shaped(+eps) - shaped(-eps)."""
    s = np.asarray(shaped, dtype=np.float64)
    return s[0::2] - s[1::2]


ESTIMATORS = {"one_point": one_point, "antithetic": antithetic}


def step_scale(lr: float, population: int, sigma: float, divide_by_sigma: bool) -> float:
    return lr / population / (sigma if divide_by_sigma else 1.0)


@dataclass
class Update:
    """What one ES iteration does to the weights (and what the seed log stores)."""

    coefficients: list[float]
    """c_d per noise direction d = 0 .. D-1."""
    scale: float
    """Step multiplier: theta += scale * sum_d c_d eps_d."""
    status: str
    """applied | zero | skipped."""
    message: str = ""
    shaped: list[float] = field(default_factory=list)

    @property
    def applies(self) -> bool:
        return self.status == "applied"

    def skipped(self, message: str) -> "Update":
        """This update marked as not applied (its coefficients kept for the record)."""
        return dataclasses.replace(self, status="skipped", message=message)


MAX_STEP = 1e30
"""Largest ``|scale| * sum_d |c_d|`` an update may have (a weight moves by at most that times max |eps|)."""


def compute_update(fitness, *, estimator: str, shaping: str, lr: float, sigma: float,
                   divide_by_sigma: bool = False, errors: dict[int, str] | None = None) -> Update:
    """Turn N member fitnesses into an ``Update`` (pure)."""
    f = np.asarray(fitness, dtype=np.float64)
    n = len(f)
    scale = step_scale(lr, n, sigma, divide_by_sigma)
    directions = n // 2 if estimator == "antithetic" else n
    if errors or not np.all(np.isfinite(f)):
        bad = sorted(set((errors or {}).keys()) | {int(i) for i in np.flatnonzero(~np.isfinite(f))})
        detail = "; ".join(f"member {i}: {(errors or {}).get(i, f[i])}" for i in bad[:3])
        return Update([0.0] * directions, scale, "skipped", f"non-finite fitness, update skipped ({detail})")
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow becomes inf and is refused below
        shaped = SHAPINGS[shaping](f)
        coefficients = ESTIMATORS[estimator](shaped)
    if not (np.all(np.isfinite(coefficients)) and math.isfinite(scale)):
        return Update([0.0] * directions, scale, "skipped",
                      f"non-finite update coefficients or step scale ({_brief(coefficients)}, scale {scale:.3g}), update skipped")
    step = abs(scale) * float(np.sum(np.abs(coefficients)))
    if not step <= MAX_STEP:
        return Update([0.0] * directions, scale, "skipped",
                      f"update step |scale| x sum|c| = {step:.3g} exceeds {MAX_STEP:.0e} (fitness {_brief(f)}), update skipped")
    if not np.any(coefficients):
        return Update([0.0] * directions, scale, "zero",
                      f"no fitness signal (all members scored {f[0]:.4g})" if np.ptp(f) == 0 else "zero update",
                      shaped.tolist())
    return Update(coefficients.tolist(), scale, "applied", "", shaped.tolist())


def _brief(values: np.ndarray) -> str:
    shown = ", ".join(f"{v:.3g}" for v in np.asarray(values)[:4])
    return f"[{shown}{', ...' if len(values) > 4 else ''}]"
