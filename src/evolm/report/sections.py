"""The report's run sections: the runs table, held-out pass@k (base vs trained), the held-out probe
during training, training reward, and cost.

Design decisions:

- Each section is a function of the sources read (``report.read.Sources``) and returns a ``Section``,
  or None when no input has its data; every plotted number is also in a table.
- The only derived numbers are pure functions of what was read: pass@k for k = 1 .. n from each
  problem's n and c (``evolm.metrics.pass_at_k_curve``), sums and means of the training records.
- The base model's pass@k curve is a run's ``eval_before.json``, shown once as "base" (black, dashed)
  when every run measured the same thing (same task, sampling, summary and problems), else as
  "<run> base" dashed in the run's colour; each trained run's curve is its ``eval_after.json`` (solid),
  plus any ``evolm eval`` outputs (dash-dotted, in their run's colour). Every run keeps its colour in
  every figure (``read.assign_colors``). Multiple-choice tasks get the chance curve (uniform guessing,
  ``chance_curve``), grey dotted, and a chance row in the table.
- Runs are compared on one quantity, ``match`` (``evolm report --match``): updates (default),
  sequences, tokens or seconds, the four every training record carries (``runs.MATCH_FIELDS``). The
  training-reward and probe curves are drawn against it (a probe at update u sits at what the run had
  spent after u updates), and the budget section states per run what it spent in every quantity,
  what it was configured to match, and its completion length limit, so a "matched budget" says which
  budget was matched and what the other ones came to.
- A section whose numbers cannot carry a claim opens with a visible warning (``report.checks``): every
  pass@k 0, or fewer than 20 problems.
- Each analysis kind's section is drawn by its own module (``ANALYSIS_SECTIONS``); ``analysis_sections``
  puts them in ``read.ANALYSIS_KINDS`` order with their warnings, for ``evolm report`` and the study page.
"""

from __future__ import annotations

import re
from typing import Sequence

from evolm.analysis import compression, diversity, drift, localisation, sparsity, update_variance
from evolm.document import BASE_COLOR, COLORS, EXTRA_COLORS, Alert, Canvas, Section, Table, integer_x, passk_axes, pick_colour
from evolm.markdown import shown_path
from evolm.metrics import pass_at_k_curve
from evolm.report.checks import analysis_warnings, passk_warnings
from evolm.report.read import ANALYSIS_KINDS, Run, Sources
from evolm.runs import MATCH_FIELDS, spent

AXIS_LABELS = {"updates": "update", "sequences": "sequences generated", "tokens": "tokens generated",
               "seconds": "training seconds"}
"""The x-axis label of each quantity runs can be matched on."""


def spent_by_step(run: Run, match: str) -> dict[int, float]:
    """``{step: how much of match the run had spent after that many updates}`` (step 0: nothing)."""
    return {0: 0.0, **{int(r["step"]): spent(r, match) for r in run.train}}


def _x_axis(ax, match: str) -> None:
    ax.set_xlabel(AXIS_LABELS[match])
    if match == "updates":
        integer_x(ax)


def runs_section(src: Sources) -> Section | None:
    if not src.runs:
        return None
    rows = [[r.label, r.method, shown_path(r.path), r.info.get("status"), r.config.get("model", {}).get("spec"),
             r.config.get("task", {}).get("name"), len(r.train)] for r in src.runs]
    return Section("Runs", [Table(["label", "method", "directory", "status", "model", "task", "updates"], rows)])


def _eval_curve(report: dict) -> tuple[list[float], dict]:
    problems = report.get("problems") or []
    ns = [p["n"] for p in problems]
    cs = [p["c"] for p in problems]
    return (pass_at_k_curve(ns, cs) if ns else []), report.get("summary", {})


def chance_curve(report: dict) -> list[float]:
    """pass@k of uniform guessing for k = 1 .. n when every problem defines a chance accuracy q
    (multiple choice): the mean over problems of 1 - (1 - q)^k (pure); [] otherwise."""
    problems = report.get("problems") or []
    chances = [p.get("chance") for p in problems]
    if not problems or any(q is None for q in chances):
        return []
    n = min(p["n"] for p in problems)
    return [sum(1 - (1 - q) ** k for q in chances) / len(chances) for k in range(1, n + 1)]


def _same_eval(a: dict, b: dict) -> bool:
    keys = ("task", "sampling", "summary")
    return all(a.get(k) == b.get(k) for k in keys) and [p.get("id") for p in a.get("problems", [])] == \
        [p.get("id") for p in b.get("problems", [])]


def passk_section(src: Sources, canvas: Canvas) -> Section | None:
    # (label, task, curve, summary, colour, line style, report)
    curves: list[tuple[str, str, list[float], dict, str, str, dict]] = []
    befores = [(r, r.eval_before) for r in src.runs if r.eval_before]
    if befores and all(_same_eval(befores[0][1], b) for _, b in befores[1:]):
        befores = [(None, befores[0][1])]
    for run, report in befores:
        curve, summary = _eval_curve(report)
        label, color = ("base", BASE_COLOR) if run is None else (f"{run.label} base", src.color(run.label))
        curves.append((label, report.get("task", ""), curve, summary, color, "--", report))
    for run in src.runs:
        if run.eval_after:
            curve, summary = _eval_curve(run.eval_after)
            curves.append((run.label, run.eval_after.get("task", ""), curve, summary, src.color(run.label), "-",
                           run.eval_after))
    for label, _, report in src.evals:
        for task, t in report.get("tasks", {}).items():
            curve, summary = _eval_curve(t)
            curves.append((label, task, curve, summary, src.color(label), "-.", t))
    curves = [c for c in curves if c[2]]
    if not curves:
        return None
    tasks = sorted({c[1] for c in curves})
    sec = Section("Held-out pass@k: base vs trained")
    sec.blocks += [Alert(w) for w in passk_warnings(c[:4] for c in curves)]
    sec.blocks.append("pass@k for k = 1 .. n from each problem's n samples and c correct ones (unbiased estimator, "
                      "averaged over problems); one colour per run: its base (`eval_before.json`) dashed, trained "
                      "(`eval_after.json`) solid, its `evolm eval` outputs dash-dotted; a base shared by every run is "
                      "black. Grey dotted: what uniform guessing scores on multiple-choice tasks (chance). The k axis "
                      "is logarithmic (base 2); pass@k is linear from 0.")
    fig = canvas.figure(7.0, 4.2)
    ax = fig.add_subplot()
    for label, task, curve, _, color, style, _ in curves:
        name = label if len(tasks) == 1 else f"{label} [{task}]"
        ax.plot(range(1, len(curve) + 1), curve, style, marker="o", ms=3, color=color, label=name)
    chances: dict[str, list[float]] = {}
    for _, task, _, _, _, _, report in curves:
        chance = chance_curve(report)
        if chance and len(chance) > len(chances.get(task, [])):
            chances[task] = chance
    for task, chance in chances.items():
        ax.plot(range(1, len(chance) + 1), chance, ":", color="gray", lw=1.2,
                label="chance" if len(tasks) == 1 else f"chance [{task}]")
    passk_axes(ax, max(len(c[2]) for c in curves))
    ax.set_title("held-out pass@k" + (f" on {tasks[0]}" if len(tasks) == 1 else ""))
    ax.legend(fontsize=8)
    sec.blocks.append(canvas.save(fig, "passk", "pass@k curves",
                                  "dashed: base model" + ("; grey dotted: chance" if chances else "")))
    kmax = max(len(c[2]) for c in curves)
    ks = sorted({k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256) if k <= kmax} | {kmax})
    rows = []
    for label, task, curve, s, *_ in curves:
        rows.append([label, task, s.get("problems"), s.get("n"), s.get("greedy")] +
                    [curve[k - 1] if k <= len(curve) else None for k in ks] +
                    [s.get("mean_correct"), s.get("entropy"), s.get("distinct_correct")])
    for task, chance in chances.items():
        rows.append(["chance (uniform guessing)", task, None, len(chance), None] +
                    [chance[k - 1] if k <= len(chance) else None for k in ks] + [None, None, None])
    sec.blocks.append(Table(["model", "task", "problems", "n", "greedy"] + [f"pass@{k}" for k in ks] +
                            ["mean correct", "entropy (nats)", "distinct correct"], rows))
    return sec


def _stage_bounds(run: Run) -> list[int]:
    train = run.train
    return [b["step"] - 1 for a, b in zip(train, train[1:]) if a.get("stage") != b.get("stage")]


def reward_section(src: Sources, canvas: Canvas, match: str = "updates") -> Section | None:
    runs = [r for r in src.runs if any(x.get("reward_mean") is not None for x in r.train)]
    if not runs:
        return None
    sec = Section("Training reward")
    sec.blocks.append("Mean training reward per update (`metrics.jsonl`, kind train): for ES the mean over the "
                      "population's members, for GRPO over the update's sampled completions"
                      + ("" if match == "updates" else f", against the {AXIS_LABELS[match]} each run had spent by "
                                                       "that update (`--match`)")
                      + ". Dotted lines mark pipeline stage boundaries.")
    fig = canvas.figure(7.0, 4.0)
    ax = fig.add_subplot()
    rows = []
    for run in runs:
        at = spent_by_step(run, match)
        pts = [(at[r["step"]], r["reward_mean"]) for r in run.train if r.get("reward_mean") is not None]
        color = src.color(run.label)
        ax.plot(*zip(*pts), marker="o", ms=2.5, color=color, label=run.label)
        centre = [(at[r["step"]], r["center_reward"]) for r in run.train if r.get("center_reward") is not None]
        if centre:
            ax.plot(*zip(*centre), "s--", ms=3, color=color, alpha=0.7, label=f"{run.label} (centre)")
        for b in _stage_bounds(run):
            ax.axvline(b + 0.5 if match == "updates" else at.get(b, 0.0), color=color, ls=":", lw=1)
        values = [v for _, v in pts]
        rows.append([run.label, run.method, len(values), values[0], values[-1], max(values), sum(values) / len(values)])
    _x_axis(ax, match)
    ax.set_ylabel("training reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    sec.blocks.append(canvas.save(fig, "reward", f"training reward per {AXIS_LABELS[match]}"))
    sec.blocks.append(Table(["run", "method", "updates", "first", "last", "max", "mean"], rows))
    extra = [] if match == "updates" else [AXIS_LABELS[match]]
    long = [[run.label, r["step"]] + ([spent(r, match)] if extra else []) +
            [r.get("reward_mean"), r.get("reward_std"), r.get("center_reward"), r.get("update_status") or r.get("stage_method") or ""]
            for run in runs for r in run.train]
    sec.blocks.append(Table(["run", "update"] + extra + ["reward mean", "reward std", "centre reward", "status / stage"], long,
                            "every plotted point"))
    return sec


def figure_colors(labels: Sequence[str], src: Sources) -> dict[str, str]:
    """Each label's report colour (``src.color``) unless an earlier label of this figure has it: then the first colour
    of ``COLORS`` + ``EXTRA_COLORS`` this figure has not used (``document.pick_colour``), so a figure of up to 20 runs
    repeats none."""
    out: dict[str, str] = {}
    for label in labels:
        pick_colour(label, out, {label: src.color(label)}, COLORS + EXTRA_COLORS)
    return out


def probe_section(src: Sources, canvas: Canvas, match: str = "updates") -> Section | None:
    runs = [r for r in src.runs if r.probes]
    if not runs:
        return None
    keys = sorted({k for r in runs for p in r.probes for k in p if re.fullmatch(r"pass@\d+", k)},
                  key=lambda k: int(k.split("@")[1]))
    sec = Section("Held-out probe: entropy and pass@k during training")
    tasks = sorted({str(p.get("task")) for r in runs for p in r.probes if p.get("task")})
    sec.blocks.append("Probe records (`metrics.jsonl`, kind probe): token entropy (nats, at the probe temperature) and "
                      f"pass@k on a fixed held-out set{' (' + ', '.join(tasks) + ')' if tasks else ''}, measured at "
                      "step 0, every `probe.every` updates and at the end"
                      + ("." if match == "updates" else f"; drawn against the {AXIS_LABELS[match]} each run had spent "
                                                       "by the probe's update (`--match`)."))
    from matplotlib.lines import Line2D  # local: matplotlib is slow to import, only drawing needs it

    columns = min(4, len(runs))
    fig = canvas.figure(10.0, 3.8 + 0.22 * -(-len(runs) // columns))
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    styles = ["-", "--", ":", "-."]
    colors = figure_colors([run.label for run in runs], src)
    for run in runs:
        color = colors[run.label]
        at = spent_by_step(run, match)
        ent = [(at[p["step"]], p["entropy"]) for p in run.probes if p.get("entropy") is not None and p["step"] in at]
        if ent:
            left.plot(*zip(*ent), marker="o", ms=3, color=color)
        for j, k in enumerate(keys):
            pts = [(at[p["step"]], p[k]) for p in run.probes if p.get(k) is not None and p["step"] in at]
            if pts:
                right.plot(*zip(*pts), styles[j % len(styles)], marker="o", ms=3, color=color)
    left.set_ylabel("token entropy (nats)")
    right.set_ylabel("pass@k")
    right.set_ylim(0, 1.02)
    for ax in (left, right):
        _x_axis(ax, match)
        ax.grid(alpha=0.3)
    # one legend of runs (colour) under both panels, one of k (line style) in the pass@k panel: a legend entry per
    # (run, k) pair outgrew the axes once a study page drew a dozen runs
    right.legend([Line2D([], [], color="0.3", linestyle=styles[j % len(styles)]) for j in range(len(keys))], keys,
                 fontsize=7, title="pass@k", title_fontsize=7)
    fig.legend([Line2D([], [], color=colors[run.label], marker="o", ms=3) for run in runs], [run.label for run in runs],
               loc="outside lower center", ncol=columns, fontsize=7)
    sec.blocks.append(canvas.save(fig, "probe", "entropy and pass@k trajectories"))
    extra = [] if match == "updates" else [AXIS_LABELS[match]]
    rows = [[run.label, p["step"]] + ([spent_by_step(run, match).get(p["step"])] if extra else []) +
            [p.get("task"), p.get("entropy")] + [p.get(k) for k in keys] + [p.get("distinct_correct")]
            for run in runs for p in run.probes]
    sec.blocks.append(Table(["run", "update"] + extra + ["task", "entropy"] + keys + ["distinct correct"], rows))
    return sec


def cost_section(src: Sources) -> Section | None:
    rows = []
    for run in src.runs:
        train = run.train
        if not train:
            continue
        sec_ = [r["seconds"] for r in train if r.get("seconds") is not None]
        tok = [r["gen_tokens"] for r in train if r.get("gen_tokens") is not None]
        seqs = [r["gen_sequences"] for r in train if r.get("gen_sequences") is not None]
        rss = [r["peak_rss_mb"] for r in train if r.get("peak_rss_mb") is not None]
        rows.append([run.label, run.method, len(train), sum(sec_) / len(sec_) if sec_ else None, sum(sec_) if sec_ else None,
                     sum(seqs) / len(seqs) if seqs else None, sum(tok) / len(tok) if tok else None,
                     sum(tok) if tok else None, max(rss) if rss else None, max((r.get("peak_gpu_mb") or 0 for r in train), default=0) or None])
    if not rows:
        return None
    sec = Section("Cost", ["Per-update cost from the training records: wall seconds of an update (generation, "
                           "perturbation and update; probes and checkpoints excluded), sequences and tokens generated, "
                           "and the process's peak resident memory.",
                           Table(["run", "method", "updates", "s / update", "total s", "sequences / update",
                                  "gen tokens / update", "gen tokens total", "peak RSS MB", "peak GPU MB"], rows)])
    matched = matched_quality(src.runs)
    if matched is not None:
        sec.blocks += matched
    return sec


def _probe_series(run: Run, task: str, metric: str) -> list[tuple[int, float]]:
    return sorted((int(p["step"]), float(p[metric])) for p in run.probes
                  if p.get("task") == task and p.get(metric) is not None)


def matched_quality(runs: Sequence[Run], metric: str = "pass@1") -> list | None:
    """Cost at matched quality: what each run had spent when its probe ``metric`` first reached a level every
    run reached. The level is the lowest of the runs' best probe values after update 0 (so each run reaches
    it); it must lie above every run's update-0 probe, else no run improved on a common level and there is
    nothing to match (a sentence says so). Runs are those with probes on the first run's probe task.
    Resolution is the probe interval, and a probe is a sample (its own problems and seed), so a noisy probe
    can cross the level early: the table names the update at which it did."""
    with_probes = [r for r in runs if r.train and r.probes]
    if len(with_probes) < 2:
        return None
    task = next((p.get("task") for p in with_probes[0].probes if p.get("task")), None)
    series = {r.label: _probe_series(r, task, metric) for r in with_probes}
    series = {k: v for k, v in series.items() if any(step > 0 for step, _ in v)}
    if len(series) < 2:
        return None
    start = max((v for s in series.values() for step, v in s if step == 0), default=None)
    level = min(max(v for step, v in s if step > 0) for s in series.values())
    words = (f"Cost at matched quality: what each run had spent when its held-out probe {metric} on {task} first "
             f"reached {level:.3g}, the lowest of the runs' best probe values (so that every run reaches it)")
    if start is not None and level <= start:
        return [words + f"; it does not exceed the update-0 probe ({start:.3g}), so no common improvement can be "
                "matched here."]
    rows = []
    for run in with_probes:
        if run.label not in series:
            continue
        step = next(st for st, v in series[run.label] if st > 0 and v >= level)
        upto = [r for r in run.train if int(r["step"]) <= step]
        rss = [r["peak_rss_mb"] for r in upto if r.get("peak_rss_mb") is not None]
        rows.append([run.label, run.method, step, spent_by_step(run, "seconds").get(step),
                     spent_by_step(run, "sequences").get(step), spent_by_step(run, "tokens").get(step),
                     max(rss) if rss else None])
    return [words + (f" (update 0: {start:.3g})" if start is not None else "") + ". The update is known to the probe "
            "interval, and a probe is a sample (its own problems and seed): a noisy probe can cross early.",
            Table(["run", "method", "update reached", "update seconds", "sequences", "gen tokens", "peak RSS MB"], rows)]


def completion_limits(run: Run) -> dict[str, int | None]:
    """The training completion length limit of each method a run trained with (from its resolved config):
    ES members generate ``generation.max_new_tokens``; GRPO rollouts ``grpo.max_completion_length`` (0 or
    absent: the same ``generation.max_new_tokens``)."""
    cfg = run.config
    gen = (cfg.get("generation") or {}).get("max_new_tokens")
    methods = {"es": ["es"], "grpo": ["grpo"]}.get(run.method, ["es", "grpo"] if run.kind == "pipeline" else [run.method])
    out = {}
    for m in methods:
        if m == "grpo":
            out[m] = (cfg.get("grpo") or {}).get("max_completion_length") or gen
        elif m == "es":
            out[m] = gen
    return out


def configured_match(run: Run) -> tuple[str, float | None]:
    """What a run was configured to match: ``(quantity, budget)`` (``run.match``/``run.budget``; a pipeline's
    ``pipeline.match``/``pipeline.budget``); updates with the update count when the config predates them."""
    cfg = run.config
    if run.kind == "pipeline":
        p = cfg.get("pipeline") or {}
        return p.get("match", "updates"), p.get("budget")
    r = cfg.get("run") or {}
    match = r.get("match", "updates")
    if match != "updates":
        return match, r.get("budget")
    return "updates", (cfg.get("es") or {}).get("iterations") if run.method == "es" else (cfg.get("grpo") or {}).get("steps")


def budget_section(src: Sources, match: str = "updates") -> Section | None:
    """Per run: what it spent in each quantity, what it was configured to match, its completion length limit."""
    runs = [r for r in src.runs if r.train]
    if not runs:
        return None
    rows, limits = [], set()
    for run in runs:
        last = run.train[-1]
        quantity, budget = configured_match(run)
        lim = completion_limits(run)
        limits |= {v for v in lim.values() if v is not None}
        rows.append([run.label, run.method, f"{quantity} = {budget:g}" if isinstance(budget, (int, float)) else quantity,
                     spent(last, match)] + [spent(last, q) for q in MATCH_FIELDS] +
                    [", ".join(f"{m} {v}" for m, v in lim.items())])
    values = {row[0]: row[3] for row in rows}
    lo, hi = min(values.values()), max(values.values())
    text = (f"What each run spent, from its training records' running totals. Compared on **{match}** (`--match`): "
            + ", ".join(f"{label} {v:,.6g}" for label, v in values.items())
            + (f" (largest / smallest {hi / lo:.3g})" if lo > 0 and len(values) > 1 else "") + ". "
            + ("One completion length limit on both sides"
               if len(limits) <= 1 else f"**Completion length limits differ** ({', '.join(str(v) for v in sorted(limits))} tokens)")
            + " (ES: `generation.max_new_tokens`; GRPO: `grpo.max_completion_length`, 0 = the same). A run configured to "
              "match sequences, tokens or seconds stops after the update that reaches its budget, so it overshoots by "
              "less than one update.")
    return Section("Budget: what each run spent", [text, Table(
        ["run", "method", "configured budget", f"matched: {match}", "updates", "sequences", "tokens", "seconds",
         "completion limit (tokens)"], rows)])


ANALYSIS_SECTIONS = {"drift": drift, "sparsity": sparsity, "localisation": localisation, "compression": compression,
                     "diversity": diversity, "update_variance": update_variance}
"""The module whose ``report_section(entries, canvas)`` draws each analysis kind's section."""


def analysis_sections(src: Sources, canvas: Canvas) -> list[Section]:
    """One section per analysis kind read, in ``ANALYSIS_KINDS`` order, each drawn by its analysis module,
    opening with a visible warning when a result is all zero or measured on too few problems."""
    sections = []
    for kind in ANALYSIS_KINDS:
        if not src.analyses.get(kind):
            continue
        sec = ANALYSIS_SECTIONS[kind].report_section(src.analyses[kind], canvas)
        alerts = [Alert(f"{label}: {w}" if len(src.analyses[kind]) > 1 and label not in w else w)
                  for label, _, result in src.analyses[kind] for w in analysis_warnings(kind, result)]
        sec.blocks[1:1] = alerts
        sections.append(sec)
    return sections
