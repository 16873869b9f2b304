"""The study page's first screen: the summary, one row per claim, and a short section per claim (issue 40, item 5).

A researcher reads ``REPRODUCTION.md`` in a minute: the paper's claims (C1-C9) counted apart from evolm's own
questions (Q*), then one table row per claim with its verdict, its scale (model, N, updates, seeds: the claim's
``scale``) and whether its tests were declared before their data; a claim whose tests changed after their data
says so and shows its verdict as first declared, linked to its page's side-by-side table. Below the table, each
claim gets a few lines (verdict and why, key number, what the paper reports) and a link to its own page under
``study/page/`` (``evolm.report.study.page``), where its tests, figure, evaluations and command are.

Design decisions:

- Every line stays under ``MAX_LINE`` characters and the page under ``MAX_BYTES``: long text (the pending notes,
  the twin check, the runs, the analyses) lives on the linked pages, and a summary line that would be too long is
  an error naming what to shorten rather than a silently longer page.
- The table row links to the claim's page, not to a heading anchor (a claim's anchor is as long as its claim).
"""

from __future__ import annotations

from evolm.document import Section, Table
from evolm.embedded import EMBEDDED
from evolm.report.read import Sources
from evolm.report.study.claims import ClaimsFile
from evolm.report.study.measure import ClaimOutcome, StudyOutcome
from evolm.report.study.preregistration import Declared
from evolm.report.study.verdicts import (CONTRADICTED, INCONCLUSIVE, NOT_RUN, PREMISE_ABSENT, REPRODUCED, TRAINING_FAILED,
                                         UNTESTABLE)
from evolm.report.study.words import key_number, why

PAGES = "study/page"
"""Where the linked pages go, under ``--out`` (and how the page links them)."""
SUMMARY_LINES = 10
"""The summary's most lines."""
MAX_LINE = 400
"""The longest line the page may hold (characters)."""
MAX_BYTES = 40 * 1024
"""The page's largest size: the rest goes to the linked pages."""
ORDER = (REPRODUCED, CONTRADICTED, INCONCLUSIVE, PREMISE_ABSENT, TRAINING_FAILED, UNTESTABLE, NOT_RUN)
"""Verdicts in the order the summary counts them."""
DECLARED_SECTION = "Declared before or after the data"
"""The heading of a claim page's pre-registration section (the summary row links to it)."""


def is_paper_claim(o: ClaimOutcome) -> bool:
    """The paper's claims (C1-C9) are counted apart from evolm's own questions (Q*)."""
    return not o.claim.id.startswith("Q")


def page_link(claim_id: str, anchor: str = "") -> str:
    """A claim's page, relative to ``REPRODUCTION.md``."""
    return f"{PAGES}/{claim_id}.md" + (f"#{anchor}" if anchor else "")


def anchor_of(heading: str) -> str:
    """The GitHub anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return "".join(c for c in heading.lower().replace(" ", "-") if c.isalnum() or c in "-_")


def counted(outcomes: list[ClaimOutcome]) -> str:
    """``0 reproduced, 2 contradicted (C1, C6), 5 inconclusive at this scale (C2, ...)``: reproduced always shown."""
    parts = []
    for v in ORDER:
        ids = [o.claim.id for o in outcomes if o.verdict == v]
        if ids or v == REPRODUCED:
            parts.append(f"{len(ids)} {v}" + (f" ({', '.join(ids)})" if ids else ""))
    return ", ".join(parts)


def bases_line(src: Sources) -> str:
    """The models the runs start from, what their files are and the dtype they ran in (from the run files)."""
    models: dict = {}
    for r in src.runs:
        m = r.config.get("model") or {}
        models.setdefault(m.get("spec"), set()).add(m.get("dtype"))
    parts = []
    for spec, dtypes in models.items():
        known = EMBEDDED.get(spec)
        what = known.description.split(" (")[0] + ", " + known.description.rsplit(", ", 1)[-1] if known else spec
        parts.append(f"{what} ({spec}), run in {'/'.join(sorted(d for d in dtypes if d))}")
    quantised = all(spec in EMBEDDED for spec in models)
    note = " — 4-bit GGUF files dequantised to float32 on load, so every weight starts on the 4-bit grid" if quantised and models else ""
    return f"**Bases**: {'; '.join(parts) or 'none read'}{note}."


def summary_section(claims: ClaimsFile, study: StudyOutcome, src: Sources, twins: str | None,
                    pre: Declared | None = None) -> Section:
    """At most ``SUMMARY_LINES`` lines: the verdicts (the paper's apart from evolm's), pre-registration, bases, scale,
    failed runs, twins (``twins``: one short line, or None) and where the rest is."""
    paper = [o for o in study.claims if is_paper_claim(o)]
    ours = [o for o in study.claims if not is_paper_claim(o)]
    lines = []
    if paper:
        lines.append(f"**The paper's claims** ({len(paper)}: {paper[0].claim.id}-{paper[-1].claim.id}): {counted(paper)}.")
    if ours:
        lines.append(f"**evolm's own questions** ({len(ours)}, not the paper's claims): {counted(ours)}.")
    if pre is not None:
        moved = [f"{cid} ({_first(v)})" for cid, v in pre.first.items()
                 if v != next(o.verdict for o in study.claims if o.claim.id == cid)]
        lines.append("**Pre-registration**: " + ", ".join(f"{n} tests {k.replace(' its ', ' their ')}" for k, n in pre.counts.items())
                     + f" ([record]({PAGES}/preregistration.md)); verdict as first declared where it differs: "
                     + (", ".join(moved) or "none")
                     + ("" if not pre.method else "; under the bootstrap binary contrasts had before their exact intervals: "
                        + (", ".join(f"{cid} ({_first(v)})" for cid, v in pre.method.items()
                                     if v != next(o.verdict for o in study.claims if o.claim.id == cid)) or "none"))
                     + ".")
    lines.append(bases_line(src))
    if claims.study.scale:
        lines.append(f"**Scale**: {claims.study.scale.strip()}")
    failed = [p for p in study.premises if p.holds is False]
    if failed:
        names = ", ".join(p.premise.run or p.premise.b.split("/")[-2] for p in failed)
        lines.append(f"**Runs that lost their task** (pass@1 fell; {TRAINING_FAILED}, not evidence either way): {names}.")
    if twins is not None:
        lines.append(f"**Commutative twins** (arithmetic): {twins}")
    if claims.study.pending:
        lines.append(f"**Pending**: {len(claims.study.pending)} note{'s' if len(claims.study.pending) > 1 else ''} on what is "
                     f"still to run or recompute ([pending]({PAGES}/runs.md#pending)).")
    lines.append(f"**Reading it**: one row per claim below, then a few lines per claim and its own page (tests, figure, "
                 f"evaluations, command); [what was run]({PAGES}/runs.md), [analyses and sweeps]({PAGES}/analyses.md), "
                 f"[how the verdicts are reached]({PAGES}/runs.md#how-the-verdicts-are-reached).")
    if len(lines) > SUMMARY_LINES:
        raise ValueError(f"the summary has {len(lines)} lines; at most {SUMMARY_LINES}")
    long = [line for line in lines if len(line) + 2 > MAX_LINE]
    if long:
        raise ValueError(f"a summary line has {len(long[0]) + 2} characters (at most {MAX_LINE}); shorten it: {long[0][:80]}...")
    return Section("Summary", ["\n".join(f"- {line}" for line in lines)])


def _first(verdict: str) -> str:
    """A verdict as first declared, without the reason it could not be computed (the claim's page has it)."""
    return verdict.split(" (")[0]


def declared_cell(o: ClaimOutcome, pre: Declared | None) -> str:
    """Whether a claim's tests were declared before their data; a changed one with its verdict as first declared."""
    if pre is None:
        return "not recorded"
    status = pre.claims.get(o.claim.id, "not recorded")
    if status == "changed":
        first = _first(pre.first.get(o.claim.id, "not computed"))
        return (f"changed after its data; as first declared: **{first}** "
                f"([side by side]({page_link(o.claim.id, anchor_of(DECLARED_SECTION))}))")
    return {"before": "before its data", "after": "after its data"}.get(status, status)


def summary_table(study: StudyOutcome, pre: Declared | None = None) -> Section:
    """One row per claim, the paper's claims and evolm's questions in two tables: id (linked to its page), the claim
    in a few words, verdict, scale and whether its tests were declared before their data."""
    columns = ["claim", "in a few words", "verdict", "scale (model, N, updates, seeds)", "declared"]

    def row(o: ClaimOutcome) -> list[str]:
        return [f"[{o.claim.id}]({page_link(o.claim.id)})", o.claim.short or o.claim.claim, f"**{o.verdict}**",
                o.claim.scale or "not stated", declared_cell(o, pre)]

    paper = [o for o in study.claims if is_paper_claim(o)]
    ours = [o for o in study.claims if not is_paper_claim(o)]
    blocks: list = []
    for outcomes, what in ((paper, "The paper's claims"), (ours, "evolm's own questions (not the paper's claims)")):
        if outcomes:
            blocks += [f"**{what}** ({len(outcomes)})", Table(columns, [row(o) for o in outcomes])]
    return Section("Verdicts", blocks)


def claim_title(o: ClaimOutcome) -> str:
    return f"{o.claim.id}: {o.claim.claim}"


def claim_brief(o: ClaimOutcome) -> Section:
    """A few lines per claim on the first page: verdict and why, key number, the paper's report, its page."""
    c = o.claim
    blocks: list = [f"**Verdict: {o.verdict}** — {why(o)}."]
    number = key_number(o)
    if number != "–" and o.verdict != NOT_RUN:
        blocks.append(f"**Key number** (95% interval): {number}")
    if c.paper:
        blocks.append(f"**Paper**: {c.paper}")
    blocks.append(f"**Its tests, figure, evaluations and command**: [{c.id}]({page_link(c.id)})")
    return Section(claim_title(o), blocks)


__all__ = ["PAGES", "MAX_LINE", "MAX_BYTES", "SUMMARY_LINES", "DECLARED_SECTION", "is_paper_claim", "page_link",
           "anchor_of", "summary_section", "summary_table", "claim_brief", "claim_title", "bases_line"]
