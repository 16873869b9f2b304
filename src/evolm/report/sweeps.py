"""The report's sweep sections: one per ``evolm sweep`` directory, with a table of its points, every
point's training-reward curve, and the ablations its grid supports (population scaling, σ,
estimator, shaping).

Design decisions:

- The ablations are computed here, from the sweep summary's points, by
  ``evolm.analysis.ablations.ablations_for`` with the report's own settings (``--window``, ``--band``,
  ``--band-mode``, ``--reference``); the defaults a sweep summary may carry are not used.
- One block list per ablation and group of points (the points' other assignments), each a paragraph
  stating the definition, a figure and a table of every plotted number.
"""

from __future__ import annotations

from evolm.analysis.ablations import BAND, BAND_MODE, WINDOW, ablations_for, smooth
from evolm.markdown import fmt
from evolm.document import COLORS, Canvas, Section, Table, integer_x
from evolm.report.read import Sources
from evolm.sweep import value_label


def sweep_sections(src: Sources, canvas: Canvas, window: int = WINDOW, band: float = BAND, mode: str = BAND_MODE,
                   reference=None) -> list[Section]:
    out = []
    for label, path, summary in src.sweeps:
        keys = list(summary["grid"])
        points = summary["points"]
        sec = Section(f"Sweep {label} ({summary['job_kind']}): {', '.join(keys)}")
        counts: dict[str, int] = {}
        for p in points:
            counts[p["status"]] = counts.get(p["status"], 0) + 1
        sec.blocks.append(f"`{path}`: {len(points)} points (" + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) +
                          f"). Curves are smoothed with a trailing mean over {window} update(s).")
        rows = [[value_label(p["assignments"].get(k)) if k in p["assignments"] else "" for k in keys] +
                [p["status"], p.get("updates"), p.get("start_reward"), p.get("final_reward"),
                 (p.get("eval_before") or {}).get("greedy"), (p.get("eval_after") or {}).get("greedy"),
                 p.get("seconds_per_update"), p.get("gen_tokens_total"), p.get("peak_rss_mb"), p.get("error")]
                for p in points]
        sec.blocks.append(Table(keys + ["status", "updates", "start reward", "final reward", "held-out before (greedy)",
                                        "held-out after (greedy)", "s / update", "gen tokens", "peak RSS MB", "error"], rows))
        usable = [p for p in points if p.get("curve")]
        if usable:
            fig = canvas.figure(7.0, 4.0)
            curves = {}
            for p in usable:
                pts = [(s, r) for s, r in p["curve"] if r is not None]
                curves[",".join(f"{k.split('.')[-1]}={value_label(v)}" for k, v in p["assignments"].items())] = \
                    list(zip([s for s, _ in pts], smooth([r for _, r in pts], window)))
            ax = fig.add_subplot()
            for i, (name, pts) in enumerate(curves.items()):
                ax.plot([s for s, _ in pts], [r for _, r in pts], marker="o", ms=2.5, color=COLORS[i % len(COLORS)], label=name)
            ax.set_xlabel("update")
            ax.set_ylabel("training reward (smoothed)")
            integer_x(ax)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            sec.blocks.append(canvas.save(fig, f"sweep-{label}-curves", "training reward of every point"))
        ablations = ablations_for(usable, keys, window=window, band=band, mode=mode, reference=reference)
        for name, result in ablations.items():
            sec.blocks += _ablation_blocks(name, result, label, canvas)
        out.append(sec)
    return out


def _curves_plot(ax, curves: dict[str, list], title: str, key: str) -> None:
    for i, (value, pts) in enumerate(curves.items()):
        if pts:
            ax.plot([s for s, _ in pts], [r for _, r in pts], marker="o", ms=2.5, color=COLORS[i % len(COLORS)],
                    label=f"{key.split('.')[-1]}={value}")
    ax.set_xlabel("update")
    ax.set_ylabel("training reward (smoothed)")
    integer_x(ax)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _ablation_blocks(name: str, result: dict, sweep_label: str, canvas: Canvas) -> list:
    blocks: list = []
    for group, g in result["groups"].items():
        suffix = "" if group == "all" else f" ({group})"
        if name == "population":
            blocks += _population_blocks(result, g, suffix, f"{sweep_label}-population-{group}", canvas)
        elif name == "sigma":
            blocks += _sigma_blocks(result, g, suffix, f"{sweep_label}-sigma-{group}", canvas)
        else:  # estimator, shaping
            blocks += _comparison_blocks(name, result, g, suffix, f"{sweep_label}-{name}-{group}", canvas)
    return blocks


def _population_blocks(result: dict, g: dict, suffix: str, stem: str, canvas: Canvas) -> list:
    blocks: list = [f"**Population scaling{suffix}.** Reference N = {value_label(g['reference'])}; "
                    f"'within band from' is the first update u such that at every later update "
                    f"|r_N − r_ref| ≤ {result['band']:g}" + (" × |r_ref|" if result["mode"] == "relative" else "") +
                    " on the smoothed curves (None: outside the band at the last update)." +
                    (f" {g['note']}" if g.get("note") else "")]
    if not g["rows"]:
        return blocks
    fig = canvas.figure(7.0, 4.0)
    ax = fig.add_subplot()
    _curves_plot(ax, g["curves"], f"population scaling{suffix}", result["key"])
    ref = g["curves"].get(str(g["reference"])) or []
    if ref:
        steps = [s for s, _ in ref]
        width = [(result["band"] * abs(r) if result["mode"] == "relative" else result["band"]) for _, r in ref]
        ax.fill_between(steps, [r - w for (_, r), w in zip(ref, width)], [r + w for (_, r), w in zip(ref, width)],
                        color="gray", alpha=0.25, label="band around reference")
        ax.legend(fontsize=7)
    blocks.append(canvas.save(fig, stem, f"population scaling{suffix}"))
    blocks.append(Table(["N", "within band from update", "final reward", "final gap to reference",
                         "max |gap| after", "updates compared", "zero updates", "members above / tied / below the centre"],
                        [[r["value"], r["within_band_from"], r["final_reward"], r["final_gap"], r["max_abs_gap_after"],
                          r["compared"], r.get("zero_updates"), _versus(r.get("members_vs_centre"))] for r in g["rows"]]))
    return blocks


def _versus(counts: dict | None) -> str | None:
    """``above / tied / below of members`` (None when the centre was not scored)."""
    if not counts:
        return None
    return f"{counts['above']} / {counts['tied']} / {counts['below']} of {counts['members']}"


def _sigma_blocks(result: dict, g: dict, suffix: str, stem: str, canvas: Canvas) -> list:
    rows = g["rows"]
    fig = canvas.figure(7.0, 4.0)
    ax = fig.add_subplot()
    xs = [float(r["value"]) for r in rows]
    ax.plot(xs, [r["final_reward"] for r in rows], "o-", label="final reward")
    ax.plot(xs, [r["start_reward"] for r in rows], "s--", color="gray", label="first-update reward")
    for r in rows:
        if r["flags"] and r["final_reward"] is not None:
            ax.plot(float(r["value"]), r["final_reward"], "x", color="red", ms=10, mew=2)
            ax.annotate(", ".join(r["flags"]), (float(r["value"]), r["final_reward"]), fontsize=7,
                        textcoords="offset points", xytext=(4, 6), color="red")
    log = all(x > 0 for x in xs)
    if log:
        ax.set_xscale("log")
    ax.set_xlabel("σ (log scale)" if log else "σ")
    ax.set_ylabel("training reward")
    ax.set_title(f"σ sweep{suffix} (red ×: flagged)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return [f"**σ sweep{suffix}.** Flags: no_signal = at least {result['no_signal']:.0%} of updates were "
            f"zero (every member scored the same); below_start = final < first-update reward; collapsed = "
            f"final < {result['collapse']:g} × start (or held-out greedy after < {result['collapse']:g} × "
            f"before); heldout_below_base = held-out greedy after < before. Best unflagged σ: "
            f"{fmt(g['best'])}.",
            canvas.save(fig, stem, f"σ sweep{suffix}"),
            Table(["σ", "start reward", "final reward", "change", "zero-update fraction",
                   "held-out before", "held-out after", "flags"],
                  [[r["value"], r["start_reward"], r["final_reward"], r["change"], r["zero_update_fraction"],
                    r["heldout_before"], r["heldout_after"], ", ".join(r["flags"])] for r in rows])]


def _comparison_blocks(name: str, result: dict, g: dict, suffix: str, stem: str, canvas: Canvas) -> list:
    key = result["key"]
    title = {"estimator": "Estimator (equal evaluation budget)", "shaping": "Fitness shaping"}[name]
    fig = canvas.figure(7.0, 4.0)
    ax = fig.add_subplot()
    _curves_plot(ax, g["curves"], f"{title.lower()}{suffix}", key)
    text = f"**{title}{suffix}.** Final reward = smoothed reward at the last update; mean = mean over all updates."
    if name == "estimator":
        text += (" Evaluations = members × updates; one-point and antithetic are compared at the same population, "
                 f"i.e. the same evaluation budget (equal budget here: {fmt(g.get('equal_budget'))}).")
    return [text, canvas.save(fig, stem, f"{title.lower()}{suffix}"),
            Table([key.split(".")[-1], "updates", "final reward", "mean reward", "evaluations",
                   "held-out before", "held-out after"],
                  [[r["value"], r["updates"], r["final_reward"], r["mean_reward"], r["evaluations"],
                    r["heldout_before"], r["heldout_after"]] for r in g["rows"]])]
