"""Pre-registration dates (issue 40, item 1): each test dated by the commit that declared it, against its data."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from evolm.report.study import preregistration as pre

ROOT = Path(__file__).resolve().parents[1]
TEST = '[[claim.test]]\nname = "{name}"\nkind = "change"\nrun = "{run}"\nmetric = "entropy"\nexpect = "not_down"\nmargin = {m}\n'


def _git(repo: Path, *args: str, date: str = "") -> None:
    env = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date, "PATH": "/usr/bin:/bin",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, env={k: v for k, v in env.items() if v})


def _run(data: Path, name: str, finished: float) -> None:
    (data / name).mkdir(parents=True)
    (data / name / "run.json").write_text(json.dumps({"started": finished - 60, "finished": finished}))
    for f in ("eval_before.json", "eval_after.json"):
        (data / name / f).write_text("{}")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_declared_before_after_and_changed_after_the_data(tmp_path):
    repo = tmp_path
    _git(repo, "init", "-q")
    claims = repo / "study" / "claims.toml"
    claims.parent.mkdir()
    head = '[study]\ndata = "data"\n\n[[claim]]\nid = "C2"\nclaim = "c"\n\n'
    claims.write_text(head + TEST.format(name="early", run="r1", m=0.016))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "declare", date="2026-11-30T10:00:00+00:00")
    _run(repo / "data", "r1", 1796040000.0)   # 2026-11-30 ~12:00 UTC: after the declaration
    _run(repo / "data", "r2", 1796040000.0)
    claims.write_text(head + TEST.format(name="early", run="r1", m=0.016) + TEST.format(name="late", run="r2", m=0.016))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "late test", date="2026-12-01T10:00:00+00:00")
    claims.write_text(head + TEST.format(name="early", run="r1", m=0.5) + TEST.format(name="late", run="r2", m=0.016))
    _git(repo, "commit", "-qam", "widen", date="2026-12-02T10:00:00+00:00")
    record = pre.build_record(claims, repo)
    rows = {r["name"]: r for r in record["tests"]}
    assert rows["early"]["status"] == pre.CHANGED and rows["early"]["original"] == {"margin": 0.016}
    assert rows["early"]["changed"]["date"] == "2026-12-02T10:00:00Z"
    assert rows["early"]["declared"]["date"] == "2026-11-30T10:00:00Z"
    assert rows["early"]["data"] == {"date": pre._iso(1796040000.0), "from": "r1/run.json finished"}
    assert rows["late"]["status"] == pre.AFTER
    # a test renamed later is the same test (identity is what it reads, not its name)
    claims.write_text(head + TEST.format(name="early, renamed", run="r1", m=0.5) + TEST.format(name="late", run="r2", m=0.016))
    assert {r["name"]: r for r in pre.build_record(claims, repo)["tests"]}["early, renamed"]["declared"]["date"] \
        == "2026-11-30T10:00:00Z"


VALUE = '[[claim.test]]\nname = "{name}"\nkind = "value"\nfile = "summary.json"\npath = "{path}"\nexpect = ">"\nthreshold = 1.0\n'


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_value_in_a_shared_file_is_dated_by_the_commit_that_first_held_it(tmp_path):
    """A summary gathers many runs' numbers: a test of an arm added to it later is dated by the commit that added
    that arm's value (a null or an empty list, a model with no seed yet, is no value), not by the file's first commit."""
    repo = tmp_path
    _git(repo, "init", "-q")
    (repo / "data").mkdir()
    summary = repo / "data" / "summary.json"
    summary.write_text(json.dumps({"arms": {"old": 1.3, "new": None, "later": []}}))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "summary with one arm", date="2026-12-01T10:00:00+00:00")
    claims = repo / "study" / "claims.toml"
    claims.parent.mkdir()
    claims.write_text('[study]\ndata = "data"\n\n[[claim]]\nid = "Q4"\nclaim = "c"\n\n'
                      + VALUE.format(name="old arm", path="arms.old") + VALUE.format(name="new arm", path="arms.new")
                      + VALUE.format(name="later arm", path="arms.later"))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "declare", date="2026-12-02T10:00:00+00:00")
    summary.write_text(json.dumps({"arms": {"old": 1.3, "new": 0.9, "later": []}}))
    _git(repo, "commit", "-qam", "the new arm's value", date="2026-12-03T10:00:00+00:00")
    rows = {r["name"]: r for r in pre.build_record(claims, repo)["tests"]}
    assert rows["old arm"]["status"] == pre.AFTER
    assert rows["old arm"]["data"] == {"date": "2026-12-01T10:00:00Z", "from": "summary.json first committed with arms.old"}
    assert rows["new arm"]["status"] == pre.BEFORE
    assert rows["new arm"]["data"] == {"date": "2026-12-03T10:00:00Z", "from": "summary.json first committed with arms.new"}
    assert rows["later arm"]["data"] == {"date": "", "from": ""} and rows["later arm"]["status"] == pre.BEFORE


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_held_out_change_of_a_run_under_way_has_no_data_until_its_table_after_training(tmp_path):
    """A change test reads a run's tables before and after training; a run that started before the test was declared
    but has no table after training yet has not produced the test's data."""
    repo = tmp_path
    _git(repo, "init", "-q")
    run = repo / "data" / "r"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"started": 1796040000.0, "status": "running"}))  # 2026-11-30 ~12:00
    (run / "eval_before.json").write_text("{}")
    claims = repo / "study" / "claims.toml"
    claims.parent.mkdir()
    claims.write_text('[study]\ndata = "data"\n\n[[claim]]\nid = "C2"\nclaim = "c"\n\n' + TEST.format(name="t", run="r", m=0.016))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "declare", date="2026-12-01T10:00:00+00:00")
    row = pre.build_record(claims, repo)["tests"][0]
    assert row["status"] == pre.BEFORE and row["data"] == {"date": "", "from": ""}
    (run / "eval_after.json").write_text("{}")
    (run / "run.json").write_text(json.dumps({"started": 1796040000.0, "finished": 1796212800.0}))  # 2026-12-02
    row = pre.build_record(claims, repo)["tests"][0]
    assert row["status"] == pre.BEFORE and row["data"]["from"] == "r/run.json finished"


def test_original_test_puts_the_first_terms_back():
    from evolm.report.study.claims import ClaimTest, MarginRef
    now = ClaimTest(kind="change", run="r", metric="entropy", expect="not_down", margin_of=MarginRef(0.5, run="g"),
                    requires=["p"])
    first = pre.original_test(now, {"margin_of": None, "requires": None, "margin": 0.016})
    assert first.margin_of is None and first.requires == [] and first.margin == 0.016 and first.run == "r"


def _history_complete() -> bool:
    if shutil.which("git") is None:
        return False
    out = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip() == "false"


@pytest.mark.skipif(not _history_complete(), reason="needs the repository's full git history")
def test_committed_record_matches_the_history():
    """A commit that changes the claims file must regenerate experiments/study/preregistration.json with it."""
    assert pre.main([str(ROOT / "experiments/study/claims.toml"), "--check"]) == 0, \
        "run: PYTHONPATH=src python -m evolm.report.study.preregistration (and regenerate the page)"
