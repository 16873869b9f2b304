"""Tests and claims in words: one line per test (``describe``), the short cells of the verdict table
(``key_number``, ``why``)."""

from __future__ import annotations

from evolm.report.study.measure import ClaimOutcome, Outcome, PremiseOutcome
from evolm.report.study.stats import LEVEL
from evolm.report.study.verdicts import (CONTRADICTED, GATED, INCONCLUSIVE, NOT_RUN, REPRODUCED, TRAINING_FAILED,
                                         UNTESTABLE)


def _signed(x: float) -> str:
    return f"{x:+.3f}"


def _g(x: float | None) -> str:
    return "–" if x is None else f"{x:.3g}"


def interval_text(r: Outcome) -> str:
    """``+0.416 [+0.320, +0.510]`` (a value test: ``40.3`` or ``2.1 [1.4, 2.9]``); empty when nothing was measured."""
    if r.estimate is None:
        return ""
    if r.kind == "value" and r.problems is None:
        if r.interval is not None:
            return f"{_g(r.estimate)} [{_g(r.interval[0])}, {_g(r.interval[1])}]"
        if r.null is not None:
            return f"{_g(r.estimate)} (null {_g(r.null[0])}–{_g(r.null[1])})"
        return _g(r.estimate)
    return f"{_signed(r.estimate)} [{_signed(r.interval[0])}, {_signed(r.interval[1])}]"


def describe(r: Outcome) -> str:
    """One test's result in words, e.g. ``c1c2-grpo pass@1 0.191 → 0.492: +0.301 [+0.252, +0.350] (64 problems;
    expected up): reproduced``; a test against a margin names it, a gated test says which premise failed, a context
    test says it is not counted, and a contradicted test of a claim with several says whether it stays
    contradicted at the claim's family-wise level (``family_note``)."""
    return _describe(r) + family_note(r) + seeds_note(r)


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


def seeds_note(r: Outcome) -> str:
    """``; per run: c1c2-grpo +0.416, c1-grpo-seed1 +0.604 (dropped: training failed ...)`` for a test over seeds."""
    if not r.seeds:
        return ""
    parts = []
    for s in r.seeds:
        number = f" {_signed(s['estimate'])}" if s.get("estimate") is not None else ""
        parts.append(f"{s['label']}{number}" + (f" (left out: {s['dropped']})" if s.get("dropped") else ""))
    return "; per run: " + ", ".join(parts)


def exact_terms_note(r: Outcome) -> str:
    """``exact: 2 paired differences' exact 97.5% intervals summed (Bonferroni), discordant 1 vs 0 of 64, 0 vs 1 of 23``
    for an interval made by ``stats.combined_exact_interval``."""
    t = r.exact_terms
    counts = ", ".join(f"{x['n01']} vs {x['n10']} of {x['problems']}" for x in t)
    return (f"exact: {len(t)} paired differences' exact {100 * t[0]['level_each']:.4g}% intervals summed (Bonferroni), "
            f"discordant {counts}")


def _margin(r: Outcome) -> str:
    return f"; margin {r.margin_note}" if r.margin_note and r.margin is not None else ""


def _verdict(r: Outcome) -> str:
    if r.verdict == UNTESTABLE:
        return f"**{UNTESTABLE}** ({r.untestable}; measured: {r.measured}; not counted)"
    if r.verdict in GATED:
        return f"**{r.verdict}** ({r.gate}; measured: {r.measured})" if r.measured else f"**{r.verdict}** ({r.gate})"
    return r.verdict


def _describe(r: Outcome) -> str:
    title = r.name or r.label
    if r.verdict == NOT_RUN:
        return f"{title}: not run ({r.detail})" if r.detail else f"{title}: not run"
    if r.kind == "contrast" and r.estimate is not None:
        how = exact_terms_note(r) if r.exact_terms else "each set resampled on its own"
        return (f"{title}: first gap {_signed(r.a)}, second gap {_signed(r.b)}; difference {interval_text(r)} "
                f"({r.detail}, {how}; expected {r.expect.replace('_', ' ')}): {_verdict(r)}")
    if r.kind in ("change", "compare") and r.estimate is not None:
        arrow = f"{r.a:.3f} → {r.b:.3f}" if r.kind == "change" else f"a {r.a:.3f}, b {r.b:.3f}"
        diff = "after − before" if r.kind == "change" else "b − a"
        if r.kind == "compare" and r.label.split(" of ", 1)[-1].startswith("("):  # (b − b_base) − (a − a_base)
            arrow, diff = f"a − a_base {_signed(r.a)}, b − b_base {_signed(r.b)}", "difference in changes"
        how = ""
        if r.method == "exact":
            how = f"; exact, {r.discordant[0]} vs {r.discordant[1]} discordant, McNemar p {r.p:.2g}"
        elif r.exact_terms:
            how = "; " + exact_terms_note(r)
        elif r.method == "stratified bootstrap":
            how = f"; {len([s for s in r.seeds if not s.get('dropped')])} runs, each resampled on its own"
        return (f"{title} {arrow}: {diff} {interval_text(r)} ({r.problems} problems{how}; expected "
                f"{r.expect.replace('_', ' ')}{_margin(r)}): {_verdict(r)}")
    if r.kind == "value" and r.estimate is not None:
        criterion = f"expected {r.expect} {r.threshold:g}"
        shown = title
        if r.method.startswith("t over") and r.interval is not None:  # a number per seed: t over the seeds
            return f"{shown}: {interval_text(r)} (mean, 95% {r.method}; {r.detail}; {criterion}): {_verdict(r)}"
        if r.problems is not None and r.interval is not None:  # a per-problem list (minus a second one)
            means = f"; means {r.a:.3f} − {r.b:.3f}" if r.a is not None and r.b is not None else ""
            return (f"{shown}: {interval_text(r)} (mean over {r.problems} problems, 95% bootstrap{means}; "
                    f"{criterion}): {_verdict(r)}")
        if r.interval is not None:
            p = f", p {r.p:.3g}" if r.p is not None else ""
            return (f"{shown}: enrichment {_g(r.estimate)} [{_g(r.interval[0])}, {_g(r.interval[1])}] (exact 95%; "
                    f"{r.detail}{p}; {criterion}): {_verdict(r)}")
        if r.null is not None:
            p = f", p {r.p:.3g}" if r.p is not None else ""
            return (f"{shown}: enrichment {_g(r.estimate)}, null 95% {_g(r.null[0])}–{_g(r.null[1])} ({r.detail}{p}; "
                    f"{criterion}): {_verdict(r)}")
        ratio = f" = {_g(r.a)} / {_g(r.b)}" if r.a is not None and r.b is not None else ""
        walk = f"; {r.detail}" if r.detail else ""
        return f"{shown}: {_g(r.estimate)}{ratio} (exact, one run{walk}; {criterion}): {_verdict(r)}"
    return f"{title}: {r.verdict} ({r.detail})"


def describe_premise(p: PremiseOutcome) -> str:
    """A premise and whether it held, e.g. ``cd-grpo-seed1 kept its task: fails (training failed): ...``."""
    state = "holds" if p.holds else "not run" if p.holds is None else f"fails ({p.premise.failure})"
    when = "reproduced" if p.premise.holds_when == "reproduced" else "not contradicted"
    why = f" {p.premise.why}" if p.premise.why else ""
    return f"**{p.premise.id}** (holds when its test is {when}): {state}.{why} Measured: {_describe(p.outcome)}"


# -- the verdict table's cells -------------------------------------------------------------------------------


def key_number(o: ClaimOutcome) -> str:
    """The key test's name and number with its interval, e.g. ``GRPO pass@16, 3 seeds: +0.23 [+0.15, +0.31]``; when
    its own verdict is not the claim's (the failed premise of a gated claim), the line says which it is and its own
    verdict (the key test bears out the claim's verdict: ``measure.decides``)."""
    r = o.key
    if r is None or r.estimate is None:
        return "–"
    what = r.name or r.label
    if r.verdict == o.verdict or o.verdict == NOT_RUN:
        return f"{what}: {interval_text(r)}"
    role = "the claim's premise, which failed; its test" if any(p.outcome is r for p in o.premises) else "this test"
    return f"{what}: {interval_text(r)} ({role}: {r.verdict})"


def why(o: ClaimOutcome) -> str:
    """One short reason for the claim's verdict, from its tests' verdicts."""
    counted = [r for r in o.tests if r.counted]
    gated = [r for r in o.tests if r.verdict in GATED and not r.context]
    failed_runs = sum(r.verdict == TRAINING_FAILED for r in gated)
    absent = len(gated) - failed_runs
    left_out = ((f"; {failed_runs} test{'s' if failed_runs != 1 else ''} of runs that lost the task left out" if failed_runs else "")
                + (f"; {absent} test{'s' if absent != 1 else ''} without {'their' if absent != 1 else 'its'} premise left out"
                   if absent else ""))
    failed = next((p for p in o.premises if p.holds is False and p.premise.gates == "claim"), None)
    untestable = sum(r.verdict == UNTESTABLE and not r.context for r in o.tests)
    left_out += f"; {untestable} untestable test{'s' if untestable != 1 else ''} not counted" if untestable else ""
    if o.verdict == NOT_RUN:
        return o.claim.not_run or "no test ran"
    if o.verdict == UNTESTABLE:
        return f"every test's outcome is fixed by its definition ({untestable} untestable)"
    if failed is not None:
        return f"premise '{failed.premise.id}' not found ({failed.outcome.verdict}); no test counted"
    if not counted and gated:
        return f"every counted test read runs that failed ({gated[0].gate})"
    n = len(counted)
    reproduced = sum(r.verdict == REPRODUCED for r in counted)
    if o.verdict == REPRODUCED:
        return f"all {n} counted test{'s' if n != 1 else ''} reproduced{left_out}"
    if o.verdict == CONTRADICTED:
        against = [r for r in counted if r.verdict == CONTRADICTED and r.family_verdict == CONTRADICTED]
        names = " and ".join(f"'{r.name or r.label}'" for r in against[:2]) + (f" and {len(against) - 2} more" if len(against) > 2 else "")
        level = " at the family-wise level" if n > 1 else ""
        return f"contradicted{level} by {names} ({len(against)} of {n} counted tests); {reproduced} reproduced{left_out}"
    inconclusive = sum(r.verdict == INCONCLUSIVE for r in counted)
    wrong = sum(r.verdict == CONTRADICTED for r in counted)
    extra = f", {wrong} contradicted at 95% only" if wrong else ""
    return f"{reproduced} of {n} counted tests reproduced, {inconclusive} inconclusive{extra}{left_out}"
