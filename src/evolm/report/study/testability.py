"""Tests that can pass and can fail (issue 40, item 2): a test whose outcome its definition fixes is refused.

A verdict means something only if the data could have given the other one. Three definitions fix it:

- **A fraction-below threshold no noise walk can reach.** After T updates of a noise-dominated ES walk each
  coordinate is ~N(0, T r²), r one update's RMS, so the fraction of moved coordinates with |Δ| < m·r is
  ``erf(m / sqrt(2T))`` (``noise_walk_fraction``): at most ``erf(m / √2)`` (T = 1), 0.683 at m = 1. "More than
  0.776 below 1 x RMS" is then contradicted whatever ES did. A value test reading a fraction below τ declares
  ``noise_walk = { tau_rms = m, updates = T }`` (τ in RMS units, the updates behind the weights): the loader
  refuses ``>`` a threshold at or above ``erf(m / √2)`` (and ``<`` one at or below 0), and the page shows the
  walk's prediction beside the measured fraction.
- **An expected count below one in a top k.** With k × share < 1 no count can show depletion, and one coordinate
  is an enrichment of 1 / (k × share): norm weights are 0.026% of SmolLM2-135M, 0.026 of a top 100.
- **A margin below one problem's share.** An equivalence or non-inferiority margin m < 1 / problems is finer than
  one problem's flip: the evaluation cannot resolve it.

The first is known from the declaration (``fixed_by_definition``, checked when the claims file loads); the others
need the data (``fixed_by_data``, checked when the test is evaluated). Either way a test that is fixed is a
one-line ``ConfigError`` naming the fix, unless it declares ``untestable = "why it is kept"`` (tests declared
before this check, kept to show their numbers): it then reads "untestable", shown and not counted, and, like a
declared test that did not run, keeps its claim from "reproduced" (a claim whose every test is untestable reads
"untestable"). A test that declares ``untestable`` and is not fixed is refused too; a test a failed premise gated
keeps its gate's verdict.

Planted checks: ``tests/test_study_calibration.py``.
"""

from __future__ import annotations

import math

from evolm.errors import ConfigError


def noise_walk_fraction(tau_rms: float, updates: int) -> float:
    """The fraction of a noise walk's coordinates with |Δ| below ``tau_rms`` × one update's RMS after ``updates``
    updates: ``erf(tau_rms / sqrt(2 · updates))``."""
    return math.erf(tau_rms / math.sqrt(2 * updates))


def noise_walk_bound(tau_rms: float) -> float:
    """The most any noise walk puts below ``tau_rms`` × one update's RMS (after one update): ``erf(tau_rms / √2)``."""
    return noise_walk_fraction(tau_rms, 1)


def fixed_by_definition(test) -> str:
    """Why ``test``'s outcome is fixed by its declaration alone (empty: it is not)."""
    walk = getattr(test, "noise_walk", None)
    if test.kind != "value" or walk is None or test.threshold is None:
        return ""
    bound = noise_walk_bound(walk.tau_rms)
    if test.expect == ">" and test.threshold >= bound:
        return (f"a fraction above {test.threshold:g} below {walk.tau_rms:g} x one update's RMS: no noise walk reaches it "
                f"(at most erf({walk.tau_rms:g}/√2) = {bound:.3f}, after one update; "
                f"{noise_walk_fraction(walk.tau_rms, walk.updates):.3f} after {walk.updates})")
    if test.expect == "<" and test.threshold <= 0:
        return f"a fraction below {test.threshold:g}: no fraction is"
    return ""


def fixed_by_data(test, outcome) -> str:
    """Why ``test``'s outcome is fixed once its files are read (``outcome``: its measured ``Outcome``); empty: not."""
    expected = getattr(outcome, "expected_count", None)
    if expected is not None and expected < 1:
        return (f"an expected count of {expected:.3g} (< 1) in a top k: no count can show depletion, and one "
                f"coordinate reads {1 / expected:.3g}x" if expected > 0 else "an expected count of 0 in a top k")
    if outcome.margin is not None and outcome.problems:
        share = 1 / outcome.problems
        if outcome.margin < share:
            return (f"a margin of {outcome.margin:.3g}, below one problem's share 1/{outcome.problems} = {share:.3g}: "
                    "finer than the evaluation resolves")
    return ""


def refusal(where: str, why: str) -> ConfigError:
    """The one-line error for a test whose outcome is fixed."""
    return ConfigError(f"{where}: its outcome is fixed by its definition ({why}); change the test, or keep it shown "
                       "and not counted with untestable = \"why it is kept\"")


def check_declaration(test, where: str) -> None:
    """Load time: refuse a test fixed by its declaration unless it declares ``untestable``; refuse a noise walk that
    is not a walk."""
    walk = getattr(test, "noise_walk", None)
    if walk is not None:
        if test.kind != "value":
            raise ConfigError(f"{where}: noise_walk is for value tests of a fraction below τ (got kind {test.kind})")
        if walk.tau_rms <= 0 or walk.updates < 1:
            raise ConfigError(f"{where}: noise_walk needs tau_rms > 0 (τ in units of one update's RMS) and updates >= 1 "
                              f"(got {walk.tau_rms}, {walk.updates})")
    elif test.kind == "value" and "fraction_below" in test.path.split("."):
        raise ConfigError(f"{where} reads a fraction below τ: declare its noise walk, noise_walk = {{ tau_rms = 1.0, "
                          "updates = 62 } (τ in units of one update's RMS, the updates behind the weights)")
    why = fixed_by_definition(test)
    if why and not test.untestable:
        raise refusal(where, why)


def mark(where: str, test, outcome, untestable: str) -> None:
    """Evaluation time: a test whose outcome its definition or its data fix reads "untestable" (its measured
    verdict kept in ``measured``) when it declares ``untestable``; else the one-line refusal. A test that declares
    ``untestable`` and is not fixed is refused too."""
    from evolm.report.study.verdicts import GATED, NOT_RUN

    if outcome.verdict == NOT_RUN or outcome.verdict in GATED:  # not counted either way; a gate says more
        return
    why = fixed_by_definition(test) or fixed_by_data(test, outcome)
    if not why:
        if test.untestable:
            raise ConfigError(f"{where} declares untestable, but its outcome is not fixed by its definition: drop untestable")
        return
    if not test.untestable:
        raise refusal(where, why)
    outcome.measured, outcome.verdict, outcome.untestable = outcome.measured or outcome.verdict, untestable, why
