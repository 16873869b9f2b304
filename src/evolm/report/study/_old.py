"""The reproduction study's claims file and the statistics behind each verdict (``evolm report --study``).

``experiments/study/claims.toml`` holds one ``[[claim]]`` per claim of "Understanding Evolution
Strategies for LLM Reasoning" (arXiv 2608.27351) and per open question, each with the command that
tests it and ``[[claim.test]]`` entries naming the committed files that decide it (``Claim``,
``ClaimTest``). This module loads and checks that file and turns every test into a number with an
interval and a verdict; ``report.reproduction`` lays them out as ``docs/REPRODUCTION.md``.

Four kinds of test:

- ``change``: a run's ``eval_after.json`` against its ``eval_before.json`` on one metric.
- ``compare``: two evaluation files (``a``, ``b``) measured on the same problems, e.g. GRPO's
  ``eval_after.json`` against ES evaluated at GRPO's rollout budget; with ``a_base`` and ``b_base``, the two
  sides' changes from their own baselines, (b − b_base) − (a − a_base) per problem (a difference in
  differences: does int4 cost ES more than it costs GRPO?).
- ``contrast``: two gaps measured on two different problem sets, (b − a) − (d − c): ``a``/``b`` are
  evaluated on one set of problems, ``c``/``d`` on another (e.g. N = 10 against N = 30 at one model scale
  and at another, on each model's own task); does the first gap exceed the second?
- ``value``: one number or enrichment record in an analysis JSON (``drift.json``,
  ``localisation.json``, ``sparsity.json``), optionally divided by a second number (``over``),
  against a threshold; or a per-problem list (``diversity.json``'s ``population_per_prompt``), optionally
  minus a second list of the same problems (``minus``), whose mean gets a bootstrap interval.

Statistics (pure functions over what was read):

- Per problem: unbiased pass@k from the problem's ``n`` and ``c`` (``metrics.pass_at_k_problem``);
  entropy = the mean of its samples' ``entropy`` (each sample weighs the same, unlike the summary's
  token-weighted entropy); greedy = ``greedy_correct`` as 0 or 1.
- Paired bootstrap over problems (``bootstrap_interval``): the two files must hold the same problem
  ids (else a one-line error naming both files); the per-problem differences b − a (change: after −
  before) are resampled with replacement ``BOOTSTRAP_RESAMPLES`` = 2000 times with the fixed seed
  ``BOOTSTRAP_SEED``, and the 95% percentile interval of the resampled mean is reported with the
  observed mean difference. Problems missing the metric on either side (no entropy recorded) are left out.
  A contrast pairs within each set and resamples the two sets independently (``contrast_interval``): the
  interval is of mean(b − a) − mean(d − c), each set resampled with its own fixed seed.
- Verdicts (``interval_verdict``): "reproduced" when the interval excludes 0 in the expected
  direction, "contradicted" when it excludes 0 in the opposite one, "inconclusive at this scale"
  otherwise. ``not_down`` and ``equal`` are non-inferiority and equivalence tests with a margin of
  one problem's share, m = 1 / problems (in the metric's own units): ``not_down`` (compare:
  ``b_not_less``) is reproduced when the interval's lower end is above −m (checked first) and
  contradicted when its upper end is below 0; ``equal`` is reproduced when the interval lies inside (−m, m) and contradicted when it excludes 0.
- Value tests (``value_verdict``) report an analysis's own uncertainty, never a bare count: a
  top-k count enrichment (``localisation.json``) with its exact 95% interval (reproduced when the
  interval clears the threshold, contradicted when it lies on the other side); a share-of-‖Δ‖²
  enrichment (``drift.json``) with the permutation null's 95% interval (reproduced when the observed
  enrichment is past the threshold and outside the null interval on that side, contradicted when both
  hold on the other side). A plain number (a relative distance, a ratio of two, a fraction of
  coordinates) is a deterministic measurement of one run's weights: it is compared with the threshold
  directly and shown as "exact (one run)". A per-problem list (a sampled measurement, one value per
  problem) is never compared as a bare mean: its mean (of the paired differences with ``minus``) gets the
  same bootstrap interval over problems as a compare test, and the interval must clear the threshold.
- "not run" when the claim or test sets ``not_run`` or an input file is missing.
- A claim's verdict (``claim_verdict``) counts its tests except the ``context`` ones (reported, with the
  reason they do not bear on the claim as stated, e.g. C9's reverse order). It is reproduced when every
  counted test is reproduced at 95% (an intersection-union test: requiring all of them needs no correction),
  contradicted when some counted test is contradicted at the claim's *family-wise* level 1 − 0.05 / m
  (Bonferroni over the m counted tests that ran: with a dozen tests per claim, one 95% interval on the wrong
  side of 0 by chance is likely, and "any contradicted" would manufacture contradictions), "not run" when no
  test ran, and inconclusive at this scale otherwise. The family-wise interval of each test is computed the
  same way at the wider level (``family_level``): bootstrap tests with ``FAMILY_RESAMPLES`` resamples (the
  tails need more than 2000), a top-k count enrichment with its exact interval at that level
  (``enrichment.clopper_pearson``), a share-of-‖Δ‖² enrichment against its permutation null widened to that
  level (from the record's z); an exact number has no sampling error and keeps its verdict.

Design decisions:

- The claims file is a typed dataclass loaded like every evolm config (``config.from_dict``: unknown
  fields with a did-you-mean, types checked), then checked per kind (``check_claims``); every
  problem is one ``ConfigError`` line naming the file, the claim and the fix.
- Files are read through a callable the caller passes (the report's ``Reader``, which lists every
  file read at the end of the page); nothing here writes.
- Paths in tests are relative to the study's data directory (``study.data``, default
  ``docs/study``): the committed copies of run directories (no weights) and analysis outputs.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from evolm import config
from evolm.analysis.enrichment import clopper_pearson, normal_quantile
from evolm.errors import ConfigError, UserError
from evolm.metrics import pass_at_k_problem

BOOTSTRAP_RESAMPLES = 2000
"""Paired bootstrap resamples per interval."""
BOOTSTRAP_SEED = 0
"""The bootstrap's fixed seed: the page regenerates with the same intervals."""
LEVEL = 0.95
"""The intervals' coverage."""
FAMILY_RESAMPLES = 20000
"""Bootstrap resamples for a family-wise interval (``family_level``): its ends are the α / 2m tail quantiles,
a handful of resamples out of 2000 at m = 15."""

REPRODUCED, CONTRADICTED, INCONCLUSIVE, NOT_RUN = "reproduced", "contradicted", "inconclusive at this scale", "not run"
VERDICTS = (REPRODUCED, CONTRADICTED, INCONCLUSIVE, NOT_RUN)
"""Every verdict a test or a claim can get."""

EXPECTS = {"change": ("up", "down", "not_down"), "compare": ("a_greater", "b_greater", "equal", "b_not_less"),
           "contrast": ("first_greater", "second_greater"), "value": (">", "<")}
"""The ``expect`` values each kind of test takes."""
REQUIRED = {"change": ("run", "metric", "expect"), "compare": ("a", "b", "metric", "expect"),
            "contrast": ("a", "b", "c", "d", "metric", "expect"), "value": ("file", "path", "expect", "threshold")}
"""The fields each kind of test needs."""
OPTIONAL = {"change": ("task", "not_run", "context"), "compare": ("a_base", "b_base", "task", "not_run", "context"),
            "contrast": ("not_run", "context"), "value": ("over", "minus", "not_run", "context")}
"""The fields each kind of test may set besides ``kind`` and its required ones."""
EXAMPLES = {"run": 'run = "c1c2-es"', "metric": 'metric = "pass@1"', "a": 'a = "c1c2-grpo/eval_after.json"',
            "b": 'b = "matched/es-at-grpo-sequences/eval.json"', "c": 'c = "c7-gemma/es.population=10/eval_after.json"',
            "d": 'd = "c7-gemma/es.population=30/eval_after.json"', "file": 'file = "analyses/c1c2/drift.json"',
            "path": 'path = "models.es.relative_distance"', "threshold": "threshold = 1.0"}


# -- the claims file ---------------------------------------------------------------------------------


@dataclass
class ValueRef:
    """A number in a JSON file under the data directory (a value test's ``over``)."""

    file: str = ""
    """The JSON file, relative to the data directory (e.g. ``analyses/c1c2/drift.json``)."""
    path: str = ""
    """Dotted key into it (e.g. ``models.grpo.relative_distance``; list items by index)."""


@dataclass
class ClaimTest:
    """One measurement that bears on a claim: ``[[claim.test]]``."""

    kind: str = ""
    """Required: ``change`` (a run's eval_after.json against its eval_before.json), ``compare`` (two evaluation files on
    the same problems), ``contrast`` (the gap b − a on one problem set against the gap d − c on another) or
    ``value`` (a number or enrichment record in an analysis JSON against a threshold)."""
    run: str = ""
    """change: the run directory under the data directory (e.g. ``c1c2-es``)."""
    metric: str = ""
    """change, compare: ``pass@K`` (unbiased, from each problem's n and c), ``entropy`` (mean of a problem's
    samples' token entropy, nats) or ``greedy`` (greedy answer correct)."""
    expect: str = ""
    """change: ``up``, ``down`` or ``not_down`` (after − before); compare: ``a_greater``, ``b_greater``, ``equal``
    or ``b_not_less`` (b − a; the last two with a margin of one problem's share); contrast: ``first_greater`` or
    ``second_greater`` ((b − a) − (d − c) above or below 0); value: ``>`` or ``<`` the threshold."""
    a: str = ""
    """compare, contrast: the first evaluation file, relative to the data directory (``eval.json`` of ``evolm eval`` or a
    run's ``eval_before.json`` / ``eval_after.json``)."""
    b: str = ""
    """compare, contrast: the second evaluation file; the difference reported is b − a."""
    c: str = ""
    """contrast: the first evaluation file of the second problem set (the second gap is d − c)."""
    d: str = ""
    """contrast: the second evaluation file of the second problem set."""
    a_base: str = ""
    """compare: ``a``'s own baseline on the same problems (e.g. the uncompressed model); with ``b_base`` the test
    compares changes, (b − b_base) − (a − a_base) per problem (e.g. whether ES loses more than GRPO under int4)."""
    b_base: str = ""
    """compare: ``b``'s own baseline on the same problems (set together with ``a_base``)."""
    file: str = ""
    """value: the JSON file, relative to the data directory (e.g. ``analyses/c1c2/localisation.json``)."""
    path: str = ""
    """value: dotted key into ``file`` (e.g. ``models.es.relative_distance`` or
    ``models.es.100.enrichment.by_category.norm``; list items by index). Keys that hold dots are matched whole."""
    over: ValueRef | None = None
    """value: a second number (``{file = ..., path = ...}``); the test reports value / over (a ratio)."""
    minus: ValueRef | None = None
    """value, when ``path`` is a per-problem list: a second list of the same problems (``{file = ..., path = ...}``),
    subtracted problem by problem; the test reports the mean difference with its paired bootstrap interval."""
    threshold: float | None = None
    """value: what the value (or ratio, or enrichment) is compared with."""
    task: str = ""
    """change, compare: the task to read from an ``eval.json`` holding several (default: its only task)."""
    not_run: str = ""
    """Why this test was not run (empty: it is run when its files exist)."""
    context: str = ""
    """Why this test is reported but not counted in the claim's verdict (empty: it counts), e.g. it measures
    something beside the claim as stated (C9's reverse order, ES -> GRPO, where the claim is GRPO -> ES)."""


@dataclass
class Claim:
    """One claim of the paper or one open question: ``[[claim]]``."""

    id: str = ""
    """Short identifier (``C1`` .. ``C9``, ``Q1``, ``Q2``)."""
    claim: str = ""
    """The claim, one line."""
    paper: str = ""
    """What the paper reports for it, one line."""
    command: str = ""
    """The one command that tests it here (e.g. ``bash experiments/study/run.sh c1c2``)."""
    decide: str = ""
    """What scale (models, updates, problems) would decide it."""
    cost: str = ""
    """Estimated CPU time of the command on this machine."""
    not_run: str = ""
    """Why it was not run this session (empty when run)."""
    test: list[ClaimTest] = field(default_factory=list)
    """The measurements that decide it (``[[claim.test]]``)."""


@dataclass
class StudySettings:
    """The study's page: ``[study]``."""

    title: str = "Reproduction study"
    """The page's title."""
    data: str = "docs/study"
    """The directory the tests' paths are relative to: committed copies of run directories (config.toml, run.json,
    metrics.jsonl, seed_log.jsonl, eval_before/after.json; no weights) and analysis outputs. Relative to the
    current directory."""
    intro: str = ""
    """The opening paragraph: what was run, on what machine, and what two small scales cannot test."""


@dataclass
class ClaimsFile:
    """``experiments/study/claims.toml``."""

    study: StudySettings = field(default_factory=StudySettings)
    """The page's settings."""
    claim: list[Claim] = field(default_factory=list)
    """The claims and open questions, in table order."""


def parse_metric(metric: str) -> tuple[str, int | None]:
    """``"pass@16"`` -> ``("pass", 16)``; ``"entropy"`` / ``"greedy"`` -> ``(metric, None)``; ValueError otherwise."""
    m = re.fullmatch(r"pass@(\d+)", metric)
    if m and int(m.group(1)) >= 1:
        return "pass", int(m.group(1))
    if metric in ("entropy", "greedy"):
        return metric, None
    raise ValueError(f"unknown metric '{metric}'")


def check_claims(claims: ClaimsFile, where: str) -> None:
    """Per-kind checks ``config.from_dict`` cannot make: unique ids, the fields each kind needs and takes."""
    seen: set[str] = set()
    for i, c in enumerate(claims.claim):
        name = f"{where}: claim {c.id or i + 1}"
        if not c.id.strip() or not c.claim.strip():
            raise ConfigError(f"{name} needs an id and a one-line claim (id = \"C1\", claim = \"...\")")
        if c.id in seen:
            raise ConfigError(f"{name}: the id {c.id} is used twice; give each [[claim]] its own id")
        seen.add(c.id)
        for j, t in enumerate(c.test):
            what = f"{name} test {j + 1} (kind {t.kind})"
            if t.kind not in EXPECTS:
                raise ConfigError(f"{name} test {j + 1}: kind must be one of {', '.join(EXPECTS)} (got '{t.kind}')")
            for f in REQUIRED[t.kind]:
                if getattr(t, f) in ("", None):
                    raise ConfigError(f"{what} needs {f} (e.g. {EXAMPLES[f]})")
            extra = [f for f in ("run", "metric", "a", "b", "c", "d", "a_base", "b_base", "file", "path", "over", "minus", "threshold", "task")
                     if f not in REQUIRED[t.kind] + OPTIONAL[t.kind] and getattr(t, f) not in ("", None)]
            if extra:
                raise ConfigError(f"{what} does not take {', '.join(extra)}; a {t.kind} test takes "
                                  f"{', '.join(REQUIRED[t.kind] + OPTIONAL[t.kind])}")
            if t.expect not in EXPECTS[t.kind]:
                raise ConfigError(f"{what}: expect must be one of {', '.join(EXPECTS[t.kind])} (got '{t.expect}')")
            if t.metric:
                try:
                    parse_metric(t.metric)
                except ValueError:
                    raise ConfigError(f"{what}: metric must be pass@K (K >= 1), entropy or greedy (got '{t.metric}')") from None
            if t.over is not None and not (t.over.file and t.over.path):
                raise ConfigError(f"{what}: over needs file and path (over = {{ file = \"analyses/c1c2/drift.json\", "
                                  "path = \"models.grpo.relative_distance\" }})")
            if t.minus is not None and not (t.minus.file and t.minus.path):
                raise ConfigError(f"{what}: minus needs file and path (minus = {{ file = \"analyses/c3/diversity.json\", "
                                  "path = \"center_per_prompt\" }})")
            if bool(t.a_base) != bool(t.b_base):
                raise ConfigError(f"{what}: a_base and b_base go together (each side's change from its own baseline)")
            if t.minus is not None and t.over is not None:
                raise ConfigError(f"{what} takes over (a ratio of numbers) or minus (a difference of per-problem lists), not both")


def load_claims(path: str | Path) -> ClaimsFile:
    """Load and check a claims file; every problem is a one-line ``ConfigError`` naming the file and the fix."""
    try:
        claims = config.from_dict(ClaimsFile, config.read_toml(path))
    except ConfigError as e:
        raise ConfigError(str(e) if str(path) in str(e) else f"{path}: {e}") from None
    check_claims(claims, str(path))
    return claims


# -- statistics (pure) -------------------------------------------------------------------------------


def problem_values(report: dict, metric: str) -> dict[str, float | None]:
    """``{problem id: value}`` of ``metric`` for every problem of one task's evaluation (``report["problems"]``):
    pass@k from n and c, the mean of the samples' entropies (None when none was recorded), greedy as 0/1."""
    name, k = parse_metric(metric)
    out: dict[str, float | None] = {}
    for p in report.get("problems") or []:
        if name == "pass":
            value = pass_at_k_problem(int(p["n"]), int(p["c"]), k)
        elif name == "entropy":
            hs = [float(h) for h in p.get("entropy") or [] if h is not None]
            value = sum(hs) / len(hs) if hs else None
        else:
            g = p.get("greedy_correct")
            value = None if g is None else float(bool(g))
        out[str(p["id"])] = value
    return out


ROUND_DIGITS = 12
"""Interval ends and means are rounded to this many decimals before any verdict compares them with 0."""


def bootstrap_interval(diffs: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                       level: float = LEVEL) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: the mean of the per-problem differences and the percentile interval of the mean over
    ``resamples`` resamples of the problems with replacement (paired: one difference per problem)."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.size == 0:
        raise ValueError("a bootstrap needs at least one problem")
    return _rounded(d.mean(), *_percentiles(_resampled_means(d, resamples, seed), level))


def _resampled_means(values: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """The mean over rows (problems) of ``resamples`` resamples of ``values``'s rows with replacement, drawn with
    ``seed``: shape (resamples,) for a vector, (resamples, columns) for a matrix."""
    idx = np.random.default_rng(seed).integers(0, values.shape[0], size=(resamples, values.shape[0]))
    return values[idx].mean(axis=1)


def _percentiles(means: np.ndarray, level: float):
    """The two ends of the central ``level`` percentile interval of ``means`` (per column for a matrix)."""
    return np.percentile(means, [100 * (1 - level) / 2, 100 * (1 + level) / 2], axis=0)


def _rounded(*values) -> tuple[float, ...]:
    """``values`` rounded to ``ROUND_DIGITS``: the per-problem values are fractions (c/n, pass@k ratios); a resample
    whose differences cancel exactly can come out as +-1e-17 in float sums, which must not "exclude 0" (seen on C8:
    [6.9e-18, 0.021])."""
    return tuple(round(float(x), ROUND_DIGITS) + 0.0 for x in values)


def contrast_interval(first: Sequence[float], second: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES,
                      seed: int = BOOTSTRAP_SEED, level: float = LEVEL) -> tuple[float, float, float]:
    """``(mean, lo, hi)`` of mean(first) − mean(second) for per-problem differences on two *different* problem sets:
    each set is resampled with replacement on its own (seeds ``seed`` and ``seed + 1``), and the interval is the
    percentile interval of the difference of the resampled means."""
    d1, d2 = (np.asarray(x, dtype=np.float64) for x in (first, second))
    if d1.size == 0 or d2.size == 0:
        raise ValueError("a contrast needs at least one problem in each set")
    diff = _resampled_means(d1, resamples, seed) - _resampled_means(d2, resamples, seed + 1)
    return _rounded(d1.mean() - d2.mean(), *_percentiles(diff, level))


def bootstrap_curve(values: np.ndarray, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                    level: float = LEVEL) -> tuple[list[float], list[float], list[float]]:
    """Mean and percentile band of each column of ``values`` (problems × points, e.g. pass@k for k = 1..n),
    resampling the problems (rows) with replacement, the same resamples for every column."""
    v = np.asarray(values, dtype=np.float64)
    lo, hi = _percentiles(_resampled_means(v, resamples, seed), level)
    return v.mean(axis=0).tolist(), lo.tolist(), hi.tolist()


def interval_verdict(expect: str, lo: float, hi: float, problems: int) -> str:
    """The verdict of a difference with interval ``[lo, hi]`` (change: after − before; compare: b − a) measured on
    ``problems`` problems (module docstring)."""
    margin = 1.0 / problems
    if expect in ("up", "b_greater", "first_greater"):
        return REPRODUCED if lo > 0 else CONTRADICTED if hi < 0 else INCONCLUSIVE
    if expect in ("down", "a_greater", "second_greater"):
        return REPRODUCED if hi < 0 else CONTRADICTED if lo > 0 else INCONCLUSIVE
    if expect in ("not_down", "b_not_less"):
        return REPRODUCED if lo > -margin else CONTRADICTED if hi < 0 else INCONCLUSIVE
    if expect == "equal":
        return REPRODUCED if -margin < lo and hi < margin else CONTRADICTED if lo > 0 or hi < 0 else INCONCLUSIVE
    raise ValueError(f"unknown expect '{expect}'")


def value_verdict(expect: str, value: float, threshold: float, interval: Sequence[float] | None = None,
                  null: Sequence[float] | None = None) -> str:
    """The verdict of ``value`` against ``threshold`` (``expect`` ``>`` or ``<``): with the value's own
    ``interval`` (the interval must clear the threshold), with a ``null`` interval (the value must be past the
    threshold and outside the null on that side), or for an exact number (compared directly)."""
    sign = 1.0 if expect == ">" else -1.0
    if interval is not None:
        near, far = (interval[0], interval[1]) if sign > 0 else (interval[1], interval[0])
        return REPRODUCED if sign * (near - threshold) > 0 else CONTRADICTED if sign * (far - threshold) < 0 else INCONCLUSIVE
    if null is not None:
        upper, lower = (null[1], null[0]) if sign > 0 else (null[0], null[1])
        if sign * (value - threshold) > 0 and sign * (value - upper) > 0:
            return REPRODUCED
        if sign * (value - threshold) < 0 and sign * (value - lower) < 0:
            return CONTRADICTED
        return INCONCLUSIVE
    return REPRODUCED if sign * (value - threshold) > 0 else CONTRADICTED


def family_level(tests: int) -> float:
    """The Bonferroni level for ``tests`` counted tests of one claim: 1 − (1 − ``LEVEL``) / tests."""
    return 1.0 - (1.0 - LEVEL) / max(1, tests)


def claim_verdict(verdicts: Sequence[str], family: Sequence[str] | None = None) -> str:
    """The verdict of a claim from its counted tests' 95% ``verdicts`` and their ``family``-wise ones (the same
    tests at ``family_level``; default: the 95% ones, a family of one): every test reproduced at 95% ->
    reproduced; any contradicted at the family-wise level -> contradicted; none run -> not run; else
    inconclusive at this scale."""
    family = list(verdicts) if family is None else list(family)
    if len(family) != len(verdicts):
        raise ValueError("claim_verdict needs one family-wise verdict per test")
    if not verdicts or all(v == NOT_RUN for v in verdicts):
        return NOT_RUN
    if any(v == CONTRADICTED and f == CONTRADICTED for v, f in zip(verdicts, family)):
        return CONTRADICTED
    if all(v == REPRODUCED for v in verdicts):
        return REPRODUCED
    return INCONCLUSIVE


def lookup(data: Any, path: str, where: str) -> Any:
    """The value at dotted ``path`` in ``data``; a key holding dots is matched whole (the longest key first),
    a list item by its index. A missing key is a ``UserError`` naming ``where``, the key and what is there."""
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
        else:
            at = ".".join(parts[:i]) or "the top level"
            there = (f"keys {', '.join(list(map(str, node))[:10])}" if isinstance(node, dict) else
                     f"a list of {len(node)}" if isinstance(node, list) else f"the value {node!r}")
            raise UserError(f"{where} has no '{parts[i]}' at {at} (it has {there}); fix the test's path in the claims file")
    return node


# -- evaluating the tests ------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one test measured and its verdict."""

    claim: str
    """The claim's id."""
    kind: str
    """``change``, ``compare`` or ``value``."""
    label: str
    """What was measured, in words (e.g. ``c1c2-grpo pass@1``)."""
    verdict: str
    """One of ``VERDICTS``."""
    expect: str = ""
    """The expected direction (the test's ``expect``)."""
    estimate: float | None = None
    """change / compare: the mean per-problem difference (after − before, b − a); contrast: (b − a) − (d − c);
    value: the value, ratio or enrichment."""
    interval: list[float] | None = None
    """The estimate's 95% interval (bootstrap over problems, or an enrichment's exact interval); None for an exact
    number."""
    null: list[float] | None = None
    """value: the permutation null's 95% interval of a share-of-‖Δ‖² enrichment."""
    a: float | None = None
    """change: the before mean; compare: a's mean (over the paired problems); contrast: the first gap, mean b − a."""
    b: float | None = None
    """change: the after mean; compare: b's mean; contrast: the second gap, mean d − c."""
    problems: int | None = None
    """Problems paired (change, compare; contrast: both sets together)."""
    p: float | None = None
    """value: the enrichment's p-value in the expected direction (one-sided for counts, two-sided for shares)."""
    threshold: float | None = None
    """value: the threshold."""
    detail: str = ""
    """Extra words: counts behind an enrichment, or why the test was not run."""
    files: list[str] = field(default_factory=list)
    """The files the test read or would read."""
    context: str = ""
    """The test's ``context``: why it is reported but not counted in the claim's verdict (empty: it counts)."""
    family_level: float | None = None
    """The claim's family-wise level (``family_level`` of its counted tests that ran); None for a context test,
    one that did not run, or a claim with one counted test."""
    family_interval: list[float] | None = None
    """The estimate's interval at ``family_level`` (for a share enrichment: the null's interval there); None for
    an exact number."""
    family_verdict: str = ""
    """The verdict at ``family_level`` (the 95% verdict when there is no family); a claim is contradicted only by
    a test contradicted at this level."""


@dataclass
class ClaimOutcome:
    """A claim, its tests' results and its verdict."""

    claim: Claim
    """The claim as written in the claims file."""
    verdict: str
    """``claim_verdict`` of the tests."""
    tests: list[Outcome]
    """One result per ``[[claim.test]]``."""


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


def _values(path: Path, metric: str, task: str, read: Callable[[Path], Any]) -> dict[str, float | None]:
    try:
        return problem_values(task_report(read(path), path, task), metric)
    except ValueError as e:  # pass@k beyond a problem's n
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


def _missing(result: Outcome, paths: list[Path]) -> bool:
    """Whether any of ``paths`` is missing; if so ``result`` (still "not run") says which."""
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        result.detail = f"{' and '.join(missing)} missing"
    return bool(missing)


@dataclass(frozen=True)
class Level:
    """The coverage an evaluation computes its intervals at, and the bootstrap resamples behind them."""

    level: float = LEVEL
    """Interval coverage (``LEVEL``, or a claim's ``family_level``)."""
    resamples: int = BOOTSTRAP_RESAMPLES
    """Bootstrap resamples (``FAMILY_RESAMPLES`` at a family-wise level, whose tails need more)."""


def _paired(claim: str, test: ClaimTest, label: str, paths: list[Path], read: Callable[[Path], Any],
            at: Level = Level()) -> Outcome:
    """compare: b − a per problem; with ``a_base`` / ``b_base`` (``paths[2:]``), (b − b_base) − (a − a_base)."""
    a_path, b_path = paths[0], paths[1]
    result = Outcome(claim, test.kind, label, NOT_RUN, expect=test.expect, files=[str(p) for p in paths])
    if _missing(result, paths):
        return result
    va, vb = (_values(p, test.metric, test.task, read) for p in (a_path, b_path))
    _same_problems(va, vb, a_path, b_path)
    if len(paths) == 4:  # each side's change from its own base, on the same problems
        a_base, b_base = (_values(p, test.metric, test.task, read) for p in paths[2:])
        _same_problems(va, a_base, a_path, paths[2])
        _same_problems(vb, b_base, b_path, paths[3])
        va, vb = _minus(va, a_base), _minus(vb, b_base)
    pairs = [(va[i], vb[i]) for i in va if va[i] is not None and vb[i] is not None]
    if not pairs:
        result.detail = f"no per-problem {test.metric} in {' or '.join(map(str, paths))}"
        return result
    diffs = [y - x for x, y in pairs]
    mean, lo, hi = bootstrap_interval(diffs, at.resamples, level=at.level)
    result.verdict = interval_verdict(test.expect, lo, hi, len(pairs))
    result.estimate, result.interval, result.problems = mean, [lo, hi], len(pairs)
    result.a, result.b = sum(x for x, _ in pairs) / len(pairs), sum(y for _, y in pairs) / len(pairs)
    return result


def _contrast(claim: str, test: ClaimTest, label: str, paths: list[Path], read: Callable[[Path], Any],
              at: Level = Level()) -> Outcome:
    """contrast: (b − a) per problem of the first set against (d − c) per problem of the second."""
    result = Outcome(claim, test.kind, label, NOT_RUN, expect=test.expect, files=[str(p) for p in paths])
    if _missing(result, paths):
        return result
    gaps = []
    for x_path, y_path in (paths[:2], paths[2:]):
        vx, vy = (_values(p, test.metric, "", read) for p in (x_path, y_path))
        _same_problems(vx, vy, x_path, y_path)
        gaps.append([vy[i] - vx[i] for i in vx if vx[i] is not None and vy[i] is not None])
    if not gaps[0] or not gaps[1]:
        result.detail = f"no per-problem {test.metric} in {' or '.join(map(str, paths))}"
        return result
    mean, lo, hi = contrast_interval(gaps[0], gaps[1], at.resamples, level=at.level)
    result.verdict = interval_verdict(test.expect, lo, hi, min(map(len, gaps)))
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


def _list_value(result: Outcome, test: ClaimTest, node: list, where: str, read: Callable[[Path], Any],
                second: Path | None, at: Level) -> Outcome:
    """A per-problem list's mean (or the mean of its paired differences with ``minus``) with its bootstrap interval."""
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
    result.estimate, result.interval, result.problems = mean, [lo, hi], len(values)
    result.verdict = value_verdict(test.expect, mean, test.threshold, result.interval)
    return result


def count_interval(record: dict, level: float) -> list[float] | None:
    """A top-k count enrichment's exact (Clopper-Pearson) interval at ``level``, from its record (``observed``,
    ``expected`` = k × ``parameter_share``): the record's own interval is at its ``confidence`` (95%)."""
    share, expected, observed = record.get("parameter_share"), record.get("expected"), record.get("observed")
    if not share or expected is None or observed is None:
        return record.get("enrichment_interval")
    lo, hi = clopper_pearson(int(observed), round(expected / share), 1.0 - level)
    return [lo / share, hi / share]


def null_interval(record: dict, level: float) -> list[float] | None:
    """A share-of-‖Δ‖² enrichment's permutation-null interval at ``level``: 1 ± q·sd, with sd the null's standard
    deviation of the enrichment recovered from the record's z ((enrichment − 1) / z) and q the normal quantile,
    clipped like the record's own (share in [0, 1]). Without a usable z the record's 95% interval is kept."""
    z, e, share = record.get("z"), record.get("enrichment"), record.get("parameter_share")
    if not z or e is None or not share:
        return record.get("null_enrichment_interval")
    q, sd = normal_quantile((1 + level) / 2), (e - 1.0) / z
    return [max(0.0, 1.0 - q * sd), min(1.0 / share, 1.0 + q * sd)]


def _value(claim: str, test: ClaimTest, label: str, files: list[Path], read: Callable[[Path], Any],
           at: Level = Level()) -> Outcome:
    path, over = files[0], (files[1] if test.over or test.minus else None)
    result = Outcome(claim, test.kind, label, NOT_RUN, expect=test.expect, threshold=test.threshold,
                        files=[str(path)] + ([str(over)] if over else []))
    if _missing(result, [path] + ([over] if over else [])):
        return result
    node = lookup(read(path), test.path, str(path))
    where = f"{path}: {test.path}"
    if isinstance(node, list):
        return _list_value(result, test, node, where, read, over, at)
    if test.minus is not None:
        raise UserError(f"{where} is not a per-problem list; minus subtracts lists: drop minus or point path at a list")
    if isinstance(node, dict) and ("enrichment_interval" in node or "null_enrichment_interval" in node):
        if over is not None:
            raise UserError(f"{where} is an enrichment record; over divides numbers only: drop over or point path at a number")
        result.estimate = node.get("enrichment")
        wider = at.level != node.get("confidence", LEVEL)
        if "enrichment_interval" in node:  # a top-k count against Binomial(k, share): its own exact interval
            result.interval = count_interval(node, at.level) if wider else node.get("enrichment_interval")
            result.p = node.get("p_enriched" if test.expect == ">" else "p_depleted")
            result.detail = f"{node.get('observed')} observed, {node.get('expected'):.3g} expected"
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
    return result


def files_of(test: ClaimTest, data_dir: Path) -> list[Path]:
    """The files a test reads: a run's eval_before/after.json, the two compared files, or the value's file(s)."""
    if test.kind == "change":
        return [data_dir / test.run / "eval_before.json", data_dir / test.run / "eval_after.json"]
    if test.kind == "compare":
        return [data_dir / f for f in (test.a, test.b, test.a_base, test.b_base) if f]
    if test.kind == "contrast":
        return [data_dir / f for f in (test.a, test.b, test.c, test.d)]
    second = test.over or test.minus
    return [data_dir / test.file] + ([data_dir / second.file] if second else [])


def label_of(test: ClaimTest) -> str:
    """What a test measures, in a few words (e.g. ``c1c2-grpo pass@1``, ``pass@16: b − a``)."""
    if test.kind == "change":
        return f"{test.run} {test.metric}"
    if test.kind == "compare" and test.a_base:
        return f"{test.metric} of ({test.b} − {test.b_base}) − ({test.a} − {test.a_base})"
    if test.kind == "compare":
        return f"{test.metric} of {test.b} − {test.a}"
    if test.kind == "contrast":
        return f"{test.metric} of ({test.b} − {test.a}) − ({test.d} − {test.c})"
    where = "/".join(Path(test.file).parts[-2:])  # e.g. c3-at-160/diversity.json: which analysis, when several
    return f"{where}: " + test.path + (f" / {test.over.path}" if test.over else f" − {test.minus.path}" if test.minus else "")


def evaluate_test(claim: Claim, test: ClaimTest, data_dir: Path, read: Callable[[Path], Any],
                  at: Level = Level()) -> Outcome:
    """One test's outcome with its intervals at ``at`` (default 95%); ``read(path)`` parses a JSON file (and may
    record it)."""
    label, files = label_of(test), files_of(test, data_dir)
    if claim.not_run or test.not_run:
        result = Outcome(claim.id, test.kind, label, NOT_RUN, expect=test.expect, threshold=test.threshold,
                         detail=test.not_run or claim.not_run, files=[str(f) for f in files])
    elif test.kind == "value":
        result = _value(claim.id, test, label, files, read, at)
    elif test.kind == "contrast":
        result = _contrast(claim.id, test, label, files, read, at)
    else:
        result = _paired(claim.id, test, label, files, read, at)
    result.context = test.context
    return result


def evaluate_claim(claim: Claim, data_dir: Path, read: Callable[[Path], Any]) -> ClaimOutcome:
    """A claim's tests at 95%, its counted tests again at the claim's family-wise level, and its verdict
    (module docstring). Each file is read once: the family-wise pass reuses what the first pass read."""
    read = functools.cache(read)
    tests = [evaluate_test(claim, t, data_dir, read) for t in claim.test]
    counted = [(t, r) for t, r in zip(claim.test, tests) if not t.context]
    ran = [(t, r) for t, r in counted if r.verdict != NOT_RUN]
    level = family_level(len(ran))
    for t, r in counted:
        r.family_verdict, r.family_interval = r.verdict, r.interval if r.null is None else r.null
        if len(ran) > 1 and r.verdict != NOT_RUN and r.estimate is not None and (r.interval or r.null):
            wide = evaluate_test(claim, t, data_dir, read, Level(level, FAMILY_RESAMPLES))
            r.family_level, r.family_verdict = level, wide.verdict
            r.family_interval = wide.interval if wide.null is None else wide.null
    verdict = NOT_RUN if claim.not_run else claim_verdict([r.verdict for _, r in counted],
                                                          [r.family_verdict for _, r in counted])
    return ClaimOutcome(claim, verdict, tests)


def evaluate_claims(claims: ClaimsFile, read: Callable[[Path], Any], data_dir: str | Path | None = None) -> list[ClaimOutcome]:
    """Every claim's tests and verdict, reading files under ``data_dir`` (default ``claims.study.data``)."""
    root = Path(claims.study.data if data_dir is None else data_dir)
    return [evaluate_claim(c, root, read) for c in claims.claim]


# -- words -------------------------------------------------------------------------------------------


def _signed(x: float) -> str:
    return f"{x:+.3f}"


def _g(x: float | None) -> str:
    return "–" if x is None else f"{x:.3g}"


def describe(r: Outcome) -> str:
    """One test's result in words, e.g. ``c1c2-grpo pass@1 0.191 → 0.492: +0.301 [+0.252, +0.350] (64 problems;
    expected up): reproduced``; a context test says it is not counted, and a contradicted test of a claim with
    several says whether it stays contradicted at the claim's family-wise level (``family_note``)."""
    return _describe(r) + family_note(r)


def family_note(r: Outcome) -> str:
    """``; family-wise 99.71% (17 counted tests) [-0.231, -0.012]: inconclusive at this scale (...)`` for a
    contradicted counted test with a family-wise interval, `` (context, not counted: why)`` for a context test,
    else nothing."""
    if r.context:
        return f" (context, not counted in the claim's verdict: {r.context})"
    if r.verdict != CONTRADICTED or r.family_level is None or r.family_interval is None:
        return ""
    tests = round((1 - LEVEL) / (1 - r.family_level))
    lo, hi = r.family_interval
    ends = (f"null {_g(lo)}–{_g(hi)}" if r.null is not None else f"[{_g(lo)}, {_g(hi)}]" if r.kind == "value"
            else f"[{_signed(lo)}, {_signed(hi)}]")
    tail = "" if r.family_verdict == CONTRADICTED else " (so it does not contradict the claim)"
    return f"; family-wise {100 * r.family_level:.4g}% ({tests} counted tests) {ends}: {r.family_verdict}{tail}"


def _describe(r: Outcome) -> str:
    if r.verdict == NOT_RUN:
        return f"{r.label}: not run ({r.detail})" if r.detail else f"{r.label}: not run"
    if r.kind == "contrast" and r.estimate is not None:
        return (f"{r.label}: first gap {_signed(r.a)}, second gap {_signed(r.b)}; difference {_signed(r.estimate)} "
                f"[{_signed(r.interval[0])}, {_signed(r.interval[1])}] ({r.detail}, each set resampled on its own; "
                f"expected {r.expect.replace('_', ' ')}): {r.verdict}")
    if r.kind in ("change", "compare") and r.estimate is not None:
        arrow = f"{r.a:.3f} → {r.b:.3f}" if r.kind == "change" else f"a {r.a:.3f}, b {r.b:.3f}"
        diff = "after − before" if r.kind == "change" else "b − a"
        if r.kind == "compare" and len(r.files) == 4:
            arrow, diff = f"a − a_base {_signed(r.a)}, b − b_base {_signed(r.b)}", "difference in changes"
        return (f"{r.label} {arrow}: {diff} {_signed(r.estimate)} [{_signed(r.interval[0])}, {_signed(r.interval[1])}] "
                f"({r.problems} problems; expected {r.expect.replace('_', ' ')}): {r.verdict}")
    if r.kind == "value" and r.estimate is not None:
        criterion = f"expected {r.expect} {r.threshold:g}"
        if r.problems is not None and r.interval is not None:  # a per-problem list (minus a second one)
            means = f"; means {r.a:.3f} − {r.b:.3f}" if r.a is not None and r.b is not None else ""
            return (f"{r.label}: {_signed(r.estimate)} [{_signed(r.interval[0])}, {_signed(r.interval[1])}] (mean over "
                    f"{r.problems} problems, 95% bootstrap{means}; {criterion}): {r.verdict}")
        if r.interval is not None:
            p = f", p {r.p:.3g}" if r.p is not None else ""
            return (f"{r.label}: enrichment {_g(r.estimate)} [{_g(r.interval[0])}, {_g(r.interval[1])}] (exact 95%; "
                    f"{r.detail}{p}; {criterion}): {r.verdict}")
        if r.null is not None:
            p = f", p {r.p:.3g}" if r.p is not None else ""
            return (f"{r.label}: enrichment {_g(r.estimate)}, null 95% {_g(r.null[0])}–{_g(r.null[1])} ({r.detail}{p}; "
                    f"{criterion}): {r.verdict}")
        ratio = f" = {_g(r.a)} / {_g(r.b)}" if r.a is not None and r.b is not None else ""
        return f"{r.label}: {_g(r.estimate)}{ratio} (exact, one run; {criterion}): {r.verdict}"
    return f"{r.label}: {r.verdict} ({r.detail})"
