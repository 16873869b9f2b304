"""The claims file (``experiments/study/claims.toml``): typed dataclasses, loaded like every evolm config and
checked per kind. Every problem is one ``ConfigError`` line naming the file, the claim and the fix."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from evolm import config
from evolm.errors import ConfigError
from evolm.report.study.testability import check_declaration
from evolm.report.study.verdicts import MARGIN_EXPECTS, PREMISE_ABSENT, TRAINING_FAILED

EXPECTS = {"change": ("up", "down", "not_down"), "compare": ("a_greater", "b_greater", "equal", "b_not_less"),
           "contrast": ("first_greater", "second_greater"), "value": (">", "<")}
"""The ``expect`` values each kind of test takes."""
REQUIRED = {"change": ("run", "metric", "expect"), "compare": ("a", "b", "metric", "expect"),
            "contrast": ("a", "b", "c", "d", "metric", "expect"), "value": ("file", "path", "expect", "threshold")}
"""The fields each kind of test needs."""
COMMON = ("name", "not_run", "context", "requires", "untestable")
UNITS = ("problem", "seed")
"""What a test's interval resamples: problems (within each seed) or seeds (Student's t over per-seed means)."""
"""Fields every kind of test may set."""
OPTIONAL = {"change": ("task", "margin", "margin_of", "seeds", "unit") + COMMON,
            "compare": ("a_base", "b_base", "task", "margin", "margin_of", "a_seeds", "b_seeds", "pairs", "unit") + COMMON,
            "contrast": COMMON, "value": ("over", "minus", "unit", "noise_walk") + COMMON}
"""The fields each kind of test may set besides ``kind`` and its required ones."""
KIND_FIELDS = ("run", "metric", "a", "b", "c", "d", "a_base", "b_base", "file", "path", "over", "minus", "threshold",
               "task", "margin", "margin_of", "seeds", "a_seeds", "b_seeds", "pairs", "unit", "noise_walk")
"""The fields some kinds take and others refuse."""
EXAMPLES = {"run": 'run = "c1c2-es"', "metric": 'metric = "pass@1"', "a": 'a = "c1c2-grpo/eval_after.json"',
            "b": 'b = "matched/es-at-grpo-sequences/eval.json"', "c": 'c = "c7-gemma/es.population=10/eval_after.json"',
            "d": 'd = "c7-gemma/es.population=30/eval_after.json"', "file": 'file = "analyses/c1c2/drift.json"',
            "path": 'path = "models.es.relative_distance"', "threshold": "threshold = 1.0"}
HOLDS = ("reproduced", "not_contradicted")
"""When a premise holds: its test reproduced at 95%, or merely not contradicted."""
GATES = ("claim", "tests")
"""What a claim's premise gates: the whole claim, or the tests that name it in ``requires``."""


@dataclass
class ValueRef:
    """A number in a JSON file under the data directory (a value test's ``over``)."""

    file: str = ""
    """The JSON file, relative to the data directory (e.g. ``analyses/c1c2/drift.json``)."""
    path: str = ""
    """Dotted key into it (e.g. ``models.grpo.relative_distance``; list items by index)."""


@dataclass
class NoiseWalk:
    """The noise walk a fraction-below-τ test is read against (``noise_walk``; ``evolm.report.study.testability``)."""

    tau_rms: float = 0.0
    """τ in units of one update's RMS (e.g. 1.0: τ = one update's RMS)."""
    updates: int = 0
    """The number of updates behind the weights (the walk puts ``erf(tau_rms / sqrt(2 · updates))`` below τ)."""


@dataclass
class MarginRef:
    """A margin relative to a reference (``margin_of``): ``fraction`` × |the reference's mean| in the test's metric."""

    fraction: float = 0.0
    """The share of the reference taken as the margin (e.g. 0.5: half of ES's gain)."""
    run: str = ""
    """A run directory: the reference is its change, eval_after.json − eval_before.json (mean over problems)."""
    a: str = ""
    """With ``b``: the reference is the mean of b − a over their problems (e.g. the base and the trained model)."""
    b: str = ""
    """See ``a``."""
    file: str = ""
    """An evaluation file: the reference is its mean level of the metric (e.g. the base's pass@1)."""
    metric: str = ""
    """The reference's metric (default: the test's)."""
    task: str = ""
    """The task to read from an ``eval.json`` holding several (default: the test's)."""


@dataclass
class ClaimTest:
    """One measurement that bears on a claim: ``[[claim.test]]``."""

    kind: str = ""
    """Required: ``change`` (a run's eval_after.json against its eval_before.json), ``compare`` (two evaluation files on
    the same problems), ``contrast`` (the gap b − a on one problem set against the gap d − c on another) or
    ``value`` (a number or enrichment record in an analysis JSON against a threshold)."""
    name: str = ""
    """A short name for the page's tables (e.g. ``GRPO pass@16, addition, 3 seeds``); default: what it reads."""
    run: str = ""
    """change: the run directory under the data directory (e.g. ``c1c2-es``)."""
    metric: str = ""
    """change, compare: ``pass@K`` (unbiased, from each problem's n and c), ``entropy`` (mean of a problem's
    samples' token entropy, nats) or ``greedy`` (greedy answer correct)."""
    expect: str = ""
    """change: ``up``, ``down`` or ``not_down`` (after − before); compare: ``a_greater``, ``b_greater``, ``equal``
    or ``b_not_less`` (b − a; the last two against the test's margin); contrast: ``first_greater`` or
    ``second_greater`` ((b − a) − (d − c) above or below 0); value: ``>`` or ``<`` the threshold."""
    margin: float | None = None
    """not_down, b_not_less, equal: the margin in the metric's units (e.g. 0.05 of pass@1); one of margin and
    margin_of is required for those, and refused for the others."""
    margin_of: MarginRef | None = None
    """not_down, b_not_less, equal: a margin relative to a named reference (``{fraction = 0.5, run = "c1c2-grpo"}``:
    half of that run's change in the same metric)."""
    seeds: list[str] = field(default_factory=list)
    """change: more runs of the same method and config with other seeds, each on its own held-out problems; the test
    then measures the method: the mean over the runs of each run's mean change, each run's problems resampled on
    their own."""
    a: str = ""
    """compare, contrast: the first evaluation file, relative to the data directory (``eval.json`` of ``evolm eval`` or a
    run's ``eval_before.json`` / ``eval_after.json``)."""
    b: str = ""
    """compare, contrast: the second evaluation file; the difference reported is b − a."""
    a_seeds: list[str] = field(default_factory=list)
    """compare: more evaluation files of side a (other seeds of its method) on the same problems; side a is then
    the per-problem mean over its files."""
    b_seeds: list[str] = field(default_factory=list)
    """compare: the same for side b."""
    pairs: list[list[str]] = field(default_factory=list)
    """compare: more ``[a, b]`` evaluation-file pairs, each pair on its own problems (the same comparison under other
    seeds, e.g. ``[["n30-grpo-s1/eval_after.json", "n30-es-s1/eval_after.json"]]``): b − a is paired by problem
    within each pair and the test is over the seeds (needs ``unit = "seed"``)."""
    unit: str = ""
    """change with ``seeds``, compare with ``pairs``: ``seed`` (the interval is Student's t over the per-seed mean
    differences: a method's claim is as uncertain as its seeds disagree) or ``problem`` (each seed's problems
    resampled on their own, the seeds fixed). Empty: ``problem``. A value test with ``unit = "seed"`` reads a list
    with one number per seed at ``path`` (e.g. a walk's drift ratio at seeds 0, 1, 2) and judges its mean by
    Student's t over those numbers (no ``over`` or ``minus``)."""
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
    requires: list[str] = field(default_factory=list)
    """The ids of the claim's premises (``gates = "tests"``) this test needs; when one fails the test reads its
    failure ("premise absent") and is not counted."""
    noise_walk: NoiseWalk | None = None
    """value, reading a fraction of coordinates below τ (required there): ``{ tau_rms = 1.0, updates = 62 }``, the
    noise walk it is read against (``testability``): a threshold no noise walk can reach is refused, and the
    walk's prediction ``erf(tau_rms / sqrt(2 · updates))`` is shown beside the measured fraction."""
    untestable: str = ""
    """Why a test whose outcome its definition fixes (a threshold no noise walk reaches, an expected top-k count
    below one, a margin below one problem's share: ``testability``) is kept: it reads "untestable", shown and not
    counted. Empty: the test must be able to pass and to fail, and the loader refuses one that cannot."""


@dataclass
class Premise(ClaimTest):
    """A precondition, itself a test (any kind and its fields): ``[[premise]]`` (a run that must not have lost its
    task, gating every test that reads the directories it ``covers``) or ``[[claim.premise]]`` (a precondition of
    one claim, e.g. a trade-off to combine)."""

    id: str = ""
    """Required: how tests name it and the page shows it (e.g. ``cd-grpo-seed1 kept its task``)."""
    why: str = ""
    """One line: what failing it means (e.g. "a run whose pass@1 fell lost the task: not evidence either way")."""
    failure: str = ""
    """The verdict its failure gives what it gates: ``training failed`` (default for ``[[premise]]``) or
    ``premise absent`` (default for ``[[claim.premise]]``)."""
    holds_when: str = "reproduced"
    """``reproduced`` (its test reproduced at 95%) or ``not_contradicted`` (its test not contradicted at 95%: e.g.
    "pass@1 did not fall")."""
    covers: list[str] = field(default_factory=list)
    """``[[premise]]``: the directories (relative to the data directory) whose evaluation files its failure takes out
    of every test (a run and its re-evaluations, e.g. ``["cd-grpo-seed1", "matched/cd-grpo-seed1"]``)."""
    gates: str = "claim"
    """``[[claim.premise]]``: ``claim`` (its failure is the claim's verdict, no test counted) or ``tests`` (only the
    tests naming it in ``requires``)."""


@dataclass
class Claim:
    """One claim of the paper or one open question: ``[[claim]]``."""

    id: str = ""
    """Short identifier (``C1`` .. ``C9``, ``Q1``, ``Q2``)."""
    claim: str = ""
    """The claim, one line."""
    short: str = ""
    """The claim in a few words, for the page's one-screen summary table (default: the claim)."""
    scale: str = ""
    """The scale its tests read, for its summary row: model, ES population N, updates, seeds (e.g. ``SmolLM2-135M;
    ES N = 8, 62 updates; GRPO 36 steps; 1 seed``)."""
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
    key: str = ""
    """The ``name`` of the test whose number the page shows as the claim's key number, when that test bears out the
    claim's verdict (``measure.decides``); otherwise, and by default, the first test that does (for a claim a premise
    gated: that premise)."""
    premise: list[Premise] = field(default_factory=list)
    """Its preconditions (``[[claim.premise]]``)."""
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
    """The opening paragraph of "What was run": what was run, on what machine, and what two small scales cannot test."""
    scale: str = ""
    """One line for the page's summary: the scale of the study (models, updates, problems)."""
    pending: list[str] = field(default_factory=list)
    """Summary lines for questions whose experiment is pending (named, with no result), e.g. the numerics question."""
    twins: str = ""
    """The commutative-twin record of ``experiments/study/twins.py`` (relative to the data directory; empty: none)."""


@dataclass
class ClaimsFile:
    """``experiments/study/claims.toml``."""

    study: StudySettings = field(default_factory=StudySettings)
    """The page's settings."""
    premise: list[Premise] = field(default_factory=list)
    """Runs that must not have lost their task (``[[premise]]``), each gating the directories it covers."""
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


def check_test(t: ClaimTest, what: str) -> None:
    """The per-kind checks of one test (or premise): required and refused fields, expect, metric, margin."""
    if t.kind not in EXPECTS:
        raise ConfigError(f"{what}: kind must be one of {', '.join(EXPECTS)} (got '{t.kind}')")
    what = f"{what} (kind {t.kind})"
    for f in REQUIRED[t.kind]:
        if getattr(t, f) in ("", None):
            raise ConfigError(f"{what} needs {f} (e.g. {EXAMPLES[f]})")
    extra = [f for f in KIND_FIELDS if f not in REQUIRED[t.kind] + OPTIONAL[t.kind] and getattr(t, f) not in ("", None, [])]
    if extra:
        raise ConfigError(f"{what} does not take {', '.join(extra)}; a {t.kind} test takes "
                          f"{', '.join(REQUIRED[t.kind] + OPTIONAL[t.kind])}")
    if t.expect not in EXPECTS[t.kind]:
        raise ConfigError(f"{what}: expect must be one of {', '.join(EXPECTS[t.kind])} (got '{t.expect}')")
    for metric in (t.metric, t.margin_of.metric if t.margin_of else ""):
        if metric:
            try:
                parse_metric(metric)
            except ValueError:
                raise ConfigError(f"{what}: metric must be pass@K (K >= 1), entropy or greedy (got '{metric}')") from None
    if t.over is not None and not (t.over.file and t.over.path):
        raise ConfigError(f"{what}: over needs file and path (over = {{ file = \"analyses/c1c2/drift.json\", "
                          "path = \"models.grpo.relative_distance\" }})")
    if t.minus is not None and not (t.minus.file and t.minus.path):
        raise ConfigError(f"{what}: minus needs file and path (minus = {{ file = \"analyses/c3/diversity.json\", "
                          "path = \"center_per_prompt\" }})")
    if t.unit and t.unit not in UNITS:
        raise ConfigError(f"{what}: unit must be one of {', '.join(UNITS)} (got '{t.unit}')")
    if t.pairs and (any(len(p) != 2 or not all(p) for p in t.pairs) or t.unit != "seed" or t.a_seeds or t.b_seeds
                    or t.a_base):
        raise ConfigError(f"{what}: pairs is a list of [a, b] files, one pair per further seed, with unit = \"seed\" and "
                          "without a_seeds, b_seeds or bases")
    if t.kind == "value" and t.unit == "seed" and (t.over is not None or t.minus is not None):
        raise ConfigError(f"{what}: a value test with unit = \"seed\" reads one list with a number per seed at path "
                          "(over and minus do not apply): drop over / minus")
    if t.kind != "value" and t.unit == "seed" and len(t.seeds) + len(t.pairs) < 1:
        raise ConfigError(f"{what}: unit = \"seed\" needs other seeds (change: seeds; compare: pairs), at least two in all")
    if bool(t.a_base) != bool(t.b_base):
        raise ConfigError(f"{what}: a_base and b_base go together (each side's change from its own baseline)")
    if t.a_base and (t.a_seeds or t.b_seeds):
        raise ConfigError(f"{what}: a_seeds / b_seeds do not go with a_base and b_base; give each seed its own test")
    if t.minus is not None and t.over is not None:
        raise ConfigError(f"{what} takes over (a ratio of numbers) or minus (a difference of per-problem lists), not both")
    if t.expect in MARGIN_EXPECTS:
        if (t.margin is None) == (t.margin_of is None):
            raise ConfigError(f"{what}: expect = \"{t.expect}\" needs its margin, one of margin = 0.05 (in the metric's "
                              "units) or margin_of = { fraction = 0.5, run = \"...\" } (a share of a reference change)")
    elif t.margin is not None or t.margin_of is not None:
        raise ConfigError(f"{what}: a margin applies to expect = {', '.join(MARGIN_EXPECTS)} only (got '{t.expect}')")
    if t.margin is not None and t.margin < 0:
        raise ConfigError(f"{what}: margin must be >= 0 (got {t.margin})")
    if t.margin_of is not None:
        m = t.margin_of
        refs = [bool(m.run), bool(m.a or m.b), bool(m.file)]
        if m.fraction <= 0 or sum(refs) != 1 or bool(m.a) != bool(m.b):
            raise ConfigError(f"{what}: margin_of needs fraction > 0 and one reference: run = \"RUN\" (its change), "
                              "a and b (the change b − a) or file (a level)")


def check_claims(claims: ClaimsFile, where: str) -> None:
    """Per-kind checks ``config.from_dict`` cannot make: unique ids and names, the fields each kind needs and
    takes, margins, premises and what names them."""
    premise_ids: set[str] = set()
    for i, p in enumerate(claims.premise):
        name = f"{where}: premise {p.id or i + 1}"
        _check_premise(p, name, premise_ids, top=True)
    seen: set[str] = set()
    for i, c in enumerate(claims.claim):
        name = f"{where}: claim {c.id or i + 1}"
        if not c.id.strip() or not c.claim.strip():
            raise ConfigError(f"{name} needs an id and a one-line claim (id = \"C1\", claim = \"...\")")
        if c.id in seen:
            raise ConfigError(f"{name}: the id {c.id} is used twice; give each [[claim]] its own id")
        seen.add(c.id)
        own: set[str] = set()
        for j, p in enumerate(c.premise):
            _check_premise(p, f"{name} premise {p.id or j + 1}", own, top=False)
        gating = {p.id for p in c.premise if p.gates == "tests"}
        names: set[str] = set()
        for j, t in enumerate(c.test):
            what = f"{name} test {j + 1}"
            check_test(t, what)
            check_declaration(t, f"{what} '{t.name}'" if t.name else what)
            if t.name:
                if t.name in names:
                    raise ConfigError(f"{what}: the name '{t.name}' is used twice in {c.id}; give each test its own")
                names.add(t.name)
            unknown = [r for r in t.requires if r not in gating]
            if unknown:
                raise ConfigError(f"{what} requires '{unknown[0]}', which is no premise of {c.id} with gates = \"tests\" "
                                  f"(its premises: {', '.join(sorted(gating)) or 'none'})")
        if c.key and c.key not in names:
            raise ConfigError(f"{name}: key '{c.key}' names no test of {c.id}; set it to a test's name")


def _check_premise(p: Premise, name: str, ids: set[str], top: bool) -> None:
    if not p.id.strip():
        raise ConfigError(f"{name} needs an id (id = \"cd-grpo-seed1 kept its task\")")
    if p.id in ids:
        raise ConfigError(f"{name}: the id '{p.id}' is used twice; give each premise its own id")
    ids.add(p.id)
    check_test(p, name)
    p.failure = p.failure or (TRAINING_FAILED if top else PREMISE_ABSENT)
    if p.failure not in (TRAINING_FAILED, PREMISE_ABSENT):
        raise ConfigError(f"{name}: failure must be '{TRAINING_FAILED}' or '{PREMISE_ABSENT}' (got '{p.failure}')")
    if p.holds_when not in HOLDS:
        raise ConfigError(f"{name}: holds_when must be one of {', '.join(HOLDS)} (got '{p.holds_when}')")
    if top and not p.covers:
        raise ConfigError(f"{name} needs covers, the directories its failure takes out of the tests "
                          "(covers = [\"cd-grpo-seed1\", \"matched/cd-grpo-seed1\"])")
    if not top and p.covers:
        raise ConfigError(f"{name}: covers is for a [[premise]] (a run's); a claim's premise gates the claim or the "
                          "tests that require it (gates = \"claim\" or \"tests\")")
    if p.gates not in GATES:
        raise ConfigError(f"{name}: gates must be one of {', '.join(GATES)} (got '{p.gates}')")
    if p.context or p.requires or p.untestable:
        raise ConfigError(f"{name}: a premise takes neither context, requires nor untestable")


def load_claims(path: str | Path) -> ClaimsFile:
    """Load and check a claims file; every problem is a one-line ``ConfigError`` naming the file and the fix."""
    try:
        claims = config.from_dict(ClaimsFile, config.read_toml(path))
    except ConfigError as e:
        raise ConfigError(str(e) if str(path) in str(e) else f"{path}: {e}") from None
    check_claims(claims, str(path))
    return claims
