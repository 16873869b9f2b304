"""Ablation analyses over sweep results: pure functions.

A sweep (``evolm sweep``) writes ``sweep_summary.json`` whose ``points`` are plain records::

    {"name": "es.population=8", "assignments": {"es.population": 8}, "status": "finished",
     "curve": [[step, reward], ...], "updates": 300, "update_status": {"applied": 298, "zero": 2},
     "eval_before": {...summary...} | None, "eval_after": {...} | None, "evaluations": 2400, ...}

Every function here takes such a list (any iterable of dicts with those fields) and returns a dict
that is both written to JSON and plotted by ``evolm.report``. Nothing here reads files.

Definitions (stated once, used everywhere):

- ``smooth(values, w)``: trailing moving average, ``s_t = mean(values[max(0, t − w + 1) .. t])``;
  ``w = 1`` is no smoothing. Curves are smoothed before any comparison below.
- Population scaling ("Understanding Evolution Strategies for LLM Reasoning", arXiv 2608.27351, reports
  which N stay "within 0.5% of the N = 30 reference at update 300" in its GSM8K runs): for a
  population N with smoothed reward curve r_N and the reference r_ref (default: the largest N of
  the group), compared on the updates both logged, ``within_band_from`` is the first update u such
  that for every compared update u' ≥ u: ``|r_N(u') − r_ref(u')| ≤ band × |r_ref(u')|``
  (``mode="relative"``, default band 0.005 = 0.5%) or ``≤ band`` (``mode="absolute"``); None when even
  the last update is outside the band. The reference itself is within from its first update. Each row
  also carries the point's zero updates (all members scored the same, so no step was taken) and, when
  the centre was scored, how many members scored above / equal to / below it (``members_vs_centre``):
  the fewer members change an output, the more of them an update needs to see any signal.
- σ sweep: per σ, start reward (first update), final reward (smoothed, last update), the fraction
  of zero updates (all members scored the same: σ too small to change any output), and flags:
  ``no_signal`` (zero-update fraction ≥ ``no_signal``, default 0.5), ``below_start`` (final < start),
  ``collapsed`` (final < ``collapse`` × start, default 0.5, or held-out greedy accuracy after <
  ``collapse`` × before), ``heldout_below_base`` (held-out greedy accuracy after < before). The start
  reward is the perturbed population's at update 1, so a large σ already lowers it; the held-out
  flags compare with the unperturbed base.
- Estimator / shaping comparisons: final and mean (area under the curve / updates) reward per value,
  held-out before/after when present, and, for the estimator, the evaluation budget (members ×
  updates): one-point and antithetic are compared at equal budget, i.e. equal population N
  (antithetic spends it on N/2 directions, each scored at ±ε); ``equal_budget`` says whether the
  budgets match.
- Grid keys are matched by their last component (``es.population``, ``stages.es.population`` ...);
  the points of a sweep are grouped by their other assignments, so a population × model grid gives
  one scaling analysis per model.

The spread of the ES update estimate (``evolm analyze update-variance``) is in ``update_variance``.
"""

from __future__ import annotations

import math
from typing import Iterable

WINDOW = 1
"""Default trailing window of the reward curves (1: no smoothing)."""
BAND = 0.005
"""Default population-scaling band: the paper's 0.5%."""
BAND_MODE = "relative"
"""Default band mode: ``|r_N − r_ref| ≤ band · |r_ref|``."""

# -- curves ------------------------------------------------------------------------------------------


def smooth(values, window: int = 1) -> list[float]:
    """Trailing moving average over ``window`` values (fewer at the start); ``window=1`` is the identity."""
    if window < 1:
        raise ValueError(f"smoothing window must be >= 1 (got {window})")
    out, acc = [], []
    for v in values:
        acc.append(float(v))
        if len(acc) > window:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def _curve(point: dict, window: int) -> tuple[list[int], list[float]]:
    pairs = [(int(s), float(r)) for s, r in point.get("curve") or [] if r is not None and math.isfinite(float(r))]
    steps = [s for s, _ in pairs]
    return steps, smooth([r for _, r in pairs], window)


def first_within_band(steps, values, ref_steps, ref_values, band: float = BAND, mode: str = BAND_MODE) -> dict:
    """The first update from which ``values`` stays within the band around ``ref_values`` (module docstring).

    Returns ``within_band_from`` (update or None), ``final_gap`` (value − reference at the last
    compared update), ``max_abs_gap_after`` (largest |gap| from ``within_band_from`` on) and
    ``compared`` (number of common updates).
    """
    if mode not in ("relative", "absolute"):
        raise ValueError(f"band mode must be 'relative' or 'absolute' (got '{mode}')")
    ref = dict(zip(ref_steps, ref_values))
    common = [(s, v, ref[s]) for s, v in zip(steps, values) if s in ref]
    if not common:
        return {"within_band_from": None, "final_gap": None, "max_abs_gap_after": None, "compared": 0}
    inside = [abs(v - r) <= (band * abs(r) if mode == "relative" else band) for _, v, r in common]
    start = None
    for i in range(len(common) - 1, -1, -1):  # walk back from the end while inside the band
        if not inside[i]:
            break
        start = i
    return {"within_band_from": None if start is None else common[start][0],
            "final_gap": common[-1][1] - common[-1][2],
            "max_abs_gap_after": None if start is None else max(abs(v - r) for _, v, r in common[start:]),
            "compared": len(common)}


# -- grouping ----------------------------------------------------------------------------------------


def _match_key(point: dict, key: str) -> str | None:
    """The assignment key of ``point`` that is ``key`` or ends with ``.<last component of key>``."""
    last = key.split(".")[-1]
    for k in point.get("assignments", {}):
        if k == key or k.split(".")[-1] == last:
            return k
    return None


def _group(points: Iterable[dict], key: str) -> dict[str, list[tuple[object, dict]]]:
    """``{label of the other assignments: [(value of key, point), ...]}`` for points that set ``key``."""
    groups: dict[str, list[tuple[object, dict]]] = {}
    for p in points:
        k = _match_key(p, key)
        if k is None:
            continue
        rest = {a: v for a, v in p["assignments"].items() if a != k}
        label = ",".join(f"{a}={v}" for a, v in sorted(rest.items())) or "all"
        groups.setdefault(label, []).append((p["assignments"][k], p))
    return groups


def _sort_key(value):
    return (0, float(value), "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0.0, str(value))


def _heldout(point: dict, which: str, metric: str = "greedy"):
    summary = point.get(which) or {}
    return summary.get(metric)


def _usable(p: dict) -> bool:
    return bool(p.get("curve"))


# -- ablations ---------------------------------------------------------------------------------------


def population_scaling(points, key: str = "es.population", reference=None, band: float = BAND,
                       mode: str = BAND_MODE, window: int = WINDOW) -> dict:
    """For each group and population N: the first update from which N stays within the band of the reference N."""
    out = {"key": key, "band": band, "mode": mode, "window": window, "groups": {}}
    for label, members in _group(points, key).items():
        members = sorted(((v, p) for v, p in members if _usable(p)), key=lambda vp: _sort_key(vp[0]))
        if not members:
            continue
        values = [v for v, _ in members]
        ref_value = values[-1] if reference is None else reference
        if ref_value not in values:
            out["groups"][label] = {"reference": ref_value, "rows": [], "curves": {},
                                    "note": f"no finished point with {key}={ref_value} in this group"}
            continue
        ref_steps, ref_curve = _curve(dict(members)[ref_value], window)
        rows, curves = [], {}
        for v, p in members:
            steps, curve = _curve(p, window)
            counts = p.get("update_status") or {}
            row = {"value": v, "name": p.get("name"), "final_reward": curve[-1] if curve else None,
                   "zero_updates": counts.get("zero", 0), "members_vs_centre": p.get("members_vs_centre"),
                   "updates": steps[-1] if steps else 0, **first_within_band(steps, curve, ref_steps, ref_curve, band, mode)}
            rows.append(row)
            curves[str(v)] = [[s, r] for s, r in zip(steps, curve)]
        out["groups"][label] = {"reference": ref_value, "rows": rows, "curves": curves}
    return out


def sigma_sweep(points, key: str = "es.sigma", window: int = 1, collapse: float = 0.5, no_signal: float = 0.5) -> dict:
    """Final reward against σ, with the failure flags of the module docstring."""
    out = {"key": key, "window": window, "collapse": collapse, "no_signal": no_signal, "groups": {}}
    for label, members in _group(points, key).items():
        rows = []
        for v, p in sorted(members, key=lambda vp: _sort_key(vp[0])):
            steps, curve = _curve(p, window)
            raw = [float(r) for _, r in p.get("curve") or [] if r is not None]
            counts = p.get("update_status") or {}
            total = sum(counts.values())
            zero_fraction = counts.get("zero", 0) / total if total else None
            start = raw[0] if raw else None
            final = curve[-1] if curve else None
            before, after = _heldout(p, "eval_before"), _heldout(p, "eval_after")
            flags = []
            if zero_fraction is not None and zero_fraction >= no_signal:
                flags.append("no_signal")
            if start is not None and final is not None and final < start:
                flags.append("below_start")
            if (start is not None and final is not None and final < collapse * start) or (
                    before is not None and after is not None and after < collapse * before):
                flags.append("collapsed")
            if before is not None and after is not None and after < before:
                flags.append("heldout_below_base")
            rows.append({"value": v, "name": p.get("name"), "status": p.get("status"), "start_reward": start,
                         "final_reward": final, "change": None if start is None or final is None else final - start,
                         "zero_update_fraction": zero_fraction, "heldout_before": before, "heldout_after": after,
                         "flags": flags})
        ok = [r for r in rows if r["final_reward"] is not None and not r["flags"]]
        best = max(ok, key=lambda r: r["final_reward"])["value"] if ok else None
        out["groups"][label] = {"rows": rows, "best": best}
    return out


def _comparison(points, key: str, window: int) -> dict:
    out = {"key": key, "window": window, "groups": {}}
    for label, members in _group(points, key).items():
        rows, curves = [], {}
        for v, p in sorted(members, key=lambda vp: _sort_key(vp[0])):
            steps, curve = _curve(p, window)
            raw = [float(r) for _, r in p.get("curve") or [] if r is not None]
            rows.append({"value": v, "name": p.get("name"), "status": p.get("status"), "updates": steps[-1] if steps else 0,
                         "final_reward": curve[-1] if curve else None,
                         "mean_reward": sum(raw) / len(raw) if raw else None,
                         "evaluations": p.get("evaluations"),
                         "heldout_before": _heldout(p, "eval_before"), "heldout_after": _heldout(p, "eval_after")})
            curves[str(v)] = [[s, r] for s, r in zip(steps, curve)]
        out["groups"][label] = {"rows": rows, "curves": curves}
    return out


def estimator_comparison(points, key: str = "es.estimator", window: int = 1) -> dict:
    """One-point vs antithetic: curves, final/mean reward and the evaluation budget of each."""
    out = _comparison(points, key, window)
    for group in out["groups"].values():
        budgets = {r["evaluations"] for r in group["rows"] if r["evaluations"] is not None}
        group["equal_budget"] = len(budgets) == 1 if budgets else None
    return out


def shaping_comparison(points, key: str = "es.shaping", window: int = 1) -> dict:
    """z-score vs none vs centred rank: curves and final/mean reward."""
    return _comparison(points, key, window)


ABLATIONS = {"population": population_scaling, "sigma": sigma_sweep, "estimator": estimator_comparison,
             "shaping": shaping_comparison}
"""Ablation analysis by the last component of a grid key."""


def ablations_for(points, grid_keys, window: int = WINDOW, band: float = BAND, mode: str = BAND_MODE,
                  reference=None) -> dict:
    """Every ablation a sweep's grid supports: ``{name: result}`` for grid keys ending in population,
    sigma, estimator or shaping."""
    points = list(points)
    out = {}
    for key in grid_keys:
        name = key.split(".")[-1]
        if name == "population":
            out[name] = population_scaling(points, key, reference=reference, band=band, mode=mode, window=window)
        elif name == "sigma":
            out[name] = sigma_sweep(points, key, window=window)
        elif name in ABLATIONS:
            out[name] = ABLATIONS[name](points, key, window=window)
    return out
