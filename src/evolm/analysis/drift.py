"""Parameter drift: how far training moved the weights, overall and per part of the network.

The headline number is the relative whole-model distance ``||θ − θ0||₂ / ||θ0||₂`` over every
parameter (tied embeddings once), the measure of "Understanding Evolution Strategies for LLM
Reasoning" (2026, arXiv 2608.27351), which reports GRPO 0.0475 against ES 1.933 on
Qwen2.5-1.5B-Instruct (about 40×) in its runs. The same ratio is given per category
(``categories.CATEGORIES``), per subcategory (``attention.q.bias``, ``norm.input_layernorm.weight``,
...), per transformer block and per tensor, with the share of the squared distance each part
carries, the number of coordinates that changed at all, and the largest and RMS coordinate change.

A share means little without the part's size: under an update that treats every coordinate alike a
category's share of ``‖Δ‖²`` is its share of the parameters. ``enrichment`` gives, per category and
subcategory, the parameter share, the share of ``‖Δ‖²``, their ratio and the permutation null's
interval and p-value (``evolm.analysis.enrichment.share_enrichment``), over the parameters the run
trained (``scope``; default all).

Design decisions:

- Pure function over two float32 state dicts; norms are accumulated in float64 so 10⁸ squared
  terms do not lose precision (``Σ Δ⁴``, for the null's variance, likewise).
- ``base`` must be the weights the run started from (a bfloat16 run's rounded base, not the float32
  spec): ``evolm analyze`` checks it against the fingerprint in the run's ``run.json``. Against the
  wrong base Δ holds the rounding of every coordinate bfloat16 cannot represent (up to 0.0039 on
  weights between 1 and 2, often the norms), which shifts every category's share.
- A coordinate "changed" when ``θ != θ0`` exactly (float32). Within a group, ``relative_distance`` is
  ``||Δ_group|| / ||θ0_group||`` (None when the group's base norm is zero) and
  ``share_of_squared_distance`` is ``||Δ_group||² / ||Δ||²``, so the shares of the categories add to 1.
- Drift is not forgetting (the digest's R5): this module only measures weights; held-out evaluations
  live elsewhere.
- The report section (``report_section``) lives here, next to the computation: a table of the whole-
  model and per-category relative distances and shares, beside ``plots.plot_drift``.
"""

from __future__ import annotations

import math

from evolm.analysis import plots
from evolm.analysis.enrichment import format_p, share_enrichment
from evolm.analysis.weights import check_compatible
from evolm.categories import CATEGORIES, layer_index, param_category, param_subcategory
from evolm.document import Canvas, Section, Table


class _Group:
    """Accumulates sums over tensors for one group of coordinates."""

    def __init__(self):
        self.delta_sq = 0.0
        self.delta_fourth = 0.0
        self.base_sq = 0.0
        self.num_params = 0
        self.num_changed = 0
        self.max_abs_delta = 0.0

    def add(self, delta_sq: float, delta_fourth: float, base_sq: float, num_params: int, num_changed: int,
            max_abs: float) -> None:
        self.delta_sq += delta_sq
        self.delta_fourth += delta_fourth
        self.base_sq += base_sq
        self.num_params += num_params
        self.num_changed += num_changed
        self.max_abs_delta = max(self.max_abs_delta, max_abs)

    def to_dict(self, total_delta_sq: float) -> dict:
        return {
            "relative_distance": math.sqrt(self.delta_sq) / math.sqrt(self.base_sq) if self.base_sq > 0 else None,
            "distance": math.sqrt(self.delta_sq),
            "base_norm": math.sqrt(self.base_sq),
            "share_of_squared_distance": self.delta_sq / total_delta_sq if total_delta_sq > 0 else 0.0,
            "num_params": self.num_params,
            "num_changed": self.num_changed,
            "max_abs_delta": self.max_abs_delta,
            "rms_delta": math.sqrt(self.delta_sq / self.num_params) if self.num_params else 0.0,
        }


def drift(base: dict, trained: dict, scope=None) -> dict:
    """Relative distance ``||θ − θ0|| / ||θ0||`` of ``trained`` from ``base``, whole-model and broken down.

    Returns ``relative_distance``, ``distance``, ``base_norm``, ``num_params``, ``num_changed``,
    ``max_abs_delta``, ``rms_delta`` and the same fields under ``by_category``, ``by_subcategory``,
    ``by_layer`` (block index, ``"none"`` outside blocks) and ``by_tensor``; and ``enrichment``: per
    category and subcategory the share of ``‖Δ‖²`` against the parameter share, over the tensors in
    ``scope`` (names the run trained; None: all), with ``changed_outside_scope`` (coordinates that moved
    in tensors outside it: 0 for a run that trained only its scope).
    """
    import torch  # local: torch is slow to import, and `evolm --help` imports this module

    check_compatible(base, trained)
    scope = set(base) if scope is None else set(scope) & set(base)
    total, scoped = _Group(), _Group()
    groups: dict[str, dict[str, _Group]] = {"by_category": {c: _Group() for c in CATEGORIES},
                                            "by_subcategory": {}, "by_layer": {}, "by_tensor": {}}
    in_scope: dict[str, dict[str, _Group]] = {"by_category": {}, "by_subcategory": {}}
    outside_changed = 0
    for name in sorted(base):
        b = base[name].to(torch.float32)
        d = trained[name].to(torch.float32) - b
        d2 = d * d
        stats = (float(d2.sum(dtype=torch.float64)), float(d2.pow(2).sum(dtype=torch.float64)),
                 float(b.pow(2).sum(dtype=torch.float64)), d.numel(), int((trained[name] != base[name]).sum()),
                 float(d.abs().max()) if d.numel() else 0.0)
        layer = layer_index(name)
        keys = {"by_category": param_category(name), "by_subcategory": param_subcategory(name),
                "by_layer": "none" if layer is None else str(layer), "by_tensor": name}
        total.add(*stats)
        for group, key in keys.items():
            groups[group].setdefault(key, _Group()).add(*stats)
        if name in scope:
            scoped.add(*stats)
            for group in in_scope:
                in_scope[group].setdefault(keys[group], _Group()).add(*stats)
        else:
            outside_changed += stats[4]
    out = total.to_dict(total.delta_sq)
    del out["share_of_squared_distance"]
    for group, members in groups.items():
        items = members.items()
        if group == "by_layer":
            items = sorted(items, key=lambda kv: (kv[0] == "none", int(kv[0]) if kv[0] != "none" else 0))
        out[group] = {k: g.to_dict(total.delta_sq) for k, g in items if g.num_params or group != "by_category"}
    out["enrichment"] = {
        "scope": "all parameters" if scope == set(base) else f"{len(scope)} of {len(base)} tensors (the ones the run trained)",
        "num_params": scoped.num_params, "changed_outside_scope": outside_changed,
        **{group: {key: {"num_params": g.num_params,
                         **share_enrichment(g.delta_sq, g.num_params, scoped.delta_sq, scoped.delta_fourth, scoped.num_params)}
                   for key, g in sorted(members.items(), key=lambda kv: _order(kv[0]))}
           for group, members in in_scope.items()}}
    return out


def _order(key: str) -> tuple:
    category = key.split(".")[0]
    return (CATEGORIES.index(category) if category in CATEGORIES else len(CATEGORIES), key)


# -- report --------------------------------------------------------------------------------------------

REPORT_TEXT = ("Relative parameter drift ‖θ − θ0‖ / ‖θ0‖ per parameter category, and each category's share of "
               "‖Δ‖² against its share of the trained parameters: enrichment = share of ‖Δ‖² / parameter share, 1 "
               "when the update treats every coordinate alike; the null interval and p-value are those of the "
               "permutation null (random assignment of coordinates to categories) (`evolm analyze drift`).")


def report_table(result: dict) -> Table:
    """Whole-model and per-category relative distance, per model."""
    cats = [c for c in CATEGORIES if any(c in m["by_category"] for m in result["models"].values())]
    rows = [[label, m["relative_distance"]] + [(m["by_category"].get(c) or {}).get("relative_distance") for c in cats]
            for label, m in result["models"].items()]
    return Table(["model", "whole model"] + [f"{c}" for c in cats], rows, "relative distance ‖θ − θ0‖ / ‖θ0‖")


def enrichment_table(result: dict) -> Table:
    """Per model and category: parameter share, share of ‖Δ‖², enrichment, the null's interval, z and p."""
    rows = []
    for label, m in result["models"].items():
        e = m.get("enrichment")
        if not e:
            continue
        for c, v in e["by_category"].items():
            lo_hi = v.get("null_enrichment_interval")
            rows.append([label, c, v["num_params"], v["parameter_share"], v["share"], v["enrichment"],
                         "" if lo_hi is None else f"{lo_hi[0]:.3g} – {lo_hi[1]:.3g}", v.get("z"), format_p(v.get("p_two_sided"))])
    scope = {m["enrichment"]["scope"] for m in result["models"].values() if m.get("enrichment")}
    return Table(["model", "category", "parameters", "parameter share", "share of ‖Δ‖²", "enrichment",
                  "null 95% interval", "z", "p (two-sided)"], rows,
                 f"share of ‖Δ‖² against parameter share (scope: {', '.join(sorted(scope))})")


def report_tables(result: dict) -> list[Table]:
    return [report_table(result)] + ([enrichment_table(result)] if any(m.get("enrichment") for m in result["models"].values()) else [])


def report_section(entries, canvas: Canvas) -> Section:
    """The report section of ``drift.json`` inputs: ``entries`` are ``(label, directory, result)``."""
    return plots.report_section("drift", REPORT_TEXT, entries, canvas, plots.plot_drift, report_tables)
