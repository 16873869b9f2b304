"""Pre-registration (issue 40): a run records the sha256 of the study file that declared its tests when it starts."""

from __future__ import annotations

import hashlib
import json

import pytest

from evolm import config
from evolm.errors import UserError
from evolm.runs import RECORD_ENV, RunDir


def test_run_records_the_declaration_it_started_under(tmp_path, monkeypatch):
    claims = tmp_path / "claims.toml"
    claims.write_text('[study]\ntitle = "t"\n')
    monkeypatch.setenv(RECORD_ENV, str(claims))
    run = RunDir.create(tmp_path, "r", config.to_toml(config.ESJob()), kind="es")
    info = json.loads((run.path / "run.json").read_text())
    assert info["recorded"] == {str(claims): {"sha256": hashlib.sha256(claims.read_bytes()).hexdigest(),
                                              "bytes": claims.stat().st_size}}
    claims.write_text('[study]\ntitle = "changed after"\n')   # a later edit does not rewrite what the run recorded
    assert json.loads((run.path / "run.json").read_text())["recorded"] == info["recorded"]


def test_no_record_without_the_variable_and_a_missing_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(RECORD_ENV, raising=False)
    run = RunDir.create(tmp_path, "plain", config.to_toml(config.ESJob()), kind="es")
    assert "recorded" not in json.loads((run.path / "run.json").read_text())
    monkeypatch.setenv(RECORD_ENV, str(tmp_path / "absent.toml"))
    with pytest.raises(UserError, match="EVOLM_RECORD_FILES names .*absent.toml"):
        RunDir.create(tmp_path, "r2", config.to_toml(config.ESJob()), kind="es")


# -- seeds as the unit (issue 40, item 4) -------------------------------------------------------------------

from test_study import outcome, write_run  # noqa: E402  (the study tests' synthetic committed files)

from evolm.report.study import CONTRADICTED, INCONCLUSIVE, REPRODUCED  # noqa: E402
from evolm.report.study.stats import seed_interval  # noqa: E402


def test_seed_interval_is_student_t_over_seed_means():
    mean, lo, hi = seed_interval([0.1, 0.2, 0.3])
    assert mean == pytest.approx(0.2) and hi - mean == pytest.approx(4.302653 * 0.1 / 3 ** 0.5, rel=1e-5)
    with pytest.raises(ValueError):
        seed_interval([0.1])


def _seeds_body(kind_lines: str) -> str:
    return '[[claim]]\nid = "C2"\nclaim = "c"\n\n[[claim.test]]\n' + kind_lines


def test_seed_unit_detects_a_consistent_effect_and_not_a_seed_lottery(tmp_path):
    data = tmp_path / "data"
    # planted: every seed gains ~2 of 16 on each of 64 problems -> reproduced over seeds
    for s, gain in enumerate((2, 2, 3)):
        write_run(data, f"es-s{s}", [4] * 64, [4 + gain] * 64)
    body = _seeds_body('kind = "change"\nrun = "es-s0"\nseeds = ["es-s1", "es-s2"]\nmetric = "pass@1"\nexpect = "up"\n'
                       'unit = "seed"\n')
    t = outcome(tmp_path, body)[0].tests[0]
    assert t.verdict == REPRODUCED and t.method == "t over 3 seeds"
    # a lottery: one seed gains a lot, two lose a little. Per problem within each seed every change is certain (the
    # fixed-seed interval excludes 0), but over seeds it is not: inconclusive
    for s, after in enumerate((12, 3, 3)):
        write_run(tmp_path / "lot", f"es-s{s}", [4] * 64, [after] * 64)
    lot = tmp_path / "lot-study"
    lot.mkdir()
    (lot / "data").symlink_to(tmp_path / "lot", target_is_directory=True)
    t2 = outcome(lot, body)[0].tests[0]
    fixed = outcome(lot, body.replace('unit = "seed"\n', ''))[0].tests[0]
    assert fixed.verdict == REPRODUCED and t2.verdict == INCONCLUSIVE


def test_pairs_compare_two_methods_over_seeds_each_on_its_own_problems(tmp_path):
    data = tmp_path / "data"
    for s in range(3):  # seed s: its own problem ids, GRPO and ES on them; ES ends below GRPO by 1-2 of 16 everywhere
        ids = [f"arithmetic:{100 * s + i}" for i in range(64)]
        for name, after in ((f"grpo-s{s}", 10), (f"es-s{s}", 8 + (s == 1))):
            d = write_run(data, name, [4] * 64, [after] * 64)
            for f in ("eval_before.json", "eval_after.json"):
                rec = json.loads((d / f).read_text())
                for p, i in zip(rec["problems"], ids):
                    p["id"] = i
                (d / f).write_text(json.dumps(rec))
    body = _seeds_body('kind = "compare"\na = "grpo-s0/eval_after.json"\nb = "es-s0/eval_after.json"\n'
                       'pairs = [["grpo-s1/eval_after.json", "es-s1/eval_after.json"], '
                       '["grpo-s2/eval_after.json", "es-s2/eval_after.json"]]\nunit = "seed"\nmetric = "pass@1"\n'
                       'expect = "b_greater"\n')
    t = outcome(tmp_path, body)[0].tests[0]
    assert t.verdict == CONTRADICTED and len(t.seeds) == 3 and t.method == "t over 3 seeds"
    assert t.estimate == pytest.approx(((8 - 10) + (9 - 10) + (8 - 10)) / 3 / 16)


def test_pairs_need_the_seed_unit(tmp_path):
    from evolm.errors import ConfigError
    body = _seeds_body('kind = "compare"\na = "x/eval_after.json"\nb = "y/eval_after.json"\n'
                       'pairs = [["x1/eval_after.json", "y1/eval_after.json"]]\nmetric = "pass@1"\nexpect = "b_greater"\n')
    with pytest.raises(ConfigError, match='pairs is a list of \\[a, b\\] files.*unit = "seed"'):
        outcome(tmp_path, body)


def test_a_test_is_re_marked_to_what_its_first_terms_make_it(tmp_path):
    """``untestable`` is declared for a test's current terms: under its terms as first declared a test is evaluated
    (not refused) when they leave its outcome open, and reads untestable when they fix it (issue 40, item 5: every
    post-hoc change shows a verdict as first declared, never "not computable")."""
    from dataclasses import replace

    from evolm.report.study.claims import load_claims
    from evolm.report.study.preregistration import evaluate_as_first_declared
    from evolm.report.study.verdicts import UNTESTABLE
    from test_study import change, write_claims

    data = tmp_path / "data"
    write_run(data, "r", [4] * 64, [5] * 64)
    kept = change("r", "pass@1", "not_down", margin=0.001) + 'untestable = "below one problem\'s share"\n'
    claims = load_claims(write_claims(tmp_path / "claims.toml", data, kept))
    read = lambda p: json.loads(p.read_text())  # noqa: E731
    (claim,) = claims.claim
    first = replace(claim, test=[replace(claim.test[0], margin=0.1)])  # first declared with a margin it can decide
    assert evaluate_as_first_declared(first, data, read, {}).tests[0].verdict == REPRODUCED
    now = replace(claim, test=[replace(claim.test[0], untestable="")])  # testable now, fixed as first declared
    first = replace(now, test=[replace(now.test[0], margin=0.001)])
    (t,) = evaluate_as_first_declared(first, data, read, {}).tests
    assert t.verdict == UNTESTABLE and "one problem's share" in t.untestable
