"""Localisation: where the largest coordinates of the update Δ = θ − θ0 land, against a null.

"Understanding Evolution Strategies for LLM Reasoning" (2026, arXiv 2608.27351) counts the top-k
coordinates of |Δ| by parameter type and reports, for its runs, that 117 of ES's top 144 in
DeepSeek-R1-Distill-Qwen-1.5B are LayerNorm weights and 24 attention-projection biases, while GRPO's
top 100 are all token embeddings or the LM head. ``top_k_localisation`` returns those counts (by
``categories.param_category`` and ``param_subcategory``) together with every selected coordinate, and
what makes them readable: per category the count expected if the top k were a random draw of the
trained coordinates (``k × the category's share of them``), the enrichment ratio observed / expected,
its exact binomial interval and p-values (``evolm.analysis.enrichment``). A raw count is not a
finding: norm weights are 0.026% of SmolLM2-135M's parameters, so an isotropic update puts 0.026 of
its top 100 there, and 3 norm coordinates would be a 100-fold enrichment.

Design decisions:

- Exact global top-k without concatenating the model: each tensor contributes its own top
  ``min(k, numel)`` candidates, and the global top k is taken among the candidates.
- Ties are broken deterministically (larger |Δ| first, then parameter name, then flat index), so the
  same checkpoints always give the same list. But a tie-broken top k says nothing about where large
  updates are: in bfloat16, |Δ| takes few distinct values (multiples of each weight's ulp), and after
  120 reference-arithmetic updates on SmolLM2-135M 33,355 coordinates share the 100th value (2^-7), so
  "the top 100" would be the alphabetically first tensors' (embeddings, then layer 0's MLP). Every k
  therefore also reports ``at_least_kth``: all coordinates with |Δ| ≥ the k-th value, counted by
  category with their own enrichment, and ``tied``: whether that set is larger than k (then read it,
  not the top-k counts).
- The null's population is the coordinates the run trained (``scope``: an ES run's perturbed tensors,
  from its seed-log header; default all), so restricting ES to some categories does not make the
  others look depleted. Only coordinates that changed can be selected; when fewer than k changed, the
  null is over the ``num_selected`` that were.
- ``base`` must be the weights the run started from: against a float32 base, a bfloat16 run's Δ holds
  the rounding of every weight (up to 0.0039 on weights between 1 and 2, often norm weights), which
  puts the top k wherever the rounding is largest, whatever training did. ``evolm analyze`` checks the base against the run's recorded
  fingerprint.
- Tied embeddings are counted once, as ``embedding``: for a tied model the embedding row *is* the LM
  head row, which the caller reports as ``tied_embeddings``.
- The report section (``report_section``) lives here, next to the computation: per category the
  expected and observed counts, the enrichment and its interval and p-values, beside
  ``plots.plot_localisation``.
"""

from __future__ import annotations

from evolm.analysis import plots
from evolm.analysis.enrichment import count_enrichment, format_p, top_k_enrichment
from evolm.analysis.weights import check_compatible
from evolm.categories import CATEGORIES, param_category, param_subcategory
from evolm.document import Canvas, Section, Table


def top_k_localisation(base: dict, trained: dict, k: int = 100, scope=None) -> dict:
    """The ``k`` largest-|Δ| coordinates of ``trained − base``, counted by category and subcategory.

    Returns ``k``, ``num_selected`` (fewer than k when fewer coordinates changed), ``by_category``
    (every category, zeros included), ``by_subcategory``, ``max_abs_delta``, ``kth_abs_delta`` (the
    smallest selected |Δ|), ``enrichment`` (``scope``, ``num_params`` and, ``by_category`` and
    ``by_subcategory``, each group's ``count_enrichment`` against the trained coordinates in ``scope``:
    tensor names, None for all), and ``coordinates``: a list of ``{name, index (the
    multi-dimensional position), delta, base, trained, category, subcategory}`` in decreasing |Δ|.
    """
    return top_k_localisations(base, trained, [k], scope)[k]


def top_k_localisations(base: dict, trained: dict, ks, scope=None) -> dict:
    """``{k: top_k_localisation(base, trained, k, scope)}`` for several k, from one pass over the weights."""
    import torch  # local: torch is slow to import, and `evolm --help` imports this module

    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1:
        raise ValueError(f"every k must be >= 1 (got {ks})")
    check_compatible(base, trained)
    population = parameter_counts(base, scope)
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
    out = {k: _summarise(base, trained, candidates[:k], k, population) for k in ks}
    thresholds = sorted({loc["kth_abs_delta"] for loc in out.values() if loc["num_selected"]})
    sets = _at_least(base, trained, thresholds, population)
    for loc in out.values():
        loc["at_least_kth"] = sets[loc["kth_abs_delta"]] if loc["num_selected"] else {}
        loc["tied"] = bool(loc["at_least_kth"]) and loc["at_least_kth"]["num_coordinates"] > loc["num_selected"]
        loc["tie_split"] = tie_split(loc)
    return out


def tie_split(loc: dict) -> dict:
    """A top-k record's counts per category with the tie at the k-th value split evenly (issue 40): the
    coordinates above the k-th |Δ| plus ``(k − above) / tied`` of each tied one, the expected counts of a
    uniformly random tie-break. A tie-broken top k says where the alphabetically first tensors are, and the tied
    set (``at_least_kth``) is not a top k: 33,352 coordinates tied at SmolLM2's 100th value put 2.98x "norm" in
    the set where, split evenly, the top 100 hold 0.03 norm coordinates against 0.026 expected. Computed from the
    record alone (its ``coordinates``, ``kth_abs_delta`` and ``at_least_kth``), so records written before this
    field existed give the same numbers (``report --study`` reads ``tie_split`` that way).

    Returns ``k``, ``tied`` (coordinates at the k-th value), ``tie_share`` (the share of each tied coordinate
    counted) and ``by_category``: ``count_enrichment`` of the count rounded to whole coordinates (``rounded``; its
    exact interval and p-values), with ``observed`` the split count and ``enrichment`` = observed / expected."""
    k, kth = loc["num_selected"], loc["kth_abs_delta"]
    shares = {c: e["parameter_share"] for c, e in ((loc.get("enrichment") or {}).get("by_category") or {}).items()}
    above = {c: 0 for c in shares}
    for x in loc.get("coordinates", []):
        if abs(x["delta"]) > kth:
            above[x["category"]] = above.get(x["category"], 0) + 1
    at_least = (loc.get("at_least_kth") or {}).get("by_category") or {}
    tied = {c: at_least.get(c, 0) - above.get(c, 0) for c in shares} if loc.get("tied") else {c: 0 for c in shares}
    n_tied = sum(tied.values())
    share = (k - sum(above.values())) / n_tied if n_tied else 1.0
    counts = {c: above[c] + share * tied[c] for c in shares} if n_tied else {c: loc["by_category"].get(c, 0) for c in shares}
    by_category = {}
    for c, s in shares.items():
        rec = count_enrichment(int(round(counts[c])), k, s) if k else {}
        if rec:
            rec.update(observed=counts[c], rounded=int(round(counts[c])),
                       enrichment=counts[c] / rec["expected"] if rec["expected"] > 0 else None)
        by_category[c] = rec
    return {"k": k, "tied": n_tied, "tie_share": share, "by_category": by_category}


def _at_least(base: dict, trained: dict, thresholds: list[float], population: dict) -> dict:
    """For each threshold (> 0), every coordinate with |Δ| ≥ it, counted by category, with its enrichment
    against the trained coordinates: what a top k cut inside a tie really selects from. One pass over
    the weights for all thresholds."""
    import torch

    counts = {t: {c: 0 for c in CATEGORIES} for t in thresholds}
    for name in sorted(base):
        if not thresholds:
            break
        d = (trained[name].to(torch.float32) - base[name].to(torch.float32)).abs()
        for t in thresholds:
            counts[t][param_category(name)] += int((d >= t).sum())
    out = {}
    for t, by_category in counts.items():
        n = sum(by_category.values())
        out[t] = {"threshold": t, "num_coordinates": n, "by_category": by_category,
                  "enrichment": top_k_enrichment(by_category, n, population["by_category"]) if n else {}}
    return out


def parameter_counts(state: dict, scope=None) -> dict:
    """The null's population: ``{"scope", "num_params", "by_category", "by_subcategory", "names"}``: coordinate
    counts over the tensors in ``scope`` (names; None: every tensor of ``state``), and those tensors' names."""
    names = sorted(state) if scope is None else sorted(set(scope) & set(state))
    by_category = {c: 0 for c in CATEGORIES}
    by_subcategory: dict[str, int] = {}
    for name in names:
        n = state[name].numel()
        by_category[param_category(name)] += n
        sub = param_subcategory(name)
        by_subcategory[sub] = by_subcategory.get(sub, 0) + n
    return {"scope": "all parameters" if len(names) == len(state) else f"{len(names)} of {len(state)} tensors (the ones the run trained)",
            "num_params": sum(by_category.values()), "by_category": by_category, "by_subcategory": by_subcategory,
            "names": set(names)}


def _summarise(base: dict, trained: dict, chosen: list, k: int, population: dict) -> dict:
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
    selected = len(chosen)
    subs = {s: n for s, n in population["by_subcategory"].items() if n}
    return {
        "k": k,
        "num_selected": selected,
        "by_category": by_category,
        "by_subcategory": dict(sorted(by_subcategory.items(), key=lambda kv: (-kv[1], kv[0]))),
        "max_abs_delta": chosen[0][0] if chosen else 0.0,
        "kth_abs_delta": chosen[-1][0] if chosen else 0.0,
        "enrichment": {
            "scope": population["scope"], "num_params": population["num_params"],
            "outside_scope": sum(1 for c in coordinates if c["name"] not in population["names"]),
            "by_category": top_k_enrichment(by_category, selected, population["by_category"]) if selected else {},
            # every subcategory the top k reached (a subcategory it missed is in the category row)
            "by_subcategory": top_k_enrichment(by_subcategory, selected, {s: subs[s] for s in by_subcategory if s in subs},
                                               total=population["num_params"]) if selected else {},
        },
        "coordinates": coordinates,
    }


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return tuple(reversed(out))


# -- report --------------------------------------------------------------------------------------------

REPORT_TEXT = ("Where the largest-magnitude updates land, against the null in which the top k are a random draw of "
               "the trained coordinates: per category the expected count (k × its share of the trained parameters), "
               "the observed count, the enrichment observed / expected with its exact 95% interval, and binomial "
               "p-values for more (enriched) and fewer (depleted) than expected (`evolm analyze localisation`).")


def report_table(result: dict) -> Table:
    """Per model, k and category: parameter share, expected and observed counts, enrichment, interval, p-values."""
    rows = []
    for label, per_k in result["models"].items():
        for k, loc in per_k.items():
            for c, e in (loc.get("enrichment") or {}).get("by_category", {}).items():
                lo_hi = e.get("enrichment_interval")
                rows.append([label, k, c, e["parameter_share"], e["expected"], e["observed"], e["enrichment"],
                             "" if lo_hi is None else f"{lo_hi[0]:.3g} – {lo_hi[1]:.3g}",
                             format_p(e["p_enriched"]), format_p(e["p_depleted"])])
    return Table(["model", "k", "category", "parameter share", "expected", "observed", "enrichment", "95% interval",
                  "p (enriched)", "p (depleted)"], rows, "top-k largest |Δ| coordinates by category, against the null")


def summary_table(result: dict) -> Table:
    """Per model and k: coordinates selected, the largest and the k-th |Δ|, and the null's population."""
    rows = [[label, k, loc["num_selected"], loc["max_abs_delta"], loc["kth_abs_delta"],
             (loc.get("enrichment") or {}).get("scope"), (loc.get("enrichment") or {}).get("num_params")]
            for label, per_k in result["models"].items() for k, loc in per_k.items()]
    return Table(["model", "k", "selected", "max |Δ|", "k-th |Δ|", "null over", "trained parameters"], rows)


def report_tables(result: dict) -> list[Table]:
    return [report_table(result), summary_table(result)]


def report_section(entries, canvas: Canvas) -> Section:
    """The report section of ``localisation.json`` inputs: ``entries`` are ``(label, directory, result)``."""
    return plots.report_section("localisation", REPORT_TEXT, entries, canvas, plots.plot_localisation, report_tables)
