"""The reproduction study (``evolm report --study``): its claims file, tests, verdicts and page.

``experiments/study/claims.toml`` holds one ``[[claim]]`` per claim of "Understanding Evolution Strategies for LLM
Reasoning" (arXiv 2608.27351) and per open question, each with the command that tests it and ``[[claim.test]]``
entries naming the committed files that decide it. The package has one module per job:

- ``claims``: the claims file's dataclasses (``ClaimsFile``, ``Claim``, ``ClaimTest``, ``Premise``: a docstring
  per field), loading and per-kind checks (``load_claims``).
- ``stats``: pure statistics: per-problem values with repeated problems pooled, the paired and stratified
  bootstrap, exact intervals for binary metrics (``scipy.stats``), the family-wise level.
- ``verdicts``: what an interval or a value says (``interval_verdict``, ``value_verdict``) and what a claim's
  counted tests say (``claim_verdict``).
- ``measure``: reading a test's files, pairing them problem by problem, premises and the claims' verdicts
  (``evaluate_study``).
- ``testability``: which tests cannot pass or cannot fail by their definition (refused, or marked "untestable").
- ``words``: one line per test, the verdict table's short cells.
- ``preregistration``: when each test was declared against when its data existed (git history, recorded in
  ``experiments/study/preregistration.json``), and every changed test's verdict as first declared.
- ``summary``: the first screen of ``docs/REPRODUCTION.md``: the paper's claims counted apart from evolm's questions,
  one row per claim (verdict, scale, declared before its data), a few lines per claim.
- ``page`` and ``figures``: ``docs/REPRODUCTION.md`` and its linked pages under ``docs/study/page/`` (``build_study``),
  and the small-multiple pass@k figures.

Four kinds of test:

- ``change``: a run's ``eval_after.json`` against its ``eval_before.json`` on one metric; with ``seeds``, the same
  change of several runs of the method (each on its own held-out problems), as one test of the method.
- ``compare``: two evaluation files (``a``, ``b``) measured on the same problems (b − a); ``a_seeds`` / ``b_seeds``
  add other seeds of a side on the same problems (the side is their per-problem mean); with ``a_base`` and
  ``b_base``, the two sides' changes from their own baselines, (b − b_base) − (a − a_base) per problem.
- ``contrast``: two gaps measured on two different problem sets, (b − a) − (d − c).
- ``value``: one number or enrichment record in an analysis JSON, optionally divided by a second number (``over``),
  against a threshold; or a per-problem list, optionally minus a second list of the same problems (``minus``),
  whose mean gets a bootstrap interval.

Statistics (``stats``; pure functions over what was read):

- Per problem: unbiased pass@k from the problem's ``n`` and ``c``; entropy = the mean of its samples' ``entropy``;
  greedy = ``greedy_correct`` as 0 or 1. A problem id that appears on several rows of one evaluation (a generated
  task repeats problems once its split runs dry: procedural Countdown's 64 rows hold 52-59 distinct problems) is
  one problem: its rows are pooled, n and c summed, the entropies joined, greedy the mean of its rows
  (``pooled_problems``). Counts of problems are distinct problems.
- Paired bootstrap over problems: the two files must hold the same problem ids (else a one-line error naming both
  files); the per-problem differences b − a (change: after − before) are resampled with replacement 2000 times
  with seed 0, and the 95% percentile interval of the resampled mean is reported with the observed mean
  difference. Problems missing the metric on either side (no entropy recorded) are left out.
- Binary per-problem metrics (greedy; any metric whose per-problem values on both sides are all 0 or 1) get an
  exact interval instead (``paired_binary_interval``): the exact unconditional interval of the difference of the
  two discordance rates (the score test inverted, its p maximised over the discordance rate); McNemar's exact p is
  reported. It is never of zero width: "0 of 64 problems differ" still allows a difference of ±0.058 at 95%.
- Several seeds (``seeds``): the estimate is the mean over runs of each run's mean change; runs on the same
  problems are averaged per problem and resampled together, runs on different problems are resampled on their own
  (``stratified_interval``). Per run, its own change and interval are shown beside.
- A contrast pairs within each set and resamples the two sets independently (``contrast_interval``).
- Binary contrasts get exact intervals, never a bootstrap: when every file a test reads is 0 or 1 per problem, a sum
  of paired differences (a contrast's two gaps, a change against another change, several seeds pooled) gets each
  difference's exact interval at 1 − α/m, summed by interval arithmetic (``combined_exact_interval``; Bonferroni, so
  its coverage is at least 95% whatever the rates and the dependence between the differences).

Verdicts (``verdicts``):

- A test: "reproduced" when its interval excludes 0 in the expected direction, "contradicted" when it excludes 0 in
  the opposite one, "inconclusive at this scale" otherwise. ``not_down`` / ``b_not_less`` (non-inferiority) and
  ``equal`` (equivalence) are judged against the test's declared margin m (``margin``, in the metric's units, or
  ``margin_of``, a fraction of a named reference: a run's change, the change between two files, or a file's
  level): ``not_down`` is reproduced when the lower end is above −m, contradicted only when the upper end is below
  −m; ``equal`` is reproduced when the interval lies inside (−m, m), contradicted only when it lies wholly beyond
  one end. The interval [0, 0] never reproduces either.
- Value tests report an analysis's own uncertainty, never a bare count: a top-k count enrichment with its exact
  interval (reproduced when it clears the threshold, contradicted when it lies on the other side); a share-of-‖Δ‖²
  enrichment with the permutation null's interval; a plain number (a relative distance, a ratio, a fraction of
  coordinates) measures one run's weights exactly and is compared directly ("exact (one run)"); a per-problem list
  gets the bootstrap interval of its mean.
- Premises: a ``[[premise]]`` is a test a run must pass for its files to count (e.g. "its pass@1 did not fall": a
  run that lost its task is a training failure, not evidence for or against a claim); when it fails, every test
  reading a directory it ``covers`` drops that run (a test left with no run of one side reads "training failed"
  and is not counted). A ``[[claim.premise]]`` is a precondition of one claim (e.g. "there is a trade-off to
  combine"); when it fails, the claim reads "premise absent" (``gates = "claim"``) or the tests that ``require``
  it do (``gates = "tests"``). A premise holds when its test is reproduced (``holds_when = "reproduced"``) or not
  contradicted (``"not_contradicted"``), at 95%. Gated tests keep their numbers on the page, with what their
  interval said.
- "not run" when the claim or test sets ``not_run`` or an input file is missing.
- "untestable" (``testability``): a test whose outcome its definition fixes (a fraction-below threshold no noise walk
  reaches, an expected top-k count below one, a margin below one problem's share) is refused when the study loads,
  unless it declares ``untestable = "why it is kept"``: then it is shown with its number, not counted, and keeps its
  claim from "reproduced"; a claim whose every test is untestable reads "untestable". A top-k count is read with the
  tie at the k-th value split evenly (``tie_split``), never as the tied set's size; a dtype-null record from the old
  null (step counts shuffled across spacings) is stale and reads "not run".
- A claim's verdict (``claim_verdict``) counts its tests except the ``context`` ones and the gated ones. It is
  reproduced when every counted test is reproduced at 95% (an intersection-union test), contradicted when some
  counted test is contradicted at the claim's family-wise level 1 − 0.05 / m (Bonferroni over its m counted tests:
  the same intervals at that level, 20,000 bootstrap resamples, a top-k enrichment's exact interval there, the
  share enrichment's null widened from its z; an exact number keeps its verdict), "not run" when none ran, the
  premise's failure when a claim premise failed (or every test was gated), and inconclusive at this scale
  otherwise.

Design decisions:

- The claims file is a typed dataclass loaded like every evolm config (``config.from_dict``: unknown fields with
  a did-you-mean, types checked), then checked per kind (``check_claims``).
- Files are read through a callable the caller passes (the report's ``Reader``, which lists every file read at
  the end of the page); nothing but the page writes.
- Paths in tests are relative to the study's data directory (``study.data``, default ``docs/study``): the
  committed copies of run directories (no weights) and analysis outputs.
"""

from __future__ import annotations

from evolm.report.study.claims import (EXAMPLES, EXPECTS, OPTIONAL, REQUIRED, Claim, ClaimsFile, ClaimTest, MarginRef,
                                       Premise, StudySettings, ValueRef, check_claims, load_claims, parse_metric)
from evolm.report.study.measure import (ClaimOutcome, Level, Outcome, PremiseOutcome, StudyOutcome, evaluate_claim,
                                        evaluate_claims, evaluate_premise, evaluate_study, evaluate_test, files_of,
                                        label_of, lookup, resolve_margin, task_report)
from evolm.report.study.stats import (BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, FAMILY_RESAMPLES, LEVEL, ROUND_DIGITS,
                                      bootstrap_curve, bootstrap_interval, combined_exact_interval, contrast_interval,
                                      count_interval, exact_proportion_interval, family_level, null_interval,
                                      paired_binary_interval, pooled_problems, problem_values, stratified_interval)
from evolm.report.study.testability import fixed_by_data, fixed_by_definition, noise_walk_bound, noise_walk_fraction
from evolm.report.study.verdicts import (CONTRADICTED, GATED, INCONCLUSIVE, MARGIN_EXPECTS, NOT_RUN, PREMISE_ABSENT,
                                         REPRODUCED, TRAINING_FAILED, UNTESTABLE, VERDICTS, claim_verdict,
                                         interval_verdict, value_verdict)
from evolm.report.study.words import describe, describe_premise, family_note, key_number, why

__all__ = [
    "EXAMPLES", "EXPECTS", "OPTIONAL", "REQUIRED", "Claim", "ClaimsFile", "ClaimTest", "MarginRef", "Premise",
    "StudySettings", "ValueRef", "check_claims", "load_claims", "parse_metric",
    "ClaimOutcome", "Level", "Outcome", "PremiseOutcome", "StudyOutcome", "evaluate_claim", "evaluate_claims",
    "evaluate_premise", "evaluate_study", "evaluate_test", "files_of", "label_of", "lookup", "resolve_margin",
    "task_report",
    "BOOTSTRAP_RESAMPLES", "BOOTSTRAP_SEED", "FAMILY_RESAMPLES", "LEVEL", "ROUND_DIGITS", "bootstrap_curve",
    "bootstrap_interval", "combined_exact_interval", "contrast_interval", "count_interval", "exact_proportion_interval",
    "family_level", "null_interval", "paired_binary_interval", "pooled_problems", "problem_values", "stratified_interval",
    "CONTRADICTED", "GATED", "INCONCLUSIVE", "MARGIN_EXPECTS", "NOT_RUN", "PREMISE_ABSENT", "REPRODUCED",
    "TRAINING_FAILED", "UNTESTABLE", "VERDICTS", "claim_verdict", "interval_verdict", "value_verdict",
    "describe", "describe_premise", "family_note", "key_number", "why",
    "fixed_by_data", "fixed_by_definition", "noise_walk_bound", "noise_walk_fraction",
]
