"""Evaluating the tests: read the files a test names, pair them problem by problem, and give its number, interval
and verdict; then each premise, each claim's family-wise pass and its verdict (rules: ``evolm.report.study``)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from evolm.errors import UserError
from evolm.report.study.claims import Claim, ClaimsFile, ClaimTest, Premise
from evolm.report.study.stats import (BOOTSTRAP_RESAMPLES, FAMILY_RESAMPLES, LEVEL, bootstrap_interval,
                                      combined_exact_interval, contrast_interval, count_interval, family_level, is_binary,
                                      null_interval, paired_binary_interval, problem_values, seed_interval,
                                      stratified_interval)
from evolm.report.study.testability import mark, noise_walk_fraction
from evolm.report.study.verdicts import (CONTRADICTED, GATED, INCONCLUSIVE, MARGIN_EXPECTS, NOT_RUN, REPRODUCED,
                                         UNTESTABLE, claim_verdict, interval_verdict, value_verdict)

Reader = Callable[[Path], Any]
"""``read(path)`` parses one JSON file (the page's reader also records it)."""
EXACT, COMBINED = "exact", "exact, combined"
"""The methods of a binary test's interval: one paired difference (``stats.paired_binary_interval``), or a sum of
several (a contrast, a change against a change, seeds pooled: ``stats.combined_exact_interval``)."""


@dataclass
class Outcome:
    """What one test (or premise) measured and its verdict."""

    claim: str
    """The claim's id (a run premise: ``premise``)."""
    kind: str
    """``change``, ``compare``, ``contrast`` or ``value``."""
    label: str
    """What was measured, in words (e.g. ``c1c2-grpo pass@1``)."""
    verdict: str
    """One of ``VERDICTS``: for a test a failed premise gated, the premise's failure (``training failed``,
    ``premise absent``), with what the interval said in ``measured``."""
    name: str = ""
    """The test's ``name`` (empty: none given)."""
    expect: str = ""
    """The expected direction (the test's ``expect``)."""
    estimate: float | None = None
    """change / compare: the mean per-problem difference (after − before, b − a; over several seeds the mean of the
    seeds' means); contrast: (b − a) − (d − c); value: the value, ratio or enrichment."""
    interval: list[float] | None = None
    """The estimate's 95% interval (bootstrap over problems, the exact interval of a binary metric, or an
    enrichment's exact interval); None for an exact number."""
    method: str = ""
    """How the interval was made: ``bootstrap``, ``stratified bootstrap`` (several seeds), ``exact`` (a binary
    metric: ``stats.paired_binary_interval``), ``exact, combined`` (a sum of binary differences:
    ``stats.combined_exact_interval``, the terms in ``exact_terms``), ``t over N seeds``, or empty (a value test;
    see its description)."""
    exact_terms: list[dict] = field(default_factory=list)
    """``exact, combined``: one dict per paired difference summed (``weight``, ``mean``, its interval ``lo``/``hi``
    at ``level_each``, discordant ``n01``/``n10``, ``problems``)."""
    null: list[float] | None = None
    """value: the permutation null's 95% interval of a share-of-‖Δ‖² enrichment."""
    a: float | None = None
    """change: the before mean; compare: a's mean (over the paired problems); contrast: the first gap, mean b − a."""
    b: float | None = None
    """change: the after mean; compare: b's mean; contrast: the second gap, mean d − c."""
    problems: int | None = None
    """Distinct problems paired (change, compare: over every seed; contrast: both sets together)."""
    p: float | None = None
    """value: the enrichment's p-value in the expected direction (one-sided for counts, two-sided for shares); an
    exact binary comparison: McNemar's exact two-sided p."""
    discordant: list[int] | None = None
    """An exact binary comparison: [problems only b got right, problems only a got right]."""
    margin: float | None = None
    """not_down, b_not_less, equal: the margin in the metric's units."""
    margin_note: str = ""
    """Where the margin came from (e.g. ``0.5 × |c1c2-grpo entropy −0.458| = 0.229``)."""
    threshold: float | None = None
    """value: the threshold."""
    detail: str = ""
    """Extra words: counts behind an enrichment, or why the test was not run."""
    files: list[str] = field(default_factory=list)
    """The files the test read or would read."""
    seeds: list[dict] = field(default_factory=list)
    """Several runs of a method (``seeds``, ``a_seeds``, ``b_seeds``): per run its label, mean(s), its own estimate
    and 95% interval, or why it was dropped (a failed premise); empty for a test of one run."""
    context: str = ""
    """The test's ``context``: why it is reported but not counted in the claim's verdict (empty: it counts)."""
    measured: str = ""
    """For a test a failed premise gated: the verdict its interval gave (not counted)."""
    gate: str = ""
    """The id of the premise whose failure gated this test (or dropped some of its seeds)."""
    expected_count: float | None = None
    """value, a top-k count: the count its null expects (k × the category's share, or the dtype null's mean)."""
    untestable: str = ""
    """Why the test's outcome is fixed by its definition (verdict ``untestable``; ``testability``)."""
    family_level: float | None = None
    """The claim's family-wise level (``family_level`` of its counted tests that ran); None for a test not counted,
    one that did not run, or a claim with one counted test."""
    family_interval: list[float] | None = None
    """The estimate's interval at ``family_level`` (for a share enrichment: the null's interval there); None for
    an exact number."""
    family_verdict: str = ""
    """The verdict at ``family_level`` (the 95% verdict when there is no family); a claim is contradicted only by
    a test contradicted at this level."""

    @property
    def counted(self) -> bool:
        """Whether the test counts in its claim's verdict (not context, not gated, run)."""
        return not self.context and self.verdict not in GATED and self.verdict not in (NOT_RUN, UNTESTABLE)


@dataclass
class PremiseOutcome:
    """A premise and whether it held."""

    premise: Premise
    """The premise as written."""
    outcome: Outcome
    """Its test's outcome."""
    holds: bool | None
    """True, False, or None when its test did not run (then it gates nothing)."""


@dataclass
class ClaimOutcome:
    """A claim, its premises' and tests' results and its verdict."""

    claim: Claim
    """The claim as written in the claims file."""
    verdict: str
    """``claim_verdict`` of the counted tests, or the failure of a premise gating the claim."""
    tests: list[Outcome]
    """One result per ``[[claim.test]]``."""
    premises: list[PremiseOutcome] = field(default_factory=list)
    """One per ``[[claim.premise]]``."""
    key: Outcome | None = None
    """The test (or failed premise) the page's verdict table shows."""


@dataclass
class StudyOutcome:
    """Every run premise's and every claim's outcome."""

    premises: list[PremiseOutcome]
    """One per ``[[premise]]``."""
    claims: list[ClaimOutcome]
    """One per ``[[claim]]``, in table order."""


@dataclass(frozen=True)
class Level:
    """The coverage an evaluation computes its intervals at, and the bootstrap resamples behind them."""

    level: float = LEVEL
    """Interval coverage (``LEVEL``, or a claim's ``family_level``)."""
    resamples: int = BOOTSTRAP_RESAMPLES
    """Bootstrap resamples (``FAMILY_RESAMPLES`` at a family-wise level, whose tails need more)."""
    binary: str = EXACT
    """A sum of binary differences (a contrast, a change against a change, seeds pooled): ``exact``
    (``stats.combined_exact_interval``) or ``bootstrap``, the percentile bootstrap it had until 2026-12-04 (issue 40,
    item 4), kept only to show what the bootstrap said (``preregistration``)."""


@dataclass(frozen=True)
class Gates:
    """What failed premises take out of a test: directories (a run premise's ``covers``) and claim premises."""

    dirs: dict = field(default_factory=dict)
    """Directory under the data directory -> the failed run premise covering it (``PremiseOutcome``)."""
    tests: dict = field(default_factory=dict)
    """A claim premise id (``gates = "tests"``) -> its ``PremiseOutcome`` when it failed."""

    def failure_of(self, premise_id: str) -> str:
        """The failure word of the failed run premise ``premise_id``."""
        return next(p.premise.failure for p in self.dirs.values() if p.premise.id == premise_id)

    def covering(self, path: Path, data_dir: Path) -> PremiseOutcome | None:
        """The failed run premise whose covered directory holds ``path``, if any. A run's ``eval_before.json``
        measures its base model, not what training made of it: never covered."""
        if path.name == "eval_before.json":
            return None
        for d, premise in self.dirs.items():
            if path == data_dir / d or (data_dir / d) in path.parents:
                return premise
        return None


# -- reading -------------------------------------------------------------------------------------------------


def task_report(data: dict, file: Path, task: str = "") -> dict:
    """One task's evaluation (with ``problems``) from an ``evolm eval`` output (``tasks``) or a run's
    ``eval_<label>.json`` (one task)."""
    if isinstance(data, dict) and "tasks" in data:
        tasks = data["tasks"] or {}
        if task and task not in tasks:
            raise UserError(f"{file} has no task '{task}' (it holds {', '.join(tasks) or 'none'}); fix the test's task")
        if not task and len(tasks) != 1:
            raise UserError(f"{file} holds {len(tasks)} tasks ({', '.join(tasks)}); name one with task = \"...\" in the test")
        return tasks[task or next(iter(tasks))]
    if not isinstance(data, dict) or "problems" not in data:
        raise UserError(f"{file} is not an evaluation with per-problem results (no problems); point the test at an "
                        "eval.json or a run's eval_before.json / eval_after.json")
    if task and data.get("task") != task:
        raise UserError(f"{file} measured task '{data.get('task')}', not '{task}'; fix the test's task")
    return data


def lookup(data: Any, path: str, where: str) -> Any:
    """The value at dotted ``path`` in ``data``; a key holding dots is matched whole (the longest key first),
    a list item by its index; ``tie_split`` of a top-k record without one is computed from it
    (``localisation.tie_split``). A missing key is a ``UserError`` naming ``where``, the key and what is there."""
    parts = path.split(".")
    node, i = data, 0
    while i < len(parts):
        for j in range(len(parts), i, -1):
            key = ".".join(parts[i:j])
            if isinstance(node, dict) and key in node:
                node, i = node[key], j
                break
            if isinstance(node, list) and j == i + 1 and re.fullmatch(r"-?\d+", key) and -len(node) <= int(key) < len(node):
                node, i = node[int(key)], j
                break
            if key == "tie_split" and isinstance(node, dict) and "coordinates" in node and "kth_abs_delta" in node:
                from evolm.analysis.localisation import tie_split  # a top-k record written before tie_split existed

                node, i = tie_split(node), j
                break
        else:
            at = ".".join(parts[:i]) or "the top level"
            there = (f"keys {', '.join(list(map(str, node))[:10])}" if isinstance(node, dict) else
                     f"a list of {len(node)}" if isinstance(node, list) else f"the value {node!r}")
            raise UserError(f"{where} has no '{parts[i]}' at {at} (it has {there}); fix the test's path in the claims file")
    return node


def _values(path: Path, metric: str, task: str, read: Reader) -> dict[str, float | None]:
    try:
        return problem_values(task_report(read(path), path, task), metric)
    except ValueError as e:  # pass@k beyond a problem's n, or no samples
        raise UserError(f"{path}: {e}") from None


def _same_problems(a: dict, b: dict, a_path: Path, b_path: Path) -> None:
    if set(a) != set(b):
        only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        raise UserError(f"{a_path} and {b_path} hold different problems ({len(only_a)} only in the first, "
                        f"{len(only_b)} only in the second, e.g. '{(only_a or only_b)[0]}'); a paired comparison "
                        "needs the same held-out problems (evolm eval --like RUN)")


def _minus(x: dict, base: dict) -> dict:
    """Per problem ``x − base`` (None where either is)."""
    return {i: None if x[i] is None or base[i] is None else x[i] - base[i] for i in x}


def _mean_of(files: list[dict]) -> dict:
    """Per problem the mean over several files' values (None where any is None)."""
    return {i: None if any(f[i] is None for f in files) else sum(f[i] for f in files) / len(files) for i in files[0]}


def _missing(result: Outcome, paths: list[Path]) -> bool:
    """Whether any of ``paths`` is missing; if so ``result`` (still "not run") says which."""
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        result.detail = f"{' and '.join(missing)} missing"
    return bool(missing)


def _shown(path: Path, data_dir: Path) -> str:
    return str(path.relative_to(data_dir)) if path.is_relative_to(data_dir) else str(path)


# -- margins -------------------------------------------------------------------------------------------------


def resolve_margin(test: ClaimTest, data_dir: Path, read: Reader) -> tuple[float | None, str, list[Path]]:
    """``(margin, where it came from, files read)`` of a test with a margin; ``(None, "", [])`` for one without. A
    reference whose files are missing gives ``(None, "... missing", files)``."""
    if test.margin is not None:
        return test.margin, f"{test.margin:g} (declared)", []
    ref = test.margin_of
    if ref is None:
        return None, "", []
    metric, task = ref.metric or test.metric, ref.task or test.task
    if ref.run:
        files, what = [data_dir / ref.run / "eval_before.json", data_dir / ref.run / "eval_after.json"], f"{ref.run} {metric} change"
    elif ref.a:
        files, what = [data_dir / ref.a, data_dir / ref.b], f"{metric} of {ref.b} − {ref.a}"
    else:
        files, what = [data_dir / ref.file], f"{ref.file} {metric}"
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        return None, f"margin reference {' and '.join(missing)} missing", files
    values = [_values(f, metric, task, read) for f in files]
    if len(values) == 2:
        _same_problems(values[0], values[1], files[0], files[1])
        diffs = [values[1][i] - values[0][i] for i in values[0] if values[0][i] is not None and values[1][i] is not None]
    else:
        diffs = [v for v in values[0].values() if v is not None]
    if not diffs:
        return None, f"no per-problem {metric} in the margin reference", files
    reference = sum(diffs) / len(diffs)
    margin = round(ref.fraction * abs(reference), 12)
    return margin, f"{ref.fraction:g} × |{what} {reference:+.3f}| = {margin:.3f}", files


# -- the paired tests (change, compare) ----------------------------------------------------------------------


def files_of(test: ClaimTest, data_dir: Path) -> list[Path]:
    """The evaluation or analysis files a test reads (seeds and bases included; not its margin's reference)."""
    if test.kind == "change":
        return [data_dir / r / f for r in [test.run] + test.seeds for f in ("eval_before.json", "eval_after.json")]
    if test.kind == "compare":
        return [data_dir / f for f in [test.a, test.b, test.a_base, test.b_base] + test.a_seeds + test.b_seeds
                + [f for pair in test.pairs for f in pair] if f]
    if test.kind == "contrast":
        return [data_dir / f for f in (test.a, test.b, test.c, test.d)]
    second = test.over or test.minus
    return [data_dir / test.file] + ([data_dir / second.file] if second else [])


def label_of(test: ClaimTest) -> str:
    """What a test measures, in a few words (e.g. ``c1c2-grpo pass@1``, ``pass@16 of b − a``)."""
    if test.kind == "change":
        runs = [test.run] + test.seeds
        return f"{' + '.join(runs)} {test.metric}" if len(runs) > 1 else f"{test.run} {test.metric}"
    if test.kind == "compare" and test.a_base:
        return f"{test.metric} of ({test.b} − {test.b_base}) − ({test.a} − {test.a_base})"
    if test.kind == "compare":
        side = lambda first, more: first if not more else "mean(" + ", ".join([first] + more) + ")"  # noqa: E731
        return f"{test.metric} of {side(test.b, test.b_seeds)} − {side(test.a, test.a_seeds)}"
    if test.kind == "contrast":
        return f"{test.metric} of ({test.b} − {test.a}) − ({test.d} − {test.c})"
    where = "/".join(Path(test.file).parts[-2:])  # e.g. c3-at-160/diversity.json: which analysis, when several
    return f"{where}: " + test.path + (f" / {test.over.path}" if test.over else f" − {test.minus.path}" if test.minus else "")


def _drop(paths: list[Path], data_dir: Path, gates: Gates) -> tuple[list[Path], list[str], str]:
    """``paths`` without those a failed run premise covers, the words for each dropped one, and the premise id."""
    kept, dropped, gate = [], [], ""
    for p in paths:
        covering = gates.covering(p, data_dir)
        if covering is None:
            kept.append(p)
        else:
            dropped.append(f"{_shown(p, data_dir)}: {covering.premise.failure} ({covering.premise.id})")
            gate = gate or covering.premise.id
    return kept, dropped, gate


def _paired(claim: str, test: ClaimTest, label: str, data_dir: Path, read: Reader, gates: Gates,
            at: Level = Level()) -> Outcome:
    """change (one run, or several seeds each on its own problems) and compare (b − a per problem; with
    ``a_seeds`` / ``b_seeds`` each side the per-problem mean over its files; with ``a_base`` / ``b_base``,
    (b − b_base) − (a − a_base))."""
    paths = files_of(test, data_dir)
    result = Outcome(claim, test.kind, label, NOT_RUN, name=test.name, expect=test.expect,
                     files=[str(p) for p in paths])
    if _missing(result, paths):
        return result
    margin, result.margin_note, margin_files = resolve_margin(test, data_dir, read)
    if test.expect in MARGIN_EXPECTS and margin is None:
        result.detail = result.margin_note
        result.files += [str(f) for f in margin_files]
        return result
    result.margin = margin
    result.files += [str(f) for f in margin_files]
    failure = ""
    if test.kind == "change":
        names = [test.run] + test.seeds
        units = [(n, [data_dir / n / "eval_before.json", data_dir / n / "eval_after.json"]) for n in names]
        drops = {n: _drop(u, data_dir, gates) for n, u in units}
        kept = [(n, u) for n, u in units if not drops[n][1]]
        gone = [n for n, _ in units if drops[n][1]]
        _change_numbers(result, test, kept or units, read, at)  # every run dropped: numbers shown, verdict gated
        if len(units) > 1:
            result.seeds = _seed_rows(test, units, read)
            for row in result.seeds:
                if drops[row["label"]][1]:
                    row["dropped"] = drops[row["label"]][1][0].split(": ", 1)[1]
        if gone:
            result.gate = drops[gone[0]][2]
            failure = "" if kept else gates.failure_of(result.gate)
    elif test.pairs:
        failure = _seed_pairs(result, test, data_dir, read, gates, at)
    else:
        a_files, b_files = [data_dir / f for f in [test.a] + test.a_seeds], [data_dir / f for f in [test.b] + test.b_seeds]
        bases = [data_dir / f for f in (test.a_base, test.b_base) if f]
        (a_kept, a_gone, a_gate), (b_kept, b_gone, b_gate), (_, base_gone, base_gate) = (
            _drop(files, data_dir, gates) for files in (a_files, b_files, bases))
        whole = not a_kept or not b_kept or bool(base_gone)
        _compare_numbers(result, test, a_files if whole else a_kept, b_files if whole else b_kept, bases, read, at)
        if len(a_files) + len(b_files) > 2:
            gone = {d.split(": ", 1)[0]: d.split(": ", 1)[1] for d in a_gone + b_gone}
            sides = ({"a"} if len(a_files) > 1 else set()) | ({"b"} if len(b_files) > 1 else set())
            result.seeds = [row for row in _compare_seed_rows(test, a_files, b_files, read, data_dir)
                            if row["side"] in sides]
            for row in result.seeds:
                row["dropped"] = gone.get(row["label"], "")
        result.gate = a_gate or b_gate or base_gate
        if whole and result.gate:
            failure = gates.failure_of(result.gate)
    if result.estimate is None:
        return result
    result.verdict = interval_verdict(test.expect, *result.interval, margin or 0.0)
    if failure:  # every run of a side lost its task: not evidence either way
        result.measured, result.verdict = result.verdict, failure
    return result


def _change_numbers(result: Outcome, test: ClaimTest, units: list[tuple[str, list[Path]]], read: Reader,
                    at: Level) -> None:
    """A change's estimate over one run or several seeds (grouped by problem set, each group resampled on its own)."""
    groups: dict[frozenset, list[dict]] = {}
    for _, (before, after) in units:
        vb, va = _values(before, test.metric, test.task, read), _values(after, test.metric, test.task, read)
        _same_problems(vb, va, before, after)
        groups.setdefault(frozenset(vb), []).append({i: (vb[i], va[i]) for i in vb})
    strata, problems = [], 0
    for runs in groups.values():  # runs on the same problems: per problem the mean of their changes
        ids = [i for i in runs[0] if all(r[i][0] is not None and r[i][1] is not None for r in runs)]
        if ids:
            strata.append((len(runs), [sum(r[i][1] - r[i][0] for r in runs) / len(runs) for i in ids]))
            problems += len(ids)
    if not strata:
        result.detail = f"no per-problem {test.metric} in {' or '.join(result.files)}"
        return
    if test.unit == "seed":  # the seed is the unit: t over the runs' mean changes
        means = [sum(y - x for x, y in _pairs(b, a, test, read)) / max(1, len(_pairs(b, a, test, read)))
                 for _, (b, a) in units]
        if len(means) < 2:
            result.detail = "one seed left: an interval over seeds needs two"
            return
        mean, lo, hi = seed_interval(means, at.level)
        result.estimate, result.interval, result.method = mean, [lo, hi], f"t over {len(means)} seeds"
        result.problems = problems
        result.a, result.b = _run_means(units, test, read)
        return
    total = sum(n for n, _ in strata)
    weights = [(n / total, d) for n, d in strata]
    runs = [_pairs(b, a, test, read) for _, (b, a) in units]
    if len(units) == 1 and _binary(runs):
        _exact(result, runs[0], at)
    elif _binary(runs) and at.binary == EXACT:  # the mean of the runs' changes: the same estimate as the strata's
        _combined(result, [(1.0 / len(runs), p) for p in runs], at)
    else:
        mean, lo, hi = stratified_interval(weights, at.resamples, level=at.level)
        result.estimate, result.interval = mean, [lo, hi]
        result.method = "bootstrap" if len(units) == 1 else "stratified bootstrap"
    result.problems = problems
    result.a, result.b = _run_means(units, test, read)


def _seed_pairs(result: Outcome, test: ClaimTest, data_dir: Path, read: Reader, gates: Gates, at: Level) -> str:
    """compare with ``pairs``: b − a paired by problem within each seed's pair, the interval Student's t over the
    seeds' mean differences; a pair either side of which a failed run premise covers is left out (shown in its
    row). Returns the failure verdict when fewer than two seeds are left."""
    rows, means, ps, gate = [], [], 0, ""
    for a, b in [(test.a, test.b)] + [tuple(p) for p in test.pairs]:
        pa, pb = data_dir / a, data_dir / b
        va, vb = _values(pa, test.metric, test.task, read), _values(pb, test.metric, test.task, read)
        _same_problems(va, vb, pa, pb)
        pairs = [(va[i], vb[i]) for i in va if va[i] is not None and vb[i] is not None]
        mean, lo, hi = _own_interval(pairs)
        _, dropped, g = _drop([pa, pb], data_dir, gates)
        rows.append({"label": f"{b} − {a}", "a": sum(x for x, _ in pairs) / len(pairs),
                     "b": sum(y for _, y in pairs) / len(pairs), "estimate": mean, "interval": [lo, hi],
                     "problems": len(pairs), "dropped": dropped[0].split(": ", 1)[1] if dropped else ""})
        gate = gate or g
        if not dropped:
            means.append(mean)
            ps += len(pairs)
    result.seeds, result.gate = rows, gate
    if len(means) < 2:
        result.detail = "fewer than two seeds left: an interval over seeds needs two"
        return gates.failure_of(gate) if gate else ""
    mean, lo, hi = seed_interval(means, at.level)
    result.estimate, result.interval, result.method = mean, [lo, hi], f"t over {len(means)} seeds"
    kept = [r for r in rows if not r["dropped"]]
    result.problems = ps
    result.a, result.b = sum(r["a"] for r in kept) / len(kept), sum(r["b"] for r in kept) / len(kept)
    return ""


def _pairs(before: Path, after: Path, test: ClaimTest, read: Reader) -> list[tuple[float, float]]:
    vb, va = _values(before, test.metric, test.task, read), _values(after, test.metric, test.task, read)
    return [(vb[i], va[i]) for i in vb if vb[i] is not None and va[i] is not None]


def _run_means(units, test: ClaimTest, read: Reader) -> tuple[float, float]:
    """The mean over runs of each run's mean before and after (what the estimate is the difference of)."""
    means = []
    for _, (before, after) in units:
        pairs = _pairs(before, after, test, read)
        means.append((sum(x for x, _ in pairs) / len(pairs), sum(y for _, y in pairs) / len(pairs)))
    return sum(m[0] for m in means) / len(means), sum(m[1] for m in means) / len(means)


def _seed_rows(test: ClaimTest, units, read: Reader) -> list[dict]:
    rows = []
    for name, (before, after) in units:
        pairs = _pairs(before, after, test, read)
        mean, lo, hi = _own_interval(pairs)
        rows.append({"label": name, "a": sum(x for x, _ in pairs) / len(pairs), "b": sum(y for _, y in pairs) / len(pairs),
                     "estimate": mean, "interval": [lo, hi], "problems": len(pairs), "dropped": ""})
    return rows


def _compare_numbers(result: Outcome, test: ClaimTest, a_files: list[Path], b_files: list[Path], bases: list[Path],
                     read: Reader, at: Level) -> None:
    a_vals = [_values(p, test.metric, test.task, read) for p in a_files]
    b_vals = [_values(p, test.metric, test.task, read) for p in b_files]
    for p, v in zip(a_files[1:] + b_files, a_vals[1:] + b_vals):
        _same_problems(a_vals[0], v, a_files[0], p)
    va, vb = _mean_of(a_vals), _mean_of(b_vals)
    if bases:  # each side's change from its own base, on the same problems
        a_base, b_base = (_values(p, test.metric, test.task, read) for p in bases)
        _same_problems(va, a_base, a_files[0], bases[0])
        _same_problems(vb, b_base, b_files[0], bases[1])
        va, vb = _minus(va, a_base), _minus(vb, b_base)
    pairs = [(va[i], vb[i]) for i in va if va[i] is not None and vb[i] is not None]
    if not pairs:
        result.detail = f"no per-problem {test.metric} in {' or '.join(result.files)}"
        return
    base_vals = [_values(p, test.metric, test.task, read) for p in bases]
    if len(a_files) == len(b_files) == 1 and not bases and _binary([pairs]):
        _exact(result, pairs, at)
    elif _binary([[(x, x) for x in v.values()] for v in a_vals + b_vals + base_vals]) and at.binary == EXACT:
        if bases:  # (b − b_base) − (a − a_base): two paired differences on the same problems
            terms = [(1.0, _paired_values(base_vals[1], b_vals[0])), (-1.0, _paired_values(base_vals[0], a_vals[0]))]
        else:  # mean(b files) − mean(a files) = the mean of every (a file, b file) pair's difference
            w = 1.0 / (len(a_vals) * len(b_vals))
            terms = [(w, _paired_values(x, y)) for x in a_vals for y in b_vals]
        _combined(result, terms, at)
    else:
        mean, lo, hi = bootstrap_interval([y - x for x, y in pairs], at.resamples, level=at.level)
        result.estimate, result.interval, result.method = mean, [lo, hi], "bootstrap"
    result.problems = len(pairs)
    result.a, result.b = sum(x for x, _ in pairs) / len(pairs), sum(y for _, y in pairs) / len(pairs)


def _compare_seed_rows(test: ClaimTest, a_files: list[Path], b_files: list[Path], read: Reader, data_dir: Path) -> list[dict]:
    """Per file of a compare with seeds: its mean, and its own difference from the other side's mean."""
    a_vals = [_values(p, test.metric, test.task, read) for p in a_files]
    b_vals = [_values(p, test.metric, test.task, read) for p in b_files]
    va, vb = _mean_of(a_vals), _mean_of(b_vals)
    rows = []
    for side, files, vals, other in (("a", a_files, a_vals, vb), ("b", b_files, b_vals, va)):
        for p, v in zip(files, vals):
            ids = [i for i in v if v[i] is not None and other[i] is not None]
            pairs = [(v[i], other[i]) if side == "a" else (other[i], v[i]) for i in ids]
            mean, lo, hi = _own_interval(pairs)
            rows.append({"label": _shown(p, data_dir), "side": side, "mean": sum(v[i] for i in ids) / len(ids),
                         "estimate": mean, "interval": [lo, hi], "problems": len(ids), "dropped": ""})
    return rows


def _own_interval(pairs: list[tuple[float, float]]) -> tuple[float, float, float]:
    """One seed's own (mean, lo, hi) of b − a at 95%: exact for a binary metric, else the bootstrap."""
    if is_binary([x for x, _ in pairs]) and is_binary([y for _, y in pairs]):
        exact = paired_binary_interval(pairs)
        return exact["mean"], exact["lo"], exact["hi"]
    return bootstrap_interval([y - x for x, y in pairs])


def _binary(groups: list[list[tuple[float, float]]]) -> bool:
    """Whether every value of every group of (a, b) pairs is 0 or 1 (and no group is empty)."""
    return bool(groups) and all(is_binary([x for x, _ in g]) and is_binary([y for _, y in g]) for g in groups)


def _paired_values(a: dict, b: dict) -> list[tuple[float, float]]:
    """(a, b) per problem of two files' values on the same problems, where both have one."""
    return [(a[i], b[i]) for i in a if a[i] is not None and b.get(i) is not None]


def _exact(result: Outcome, pairs: list[tuple[float, float]], at: Level) -> None:
    exact = paired_binary_interval(pairs, at.level)
    result.estimate, result.interval, result.method = exact["mean"], [exact["lo"], exact["hi"]], EXACT
    result.p, result.discordant = exact["p"], [exact["n01"], exact["n10"]]


def _combined(result: Outcome, terms: list[tuple[float, list[tuple[float, float]]]], at: Level) -> None:
    c = combined_exact_interval(terms, at.level)
    result.estimate, result.interval, result.method = c["mean"], [c["lo"], c["hi"]], COMBINED
    result.exact_terms = [dict(t, level_each=c["level_each"]) for t in c["terms"]]


# -- contrast and value tests ----------------------------------------------------------------------------------


def _contrast(claim: str, test: ClaimTest, label: str, paths: list[Path], read: Reader, at: Level = Level()) -> Outcome:
    """contrast: (b − a) per problem of the first set against (d − c) per problem of the second."""
    result = Outcome(claim, test.kind, label, NOT_RUN, name=test.name, expect=test.expect, files=[str(p) for p in paths])
    if _missing(result, paths):
        return result
    sets = []
    for x_path, y_path in (paths[:2], paths[2:]):
        vx, vy = (_values(p, test.metric, "", read) for p in (x_path, y_path))
        _same_problems(vx, vy, x_path, y_path)
        sets.append(_paired_values(vx, vy))
    gaps = [[y - x for x, y in pairs] for pairs in sets]
    if not gaps[0] or not gaps[1]:
        result.detail = f"no per-problem {test.metric} in {' or '.join(map(str, paths))}"
        return result
    if _binary(sets) and at.binary == EXACT:  # each gap's exact interval, combined (Bonferroni)
        _combined(result, [(1.0, sets[0]), (-1.0, sets[1])], at)
        mean, (lo, hi) = result.estimate, result.interval
    else:
        mean, lo, hi = contrast_interval(gaps[0], gaps[1], at.resamples, level=at.level)
        result.method = "bootstrap"
    result.verdict = interval_verdict(test.expect, lo, hi)
    result.estimate, result.interval = mean, [lo, hi]
    result.a, result.b = (sum(g) / len(g) for g in gaps)
    result.problems = len(gaps[0]) + len(gaps[1])
    result.detail = f"{len(gaps[0])} + {len(gaps[1])} problems"
    return result


def _number(node: Any, where: str) -> float | None:
    if node is None:
        return None
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        raise UserError(f"{where} is not a number; point the test's path at a number (e.g. models.es.relative_distance) "
                        "or at an enrichment record (e.g. models.es.100.enrichment.by_category.norm)")
    return float(node)


def _per_problem(node: Any, where: str) -> list[float]:
    if not node or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in node):
        raise UserError(f"{where} is not a list of numbers (one per problem); point the test's path at one, "
                        "e.g. population_per_prompt")
    return [float(x) for x in node]


def _list_value(result: Outcome, test: ClaimTest, node: list, where: str, read: Reader, second: Path | None,
                at: Level) -> Outcome:
    """A per-problem list's mean (or the mean of its paired differences with ``minus``) with its bootstrap interval."""
    if test.unit == "seed":
        return _seed_value(result, test, node, where, at)
    values = _per_problem(node, where)
    if second is not None:
        other_where = f"{second}: {test.minus.path}"
        other = _per_problem(lookup(read(second), test.minus.path, str(second)), other_where)
        if len(other) != len(values):
            raise UserError(f"{where} has {len(values)} problems but {other_where} has {len(other)}; minus needs "
                            "the same problems in the same order")
        result.a, result.b = sum(values) / len(values), sum(other) / len(other)
        values = [x - y for x, y in zip(values, other)]
    mean, lo, hi = bootstrap_interval(values, at.resamples, level=at.level)
    result.estimate, result.interval, result.problems, result.method = mean, [lo, hi], len(values), "bootstrap"
    result.verdict = value_verdict(test.expect, mean, test.threshold, result.interval)
    return result


def _seed_value(result: Outcome, test: ClaimTest, node: list, where: str, at: Level) -> Outcome:
    """A list with one number per seed (e.g. a walk's drift ratio at seeds 0, 1, 2): its mean with Student's t
    interval over the seeds (``stats.seed_interval``), so the verdict is as uncertain as the seeds disagree. Fewer
    than two seeds give no interval: inconclusive, saying how many there are."""
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in node):
        raise UserError(f"{where} is not a list of numbers (one per seed); point the test's path at one")
    values = [float(x) for x in node]
    result.method = f"t over {len(values)} seeds"
    if not values:
        result.detail = f"no seed has finished ({where} is empty)"
        return result
    if len(values) < 2:
        result.estimate = values[0] if values else None
        result.verdict, result.detail = INCONCLUSIVE, f"{len(values)} seed(s) so far; an interval over seeds needs two or more"
        return result
    mean, lo, hi = seed_interval(values, level=at.level)
    result.estimate, result.interval = mean, [lo, hi]
    result.detail = f"{len(values)} seeds: " + ", ".join(f"{x:.4g}" for x in values)
    result.verdict = value_verdict(test.expect, mean, test.threshold, result.interval)
    return result


def _dtype_null_value(result: Outcome, test: ClaimTest, node: dict) -> Outcome:
    """A category's top-k count against ``analyze magnitude``'s dtype-matched null (the same number of ulp-steps
    per coordinate, shuffled within the dtype's spacing): the estimate is observed / the null's mean, and the null's
    own 95% interval (its shuffles' 2.5-97.5th percentiles, in counts) is put on the same scale, so the value must
    clear the threshold and lie outside the null to count either way. The shuffles' interval is empirical: it is
    not widened at the family-wise level."""
    stale = node.get("null") != "within-spacing" or (node.get("permutations") or 0) < 1000
    mean = node.get("expected", node["null_mean"])
    result.expected_count = mean
    if stale:  # written by the old null (step counts shuffled across spacings, 20 shuffles): not evidence
        result.verdict = NOT_RUN
        result.detail = ("stale: computed with the old dtype null (step counts shuffled across spacings; "
                         "miscalibrated, issue 40); recompute with evolm analyze magnitude")
        result.expected_count = None
        return result
    if not mean:
        result.verdict = INCONCLUSIVE
        result.detail = f"{node.get('observed'):.3g} observed; the null puts none there, so there is no ratio"
        return result
    result.estimate = node["observed"] / mean
    result.null = [x / mean for x in node["null_interval"]]
    result.p = node.get("p_enriched" if test.expect == ">" else "p_depleted")
    result.detail = f"{node['observed']:.3g} observed, {mean:.3g} under the dtype-matched null"
    result.verdict = value_verdict(test.expect, result.estimate, test.threshold, None, result.null)
    return result


def _value(claim: str, test: ClaimTest, label: str, files: list[Path], read: Reader, at: Level = Level()) -> Outcome:
    path, over = files[0], (files[1] if test.over or test.minus else None)
    result = Outcome(claim, test.kind, label, NOT_RUN, name=test.name, expect=test.expect, threshold=test.threshold,
                     files=[str(path)] + ([str(over)] if over else []))
    if _missing(result, [path] + ([over] if over else [])):
        return result
    node = lookup(read(path), test.path, str(path))
    where = f"{path}: {test.path}"
    if isinstance(node, list):
        return _list_value(result, test, node, where, read, over, at)
    if test.minus is not None:
        raise UserError(f"{where} is not a per-problem list; minus subtracts lists: drop minus or point path at a list")
    if isinstance(node, dict) and "null_interval" in node and "null_mean" in node:  # analyze magnitude's dtype-matched null
        if over is not None:
            raise UserError(f"{where} is a dtype-null record; over divides numbers only: drop over or point path at a number")
        return _dtype_null_value(result, test, node)
    if isinstance(node, dict) and ("enrichment_interval" in node or "null_enrichment_interval" in node):
        if over is not None:
            raise UserError(f"{where} is an enrichment record; over divides numbers only: drop over or point path at a number")
        result.estimate = node.get("enrichment")
        wider = at.level != node.get("confidence", LEVEL)
        if "enrichment_interval" in node:  # a top-k count against Binomial(k, share): its own exact interval
            result.expected_count = node.get("expected")
            result.interval = count_interval(node, at.level) if wider else node.get("enrichment_interval")
            result.p = node.get("p_enriched" if test.expect == ">" else "p_depleted")
            tie = " (ties split evenly)" if "rounded" in node else ""
            result.detail = f"{node.get('observed'):.3g} observed{tie}, {node.get('expected'):.3g} expected"
        else:  # a share of ‖Δ‖² against the permutation null
            result.null = null_interval(node, at.level) if wider else node.get("null_enrichment_interval")
            result.p = node.get("p_two_sided")
            share = node.get("share")
            result.detail = (f"share of ‖Δ‖² {share:.3g} vs parameter share {node.get('parameter_share'):.3g}"
                             if share is not None else "nothing moved")
        if result.estimate is None or (result.interval is None and result.null is None):
            result.verdict, result.detail = INCONCLUSIVE, result.detail + "; no enrichment (the category holds no trained coordinate, or nothing moved)"
            return result
        result.verdict = value_verdict(test.expect, result.estimate, test.threshold, result.interval, result.null)
        return result
    value = _number(node, where)
    if over is not None:
        denominator = _number(lookup(read(over), test.over.path, str(over)), f"{over}: {test.over.path}")
        if value is None or not denominator:
            result.verdict, result.detail = INCONCLUSIVE, f"{test.over.path} is {denominator}: no ratio"
            return result
        result.a, result.b = value, denominator
        value = value / denominator
    if value is None:
        result.verdict, result.detail = INCONCLUSIVE, f"{test.path} is null in {path}"
        return result
    result.estimate = value
    result.verdict = value_verdict(test.expect, value, test.threshold)
    if test.noise_walk is not None:
        w = test.noise_walk
        result.detail = f"a noise walk of {w.updates} updates puts {noise_walk_fraction(w.tau_rms, w.updates):.3f} below τ"
    return result


# -- tests, premises, claims ---------------------------------------------------------------------------------


def evaluate_test(claim: Claim | str, test: ClaimTest, data_dir: Path, read: Reader, at: Level = Level(),
                  gates: Gates = Gates()) -> Outcome:
    """One test's outcome with its intervals at ``at`` (default 95%); ``read(path)`` parses a JSON file (and may
    record it); ``gates`` are the failed premises (their covered directories drop seeds or gate the test)."""
    cid, not_run = (claim.id, claim.not_run) if isinstance(claim, Claim) else (claim, "")
    label = label_of(test)
    if not_run or test.not_run:
        result = Outcome(cid, test.kind, label, NOT_RUN, name=test.name, expect=test.expect, threshold=test.threshold,
                         detail=test.not_run or not_run, files=[str(f) for f in files_of(test, data_dir)])
    elif test.kind == "value":
        result = _value(cid, test, label, files_of(test, data_dir), read, at)
    elif test.kind == "contrast":
        result = _contrast(cid, test, label, files_of(test, data_dir), read, at)
    else:
        result = _paired(cid, test, label, data_dir, read, gates, at)
    result.context = test.context
    for r in test.requires:  # a claim premise this test needs
        failed = gates.tests.get(r)
        if failed is not None and result.verdict != NOT_RUN:
            result.measured, result.verdict, result.gate = result.verdict, failed.premise.failure, r
    return result


def evaluate_premise(owner: str, premise: Premise, data_dir: Path, read: Reader, binary: str = EXACT) -> PremiseOutcome:
    """A premise's test at 95% and whether it holds (``holds_when``); None when it did not run. ``binary``:
    ``Level.binary``."""
    outcome = evaluate_test(owner, premise, data_dir, read, Level(binary=binary))
    outcome.name = outcome.name or premise.id
    if outcome.verdict == NOT_RUN:
        return PremiseOutcome(premise, outcome, None)
    holds = (outcome.verdict == REPRODUCED if premise.holds_when == "reproduced" else outcome.verdict != CONTRADICTED)
    return PremiseOutcome(premise, outcome, holds)


def evaluate_claim(claim: Claim, data_dir: Path, read: Reader, run_gates: dict | None = None,
                   binary: str = EXACT) -> ClaimOutcome:
    """A claim's premises, its tests at 95%, its counted tests again at the claim's family-wise level, and its
    verdict (package docstring). ``run_gates``: directory -> failed run premise (``evaluate_study``); ``binary``:
    ``Level.binary``. Each file is read once: the family-wise pass reuses what the first pass read."""
    read = functools.cache(read)
    premises = [evaluate_premise(claim.id, p, data_dir, read, binary) for p in claim.premise]
    failed = {p.premise.id: p for p in premises if p.holds is False}
    gates = Gates(dict(run_gates or {}), {i: p for i, p in failed.items() if p.premise.gates == "tests"})
    claim_gate = next((p for p in premises if p.holds is False and p.premise.gates == "claim"), None)
    tests = [evaluate_test(claim, t, data_dir, read, Level(binary=binary), gates) for t in claim.test]
    for j, (t, r) in enumerate(zip(claim.test, tests)):  # a test whose outcome is fixed: refused, or shown as such
        mark(f"claim {claim.id} test {j + 1}" + (f" '{t.name}'" if t.name else ""), t, r, UNTESTABLE)
    if claim_gate is not None:
        for r in tests:
            if r.verdict != NOT_RUN and not r.context and r.verdict not in GATED:
                r.measured, r.verdict, r.gate = r.verdict, claim_gate.premise.failure, claim_gate.premise.id
    counted = [(t, r) for t, r in zip(claim.test, tests) if r.counted]
    level = family_level(len(counted))
    for t, r in counted:
        r.family_verdict, r.family_interval = r.verdict, r.interval if r.null is None else r.null
        if len(counted) > 1 and r.estimate is not None and (r.interval or r.null):
            wide = evaluate_test(claim, t, data_dir, read, Level(level, FAMILY_RESAMPLES, binary), gates)
            r.family_level, r.family_verdict = level, wide.measured or wide.verdict
            r.family_interval = wide.interval if wide.null is None else wide.null
    ran = [r for r in tests if not r.context and r.verdict != NOT_RUN]
    gated = [r for r in ran if r.verdict in GATED]
    pending = [r for r in tests if not r.context and r.verdict == NOT_RUN]
    if claim.not_run:
        verdict = NOT_RUN
    elif claim_gate is not None:
        verdict = claim_gate.premise.failure
    elif not counted and gated:
        verdict = gated[0].verdict
    elif not counted and not pending and any(r.verdict == UNTESTABLE for r in ran):
        verdict = UNTESTABLE
    else:  # a declared test that did not run, or cannot decide (untestable), keeps the claim from "reproduced"
        pending += [r for r in ran if r.verdict == UNTESTABLE]
        verdict = claim_verdict([r.verdict for _, r in counted] + [r.verdict for r in pending],
                                [r.family_verdict for _, r in counted] + [r.verdict for r in pending])
    outcome = ClaimOutcome(claim, verdict, tests, premises)
    outcome.key = key_test(outcome, claim_gate)
    return outcome


def decides(o: ClaimOutcome, r: Outcome) -> bool:
    """Whether test ``r`` bears out claim ``o``'s verdict, so that it can stand for it in the verdict table: a
    reproduced claim's counted test reproduced; a contradicted claim's counted test contradicted at the family-wise
    level; an inconclusive claim's counted test neither reproduced nor contradicted there (or, when every counted test
    reproduced, a declared test that did not run or is untestable: what kept the claim from "reproduced"); an
    untestable claim's untestable test; a gated claim's test gated the same way. A claim not run takes any test."""
    if o.verdict == REPRODUCED:
        return r.counted and r.verdict == REPRODUCED
    if o.verdict == CONTRADICTED:
        return r.counted and r.verdict == CONTRADICTED and r.family_verdict == CONTRADICTED
    if o.verdict == INCONCLUSIVE:
        if r.counted:
            return r.verdict != REPRODUCED and (r.family_verdict or r.verdict) != CONTRADICTED
        return not r.context and r.verdict in (NOT_RUN, UNTESTABLE) and all(t.verdict == REPRODUCED for t in o.tests
                                                                            if t.counted)
    if o.verdict == NOT_RUN:
        return True
    return r.verdict == o.verdict


def key_test(o: ClaimOutcome, claim_gate: PremiseOutcome | None = None) -> Outcome | None:
    """The outcome the verdict table shows for a claim, always one that bears out its verdict (``decides``): its
    ``key`` test when that one does; else, for a claim a premise gated, that premise; else its first test that does,
    an inconclusive claim's inconclusive test before one that did not run; else (a claim whose tests all did not
    run) its first test."""
    named = next((r for r in o.tests if o.claim.key and r.name == o.claim.key), None)
    if named is not None and decides(o, named):
        return named
    if claim_gate is not None:
        return claim_gate.outcome
    order = sorted(o.tests, key=lambda r: not r.counted)  # counted tests first, in their order
    return next((r for r in order if decides(o, r)), None) or (o.tests or [None])[0]


def evaluate_study(claims: ClaimsFile, read: Reader, data_dir: str | Path | None = None) -> StudyOutcome:
    """The run premises, then every claim with the directories of the failed ones taken out of its tests."""
    root = Path(claims.study.data if data_dir is None else data_dir)
    read = functools.cache(read)
    premises = [evaluate_premise("premise", p, root, read) for p in claims.premise]
    run_gates = {d: p for p in premises if p.holds is False for d in p.premise.covers}
    return StudyOutcome(premises, [evaluate_claim(c, root, read, run_gates) for c in claims.claim])


def evaluate_claims(claims: ClaimsFile, read: Reader, data_dir: str | Path | None = None) -> list[ClaimOutcome]:
    """Every claim's tests and verdict, reading files under ``data_dir`` (default ``claims.study.data``)."""
    return evaluate_study(claims, read, data_dir).claims
