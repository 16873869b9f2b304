"""Functional sparsity: how much of the update Δ = θ − θ0 is small, and does the small part matter.

"Understanding Evolution Strategies for LLM Reasoning" (2026, arXiv 2608.27351) reports, for its ES
runs (four models), that at a threshold τ within the magnitude range of a *single* ES update 77.6–93.0%
of the nonzero updates have |Δ| < τ, and that the model ``θ0 + Δ·1[|Δ| ≥ τ]`` keeps target-task
pass@1 until the update is very sparse. Whether a given run shows this is what this module measures,
both halves:

- ``update_sparsity(base, trained, taus)``: for each τ, the fraction of nonzero coordinates of Δ
  below τ (overall and per category), and how many coordinates the thresholded model keeps.
- ``threshold_update(base, trained, tau)``: the thresholded model, computed as
  ``torch.where(|θ − θ0| ≥ τ, θ, θ0)`` so every coordinate is *bit-exactly* either the trained or the
  base value. (``θ0 + Δ·mask`` is not: ``θ0 + (θ − θ0)`` need not round back to ``θ`` in float32.)
- ``sparsity_curve(base, trained, taus, evaluate)``: evaluates the thresholded model at every τ plus
  the two end points (base and trained), with any ``evaluate(state) -> metrics`` callable.

The τ grid is scaled to one ES update. ``single_update_rms(seed_log)`` reads the ES run's
``seed_log.jsonl`` records ``{"step", "scale", "coefficients": [c_1..c_N], ...}``: one update is
``u = scale · Σ_i c_i ε_i`` with independent standard-normal noise directions ε_i, so each coordinate
of u is N(0, scale² Σ c_i²) and the RMS of one update is ``scale · sqrt(Σ c_i²)``. The median over the
run's updates is returned (robust to schedules and outliers). This assumes one coefficient per
*independent* direction: an antithetic pair must be logged as one direction with coefficient
``c⁺ − c⁻``. For GRPO (no seed log), pass the scale explicitly (``tau_scale``), typically the ES run's,
so both models are thresholded on the same grid. ``tau_grid(scale, multipliers)`` gives
τ = m × scale for m in ``DEFAULT_MULTIPLIERS``.

The report section (``report_section``) lives here, next to the computation: per model the curve's
anchors (base θ0 and trained θ0 + Δ) and each τ's fraction below, kept fraction and metric, beside
``plots.plot_sparsity``.
"""

from __future__ import annotations

import math
import statistics
from typing import Callable

from evolm.analysis import plots
from evolm.analysis.weights import check_compatible
from evolm.categories import CATEGORIES, param_category
from evolm.errors import UserError
from evolm.markdown import fmt
from evolm.document import Canvas, Section, Table

DEFAULT_MULTIPLIERS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)

Evaluate = Callable[[dict], dict]
"""``evaluate(state_dict) -> {metric name: value}``; the runners only call it and record its result."""


def single_update_rms(seed_log_records: list[dict]) -> float:
    """Median over updates of ``scale · sqrt(Σ c_i²)``, the per-coordinate RMS of one ES update.

    The run's header record (``kind = "header"``: noise, estimator, parameter layout) and updates that
    were not applied (``status`` ``"zero"`` or ``"skipped"``: no fitness signal) are not updates and are
    left out."""
    values = []
    for r in seed_log_records:
        if r.get("kind") == "header" or r.get("status", "applied") != "applied":
            continue
        if "scale" not in r or "coefficients" not in r:
            raise UserError("seed log records need 'scale' and 'coefficients'; pass --tau-scale to set the threshold scale directly")
        values.append(abs(float(r["scale"])) * math.sqrt(sum(float(c) ** 2 for c in r["coefficients"])))
    if not values:
        raise UserError("the seed log is empty; pass --tau-scale to set the threshold scale directly")
    return float(statistics.median(values))


def tau_grid(scale: float, multipliers=DEFAULT_MULTIPLIERS) -> list[float]:
    """Thresholds ``m × scale`` for each multiplier ``m``."""
    if not scale > 0:
        raise UserError(f"the threshold scale must be > 0 (got {scale}); pass --tau-scale")
    return [float(m) * float(scale) for m in multipliers]


def update_sparsity(base: dict, trained: dict, taus) -> dict:
    """For each τ: the fraction of nonzero |Δ| below τ, and the coordinates ``|Δ| ≥ τ`` keeps.

    Returns ``num_params``, ``num_nonzero`` (coordinates with θ != θ0), ``taus``, ``fraction_below``
    (of nonzero updates, per τ), ``num_kept`` and ``kept_fraction`` (of all coordinates, per τ), and
    ``by_category`` with ``num_nonzero``, ``fraction_below`` and ``num_kept`` per category.
    """
    import torch  # local: torch is slow to import, and `evolm --help` imports this module

    check_compatible(base, trained)
    taus = [float(t) for t in taus]
    per_cat = {c: {"num_params": 0, "num_nonzero": 0, "below": [0] * len(taus)} for c in CATEGORIES}
    for name in sorted(base):
        d = (trained[name].to(torch.float32) - base[name].to(torch.float32)).abs().flatten()
        d = d[trained[name].flatten() != base[name].flatten()]
        cat = per_cat[param_category(name)]
        cat["num_params"] += base[name].numel()
        cat["num_nonzero"] += d.numel()
        if d.numel():  # one comparison pass per τ is cheaper than sorting 10⁸ values for a handful of τ
            cat["below"] = [a + int((d < tau).sum()) for a, tau in zip(cat["below"], taus)]
    num_params = sum(c["num_params"] for c in per_cat.values())
    num_nonzero = sum(c["num_nonzero"] for c in per_cat.values())
    below = [sum(c["below"][i] for c in per_cat.values()) for i in range(len(taus))]
    return {
        "num_params": num_params,
        "num_nonzero": num_nonzero,
        "taus": taus,
        "fraction_below": [b / num_nonzero if num_nonzero else 0.0 for b in below],
        "num_kept": [num_nonzero - b for b in below],
        "kept_fraction": [(num_nonzero - b) / num_params if num_params else 0.0 for b in below],
        "by_category": {
            name: {"num_params": c["num_params"], "num_nonzero": c["num_nonzero"],
                   "fraction_below": [b / c["num_nonzero"] if c["num_nonzero"] else 0.0 for b in c["below"]],
                   "num_kept": [c["num_nonzero"] - b for b in c["below"]]}
            for name, c in per_cat.items() if c["num_params"]
        },
    }


def threshold_update(base: dict, trained: dict, tau: float) -> dict:
    """``θ0 + Δ·1[|Δ| ≥ τ]``, bit-exact: trained values where ``|θ − θ0| ≥ τ``, base values elsewhere."""
    import torch  # local: torch is slow to import, and `evolm --help` imports this module

    check_compatible(base, trained)
    out = {}
    for name in base:
        b, t = base[name], trained[name]
        keep = (t.to(torch.float32) - b.to(torch.float32)).abs() >= tau
        out[name] = torch.where(keep, t, b)
    return out


def sparsity_curve(base: dict, trained: dict, taus, evaluate: Evaluate, multipliers=None,
                   base_metrics: dict | None = None) -> dict:
    """Evaluate the thresholded model at every τ; the base and trained models are the end points.

    Returns ``update_sparsity``'s fields plus ``points`` (per τ: ``tau``, ``multiplier`` when given,
    ``fraction_below``, ``kept_fraction``, ``metrics``) and ``reference`` (``base`` and ``trained``
    metrics; pass ``base_metrics`` to reuse the base's when comparing several trained models).
    """
    stats = update_sparsity(base, trained, taus)
    points = []
    for i, tau in enumerate(stats["taus"]):
        metrics = evaluate(threshold_update(base, trained, tau))
        points.append({"tau": tau, "multiplier": None if multipliers is None else float(multipliers[i]),
                       "fraction_below": stats["fraction_below"][i], "kept_fraction": stats["kept_fraction"][i],
                       "metrics": metrics})
    reference = {"base": evaluate(base) if base_metrics is None else base_metrics, "trained": evaluate(trained)}
    return {**stats, "points": points, "reference": reference}


# -- report --------------------------------------------------------------------------------------------

REPORT_TEXT = ("Functional sparsity: how many update coordinates are below a threshold τ, and how the model does "
               "when only the coordinates with |Δ| ≥ τ are kept (`evolm analyze sparsity`).")


def report_table(result: dict) -> Table:
    """Per model: the curve's anchors θ0 (nothing kept) and θ0 + Δ (everything kept) when re-evaluated,
    then per τ the fraction of nonzero |Δ| below τ, the kept fraction and the metric of the thresholded model."""
    metric = result.get("metric", "greedy_pass@1")
    rows = []
    for label, m in result["models"].items():
        points = {p["tau"]: p for p in m.get("points") or []}
        ref = m.get("reference") or {}
        if ref.get("base"):
            rows.append([f"{label}: base θ0", None, None, 0.0, ref["base"].get(metric)])
        if ref.get("trained"):
            rows.append([f"{label}: trained θ0 + Δ", 0.0, 0.0, 1.0, ref["trained"].get(metric)])
        for tau, frac in zip(m["taus"], m["fraction_below"]):
            p = points.get(tau, {})
            rows.append([label, tau, frac, p.get("kept_fraction"), (p.get("metrics") or {}).get(metric)])
    return Table(["model", "τ", "fraction of |Δ| below τ", "kept fraction", f"{metric} of θ0 + Δ·1[|Δ| ≥ τ]"], rows,
                 f"τ scale {fmt(result.get('tau_scale'))} ({result.get('tau_scale_source', '')})")


def report_section(entries, canvas: Canvas) -> Section:
    """The report section of ``sparsity.json`` inputs: ``entries`` are ``(label, directory, result)``."""
    return plots.report_section("sparsity", REPORT_TEXT, entries, canvas, plots.plot_sparsity, report_table)
