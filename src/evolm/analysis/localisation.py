"""Localisation: where the largest coordinates of the update Δ = θ − θ0 land.

Qiu et al. count the top-k coordinates of |Δ| by parameter type: in DeepSeek-R1-Distill-Qwen-1.5B,
117 of ES's top 144 are LayerNorm weights and 24 attention-projection biases, while GRPO's top 100
are all token embeddings or the LM head, and GRPO's largest update is an order of magnitude smaller.
``top_k_localisation`` returns those counts (by ``categories.param_category`` and
``param_subcategory``) together with every selected coordinate.

Design decisions:

- Exact global top-k without concatenating the model: each tensor contributes its own top
  ``min(k, numel)`` candidates, and the global top k is taken among the candidates.
- Ties are broken deterministically (larger |Δ| first, then parameter name, then flat index), so the
  same checkpoints always give the same list.
- Tied embeddings are counted once, as ``embedding``: for a tied model the embedding row *is* the LM
  head row, which the caller reports as ``tied_embeddings``.
- The report section (``report_section``) lives here, next to the computation: the top-k counts per
  category, beside ``plots.plot_localisation``.
"""

from __future__ import annotations

from evolm.analysis import plots
from evolm.analysis.weights import check_compatible
from evolm.categories import CATEGORIES, param_category, param_subcategory
from evolm.document import Canvas, Section, Table


def top_k_localisation(base: dict, trained: dict, k: int = 100) -> dict:
    """The ``k`` largest-|Δ| coordinates of ``trained − base``, counted by category and subcategory.

    Returns ``k``, ``num_selected`` (fewer than k when fewer coordinates changed), ``by_category``
    (every category, zeros included), ``by_subcategory``, ``max_abs_delta``, ``kth_abs_delta`` (the
    smallest selected |Δ|), and ``coordinates``: a list of ``{name, index (the multi-dimensional
    position), delta, base, trained, category, subcategory}`` in decreasing |Δ|.
    """
    return top_k_localisations(base, trained, [k])[k]


def top_k_localisations(base: dict, trained: dict, ks) -> dict:
    """``{k: top_k_localisation(base, trained, k)}`` for several k, from one pass over the weights."""
    import torch  # local: torch is slow to import, and `evolm --help` imports this module

    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1:
        raise ValueError(f"every k must be >= 1 (got {ks})")
    check_compatible(base, trained)
    k_max = ks[-1]
    candidates: list[tuple[float, str, int, float]] = []
    for name in sorted(base):
        d = (trained[name].to(torch.float32) - base[name].to(torch.float32)).flatten()
        if d.numel() == 0:
            continue
        values, idx = torch.topk(d.abs(), min(k_max, d.numel()), sorted=False)
        keep = values > 0
        values, idx = values[keep], idx[keep]
        candidates += zip(values.tolist(), [name] * len(idx), idx.tolist(), d[idx].tolist())
    candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
    return {k: _summarise(base, trained, candidates[:k], k) for k in ks}


def _summarise(base: dict, trained: dict, chosen: list, k: int) -> dict:
    by_category = {c: 0 for c in CATEGORIES}
    by_subcategory: dict[str, int] = {}
    coordinates = []
    for v, name, flat, delta in chosen:
        category, sub = param_category(name), param_subcategory(name)
        by_category[category] += 1
        by_subcategory[sub] = by_subcategory.get(sub, 0) + 1
        coordinates.append({"name": name, "index": list(_unravel(flat, tuple(base[name].shape))), "delta": delta,
                            "base": float(base[name].flatten()[flat]), "trained": float(trained[name].flatten()[flat]),
                            "category": category, "subcategory": sub})
    return {
        "k": k,
        "num_selected": len(chosen),
        "by_category": by_category,
        "by_subcategory": dict(sorted(by_subcategory.items(), key=lambda kv: (-kv[1], kv[0]))),
        "max_abs_delta": chosen[0][0] if chosen else 0.0,
        "kth_abs_delta": chosen[-1][0] if chosen else 0.0,
        "coordinates": coordinates,
    }


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return tuple(reversed(out))


# -- report --------------------------------------------------------------------------------------------

REPORT_TEXT = "Where the largest-magnitude updates land, counted by parameter category (`evolm analyze localisation`)."


def report_table(result: dict) -> Table:
    """Per model and k: the largest |Δ| and how many of the top k coordinates each category holds."""
    rows = [[label, k, loc["max_abs_delta"]] + [loc["by_category"].get(c, 0) for c in CATEGORIES]
            for label, per_k in result["models"].items() for k, loc in per_k.items()]
    return Table(["model", "k", "max |Δ|"] + list(CATEGORIES), rows, "top-k largest |Δ| coordinates by category")


def report_section(entries, canvas: Canvas) -> Section:
    """The report section of ``localisation.json`` inputs: ``entries`` are ``(label, directory, result)``."""
    return plots.report_section("localisation", REPORT_TEXT, entries, canvas, plots.plot_localisation, report_table)
