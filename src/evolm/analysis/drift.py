"""Parameter drift: how far training moved the weights, overall and per part of the network.

The headline number is the paper's relative whole-model distance ``||θ − θ0||₂ / ||θ0||₂`` over every
parameter (tied embeddings once). Qiu et al. report GRPO 0.0475 against ES 1.933 on Qwen2.5-1.5B
(about 40×). The same ratio is given per category (``categories.CATEGORIES``), per subcategory
(``attention.q.bias``, ``norm.input_layernorm.weight``, ...), per transformer block and per tensor,
with the share of the squared distance each part carries, the number of coordinates that changed at
all, and the largest and RMS coordinate change.

Design decisions:

- Pure function over two float32 state dicts; norms are accumulated in float64 so 10⁸ squared
  terms do not lose precision.
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
from evolm.analysis.weights import check_compatible
from evolm.categories import CATEGORIES, layer_index, param_category, param_subcategory
from evolm.document import Canvas, Section, Table


class _Group:
    """Accumulates sums over tensors for one group of coordinates."""

    def __init__(self):
        self.delta_sq = 0.0
        self.base_sq = 0.0
        self.num_params = 0
        self.num_changed = 0
        self.max_abs_delta = 0.0

    def add(self, delta_sq: float, base_sq: float, num_params: int, num_changed: int, max_abs: float) -> None:
        self.delta_sq += delta_sq
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


def drift(base: dict, trained: dict) -> dict:
    """Relative distance ``||θ − θ0|| / ||θ0||`` of ``trained`` from ``base``, whole-model and broken down.

    Returns ``relative_distance``, ``distance``, ``base_norm``, ``num_params``, ``num_changed``,
    ``max_abs_delta``, ``rms_delta`` and the same fields under ``by_category``, ``by_subcategory``,
    ``by_layer`` (block index, ``"none"`` outside blocks) and ``by_tensor``.
    """
    import torch  # local: torch is slow to import, and `evolm --help` imports this module

    check_compatible(base, trained)
    total = _Group()
    groups: dict[str, dict[str, _Group]] = {"by_category": {c: _Group() for c in CATEGORIES},
                                            "by_subcategory": {}, "by_layer": {}, "by_tensor": {}}
    for name in sorted(base):
        b = base[name].to(torch.float32)
        d = trained[name].to(torch.float32) - b
        stats = (float(d.pow(2).sum(dtype=torch.float64)), float(b.pow(2).sum(dtype=torch.float64)), d.numel(),
                 int((trained[name] != base[name]).sum()), float(d.abs().max()) if d.numel() else 0.0)
        layer = layer_index(name)
        keys = {"by_category": param_category(name), "by_subcategory": param_subcategory(name),
                "by_layer": "none" if layer is None else str(layer), "by_tensor": name}
        total.add(*stats)
        for group, key in keys.items():
            groups[group].setdefault(key, _Group()).add(*stats)
    out = total.to_dict(total.delta_sq)
    del out["share_of_squared_distance"]
    for group, members in groups.items():
        items = members.items()
        if group == "by_layer":
            items = sorted(items, key=lambda kv: (kv[0] == "none", int(kv[0]) if kv[0] != "none" else 0))
        out[group] = {k: g.to_dict(total.delta_sq) for k, g in items if g.num_params or group != "by_category"}
    return out


# -- report --------------------------------------------------------------------------------------------

REPORT_TEXT = "Relative parameter drift ‖θ − θ0‖ / ‖θ0‖ per parameter category (`evolm analyze drift`)."


def report_table(result: dict) -> Table:
    """Whole-model and per-category relative distance, and each category's share of ‖Δ‖², per model."""
    cats = [c for c in CATEGORIES if any(c in m["by_category"] for m in result["models"].values())]
    rows = [[label, m["relative_distance"]] + [(m["by_category"].get(c) or {}).get("relative_distance") for c in cats] +
            [(m["by_category"].get(c) or {}).get("share_of_squared_distance") for c in cats]
            for label, m in result["models"].items()]
    return Table(["model", "whole model"] + [f"{c} rel." for c in cats] + [f"{c} share of ‖Δ‖²" for c in cats], rows,
                 "relative distance ‖θ − θ0‖ / ‖θ0‖")


def report_section(entries, canvas: Canvas) -> Section:
    """The report section of ``drift.json`` inputs: ``entries`` are ``(label, directory, result)``."""
    return plots.report_section("drift", REPORT_TEXT, entries, canvas, plots.plot_drift, report_table)
