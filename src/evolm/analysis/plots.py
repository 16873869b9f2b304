"""One PNG per analysis, drawn from the same dict that is written as JSON, and the report section
that shows it.

Design decisions:

- Figures are built with ``matplotlib.figure.Figure`` (Agg canvas, no pyplot), so plotting never
  touches global GUI state and works headless; each function takes the analysis result exactly as
  saved and a path, so a plot can be redrawn from the JSON alone (``evolm analyze`` writes
  ``<kind>.png`` with it, ``evolm report`` redraws it).
- ``report_section`` is the layout every analysis's report section shares (its paragraph, then per
  input the figure and the analysis's own table); each analysis module calls it with its plot and
  table (``drift.report_section`` ...).
- matplotlib is imported inside the functions that draw: importing this module (which the ``evolm``
  command line does) stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from evolm.categories import CATEGORIES
from evolm.document import Canvas, Figure, Section, Table
from evolm.markdown import shown_path


def report_section(kind: str, text: str, entries, canvas: Canvas, plot: Callable[[dict, Path], Path],
                   table: Callable[[dict], Table | list[Table]]) -> Section:
    """The report section of one analysis kind: ``text``, then for each ``(label, directory, result)`` in
    ``entries`` the figure ``plot(result, path)`` draws and the table(s) ``table(result)``."""
    entries = list(entries)
    title = kind.replace("_", " ")
    sec = Section(f"Analysis: {title}", [text])
    for label, path, result in entries:
        name = canvas.name(f"{kind}-{label}" if len(entries) > 1 else kind)
        plot(result, canvas.path(name))
        sec.blocks.append(Figure(name, f"{title} ({label})", f"from {shown_path(Path(path) / (kind + '.json'))}"))
        tables = table(result)
        sec.blocks.extend(tables if isinstance(tables, list) else [tables])
    return sec


def _figure(width: float = 7.0, height: float = 4.0):
    from matplotlib.figure import Figure as MplFigure  # local: matplotlib is slow to import, only drawing needs it

    return MplFigure(figsize=(width, height), dpi=110, layout="constrained")


def _save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def _grouped_bars(ax, groups: list[str], series: dict[str, list[float]]) -> None:
    x = np.arange(len(groups))
    width = 0.8 / max(len(series), 1)
    for i, (label, values) in enumerate(series.items()):
        ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=label)
    ax.set_xticks(x, groups, rotation=20)
    if len(series) > 1:
        ax.legend(fontsize=8)


def _rate_axis(ax, values) -> None:
    """A 0..1 y-axis when every plotted value is a rate (pass@k, accuracy)."""
    values = [v for v in values if v is not None]
    if values and all(0.0 <= v <= 1.0 for v in values):
        ax.set_ylim(0.0, 1.02)


def plot_drift(result: dict, path) -> Path:
    """Left: relative distance per category, one bar per trained model, on a linear axis from 0 (a bar half
    as long is half the drift; a log axis starting above 0 would make it look ten times shorter). Right
    (when the JSON has it): each category's share of ‖Δ‖² over its parameter share, with the
    permutation null's 95% interval."""
    models = result["models"]
    cats = [c for c in CATEGORIES if any(c in m["by_category"] for m in models.values())]
    series = {f"{label} (whole {m['relative_distance']:.3g})":
              [(m["by_category"].get(c) or {}).get("relative_distance") or 0.0 for c in cats] for label, m in models.items()}
    enriched = {label: m["enrichment"]["by_category"] for label, m in models.items() if m.get("enrichment")}
    fig = _figure(11.0 if enriched else 7.0, 4.0)
    ax = fig.add_subplot(1, 2, 1) if enriched else fig.add_subplot()
    _grouped_bars(ax, cats, series)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("||θ − θ0|| / ||θ0|| (linear, from 0)")
    ax.set_title("Relative parameter drift by category")
    if len(series) == 1:
        ax.legend(list(series), fontsize=8)
    if enriched:
        right = fig.add_subplot(1, 2, 2)
        points = {label: {c: (v["enrichment"], v.get("null_enrichment_interval")) for c, v in e.items()}
                  for label, e in enriched.items()}
        _enrichment_axes(right, points, "share of ||Δ||² / parameter share",
                         "Enrichment of ||Δ||² (grey: 95% null interval)", null_bars=True)
    return _save(fig, path)


def _enrichment_axes(ax, points: dict[str, dict[str, tuple]], ylabel: str, title: str, null_bars: bool = False) -> None:
    """Enrichment per category on a log axis, a line at 1 (the null). ``points``: ``{series: {category:
    (enrichment, [lo, hi])}}``; the interval is the estimate's (``null_bars`` False: drawn on the point)
    or the null's (True: a grey bar around 1). A zero enrichment is drawn as an open marker at the floor,
    with its interval's upper end."""
    cats = [c for c in CATEGORIES if any(c in p for p in points.values())]
    values = [v for p in points.values() for e, iv in p.values() for v in ([e] + list(iv or [])) if v]
    floor = min([v for v in values if v > 0] + [1.0]) / 3
    x = np.arange(len(cats))
    width = 0.8 / max(len(points), 1)
    for i, (label, per_cat) in enumerate(points.items()):
        xs = x + (i - (len(points) - 1) / 2) * width
        labelled = False  # the series' label goes on its first drawn point
        for xi, c in zip(xs, cats):
            if c not in per_cat:
                continue
            e, iv = per_cat[c]
            if e is None:
                continue
            y = max(e, floor)
            color = f"C{i}"
            if iv is not None:
                lo, hi = max(iv[0], floor), max(iv[1], floor)
                if null_bars:
                    ax.plot([xi, xi], [lo, hi], color="0.6", lw=6, solid_capstyle="butt", zorder=1)
                else:
                    ax.plot([xi, xi], [lo, hi], color=color, lw=1.5, zorder=2)
            ax.plot([xi], [y], "o", color=color, mfc=color if e > 0 else "white", ms=6, zorder=3,
                    label=None if labelled else label)
            labelled = True
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xticks(x, cats, rotation=20)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    if ax.get_legend_handles_labels()[0]:  # nothing drawn (every enrichment undefined): no empty legend
        ax.legend(fontsize=7)


def plot_sparsity(result: dict, path) -> Path:
    """Left: fraction of nonzero updates below τ. Right (when re-evaluated): the metric of the thresholded model."""
    metric = result.get("metric", "greedy_pass@1")
    evaluated = any(m.get("points") for m in result["models"].values())
    fig = _figure(10.0 if evaluated else 6.0, 4.0)
    left = fig.add_subplot(1, 2, 1) if evaluated else fig.add_subplot()
    right = fig.add_subplot(1, 2, 2) if evaluated else None
    for label, m in result["models"].items():
        left.plot(m["taus"], m["fraction_below"], marker="o", label=label)
        if right is not None and m.get("points"):
            points = m["points"]
            line = right.plot([p["tau"] for p in points], [p["metrics"].get(metric) for p in points], marker="o", label=label)[0]
            ref = m.get("reference", {})
            if "trained" in ref:
                right.axhline(ref["trained"].get(metric), color=line.get_color(), ls="--", lw=1)
            if "base" in ref:
                right.axhline(ref["base"].get(metric), color="gray", ls=":", lw=1)
    scale = result.get("tau_scale")
    what = "single ES update RMS" if "single-update RMS" in str(result.get("tau_scale_source", "")) else "τ scale"
    for ax in (left, right) if right is not None else (left,):
        ax.set_xscale("log")
        ax.set_xlabel("threshold τ, log scale" + (f" (vertical line: {what} {scale:.3g})" if scale else ""))
        if scale:
            ax.axvline(scale, color="black", lw=0.8, alpha=0.5)
    left.set_ylabel("fraction of nonzero |Δ| below τ")
    left.set_ylim(0, 1)
    left.legend(fontsize=8)
    if right is not None:
        right.set_ylabel(f"{metric} of θ0 + Δ·1[|Δ| ≥ τ]")
        right.set_title("dashed: trained model, dotted: base", fontsize=8)
        right.legend(fontsize=8)
        _rate_axis(right, [p["metrics"].get(metric) for m in result["models"].values() for p in m.get("points") or []])
    return _save(fig, path)


def plot_localisation(result: dict, path) -> Path:
    """Left: top-k counts per category (bars) and the null's expected counts (black ticks). Right: the
    enrichment observed / expected with its exact 95% interval, log scale (1 = what chance gives)."""
    series, expected, points = {}, {}, {}
    for label, per_k in result["models"].items():
        for k, loc in per_k.items():
            name = f"{label} top-{k} (max |Δ| {loc['max_abs_delta']:.2g})"
            series[name] = [loc["by_category"].get(c, 0) for c in CATEGORIES]
            e = (loc.get("enrichment") or {}).get("by_category") or {}
            expected[name] = [e[c]["expected"] if c in e else None for c in CATEGORIES]
            if e:
                points[f"{label} top-{k}"] = {c: (v["enrichment"], v.get("enrichment_interval")) for c, v in e.items()}
    fig = _figure(11.0 if points else 7.0, 4.0)
    ax = fig.add_subplot(1, 2, 1) if points else fig.add_subplot()
    _grouped_bars(ax, list(CATEGORIES), series)
    x = np.arange(len(CATEGORIES))
    width = 0.8 / max(len(series), 1)
    for i, values in enumerate(expected.values()):
        xs = [xi for xi, v in zip(x + (i - (len(series) - 1) / 2) * width, values) if v is not None]
        ax.plot(xs, [v for v in values if v is not None], "_", color="black", ms=12, mew=2,
                label="expected (null)" if i == 0 else None)
    ax.set_ylabel("coordinates among the top k of |Δ|")
    title = "Where the largest updates land"
    if result.get("tied_embeddings"):
        title += " (tied: embedding = LM head)"
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    if points:
        _enrichment_axes(fig.add_subplot(1, 2, 2), points, "observed / expected (log)",
                         "Enrichment with exact 95% interval (open: none observed)")
    return _save(fig, path)


def plot_magnitude(result: dict, path) -> Path:
    """Per category, the top-k enrichment of each model three ways (log axis, 1 = the null): absolute |Δ|
    against exchangeable coordinates, relative |Δ| / |θ0| against the same null, and absolute |Δ| against
    the dtype-matched null (step counts shuffled; its 95% range drawn as a grey bar around the point's
    null mean)."""
    fig = _figure(14.0, 4.0)
    views = (("absolute", "|Δ| vs exchangeable null"), ("relative", "|Δ|/|θ0| vs exchangeable null"),
             ("dtype_null", "|Δ| vs dtype-matched null"))
    for i, (view, title) in enumerate(views):
        points = {}
        for label, m in result["models"].items():
            if view == "dtype_null":
                per = m["dtype_null"]["by_category"]
                points[f"{label} ({m['dtype']})"] = {
                    c: (v["enrichment"], [v["null_interval"][0] / v["null_mean"], v["null_interval"][1] / v["null_mean"]]
                        if v["null_mean"] else None) for c, v in per.items()}
            else:
                per = m[view]["enrichment"]
                points[label] = {c: (v["enrichment"], v.get("enrichment_interval")) for c, v in per.items()}
        _enrichment_axes(fig.add_subplot(1, 3, i + 1), points, "observed / expected (log)",
                         f"top-{result.get('k')}: {title}", null_bars=view == "dtype_null")
    return _save(fig, path)


def plot_compression(result: dict, path) -> Path:
    """The chosen metric per compression method, one bar per model."""
    metric = result.get("metric", "greedy_pass@1")
    methods = result["methods"]
    models = list(dict.fromkeys(r["model"] for r in result["rows"]))
    value = {(r["model"], r["method"]): r["metrics"].get(metric) for r in result["rows"]}
    series = {m: [value.get((m, meth)) or 0.0 for meth in methods] for m in models}
    fig = _figure()
    ax = fig.add_subplot()
    _grouped_bars(ax, methods, series)
    ax.set_ylabel(metric)
    _rate_axis(ax, list(value.values()))
    ax.set_title(f"Compression of {', '.join(result['categories'])} weights")
    if len(series) == 1:
        ax.legend(list(series), fontsize=8)
    return _save(fig, path)


def plot_diversity(result: dict, path) -> Path:
    """Left: coverage of one sample per member vs N centre samples. Right: JS divergence per prompt."""
    fig = _figure(10.0, 4.0)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    labels = [f"population\n(1 × {result['num_members']} members)", f"centre\n({result['center_samples']} samples)"]
    left.bar(labels, [result["population"], result["center"]], color=["tab:orange", "tab:blue"])
    left.set_ylim(0, 1)
    left.set_ylabel("coverage (≥ 1 correct)")
    left.set_title(f"gap {result['gap']:+.3f}", fontsize=9)
    js = result.get("js_divergence_per_prompt") or []
    right.bar(range(len(js)), js, color="tab:green")
    right.axhline(result["js_divergence"], color="black", ls="--", lw=1, label="mean")
    null = result.get("js_divergence_null")
    if null is not None:
        right.axhline(null, color="gray", ls=":", lw=1.2, label="sampling-noise baseline (centre split)")
        right.legend(fontsize=7)
    right.set_xlabel("prompt")
    from matplotlib.ticker import MaxNLocator  # local: matplotlib is slow to import, only drawing needs it

    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.set_ylabel("verifier-projected JSD (nats)")
    title = f"mean {result['js_divergence']:.4f}"
    if null is not None:
        title += f" (baseline {null:.4f})"
    right.set_title(title, fontsize=9)
    return _save(fig, path)


def plot_update_variance(result: dict, path) -> Path:
    """Per estimator: mean pairwise cosine of R update samples (± std) and their relative per-coordinate variance."""
    names = list(result["estimators"])
    est = result["estimators"]
    fig = _figure(9.0, 3.8)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    cos = [est[n]["mean_pairwise_cosine"] for n in names]
    err = [est[n].get("std_pairwise_cosine") or 0.0 for n in names]
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"][:len(names)]
    left.bar(names, [c if c is not None else 0.0 for c in cos], yerr=err, color=colors, capsize=4)
    left.axhline(0, color="black", lw=0.8)
    left.set_ylabel("mean pairwise cosine of updates")
    left.set_title("agreement between independent update samples", fontsize=9)
    rel = [est[n]["relative_variance"] for n in names]
    right.bar(names, [r if r is not None else 0.0 for r in rel], color=colors)
    right.axhline(1.0, color="gray", ls=":", lw=1)
    right.set_ylabel("mean var / mean square (per coordinate)")
    setup = result.get("setup", {})
    right.set_title(f"N={setup.get('population')}, σ={setup.get('sigma')}, R={setup.get('repeats')} "
                    f"({setup.get('coordinates', 0):,} coordinates)", fontsize=9)
    for ax, values in ((left, cos), (right, rel)):
        for i, v in enumerate(values):
            if v is None:
                ax.text(i, 0, "no update", ha="center", va="bottom", fontsize=8)
    return _save(fig, path)
