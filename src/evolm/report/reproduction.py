"""``evolm report --study``: the reproduction study's page, ``docs/REPRODUCTION.md``, from committed files.

    evolm report --study experiments/study/claims.toml --out docs

Writes ``<out>/REPRODUCTION.md``, its figures under ``<out>/study/figures/`` and every verdict's numbers in
``<out>/study/reproduction.json``. The claims, their tests and the statistics are ``report.study``; this
module lays the page out:

1. "What was run": the claims file's intro, then one row per run read (model, dtype, device, threads,
   task, updates, update seconds, sequences, held-out problems × samples), all from the run files.
2. "Claims and verdicts": one row per claim or open question: claim | command | paper reports |
   measured here (each test with its 95% interval and verdict; a contradicted one also at the claim's
   family-wise level, a context one marked not counted) | verdict | what would decide it (with
   the cost here and, when not run, why).
3. Held-out pass@k curves with bootstrap bands, one figure per claim (claims testing the same files share
   one), each with its table.
4. The run sections of ``evolm report`` on the runs the tests name (probe entropy and pass@k
   trajectories, budget, cost), against the quantity the runs were matched on, and the analyses' own
   sections (drift, localisation, ...) for the analysis files the tests name.
5. The sweep sections of ``evolm report`` (training-reward curves, the population-scaling band with the
   paper's 0.5% relative band and the largest N as reference) for every sweep one of whose points a test
   names.

Design decisions:

- Generated only from files under the study's data directory (``study.data``: committed copies of run
  directories without weights, and analysis outputs) plus the claims file, so anyone can regenerate
  the page; it says so at the top and lists every file read at the end.
- Run and analysis directories are read through ``report.read.gather`` (runs only through the
  ``RunDir`` read side): a copied run directory without ``final/`` or checkpoints reads like any run,
  and its status is what its ``run.json`` says (finished).
- The page holds no machine's absolute paths: paths under the current directory are shown relative to
  it (run from the repository root, as ``experiments/study/run.sh report`` does).
- A claim or test that was not run still gets its row (verdict "not run" with the reason); a page
  with nothing run yet is valid, so it can be generated before the first run finishes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evolm.document import Canvas, Figure, Section, Table, passk_axes, pick_colour, render_markdown
from evolm.metrics import pass_at_k_problem
from evolm.report.read import ANALYSIS_KINDS, Reader, Sources, gather
from evolm.report.sections import analysis_sections, budget_section, configured_match, cost_section, probe_section
from evolm.report.study import (BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, CONTRADICTED, FAMILY_RESAMPLES, INCONCLUSIVE, LEVEL,
                                NOT_RUN, REPRODUCED, ClaimOutcome, ClaimsFile, bootstrap_curve, bootstrap_interval,
                                VERDICTS, describe, evaluate_claims, exact_proportion_interval, files_of, load_claims,
                                pooled_problems, task_report)
from evolm.report.study.stats import is_binary
from evolm.report.sweeps import sweep_sections
from evolm.runs import atomic_write_json, atomic_write_text

PAGE = "REPRODUCTION.md"
"""The page's file name under ``--out``."""
FIGURES = "study/figures"
"""Where the figures go, under ``--out`` (and how the page links them)."""


@dataclass
class StudyResult:
    """What ``build_study`` wrote."""

    markdown: Path
    """``<out>/REPRODUCTION.md``."""
    json: Path
    """``<out>/study/reproduction.json``: every claim's verdict and every test's numbers."""
    figures: list[Path]
    """The PNGs under ``<out>/study/figures/``."""
    outcomes: list[ClaimOutcome]
    """Every claim's outcome, in table order."""


def shown(path: str | Path) -> str:
    """``path`` relative to the current directory when it lies under it, else as given."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


# -- sections ----------------------------------------------------------------------------------------


def runs_table(src: Sources, data: Path) -> Table:
    """One row per run read: what it trained, on what, and what it spent (all from its files)."""
    rows = []
    for r in src.runs:
        cfg, last = r.config, (r.train[-1] if r.train else {})
        model, task = cfg.get("model") or {}, cfg.get("task") or {}
        params = ", ".join(f"{k}={v}" for k, v in (task.get("params") or {}).items())
        after = (r.eval_after or {}).get("summary") or {}
        rows.append([r.label, r.method, model.get("spec"), model.get("dtype"), model.get("device"), model.get("threads"),
                     f"{task.get('name')} ({params})" if params else task.get("name"), r.info.get("status"), len(r.train),
                     last.get("seconds_total"), last.get("gen_sequences_total"),
                     f"{after.get('problems')} × {after.get('n')}" if after else None])
    return Table(["run", "method", "model", "dtype", "device", "threads", "task", "status", "updates", "update seconds",
                  "sequences", "held-out problems × samples"], rows,
                 f"the runs the tests read, from their run.json, config.toml, metrics.jsonl and eval_after.json under {shown(data)}/")


def intro_section(claims: ClaimsFile, src: Sources, data: Path) -> Section:
    blocks: list = [claims.study.intro.strip()] if claims.study.intro.strip() else []
    if src.runs:
        blocks.append(runs_table(src, data))
    else:
        blocks.append(f"No run directory named by a test exists yet under `{shown(data)}/`.")
    return Section("What was run", blocks)


def verdict_section(outcomes: list[ClaimOutcome]) -> Section:
    counts = {v: sum(o.verdict == v for o in outcomes) for v in VERDICTS}
    method = (f"Each test in the measured column gives the mean per-problem difference (change: after − before; compare: "
              f"b − a; a problem on several rows of one evaluation is one problem, its rows pooled) with its {LEVEL:.0%} "
              f"paired-bootstrap interval over problems ({BOOTSTRAP_RESAMPLES} resamples, seed {BOOTSTRAP_SEED}); for a "
              "metric that is 0 or 1 per problem (greedy, pass@n of n samples) the exact unconditional interval of the "
              "paired difference with McNemar's exact p; over several seeds of a method, the mean of the seeds' changes "
              "with each seed's problems resampled on their own; or an analysis's value with its own interval "
              "(localisation: the exact interval of a top-k enrichment; drift: the permutation null's interval of a "
              "share-of-‖Δ‖² enrichment; a per-problem list: the bootstrap interval of its mean); plain numbers measured "
              "on one run's weights are exact. A test is reproduced when its interval excludes 0 (or clears the "
              "threshold) in the expected direction, contradicted when it does so in the opposite one, inconclusive at "
              "this scale otherwise; 'not down', 'b not less' and 'equal' are judged against the test's declared margin "
              "and contradicted only beyond it. A failed premise takes its runs out of the tests (training failed) or "
              "its claim out of the count (premise absent). A claim's verdict counts its tests except context and gated "
              f"ones: reproduced when every counted test is reproduced at {LEVEL:.0%}, contradicted when a counted test "
              f"is contradicted at the claim's family-wise level 1 − {1 - LEVEL:.2g} / m (Bonferroni over its m counted "
              f"tests, {FAMILY_RESAMPLES} bootstrap resamples), not run when none ran, inconclusive otherwise.")
    summary = f"{len(outcomes)} rows: " + ", ".join(f"{n} {v}" for v, n in counts.items())
    rows = []
    for o in outcomes:
        c = o.claim
        decide = c.decide + (f"<br>Cost here: {c.cost}" if c.cost else "") + (f"<br>Not run: {c.not_run}" if c.not_run else "")
        rows.append([f"**{c.id}** {c.claim}", f"`{c.command}`" if c.command else "", c.paper,
                     "<br>".join(describe(t) for t in o.tests) or "–", f"**{o.verdict}**", decide])
    return Section("Claims and verdicts", [method, summary + ".", Table(
        ["claim", "command", "paper reports", "measured here (95% interval)", "verdict", "what would decide it"], rows)])


def passk_matrix(report: dict) -> np.ndarray:
    """Problems × k: each problem's unbiased pass@k for k = 1 .. the smallest n."""
    problems = pooled_problems(report)
    k_max = min(int(p["n"]) for p in problems)
    return np.array([[pass_at_k_problem(int(p["n"]), int(p["c"]), k) for k in range(1, k_max + 1)] for p in problems])


def _series_label(file: str, data: Path) -> str:
    rel = Path(file).relative_to(data) if Path(file).is_relative_to(data) else Path(file)
    if rel.name in ("eval_before.json", "eval_after.json"):
        return f"{rel.parent} {rel.stem.removeprefix('eval_')}"
    return str(rel.parent if rel.name == "eval.json" else rel.with_suffix(""))


def _cell(mean: float, lo: float, hi: float) -> str:
    return f"{mean:.3f} [{lo:.3f}, {hi:.3f}]"


def passk_sections(outcomes: list[ClaimOutcome], data: Path, read, canvas: Canvas) -> list[Section]:
    """One figure per claim whose change / compare tests ran (claims reading the same files share one): pass@k
    for k = 1 .. n with the 95% bootstrap band over problems; a run's base dashed, the rest solid."""
    groups: dict[tuple, list[str]] = {}
    for o in outcomes:
        files: list[tuple[str, str]] = []
        for t, r in zip(o.claim.test, o.tests):
            if t.kind != "value" and r.verdict != NOT_RUN:
                files += [(str(f), t.task) for f in files_of(t, data) if (str(f), t.task) not in files]
        if files:
            groups.setdefault(tuple(files), []).append(o.claim.id)
    if not groups:
        return []
    sec = Section("Held-out pass@k with intervals", [
        f"pass@k for k = 1 .. n from each problem's n and c (unbiased estimator, averaged over problems); the band is the "
        f"{LEVEL:.0%} percentile interval of the mean over {BOOTSTRAP_RESAMPLES} bootstrap resamples of the problems. One "
        "colour per directory within a figure (the same colour as in earlier figures where it is free); a run's base (`eval_before.json`) dashed, trained or matched evaluations solid (a base "
        "measured identically by several runs is drawn once). The k axis is logarithmic (base 2). Re-evaluations "
        "without samples (n = 0: greedy only, e.g. the masked models of the sparsity analysis) appear in the tables only."])
    colours: dict[str, str] = {}
    for files, ids in groups.items():
        fig = canvas.figure(7.0, 4.2)
        ax = fig.add_subplot()
        figure_colours: dict[str, str] = {}
        rows: list[dict] = []
        drawn: dict[tuple, dict] = {}
        for file, task in files:
            report = task_report(read(Path(file)), Path(file), task)
            label = _series_label(file, data)
            pooled = pooled_problems(report)
            greedy = _greedy_cell([p["greedy"] for p in pooled if p["greedy"] is not None])
            if not all("n" in p for p in pooled):  # greedy only (a re-evaluation without samples)
                rows.append({"label": label, "file": shown(file), "problems": len(pooled), "n": 0, "pass": {},
                             "entropy": None, "greedy": greedy})
                continue
            before = file.endswith("eval_before.json")
            key = tuple((p["id"], p["n"], p["c"]) for p in pooled)
            if before and key in drawn:  # the same base, measured on the same problems with the same seed
                drawn[key]["label"] += f" = {label}"
                continue
            m = passk_matrix(report)
            mean, lo, hi = bootstrap_curve(m)
            ks = list(range(1, m.shape[1] + 1))
            owner = label.rsplit(" ", 1)[0] if file.endswith(("eval_before.json", "eval_after.json")) else label
            color = pick_colour(owner, figure_colours, colours)
            ax.plot(ks, mean, "--" if before else "-", marker="o", ms=3, color=color, label=label)
            ax.fill_between(ks, lo, hi, color=color, alpha=0.15, lw=0)
            entropy = [sum(p["entropy"]) / len(p["entropy"]) for p in pooled if p["entropy"]]
            row = {"label": label, "file": shown(file), "problems": len(pooled), "n": len(ks),
                   "pass": {k: _cell(mean[k - 1], lo[k - 1], hi[k - 1]) for k in ks},
                   "entropy": _cell(*bootstrap_interval(entropy)) if entropy else None, "greedy": greedy}
            rows.append(row)
            if before:
                drawn[key] = row
        k_top = max(r["n"] for r in rows)
        ticks: list[int] = []
        if k_top:  # at least one evaluation with samples: the figure (greedy-only ones are in the table)
            ticks = passk_axes(ax, k_top)
            ax.set_title(f"held-out pass@k ({', '.join(ids)})")
            ax.legend(fontsize=8)
            sec.blocks.append(canvas.save(fig, f"passk-{'-'.join(ids)}", f"held-out pass@k: {', '.join(ids)}",
                                          "dashed: base; bands: 95% bootstrap intervals over problems"))
        shown_ks = sorted((set(ticks) | {r["n"] for r in rows}) - {0})
        sec.blocks.append(Table(["evaluation", "file", "problems", "n"] + [f"pass@{k}" for k in shown_ks] +
                                ["entropy (nats)", "greedy"],
                                [[r["label"], r["file"], r["problems"], r["n"]] + [r["pass"].get(k) for k in shown_ks] +
                                 [r["entropy"], r["greedy"]] for r in rows],
                                f"{', '.join(ids)}: mean over problems [95% bootstrap interval]"))
    return [sec]


def _greedy_cell(values: list[float]) -> str | None:
    """Greedy accuracy over problems with its 95% interval: exact (Clopper-Pearson) when every problem is right or
    wrong, else the bootstrap's (a repeated problem whose rows disagree)."""
    if not values:
        return None
    if is_binary(values):
        lo, hi = exact_proportion_interval(int(sum(values)), len(values))
        return _cell(sum(values) / len(values), lo, hi)
    return _cell(*bootstrap_interval(values))


def _inputs(outcomes: list[ClaimOutcome], data: Path) -> tuple[list[Path], list[Path], list[Path]]:
    """The run directories, analysis directories and sweep directories the run tests name and that exist (a sweep
    is named through one of its points' files)."""
    runs: list[Path] = []
    analyses: list[Path] = []
    sweeps: list[Path] = []
    for o in outcomes:
        for t, r in zip(o.claim.test, o.tests):
            if r.verdict == NOT_RUN:
                continue
            for f in files_of(t, data):
                d = f.parent
                if (d / "run.json").exists() and (d / "metrics.jsonl").exists():
                    runs += [d] if d not in runs else []
                    if (d.parent / "sweep.json").exists() and d.parent not in sweeps:
                        sweeps.append(d.parent)
                elif f.stem in ANALYSIS_KINDS and f.exists():
                    analyses += [d] if d not in analyses else []
    return runs, analyses, sweeps


def common_match(src: Sources) -> str:
    """The quantity every run was configured to match (``run.match``), or updates when they differ."""
    found = {configured_match(r)[0] for r in src.runs}
    return found.pop() if len(found) == 1 else "updates"


# -- the page ----------------------------------------------------------------------------------------


def build_study(claims_path: str | Path, out: str | Path = "docs") -> StudyResult:
    """Read the claims file and the files its tests name; write ``<out>/REPRODUCTION.md``, its figures and
    ``<out>/study/reproduction.json``."""
    claims = load_claims(claims_path)
    data = Path(claims.study.data)
    reader = Reader()
    reader.note([claims_path])
    outcomes = evaluate_claims(claims, reader.json, data)
    out = Path(out)
    canvas = Canvas(out / "study")
    for old in canvas.dir.glob("*.png"):  # a re-run must not leave figures the new page does not show
        old.unlink()
    runs, analyses, sweeps = _inputs(outcomes, data)
    inputs = runs + analyses + sweeps
    src = gather([str(p) for p in inputs], {str(p.resolve()): str(p.relative_to(data)) if p.is_relative_to(data)
                                            else p.name for p in inputs}, reader) if inputs else Sources()
    src.analyses = {kind: [(label, Path(shown(d)), result) for label, d, result in entries]
                    for kind, entries in src.analyses.items()}
    match = common_match(src)
    sections = [intro_section(claims, src, data), verdict_section(outcomes)]
    sections += passk_sections(outcomes, data, reader.json, canvas)
    sections += [s for s in (probe_section(src, canvas, match), budget_section(src, match), cost_section(src)) if s is not None]
    sections += analysis_sections(src, canvas)
    sections += sweep_sections(src, canvas)  # evolm report's default window, band and reference
    files = list(dict.fromkeys(shown(f) for f in reader.files))
    note = (f"Generated by `evolm report --study {shown(claims_path)}` from the {len(files)} file{'s' if len(files) != 1 else ''} "
            "listed at the end "
            f"(committed copies of run directories without weights, and analysis outputs, under `{shown(data)}/`); "
            "regenerate it with that command instead of editing it. Every number below is read from those files or "
            "computed from them by the pure functions of `evolm.report.study`.")
    page = out / PAGE
    atomic_write_text(page, render_markdown(claims.study.title, sections, files, note, figures=FIGURES))
    figures = [canvas.path(b.name) for sec in sections for b in sec.blocks if isinstance(b, Figure)]
    record = {"claims_file": shown(claims_path), "data": shown(data), "files_read": files,
              "figures": [f"{FIGURES}/{f.name}" for f in figures],
              "claims": [{"id": o.claim.id, "claim": o.claim.claim, "verdict": o.verdict,
                          "tests": [dataclasses.asdict(t) | {"files": [shown(f) for f in t.files]} for t in o.tests]}
                         for o in outcomes]}
    atomic_write_json(out / "study" / "reproduction.json", record)
    return StudyResult(page, out / "study" / "reproduction.json", figures, outcomes)


__all__ = ["PAGE", "FIGURES", "StudyResult", "build_study", "shown"]
