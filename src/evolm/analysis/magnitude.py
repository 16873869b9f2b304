"""Magnitude-aware analyses: is a finding about Δ = θ − θ0 ES's, or weight magnitude × dtype spacing?

In bfloat16 a weight can only move in steps of its own ulp, ``ulp(θ) ≈ |θ| · 2^-7``: a norm weight
near 1 moves by at least 0.0039, a matrix weight near 0.02 by 1.2e-4. So wherever a run's arithmetic
rounds in a low-precision dtype (Qiu et al.'s in-place bf16 loop, ``evolm.es.reference``), the largest
|Δ| land on the largest weights, whatever the optimiser did: a top-k count, a sparsity fraction or a
drift share read in absolute |Δ| can be a property of the dtype. The exchangeable-coordinate null of
``evolm.analysis.enrichment`` treats every coordinate alike, so it cannot tell. This module adds two
views that can:

- **Relative terms** (``relative_localisation``, ``relative_sparsity``): the same top-k counts and
  below-τ fractions on ``r = |Δ| / |θ0|``. In a dtype of p mantissa bits one ulp is between 2^-p and
  2^(1-p) of |θ| for every weight, so a walk in ulp steps is (up to that factor of 2) exchangeable in r.
  Coordinates with θ0 = 0 have no relative change and are left out (counted as ``num_zero_base``).
- **The dtype-matched null** (``dtype_null_localisation``), calibrated (issue 40): each coordinate's |Δ| is
  permuted only among the coordinates of equal spacing, ulp(θ0) (in a dtype whose spacing is a power of two,
  the same exponent). Step counts ``s_i = Δ_i / ulp(θ0_i)`` depend on the spacing by construction (a float32
  walk of equal |Δ| everywhere takes 2^7 more steps on a weight near 0.01 than on one near 1), so a null that
  shuffles them across spacings reports "effects" where there can be none: the earlier null (step counts
  shuffled over every coordinate, 20 shuffles) gave attention 0.42-0.46x and MLP 1.28-1.41x at p = 0.048 on
  exact float32 walks, and on Gemma put every shuffle's top 100 in the norm weights. Within one spacing group
  the question is the right one: do a category's coordinates take larger steps than the other coordinates of
  the same spacing? Such a permutation keeps each group's multiset of |Δ|, so the k-th value and each group's
  number of coordinates above it and tied at it are fixed; the permutations are drawn exactly as multivariate
  hypergeometric draws of categories per group (no tensor is permuted: 10,000 permutations cost seconds), and
  the exact null mean (``expected``) is computed beside them. Per category: the tie-split observed count,
  the expected count, the permutations' mean and 95% range, enrichment = observed / expected, and one-sided
  p-values ``(1 + #{null ≥ obs}) / (R + 1)`` (and ≤ for depletion), with R ≥ 1,000 permutations
  (``MIN_PERMUTATIONS``; default 10,000; fewer are refused: 20 put the floor of p at 0.048).
  Counts are tie-aware (``_top_k_cut``): in bf16 the k-th largest |Δ| is shared by up to tens of
  thousands of coordinates, so ties at the k-th value are split evenly (the expected counts of a random
  tie-break) on both sides of the comparison, never counted as the tied set's size.
  A category that holds the top k because its weights are large (a spacing group of its own) is at
  enrichment 1 with p = 1 both ways: the count cannot tell ES from spacing there. Planted checks
  (``tests/test_magnitude.py``): no effect on exact float32 walks nor on seeded bf16 walks of the same
  arithmetic; an effect where one category's steps are larger within its spacing.
  Only a walk that stayed near θ0 has a step count: a coordinate whose θ0 is 0, or whose θ left
  ``[θ0/2, 2·θ0]`` (crossed zero, or moved by more than |θ0|), walked through spacings other than ulp(θ0),
  and its Δ / ulp(θ0) means nothing (a zero's spacing is 2^-133 in bf16, 2^-149 in float32: a 1e-4 move is
  ~1e36 "steps"). Such coordinates are *held out*: they keep their observed Δ in every shuffle (they still
  compete for the top k, on both sides alike) and their step counts are not shuffled onto others. Before
  this rule, the 325,128 zero weights of SmolLM2-135M's dequantised 4-bit base (6.2 M in Gemma-3-270M's)
  carried ~1e33-1e38 steps, and wherever a shuffle put them was the null's top k: the null read parameter
  shares (SmolLM2) or "all in norm" (Gemma, the largest spacings), not spacing. ``held_out`` reports how
  many coordinates were held, by category, and their share of the observed top k.

``magnitude_analysis`` runs all of it plus the per-category step-count summary (``step_counts``: how
many coordinates moved, the median and mean |steps|, the share that moved exactly one ulp). The dtype
is the one the run's arithmetic rounded in (``model.dtype`` of an ``es.arithmetic = "reference"`` or ``"artifact"`` run
and of a GRPO run, whose optimiser updates the model's own weights; float32 for exact ES, whose
masters are float32).

Design decisions:

- ``ulp(x)`` is ``2^(e − p)`` for ``|x|`` in ``[2^e, 2^(e+1))`` with p the dtype's mantissa bits
  (bfloat16 7, float16 10, float32 23), and the smallest subnormal spacing below the normal range, so
  it is defined for every finite θ0, zero included.
- The permutation is over every coordinate in scope (unchanged ones carry |Δ| = 0), with a seeded numpy
  generator: results are reproducible and the null's population is the one the exchangeable null uses.
- Steps are float64 (``_steps``): a float32 zero's spacing is 2^-149, so Δ / spacing overflows float32
  for |Δ| > 4.8e-7; spacings are powers of two, so every result that was finite in float32 is unchanged.
  Within a factor of 2 of θ0 the difference θ − θ0 is exact (Sterbenz), so a held-in step count is exact.
- Memory: the coordinates in scope are flattened once per trained model (θ0, θ, category ids); the null
  keeps the held-in coordinates' |Δ| (float64), spacing (float32) and categories compacted, the held-out
  ones' |Δ|, and one group index (int64): about 30 bytes per coordinate besides the loaded weights. (The
  earlier null, which permuted tensors, measured 7.6 GB resident for a SmolLM2-135M run, 14.5 GB for Gemma.)
- Planted checks (``tests/test_magnitude.py``): a pure ±1-ulp walk in bfloat16 puts the top k in the
  norm weights in absolute |Δ| and nowhere special relatively or against the dtype-matched null; the
  same-length float32 Gaussian walk has no absolute enrichment; a bf16 walk whose norm coordinates take
  more steps is enriched against the dtype-matched null.
"""

from __future__ import annotations

from evolm.analysis.enrichment import top_k_enrichment
from evolm.analysis.weights import check_compatible
from evolm.categories import CATEGORIES, param_category

MANTISSA_BITS = {"bfloat16": 7, "float16": 10, "float32": 23}
"""Explicit mantissa bits p of each dtype the analyses know (one ulp of 1.0 is 2^-p)."""
MIN_EXPONENT = {"bfloat16": -126, "float16": -14, "float32": -126}
"""The smallest normal exponent of each dtype (below it the spacing is constant)."""


def _check_dtype(dtype: str) -> str:
    if dtype not in MANTISSA_BITS:
        from evolm.errors import UserError

        raise UserError(f"dtype must be one of {sorted(MANTISSA_BITS)} (got '{dtype}')")
    return dtype


def ulp(x, dtype: str):
    """The spacing of ``dtype``'s representable values at ``|x|`` (float32 tensor in, float32 out)."""
    import torch  # local: torch is slow to import, and `evolm --help` imports this module

    p, emin = MANTISSA_BITS[_check_dtype(dtype)], MIN_EXPONENT[dtype]
    x = x.to(torch.float32)
    _, e = torch.frexp(x)  # |x| = m · 2^e, m in [0.5, 1): |x| in [2^(e-1), 2^e); frexp(0) has e = 0
    e = torch.where(x == 0, torch.full_like(e, emin), torch.clamp(e - 1, min=emin))
    return torch.ldexp(torch.ones_like(x, dtype=torch.float32), (e - p).to(torch.float32))


def _steps(b, t, dtype: str):
    """``(spacing, steps)``: ulp(θ0) and Δ / ulp(θ0), both float64 (module docstring: a float32 zero's spacing)."""
    spacing = ulp(b, dtype).double()
    return spacing, (t - b).double() / spacing


def _held_in(b, t):
    """Coordinates whose Δ / ulp(θ0) is a walk's step count: θ0 ≠ 0 and θ in ``[θ0/2, 2·θ0]`` (same sign, so
    the spacing changed by at most a factor of 2 along the way). Unchanged coordinates are held in (0 steps)."""
    import torch

    a, c = b.abs(), t.abs()
    return (b != 0) & (torch.sign(t) == torch.sign(b)) & (c <= 2 * a) & (2 * c >= a)


def _flat(base: dict, trained: dict, names: list[str]):
    import torch

    b = torch.cat([base[n].to(torch.float32).flatten() for n in names])
    t = torch.cat([trained[n].to(torch.float32).flatten() for n in names])
    return b, t


def _category_index(base: dict, names: list[str]):
    """Category id (index into CATEGORIES) of every flattened coordinate of ``names``, as a tensor."""
    import torch

    return torch.cat([torch.full((base[n].numel(),), CATEGORIES.index(param_category(n)), dtype=torch.int8) for n in names])


def _names(base: dict, trained: dict, scope) -> list[str]:
    check_compatible(base, trained)
    return sorted(base) if scope is None else sorted(set(scope) & set(base))


def _coordinates(base: dict, trained: dict, scope) -> tuple:
    """``(θ0, θ, category ids)`` of every coordinate in scope, flattened once (float32, float32, int8)."""
    names = _names(base, trained, scope)
    b, t = _flat(base, trained, names)
    return b, t, _category_index(base, names)


def _top_k_cut(score, cat_ids, k: int, held=None) -> dict:
    """The top ``k`` coordinates of ``score`` (> 0) by category, with ties at the k-th value split evenly.

    A low-precision Δ takes few distinct values (bf16: whole ulps), so the k-th largest is often shared
    by thousands of coordinates and any top-k list is a tie-break (module docstring of
    ``evolm.analysis.localisation``). ``counts``: per category, the coordinates above the k-th value plus
    its share ``(k − above) / tied`` of each tied one: the expected counts of a uniformly random
    tie-break, summing to k (integers when no tie is cut), so an observed cut and a null's compare on
    one scale. ``at_least_kth``: the whole set at or above the k-th value, by category (integers);
    ``size``, ``tied`` (coordinates equal to the k-th value) and ``kth`` describe it.

    ``held``: optional ``(score, cat_ids)`` of more coordinates competing for the same top k (the dtype
    null's held-out ones, kept apart so that the shuffled part need not be copied into one tensor);
    ``held_counts`` is then their tie-split share of ``counts``."""
    import torch

    parts = [(score, cat_ids)] + ([held] if held is not None else [])
    k = min(k, sum(int((s > 0).sum()) for s, _ in parts))
    if k == 0:
        zero = {c: 0 for c in CATEGORIES}
        return {"k": 0, "kth": None, "size": 0, "tied": 0, "counts": zero, "at_least_kth": dict(zero),
                "held_counts": dict(zero)}
    tops = [torch.topk(s, min(k, s.numel()), sorted=False).values.double() for s, _ in parts if s.numel()]
    kth = torch.topk(torch.cat(tops), k, sorted=False).values.min()
    n = len(CATEGORIES)
    ca, ct = [], []
    for s, ids in parts:
        ca.append(torch.bincount(ids[s > kth].long(), minlength=n).tolist())
        ct.append(torch.bincount(ids[s == kth].long(), minlength=n).tolist())
    n_above, n_tied = sum(map(sum, ca)), sum(map(sum, ct))
    share = (k - n_above) / n_tied if n_above + n_tied > k else 1

    def split(a, t):  # share is the int 1 when no tie is cut: integer counts
        return {c: a[i] + share * t[i] for i, c in enumerate(CATEGORIES)}

    total_a = [sum(x[i] for x in ca) for i in range(n)]
    total_t = [sum(x[i] for x in ct) for i in range(n)]
    return {"k": k, "kth": float(kth), "size": n_above + n_tied, "tied": n_tied, "counts": split(total_a, total_t),
            "at_least_kth": {c: total_a[i] + total_t[i] for i, c in enumerate(CATEGORIES)},
            "held_counts": split(ca[1], ct[1]) if held is not None else {c: 0 for c in CATEGORIES}}


def _top_k_counts(score, cat_ids, k: int, held=None) -> dict:
    """``_top_k_cut``'s tie-split counts per category."""
    return _top_k_cut(score, cat_ids, k, held)["counts"]


def relative_localisation(base: dict, trained: dict, k: int = 100, scope=None, coords=None) -> dict:
    """The top ``k`` coordinates of ``|Δ| / |θ0|`` by category, against the exchangeable null.

    Returns ``k``, ``num_selected``, ``num_zero_base`` (in-scope coordinates with θ0 = 0, left out),
    ``by_category`` (counts) and ``enrichment`` (``top_k_enrichment`` over the coordinates with θ0 ≠ 0)."""
    import torch

    b, t, cat_ids = coords or _coordinates(base, trained, scope)
    d = t - b
    nonzero_base = b != 0
    rel = torch.where(nonzero_base, d.abs() / b.abs().clamp_min(torch.finfo(torch.float32).tiny), torch.zeros_like(d))
    cut = _top_k_cut(rel, cat_ids, k)
    population = torch.bincount(cat_ids[nonzero_base].long(), minlength=len(CATEGORIES))
    param_counts = {c: int(population[i]) for i, c in enumerate(CATEGORIES)}
    size = cut["size"]  # the set the cut selects: the top k, or every coordinate tied at its k-th value too
    return {"k": k, "num_selected": cut["k"], "num_zero_base": int((~nonzero_base).sum()), "by_category": cut["counts"],
            "at_least_kth": {"size": size, "tied": cut["tied"], "kth": cut["kth"], "by_category": cut["at_least_kth"]},
            "enrichment": top_k_enrichment(cut["at_least_kth"], size, param_counts) if size else {}}


def step_counts(base: dict, trained: dict, dtype: str, scope=None, coords=None) -> dict:
    """Per category: coordinates, how many moved, and their |steps| = |Δ| / ulp(θ0) in ``dtype``
    (``median_steps``, ``mean_steps``, ``one_step_share``: the share of moved coordinates within 1.5 ulp),
    over the moved coordinates whose step count is a walk's (``_held_in``); ``num_held_out``: the moved
    ones that are not (θ0 = 0, or θ outside [θ0/2, 2·θ0]), left out of the step statistics."""
    import torch

    b, t, cat_ids = coords or _coordinates(base, trained, scope)
    steps = _steps(b, t, dtype)[1].abs()
    moved_all = t != b
    held_in = _held_in(b, t)
    out = {}
    for i, c in enumerate(CATEGORIES):
        mask = cat_ids == i
        if not bool(mask.any()):
            continue
        moved = steps[mask & moved_all & held_in]
        out[c] = {"num_params": int(mask.sum()), "num_changed": int((mask & moved_all).sum()),
                  "num_held_out": int((mask & moved_all & ~held_in).sum()),
                  "median_steps": float(moved.median()) if moved.numel() else 0.0,
                  "mean_steps": float(moved.double().mean()) if moved.numel() else 0.0,
                  "one_step_share": float((moved < 1.5).double().mean()) if moved.numel() else 0.0}
    return {"dtype": dtype, "by_category": out}


MIN_PERMUTATIONS = 1000
"""The fewest permutations ``dtype_null_localisation`` takes: with R of them the smallest p it can report is
1 / (R + 1), and 20 put that floor at 0.048 (issue 40)."""
DEFAULT_PERMUTATIONS = 10_000
"""``analyze magnitude``'s default number of permutations (the p floor 1e-4)."""
NULL_KIND = "within-spacing"
"""The ``null`` field of a dtype-null record computed by ``dtype_null_localisation`` (permutations within coordinates
of equal spacing). A record without it came from the old null that shuffled step counts across spacings."""


def dtype_null_localisation(base: dict, trained: dict, dtype: str, k: int = 100, scope=None,
                            permutations: int = DEFAULT_PERMUTATIONS, seed: int = 0, coords=None) -> dict:
    """Top-k |Δ| counts per category against the within-spacing null (module docstring): each coordinate's |Δ|
    permuted only among the coordinates of the same ``dtype`` spacing ulp(θ0).

    Such a permutation keeps each spacing group's multiset of |Δ|, hence the k-th value and how many of each
    group's coordinates are above it (``a_g``) or tied at it (``t_g``); it only chooses *which* coordinates of the
    group get them. So a permutation's count per category is drawn exactly, without permuting anything: per group,
    a multivariate hypergeometric draw of ``a_g + t_g`` coordinates from the group's categories, of which ``a_g``
    (a second draw) are above the k-th value and the rest share its tie evenly. ``expected`` is the exact null
    mean, ``sum_g (a_g + share · t_g) · n_gc / n_g`` (held-out coordinates added as observed).

    Returns ``k``, ``dtype``, ``null`` (``NULL_KIND``), ``permutations``, ``groups`` (spacing groups reaching the
    top k), ``observed`` (tie-split counts), ``held_out`` (coordinates kept at their observed Δ: ``num``,
    ``by_category``, ``in_observed_top_k``), ``at_least_kth`` and ``by_category``: per category ``observed``,
    ``expected``, ``null_mean`` (over the permutations), ``null_interval`` (their 2.5% and 97.5%), ``enrichment``
    (observed / expected; None when the null expects none), ``p_enriched`` and ``p_depleted``
    (``(1 + #{null ≥ observed}) / (R + 1)``, and ≤), and ``null`` and ``permutations`` again (so that a record read
    alone says which null made it)."""
    import numpy as np
    import torch

    if permutations < MIN_PERMUTATIONS:
        raise ValueError(f"permutations must be >= {MIN_PERMUTATIONS} (got {permutations}): with R permutations the "
                         f"smallest p is 1 / (R + 1)")
    b, t, cat_ids = coords or _coordinates(base, trained, scope)
    keep = _held_in(b, t)
    spacing = ulp(b[keep], dtype)  # float32 powers of two: equal spacing = equal exponent
    score = (t[keep] - b[keep]).double().abs()  # exact: θ within a factor of 2 of θ0 (Sterbenz)
    ids = cat_ids[keep]
    held = ((t[~keep] - b[~keep]).double().abs(), cat_ids[~keep])
    cut = _top_k_cut(score, ids, k, held)
    observed = cut["counts"]
    n = len(CATEGORIES)
    fixed = np.array([cut["held_counts"][c] for c in CATEGORIES], dtype=float)
    groups = []
    if cut["k"]:
        kth = cut["kth"]
        above_all = cut["size"] - cut["tied"]
        share = (cut["k"] - above_all) / cut["tied"] if cut["size"] > cut["k"] else 1.0
        _, group = torch.unique(spacing, return_inverse=True)
        ng = int(group.max()) + 1 if group.numel() else 0
        key = group.long() * n + ids.long()
        composition = torch.bincount(key, minlength=ng * n).reshape(ng, n).numpy().astype(np.int64)
        above = torch.bincount(group[score > kth], minlength=ng).numpy()
        tied = torch.bincount(group[score == kth], minlength=ng).numpy()
        groups = [(composition[g], int(above[g]), int(tied[g])) for g in range(ng) if above[g] or tied[g]]
    rng = np.random.default_rng(int(seed))
    draws = np.tile(fixed, (permutations, 1))
    expected = fixed.copy()
    for colors, a, tg in groups:
        expected += (a + share * tg) * colors / colors.sum()
        x = rng.multivariate_hypergeometric(colors, a + tg, size=permutations).astype(float)
        if tg == 0 or share == 1.0:
            draws += x
        elif a == 0:
            draws += share * x
        else:  # which a of the a + t drawn are above the k-th value: a second draw from what the first drew
            y = np.stack([rng.multivariate_hypergeometric(row.astype(np.int64), a) for row in x])
            draws += y + share * (x - y)
    present = {CATEGORIES[i] for i in torch.unique(cat_ids).tolist()}
    by_category = {}
    for i, c in enumerate(CATEGORIES):
        if c not in present:
            continue
        values = np.sort(draws[:, i])
        obs, exp = observed[c], float(expected[i])
        tol = 1e-9 * max(1.0, abs(obs))
        by_category[c] = {"observed": obs, "expected": exp, "null_mean": float(values.mean()),
                          "null_interval": [float(values[int(0.025 * (len(values) - 1))]),
                                            float(values[int(round(0.975 * (len(values) - 1)))])],
                          "enrichment": obs / exp if exp > 0 else None,
                          "p_enriched": float((1 + (values >= obs - tol).sum()) / (len(values) + 1)),
                          "p_depleted": float((1 + (values <= obs + tol).sum()) / (len(values) + 1)),
                          "null": NULL_KIND, "permutations": permutations}
    held_ids = torch.bincount(held[1].long(), minlength=n).tolist()
    return {"k": k, "dtype": dtype, "null": NULL_KIND, "permutations": permutations, "groups": len(groups),
            "observed": observed,
            "held_out": {"rule": "theta0 = 0, or theta outside [theta0/2, 2 theta0]: kept at the observed delta",
                         "num": int(held[0].numel()), "by_category": dict(zip(CATEGORIES, held_ids)),
                         "in_observed_top_k": cut["held_counts"]},
            "at_least_kth": {"size": cut["size"], "tied": cut["tied"], "kth": cut["kth"]}, "by_category": by_category}


def relative_sparsity(base: dict, trained: dict, taus, scope=None, coords=None) -> dict:
    """For each relative threshold τ: the fraction of changed coordinates (θ0 ≠ 0) with ``|Δ| / |θ0| < τ``,
    overall and per category (``update_sparsity``'s question in relative terms)."""
    import torch

    taus = [float(x) for x in taus]
    b, t, cat_ids = coords or _coordinates(base, trained, scope)
    keep = (t != b) & (b != 0)
    rel = ((t - b).abs() / b.abs().clamp_min(torch.finfo(torch.float32).tiny))[keep]
    ids = cat_ids[keep]
    by_category = {}
    for i, c in enumerate(CATEGORIES):
        r = rel[ids == i]
        if r.numel():
            by_category[c] = {"num_changed": int(r.numel()), "fraction_below": [float((r < x).double().mean()) for x in taus]}
    return {"taus": taus, "num_changed": int(rel.numel()),
            "fraction_below": [float((rel < x).double().mean()) if rel.numel() else 0.0 for x in taus],
            "by_category": by_category}


DEFAULT_RELATIVE_TAUS = (1e-4, 1e-3, 1e-2, 1e-1)
"""Relative thresholds of ``relative_sparsity`` (one bf16 ulp is 2^-8 .. 2^-7 ≈ 0.004 .. 0.008 of |θ|)."""


def magnitude_analysis(base: dict, trained: dict, dtype: str, k: int = 100, scope=None,
                       permutations: int = DEFAULT_PERMUTATIONS,
                       seed: int = 0, taus=DEFAULT_RELATIVE_TAUS) -> dict:
    """Absolute top-k enrichment (the exchangeable null), relative top-k, the dtype-matched null, step
    counts and relative sparsity of one trained model against its base, in one dict."""
    from evolm.analysis.localisation import top_k_localisation

    absolute = top_k_localisation(base, trained, k, scope)
    coords = _coordinates(base, trained, scope)  # flattened once for the four views below
    return {"dtype": dtype, "k": k,
            "absolute": {"by_category": absolute["by_category"], "enrichment": absolute["enrichment"]["by_category"],
                         "tied": absolute["tied"], "at_least_kth": absolute["at_least_kth"]},
            "relative": relative_localisation(base, trained, k, scope, coords=coords),
            "dtype_null": dtype_null_localisation(base, trained, dtype, k, scope, permutations, seed, coords=coords),
            "steps": step_counts(base, trained, dtype, scope, coords=coords),
            "relative_sparsity": relative_sparsity(base, trained, taus, scope, coords=coords)}

