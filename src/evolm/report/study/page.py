"""``evolm report --study``: the reproduction study's page, ``docs/REPRODUCTION.md``, and its linked pages, from
committed files.

    evolm report --study experiments/study/claims.toml --out docs

Writes ``<out>/REPRODUCTION.md`` (read in a minute: ``summary``), the pages it links under ``<out>/study/page/``,
their figures under ``<out>/study/figures/`` and every verdict's numbers in ``<out>/study/reproduction.json``:

1. ``REPRODUCTION.md``: the summary (the paper's claims counted apart from evolm's questions, pre-registration,
   bases, scale, failed runs, twins), one row per claim (verdict, scale, declared before or after its data) and a
   few lines per claim linking its page (``evolm.report.study.summary``).
2. ``study/page/<id>.md``, one per claim: what the paper reports, the command, its premises, one line per test (with
   its interval, margin, per-seed numbers and, for a contradicted one, its family-wise interval), a small-multiple
   pass@k figure (``figures``) and a table of the evaluations it reads, what would decide it and the cost; then
   whether its tests were declared before their data, each changed test beside its verdict as first declared.
3. ``study/page/preregistration.md``: the whole pre-registration record (``preregistration``).
4. ``study/page/runs.md``: the pending notes, "Runs that must not have lost their task" (the ``[[premise]]``
   entries), "Commutative twins in arithmetic" (``experiments/study/twins.py``'s record), the C4 ratio at matched
   budgets, "What was run", how the verdicts are reached, the run sections of ``evolm report`` on the runs the tests
   name (probe trajectories, budget, cost), and every file read.
5. ``study/page/analyses.md``: the analyses' own sections and the sweep sections for every sweep one of whose
   points a test names.

Design decisions:

- Generated only from files under the study's data directory plus the claims file, so anyone can regenerate
  the pages; each says so at the top, and the files read are listed on the runs page.
- Every ``*.md`` under ``study/page/`` and every figure is rewritten on each run and stale ones removed, so a page
  for a claim that no longer exists does not linger (tests compare the whole directory with a fresh build).
- Run and analysis directories are read through ``report.read.gather`` (runs only through the ``RunDir`` read
  side): a copied run directory without ``final/`` or checkpoints reads like any run.
- The pages hold no machine's absolute paths: paths under the current directory are shown relative to it.
- A claim or test that was not run still gets its row (verdict "not run" with the reason).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from evolm.document import Canvas, Figure, Section, Table, render_markdown
from evolm.report.read import ANALYSIS_KINDS, Reader, Sources, gather
from evolm.report.sections import analysis_sections, budget_section, configured_match, cost_section, probe_section
from evolm.report.study.claims import ClaimsFile, load_claims
from evolm.report.study.figures import claim_figure, passk_matrix
from evolm.report.study.preregistration import AFTER, BEFORE, CHANGED, RECORD, declared
from evolm.report.study.ratios import ratio_section
from evolm.report.study.measure import ClaimOutcome, PremiseOutcome, StudyOutcome, evaluate_study, files_of, task_report
from evolm.report.study.stats import (BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, FAMILY_RESAMPLES, LEVEL, bootstrap_curve,
                                      bootstrap_interval, exact_proportion_interval, is_binary, paired_binary_interval,
                                      pooled_problems, problem_values)
from evolm.report.study.verdicts import NOT_RUN, TRAINING_FAILED
from evolm.report.study.summary import (DECLARED_SECTION, PAGES, claim_brief, claim_title, summary_section,
                                        summary_table)
from evolm.report.study.words import describe, describe_premise, why
from evolm.report.sweeps import sweep_sections
from evolm.runs import atomic_write_json, atomic_write_text

PAGE = "REPRODUCTION.md"
"""The page's file name under ``--out``."""
FIGURES = "study/figures"
"""Where the figures go, under ``--out`` (and how the page links them)."""
SHOWN_KS = (1, 4, 16, 32)
"""The pass@k columns of a claim's evaluation table (those its evaluations reach)."""


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
    premises: list[PremiseOutcome] = dataclasses.field(default_factory=list)
    """Every run premise's outcome."""
    pages: list[Path] = dataclasses.field(default_factory=list)
    """The linked pages under ``<out>/study/page/``."""


def shown(path: str | Path) -> str:
    """``path`` relative to the current directory when it lies under it, else as given."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


# -- one section per claim ------------------------------------------------------------------------------------


def claim_section(o: ClaimOutcome, data: Path, read, canvas: Canvas) -> Section:
    c = o.claim
    blocks: list = [f"**Verdict: {o.verdict}** — {why(o)}.", f"**Scale**: {c.scale or 'not stated'}", f"**Paper**: {c.paper}"]
    if c.command:
        blocks.append(f"**Command**: `{c.command}`")
    if c.not_run:
        blocks.append(f"**Not run**: {c.not_run}")
    if o.premises:
        blocks.append("**Premises**:\n" + "\n".join(f"- {describe_premise(p)}" for p in o.premises))
    if o.tests:
        blocks.append("**Tests** (95% intervals; a gated or context test is shown, not counted):\n"
                      + "\n".join(f"- {describe(t)}" for t in o.tests))
    figure = claim_figure(o, data, read, canvas)
    if figure is not None:
        blocks.append(figure)
    table = evaluations_table(o, data, read)
    if table is not None:
        blocks.append(table)
    blocks.append(f"**What would decide it**: {c.decide}" + (f" **Cost here**: {c.cost}" if c.cost else ""))
    return Section("Verdict and tests", blocks)


def _cell(mean: float, lo: float, hi: float) -> str:
    return f"{mean:.3f} [{lo:.3f}, {hi:.3f}]"


def _greedy_cell(values: list[float]) -> str | None:
    """Greedy accuracy over problems with its 95% interval: exact (Clopper-Pearson) when every problem is right or
    wrong, else the bootstrap's (a repeated problem whose rows disagree)."""
    if not values:
        return None
    if is_binary(values):
        lo, hi = exact_proportion_interval(int(sum(values)), len(values))
        return _cell(sum(values) / len(values), lo, hi)
    return _cell(*bootstrap_interval(values))


def evaluations_table(o: ClaimOutcome, data: Path, read) -> Table | None:
    """One row per evaluation file a claim's change and compare tests read: distinct problems, samples, pass@k
    (bootstrap interval), entropy, greedy (exact interval), with repeated problems pooled."""
    files: list[tuple[Path, str]] = []
    for t, r in zip(o.claim.test, o.tests):
        if t.kind in ("change", "compare", "contrast") and r.verdict != NOT_RUN:
            files += [(f, t.task) for f in files_of(t, data) if (f, t.task) not in files]
    if not files:
        return None
    rows, ks = [], set()
    for f, task in files:
        report = task_report(read(f), f, task)
        pooled = pooled_problems(report)
        greedy = _greedy_cell([p["greedy"] for p in pooled if p["greedy"] is not None])
        row = {"file": shown(f), "problems": len(pooled), "n": 0, "pass": {}, "entropy": None, "greedy": greedy}
        if all("n" in p for p in pooled):
            m = passk_matrix(report)
            mean, lo, hi = bootstrap_curve(m)
            row["n"] = m.shape[1]
            row["pass"] = {k: _cell(mean[k - 1], lo[k - 1], hi[k - 1]) for k in SHOWN_KS if k <= m.shape[1]}
            ks |= set(row["pass"])
            entropy = [sum(p["entropy"]) / len(p["entropy"]) for p in pooled if p["entropy"]]
            row["entropy"] = _cell(*bootstrap_interval(entropy)) if entropy else None
        rows.append(row)
    ks = sorted(ks)
    return Table(["evaluation", "problems", "n"] + [f"pass@{k}" for k in ks] + ["entropy (nats)", "greedy"],
                 [[r["file"], r["problems"], r["n"]] + [r["pass"].get(k) for k in ks] + [r["entropy"], r["greedy"]]
                  for r in rows],
                 f"{o.claim.id}: mean over distinct problems [95% interval: bootstrap; greedy exact]")


# -- run premises, twins, what was run, method --------------------------------------------------------------------


def premises_section(study: StudyOutcome) -> Section | None:
    if not study.premises:
        return None
    failed = [p for p in study.premises if p.holds is False]
    held = [p for p in study.premises if p.holds]
    blocks = [f"Each trained run the claims about a method read must not have lost its task (its held-out pass@1 "
              f"fell): {len(held)} held, {len(failed)} failed; a failed run's files are left out of every test "
              f"(a test left without a run of one side reads \"{TRAINING_FAILED}\")."]
    if failed:
        blocks.append("\n".join(f"- {describe_premise(p)}" for p in failed))
    return Section("Runs that must not have lost their task", blocks)


def _change(before: dict, after: dict, ids: list[str]) -> tuple[float | None, str]:
    """The paired change after − before over ``ids`` and its cell (exact interval for a 0/1 metric)."""
    pairs = [(before[i], after[i]) for i in ids]
    if not pairs:
        return None, "–"
    if is_binary([x for x, _ in pairs]) and is_binary([y for _, y in pairs]):
        exact = paired_binary_interval(pairs)
        mean, lo, hi = exact["mean"], exact["lo"], exact["hi"]
    else:
        mean, lo, hi = bootstrap_interval([y - x for x, y in pairs])
    return mean, f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]"


@dataclass
class Twins:
    """The commutative-twin check, read from ``experiments/study/twins.py``'s record and the runs' evaluations."""

    rows: list[list]
    """Per run: held-out, twin in the train split, twin trained on, then pass@1 and pass@k changes (all, twin-free)."""
    gaps: dict[int, float]
    """Per digits (1, 2): the largest |pass@1 change on all − on the twin-free problems| over the runs."""
    drawn: dict[int, tuple[int, int, int]]
    """Per digits: the fewest and most held-out problems a run trained on the twin of, and the held-out count."""
    twin_free: dict[int, tuple[int, int]]
    """Per digits: the fewest and most twin-free held-out problems of a run."""


def twins_check(twins: dict, data: Path, read) -> Twins:
    rows, gaps, drawn, free = [], {}, {}, {}
    for run, rec in twins.get("runs", {}).items():
        before, after = data / run / "eval_before.json", data / run / "eval_after.json"
        if not (before.exists() and after.exists()):
            continue
        twinned = set(rec["twins_drawn"])
        digits = int(rec["task"].get("digits", 2))
        row = [run, len(rec["heldout"]), len(rec["twins_in_train_split"]), len(twinned)]
        reports = [task_report(read(f), f) for f in (before, after)]
        n = min(int(p["n"]) for r in reports for p in pooled_problems(r))
        for metric in ("pass@1", f"pass@{min(n, 16)}"):
            vb, va = (problem_values(r, metric) for r in reports)
            ids = [i for i in vb if vb[i] is not None and va.get(i) is not None]
            (m_all, all_cell), (m_free, free_cell) = _change(vb, va, ids), _change(vb, va, [i for i in ids if i not in twinned])
            row += [all_cell, free_cell] if metric == "pass@1" else [metric, all_cell, free_cell]
            if metric == "pass@1" and m_all is not None and m_free is not None:
                gaps[digits] = max(gaps.get(digits, 0.0), abs(m_all - m_free))
        lo, hi, size = drawn.get(digits, (len(twinned), len(twinned), len(rec["heldout"])))
        drawn[digits] = (min(lo, len(twinned)), max(hi, len(twinned)), size)
        count = len(rec["heldout"]) - len(twinned)
        flo, fhi = free.get(digits, (count, count))
        free[digits] = (min(flo, count), max(fhi, count))
        rows.append(row)
    return Twins(rows, gaps, drawn, free)


def twins_line(check: Twins) -> str:
    """One summary line from the twin check."""
    parts = []
    if 2 in check.drawn:
        lo, hi, size = check.drawn[2]
        parts.append(f"{lo}-{hi} of {size} held-out 2-digit sums per run had their twin (b+a for a+b) among the problems "
                     f"the run trained on; on the others pass@1 changes within {check.gaps[2]:.3f} of those on all problems")
    if 1 in check.drawn:
        lo, hi, size = check.drawn[1]
        flo, fhi = check.twin_free[1]
        parts.append(f"{lo}-{hi} of {size} 1-digit sums (Gemma, C3, C7), leaving {flo}-{fhi} twin-free problems (pass@1 "
                     f"changes within {check.gaps[1]:.3f}): those results are largely on twins of trained problems")
    return "; ".join(parts) + " (split_version = 1, what every committed run used)."


def twins_brief(check: Twins) -> str:
    """The twin check in one short line for the summary (the full line and table: the runs page)."""
    parts = [f"{'2-digit' if d == 2 else '1-digit'} sums within {check.gaps[d]:.3f}"
             + (f" ({check.twin_free[d][0]}-{check.twin_free[d][1]} twin-free problems)" if d == 1 else "")
             for d in (2, 1) if d in check.gaps]
    return ("on the held-out problems whose twin (b+a for a+b) a run did not train on, pass@1 changes as on all of them: "
            + ", ".join(parts) + f" ([check]({PAGES}/runs.md#commutative-twins-in-arithmetic)).")


def twins_section(twins: dict, check: Twins, data: Path) -> Section:
    text = ("The arithmetic task's committed split (`split_version = 1`) hashes a problem's expression text, so `47+85` "
            "and `85+47` may fall in different splits: a held-out problem's commutative twin may be a training problem. "
            "`experiments/study/twins.py` rebuilds, from each run's config and log, the training problems it drew "
            f"(`{shown(data / 'analyses/twins/twins.json')}`); per run, the held-out problems whose twin lies in the "
            "train split, those whose twin the run trained on, and the paired change (after − before; 95% interval: "
            "bootstrap, exact for a 0/1 metric) on all held-out problems and on those whose twin it did not train on. "
            "`split_version = 2` (`evolm.tasks.arithmetic`) keeps a+b and b+a in one split, for new runs; re-drawing "
            "would change every committed run's held-out problems, so the committed runs keep version 1 and this table "
            "is the check.")
    table = Table(["run", "held-out", "twin in train split", "twin trained on", "pass@1 change, all",
                   "pass@1 change, twin-free", "k", "pass@k change, all", "pass@k change, twin-free"], check.rows)
    return Section("Commutative twins in arithmetic", [text, f"**In short**: {twins_line(check)}", table])


def runs_table(src: Sources, data: Path) -> Table:
    """One row per run read: what it trained, on what, and what it spent (all from its files)."""
    rows = []
    for r in src.runs:
        cfg, last = r.config, (r.train[-1] if r.train else {})
        model, task = cfg.get("model") or {}, cfg.get("task") or {}
        params = ", ".join(f"{k}={v}" for k, v in (task.get("params") or {}).items())
        after = (r.eval_after or {}).get("summary") or {}
        distinct = len({str(p["id"]) for p in (r.eval_after or {}).get("problems") or []})
        held = f"{after.get('problems')} × {after.get('n')}" if after else None
        if after and distinct and distinct != after.get("problems"):
            held = f"{after.get('problems')} ({distinct} distinct) × {after.get('n')}"
        rows.append([r.label, r.method, model.get("spec"), model.get("dtype"), model.get("device"), model.get("threads"),
                     f"{task.get('name')} ({params})" if params else task.get("name"), r.info.get("status"), len(r.train),
                     last.get("seconds_total"), last.get("gen_sequences_total"), held])
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


def method_section() -> Section:
    return Section("How the verdicts are reached", [
        f"A change test pairs a run's `eval_after.json` with its `eval_before.json` problem by problem; a compare test "
        "two evaluation files on the same problems (b − a); a problem that appears on several rows of one evaluation "
        "is one problem (its rows pooled: n and c summed). pass@k is the unbiased estimator from each problem's n and "
        "c, entropy the mean of a problem's samples' token entropy (nats), greedy whether the greedy answer is correct. "
        f"Intervals: the {LEVEL:.0%} percentile bootstrap over problems ({BOOTSTRAP_RESAMPLES} resamples, seed "
        f"{BOOTSTRAP_SEED}); for a metric that is 0 or 1 per problem (greedy, and pass@n of n samples) the exact "
        "unconditional interval of the paired difference (the score test inverted, its p-value maximised over the "
        "discordance), with McNemar's exact p; a sum of such differences (a contrast of two gaps, a change against another "
        "change, several seeds pooled, every file 0 or 1 per problem) each difference's exact interval at 1 − α/m, "
        "summed (Bonferroni: coverage at least the level; a bootstrap is never taken of 0/1 data); several seeds of a "
        "method in one test otherwise: the mean of the seeds' changes, each seed's problems resampled on their own. "
        "Analyses: a top-k enrichment's exact interval, a share "
        "enrichment's permutation null, an exact number for one run's weights. A test is reproduced when its interval "
        "excludes 0 in the expected direction, contradicted when it excludes 0 in the other; 'not down', 'b not less' "
        "and 'equal' are judged against the test's declared margin (absolute, or a share of a named reference change), "
        "contradicted only beyond it, and [0, 0] never shows them. A premise that fails takes its runs' files out of the "
        "tests (training failed) or its claim out of the count (premise absent). A claim is reproduced when every "
        f"counted test is reproduced at {LEVEL:.0%}, contradicted when one is contradicted at the family-wise level "
        f"1 − {1 - LEVEL:.2g} / m (Bonferroni over its m counted tests, {FAMILY_RESAMPLES} bootstrap resamples), and "
        "inconclusive at this scale otherwise. Details: `evolm.report.study`."])


# -- inputs --------------------------------------------------------------------------------------------------


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


def grouped_files(files: list[str]) -> list[str]:
    """The files read, one line per directory: ``docs/study/c1c2-es/{config.toml, eval_after.json}`` (a directory
    with one file keeps its path; reproduction.json lists every file in full)."""
    by: dict[str, list[str]] = {}
    for f in files:
        parent, _, name = f.rpartition("/")
        by.setdefault(parent, []).append(name)
    return [(f"{d}/" if d else "") + (names[0] if len(names) == 1 else "{" + ", ".join(names) + "}")
            for d, names in by.items()]


# -- the page ----------------------------------------------------------------------------------------------


def pending_section(claims: ClaimsFile) -> Section | None:
    """The questions whose experiment is pending or whose files are stale (``[study] pending``), in full."""
    if not claims.study.pending:
        return None
    return Section("Pending", ["\n".join(f"- {p.strip()}" for p in claims.study.pending)])


def _up(page_dir: str, target: str) -> str:
    """``target`` (relative to ``--out``) as linked from a page in ``page_dir`` (relative to ``--out``)."""
    return os.path.relpath(target, page_dir)


def _write_page(out: Path, name: str, title: str, sections: list[Section], files: list[str] | None, note: str) -> Path:
    path = out / PAGES / name
    atomic_write_text(path, render_markdown(title, sections, files, note, figures=_up(PAGES, FIGURES)))
    return path


def build_study(claims_path: str | Path, out: str | Path = "docs") -> StudyResult:
    """Read the claims file and the files its tests name; write ``<out>/REPRODUCTION.md``, its linked pages under
    ``<out>/study/page/``, their figures and ``<out>/study/reproduction.json``."""
    claims = load_claims(claims_path)
    data = Path(claims.study.data)
    reader = Reader()
    reader.note([claims_path])
    study = evaluate_study(claims, reader.json, data)
    outcomes = study.claims
    out = Path(out)
    canvas = Canvas(out / "study")
    for old in canvas.dir.glob("*.png"):  # a re-run must not leave figures the new pages do not show
        old.unlink()
    (out / PAGES).mkdir(parents=True, exist_ok=True)
    for old in (out / PAGES).glob("*.md"):  # nor a page for a claim that no longer exists
        old.unlink()
    runs, analyses, sweeps = _inputs(outcomes, data)
    inputs = runs + analyses + sweeps
    src = gather([str(p) for p in inputs], {str(p.resolve()): str(p.relative_to(data)) if p.is_relative_to(data)
                                            else p.name for p in inputs}, reader) if inputs else Sources()
    src.analyses = {kind: [(label, Path(shown(d)), result) for label, d, result in entries]
                    for kind, entries in src.analyses.items()}
    twins_path = data / claims.study.twins if claims.study.twins else None
    twins = reader.json(twins_path) if twins_path is not None and twins_path.exists() else None
    check = twins_check(twins, data, reader.json) if twins is not None else None
    match = common_match(src)
    pre = declared(claims_path, claims, study, data, reader.json)
    command = f"evolm report --study {shown(claims_path)}"
    home = _up(PAGES, PAGE)
    sub_note = (f"Part of [the reproduction study]({home}); generated by `{command}` from committed files; regenerate it "
                "with that command instead of editing it.")
    claim_pages = {}
    for o in outcomes:
        own = [claim_section(o, data, reader.json, canvas)]
        if pre is not None:
            status = {"before": BEFORE, "after": AFTER, "changed": CHANGED}.get(pre.claims.get(o.claim.id, ""), "not recorded")
            own.append(Section(DECLARED_SECTION, [f"**Its tests**: {status} (the whole record: [pre-registration]"
                                                  f"(preregistration.md)).", *pre.blocks.get(o.claim.id, [])]))
        files = list(dict.fromkeys(shown(f) for r in o.tests + [p.outcome for p in o.premises] for f in r.files))
        claim_pages[o.claim.id] = own, grouped_files([shown(claims_path)] + files)
    context = [s for s in (pending_section(claims), premises_section(study),
                           twins_section(twins, check, data) if twins is not None else None,
                           ratio_section(data, reader.json), intro_section(claims, src, data), method_section())
               if s is not None]
    context += [s for s in (probe_section(src, canvas, match), budget_section(src, match), cost_section(src)) if s is not None]
    detail = analysis_sections(src, canvas) + sweep_sections(src, canvas)  # evolm report's default window, band and reference
    files = list(dict.fromkeys(shown(f) for f in reader.files))
    listed = grouped_files(files)
    pages = [_write_page(out, f"{o.claim.id}.md", claim_title(o), *claim_pages[o.claim.id], sub_note) for o in outcomes]
    if pre is not None:
        pages.append(_write_page(out, "preregistration.md", "Pre-registration", [pre.section],
                                 [shown(claims_path), shown(Path(claims_path).parent / RECORD)], sub_note))
    pages.append(_write_page(out, "runs.md", "What was run, and how the verdicts are reached", context, listed, sub_note))
    pages.append(_write_page(out, "analyses.md", "Analyses and sweeps", detail or [Section("None", ["No analysis read."])],
                             None, sub_note + f" Its files are listed on [what was run](runs.md#files-read)."))
    sections = [summary_section(claims, study, src, twins_brief(check) if check is not None else None, pre),
                summary_table(study, pre)] + [claim_brief(o) for o in outcomes]
    note = (f"Generated by `{command}` from the {len(files)} file{'s' if len(files) != 1 else ''} listed on "
            f"[what was run]({PAGES}/runs.md#files-read) (committed copies of run directories without weights, and "
            f"analysis outputs, under `{shown(data)}/`); regenerate it with that command instead of editing it.")
    page = out / PAGE
    atomic_write_text(page, render_markdown(claims.study.title, sections, None, note, figures=FIGURES))
    shown_sections = [s for own, _ in claim_pages.values() for s in own] + context + detail
    figures = [canvas.path(b.name) for sec in shown_sections for b in sec.blocks if isinstance(b, Figure)]
    record = {"claims_file": shown(claims_path), "data": shown(data), "files_read": files,
              "figures": [f"{FIGURES}/{f.name}" for f in figures],
              "premises": [{"id": p.premise.id, "holds": p.holds, "failure": p.premise.failure,
                            "test": dataclasses.asdict(p.outcome) | {"files": [shown(f) for f in p.outcome.files]}}
                           for p in study.premises],
              "claims": [{"id": o.claim.id, "claim": o.claim.claim, "verdict": o.verdict,
                          "premises": [{"id": p.premise.id, "holds": p.holds, "failure": p.premise.failure,
                                        "test": dataclasses.asdict(p.outcome) | {"files": [shown(f) for f in p.outcome.files]}}
                                       for p in o.premises],
                          "tests": [dataclasses.asdict(t) | {"files": [shown(f) for f in t.files]} for t in o.tests]}
                         for o in outcomes]}
    atomic_write_json(out / "study" / "reproduction.json", record)
    return StudyResult(page, out / "study" / "reproduction.json", figures, outcomes, study.premises, pages)


__all__ = ["PAGE", "PAGES", "FIGURES", "StudyResult", "build_study", "shown"]
