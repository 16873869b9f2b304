"""One command the study page prints, run for real at a smoke budget (issue 40, item 6).

tests/test_study_commands.py runs every stage with a stand-in interpreter that writes file names; this test runs the
real ``bash experiments/study/run.sh n30 0`` (C1 and C2 at N = 30: ES, then GRPO, from the real SmolLM2-135M) from a
scratch copy into a temporary OUT, at the smallest budget the script takes (one ES update of N = 2 on 2 prompts, one
GRPO step, 4 held-out problems), then ``collect`` into a temporary PUBLISH, and checks that the files C1's and C2's
N = 30 tests read for seed 0 are there and parse as the claims read them: each evaluation holds per-problem samples
for the test's metric, the two sides of a compare hold the same problems, and metrics.jsonl holds the run's training
records up to its budget. Slow (minutes on CPU): not in the default ``make test``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evolm.report.study import load_claims, problem_values, task_report
from evolm.report.study.measure import files_of

from test_study_commands import ROOT, _scratch

SMOKE = {"ITERATIONS": "1", "POPULATION": "2", "PROMPTS": "2", "STEPS": "1", "EVAL_COUNT": "4"}
"""The smallest n30 budget run.sh takes (its n30 overrides; unset, the configs' declared budgets run)."""


def _n30_tests():
    """(claim id, test) of every C1/C2 test that reads the n30 runs."""
    claims = load_claims(ROOT / "experiments" / "study" / "claims.toml")
    return [(c.id, t) for c in claims.claim for t in c.test
            if any("n30-" in str(f) for f in files_of(t, Path("d")))]


def test_the_n30_tests_are_found():
    assert {cid for cid, _ in _n30_tests()} == {"C1", "C2"}


@pytest.mark.slow
def test_n30_at_a_smoke_budget_writes_and_publishes_what_c1_and_c2_read(tmp_path):
    repo = _scratch(tmp_path, "experiments/study")
    out, publish = tmp_path / "out", tmp_path / "publish"
    env = dict(os.environ, OUT=str(out), PY=sys.executable, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", **SMOKE)
    env.pop("PUBLISH", None)
    for stage in (["n30", "0"], ["collect"]):
        done = subprocess.run(["bash", "experiments/study/run.sh", *stage], cwd=repo, capture_output=True, text=True,
                              timeout=1800, env=dict(env, PUBLISH=str(publish)) if stage == ["collect"] else env)
        logs = "".join(p.read_text()[-3000:] for p in sorted(out.glob("*.log")))
        assert done.returncode == 0, f"run.sh {' '.join(stage)}: {done.stderr[-3000:]}\n{logs}"

    for name, steps in (("n30-es-s0", 1), ("n30-grpo-s0", 1)):
        records = [json.loads(line) for line in (publish / name / "metrics.jsonl").read_text().splitlines() if line]
        assert max(r["step"] for r in records if r.get("kind") == "train") == steps, name
        run = json.loads((publish / name / "run.json").read_text())
        assert "experiments/study/claims.toml" in json.dumps(run), f"{name}: run.json records no claims-file hash"
        assert not (publish / name / "final").exists(), f"{name}: collect published weights"

    checked = 0
    for cid, t in _n30_tests():
        seed0 = [f for f in files_of(t, publish) if "-s1/" not in str(f) and "-s2/" not in str(f)]
        values = []
        for f in seed0:
            assert f.is_file(), f"{cid} '{t.name}' reads {f.relative_to(publish)}, which n30 + collect did not write"
            report = task_report(json.loads(f.read_text()), f, t.task)
            v = problem_values(report, t.metric)
            assert len(v) >= 1 and all(x is not None for x in v.values()), f"{f}: no per-problem {t.metric}"
            values.append(set(v))
            checked += 1
        assert all(ids == values[0] for ids in values), f"{cid} '{t.name}': its files hold different problems"
    assert checked >= 8
