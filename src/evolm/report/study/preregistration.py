"""Pre-registration (issue 40, item 1): when each test was declared, when its data came to exist, and what changed.

A test is declared by the commit that first put it into the claims file; its data exist from the earliest end of
the runs it reads (``run.json``'s ``finished``, else ``started``; a held-out change of a run whose table after training
is not there yet has no data) or, for a file outside a run directory (an analysis output), the
commit that first added that file; for a value test, the first commit in which that file holds a value at the test's path
(a summary gathers many runs' numbers, and a row added later is dated by the row). A test is then "declared before its data", "declared after its data", or
"changed after its data" when its terms (what decides it: expect, margin, threshold, premise it requires, the runs
it pools) changed after its data existed; such a test is shown beside its verdict under the terms it was first
declared with, measured on the same files.

Design decisions:

- The history is read from git once, by ``python -m evolm.report.study.preregistration CLAIMS`` (needs the
  repository's history; ``experiments/study/run.sh`` does not call it), and committed as
  ``experiments/study/preregistration.json`` beside the claims file; the page reads only that record, so it
  regenerates without git. tests/test_preregistration.py checks the committed record against the history, so a
  commit that changes the claims file without regenerating the record fails the tests.
- A test is identified across versions by what it reads (claim id, kind, files, metric, path, task), not by its
  name: most tests got their names on 2026-12-01, after they were declared. A test whose files changed is a new
  test from that commit on (a later declaration date, never an earlier one).
- Why a term changed is written by hand in ``experiments/study/revisions.toml`` (``[[revision]]``: claim, commit,
  why); a change with no entry there reads "why: not recorded".
- Claim premises (``[[claim.premise]]``) are dated the same way; a claim whose premise was added after its data
  is also shown with its verdict without that premise.
- A change of the study's statistics after the data (``[[method]]`` in ``revisions.toml``: when, what, why, and the
  ``Level.binary`` that computes the method it replaced) is no term of one test: every test whose interval it
  changed is listed with its interval and verdict under the old method beside the new, and every claim with its
  verdict under the old method (2026-12-04: binary contrasts got exact intervals instead of percentile bootstraps).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import tomllib
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from evolm import config

IDENTITY = ("kind", "run", "a", "b", "c", "d", "file", "path", "metric", "task")
"""The fields that make a test the same test across versions of the claims file."""
TERMS = ("expect", "margin", "margin_of", "threshold", "over", "minus", "unit", "requires", "context", "seeds",
         "a_seeds", "b_seeds", "pairs")
"""The fields that decide a test's verdict on given files: a change of one after the data is a post-hoc change."""
BEFORE, AFTER, CHANGED = "declared before its data", "declared after its data", "changed after its data"
RECORD = "preregistration.json"
REVISIONS = "revisions.toml"


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def identity(claim_id: str, test: dict) -> tuple:
    return (claim_id,) + tuple(str(test.get(f, "")) for f in IDENTITY)


def terms(test: dict) -> dict:
    return {f: test[f] for f in TERMS if f in test and test[f] not in ("", None, [], {})}


def _tests(doc: dict) -> list[tuple[tuple, dict]]:
    """Every test of one version, with its identity made unique by its order among equal identities."""
    out, seen = [], {}
    for claim in doc.get("claim", []):
        for t in claim.get("test", []):
            key = identity(claim.get("id", ""), t)
            seen[key] = seen.get(key, 0) + 1
            out.append((key + (seen[key],), t))
        for p in claim.get("premise", []):
            out.append(((claim.get("id", ""), "premise", p.get("id", "")), p))
    return out


def history(claims: Path, repo: Path) -> list[tuple[str, str, dict]]:
    """(commit, date, parsed claims file) for every commit that changed it, oldest first."""
    rel = claims.resolve().relative_to(repo.resolve())
    out = []
    for line in _git("log", "--reverse", "--format=%h %cI", "--", str(rel), cwd=repo).splitlines():
        commit, date = line.split()
        try:
            doc = tomllib.loads(_git("show", f"{commit}:{rel}", cwd=repo))
        except (tomllib.TOMLDecodeError, subprocess.CalledProcessError):
            continue
        out.append((commit, date, doc))
    return out


def added_dates(data: Path, repo: Path) -> dict[str, str]:
    """The date each file under ``data`` was first committed (path relative to the repository)."""
    rel = data.resolve().relative_to(repo.resolve())
    dates, date = {}, ""
    for line in _git("log", "--reverse", "--diff-filter=A", "--format=@%cI", "--name-only", "--", str(rel),
                     cwd=repo).splitlines():
        if line.startswith("@"):
            date = line[1:]
        elif line.strip():
            dates.setdefault(line.strip(), date)
    return dates


def _utc(date: str) -> str:
    return datetime.fromisoformat(date).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class PathDates:
    """When a value first stood at a path of a committed JSON file: the date of the first commit of the file in
    which ``measure.lookup`` finds it, not null and not an empty list (a model with no seed yet; "" when none has). A file that gathers many runs' numbers (a summary,
    ``refnum/real_arm.json``) exists long before a new arm's row does; a test of that row is dated by the row."""

    def __init__(self, repo: Path):
        self.repo, self.versions = repo, {}

    def _versions(self, rel: str) -> list[tuple[str, Any]]:
        if rel not in self.versions:
            out = []
            for line in _git("log", "--reverse", "--format=%h %cI", "--", rel, cwd=self.repo).splitlines():
                commit, date = line.split()
                try:
                    out.append((date, json.loads(_git("show", f"{commit}:{rel}", cwd=self.repo))))
                except (subprocess.CalledProcessError, ValueError):  # deleted in that commit, or not JSON
                    continue
            self.versions[rel] = out
        return self.versions[rel]

    def first(self, rel: str, path: str) -> str:
        from evolm.errors import UserError
        from evolm.report.study.measure import lookup

        for date, doc in self._versions(rel):
            try:
                value = lookup(doc, path, rel)
            except (UserError, TypeError, ValueError, KeyError):
                continue
            if value is not None and value != [] and value != {}:  # a placeholder (no seed yet) is no data
                return date
        return ""


def data_date(files: list[str], data: Path, repo: Path, added: dict[str, str],
              paths: dict[str, str] | None = None, path_dates: PathDates | None = None) -> tuple[str, str]:
    """The earliest date any of a test's files existed, and where that date comes from. ``paths``: the value a
    test reads in a file outside a run directory (a JSON path); that file's date is then the first commit that
    holds a value there (``PathDates``), not the file's first commit."""
    found = []
    for f in files:
        path = data / f
        run = next((d for d in [path.parent, *path.parent.parents] if (d / "run.json").exists()
                    and d.resolve().is_relative_to(data.resolve())), None)
        if run is not None:
            if f.endswith(("eval_before.json", "eval_after.json")) and not (run / "eval_after.json").exists():
                continue  # a held-out change of a run under way: its data is the table after training, not there yet
            info = json.loads((run / "run.json").read_text())
            end = info.get("finished") or info.get("started")
            if end:
                found.append((_iso(float(end)), f"{run.relative_to(data)}/run.json "
                              f"{'finished' if info.get('finished') else 'started'}"))
                continue
        rel = str(path.resolve().relative_to(repo.resolve()))
        if paths and paths.get(f) and path_dates is not None and f.endswith(".json"):
            date = path_dates.first(rel, paths[f])
            if date:
                found.append((_utc(date), f"{f} first committed with {paths[f]}"))
        elif rel in added:
            found.append((_utc(added[rel]), f"{f} first committed"))
    return min(found) if found else ("", "")


def _test_paths(t: dict) -> dict[str, str]:
    """The JSON path a value test reads in each of its files."""
    if t.get("kind") != "value":
        return {}
    second = t.get("over") or t.get("minus") or {}
    out = {t.get("file", ""): t.get("path", "")}
    if second.get("file"):
        out[second["file"]] = second.get("path", "")
    return {f: p for f, p in out.items() if f and p}


def _test_files(t: dict) -> list[str]:
    if t.get("kind") == "change":
        return [f"{r}/{n}" for r in [t.get("run", "")] + list(t.get("seeds", [])) for n in ("eval_before.json", "eval_after.json")]
    if t.get("kind") == "value":
        second = t.get("over") or t.get("minus") or {}
        return [t.get("file", "")] + ([second["file"]] if second.get("file") else [])
    names = [t.get(k, "") for k in ("a", "b", "c", "d", "a_base", "b_base")]
    names += list(t.get("a_seeds", [])) + list(t.get("b_seeds", [])) + [f for p in t.get("pairs", []) for f in p]
    return [n for n in names if n]


def build_record(claims: Path, repo: Path) -> dict:
    """The pre-registration record of the claims file's current tests, from the repository's history."""
    versions = history(claims, repo)
    current = tomllib.loads(claims.read_text())
    data = Path(current.get("study", {}).get("data", "docs/study"))
    data = data if data.is_absolute() else repo / data
    added = added_dates(data, repo)
    path_dates = PathDates(repo)
    first: dict[tuple, tuple[str, str, dict]] = {}
    last_change: dict[tuple, tuple[str, str]] = {}
    last_seen: dict[tuple, dict] = {}
    for commit, date, doc in versions:
        for key, t in _tests(doc):
            if key not in first:
                first[key] = (commit, date, terms(t))
            elif key in last_seen and terms(t) != last_seen[key]:
                last_change[key] = (commit, date)
        last_seen = {key: terms(t) for key, t in _tests(doc)}
    rows = []
    for key, t in _tests(current):
        commit, date = first.get(key, ("uncommitted", ""))[:2]
        is_premise = key[1] == "premise"
        when, source = data_date(_test_files(t), data, repo, added, _test_paths(t), path_dates)
        row = {"claim": key[0], "name": t.get("id", "") if is_premise else t.get("name", ""),
               "premise": is_premise, "declared": {"commit": commit, "date": _utc(date) if date else ""},
               "data": {"date": when, "from": source}}
        declared = row["declared"]["date"]
        row["status"] = AFTER if (declared and when and declared > when) else BEFORE
        if key in last_change and when and _utc(last_change[key][1]) > when:
            ch_commit, ch_date = last_change[key]
            original = first[key][2]
            row.update(status=CHANGED, changed={"commit": ch_commit, "date": _utc(ch_date)},
                       original={f: original.get(f) for f in sorted(set(original) | set(terms(t)))
                                 if original.get(f) != terms(t).get(f)})
        rows.append(row)
    return {"claims_file": str(claims.resolve().relative_to(repo.resolve())),
            "generated_by": "python -m evolm.report.study.preregistration " + str(claims.resolve().relative_to(repo.resolve())),
            "tests": rows}


@dataclass
class Revision:
    """Why a claim's tests changed after their data in one commit: ``[[revision]]`` in ``revisions.toml``."""

    claim: str = ""
    """The claim's id (e.g. ``C2``)."""
    commit: str = ""
    """The commit that changed them (its short hash, as the record names it)."""
    why: str = ""
    """Why they changed, and what they had been."""


@dataclass
class MethodRevision:
    """A change of how the study computes intervals, made after data existed: ``[[method]]`` in ``revisions.toml``."""

    date: str = ""
    """When it was made (UTC date)."""
    change: str = ""
    """What changed, in a few words (e.g. "binary contrasts: percentile bootstrap -> exact interval")."""
    why: str = ""
    """Why it changed."""
    before: str = ""
    """The ``measure.Level.binary`` value that computes the replaced method (e.g. ``bootstrap``)."""


@dataclass
class Revisions:
    """``experiments/study/revisions.toml``."""

    revision: list[Revision] = field(default_factory=list)
    """The recorded reasons."""
    method: list[MethodRevision] = field(default_factory=list)
    """Changes of the study's statistics after the data."""


def load_revisions(claims_path: str | Path) -> Revisions:
    """``revisions.toml`` beside the claims file (empty when absent)."""
    path = Path(claims_path).parent / REVISIONS
    return config.from_dict(Revisions, config.read_toml(path)) if path.exists() else Revisions()


def load_record(claims_path: str | Path) -> tuple[dict | None, dict[tuple[str, str], str]]:
    """The committed record beside the claims file (None when absent) and the reasons, by (claim, commit)."""
    base = Path(claims_path).parent
    record = json.loads((base / RECORD).read_text()) if (base / RECORD).exists() else None
    reasons = {(r.claim, r.commit): r.why for r in load_revisions(claims_path).revision}
    return record, reasons


def original_test(test: Any, original: dict) -> Any:
    """The test as first declared: its current fields with the original terms put back (absent terms cleared)."""
    from evolm.report.study.claims import ClaimTest, MarginRef, ValueRef
    changes: dict[str, Any] = {}
    for f, v in original.items():
        if f == "margin_of":
            changes[f] = config.from_dict(MarginRef, v) if v else None
        elif f in ("over", "minus"):
            changes[f] = config.from_dict(ValueRef, v) if v else None
        elif v is None:
            changes[f] = getattr(ClaimTest(), f)
        else:
            changes[f] = v
    return replace(test, **changes)


def _short(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_short(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return f"{len(v)} more" if v and all(isinstance(x, (str, list)) for x in v) else str(v)
    return "none" if v is None else str(v)


def original_terms(original: dict) -> str:
    """``margin_of: none; margin: 0.016``: the terms as first declared, in the claims file's words."""
    return "; ".join(f"{f} {_short(v)}" for f, v in original.items())


FIRST_UNTESTABLE = "its outcome is fixed under its terms as first declared"
"""The ``untestable`` reason a test gets when its terms as first declared fix its outcome."""


def evaluate_as_first_declared(claim: Any, data: Path, read: Any, run_gates: dict) -> Any:
    """``evaluate_claim`` on a claim whose tests carry their terms as first declared. ``untestable`` is no term: it
    was declared for the current terms, so a test is re-marked to what its first terms make it (untestable when they
    fix its outcome, testable when they do not) instead of being refused; each test at most once."""
    import re

    from evolm.errors import ConfigError
    from evolm.report.study.measure import evaluate_claim
    flipped: set[int] = set()
    while True:
        try:
            return evaluate_claim(claim, data, read, run_gates)
        except ConfigError as e:
            m = re.match(rf"claim {re.escape(claim.id)} test (\d+)\b", str(e))
            j = int(m.group(1)) - 1 if m else -1
            if j < 0 or j in flipped or not ("untestable" in str(e) or "fixed by its definition" in str(e)):
                raise
            flipped.add(j)
            t = claim.test[j]
            tests = list(claim.test)
            tests[j] = replace(t, untestable="" if t.untestable else FIRST_UNTESTABLE)
            claim = replace(claim, test=tests)


@dataclass
class Declared:
    """What the page shows about pre-registration: counts, one line per claim, and the changed tests side by side."""

    counts: dict[str, int]
    claims: dict[str, str]
    """claim id -> its one-word status for the summary row (``before``, ``after``, ``changed``)."""
    section: Any
    """The whole record: every changed test beside its verdict as first declared, every claim's reason."""
    first: dict[str, str] = field(default_factory=dict)
    """claim id -> its verdict under its tests as first declared (claims with a changed test or a late premise)."""
    blocks: dict[str, list] = field(default_factory=dict)
    """claim id -> the record's blocks for that claim alone (its changed tests side by side, why, late tests)."""
    method: dict[str, str] = field(default_factory=dict)
    """claim id -> its verdict under the statistics a ``[[method]]`` revision replaced (claims with a test it changed)."""


def declared(claims_path: str | Path, claims: Any, study: Any, data: Path, read: Any) -> Declared | None:
    """Compare each test's declaration with its data from the committed record and re-evaluate every changed claim
    under its tests as first declared (and without premises added after its data), on the same files."""
    from evolm.document import Section, Table
    from evolm.report.study.measure import evaluate_claim
    from evolm.report.study.verdicts import MARGIN_EXPECTS
    record, reasons = load_record(claims_path)
    if record is None:
        return None
    rows = {(r["claim"], r["name"], r["premise"]): r for r in record["tests"]}
    run_gates = {d: p for p in study.premises if p.holds is False for d in p.premise.covers}
    counts = {BEFORE: 0, AFTER: 0, CHANGED: 0}
    per_claim, table, whys, late = {}, [], [], []
    first_verdicts: dict[str, str] = {}
    own: dict[str, list] = {}
    columns = ["claim", "test", "declared (UTC)", "data (UTC)", "changed", "as first declared", "verdict now",
               "verdict as first declared"]
    for o in study.claims:
        c = o.claim
        mine = [rows.get((c.id, t.name, False)) for t in c.test] + [rows.get((c.id, p.id, True)) for p in c.premise]
        statuses = [r["status"] for r in mine if r]
        for st in statuses:
            counts[st] += 1
        per_claim[c.id] = ("changed" if CHANGED in statuses else "after" if AFTER in statuses
                           else "before" if statuses else "not recorded")
        added_late = [p for p in c.premise if (r := rows.get((c.id, p.id, True))) and r["status"] == AFTER]
        changed = [(i, rows[(c.id, t.name, False)]) for i, t in enumerate(c.test)
                   if rows.get((c.id, t.name, False), {}).get("status") == CHANGED]
        after = [t.name for t in c.test if rows.get((c.id, t.name, False), {}).get("status") == AFTER]
        if after:
            late.append(f"{c.id}: {len(after)} test{'s' if len(after) > 1 else ''} declared after {'their' if len(after) > 1 else 'its'} data "
                        f"({', '.join(after[:3])}{', ...' if len(after) > 3 else ''})")
            own[c.id] = ["Declared after their data (never changed since): " + ", ".join(after) + "."]
        if not changed and not added_late:
            continue
        tests = list(c.test)
        shown_terms = {}
        for i, r in changed:
            shown_terms[i] = original_terms(r["original"])
            try:
                tests[i] = original_test(tests[i], r["original"])
            except Exception:  # an original term the loader no longer takes
                tests[i] = None
                continue
            if tests[i].expect in MARGIN_EXPECTS and tests[i].margin is None and tests[i].margin_of is None:
                n = o.tests[i].problems or 64  # the rule before margins were declared: one problem's share
                tests[i] = dataclasses.replace(tests[i], margin=1 / n)
                shown_terms[i] += f" (so the margin of that time: one problem's share, 1/{n} = {1 / n:.3f})"
        first = dataclasses.replace(c, test=[t for t in tests if t is not None],
                                    premise=[p for p in c.premise if p not in added_late])
        try:
            then = evaluate_as_first_declared(first, data, read, run_gates)
            then_tests = {t.name: r for t, r in zip(first.test, then.tests)}
            then_verdict = then.verdict
        except Exception as e:
            then_tests, then_verdict = {}, f"not computable ({str(e).splitlines()[0][:120]})"
        now_tests = {t.name: r for t, r in zip(c.test, o.tests)}
        start = len(table)
        for i, r in changed:
            name = c.test[i].name
            t_then = then_tests.get(name)
            table.append([c.id, name, r["declared"]["date"][:16].replace("T", " "), r["data"]["date"][:16].replace("T", " "),
                          f"{r['changed']['date'][:16].replace('T', ' ')} ({r['changed']['commit']})",
                          shown_terms[i], now_tests[name].verdict,
                          t_then.verdict if t_then is not None else "not computable"])
        for p in added_late:
            r = rows[(c.id, p.id, True)]
            table.append([c.id, f"premise: {p.id}", r["declared"]["date"][:16].replace("T", " "),
                          r["data"]["date"][:16].replace("T", " "), "added after its data", "no such premise", "", ""])
        commits = sorted({r["changed"]["commit"] for _, r in changed} | {rows[(c.id, p.id, True)]["declared"]["commit"]
                                                                          for p in added_late})
        why = "; ".join(f"{k}: {reasons.get((c.id, k), 'why not recorded')}" for k in commits)
        whys.append(f"- **{c.id}**: verdict now **{o.verdict}**; under its tests as first declared"
                    f"{' and without the premises added after its data' if added_late else ''}: **{then_verdict}**. {why}")
        first_verdicts[c.id] = then_verdict
        own[c.id] = [whys[-1][2:], Table(columns, table[start:])] + own.get(c.id, [])
    blocks = [f"Each test is dated by the commit that first declared it (`git log` of the claims file, recorded in "
              f"`experiments/study/{RECORD}` by `python -m evolm.report.study.preregistration`) and compared with the "
              f"date its data came to exist (the runs' `run.json` finished time, else the file's first commit): "
              f"{counts[BEFORE]} {BEFORE}, {counts[AFTER]} {AFTER}, {counts[CHANGED]} {CHANGED} (a term that decides the "
              f"verdict - expect, margin, threshold, a premise it requires, the seeds it pools - changed after the data "
              f"existed). A claim whose tests changed is re-evaluated on the same files under its tests as first "
              f"declared, side by side with its verdict now."]
    if table:
        blocks.append(Table(columns, table))
    if whys:
        blocks.append("\n".join(whys))
    if late:
        blocks.append("Declared after their data (never changed since):\n" + "\n".join(f"- {x}" for x in late))
    method = {}
    for rev in load_revisions(claims_path).method:
        text, rows, then = method_changes(rev, study, data, read, run_gates)
        blocks += [text, Table(METHOD_COLUMNS, rows)] if rows else [text]
        for cid, verdict in then.items():
            method[cid] = verdict
            mine = [r for r in rows if r[0] == cid]
            own.setdefault(cid, []).extend([f"{rev.date}, after the data: {rev.change} ({rev.why}). Verdict under the old "
                                            f"method: **{verdict}**.", Table(METHOD_COLUMNS, mine)])
    return Declared(counts, per_claim, Section("Pre-registration: declared before or after the data", blocks),
                    first_verdicts, own, method)


METHOD_COLUMNS = ["claim", "test", "old method", "interval then", "verdict then", "method now", "interval now",
                  "verdict now"]
"""The columns of a ``[[method]]`` revision's table."""


def method_changes(rev: MethodRevision, study: Any, data: Path, read: Any, run_gates: dict) -> tuple[str, list, dict]:
    """A ``[[method]]`` revision's paragraph, one row per test whose interval it changed (old beside new) and every
    such claim's verdict under the old method (claim id -> verdict)."""
    from evolm.report.study.measure import evaluate_claim

    def ends(r: Any) -> str:
        return "–" if not r.interval else f"[{r.interval[0]:+.3f}, {r.interval[1]:+.3f}]"

    def shown(r: Any) -> str:
        wide = f"; family-wise: {r.family_verdict}" if r.family_level is not None and r.family_verdict != r.verdict else ""
        return r.verdict + (f" (measured: {r.measured})" if r.measured else "") + wide

    rows, then = [], {}
    for o in study.claims:
        old = evaluate_claim(o.claim, data, read, run_gates, binary=rev.before)
        pairs = list(zip(o.tests, old.tests)) + [(p.outcome, q.outcome) for p, q in zip(o.premises, old.premises)]
        changed = [(r, q) for r, q in pairs if r.method != q.method]
        for r, q in changed:
            name = r.name or r.label
            name = f"premise: {name}" if any(p.outcome is r for p in o.premises) else name
            rows.append([o.claim.id, name, q.method, ends(q), shown(q), r.method, ends(r), shown(r)])
        if changed:
            then[o.claim.id] = old.verdict
    moved = [f"{cid} ({v} under the old method)" for cid, v in then.items()
             if v != next(o.verdict for o in study.claims if o.claim.id == cid)]
    text = (f"**Changed after the data, for every test of its kind ({rev.date})**: {rev.change}. Why: {rev.why}. "
            f"{len(rows)} tests and premises of {len(then)} claims changed interval; claims whose verdict moved: "
            f"{', '.join(moved) or 'none'}. Each such test, under the old method and the new:")
    return text, rows, then


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write the pre-registration record beside a claims file from git history.")
    ap.add_argument("claims", nargs="?", default="experiments/study/claims.toml")
    ap.add_argument("--check", action="store_true", help="exit 1 when the committed record differs from the history")
    args = ap.parse_args(argv)
    claims = Path(args.claims)
    repo = Path(_git("rev-parse", "--show-toplevel", cwd=claims.resolve().parent).strip())
    text = json.dumps(build_record(claims, repo), indent=1, ensure_ascii=False) + "\n"
    out = claims.parent / RECORD
    if args.check:
        same = out.exists() and out.read_text() == text
        print(f"{out}: {'matches' if same else 'differs from'} the history")
        return 0 if same else 1
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
