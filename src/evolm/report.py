"""``evolm report``: one page a person would rather look at than the JSON, from run, sweep, eval and
analysis directories.

    evolm report runs/es runs/grpo runs/es/analysis runs/sweep-sigma --label base-vs-es=runs/es --out report

Writes ``<out>/report.md`` (figures as ``figures/*.png``), ``<out>/report.html`` (self-contained: the
same PNGs embedded as base64 data URIs, tables as HTML) and ``<out>/report.json`` (every table's
numbers, the figure list and the files read).

Design decisions:

- Every number shown comes from a file. Inputs are read through one ``Reader`` that records each
  file it opens; the report ends with that list. Nothing is recomputed from weights or re-sampled;
  the few derived numbers (pass@k curves from per-problem n and c, smoothed curves, the ablation
  analyses of ``evolm.analysis.ablations``) are pure functions of what was read.
- An input path is recognised by its files: ``sweep.json`` -> an ``evolm sweep`` directory (its
  points are run directories); ``run.json`` -> a run (``kind`` es, grpo, pipeline; a pipeline sweep's
  point runs are taken one by one); ``eval.json`` -> an ``evolm eval`` output; ``drift.json``,
  ``sparsity.json``, ``localisation.json``, ``compression.json``, ``diversity.json``,
  ``update_variance.json`` -> an ``evolm analyze`` output. A run directory's ``eval/`` and ``analysis/``
  subdirectories (the default outputs of ``evolm eval`` / ``evolm analyze`` for it) are read too.
- The document is built once as a list of sections holding paragraphs, tables and figures, then
  rendered twice (Markdown and HTML), so the two can never disagree. Every plotted number also
  appears in a table.
- Labels: ``--label NAME=PATH`` names an input (and adds it when not given positionally). Otherwise a
  run is named by its method (es, grpo, pipeline), with the directory name added when two runs share
  a method. The base model's pass@k curve is a run's ``eval_before.json`` (one "base" curve when all
  runs measured the same thing), each trained run's curve its ``eval_after.json``.
- Plots use matplotlib's object API on the Agg canvas (``matplotlib.figure.Figure``), never pyplot
  state; analysis figures are redrawn by ``evolm.analysis.plots`` from the analysis JSON.
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import math
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolm.errors import UserError

ANALYSIS_KINDS = ("drift", "sparsity", "localisation", "compression", "diversity", "update_variance")
RUN_KINDS = ("es", "grpo", "pipeline")


# -- reading -------------------------------------------------------------------------------------------


class Reader:
    """Reads JSON / JSONL / TOML files and remembers every file it read (in order, once)."""

    def __init__(self):
        self.files: list[str] = []

    def _note(self, path: Path) -> None:
        s = str(path)
        if s not in self.files:
            self.files.append(s)

    def json(self, path) -> Any:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except ValueError as e:
            raise UserError(f"{path} is not valid JSON: {e}") from None
        self._note(path)
        return data

    def jsonl(self, path) -> list[dict]:
        from evolm.runs import read_jsonl

        path = Path(path)
        if path.exists():
            self._note(path)
        return read_jsonl(path)

    def toml(self, path) -> dict:
        from evolm.config import read_toml

        self._note(Path(path))
        return read_toml(path)

    def note(self, paths) -> None:
        for p in paths:
            self._note(Path(p))


def _by_step(records: list[dict]) -> list[dict]:
    """One record per step, the last one logged winning (a resumed run may have re-logged a step)."""
    out: dict[int, dict] = {}
    for r in records:
        if "step" in r:
            out[int(r["step"])] = r
    return [out[s] for s in sorted(out)]


@dataclass
class Run:
    label: str
    path: Path
    kind: str
    info: dict
    config: dict
    metrics: list[dict]
    eval_before: dict | None = None
    eval_after: dict | None = None

    @property
    def train(self) -> list[dict]:
        return _by_step([r for r in self.metrics if r.get("kind", "train") == "train"])

    @property
    def probes(self) -> list[dict]:
        return _by_step([r for r in self.metrics if r.get("kind") == "probe"])


@dataclass
class Sources:
    runs: list[Run] = field(default_factory=list)
    sweeps: list[tuple[str, Path, dict]] = field(default_factory=list)
    evals: list[tuple[str, Path, dict]] = field(default_factory=list)
    analyses: dict[str, list[tuple[str, Path, dict]]] = field(default_factory=dict)


def _read_run(path: Path, label: str | None, reader: Reader) -> Run:
    info = reader.json(path / "run.json")
    cfg = reader.toml(path / "config.toml") if (path / "config.toml").exists() else {}
    metrics = reader.jsonl(path / "metrics.jsonl")
    run = Run(label or "", path, str(info.get("kind", "run")), info, cfg, metrics)
    for which in ("before", "after"):
        f = path / f"eval_{which}.json"
        if f.exists():
            setattr(run, f"eval_{which}", reader.json(f))
    return run


def _analysis_files(path: Path) -> list[Path]:
    return [path / f"{k}.json" for k in ANALYSIS_KINDS if (path / f"{k}.json").exists()]


def gather(paths: list[str], labels: dict[str, str], reader: Reader) -> Sources:
    """Classify and read every input path (see the module docstring)."""
    src = Sources()
    given = {str(Path(p).resolve()): labels.get(str(Path(p).resolve())) for p in paths}
    for resolved, label in given.items():
        path = Path(resolved)
        if not path.is_dir():
            raise UserError(f"{path} is not a directory; pass run, sweep, eval or analysis directories")
        shown = Path(next(p for p in paths if str(Path(p).resolve()) == resolved))
        found = False
        if (path / "sweep.json").exists():
            src.sweeps.append((label or shown.name, shown, _read_sweep(path, reader)))
            continue
        if (path / "run.json").exists():
            info = json.loads((path / "run.json").read_text())
            if info.get("kind") in RUN_KINDS or (path / "metrics.jsonl").exists():
                src.runs.append(_read_run(path, label, reader))
                found = True
            else:  # a directory of runs (e.g. a pipeline sweep): each child run is an input
                reader.note([path / "run.json"])
                for child in sorted(p for p in path.iterdir() if (p / "run.json").exists()):
                    src.runs.append(_read_run(child, f"{label or path.name}/{child.name}", reader))
                    found = True
        subdirs = [path] + ([path / "eval", path / "analysis"] if found else [])
        for d in subdirs:
            if (d / "eval.json").exists():
                src.evals.append((label or (path.name if d == path else f"{path.name}/{d.name}"), d, reader.json(d / "eval.json")))
                found = True
            for f in _analysis_files(d):
                result = reader.json(f)
                src.analyses.setdefault(f.stem, []).append((label or path.name, d, result))
                found = True
        if not found:
            raise UserError(f"{shown} is not a run, sweep, eval or analysis directory (no run.json, sweep.json, "
                            f"eval.json or {'/'.join(k + '.json' for k in ANALYSIS_KINDS[:2])}...)")
    _name_runs(src.runs)
    return src


def _read_sweep(path: Path, reader: Reader) -> dict:
    """The sweep summary recomputed from the points' run directories (``sweep.summarize_sweep``)."""
    from evolm.sweep import summarize_sweep

    summary = summarize_sweep(path)
    reader.note(summary.pop("sources"))
    return summary


def _method(run: Run) -> str:
    return run.kind if run.kind in RUN_KINDS else run.info.get("method", run.kind)


def _name_runs(runs: list[Run]) -> None:
    counts: dict[str, int] = {}
    for r in runs:
        counts[_method(r)] = counts.get(_method(r), 0) + 1
    for r in runs:
        if not r.label:
            m = _method(r)
            r.label = m if counts[m] == 1 else f"{m} ({r.path.name})"


# -- the document ----------------------------------------------------------------------------------


@dataclass
class Table:
    columns: list[str]
    rows: list[list[Any]]
    caption: str = ""


@dataclass
class Figure:
    name: str
    title: str
    caption: str = ""


@dataclass
class Section:
    title: str
    blocks: list = field(default_factory=list)


def fmt(v: Any) -> str:
    """A table cell: None -> empty, floats with 4 significant digits, lists joined."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(fmt(x) for x in v)
    return str(v)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "x"


class Canvas:
    """Saves figures under ``<out>/figures`` with unique names."""

    def __init__(self, out: Path):
        self.dir = out / "figures"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.names: set[str] = set()

    def name(self, stem: str) -> str:
        base = _slug(stem)
        name, i = base, 2
        while name in self.names:
            name, i = f"{base}-{i}", i + 1
        self.names.add(name)
        return name

    def path(self, name: str) -> Path:
        return self.dir / f"{name}.png"

    def figure(self, width: float = 7.0, height: float = 4.0):
        from matplotlib.figure import Figure as MplFigure

        return MplFigure(figsize=(width, height), dpi=110, layout="constrained")

    def save(self, fig, stem: str, title: str, caption: str = "") -> Figure:
        name = self.name(stem)
        fig.savefig(self.path(name))
        return Figure(name, title, caption)


def _integer_x(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _series_styles():
    return ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray",
            "tab:olive", "tab:cyan"]


# -- sections: runs ------------------------------------------------------------------------------------


def _eval_curve(report: dict) -> tuple[list[float], dict]:
    from evolm import metrics

    problems = report.get("problems") or []
    ns = [p["n"] for p in problems]
    cs = [p["c"] for p in problems]
    return (metrics.pass_at_k_curve(ns, cs) if ns else []), report.get("summary", {})


def _same_eval(a: dict, b: dict) -> bool:
    keys = ("task", "sampling", "summary")
    return all(a.get(k) == b.get(k) for k in keys) and [p.get("id") for p in a.get("problems", [])] == \
        [p.get("id") for p in b.get("problems", [])]


def passk_section(src: Sources, canvas: Canvas) -> Section | None:
    curves: list[tuple[str, str, list[float], dict]] = []  # (label, task, curve, summary)
    befores = [(r, r.eval_before) for r in src.runs if r.eval_before]
    if befores and all(_same_eval(befores[0][1], b) for _, b in befores[1:]):
        befores = [(None, befores[0][1])]
    for run, report in befores:
        curve, summary = _eval_curve(report)
        curves.append(("base" if run is None else f"base ({run.label})", report.get("task", ""), curve, summary))
    for run in src.runs:
        if run.eval_after:
            curve, summary = _eval_curve(run.eval_after)
            curves.append((run.label, run.eval_after.get("task", ""), curve, summary))
    for label, _, report in src.evals:
        for task, t in report.get("tasks", {}).items():
            curve, summary = _eval_curve(t)
            curves.append((f"{label}: {report.get('model', {}).get('spec', '')}".rstrip(": "), task, curve, summary))
    curves = [c for c in curves if c[2]]
    if not curves:
        return None
    tasks = sorted({c[1] for c in curves})
    sec = Section("Held-out pass@k: base vs trained")
    sec.blocks.append("pass@k for k = 1 .. n from each problem's n samples and c correct ones (unbiased estimator, "
                      "averaged over problems); base = a run's `eval_before.json`, trained = its `eval_after.json`, "
                      "plus any `evolm eval` outputs.")
    fig = canvas.figure(7.0, 4.2)
    ax = fig.add_subplot()
    colors = _series_styles()
    for i, (label, task, curve, _) in enumerate(curves):
        name = label if len(tasks) == 1 else f"{label} [{task}]"
        style = "--" if label.startswith("base") else "-"
        ax.plot(range(1, len(curve) + 1), curve, style, marker="o", ms=3, color=colors[i % len(colors)], label=name)
    ax.set_xscale("log", base=2)
    kmax_plot = max(len(c[2]) for c in curves)
    ticks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if k <= kmax_plot]
    ax.set_xticks(ticks, [str(k) for k in ticks])
    ax.minorticks_off()
    ax.set_xlabel("k (samples)")
    ax.set_ylabel("pass@k")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title("held-out pass@k" + (f" on {tasks[0]}" if len(tasks) == 1 else ""))
    ax.legend(fontsize=8)
    sec.blocks.append(canvas.save(fig, "passk", "pass@k curves", "dashed: base model"))
    kmax = max(len(c[2]) for c in curves)
    ks = sorted({k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256) if k <= kmax} | {kmax})
    rows = []
    for label, task, curve, s in curves:
        rows.append([label, task, s.get("problems"), s.get("n"), s.get("greedy")] +
                    [curve[k - 1] if k <= len(curve) else None for k in ks] +
                    [s.get("mean_correct"), s.get("entropy"), s.get("distinct_correct")])
    sec.blocks.append(Table(["model", "task", "problems", "n", "greedy"] + [f"pass@{k}" for k in ks] +
                            ["mean correct", "entropy (nats)", "distinct correct"], rows))
    return sec


def _stage_bounds(run: Run) -> list[int]:
    train = run.train
    return [b["step"] - 1 for a, b in zip(train, train[1:]) if a.get("stage") != b.get("stage")]


def reward_section(src: Sources, canvas: Canvas) -> Section | None:
    runs = [r for r in src.runs if any(x.get("reward_mean") is not None for x in r.train)]
    if not runs:
        return None
    sec = Section("Training reward")
    sec.blocks.append("Mean training reward per update (`metrics.jsonl`, kind train): for ES the mean over the "
                      "population's members, for GRPO over the update's sampled completions. Dotted lines mark "
                      "pipeline stage boundaries.")
    fig = canvas.figure(7.0, 4.0)
    ax = fig.add_subplot()
    colors = _series_styles()
    rows = []
    for i, run in enumerate(runs):
        pts = [(r["step"], r["reward_mean"]) for r in run.train if r.get("reward_mean") is not None]
        color = colors[i % len(colors)]
        ax.plot(*zip(*pts), marker="o", ms=2.5, color=color, label=run.label)
        centre = [(r["step"], r["center_reward"]) for r in run.train if r.get("center_reward") is not None]
        if centre:
            ax.plot(*zip(*centre), "s--", ms=3, color=color, alpha=0.7, label=f"{run.label} (centre)")
        for b in _stage_bounds(run):
            ax.axvline(b + 0.5, color=color, ls=":", lw=1)
        values = [v for _, v in pts]
        rows.append([run.label, _method(run), len(values), values[0], values[-1], max(values), sum(values) / len(values)])
    ax.set_xlabel("update")
    ax.set_ylabel("training reward")
    _integer_x(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    sec.blocks.append(canvas.save(fig, "reward", "training reward per update"))
    sec.blocks.append(Table(["run", "method", "updates", "first", "last", "max", "mean"], rows))
    long = [[run.label, r["step"], r.get("reward_mean"), r.get("reward_std"), r.get("center_reward"),
             r.get("update_status") or r.get("stage_method") or ""] for run in runs for r in run.train]
    sec.blocks.append(Table(["run", "update", "reward mean", "reward std", "centre reward", "status / stage"], long,
                            "every plotted point"))
    return sec


def probe_section(src: Sources, canvas: Canvas) -> Section | None:
    runs = [r for r in src.runs if r.probes]
    if not runs:
        return None
    keys = sorted({k for r in runs for p in r.probes for k in p if re.fullmatch(r"pass@\d+", k)},
                  key=lambda k: int(k.split("@")[1]))
    sec = Section("Held-out probe: entropy and pass@k during training")
    tasks = sorted({str(p.get("task")) for r in runs for p in r.probes if p.get("task")})
    sec.blocks.append("Probe records (`metrics.jsonl`, kind probe): token entropy (nats, at the probe temperature) and "
                      f"pass@k on a fixed held-out set{' (' + ', '.join(tasks) + ')' if tasks else ''}, measured at "
                      "step 0, every `probe.every` updates and at the end.")
    fig = canvas.figure(10.0, 3.8)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    colors = _series_styles()
    styles = ["-", "--", ":", "-."]
    for i, run in enumerate(runs):
        color = colors[i % len(colors)]
        ent = [(p["step"], p["entropy"]) for p in run.probes if p.get("entropy") is not None]
        if ent:
            left.plot(*zip(*ent), marker="o", ms=3, color=color, label=run.label)
        for j, k in enumerate(keys):
            pts = [(p["step"], p[k]) for p in run.probes if p.get(k) is not None]
            if pts:
                right.plot(*zip(*pts), styles[j % len(styles)], marker="o", ms=3, color=color, label=f"{run.label} {k}")
    left.set_xlabel("update")
    left.set_ylabel("token entropy (nats)")
    right.set_xlabel("update")
    right.set_ylabel("pass@k")
    right.set_ylim(0, 1.02)
    for ax in (left, right):
        _integer_x(ax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    sec.blocks.append(canvas.save(fig, "probe", "entropy and pass@k trajectories"))
    rows = [[run.label, p["step"], p.get("task"), p.get("entropy")] + [p.get(k) for k in keys] + [p.get("distinct_correct")]
            for run in runs for p in run.probes]
    sec.blocks.append(Table(["run", "update", "task", "entropy"] + keys + ["distinct correct"], rows))
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
        rows.append([run.label, _method(run), len(train), sum(sec_) / len(sec_) if sec_ else None, sum(sec_) if sec_ else None,
                     sum(seqs) / len(seqs) if seqs else None, sum(tok) / len(tok) if tok else None,
                     sum(tok) if tok else None, max(rss) if rss else None, max((r.get("peak_gpu_mb") or 0 for r in train), default=0) or None])
    if not rows:
        return None
    return Section("Cost", ["Per-update cost from the training records: wall seconds of an update (generation, "
                            "perturbation and update; probes and checkpoints excluded), sequences and tokens generated, "
                            "and the process's peak resident memory.",
                            Table(["run", "method", "updates", "s / update", "total s", "sequences / update",
                                   "gen tokens / update", "gen tokens total", "peak RSS MB", "peak GPU MB"], rows)])


# -- sections: analyses --------------------------------------------------------------------------------


def _analysis_rows(kind: str, result: dict) -> Table:
    from evolm.categories import CATEGORIES

    if kind == "drift":
        cats = [c for c in CATEGORIES if any(c in m["by_category"] for m in result["models"].values())]
        rows = [[label, m["relative_distance"]] + [(m["by_category"].get(c) or {}).get("relative_distance") for c in cats] +
                [(m["by_category"].get(c) or {}).get("share_of_squared_distance") for c in cats]
                for label, m in result["models"].items()]
        return Table(["model", "whole model"] + [f"{c} rel." for c in cats] + [f"{c} share of ‖Δ‖²" for c in cats], rows,
                     "relative distance ‖θ − θ0‖ / ‖θ0‖")
    if kind == "sparsity":
        metric = result.get("metric", "greedy_pass@1")
        rows = []
        for label, m in result["models"].items():
            points = {p["tau"]: p for p in m.get("points") or []}
            ref = m.get("reference") or {}
            if ref.get("base"):  # the curve's anchors: θ0 (nothing kept) and θ0 + Δ (everything kept)
                rows.append([f"{label}: base θ0", None, None, 0.0, ref["base"].get(metric)])
            if ref.get("trained"):
                rows.append([f"{label}: trained θ0 + Δ", 0.0, 0.0, 1.0, ref["trained"].get(metric)])
            for tau, frac in zip(m["taus"], m["fraction_below"]):
                p = points.get(tau, {})
                rows.append([label, tau, frac, p.get("kept_fraction"), (p.get("metrics") or {}).get(metric)])
        return Table(["model", "τ", "fraction of |Δ| below τ", "kept fraction", f"{metric} of θ0 + Δ·1[|Δ| ≥ τ]"], rows,
                     f"τ scale {fmt(result.get('tau_scale'))} ({result.get('tau_scale_source', '')})")
    if kind == "localisation":
        rows = [[label, k, loc["max_abs_delta"]] + [loc["by_category"].get(c, 0) for c in CATEGORIES]
                for label, per_k in result["models"].items() for k, loc in per_k.items()]
        return Table(["model", "k", "max |Δ|"] + list(CATEGORIES), rows, "top-k largest |Δ| coordinates by category")
    if kind == "compression":
        metric = result.get("metric", "greedy_pass@1")
        rows = [[r["model"], r["method"], r["metrics"].get(metric), r.get("relative_error"), r.get("error_to_update"),
                 r.get("zero_fraction")] for r in result["rows"]]
        return Table(["model", "method", metric, "relative weight error", "error / update", "zero fraction"], rows)
    if kind == "diversity":
        setup = result.get("setup", {})
        rows = [["population coverage (1 sample per member)", result["population"]],
                ["centre coverage (N samples)", result["center"]], ["gap", result["gap"]],
                ["verifier-projected JSD (nats)", result["js_divergence"]],
                ["JSD sampling-noise baseline", result.get("js_divergence_null")],
                ["members N", result["num_members"]], ["prompts", result["num_prompts"]],
                ["samples per member and prompt", result.get("member_samples_per_prompt")],
                ["centre samples per prompt", result.get("center_samples_per_prompt")],
                ["centre estimator", result.get("center_estimator")],
                ["centre accuracy", result.get("center_accuracy")],
                ["mean member accuracy", sum(result["member_accuracy"]) / len(result["member_accuracy"])
                 if result.get("member_accuracy") else None]]
        rows += [[k, setup[k]] for k in ("model", "task", "sigma", "estimator", "temperature") if k in setup]
        return Table(["quantity", "value"], rows)
    if kind == "update_variance":
        rows = [[name, e.get("evaluations_per_update"), e.get("directions_per_update"), e["mean_pairwise_cosine"],
                 e.get("std_pairwise_cosine"), e["relative_variance"], e["mean_coordinate_variance"], e["mean_update_norm"],
                 f"{list(e.get('status', [])).count('applied')}/{e['repeats']}"]
                for name, e in result["estimators"].items()]
        return Table(["estimator", "evaluations / update", "directions", "mean pairwise cosine", "std", "relative variance",
                      "mean coordinate variance", "mean ‖update‖ (subset)", "applied"], rows)
    raise ValueError(kind)


ANALYSIS_TEXT = {
    "drift": "Relative parameter drift ‖θ − θ0‖ / ‖θ0‖ per parameter category (`evolm analyze drift`).",
    "sparsity": "Functional sparsity: how many update coordinates are below a threshold τ, and how the model does "
                "when only the coordinates with |Δ| ≥ τ are kept (`evolm analyze sparsity`).",
    "localisation": "Where the largest-magnitude updates land, counted by parameter category (`evolm analyze localisation`).",
    "compression": "Fake-quantisation and magnitude pruning, re-evaluated on the target task (`evolm analyze compression`).",
    "diversity": "Lemma 2: one sample per ES population member versus N samples from the centre, and the "
                 "verifier-projected Jensen-Shannon divergence among the members (`evolm analyze diversity`).",
    "update_variance": "The spread of R independent ES update estimates at fixed weights and prompts, per estimator at "
                       "equal evaluation budget (`evolm analyze update-variance`).",
}


def analysis_sections(src: Sources, canvas: Canvas) -> list[Section]:
    from evolm.analysis import plots

    out = []
    for kind in ANALYSIS_KINDS:
        items = src.analyses.get(kind) or []
        if not items:
            continue
        sec = Section(f"Analysis: {kind.replace('_', ' ')}", [ANALYSIS_TEXT[kind]])
        for label, path, result in items:
            name = canvas.name(f"{kind}-{label}" if len(items) > 1 else kind)
            getattr(plots, f"plot_{kind}")(result, canvas.path(name))
            sec.blocks.append(Figure(name, f"{kind.replace('_', ' ')} ({label})", f"from {path / (kind + '.json')}"))
            sec.blocks.append(_analysis_rows(kind, result))
        out.append(sec)
    return out


# -- sections: sweeps ----------------------------------------------------------------------------------


def _value_label(v) -> str:
    from evolm.sweep import value_label

    return value_label(v)


def _curves_plot(ax, curves: dict[str, list], title: str, key: str) -> None:
    colors = _series_styles()
    for i, (value, pts) in enumerate(curves.items()):
        if pts:
            ax.plot([s for s, _ in pts], [r for _, r in pts], marker="o", ms=2.5, color=colors[i % len(colors)],
                    label=f"{key.split('.')[-1]}={value}")
    ax.set_xlabel("update")
    ax.set_ylabel("training reward (smoothed)")
    _integer_x(ax)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def sweep_sections(src: Sources, canvas: Canvas, window: int, band: float, mode: str, reference) -> list[Section]:
    from evolm.analysis.ablations import ablations_for

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
        rows = [[_value_label(p["assignments"].get(k)) if k in p["assignments"] else "" for k in keys] +
                [p["status"], p.get("updates"), p.get("start_reward"), p.get("final_reward"),
                 (p.get("eval_before") or {}).get("greedy"), (p.get("eval_after") or {}).get("greedy"),
                 p.get("seconds_per_update"), p.get("gen_tokens_total"), p.get("peak_rss_mb"), p.get("error")]
                for p in points]
        sec.blocks.append(Table(keys + ["status", "updates", "start reward", "final reward", "held-out before (greedy)",
                                        "held-out after (greedy)", "s / update", "gen tokens", "peak RSS MB", "error"], rows))
        usable = [p for p in points if p.get("curve")]
        if usable:
            from evolm.analysis.ablations import smooth

            fig = canvas.figure(7.0, 4.0)
            curves = {}
            for p in usable:
                pts = [(s, r) for s, r in p["curve"] if r is not None]
                curves[",".join(f"{k.split('.')[-1]}={_value_label(v)}" for k, v in p["assignments"].items())] = \
                    list(zip([s for s, _ in pts], smooth([r for _, r in pts], window)))
            ax = fig.add_subplot()
            colors = _series_styles()
            for i, (name, pts) in enumerate(curves.items()):
                ax.plot([s for s, _ in pts], [r for _, r in pts], marker="o", ms=2.5, color=colors[i % len(colors)], label=name)
            ax.set_xlabel("update")
            ax.set_ylabel("training reward (smoothed)")
            _integer_x(ax)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            sec.blocks.append(canvas.save(fig, f"sweep-{label}-curves", "training reward of every point"))
        ablations = ablations_for(usable, keys, window=window, band=band, mode=mode, reference=reference)
        for name, result in ablations.items():
            sec.blocks += _ablation_blocks(name, result, label, canvas)
        out.append(sec)
    return out


def _ablation_blocks(name: str, result: dict, sweep_label: str, canvas: Canvas) -> list:
    blocks: list = []
    key = result["key"]
    for group, g in result["groups"].items():
        suffix = "" if group == "all" else f" ({group})"
        if name == "population":
            blocks.append(f"**Population scaling{suffix}.** Reference N = {_value_label(g['reference'])}; "
                          f"'within band from' is the first update u such that at every later update "
                          f"|r_N − r_ref| ≤ {result['band']:g}" + (" × |r_ref|" if result["mode"] == "relative" else "") +
                          " on the smoothed curves (None: outside the band at the last update)." +
                          (f" {g['note']}" if g.get("note") else ""))
            if not g["rows"]:
                continue
            fig = canvas.figure(7.0, 4.0)
            ax = fig.add_subplot()
            _curves_plot(ax, g["curves"], f"population scaling{suffix}", key)
            ref = g["curves"].get(str(g["reference"])) or []
            if ref:
                steps = [s for s, _ in ref]
                width = [(result["band"] * abs(r) if result["mode"] == "relative" else result["band"]) for _, r in ref]
                ax.fill_between(steps, [r - w for (_, r), w in zip(ref, width)], [r + w for (_, r), w in zip(ref, width)],
                                color="gray", alpha=0.25, label="band around reference")
                ax.legend(fontsize=7)
            blocks.append(canvas.save(fig, f"{sweep_label}-population-{group}", f"population scaling{suffix}"))
            blocks.append(Table(["N", "within band from update", "final reward", "final gap to reference",
                                 "max |gap| after", "updates compared"],
                                [[r["value"], r["within_band_from"], r["final_reward"], r["final_gap"], r["max_abs_gap_after"],
                                  r["compared"]] for r in g["rows"]]))
        elif name == "sigma":
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
            if all(x > 0 for x in xs):
                ax.set_xscale("log")
            ax.set_xlabel("σ")
            ax.set_ylabel("training reward")
            ax.set_title(f"σ sweep{suffix} (red ×: flagged)", fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            blocks.append(f"**σ sweep{suffix}.** Flags: no_signal = at least {result['no_signal']:.0%} of updates were "
                          f"zero (every member scored the same); below_start = final < first-update reward; collapsed = "
                          f"final < {result['collapse']:g} × start (or held-out greedy after < {result['collapse']:g} × "
                          f"before); heldout_below_base = held-out greedy after < before. Best unflagged σ: "
                          f"{fmt(g['best'])}.")
            blocks.append(canvas.save(fig, f"{sweep_label}-sigma-{group}", f"σ sweep{suffix}"))
            blocks.append(Table(["σ", "start reward", "final reward", "change", "zero-update fraction",
                                 "held-out before", "held-out after", "flags"],
                                [[r["value"], r["start_reward"], r["final_reward"], r["change"], r["zero_update_fraction"],
                                  r["heldout_before"], r["heldout_after"], ", ".join(r["flags"])] for r in rows]))
        else:  # estimator, shaping
            title = {"estimator": "Estimator (equal evaluation budget)", "shaping": "Fitness shaping"}[name]
            fig = canvas.figure(7.0, 4.0)
            ax = fig.add_subplot()
            _curves_plot(ax, g["curves"], f"{title.lower()}{suffix}", key)
            text = f"**{title}{suffix}.** Final reward = smoothed reward at the last update; mean = mean over all updates."
            if name == "estimator":
                text += (" Evaluations = members × updates; one-point and antithetic are compared at the same population, "
                         f"i.e. the same evaluation budget (equal budget here: {fmt(g.get('equal_budget'))}).")
            blocks.append(text)
            blocks.append(canvas.save(fig, f"{sweep_label}-{name}-{group}", f"{title.lower()}{suffix}"))
            blocks.append(Table([key.split(".")[-1], "updates", "final reward", "mean reward", "evaluations",
                                 "held-out before", "held-out after"],
                                [[r["value"], r["updates"], r["final_reward"], r["mean_reward"], r["evaluations"],
                                  r["heldout_before"], r["heldout_after"]] for r in g["rows"]]))
    return blocks


# -- rendering -----------------------------------------------------------------------------------------


def _md_cell(v: Any) -> str:
    return fmt(v).replace("|", "\\|").replace("\n", " ")


def render_markdown(title: str, sections: list[Section], files: list[str], note: str) -> str:
    lines = [f"# {title}", "", note, ""]
    for sec in sections:
        lines += [f"## {sec.title}", ""]
        for b in sec.blocks:
            if isinstance(b, str):
                lines += [b, ""]
            elif isinstance(b, Figure):
                alt = b.title.replace("[", "(").replace("]", ")")
                lines += [f"![{alt}](figures/{b.name}.png)", ""]
                if b.caption:
                    lines += [f"*{b.caption}*", ""]
            elif isinstance(b, Table):
                if b.caption:
                    lines += [f"*{b.caption}*", ""]
                lines.append("| " + " | ".join(_md_cell(c) for c in b.columns) + " |")
                lines.append("|" + "|".join("---" for _ in b.columns) + "|")
                lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
                lines.append("")
    lines += ["## Files read", ""] + [f"- `{f}`" for f in files] + [""]
    return "\n".join(lines)


def _inline_html(text: str) -> str:
    text = html.escape(text)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", text)


CSS = """body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{border-bottom:2px solid #ccc}h2{margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:0.6em 0 1.4em;font-size:0.85em}th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}figure{margin:1em 0}img{max-width:100%}
figcaption,.caption{color:#555;font-size:0.85em}code{background:#f4f4f4;padding:0 3px}
.tablewrap{overflow-x:auto}"""


def render_html(title: str, sections: list[Section], files: list[str], note: str, figure_dir: Path) -> str:
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
           f"<style>{CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1>", f"<p>{_inline_html(note)}</p>"]
    toc = "".join(f"<li><a href='#s{i}'>{html.escape(s.title)}</a></li>" for i, s in enumerate(sections))
    out.append(f"<ul>{toc}<li><a href='#files'>Files read</a></li></ul>")
    for i, sec in enumerate(sections):
        out.append(f"<h2 id='s{i}'>{html.escape(sec.title)}</h2>")
        for b in sec.blocks:
            if isinstance(b, str):
                out.append(f"<p>{_inline_html(b)}</p>")
            elif isinstance(b, Figure):
                data = base64.b64encode((figure_dir / f"{b.name}.png").read_bytes()).decode()
                cap = html.escape(b.title + (f" ({b.caption})" if b.caption else ""))
                out.append(f"<figure><img alt='{html.escape(b.title)}' src='data:image/png;base64,{data}'>"
                           f"<figcaption>{cap}</figcaption></figure>")
            elif isinstance(b, Table):
                if b.caption:
                    out.append(f"<p class='caption'>{_inline_html(b.caption)}</p>")
                head = "".join(f"<th>{html.escape(str(c))}</th>" for c in b.columns)
                body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(c))}</td>" for c in row) + "</tr>" for row in b.rows)
                out.append(f"<div class='tablewrap'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")
    out.append("<h2 id='files'>Files read</h2><ul>" + "".join(f"<li><code>{html.escape(f)}</code></li>" for f in files) + "</ul>")
    out.append("</body></html>")
    return "\n".join(out)


# -- entry point -------------------------------------------------------------------------------------


@dataclass
class ReportResult:
    out: Path
    markdown: Path
    html: Path
    json: Path
    figures: list[Path]


def build_report(paths: list[str], out: str | Path, labels: dict[str, str] | None = None, title: str = "evolm report",
                 window: int = 1, band: float = 0.005, band_mode: str = "relative", reference=None) -> ReportResult:
    """Read the inputs, draw the figures, and write report.md, report.html and report.json into ``out``.

    ``labels`` maps input paths to names (``--label NAME=PATH``); ``window``, ``band``, ``band_mode`` and
    ``reference`` set the sweep ablations (``evolm.analysis.ablations``).
    """
    from evolm.runs import atomic_write_json, atomic_write_text

    if window < 1:
        raise UserError(f"--window must be >= 1 (got {window})")
    if band < 0 or band_mode not in ("relative", "absolute"):
        raise UserError("--band must be >= 0 and --band-mode relative or absolute")
    labels = {str(Path(p).resolve()): name for p, name in (labels or {}).items()}
    paths = list(dict.fromkeys(list(paths) + [p for p in (labels or {}) if p not in {str(Path(x).resolve()) for x in paths}]))
    if not paths:
        raise UserError("evolm report needs at least one run, sweep, eval or analysis directory")
    for p in paths:
        if not Path(p).exists():
            raise UserError(f"{p} does not exist")
    reader = Reader()
    src = gather(paths, labels, reader)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    canvas = Canvas(out)
    for old in canvas.dir.glob("*.png"):  # a re-run must not leave figures the new report does not list
        old.unlink()
    sections = [s for s in (passk_section(src, canvas), probe_section(src, canvas), reward_section(src, canvas),
                            cost_section(src)) if s is not None]
    sections += sweep_sections(src, canvas, window, band, band_mode, reference)
    sections += analysis_sections(src, canvas)
    if src.runs:
        rows = [[r.label, _method(r), str(r.path), r.info.get("status"), r.config.get("model", {}).get("spec"),
                 r.config.get("task", {}).get("name"), len(r.train)] for r in src.runs]
        sections.insert(0, Section("Runs", [Table(["label", "method", "directory", "status", "model", "task", "updates"], rows)]))
    if not sections:
        raise UserError("none of the inputs has anything to report (no training records, evaluations, sweeps or analyses)")
    note = (f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')} by `evolm report` from {len(reader.files)} files "
            "(listed at the end); every number below is read from them or computed from them by a documented pure "
            "function.")
    figures = [b for s in sections for b in s.blocks if isinstance(b, Figure)]
    md = render_markdown(title, sections, reader.files, note)
    page = render_html(title, sections, reader.files, note, canvas.dir)
    atomic_write_text(out / "report.md", md)
    atomic_write_text(out / "report.html", page)
    data = {"title": title, "inputs": [str(p) for p in paths], "files_read": reader.files,
            "figures": [f"figures/{f.name}.png" for f in figures],
            "sections": [{"title": s.title, "tables": [{"columns": b.columns, "rows": b.rows, "caption": b.caption}
                                                         for b in s.blocks if isinstance(b, Table)],
                          "figures": [f"figures/{b.name}.png" for b in s.blocks if isinstance(b, Figure)]} for s in sections]}
    atomic_write_json(out / "report.json", data)
    return ReportResult(out, out / "report.md", out / "report.html", out / "report.json",
                        [canvas.path(f.name) for f in figures])


def _parse_labels(items: list[str]) -> dict[str, str]:
    labels = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise UserError(f"--label expects NAME=PATH, e.g. --label es=runs/es-demo (got '{item}')")
        labels[path.strip()] = name.strip()
    return labels


def _cmd_report(args) -> int:
    reference = None
    if args.reference is not None:
        from evolm.config import parse_value

        reference = parse_value(args.reference)
    result = build_report(args.paths, args.out, labels=_parse_labels(args.label), title=args.title, window=args.window,
                          band=args.band, band_mode=args.band_mode, reference=reference)
    print(f"wrote {result.markdown}, {result.html} and {result.json} ({len(result.figures)} figures in {result.out / 'figures'})")
    return 0


def add_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="report.md + self-contained report.html with plots and tables from runs, sweeps, evals and analyses",
        description="Build one report from run directories (ES, GRPO, pipeline), sweep directories (evolm sweep), eval "
                    "outputs (eval.json) and analysis outputs (drift.json, sparsity.json, localisation.json, "
                    "compression.json, diversity.json, update_variance.json). Draws pass@k curves (base vs trained), entropy "
                    "and pass@k trajectories, training reward curves, a cost table, the analyses, and for sweeps the "
                    "population-scaling, sigma, estimator and shaping ablations, each with a table of its numbers. "
                    "Writes <out>/report.md, <out>/report.html (figures embedded), <out>/report.json and <out>/figures/.",
        epilog="example: evolm report runs/es runs/grpo runs/es/analysis --label ES=runs/es --out report",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", metavar="PATH", help="run, sweep, eval or analysis directories")
    p.add_argument("--label", action="append", default=[], metavar="NAME=PATH",
                   help="name an input in plots and tables (repeatable; adds PATH when not given positionally)")
    p.add_argument("--out", "-o", default="report", metavar="DIR", help="output directory (default: report)")
    p.add_argument("--title", default="evolm report", help="report title (default: evolm report)")
    g = p.add_argument_group("sweep ablations")
    g.add_argument("--window", type=int, default=1, help="trailing moving-average window for reward curves (default: 1 = none)")
    g.add_argument("--band", type=float, default=0.005, help="population-scaling band (default: 0.005 = 0.5%%)")
    g.add_argument("--band-mode", default="relative", choices=["relative", "absolute"],
                   help="band relative to the reference reward (|Δ| <= band·|r_ref|) or absolute (|Δ| <= band) (default: relative)")
    g.add_argument("--reference", metavar="N", help="reference population size (default: the largest N of each group)")
    p.set_defaults(func=_cmd_report)

