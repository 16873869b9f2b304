"""The committed page a researcher reads in a minute (issue 40, items 1 and 5): the paper's claims counted apart from
evolm's questions, one row per claim with its scale and whether its tests were declared before their data, every
post-hoc change beside its verdict as first declared, the rest on linked pages; under 40 KB, no line over 400
characters, every link resolving."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from evolm.report.study.summary import MAX_BYTES, MAX_LINE

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "REPRODUCTION.md"
PAGES = ROOT / "docs" / "study" / "page"
MD = PAGE.read_text()
CLAIMS = tomllib.loads((ROOT / "experiments" / "study" / "claims.toml").read_text())["claim"]
MODEL_NAMES = {"smollm2-135m": "SmolLM2-135M", "gemma3-270m": "Gemma-3-270M"}
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def _section(title: str, text: str = MD) -> str:
    return text.split(f"\n## {title}")[1].split("\n## ")[0]


def _rows(text: str) -> list[str]:
    return [r for r in text.splitlines() if r.startswith("| [")]


def _anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _broken(page: Path) -> list[str]:
    text = page.read_text()
    out = [f"{t} (no such image)" for t in _IMAGE.findall(text) if not (page.parent / t).exists()]
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            out.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md":
            heads = {_anchor(h) for h in re.findall(r"^#+ (.+)$", resolved.read_text(), re.M)}
            if anchor not in heads:
                out.append(f"{target} (no heading #{anchor} in {resolved.name})")
    return out


def test_the_page_is_short_with_short_lines():
    assert len(PAGE.read_bytes()) < MAX_BYTES == 40 * 1024
    long = [(i + 1, len(line)) for i, line in enumerate(MD.splitlines()) if len(line) > MAX_LINE]
    assert not long, f"lines over {MAX_LINE} characters (line, length): {long}"


def test_every_link_from_the_page_and_its_pages_resolves():
    linked = {(PAGE.parent / t.partition("#")[0]).resolve() for t in _LINK.findall(MD) if t.startswith("study/page/")}
    assert linked == {p.resolve() for p in PAGES.glob("*.md")}  # every page is linked from the first, none missing
    for page in [PAGE, *sorted(PAGES.glob("*.md"))]:
        assert not _broken(page), (page.name, _broken(page))


def test_one_row_per_claim_with_its_scale_and_declaration():
    table = _section("Verdicts")
    paper, ours = table.split("**evolm's own questions")
    assert "**The paper's claims** (9)" in paper
    assert "| claim | in a few words | verdict | scale (model, N, updates, seeds) | declared |" in paper
    ids = [re.match(r"\| \[(\w+)\]\(study/page/\1\.md\)", r).group(1) for r in _rows(table)]
    assert ids == [c["id"] for c in CLAIMS]
    assert [i for i in ids if not i.startswith("Q")] == [f"C{i}" for i in range(1, 10)]
    assert all(i.startswith("Q") for i in [re.match(r"\| \[(\w+)\]", r).group(1) for r in _rows(ours)])
    for row, claim in zip(_rows(table), CLAIMS):
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[3] == claim["scale"] and claim["scale"], claim["id"]
        assert cells[4] in ("before its data", "after its data") or cells[4].startswith(
            "changed after its data; as first declared: **"), (claim["id"], cells[4])
        if cells[4].startswith("changed"):
            assert f"(study/page/{claim['id']}.md#declared-before-or-after-the-data)" in cells[4]
    summary = _section("Summary")
    assert "**The paper's claims** (9: C1-C9): 0 reproduced" in summary and "**evolm's own questions** (7" in summary


def test_a_claims_scale_names_the_models_and_populations_of_the_runs_it_reads():
    """The hand-written scale agrees with the run directories the claim's tests read (their config.toml)."""
    data = ROOT / "docs" / "study"
    for claim in CLAIMS:
        names = [t.get(k, "") for t in claim.get("test", []) for k in ("run", "a", "b", "c", "d")]
        names += [s for t in claim.get("test", []) for s in t.get("seeds", [])]
        runs = {d for n in names if n for d in [data / n, *(data / n).parents] if (d / "run.json").exists()
                and (d / "config.toml").exists() and d.is_relative_to(data)}
        for run in runs:
            config = tomllib.loads((run / "config.toml").read_text())
            spec = config.get("model", {}).get("spec", "")
            assert MODEL_NAMES.get(spec, spec) in claim["scale"], (claim["id"], run.name, spec)
            n = config.get("es", {}).get("population")
            if n:
                assert re.search(rf"\bN = (?:\d+ vs )?{n}\b", claim["scale"]), (claim["id"], run.name, n)


def test_every_changed_claim_shows_its_verdict_as_first_declared():
    record = (PAGES / "preregistration.md").read_text()
    for row in _rows(_section("Verdicts")):
        cid = re.match(r"\| \[(\w+)\]", row).group(1)
        if "changed after its data" in row:
            own = _section("Declared before or after the data", (PAGES / f"{cid}.md").read_text())
            assert "| verdict now | verdict as first declared |" in own and f"- **{cid}**" in record, cid
    assert "not computable" not in MD + record  # every changed claim has a verdict as first declared


def test_c2_under_its_original_margin_reads_contradicted():
    for text in ((PAGES / "preregistration.md").read_text(), (PAGES / "C2.md").read_text()):
        c2 = next(line for line in text.splitlines() if line.startswith(("- **C2**", "**C2**")))
        assert "verdict now **inconclusive at this scale**" in c2 and "as first declared: **contradicted**" in c2
        assert "0.016 nats" in c2
        assert re.search(r"\| C2 \| ES entropy, addition, 62 updates \|.*1/64 = 0.016.*\| reproduced \| contradicted \|", text)
    c2_row = next(r for r in _rows(_section("Verdicts")) if r.startswith("| [C2]"))
    assert "as first declared: **contradicted**" in c2_row


def test_every_claims_key_number_comes_from_a_test_that_bears_out_its_verdict():
    # The key number once came from the claims file's `key` whatever that test read: Q3d's row showed a reproduced
    # number under a "contradicted" verdict (issue 40, item 5). Now the key test bears out the claim's verdict
    # (measure.decides), or it is a gated claim's failed premise and its line says so, with that test's own verdict.
    import json

    from evolm.report.study import load_claims
    from evolm.report.study.measure import evaluate_study
    from evolm.report.study.words import key_number

    claims = load_claims(ROOT / "experiments" / "study" / "claims.toml")
    study = evaluate_study(claims, lambda p: json.loads(Path(p).read_text()), ROOT / claims.study.data)
    q3d = next(o for o in study.claims if o.claim.id == "Q3d")
    assert q3d.verdict == "contradicted" and q3d.key.verdict == "contradicted", (q3d.key.name, q3d.key.verdict)
    from evolm.report.study.measure import decides
    for o in study.claims:
        r, line = o.key, key_number(o)
        gate = next((p for p in o.premises if p.outcome is r), None)
        assert r is not None and (decides(o, r) or gate is not None), (o.claim.id, o.verdict, r and r.verdict)
        if r.verdict != o.verdict and o.verdict != "not run":
            assert line.endswith(f": {r.verdict})"), (o.claim.id, line)
        if line != "–" and o.verdict != "not run":  # the committed page shows the same line under the claim
            assert f"**Key number** (95% interval): {line}" in _section(f"{o.claim.id}: "), o.claim.id


def test_the_interval_change_of_binary_contrasts_is_listed_with_each_tests_old_interval_and_verdict():
    # issue 40, item 4: binary contrasts moved from a percentile bootstrap to exact intervals after their data; the
    # record lists every test it changed under both, and each claim page its own
    record = (PAGES / "preregistration.md").read_text()
    assert "**Changed after the data, for every test of its kind (2026-12-04)**" in record
    c2 = "ES vs GRPO pass@16, addition, equal seconds, 3 GRPO seeds"
    assert re.search(rf"\| C2 \| {re.escape(c2)} \| bootstrap \| \[-0.219, -0.016\] \| contradicted; family-wise: "
                     r"inconclusive at this scale \| exact, combined \| \[[^]]+\] \| inconclusive at this scale \|", record)
    c7 = "N = 10 → 30 gap, 135M minus 270M, greedy, 40 updates"
    for text in (record, (PAGES / "C7.md").read_text()):
        assert re.search(rf"\| C7 \| {re.escape(c7)} \| bootstrap \| \[\+0.000, \+0.162\] \|.*\| exact, combined \|", text)
    assert "under the bootstrap binary contrasts had before their exact intervals: none." in MD
