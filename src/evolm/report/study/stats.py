"""The study's statistics: per-problem values (duplicates pooled), bootstrap and exact intervals. Pure functions.

Distributions and exact intervals come from scipy (``scipy.stats.binomtest`` for Clopper-Pearson intervals and
McNemar's exact test, ``scipy.stats.norm`` for quantiles, ``scipy.special`` for the multinomial probabilities of
the exact unconditional interval of a paired difference); the bootstrap is numpy with fixed seeds, so the page
regenerates with the same numbers.

Binary contrasts get exact intervals, never a bootstrap (issue 40, item 4). When every file a test reads is 0 or 1
per problem (greedy; pass@n of n samples), the difference of one pair of files gets the exact unconditional interval
of a paired difference (``paired_binary_interval``: Tango's score test inverted, its p-value maximised over the
discordance rate, Chan & Zhang 1999; McNemar's exact p from ``scipy.stats.binomtest`` on the discordant counts);
a combination of such differences (a contrast of two gaps on two problem sets, a change against another change on
the same problems, several seeds' differences pooled) gets ``combined_exact_interval``: each difference's exact
interval at 1 − α/m, summed by interval arithmetic (Bonferroni), whose coverage is at least the level whatever the
rates and the dependence between the terms. No bootstrap is ever taken of 0/1 data; tests/test_study_calibration.py
checks the coverage on simulated 0/1 data.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
from scipy import stats as scipy_stats
from scipy.special import gammaln, xlogy

from evolm.metrics import pass_at_k_problem
from evolm.report.study.claims import parse_metric

BOOTSTRAP_RESAMPLES = 2000
"""Paired bootstrap resamples per interval."""
BOOTSTRAP_SEED = 0
"""The bootstrap's fixed seed: the page regenerates with the same intervals."""
LEVEL = 0.95
"""The intervals' coverage."""
FAMILY_RESAMPLES = 20000
"""Bootstrap resamples for a family-wise interval (``family_level``): its ends are the α / 2m tail quantiles,
a handful of resamples out of 2000 at m = 15."""
ROUND_DIGITS = 12
"""Interval ends and means are rounded to this many decimals before any verdict compares them with 0."""


# -- per-problem values -----------------------------------------------------------------------------------


def pooled_problems(report: dict) -> list[dict]:
    """One record per distinct problem id of an evaluation (``report["problems"]``), in first-appearance order.

    A generated task's held-out draw repeats problems once its split has no fresh ones (procedural Countdown: 64
    rows, 52-59 distinct ids), and a repeated problem is one problem measured more often: its rows are pooled,
    ``n`` and ``c`` summed (so pass@k is the unbiased estimator over all its samples), the samples' ``entropy``
    lists joined, and ``greedy`` the mean of the rows' ``greedy_correct`` (0 or 1 unless the rows disagree, which
    can happen when the rows show the numbers in another order). ``rows`` counts the rows pooled."""
    pooled: dict[str, dict] = {}
    for p in report.get("problems") or []:
        pid = str(p["id"])
        q = pooled.setdefault(pid, {"id": pid, "rows": 0, "entropy": [], "greedies": []})
        q["rows"] += 1
        if "n" in p and "c" in p:
            q["n"], q["c"] = q.get("n", 0) + int(p["n"]), q.get("c", 0) + int(p["c"])
        q["entropy"] += [float(h) for h in p.get("entropy") or [] if h is not None]
        if p.get("greedy_correct") is not None:
            q["greedies"].append(float(bool(p["greedy_correct"])))
    for q in pooled.values():
        greedies = q.pop("greedies")
        q["greedy"] = sum(greedies) / len(greedies) if greedies else None
    return list(pooled.values())


def problem_values(report: dict, metric: str) -> dict[str, float | None]:
    """``{problem id: value}`` of ``metric`` for every distinct problem of one task's evaluation (rows of a repeated
    problem pooled: ``pooled_problems``): pass@k from n and c, the mean of the samples' entropies (None when none
    was recorded), greedy as the share of its rows answered right greedily (0 or 1 for a problem asked once)."""
    name, k = parse_metric(metric)
    out: dict[str, float | None] = {}
    for p in pooled_problems(report):
        if name == "pass":
            if "n" not in p:
                raise ValueError(f"problem {p['id']} has no samples (n, c): pass@{k} needs them")
            value = pass_at_k_problem(p["n"], p["c"], k)
        elif name == "entropy":
            value = sum(p["entropy"]) / len(p["entropy"]) if p["entropy"] else None
        else:
            value = p["greedy"]
        out[p["id"]] = value
    return out


def is_binary(values: Sequence[float]) -> bool:
    """Whether every value is 0 or 1 (a per-problem right/wrong)."""
    return bool(values) and all(v in (0.0, 1.0) for v in values)


# -- bootstrap ---------------------------------------------------------------------------------------------


def bootstrap_interval(diffs: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                       level: float = LEVEL) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: the mean of the per-problem differences and the percentile interval of the mean over
    ``resamples`` resamples of the problems with replacement (paired: one difference per problem)."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.size == 0:
        raise ValueError("a bootstrap needs at least one problem")
    return _rounded(d.mean(), *_percentiles(_resampled_means(d, resamples, seed), level))


def stratified_interval(groups: Sequence[tuple[float, Sequence[float]]], resamples: int = BOOTSTRAP_RESAMPLES,
                        seed: int = BOOTSTRAP_SEED, level: float = LEVEL) -> tuple[float, float, float]:
    """``(mean, lo, hi)`` of ``Σ w_g · mean(d_g)`` over groups ``(w_g, d_g)`` of per-problem values measured on
    different problem sets (several seeds of a method, each on its own held-out problems): each group is resampled
    with replacement on its own (group g with seed ``seed + g``), and the interval is the percentile interval of
    the weighted sum of the resampled means. One group of weight 1 is ``bootstrap_interval``."""
    if not groups or any(len(d) == 0 for _, d in groups):
        raise ValueError("a stratified bootstrap needs at least one problem in each group")
    if len(groups) == 1 and groups[0][0] == 1.0:
        return bootstrap_interval(groups[0][1], resamples, seed, level)
    total = np.zeros(resamples)
    mean = 0.0
    for g, (w, d) in enumerate(groups):
        values = np.asarray(d, dtype=np.float64)
        total = total + w * _resampled_means(values, resamples, seed + g)
        mean += w * values.mean()
    return _rounded(mean, *_percentiles(total, level))


def seed_interval(means: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """``(mean, lo, hi)`` with the seed as the unit: the mean of per-seed means and Student's t interval over them
    (``n - 1`` degrees of freedom, ``scipy.stats.t``), so a method's claim is as uncertain as its seeds disagree,
    whatever the number of problems per seed. Needs >= 2 seeds; with 3 the half-width is 4.30 standard errors."""
    m = np.asarray(means, dtype=np.float64)
    if m.size < 2:
        raise ValueError("an interval over seeds needs at least two seeds")
    half = scipy_stats.t.ppf((1 + level) / 2, m.size - 1) * m.std(ddof=1) / np.sqrt(m.size)
    return _rounded(m.mean(), m.mean() - half, m.mean() + half)


def _resampled_means(values: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """The mean over rows (problems) of ``resamples`` resamples of ``values``'s rows with replacement, drawn with
    ``seed``: shape (resamples,) for a vector, (resamples, columns) for a matrix."""
    idx = np.random.default_rng(seed).integers(0, values.shape[0], size=(resamples, values.shape[0]))
    return values[idx].mean(axis=1)


def _percentiles(means: np.ndarray, level: float):
    """The two ends of the central ``level`` percentile interval of ``means`` (per column for a matrix)."""
    return np.percentile(means, [100 * (1 - level) / 2, 100 * (1 + level) / 2], axis=0)


def _rounded(*values) -> tuple[float, ...]:
    """``values`` rounded to ``ROUND_DIGITS``: the per-problem values are fractions (c/n, pass@k ratios); a resample
    whose differences cancel exactly can come out as +-1e-17 in float sums, which must not "exclude 0" (seen on C8:
    [6.9e-18, 0.021])."""
    return tuple(round(float(x), ROUND_DIGITS) + 0.0 for x in values)


def contrast_interval(first: Sequence[float], second: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES,
                      seed: int = BOOTSTRAP_SEED, level: float = LEVEL) -> tuple[float, float, float]:
    """``(mean, lo, hi)`` of mean(first) − mean(second) for per-problem differences on two *different* problem sets:
    each set is resampled with replacement on its own (seeds ``seed`` and ``seed + 1``), and the interval is the
    percentile interval of the difference of the resampled means."""
    d1, d2 = (np.asarray(x, dtype=np.float64) for x in (first, second))
    if d1.size == 0 or d2.size == 0:
        raise ValueError("a contrast needs at least one problem in each set")
    diff = _resampled_means(d1, resamples, seed) - _resampled_means(d2, resamples, seed + 1)
    return _rounded(d1.mean() - d2.mean(), *_percentiles(diff, level))


def bootstrap_curve(values: np.ndarray, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                    level: float = LEVEL) -> tuple[list[float], list[float], list[float]]:
    """Mean and percentile band of each column of ``values`` (problems × points, e.g. pass@k for k = 1..n),
    resampling the problems (rows) with replacement, the same resamples for every column."""
    v = np.asarray(values, dtype=np.float64)
    lo, hi = _percentiles(_resampled_means(v, resamples, seed), level)
    return v.mean(axis=0).tolist(), lo.tolist(), hi.tolist()


# -- exact intervals ---------------------------------------------------------------------------------------


def exact_proportion_interval(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The Clopper-Pearson interval of a binomial proportion, ``k`` of ``n`` (``scipy.stats.binomtest``); [0, 1]
    when ``n`` is 0."""
    if n == 0:
        return 0.0, 1.0
    ci = scipy_stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=level, method="exact")
    return float(ci.low), float(ci.high)


NUISANCE_GRID = 100
"""Points of the nuisance parameter (the discordance) the exact unconditional p-value is maximised over."""
BISECTION_STEPS = 30
"""Bisection steps per end of an exact unconditional interval (precision 2^-30 of the search range)."""


@functools.lru_cache(maxsize=8)
def _outcomes(n: int) -> tuple[np.ndarray, ...]:
    """Every outcome (n01, n10, rest) of ``n`` paired problems and its log multinomial coefficient."""
    i, j = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    keep = i + j <= n
    i, j = i[keep].astype(np.float64), j[keep].astype(np.float64)
    rest = n - i - j
    return i, j, rest, gammaln(n + 1) - gammaln(i + 1) - gammaln(j + 1) - gammaln(rest + 1)


def _score(n01, n10, n: int, delta: float):
    """Tango's (1998) score statistic of H0: p01 − p10 = ``delta`` for paired binary outcomes (arrays of counts):
    (n01 − n10 − n·delta) / sqrt(n (2 q + delta (1 − delta))), q the restricted maximum-likelihood p10."""
    a, b, c = 2.0 * n, -n01 - n10 + (2.0 * n - n01 + n10) * delta, -n10 * delta * (1.0 - delta)
    q = (-b + np.sqrt(np.maximum(b * b - 4.0 * a * c, 0.0))) / (2.0 * a)
    var = n * (2.0 * q + delta * (1.0 - delta))
    num = n01 - n10 - n * delta
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(var > 1e-15, num / np.sqrt(np.maximum(var, 1e-300)), np.sign(num) * np.inf)
    return np.where(np.abs(num) < 1e-12, 0.0, t)


def _tail(n01: int, n10: int, n: int, delta: float, upper: bool) -> float:
    """The exact unconditional one-sided p-value of the observed (n01, n10) under H0: p01 − p10 = ``delta``: the
    probability of a score at least as extreme, maximised over the nuisance p10 (``NUISANCE_GRID`` points)."""
    i, j, rest, coef = _outcomes(n)
    t = _score(i, j, n, delta)
    t_obs = float(_score(np.array([n01], float), np.array([n10], float), n, delta)[0])
    mask = t >= t_obs - 1e-9 if upper else t <= t_obs + 1e-9
    lo, hi = max(0.0, -delta), (1.0 - delta) / 2.0
    if hi < lo:
        return 0.0
    p10 = np.linspace(lo, hi, NUISANCE_GRID)[:, None]
    p01, p00 = p10 + delta, np.maximum(1.0 - 2.0 * p10 - delta, 0.0)
    logp = coef[mask] + xlogy(i[mask], p01) + xlogy(j[mask], p10) + xlogy(rest[mask], p00)
    return float(np.nan_to_num(np.exp(logp)).sum(axis=1).max())


@functools.lru_cache(maxsize=4096)
def exact_paired_interval(n01: int, n10: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The exact unconditional interval of p01 − p10 from ``n01`` and ``n10`` discordant problems of ``n``: the
    values not rejected by the exact unconditional score test at α/2 on either side (Tango's statistic, the p-value
    maximised over the nuisance; each end found by bisection, and 0 tested itself: the p-value is discontinuous
    where scores tie)."""
    alpha, estimate = (1.0 - level) / 2.0, (n01 - n10) / n

    def end(upper: bool) -> float:
        bound, inside = (-1.0, estimate) if upper else (1.0, estimate)  # search between the bound and the estimate
        if _tail(n01, n10, n, bound + (1e-9 if upper else -1e-9), upper) > alpha:
            return bound
        for _ in range(BISECTION_STEPS):
            mid = (bound + inside) / 2.0
            if _tail(n01, n10, n, mid, upper) > alpha:
                inside = mid
            else:
                bound = mid
        return inside

    lo, hi = end(True), end(False)
    # The p-value jumps where scores tie (at 0 exactly, the outcomes of equal score enter the tail): bisection can
    # stop a hair past 0 while the test at 0 itself accepts. The verdicts ask whether 0 is excluded, so 0 is tested.
    if lo > 0 and _tail(n01, n10, n, 0.0, True) > alpha:
        lo = 0.0
    if hi < 0 and _tail(n01, n10, n, 0.0, False) > alpha:
        hi = 0.0
    return lo, hi


def paired_binary_interval(pairs: Sequence[tuple[float, float]], level: float = LEVEL) -> dict:
    """An exact interval for the difference of two right/wrong rates measured on the same problems.

    ``pairs`` are (a, b) per problem, each 0 or 1: n01 problems only b got right, n10 only a, of N. The difference
    b − a = (n01 − n10) / N gets the exact unconditional interval of p01 − p10 (``exact_paired_interval``: the
    score test inverted, its p-value maximised over the discordance rate, so that the interval's coverage holds
    whatever the discordance; Tango 1998, Chan & Zhang 1999). It is never of zero width: 0 discordant problems of
    64 still allow a difference of ±0.058 at 95%. ``p`` is McNemar's exact test (two-sided binomial of n01 of the
    n01 + n10 discordant against 1/2, ``scipy.stats.binomtest``; 1 when none is discordant).

    Returns ``{mean, lo, hi, p, n01, n10, problems}``."""
    a = np.asarray([x for x, _ in pairs], dtype=np.float64)
    b = np.asarray([y for _, y in pairs], dtype=np.float64)
    if a.size == 0:
        raise ValueError("an exact paired interval needs at least one problem")
    n01, n10, n = int(((a == 0) & (b == 1)).sum()), int(((a == 1) & (b == 0)).sum()), int(a.size)
    lo, hi = exact_paired_interval(n01, n10, n, round(level, 12))
    p = float(scipy_stats.binomtest(n01, n01 + n10, 0.5).pvalue) if n01 + n10 else 1.0
    mean, lo, hi = _rounded((n01 - n10) / n, lo, hi)
    return {"mean": mean, "lo": lo, "hi": hi, "p": p, "n01": n01, "n10": n10, "problems": n}


def combined_exact_interval(terms: Sequence[tuple[float, Sequence[tuple[float, float]]]], level: float = LEVEL) -> dict:
    """An exact interval for a weighted sum of paired binary differences, ``Σ w_g · mean(b − a over pairs_g)``: the
    gap of one set minus the gap of another (a contrast: weights +1 and −1), a change from a base minus another
    change on the same problems, or the mean of several seeds' differences.

    Each term gets its exact paired interval (``paired_binary_interval``) at the level 1 − (1 − ``level``) / m, m the
    number of terms, and the ends are combined by interval arithmetic: ``Σ w_g · [lo_g, hi_g]`` (a negative weight
    swaps a term's ends). By Bonferroni's inequality every term's interval holds its true difference at once with
    probability >= ``level``, so the sum's interval covers the true sum at least at ``level`` whatever the rates, the
    problems' number and the dependence between the terms (two gaps measured on the same problems included): an
    exact (conservative) interval, where a percentile bootstrap on 0/1 data resting on one discordant problem per
    term gives intervals that are too short. One term of weight 1 is ``paired_binary_interval`` itself.

    Returns ``{mean, lo, hi, level_each, terms}``, ``terms`` one dict per term: ``{weight, mean, lo, hi, n01, n10,
    problems}`` (its interval at ``level_each``)."""
    if not terms or any(len(pairs) == 0 for _, pairs in terms):
        raise ValueError("an exact combined interval needs at least one problem in each term")
    each = round(1.0 - (1.0 - level) / len(terms), 12)
    rows, mean, lo, hi = [], 0.0, 0.0, 0.0
    for w, pairs in terms:
        e = paired_binary_interval(pairs, each)
        mean += w * e["mean"]
        lo += w * (e["lo"] if w >= 0 else e["hi"])
        hi += w * (e["hi"] if w >= 0 else e["lo"])
        rows.append({"weight": w, "mean": e["mean"], "lo": e["lo"], "hi": e["hi"], "n01": e["n01"], "n10": e["n10"],
                     "problems": e["problems"]})
    mean, lo, hi = _rounded(mean, lo, hi)
    return {"mean": mean, "lo": lo, "hi": hi, "level_each": each, "terms": rows}


def normal_quantile(q: float) -> float:
    """The standard normal quantile (``scipy.stats.norm.ppf``)."""
    return float(scipy_stats.norm.ppf(q))


def count_interval(record: dict, level: float) -> list[float] | None:
    """A top-k count enrichment's exact (Clopper-Pearson) interval at ``level``, from its record (``observed``,
    ``expected`` = k × ``parameter_share``): the record's own interval is at its ``confidence`` (95%)."""
    share, expected, observed = record.get("parameter_share"), record.get("expected"), record.get("observed")
    if not share or expected is None or observed is None:
        return record.get("enrichment_interval")
    lo, hi = exact_proportion_interval(int(record.get("rounded", observed)), round(expected / share), level)
    return [lo / share, hi / share]


def null_interval(record: dict, level: float) -> list[float] | None:
    """A share-of-‖Δ‖² enrichment's permutation-null interval at ``level``: 1 ± q·sd, with sd the null's standard
    deviation of the enrichment recovered from the record's z ((enrichment − 1) / z) and q the normal quantile,
    clipped like the record's own (share in [0, 1]). Without a usable z the record's 95% interval is kept."""
    z, e, share = record.get("z"), record.get("enrichment"), record.get("parameter_share")
    if not z or e is None or not share:
        return record.get("null_enrichment_interval")
    q, sd = normal_quantile((1 + level) / 2), (e - 1.0) / z
    return [max(0.0, 1.0 - q * sd), min(1.0 / share, 1.0 + q * sd)]


def family_level(tests: int) -> float:
    """The Bonferroni level for ``tests`` counted tests of one claim: 1 − (1 − ``LEVEL``) / tests."""
    return 1.0 - (1.0 - LEVEL) / max(1, tests)
