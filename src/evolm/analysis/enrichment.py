"""Where an update lands, against a null: enrichment of parameter categories, with p-values and intervals.

"117 of the 144 largest updates are LayerNorm weights" means nothing until it is compared with how many
would land there by chance. The null here is *exchangeable coordinates*: the update treats every
selected coordinate alike (an isotropic random walk does exactly that: every coordinate's update has
the same distribution), so which coordinates end up largest, or carry most of ``‖Δ‖²``, is a random
draw that ignores categories. A category holding a share ``s = n_c / N`` of the N selected coordinates
then expects ``k·s`` of the top k and a share ``s`` of ``‖Δ‖²``; the enrichment ratio is observed /
expected (1 under the null; SmolLM2's norm weights are 0.026% of its parameters, so 0.026 expected in a
top 100).

Two statistics, pure functions of counts and sums:

- Top-k counts (``count_enrichment``): under the null the top-k set is a uniform random k-subset, so a
  category's count is hypergeometric, which for k ≪ N is ``Binomial(k, s)``. Reported: expected
  ``k·s``, observed, enrichment, the exact one-sided binomial p-values ``P(X ≥ obs)`` (enriched) and
  ``P(X ≤ obs)`` (depleted), the two-sided ``min(1, 2·min(...))``, and a Clopper-Pearson interval for
  the category's proportion of the top k, divided by s: an exact ``1 − alpha`` interval for the
  enrichment ratio.
- Share of ``‖Δ‖²`` (``share_enrichment``): the null is the permutation distribution of which
  coordinates a category holds. The category's sum of squares ``S_c`` is then the sum of a random
  ``n_c``-subset of the N values ``x_i = Δ_i²``, whose mean and variance are exact and distribution-free
  (finite-population sampling): ``E = n_c·μ`` and ``Var = n_c (N − n_c)/(N − 1) · σ²`` with μ, σ² the
  mean and variance of the x_i (so heavy-tailed updates widen the null instead of faking significance).
  Reported: parameter share, observed share ``S_c / Σx``, enrichment, the null's ``1 − alpha`` interval
  of the share and of the enrichment (normal approximation to the permutation distribution), the
  z-score and its two-sided normal p-value. For categories of few coordinates the normal
  approximation is rough; the counts are in the output to judge.

Design decisions:

- Binomial tails are summed in log space (``lgamma``), so p-values down to ~1e-300 are exact and
  smaller ones underflow to 0.0 (shown as ``< 1e-300``).
- Six categories are tested at once; p-values are per category, not corrected for multiplicity
  (multiply by the number of categories for a Bonferroni bound).
- The selected coordinates N are the parameters the run trained (an ES run's seed-log header lists
  the tensors it perturbed; otherwise every parameter): a category ES never touched is not "depleted".
"""

from __future__ import annotations

import math

Z_95 = 1.959963984540054
"""The standard normal's 97.5% quantile."""


def _log_pmf(x: int, n: int, p: float) -> float:
    if p <= 0.0:
        return 0.0 if x == 0 else -math.inf
    if p >= 1.0:
        return 0.0 if x == n else -math.inf
    return (math.lgamma(n + 1) - math.lgamma(x + 1) - math.lgamma(n - x + 1)
            + x * math.log(p) + (n - x) * math.log1p(-p))


def _log_sum_exp(values: list[float]) -> float:
    top = max(values)
    if top == -math.inf:
        return -math.inf
    return top + math.log(sum(math.exp(v - top) for v in values))


def binomial_sf(x: int, n: int, p: float) -> float:
    """``P(X ≥ x)`` for ``X ~ Binomial(n, p)``."""
    if x <= 0:
        return 1.0
    if x > n:
        return 0.0
    return min(1.0, math.exp(_log_sum_exp([_log_pmf(i, n, p) for i in range(x, n + 1)])))


def binomial_cdf(x: int, n: int, p: float) -> float:
    """``P(X ≤ x)`` for ``X ~ Binomial(n, p)``."""
    if x < 0:
        return 0.0
    if x >= n:
        return 1.0
    return min(1.0, math.exp(_log_sum_exp([_log_pmf(i, n, p) for i in range(0, x + 1)])))


def _bisect(f, target: float, increasing: bool) -> float:
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if (f(mid) < target) == increasing:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def clopper_pearson(x: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """The exact (Clopper-Pearson) ``1 − alpha`` interval for a binomial proportion, ``x`` successes in ``n``."""
    if n <= 0:
        return 0.0, 1.0
    lo = 0.0 if x <= 0 else _bisect(lambda p: binomial_sf(x, n, p), alpha / 2, increasing=True)
    hi = 1.0 if x >= n else _bisect(lambda p: binomial_cdf(x, n, p), alpha / 2, increasing=False)
    return lo, hi


def count_enrichment(observed: int, k: int, share: float, alpha: float = 0.05) -> dict:
    """A category's count among the top ``k`` coordinates against ``Binomial(k, share)`` (module docstring).

    ``enrichment`` and its interval are None when the category holds no selected coordinate (share 0)."""
    expected = k * share
    lo, hi = clopper_pearson(observed, k, alpha)
    p_enriched, p_depleted = binomial_sf(observed, k, share), binomial_cdf(observed, k, share)
    return {
        "parameter_share": share, "expected": expected, "observed": int(observed),
        "enrichment": observed / expected if expected > 0 else None,
        "enrichment_interval": [lo / share, hi / share] if share > 0 else None,
        "p_enriched": p_enriched, "p_depleted": p_depleted, "p_two_sided": min(1.0, 2 * min(p_enriched, p_depleted)),
        "confidence": 1 - alpha,
    }


def top_k_enrichment(counts: dict[str, int], k: int, param_counts: dict[str, int], alpha: float = 0.05,
                     total: int | None = None) -> dict:
    """``count_enrichment`` for every group in ``param_counts`` with selected coordinates: ``counts`` observed
    among the top ``k``, ``param_counts`` the selected coordinates per group, ``total`` all selected
    coordinates N (default: the sum of ``param_counts``; pass it when only some groups are listed)."""
    total = sum(param_counts.values()) if total is None else int(total)
    return {g: count_enrichment(int(counts.get(g, 0)), k, n / total, alpha)
            for g, n in param_counts.items() if n > 0 and total > 0}


def share_enrichment(sum_sq: float, num_params: int, total_sq: float, total_fourth: float, total_params: int,
                     alpha: float = 0.05) -> dict:
    """A category's share of ``‖Δ‖²`` against the permutation null (module docstring).

    ``sum_sq``: the category's ``Σ Δ²``; ``num_params``: its coordinates n_c; ``total_sq``, ``total_fourth``:
    ``Σ Δ²`` and ``Σ Δ⁴`` over all N = ``total_params`` selected coordinates."""
    n, big_n = int(num_params), int(total_params)
    share = n / big_n if big_n else 0.0
    observed = sum_sq / total_sq if total_sq > 0 else None  # nothing moved: no share to compare
    z_q = normal_quantile(1 - alpha / 2)
    out = {"parameter_share": share, "share": observed,
           "enrichment": observed / share if share > 0 and observed is not None else None,
           "null_share_interval": None, "null_enrichment_interval": None, "z": None, "p_two_sided": None,
           "confidence": 1 - alpha}
    if total_sq <= 0 or big_n < 2 or n == 0:
        return out
    mean = total_sq / big_n
    variance = max(total_fourth / big_n - mean * mean, 0.0)
    sd_sum = math.sqrt(n * (big_n - n) / (big_n - 1) * variance)
    sd_share = sd_sum / total_sq
    interval = [max(0.0, share - z_q * sd_share), min(1.0, share + z_q * sd_share)]
    out["null_share_interval"] = interval
    out["null_enrichment_interval"] = [interval[0] / share, interval[1] / share]
    if sd_sum > 0:
        z = (sum_sq - n * mean) / sd_sum
        out["z"] = z
        out["p_two_sided"] = math.erfc(abs(z) / math.sqrt(2))
    else:  # every coordinate has the same Δ²: the share is fixed at the parameter share
        out["z"], out["p_two_sided"] = 0.0, 1.0
    return out


def normal_quantile(q: float) -> float:
    """The standard normal quantile, by bisection on ``erf`` (only a few are ever needed)."""
    if abs(q - 0.975) < 1e-15:
        return Z_95
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if 0.5 * math.erfc(-mid / math.sqrt(2)) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def format_p(p: float | None) -> str:
    """A p-value for a table: ``< 1e-300`` when it underflowed, 3 significant digits otherwise."""
    if p is None:
        return ""
    return "< 1e-300" if p == 0 else f"{p:.3g}"
