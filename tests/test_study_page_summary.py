"""The committed page's summary (issue 40, items 1 and 5): the paper's claims counted apart from evolm's questions,
each row marked declared before or after its data, and the post-hoc changes beside their original verdicts."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MD = (ROOT / "docs" / "REPRODUCTION.md").read_text()


def _section(title: str) -> str:
    return MD.split(f"\n## {title}")[1].split("\n## ")[0]


def test_paper_claims_and_questions_are_counted_apart():
    table = _section("Verdicts")
    paper, ours = table.split("**evolm's own questions")
    assert "**The paper's claims** (9)" in paper
    assert [re.match(r"\| \[(\w+)\]", r).group(1) for r in paper.splitlines() if r.startswith("| [")] == \
        [f"C{i}" for i in range(1, 10)]
    assert all(re.match(r"\| \[Q", r) for r in ours.splitlines() if r.startswith("| ["))
    assert "| declared |" in paper.splitlines()[2] or "| declared |" in paper
    summary = _section("Summary")
    assert "the paper's claims (9):" in summary and "evolm's own questions (" in summary


def test_every_row_says_whether_it_was_declared_before_its_data():
    rows = [r for r in _section("Verdicts").splitlines() if r.startswith("| [")]
    assert rows and all(r.rstrip(" |").endswith(("before its data", "after its data", "changed after its data",
                                                  "not recorded")) for r in rows)


def test_c2_under_its_original_margin_reads_contradicted():
    pre = _section("Pre-registration: declared before or after the data")
    c2 = next(line for line in pre.splitlines() if line.startswith("- **C2**"))
    assert "verdict now **inconclusive at this scale**" in c2 and "as first declared: **contradicted**" in c2
    assert "0.016 nats" in c2
    assert re.search(r"\| C2 \| ES entropy, addition, 62 updates \|.*1/64 = 0.016.*\| reproduced \| contradicted \|", pre)
