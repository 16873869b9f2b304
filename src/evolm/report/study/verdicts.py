"""Verdicts: what an interval (or a value against a threshold) says about a test, and what a claim's tests say.

Pure functions of numbers; the rules are the package docstring's (``evolm.report.study``).
"""

from __future__ import annotations

from typing import Sequence

REPRODUCED, CONTRADICTED, INCONCLUSIVE, NOT_RUN = "reproduced", "contradicted", "inconclusive at this scale", "not run"
TRAINING_FAILED, PREMISE_ABSENT = "training failed", "premise absent"
"""The two verdicts of a failed premise: a run that lost its task (its tests are not evidence either way), and a
claim whose precondition (e.g. a trade-off to combine) was not found here."""
UNTESTABLE = "untestable"
"""A test whose outcome its definition fixes (``testability``): shown with its number, never counted; a claim all
of whose tests are untestable reads it too."""
VERDICTS = (REPRODUCED, CONTRADICTED, INCONCLUSIVE, NOT_RUN, TRAINING_FAILED, PREMISE_ABSENT, UNTESTABLE)
"""Every verdict a test or a claim can get."""
GATED = (TRAINING_FAILED, PREMISE_ABSENT)
"""The verdicts of tests a failed premise took out of their claim's count."""

MARGIN_EXPECTS = ("not_down", "b_not_less", "equal")
"""The expectations judged against a declared margin (non-inferiority and equivalence)."""


def interval_verdict(expect: str, lo: float, hi: float, margin: float = 0.0) -> str:
    """The verdict of a difference with interval ``[lo, hi]`` (change: after − before; compare: b − a; contrast:
    (b − a) − (d − c)).

    Directional expectations (``up``, ``b_greater``, ``first_greater`` and their mirrors) need the interval to
    exclude 0. ``not_down`` / ``b_not_less`` (non-inferiority with ``margin`` m, in the metric's units) are
    reproduced when ``lo > −m`` and contradicted only when ``hi < −m``; ``equal`` (equivalence) is reproduced
    when the interval lies inside (−m, m) and contradicted only when it lies wholly beyond one end. The interval
    [0, 0] (no problem differs, so the resamples cannot differ either) bounds nothing: it never reproduces
    ``not_down`` or ``equal``. (Binary metrics get exact intervals, never [0, 0]: ``stats.paired_binary_interval``.)
    """
    if expect in ("up", "b_greater", "first_greater"):
        return REPRODUCED if lo > 0 else CONTRADICTED if hi < 0 else INCONCLUSIVE
    if expect in ("down", "a_greater", "second_greater"):
        return REPRODUCED if hi < 0 else CONTRADICTED if lo > 0 else INCONCLUSIVE
    if expect not in MARGIN_EXPECTS:
        raise ValueError(f"unknown expect '{expect}'")
    if margin < 0:
        raise ValueError(f"a margin is >= 0 (got {margin})")
    flat = lo == hi == 0
    if expect in ("not_down", "b_not_less"):
        return CONTRADICTED if hi < -margin else REPRODUCED if lo > -margin and not flat else INCONCLUSIVE
    if lo > margin or hi < -margin:
        return CONTRADICTED
    return REPRODUCED if -margin < lo and hi < margin and not flat else INCONCLUSIVE


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


def claim_verdict(verdicts: Sequence[str], family: Sequence[str] | None = None) -> str:
    """The verdict of a claim from its counted tests' 95% ``verdicts`` and their ``family``-wise ones (the same
    tests at the family-wise level; default: the 95% ones, a family of one): every test reproduced at 95% ->
    reproduced; any contradicted at the family-wise level -> contradicted; none run -> not run; else
    inconclusive at this scale. Tests a failed premise gated are not passed here (``measure.evaluate_claim``)."""
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
