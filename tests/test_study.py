"""The reproduction study's page (``evolm report --study``): claims file, paired bootstrap, verdicts, page, CLI.

Fast: no model. Run directories are written the way the study commits them (config.toml, run.json,
metrics.jsonl, seed_log.jsonl, config_history.jsonl, eval_before/after.json; no final/, no checkpoints),
with per-problem n and c chosen so the differences, intervals and verdicts are known."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from evolm.commands import main
from evolm.errors import ConfigError, UserError
from evolm.metrics import pass_at_k_problem
from evolm.report import study
from evolm.report.reproduction import build_study
from evolm.report.study import (CONTRADICTED, INCONCLUSIVE, NOT_RUN, PREMISE_ABSENT, REPRODUCED, TRAINING_FAILED,
                                bootstrap_interval, claim_verdict, interval_verdict, load_claims, value_verdict)

ROOT = Path(__file__).resolve().parents[1]


# -- synthetic committed files -------------------------------------------------------------------------


def problems(cs, n=16, entropy=None, greedy=None, ids=None):
    """One problem per c in ``cs``: n samples, c correct, every sample's entropy ``entropy[i]`` (default 0.5)."""
    out = []
    for i, c in enumerate(cs):
        h = 0.5 if entropy is None else entropy[i]
        out.append({"id": (ids or [f"arithmetic:{i}" for i in range(len(cs))])[i], "n": n, "c": int(c),
                    "answers": ["1"] * n, "correct": [j < c for j in range(n)], "entropy": [h] * n,
                    "num_tokens": [8] * n, "greedy_correct": bool(c > n // 2) if greedy is None else greedy[i]})
    return out


def run_eval(label, probs):
    """A run's eval_<label>.json (one task)."""
    return {"task": "arithmetic", "split": "test", "sampling": {"n": probs[0]["n"], "temperature": 1.0},
            "ks": [1, 16], "summary": {"problems": len(probs), "n": probs[0]["n"]}, "problems": probs,
            "label": label, "step": 0 if label == "before" else 10}


def write_run(data: Path, name: str, before, after, method="es"):
    """A run directory as the study commits it (no weights); ``before`` / ``after``: each problem's c of 16."""
    d = data / name
    d.mkdir(parents=True)
    (d / "config.toml").write_text(f'[run]\nname = "{name}"\nmatch = "seconds"\nbudget = 100\n\n[model]\n'
                                   'spec = "smollm2-135m"\ndtype = "float32"\nthreads = 1\ndevice = "cpu"\n\n'
                                   '[task]\nname = "arithmetic"\nparams = { digits = 2 }\n\n[generation]\nmax_new_tokens = 24\n')
    (d / "run.json").write_text(json.dumps({"kind": method, "status": "finished", "model": "smollm2-135m", "steps": 3}))
    records = [{"step": s, "kind": "train", "method": method, "reward_mean": 0.1 * s, "seconds": 40.0,
                "gen_sequences": 256, "gen_tokens": 3000, "seconds_total": 40.0 * s, "gen_sequences_total": 256 * s,
                "gen_tokens_total": 3000 * s, "peak_rss_mb": 1200.0} for s in (1, 2, 3)]
    records += [{"step": s, "kind": "probe", "task": "arithmetic", "entropy": 0.5 - 0.1 * s, "pass@1": 0.2 + 0.05 * s,
                 "pass@8": 0.5} for s in (0, 3)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (d / "config_history.jsonl").write_text(json.dumps({"event": "create", "step": 0, "changes": {}, "config": {}}) + "\n")
    if method == "es":
        (d / "seed_log.jsonl").write_text(json.dumps({"step": 1, "scale": 1e-4, "coefficients": [1.0] * 8}) + "\n")
    (d / "eval_before.json").write_text(json.dumps(run_eval("before", problems(before))))
    (d / "eval_after.json").write_text(json.dumps(run_eval("after", problems(after))))
    return d


def write_claims(path: Path, data: Path, body: str) -> Path:
    path.write_text(f'[study]\ntitle = "Study"\ndata = "{data}"\nintro = "Synthetic."\n\n' + body)
    return path


def change(run, metric, expect, cid="C1", margin=None):
    """A claim with one change test (``margin``: its declared margin, which not_down needs)."""
    margin = 1 / 64 if margin is None and expect == "not_down" else margin
    return (f'[[claim]]\nid = "{cid}"\nclaim = "a claim"\npaper = "the paper"\ncommand = "bash run.sh {cid}"\n'
            f'decide = "more"\ncost = "1 h"\n\n[[claim.test]]\nkind = "change"\nrun = "{run}"\nmetric = "{metric}"\n'
            f'expect = "{expect}"\n' + (f"margin = {margin}\n" if margin is not None else "") + "\n")


def outcome(tmp_path, body):
    """The outcomes of a claims file whose data directory is ``tmp_path / "data"``."""
    data = tmp_path / "data"
    claims = load_claims(write_claims(tmp_path / "claims.toml", data, body))
    read = lambda p: json.loads(Path(p).read_text())  # noqa: E731
    return study.evaluate_claims(claims, read)


# -- statistics --------------------------------------------------------------------------------------


def test_bootstrap_interval_known_values():
    # half the problems gained one whole problem, half nothing: mean 0.5, sd of the mean 0.5/8 = 0.0625
    mean, lo, hi = bootstrap_interval([1.0] * 32 + [0.0] * 32)
    assert mean == 0.5
    assert lo == pytest.approx(0.5 - 1.96 * 0.0625, abs=0.03) and hi == pytest.approx(0.5 + 1.96 * 0.0625, abs=0.03)
    assert bootstrap_interval([1.0] * 32 + [0.0] * 32) == (mean, lo, hi)  # fixed seed: the page regenerates identically
    assert bootstrap_interval([0.25] * 10) == (0.25, 0.25, 0.25)


def test_interval_verdicts_in_every_direction():
    assert interval_verdict("up", 0.1, 0.3) == REPRODUCED
    assert interval_verdict("up", -0.3, -0.1) == CONTRADICTED
    assert interval_verdict("up", -0.1, 0.3) == INCONCLUSIVE
    assert interval_verdict("up", 0.0, 0.0) == INCONCLUSIVE  # nothing moved
    assert interval_verdict("down", -0.3, -0.1) == REPRODUCED
    assert interval_verdict("a_greater", 0.1, 0.2) == CONTRADICTED
    assert interval_verdict("b_greater", 0.1, 0.2) == REPRODUCED
    # not_down: non-inferiority against the test's margin (here 1/64 = 0.0156), contradicted only beyond it
    m = 1 / 64
    assert interval_verdict("not_down", -0.01, 0.02, m) == REPRODUCED
    assert interval_verdict("not_down", -0.01, -0.005, m) == REPRODUCED  # within the margin
    assert interval_verdict("not_down", -0.2, -0.05, m) == CONTRADICTED
    assert interval_verdict("not_down", -0.2, 0.05, m) == INCONCLUSIVE
    assert interval_verdict("not_down", -0.2, -0.01, m) == INCONCLUSIVE  # below 0, but not beyond the margin
    assert interval_verdict("equal", -0.01, 0.01, m) == REPRODUCED
    assert interval_verdict("equal", 0.05, 0.2, m) == CONTRADICTED
    assert interval_verdict("equal", 0.01, 0.2, m) == INCONCLUSIVE  # excludes 0, not the margin: not contradicted
    assert interval_verdict("equal", -0.1, 0.1, m) == INCONCLUSIVE
    assert value_verdict(">", 40.0, 10.0) == REPRODUCED and value_verdict(">", 2.0, 10.0) == CONTRADICTED
    assert value_verdict(">", 5.0, 1.0, interval=[2.0, 9.0]) == REPRODUCED
    assert value_verdict(">", 5.0, 1.0, interval=[0.5, 9.0]) == INCONCLUSIVE
    assert value_verdict(">", 0.2, 1.0, interval=[0.05, 0.6]) == CONTRADICTED
    assert value_verdict("<", 0.2, 1.0, interval=[0.05, 0.6]) == REPRODUCED
    assert value_verdict(">", 1.5, 1.0, null=[0.9, 1.1]) == REPRODUCED
    assert value_verdict(">", 1.05, 1.0, null=[0.9, 1.1]) == INCONCLUSIVE
    assert value_verdict(">", 0.5, 1.0, null=[0.9, 1.1]) == CONTRADICTED
    assert claim_verdict([REPRODUCED, REPRODUCED]) == REPRODUCED
    assert claim_verdict([REPRODUCED, CONTRADICTED, NOT_RUN]) == CONTRADICTED
    assert claim_verdict([REPRODUCED, NOT_RUN]) == INCONCLUSIVE
    assert claim_verdict([NOT_RUN, NOT_RUN]) == NOT_RUN and claim_verdict([]) == NOT_RUN


def test_change_reproduced_contradicted_inconclusive(tmp_path):
    data = tmp_path / "data"
    write_run(data, "up", [0] * 64, [8] * 64)  # pass@1 0 -> 0.5 on every problem
    write_run(data, "worse", [8] * 64, [0] * 64)
    write_run(data, "mixed", [4] * 32 + [12] * 32, [12] * 32 + [4] * 32)  # +0.5 on half, -0.5 on the other half
    res = outcome(tmp_path, change("up", "pass@1", "up", "A") + change("worse", "pass@1", "up", "B")
                  + change("mixed", "pass@1", "up", "C") + change("up", "pass@16", "up", "D"))
    a, b, c, d = (r.tests[0] for r in res)
    assert (a.verdict, a.estimate, a.interval, a.a, a.b, a.problems) == (REPRODUCED, 0.5, [0.5, 0.5], 0.0, 0.5, 64)
    assert (b.verdict, b.estimate) == (CONTRADICTED, -0.5)
    assert c.verdict == INCONCLUSIVE and c.estimate == pytest.approx(0.0, abs=1e-12)
    assert c.interval[0] == pytest.approx(-1.96 * 0.5 / 8, abs=0.03) and c.interval[1] == pytest.approx(1.96 * 0.5 / 8, abs=0.03)
    assert d.estimate == pytest.approx(1.0) and d.verdict == REPRODUCED  # pass@16 of 0 -> 8 correct of 16
    assert [r.verdict for r in res] == [REPRODUCED, CONTRADICTED, INCONCLUSIVE, REPRODUCED]
    text = study.describe(a)
    assert "up pass@1 0.000 → 0.500" in text and "+0.500 [+0.500, +0.500]" in text and "64 problems" in text


def test_a_claim_is_contradicted_only_at_its_family_wise_level(tmp_path):
    """One 95% contradiction among many tests is what chance gives: it contradicts the claim only when it holds at
    the Bonferroni level 1 - 0.05 / m; a context test is reported but not counted."""
    assert study.family_level(1) == pytest.approx(0.95) and study.family_level(20) == pytest.approx(0.9975)
    assert claim_verdict([REPRODUCED, CONTRADICTED], [REPRODUCED, INCONCLUSIVE]) == INCONCLUSIVE
    assert claim_verdict([REPRODUCED, CONTRADICTED], [INCONCLUSIVE, CONTRADICTED]) == CONTRADICTED
    assert claim_verdict([REPRODUCED, REPRODUCED], [INCONCLUSIVE, INCONCLUSIVE]) == REPRODUCED  # all at 95%: no correction
    with pytest.raises(ValueError, match="one family-wise verdict per test"):
        claim_verdict([REPRODUCED], [])
    data = tmp_path / "data"
    # pass@1 falls by 1/16 on 20 of 64 problems and rises by 1/16 on 8: mean -0.0117, standard error ~0.0050 -> the
    # 95% interval excludes 0 (z 1.96), the 99.75% one of 20 tests (z 3.02) does not
    write_run(data, "slip", [2] * 64, [1] * 20 + [3] * 8 + [2] * 36)
    write_run(data, "up", [0] * 64, [8] * 64)
    write_run(data, "worse", [8] * 64, [0] * 64)
    test = lambda run, context="": (f'[[claim.test]]\nkind = "change"\nrun = "{run}"\nmetric = "pass@1"\nexpect = "up"\n'  # noqa: E731
                                    + (f'context = "{context}"\n' if context else "") + "\n")
    head = lambda cid: f'[[claim]]\nid = "{cid}"\nclaim = "c"\n\n'  # noqa: E731
    res = outcome(tmp_path, head("ALONE") + test("slip")
                  + head("MANY") + test("slip") + test("up") * 19
                  + head("REAL") + test("worse") + test("up") * 19
                  + head("CTX") + test("up") + test("worse", "the reverse order"))
    alone, many, real, ctx = res
    assert alone.tests[0].verdict == CONTRADICTED and alone.verdict == CONTRADICTED  # a family of one: 95%
    assert alone.tests[0].family_level is None and study.family_note(alone.tests[0]) == ""
    slip = many.tests[0]
    assert slip.verdict == CONTRADICTED and slip.family_level == pytest.approx(0.9975)
    assert slip.family_verdict == INCONCLUSIVE and slip.family_interval[0] < 0 <= slip.family_interval[1]
    assert slip.family_interval[0] < slip.interval[0] and many.verdict == INCONCLUSIVE
    text = study.describe(slip)
    assert "family-wise 99.75% (20 counted tests)" in text and "does not contradict the claim" in text
    assert real.tests[0].family_verdict == CONTRADICTED and real.verdict == CONTRADICTED
    assert ctx.verdict == REPRODUCED and ctx.tests[1].verdict == CONTRADICTED and ctx.tests[1].context
    assert "(context, not counted in the claim's verdict: the reverse order)" in study.describe(ctx.tests[1])


def test_family_wise_enrichment_intervals_widen_the_records_own():
    from evolm.analysis.enrichment import count_enrichment, share_enrichment

    rec = count_enrichment(28, 100, 0.197)  # C6's ES attention row: 28 observed, 19.7 expected
    assert study.count_interval(rec, 0.95) == pytest.approx(rec["enrichment_interval"])
    wide = study.count_interval(rec, 0.9975)
    assert wide[0] < rec["enrichment_interval"][0] and wide[1] > rec["enrichment_interval"][1]
    share = share_enrichment(sum_sq=2.6, num_params=250, total_sq=1000.0, total_fourth=40.0, total_params=100_000)
    assert share["z"] > 0 and share["null_enrichment_interval"][1] < 1.5
    assert study.null_interval(share, 0.95) == pytest.approx(share["null_enrichment_interval"])
    lo, hi = study.null_interval(share, 0.9975)
    assert lo < share["null_enrichment_interval"][0] and hi > share["null_enrichment_interval"][1]


def test_pass_at_k_per_problem_is_the_unbiased_estimator(tmp_path):
    data = tmp_path / "data"
    cs_before, cs_after = list(range(0, 16)) * 4, [min(c + 3, 16) for c in range(0, 16)] * 4
    write_run(data, "r", cs_before, cs_after)
    res = outcome(tmp_path, change("r", "pass@4", "up"))[0].tests[0]
    expect = np.mean([pass_at_k_problem(16, y, 4) - pass_at_k_problem(16, x, 4) for x, y in zip(cs_before, cs_after)])
    assert res.estimate == pytest.approx(expect) and res.verdict == REPRODUCED


def test_entropy_not_down(tmp_path):
    data = tmp_path / "data"
    rng = np.random.default_rng(1)
    # the same problems and correctness, chosen entropies: a tiny drop (within 1/64), a large drop, a wide spread
    cases = {"tiny": [0.5 - 0.001] * 64, "large": [0.1] * 64, "wide": list(0.5 + rng.choice([-0.5, 0.5], 64))}
    for name, after in cases.items():
        d = write_run(data, name, [4] * 64, [4] * 64)
        (d / "eval_before.json").write_text(json.dumps(run_eval("before", problems([4] * 64, entropy=[0.5] * 64))))
        (d / "eval_after.json").write_text(json.dumps(run_eval("after", problems([4] * 64, entropy=after))))
    res = outcome(tmp_path, change("tiny", "entropy", "not_down", "A") + change("large", "entropy", "not_down", "B")
                  + change("wide", "entropy", "not_down", "C") + change("large", "entropy", "down", "D"))
    tiny, large, wide, down = (r.tests[0] for r in res)
    assert tiny.verdict == REPRODUCED and tiny.estimate == pytest.approx(-0.001)
    assert large.verdict == CONTRADICTED and large.estimate == pytest.approx(-0.4)
    assert wide.verdict == INCONCLUSIVE
    assert down.verdict == REPRODUCED


def test_compare_and_mismatched_problems(tmp_path):
    data = tmp_path / "data"
    write_run(data, "grpo", [4] * 64, [12] * 64, method="grpo")
    write_run(data, "es", [4] * 64, [6] * 64)
    matched = data / "matched" / "es-at-grpo-sequences"
    matched.mkdir(parents=True)
    (matched / "eval.json").write_text(json.dumps({"model": {"spec": "x"}, "settings": {"n": 16},
                                                   "tasks": {"arithmetic": run_eval("x", problems([5] * 64))}}))
    body = ('[[claim]]\nid = "C2"\nclaim = "c"\n\n'
            '[[claim.test]]\nkind = "compare"\na = "grpo/eval_after.json"\nb = "es/eval_after.json"\nmetric = "pass@1"\nexpect = "a_greater"\n\n'
            '[[claim.test]]\nkind = "compare"\na = "es/eval_before.json"\nb = "matched/es-at-grpo-sequences/eval.json"\nmetric = "pass@1"\nexpect = "b_greater"\n\n'
            '[[claim.test]]\nkind = "compare"\na = "es/eval_after.json"\nb = "grpo/eval_after.json"\nmetric = "greedy"\nexpect = "equal"\n'
            'margin = 0.1\n')
    res = outcome(tmp_path, body)[0]
    first, second, third = res.tests
    assert (first.verdict, first.estimate) == (REPRODUCED, pytest.approx(6 / 16 - 12 / 16))
    assert (second.verdict, second.estimate) == (REPRODUCED, pytest.approx(1 / 16))
    # greedy_correct is c > n/2: 6 of 16 -> wrong, 12 of 16 -> right on every problem: b - a = 1, not equal (its exact
    # interval lies beyond the margin 0.1)
    assert third.verdict == CONTRADICTED and third.estimate == 1.0 and third.method == "exact" and third.interval[0] > 0.85
    assert res.verdict == CONTRADICTED
    # a file of other problems: one line naming both files
    ids = [f"arithmetic:{i + 100}" for i in range(64)]
    (matched / "eval.json").write_text(json.dumps({"tasks": {"arithmetic": run_eval("x", problems([5] * 64, ids=ids))}}))
    with pytest.raises(UserError) as e:
        outcome(tmp_path, body)
    msg = str(e.value)
    assert "\n" not in msg and str(data / "es" / "eval_before.json") in msg
    assert str(matched / "eval.json") in msg and "different problems" in msg


def test_missing_files_and_not_run(tmp_path):
    data = tmp_path / "data"
    write_run(data, "es", [4] * 64, [6] * 64)
    body = (change("nowhere", "pass@1", "up", "A") + change("es", "pass@1", "up", "B") +
            '[[claim.test]]\nkind = "change"\nrun = "es"\nmetric = "pass@16"\nexpect = "up"\nnot_run = "no time"\n\n'
            '[[claim]]\nid = "C"\nclaim = "c"\nnot_run = "too expensive here"\n\n'
            '[[claim.test]]\nkind = "change"\nrun = "es"\nmetric = "pass@1"\nexpect = "up"\n\n'
            '[[claim.test]]\nkind = "change"\nrun = "es"\nmetric = "pass@16"\nexpect = "up"\n')
    a, b, c = outcome(tmp_path, body)
    assert a.verdict == NOT_RUN and a.tests[0].verdict == NOT_RUN and "missing" in a.tests[0].detail
    assert str(data / "nowhere" / "eval_before.json") in a.tests[0].detail
    assert b.verdict == INCONCLUSIVE and b.tests[0].verdict == REPRODUCED  # one test ran, one did not
    assert b.tests[1].verdict == NOT_RUN and b.tests[1].detail == "no time"
    assert c.verdict == NOT_RUN and [t.verdict for t in c.tests] == [NOT_RUN, NOT_RUN]
    assert c.tests[0].detail == "too expensive here"


def _analyses(data: Path) -> None:
    """drift.json and localisation.json computed by the real analyses from small state dicts: ES moves 10 norm
    coordinates by 1 and every other coordinate by at most 1e-3; GRPO moves the 500 embedding coordinates most."""
    import torch

    from evolm.analysis.drift import drift
    from evolm.analysis.localisation import top_k_localisations

    g = torch.Generator().manual_seed(0)
    base = {"model.norm.weight": torch.ones(10), "model.layers.0.self_attn.q_proj.weight": torch.randn(49, 10, generator=g),
            "model.embed_tokens.weight": torch.randn(50, 10, generator=g)}
    small = {k: 1e-3 * torch.rand(v.shape, generator=g) for k, v in base.items()}
    es = {k: v + small[k] + (1.0 if k == "model.norm.weight" else 0.0) for k, v in base.items()}
    grpo = {k: v + 1e-4 * small[k] + (0.01 if "embed" in k else 0.0) for k, v in base.items()}
    d = data / "analyses" / "c1c2"
    d.mkdir(parents=True)
    models = {"es": es, "grpo": grpo}
    (d / "drift.json").write_text(json.dumps({"kind": "drift", "models": {k: drift(base, m) for k, m in models.items()}}))
    loc = {k: {str(kk): v for kk, v in top_k_localisations(base, m, [100]).items()} for k, m in models.items()}
    (d / "localisation.json").write_text(json.dumps({"kind": "localisation", "models": loc}))


def value(cid, file, path, expect=">", threshold=1.0, over=""):
    return (f'[[claim]]\nid = "{cid}"\nclaim = "c"\n\n[[claim.test]]\nkind = "value"\nfile = "{file}"\npath = "{path}"\n'
            f'expect = "{expect}"\nthreshold = {threshold}\n{over}\n')


def test_value_tests_report_intervals_and_p_values(tmp_path):
    _analyses(tmp_path / "data")
    drift_json = json.loads((tmp_path / "data" / "analyses" / "c1c2" / "drift.json").read_text())
    over = 'over = { file = "analyses/c1c2/drift.json", path = "models.grpo.relative_distance" }'
    res = outcome(tmp_path, value("A", "analyses/c1c2/drift.json", "models.es.relative_distance", threshold=10.0, over=over)
                  + value("B", "analyses/c1c2/localisation.json", "models.es.100.enrichment.by_category.norm")
                  + value("C", "analyses/c1c2/localisation.json", "models.es.100.enrichment.by_category.attention")
                  + value("D", "analyses/c1c2/drift.json", "models.es.enrichment.by_category.norm")
                  + value("E", "analyses/c1c2/localisation.json", "models.grpo.100.enrichment.by_category.embedding"))
    ratio, norm, attention, share, emb = (r.tests[0] for r in res)
    es_d, grpo_d = drift_json["models"]["es"]["relative_distance"], drift_json["models"]["grpo"]["relative_distance"]
    assert ratio.estimate == pytest.approx(es_d / grpo_d) and ratio.estimate > 10 and ratio.verdict == REPRODUCED
    assert f"= {es_d:.3g} / {grpo_d:.3g}" in study.describe(ratio) and "exact, one run" in study.describe(ratio)
    # 10 norm coordinates of 1000 (1 expected in a top 100) all in ES's top 100: enrichment 10, exact interval above 1
    assert norm.verdict == REPRODUCED and norm.estimate == pytest.approx(10.0) and norm.interval[0] > 1
    assert norm.p < 1e-6 and "10 observed, 1 expected" in study.describe(norm) and "exact 95%" in study.describe(norm)
    assert attention.verdict == INCONCLUSIVE and attention.interval[0] < 1 < attention.interval[1]
    assert share.verdict == REPRODUCED and share.null is not None and "null 95%" in study.describe(share)
    assert emb.verdict == REPRODUCED and emb.estimate == pytest.approx(2.0)  # 100 of 100 where 50 are expected
    with pytest.raises(UserError, match="has no 'relative_distanc'"):
        outcome(tmp_path, value("F", "analyses/c1c2/drift.json", "models.es.relative_distanc"))


def test_a_value_test_reads_a_dtype_null_record_on_the_null_s_own_scale(tmp_path):
    """analyze magnitude's dtype-matched null (Q3c): the estimate is observed / the null's expected count and the
    null's interval is divided by the same number, so a count inside the null reads inconclusive and one below it
    reproduces "<"; a record of the old null (step counts shuffled across spacings, no ``null`` field) is stale and
    reads "not run"."""
    import torch

    from evolm.analysis.magnitude import dtype_null_localisation, ulp

    g = torch.Generator().manual_seed(0)
    norm, mat = "model.layers.0.input_layernorm.weight", "model.layers.0.mlp.up_proj.weight"
    base = {norm: (1 + 0.5 * torch.rand(2000, generator=g)).bfloat16().float(),
            mat: (0.02 * torch.randn(200, 100, generator=g)).bfloat16().float()}
    def walk(steps, start=base):  # steps[n] +1-ulp steps on every coordinate of tensor n
        out = {}
        for n, x in start.items():
            for _ in range(steps.get(n, 0)):
                x = (x + ulp(x, "bfloat16")).bfloat16().float()
            out[n] = x
        return out
    d = tmp_path / "data" / "analyses" / "m"
    d.mkdir(parents=True)
    # all: every coordinate one step (the norm weights' large ulp puts all 100 there, observed and null alike);
    # fewer: norm weights on the matrices' scale (the same spacings) that took 1 step where the matrices took 4
    small = dict(base, **{norm: (0.02 * torch.randn(2000, generator=g)).bfloat16().float()})
    for name, start, steps in (("all", base, {norm: 1, mat: 1}), ("fewer", small, {norm: 1, mat: 4})):
        rec = dtype_null_localisation(start, walk(steps, start), "bfloat16", k=100, permutations=1000)
        (d / f"{name}.json").write_text(json.dumps({"models": {"es": {"dtype_null": rec}}}))
    old = json.loads((d / "all.json").read_text())
    del old["models"]["es"]["dtype_null"]["null"]
    for r in old["models"]["es"]["dtype_null"]["by_category"].values():
        del r["null"], r["permutations"]
    (d / "old.json").write_text(json.dumps(old))
    res = outcome(tmp_path, value("A", "analyses/m/all.json", "models.es.dtype_null.by_category.norm", expect="<")
                  + value("B", "analyses/m/fewer.json", "models.es.dtype_null.by_category.norm", expect="<")
                  + value("C", "analyses/m/old.json", "models.es.dtype_null.by_category.norm", expect="<"))
    same, fewer, stale = (r.tests[0] for r in res)
    assert same.estimate == pytest.approx(1.0) and same.null == pytest.approx([1.0, 1.0]) and same.verdict == INCONCLUSIVE
    assert fewer.estimate == 0 and fewer.null[0] > 0 and fewer.verdict == REPRODUCED
    assert "under the dtype-matched null" in study.describe(fewer) and "null 95%" in study.describe(fewer)
    assert stale.verdict == NOT_RUN and "stale" in stale.detail


def test_per_problem_list_values_get_a_bootstrap_interval(tmp_path):
    d = tmp_path / "data" / "analyses" / "c3"
    d.mkdir(parents=True)
    pop = [1.0] * 40 + [0.5] * 24
    center = [0.5] * 64
    js, null = [0.2] * 64, [0.05 + 0.3 * (i % 2) for i in range(64)]  # null averages 0.2: no excess
    (d / "diversity.json").write_text(json.dumps({"population_per_prompt": pop, "center_per_prompt": center,
                                                  "js": js, "null": null, "bad": [1, "x"]}))
    minus = lambda path: f'minus = {{ file = "analyses/c3/diversity.json", path = "{path}" }}'  # noqa: E731
    res = outcome(tmp_path, value("A", "analyses/c3/diversity.json", "population_per_prompt", threshold=0.0,
                                  over=minus("center_per_prompt"))
                  + value("B", "analyses/c3/diversity.json", "js", threshold=0.0, over=minus("null"))
                  + value("C", "analyses/c3/diversity.json", "center_per_prompt", expect="<", threshold=0.4))
    gap, excess, level = (r.tests[0] for r in res)
    # 40 of 64 problems differ by 0.5, the rest by 0: mean 0.3125, bootstrap interval well above 0
    assert gap.estimate == pytest.approx(40 * 0.5 / 64) and gap.interval[0] > 0 and gap.verdict == REPRODUCED
    assert (gap.a, gap.b, gap.problems) == (pytest.approx(sum(pop) / 64), 0.5, 64)
    assert "64 problems, 95% bootstrap" in study.describe(gap) and "− center_per_prompt" in gap.label
    assert excess.estimate == pytest.approx(0.0) and excess.interval[0] < 0 < excess.interval[1]
    assert excess.verdict == INCONCLUSIVE
    assert level.verdict == CONTRADICTED and level.interval == [0.5, 0.5]  # a constant list: a zero-width interval
    with pytest.raises(UserError, match="not a list of numbers"):
        outcome(tmp_path, value("D", "analyses/c3/diversity.json", "bad", threshold=0.0))
    (d / "short.json").write_text(json.dumps({"x": [0.1, 0.2]}))
    with pytest.raises(UserError, match="minus needs the same problems"):
        outcome(tmp_path, value("E", "analyses/c3/diversity.json", "js", threshold=0.0,
                                over='minus = { file = "analyses/c3/short.json", path = "x" }'))
    with pytest.raises(UserError, match="minus subtracts lists"):
        outcome(tmp_path, value("F", "analyses/c3/short.json", "x.0", threshold=0.0,
                                over='minus = { file = "analyses/c3/short.json", path = "x" }'))


def test_compare_changes_from_own_baselines(tmp_path):
    data = tmp_path / "data"
    # a (GRPO-like): 0.5 -> 0.5 under compression; b (ES-like): 0.75 -> 0.25 on every problem
    data.mkdir(parents=True, exist_ok=True)
    for name, cs in {"a0": [8] * 64, "a1": [8] * 64, "b0": [12] * 64, "b1": [4] * 64}.items():
        (data / f"{name}.json").write_text(json.dumps(run_eval("after", problems(cs))))
    body = ('[[claim]]\nid = "Q"\nclaim = "c"\n\n[[claim.test]]\nkind = "compare"\na = "a1.json"\nb = "b1.json"\n'
            'a_base = "a0.json"\nb_base = "b0.json"\nmetric = "pass@1"\nexpect = "a_greater"\n')
    r = outcome(tmp_path, body)[0].tests[0]
    assert r.estimate == pytest.approx(-0.5) and r.interval == [-0.5, -0.5] and r.verdict == REPRODUCED
    assert outcome(tmp_path, body.replace('"a_greater"', '"b_not_less"\nmargin = 0.1'))[0].tests[0].verdict == CONTRADICTED
    swapped = body.replace('"a1.json"', '"B1"').replace('"b1.json"', '"a1.json"').replace('"B1"', '"b1.json"')
    swapped = swapped.replace('"a0.json"', '"B0"').replace('"b0.json"', '"a0.json"').replace('"B0"', '"b0.json"')
    assert outcome(tmp_path, swapped.replace('"a_greater"', '"b_not_less"\nmargin = 0.1'))[0].tests[0].verdict == REPRODUCED
    assert (r.a, r.b) == (pytest.approx(0.0), pytest.approx(-0.5)) and len(r.files) == 4
    assert "difference in changes" in study.describe(r) and "(b1.json − b0.json) − (a1.json − a0.json)" in r.label
    (data / "b0.json").write_text(json.dumps(run_eval("after", problems([12] * 63))))
    with pytest.raises(UserError, match="hold different problems"):
        outcome(tmp_path, body)
    with pytest.raises(ConfigError, match="a_base and b_base go together"):
        load_claims(write_claims(tmp_path / "claims.toml", data, body.replace('b_base = "b0.json"\n', "")))


def test_claims_file_errors_are_one_line_configerrors(tmp_path):
    data = tmp_path / "data"
    cases = {
        change("r", "pass@1", "up").replace('metric = "pass@1"', 'metrc = "pass@1"'): "did you mean 'metric'",
        change("r", "pass@1", "up").replace('kind = "change"', 'kind = "delta"'): "kind must be one of",
        change("r", "pass@1", "up").replace('expect = "up"', 'expect = "b_greater"'): "expect must be one of up, down, not_down",
        change("r", "pass@1", "up").replace('metric = "pass@1"', 'metric = "pass@0"'): "metric must be pass@K",
        change("r", "pass@1", "up").replace('run = "r"', 'run = "r"\nfile = "x.json"'): "does not take file",
        change("r", "pass@1", "up").replace('run = "r"\n', ''): 'needs run (e.g. run = "c1c2-es")',
        change("r", "pass@1", "up") + change("r", "pass@1", "up"): "the id C1 is used twice",
        '[[claim]]\nid = "X"\nclaim = "c"\nverdict = "reproduced"\n': "unknown config field 'claim[0].verdict'",
        value("V", "a.json", "x", over='minus = { file = "a.json" }'): "minus needs file and path",
        value("V", "a.json", "x", over='over = { file = "a.json", path = "y" }\nminus = { file = "a.json", path = "z" }'):
            "takes over (a ratio of numbers) or minus",
        change("r", "pass@1", "up") + 'minus = { file = "a.json", path = "z" }\n': "does not take minus",
    }
    for body, expected in cases.items():
        path = write_claims(tmp_path / "claims.toml", data, body)
        with pytest.raises(ConfigError) as e:
            load_claims(path)
        assert expected in str(e.value) and "\n" not in str(e.value) and str(path) in str(e.value), (expected, str(e.value))


def test_page_and_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    data = Path("data")
    write_run(data, "c1c2-grpo", [4] * 64, [12] * 64, method="grpo")
    write_run(data, "c1c2-es", [4] * 64, [5] * 64)
    _analyses(data)
    body = (change("c1c2-grpo", "pass@1", "up", "C1") + change("c1c2-es", "pass@16", "up", "C2")
            + value("C6", "analyses/c1c2/localisation.json", "models.es.100.enrichment.by_category.norm")
            + change("c1c2-es", "pass@1", "up", "C3").replace('cost = "1 h"', 'cost = "1 h"\nnot_run = "no budget"'))
    claims = write_claims(Path("claims.toml"), data, body)
    assert main(["report", "--study", str(claims), "--out", "docs"]) == 0
    said = capsys.readouterr().out
    assert "wrote docs/REPRODUCTION.md (4 claims" in said
    md = Path("docs/REPRODUCTION.md").read_text()
    assert md.startswith("# Study\n") and "Generated by `evolm report --study claims.toml`" in md
    # a summary of at most ten lines, then one short row per claim, then a few lines per claim linking its page
    heads = re.findall(r"^## .*$", md, re.M)
    assert heads[:2] == ["## Summary", "## Verdicts"] and heads[2:6] == ["## C1: a claim", "## C2: a claim", "## C6: c",
                                                                         "## C3: a claim"]
    summary = [line for line in md.split("## Summary")[1].split("\n## ")[0].splitlines() if line.strip()]
    assert len(summary) <= 10
    assert any("Q4_1 GGUF" in line and "dequantised to float32" in line for line in summary)
    table = md.split("## Verdicts")[1].split("\n## ")[0]
    assert "| claim | in a few words | verdict | scale (model, N, updates, seeds) | declared |" in table
    rows = [line for line in table.splitlines() if line.startswith("| [")]
    assert [re.match(r"\| \[(\w+)\]\(study/page/\1\.md\)", r).group(1) for r in rows] == ["C1", "C2", "C6", "C3"]
    assert "**reproduced**" in rows[0] and "**not run**" in rows[3] and all(len(r) <= 400 for r in rows)
    brief = md.split("## C1: a claim")[1].split("\n## ")[0]
    assert "+0.500 [+0.500, +0.500]" in brief and "all 1 counted test reproduced" in brief and "](study/page/C1.md)" in brief
    assert "no budget" in md.split("## C3: a claim")[1].split("\n## ")[0]
    # each claim's page: its command, tests, figure and evaluations
    c1 = Path("docs/study/page/C1.md").read_text()
    assert c1.startswith("# C1: a claim\n") and "](../../REPRODUCTION.md)" in c1
    assert "**Command**: `bash run.sh C1`" in c1 and "- c1c2-grpo pass@1 0.250 → 0.750" in c1
    assert "**Not run**: no budget" in Path("docs/study/page/C3.md").read_text()
    # the figures the pages link exist and are PNGs, under docs/study/figures
    pages = {p.name: p.read_text() for p in Path("docs/study/page").glob("*.md")}
    assert set(pages) == {"C1.md", "C2.md", "C6.md", "C3.md", "runs.md", "analyses.md"}
    linked = [f for text in pages.values() for f in re.findall(r"\]\(\.\./(figures/[^)]+\.png)\)", text)]
    assert linked and all((Path("docs/study") / f).read_bytes()[:4] == b"\x89PNG" for f in linked)
    assert "](../figures/passk-c1.png)" in c1
    heads = re.findall(r"^## .*$", pages["runs.md"] + pages["analyses.md"], re.M)
    assert {"## Held-out probe: entropy and pass@k during training", "## Analysis: localisation",
            "## What was run", "## How the verdicts are reached"} <= set(heads)
    # files read are listed, one line per directory, relative to the current directory: no absolute path
    files = pages["runs.md"].split("## Files read")[1]
    assert "- `claims.toml`" in files and "- `data/analyses/c1c2/{localisation.json, drift.json}`" in files
    es_line = next(line for line in files.splitlines() if line.startswith("- `data/c1c2-es/{"))
    assert "eval_after.json" in es_line and "metrics.jsonl" in es_line
    assert "## Files read" not in md and "](study/page/runs.md#files-read)" in md
    assert str(tmp_path) not in md + "".join(pages.values())
    record = json.loads(Path("docs/study/reproduction.json").read_text())
    assert [c["verdict"] for c in record["claims"]] == [REPRODUCED, INCONCLUSIVE, REPRODUCED, NOT_RUN]
    assert sorted(record["figures"]) == sorted(f"study/{f}" for f in dict.fromkeys(linked))
    # the runs table comes from the copied run directories (no weights): status from run.json
    assert "| c1c2-grpo | grpo | smollm2-135m | float32 | cpu | 1 | arithmetic (digits=2) | finished | 3 | 120 |" in pages["runs.md"]
    # a page for a claim that no longer exists is removed on the next build
    Path("docs/study/page/C99.md").write_text("# stale\n")
    assert main(["report", "--study", str(claims), "--out", "docs"]) == 0
    capsys.readouterr()
    assert not Path("docs/study/page/C99.md").exists()
    # --study takes no PATH
    assert main(["report", "--study", str(claims), "runs/es"]) == 2
    assert "--study takes no PATH" in capsys.readouterr().err
    # a bad claims file is one line on stderr
    Path("bad.toml").write_text('[[claim]]\nid = "X"\nclaim = "c"\n\n[[claim.test]]\nkind = "delta"\n')
    assert main(["report", "--study", "bad.toml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("evolm: error: bad.toml: ") and err.count("\n") == 1 and "kind must be one of" in err


def test_copied_run_directory_reads_like_a_run(tmp_path):
    from evolm.report.read import Reader, gather

    d = write_run(tmp_path, "c1c2-es", [4] * 64, [5] * 64)
    src = gather([str(d)], {}, Reader())
    (run,) = src.runs
    assert run.info["status"] == "finished" and not (d / "final").exists()
    assert len(run.train) == 3 and len(run.probes) == 2 and run.eval_after["problems"][0]["c"] == 5


def test_the_committed_claims_file():
    claims = load_claims(ROOT / "experiments" / "study" / "claims.toml")
    ids = [c.id for c in claims.claim]
    assert ids == [f"C{i}" for i in range(1, 10)] + ["Q1", "Q2", "Q3a", "Q3b", "Q3c", "Q3d", "Q4"]
    for c in claims.claim:
        assert c.claim and c.paper and c.command and c.decide and c.cost, c.id
        assert c.not_run or c.test, f"{c.id} is neither run nor says why not"
    # nothing committed yet: every row still renders, as "not run"
    out = study.evaluate_claims(claims, lambda p: json.loads(Path(p).read_text()), ROOT / "no-such-dir")
    assert {o.verdict for o in out} == {NOT_RUN}


def test_float_noise_never_makes_an_interval_exclude_zero():
    """Differences that cancel exactly (here 1/3 - 1/3 style fractions) must give an interval touching 0,
    not one starting at +1e-17 that would turn 'equal' into 'contradicted'."""
    from evolm.report.study import bootstrap_interval, interval_verdict

    diffs = [0.1 + 0.2 - 0.3] * 40 + [1 / 3 - (1 - 2 / 3)] * 20 + [1 / 64, 0.0, 0.0, 0.0]
    mean, lo, hi = bootstrap_interval(diffs)
    assert lo == 0.0 and hi > 0
    assert interval_verdict("equal", lo, hi, 1 / 64) != "contradicted"


def test_greedy_only_evaluations_are_tabled_not_drawn(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = Path("data")
    d = data / "analyses" / "c5" / "sparsity"
    d.mkdir(parents=True)
    for name, correct in {"es_trained": [True] * 40 + [False] * 24, "es_x8": [True] * 39 + [False] * 25}.items():
        probs = [{"id": f"arithmetic:{i}", "greedy_correct": c} for i, c in enumerate(correct)]  # n = 0: no samples
        (d / f"{name}.json").write_text(json.dumps({"task": "arithmetic", "split": "test", "problems": probs}))
    body = ('[[claim]]\nid = "C5"\nclaim = "c"\n\n[[claim.test]]\nkind = "compare"\na = "analyses/c5/sparsity/es_trained.json"\n'
            'b = "analyses/c5/sparsity/es_x8.json"\nmetric = "greedy"\nexpect = "equal"\nmargin = 0.05\n')
    result = build_study(write_claims(Path("claims.toml"), data, body), "docs")
    (test,) = result.outcomes[0].tests
    assert test.estimate == pytest.approx(-1 / 64) and test.problems == 64
    section = Path("docs/study/page/C5.md").read_text().split("## Verdict and tests")[1].split("\n## ")[0]
    assert "](../figures/" not in section  # nothing to draw without samples
    assert "| analyses/c5/sparsity/es_x8.json |" in section or "es_x8" in section
    assert "0.609 [" in section  # es_x8's greedy mean with its interval


def test_collect_copies_run_and_evaluation_files_and_never_weights(tmp_path):
    """experiments/study/collect.py: a run's files (and a continued run's earlier evaluation), an
    evaluation directory named base/, never a directory holding weights nor a run's final/."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("study_collect", ROOT / "experiments" / "study" / "collect.py")
    collect = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(collect)
    src, dst = tmp_path / "runs", tmp_path / "docs"
    run = src / "es-run"
    (run / "final").mkdir(parents=True)
    for f in ("run.json", "config.toml", "eval_after.json", "eval_after_step160.json", "final/config.json"):
        (run / f).write_text("{}")
    (run / "final" / "model.safetensors").write_bytes(b"w")
    (src / "k32" / "base").mkdir(parents=True)
    (src / "k32" / "base" / "eval.json").write_text("{}")
    weights = src / "analyses" / "c5" / "base"
    weights.mkdir(parents=True)
    for f in ("config.json", "tokenizer.json"):
        (weights / f).write_text("{}")
    (weights / "model.safetensors").write_bytes(b"w")
    (src / "analyses" / "c5" / "sparsity.json").write_text("{}")
    written = sorted(str(p.relative_to(dst)) for p in collect.collect(src, dst))
    assert written == ["analyses/c5/sparsity.json", "es-run/config.toml", "es-run/eval_after.json",
                       "es-run/eval_after_step160.json", "es-run/run.json", "k32/base/eval.json"]


def test_contrast_interval_resamples_each_set_on_its_own():
    first = [0.0, 1.0] * 32
    # with a constant second set the contrast is the first set's own bootstrap (same seed, same resamples)
    assert study.contrast_interval(first, [0.0] * 23) == bootstrap_interval(first)
    assert study.contrast_interval(first, [0.25] * 23) == tuple(round(x - 0.25, 12) for x in bootstrap_interval(first))
    mean, lo, hi = study.contrast_interval([0.5] * 64, [0.0, 0.5] * 10)
    assert mean == pytest.approx(0.25) and lo < 0.25 < hi and lo >= 0.0 and hi <= 0.5
    with pytest.raises(ValueError, match="at least one problem in each set"):
        study.contrast_interval([1.0], [])


def test_contrast_of_gaps_on_two_problem_sets(tmp_path):
    """C7's test: the N = 10 -> 30 gap at one scale against the same gap at another, on each model's own problems."""
    data = tmp_path / "data"
    data.mkdir(parents=True)
    other = [f"other:{i}" for i in range(23)]
    files = {"s10": problems([4] * 64), "s30": problems([12] * 64),  # gap +0.5 on the first set
             "g10": problems([8] * 23, ids=other), "g30": problems([8] * 23, ids=other)}  # gap 0 on the second
    for name, probs in files.items():
        (data / f"{name}.json").write_text(json.dumps(run_eval("after", probs)))
    body = ('[[claim]]\nid = "C7"\nclaim = "c"\n\n[[claim.test]]\nkind = "contrast"\na = "s10.json"\nb = "s30.json"\n'
            'c = "g10.json"\nd = "g30.json"\nmetric = "pass@1"\nexpect = "first_greater"\n')
    r = outcome(tmp_path, body)[0].tests[0]
    assert (r.verdict, r.estimate, r.interval) == (REPRODUCED, pytest.approx(0.5), [0.5, 0.5])
    assert (r.a, r.b, r.problems) == (pytest.approx(0.5), pytest.approx(0.0), 87) and len(r.files) == 4
    said = study.describe(r)
    assert "first gap +0.500, second gap +0.000" in said and "64 + 23 problems" in said
    assert r.label == "pass@1 of (s30.json − s10.json) − (g30.json − g10.json)"
    assert outcome(tmp_path, body.replace("first_greater", "second_greater"))[0].tests[0].verdict == CONTRADICTED
    # equal gaps on both sets: the interval holds 0
    (data / "s30.json").write_text(json.dumps(run_eval("after", problems([4] * 64))))
    assert outcome(tmp_path, body)[0].tests[0].verdict == INCONCLUSIVE
    # within a pair the problems must be the same; a missing file is "not run"; d is required
    (data / "g30.json").write_text(json.dumps(run_eval("after", problems([8] * 23))))
    with pytest.raises(UserError, match="hold different problems"):
        outcome(tmp_path, body)
    (data / "g30.json").unlink()
    assert outcome(tmp_path, body)[0].tests[0].verdict == NOT_RUN
    with pytest.raises(ConfigError, match='needs d'):
        load_claims(write_claims(tmp_path / "claims.toml", data, body.replace('d = "g30.json"\n', "")))
    with pytest.raises(ConfigError, match="does not take task"):
        load_claims(write_claims(tmp_path / "claims.toml", data, body + 'task = "arithmetic"\n'))


def test_page_shows_the_sweep_of_a_tested_point(tmp_path, monkeypatch):
    """A test naming a sweep point's file brings the sweep's section (curves, population-scaling band) to the page."""
    monkeypatch.chdir(tmp_path)
    data = Path("data")
    points = []
    for n, after in ((10, [5] * 64), (30, [9] * 64)):
        name = f"es.population={n}"
        write_run(data / "c7", name, [4] * 64, after)
        points.append({"name": name, "assignments": {"es.population": n}, "dir": name, "status": "finished"})
    (data / "c7" / "sweep.json").write_text(json.dumps({"format": 1, "kind": "es", "grid": {"es.population": [10, 30]},
                                                        "points": points}))
    body = ('[[claim]]\nid = "C7"\nclaim = "c"\n\n[[claim.test]]\nkind = "compare"\na = "c7/es.population=10/eval_after.json"\n'
            'b = "c7/es.population=30/eval_after.json"\nmetric = "pass@1"\nexpect = "b_greater"\n')
    build_study(write_claims(Path("claims.toml"), data, body), "docs")
    md = Path("docs/study/page/analyses.md").read_text()
    assert "## Sweep c7 (es): es.population" in md
    sweep = md.split("## Sweep c7 (es): es.population")[1]
    assert "population" in sweep.lower() and "](../figures/sweep-c7-curves" in sweep
    assert "- `data/c7/sweep.json`" in Path("docs/study/page/runs.md").read_text().split("## Files read")[1]


def test_pick_colour_keeps_a_directory_colour_and_never_repeats_one_within_a_figure():
    from evolm.document import COLORS
    from evolm.report.reproduction import pick_colour

    page: dict[str, str] = {}
    first = {}
    for i in range(len(COLORS) + 2):  # an earlier figure with more directories than colours: it cycles
        pick_colour(f"run{i}", first, page)
    assert page["run0"] == COLORS[0] and page[f"run{len(COLORS)}"] == COLORS[0]
    # a later figure with run0 and run<len(COLORS)>, which the page gave the same colour: they must differ here
    figure: dict[str, str] = {}
    a = pick_colour("run0", figure, page)
    b = pick_colour(f"run{len(COLORS)}", figure, page)
    c = pick_colour("new", figure, page)
    assert a == COLORS[0] and b != a and len({a, b, c}) == 3
    assert pick_colour("run0", figure, page) == a  # stable within the figure
    assert page["new"] == c  # and remembered for later figures


def test_null_model_is_the_base_plus_a_random_step_of_the_runs_size_per_tensor(tmp_path, tokenizer):
    """experiments/study/null_model.py (Q2's null): every tensor moves from the base by exactly as much as the run's
    did, in another direction; seeded, so the same seed gives the same model."""
    import importlib.util

    import torch
    from conftest import make_tiny_model

    base = make_tiny_model(tokenizer, seed=3)
    base.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    trained = make_tiny_model(tokenizer, seed=3)
    with torch.no_grad():
        trained.model.layers[0].input_layernorm.weight[:5] += 0.5  # a planted, very non-isotropic step
        trained.model.layers[1].self_attn.q_proj.weight.mul_(1.01)
    run = tmp_path / "run"
    trained.save_pretrained(run / "final")
    tokenizer.save_pretrained(run / "final")
    (run / "config.toml").write_text(f'[model]\nspec = "{tmp_path / "base"}"\n')
    (run / "run.json").write_text('{"kind": "es"}\n')
    spec = importlib.util.spec_from_file_location("study_null", ROOT / "experiments" / "study" / "null_model.py")
    null_model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(null_model)
    assert null_model.main([str(run), str(tmp_path / "null"), "--seed", "1"]) == 0
    assert null_model.main([str(run), str(tmp_path / "null2"), "--seed", "1"]) == 0
    b, t = base.state_dict(), trained.state_dict()
    from transformers import AutoModelForCausalLM

    n = AutoModelForCausalLM.from_pretrained(tmp_path / "null").state_dict()
    n2 = AutoModelForCausalLM.from_pretrained(tmp_path / "null2").state_dict()
    for name in t:
        step, null = t[name] - b[name], n[name] - b[name]
        assert torch.allclose(null.norm(), step.norm(), rtol=1e-4, atol=1e-6), name
        assert torch.equal(n[name], n2[name])
    norm = "model.layers.0.input_layernorm.weight"
    assert int(((n[norm] - b[norm]).abs() > 0).sum()) == b[norm].numel()  # spread over every coordinate, not 5
    assert (n["model.embed_tokens.weight"] == b["model.embed_tokens.weight"]).all()  # untouched tensor stays put
    record = json.loads((tmp_path / "null" / "null.json").read_text())
    assert record["seed"] == 1 and record["relative_distance_null"] == pytest.approx(record["relative_distance_trained"], rel=1e-4)


def test_every_claims_command_is_a_stage_of_the_driver():
    """Each row's command names stages that experiments/study/run.sh has (and lists in its usage line), and the
    driver parses: a fresh clone can run every row's command."""
    import subprocess

    driver = ROOT / "experiments" / "study" / "run.sh"
    text = driver.read_text()
    subprocess.run(["bash", "-n", str(driver)], check=True)
    stages = set(re.findall(r"^  ([a-z0-9]+)\)", text, flags=re.M))
    usage = re.search(r'usage: \$0 ([^"]+)"', text).group(1)
    claims = load_claims(ROOT / "experiments" / "study" / "claims.toml")
    named = {s for c in claims.claim for s in re.findall(r"experiments/study/run\.sh ([a-z0-9]+)", c.command)}
    assert named and named <= stages, named - stages
    assert named <= set(re.findall(r"[a-z0-9]+", usage)), named - set(re.findall(r"[a-z0-9]+", usage))
    refnum = ROOT / "experiments" / "refnum" / "run.sh"  # Q3's driver
    subprocess.run(["bash", "-n", str(refnum)], check=True)
    modes = set(re.findall(r"^  ([a-z0-9]+)\)", refnum.read_text(), flags=re.M))
    asked = {s for c in claims.claim for s in re.findall(r"experiments/refnum/run\.sh ([a-z0-9]+)", c.command)}
    assert asked and asked <= modes, asked - modes
    subprocess.run(["bash", "-n", str(ROOT / "experiments" / "refnum" / "artifact_walks.sh")], check=True)  # Q4's driver
    assert all(re.findall(r"[a-z/]+/(?:run|artifact_walks)\.sh", c.command) for c in claims.claim)


def test_the_committed_page_regenerates_from_the_committed_files(tmp_path, monkeypatch):
    """docs/REPRODUCTION.md and docs/study/reproduction.json are what `evolm report --study` writes from the
    committed claims file and docs/study/ today (regenerate them with bash experiments/study/run.sh report)."""
    monkeypatch.chdir(ROOT)
    result = build_study("experiments/study/claims.toml", out=tmp_path)
    assert result.markdown.read_text() == (ROOT / "docs" / "REPRODUCTION.md").read_text()
    built = {p.name: p.read_text() for p in (tmp_path / "study" / "page").glob("*.md")}
    committed = {p.name: p.read_text() for p in (ROOT / "docs" / "study" / "page").glob("*.md")}
    assert sorted(built) == sorted(committed)  # a stale page for a claim that is gone fails here
    assert [name for name in built if built[name] != committed[name]] == []
    figures = sorted(p.name for p in (tmp_path / "study" / "figures").glob("*.png"))
    assert figures == sorted(p.name for p in (ROOT / "docs" / "study" / "figures").glob("*.png"))  # none stale, none missing
    assert json.loads(result.json.read_text()) == json.loads((ROOT / "docs" / "study" / "reproduction.json").read_text())


# -- issue 16, item 4: margins, exact intervals, pooled duplicates, premises, seeds ------------------------------


def test_repeated_problem_ids_are_pooled_not_overwritten(tmp_path):
    """A held-out draw that repeats a problem (procedural Countdown: 64 rows, 59 ids) measures that problem more
    often: its rows are one problem with n and c summed, entropies joined and greedy averaged."""
    rows = problems([0, 16, 4, 8], ids=["p:a", "p:b", "p:a", "p:c"], entropy=[0.2, 0.4, 0.6, 0.8],
                    greedy=[False, True, True, False])
    pooled = study.pooled_problems({"problems": rows})
    assert [(p["id"], p["n"], p["c"], p["rows"]) for p in pooled] == [("p:a", 32, 4, 2), ("p:b", 16, 16, 1), ("p:c", 16, 8, 1)]
    assert pooled[0]["greedy"] == 0.5 and len(pooled[0]["entropy"]) == 32
    values = study.problem_values({"problems": rows}, "pass@1")
    assert values == pytest.approx({"p:a": 4 / 32, "p:b": 1.0, "p:c": 0.5})  # not p:a = 4/16, its last row, as before
    assert study.problem_values({"problems": rows}, "pass@4")["p:a"] == pytest.approx(pass_at_k_problem(32, 4, 4))
    assert study.problem_values({"problems": rows}, "entropy")["p:a"] == pytest.approx(0.4)
    # a change test reads distinct problems, and the page's own table agrees with it
    data = tmp_path / "data"
    d = write_run(data, "cd", [0] * 4, [0] * 4)
    (d / "eval_before.json").write_text(json.dumps(run_eval("before", problems([0, 2, 0], ids=["x", "y", "x"]))))
    (d / "eval_after.json").write_text(json.dumps(run_eval("after", problems([8, 2, 0], ids=["x", "y", "x"]))))
    r = outcome(tmp_path, change("cd", "pass@1", "up"))[0].tests[0]
    assert r.problems == 2 and (r.a, r.b) == (pytest.approx((0 + 2 / 16) / 2), pytest.approx((8 / 32 + 2 / 16) / 2))


def test_binary_metrics_get_an_exact_interval_never_of_zero_width():
    from evolm.report.study.stats import exact_paired_interval

    same = [(1.0, 1.0)] * 20 + [(0.0, 0.0)] * 44  # no problem differs
    r = study.paired_binary_interval(same)
    assert r["mean"] == 0 and r["lo"] < -0.05 and r["hi"] > 0.05 and r["p"] == 1.0  # 0 of 64 still allows ~5.8%
    assert interval_verdict("equal", r["lo"], r["hi"], 1 / 64) == INCONCLUSIVE
    assert interval_verdict("equal", r["lo"], r["hi"], 0.1) == REPRODUCED  # a margin wider than what 64 problems bound
    gain = [(0.0, 1.0)] * 12 + [(1.0, 0.0)] * 2 + [(0.0, 0.0)] * 50
    r = study.paired_binary_interval(gain)
    assert r["mean"] == pytest.approx(10 / 64) and (r["n01"], r["n10"]) == (12, 2)
    assert 0.03 < r["lo"] < 0.06 and 0.26 < r["hi"] < 0.31  # near the bootstrap's [0.031, 0.297], but exact
    assert r["p"] == pytest.approx(0.01294, abs=1e-4)  # McNemar's exact test: 2 * P(Bin(14, 1/2) <= 2)
    # consistent with the test at 0: 4 of 64 only b right is not enough (McNemar p 0.125), 6 of 64 is
    assert exact_paired_interval(4, 0, 64)[0] == 0.0 and exact_paired_interval(6, 0, 64)[0] > 0
    assert exact_paired_interval(0, 6, 64) == tuple(-x for x in reversed(exact_paired_interval(6, 0, 64)))


def test_the_exact_paired_interval_covers_at_its_level():
    """Exact coverage, summed over every outcome of 12 paired problems, at a few points of the parameter space."""
    from scipy.stats import multinomial

    from evolm.report.study.stats import exact_paired_interval

    n = 12
    for p01, p10 in ((0.3, 0.1), (0.05, 0.05), (0.5, 0.0), (0.0, 0.0)):
        coverage = 0.0
        for i in range(n + 1):
            for j in range(n + 1 - i):
                lo, hi = exact_paired_interval(i, j, n)
                if lo - 1e-9 <= p01 - p10 <= hi + 1e-9:
                    coverage += multinomial.pmf([i, j, n - i - j], n, [p01, p10, 1 - p01 - p10])
        assert coverage >= 0.95 - 2e-3, (p01, p10, coverage)


def test_margins_are_declared_per_test(tmp_path):
    data = tmp_path / "data"
    # entropy 0.5 -> 0.45 for ES, 0.5 -> 0.1 for GRPO (on the same problems)
    for name, after in {"es": 0.45, "grpo": 0.1}.items():
        d = write_run(data, name, [4] * 64, [4] * 64)
        (d / "eval_before.json").write_text(json.dumps(run_eval("before", problems([4] * 64, entropy=[0.5] * 64))))
        (d / "eval_after.json").write_text(json.dumps(run_eval("after", problems([4] * 64, entropy=[after] * 64))))
    relative = change("es", "entropy", "not_down").replace("margin = 0.015625", 'margin_of = { fraction = 0.5, run = "grpo" }')
    r = outcome(tmp_path, relative)[0].tests[0]
    assert r.margin == pytest.approx(0.2) and r.verdict == REPRODUCED  # fell 0.05, less than half of GRPO's 0.4
    assert "0.5 × |grpo entropy change -0.400| = 0.200" in study.describe(r)
    assert outcome(tmp_path, change("es", "entropy", "not_down", margin=0.02))[0].tests[0].verdict == CONTRADICTED
    level = relative.replace('run = "grpo"', 'file = "grpo/eval_before.json"').replace("fraction = 0.5", "fraction = 0.05")
    assert outcome(tmp_path, level)[0].tests[0].margin == pytest.approx(0.025)  # 5% of the base's entropy level
    missing = relative.replace('run = "grpo"', 'run = "nowhere"')
    r = outcome(tmp_path, missing)[0].tests[0]
    assert r.verdict == NOT_RUN and "margin reference" in r.detail
    cases = {change("es", "entropy", "not_down").replace("margin = 0.015625\n", ""): "needs its margin",
             change("es", "entropy", "up", margin=0.1): "a margin applies to expect",
             change("es", "entropy", "not_down", margin=-0.1): "margin must be >= 0",
             relative.replace('run = "grpo"', 'run = "grpo", file = "x.json"'): "margin_of needs fraction > 0 and one reference"}
    for body, expected in cases.items():
        with pytest.raises(ConfigError, match=expected):
            load_claims(write_claims(tmp_path / "claims.toml", data, body))


def test_seeds_of_a_method_are_one_test(tmp_path):
    """Three runs of one method, each on its own problems: the mean of the runs' changes, each run's problems
    resampled on their own; several files of one side on the same problems: their per-problem mean."""
    data = tmp_path / "data"
    for name, after, ids in (("s0", 8, "a"), ("s1", 12, "b"), ("s2", 4, "c")):
        d = write_run(data, name, [4] * 64, [after] * 64)
        idx = [f"{ids}:{i}" for i in range(64)]
        (d / "eval_before.json").write_text(json.dumps(run_eval("before", problems([4] * 64, ids=idx))))
        (d / "eval_after.json").write_text(json.dumps(run_eval("after", problems([after] * 32 + [4] * 32, ids=idx))))
    body = change("s0", "pass@1", "up").replace('run = "s0"', 'run = "s0"\nseeds = ["s1", "s2"]')
    r = outcome(tmp_path, body)[0].tests[0]
    per_run = [(8 - 4) / 16 / 2, (12 - 4) / 16 / 2, 0.0]
    assert r.estimate == pytest.approx(sum(per_run) / 3) and r.method == "stratified bootstrap" and r.problems == 192
    assert [s["label"] for s in r.seeds] == ["s0", "s1", "s2"]
    assert [s["estimate"] for s in r.seeds] == pytest.approx(per_run)
    assert r.interval[0] < r.estimate < r.interval[1] and r.verdict == REPRODUCED
    assert "per run: s0 +0.125, s1 +0.250, s2 +0.000" in study.describe(r)
    # compare with b_seeds: side b is the per-problem mean of its files
    (data / "x").mkdir()
    for name, cs in {"a": [4] * 64, "b1": [8] * 64, "b2": [12] * 64}.items():
        (data / "x" / f"{name}.json").write_text(json.dumps(run_eval("after", problems(cs))))
    cmp = ('[[claim]]\nid = "M"\nclaim = "c"\n\n[[claim.test]]\nkind = "compare"\na = "x/a.json"\nb = "x/b1.json"\n'
           'b_seeds = ["x/b2.json"]\nmetric = "pass@1"\nexpect = "b_greater"\n')
    r = outcome(tmp_path, cmp)[0].tests[0]
    assert r.estimate == pytest.approx((8 + 12) / 2 / 16 - 4 / 16) and r.verdict == REPRODUCED
    assert [s["label"] for s in r.seeds] == ["x/b1.json", "x/b2.json"]
    with pytest.raises(ConfigError, match="does not take seeds"):
        load_claims(write_claims(tmp_path / "claims.toml", data, cmp.replace("b_seeds", "seeds")))


def test_a_run_that_lost_its_task_is_not_evidence(tmp_path):
    """A [[premise]] that fails takes the directories it covers out of every test: a seed is left out of its
    method's test, and a test with no run left on one side reads "training failed" and is not counted."""
    data = tmp_path / "data"
    write_run(data, "good", [4] * 64, [8] * 64, method="grpo")
    write_run(data, "lost", [4] * 64, [0] * 64, method="grpo")  # pass@1 0.25 -> 0
    premises = "".join(f'[[premise]]\nid = "{run} kept its task"\nkind = "change"\nrun = "{run}"\nmetric = "pass@1"\n'
                       f'expect = "up"\nholds_when = "not_contradicted"\ncovers = ["{run}"]\n\n' for run in ("good", "lost"))
    body = (premises + change("good", "pass@16", "down", "A").replace('run = "good"', 'run = "good"\nseeds = ["lost"]')
            + change("lost", "pass@1", "up", "B") + change("good", "pass@1", "up", "B").split("\n\n", 1)[1])
    data_claims = write_claims(tmp_path / "claims.toml", data, body)
    claims = load_claims(data_claims)
    s = study.evaluate_study(claims, lambda p: json.loads(Path(p).read_text()))
    assert [p.holds for p in s.premises] == [True, False]
    a, b = s.claims
    (seeded,) = a.tests
    assert seeded.gate == "lost kept its task" and [x["dropped"] for x in seeded.seeds][1].startswith("training failed")
    assert seeded.problems == 64  # the good run only
    lost, good = b.tests
    assert lost.verdict == TRAINING_FAILED and lost.measured == CONTRADICTED and not lost.counted
    assert good.verdict == REPRODUCED and b.verdict == REPRODUCED  # the lost run does not contradict the claim
    assert "**training failed** (lost kept its task; measured: contradicted)" in study.describe(lost)
    with pytest.raises(ConfigError, match="needs covers"):
        load_claims(write_claims(tmp_path / "c2.toml", data, body.replace('covers = ["good"]\n', "")))


def test_a_claim_without_its_premise_reads_premise_absent(tmp_path):
    data = tmp_path / "data"
    write_run(data, "flat", [4] * 64, [4] * 64)
    write_run(data, "up", [0] * 64, [8] * 64)
    premise = lambda run, gates="claim": (f'[[claim.premise]]\nid = "{run} gained"\ngates = "{gates}"\nkind = "change"\n'  # noqa: E731
                                          f'run = "{run}"\nmetric = "pass@1"\nexpect = "up"\n\n')
    test = lambda run, req="": (f'[[claim.test]]\nkind = "change"\nrun = "{run}"\nmetric = "pass@16"\nexpect = "up"\n'  # noqa: E731
                                + (f'requires = ["{req}"]\n' if req else "") + "\n")
    head = lambda cid: f'[[claim]]\nid = "{cid}"\nclaim = "c"\n\n'  # noqa: E731
    res = outcome(tmp_path, head("GATED") + premise("flat") + test("up")
                  + head("HELD") + premise("up") + test("up")
                  + head("SOME") + premise("flat", "tests") + test("up", "flat gained") + test("up"))
    gated, held, some = res
    assert gated.verdict == PREMISE_ABSENT and gated.tests[0].verdict == PREMISE_ABSENT
    assert gated.tests[0].measured == REPRODUCED and gated.key is gated.premises[0].outcome
    assert "premise 'flat gained' not found" in study.why(gated)
    assert held.verdict == REPRODUCED and held.premises[0].holds
    assert some.tests[0].verdict == PREMISE_ABSENT and some.tests[1].verdict == REPRODUCED and some.verdict == REPRODUCED
    with pytest.raises(ConfigError, match="requires 'nothing'"):
        load_claims(write_claims(tmp_path / "c.toml", data, head("X") + premise("up", "tests") + test("up", "nothing")))


def test_figures_are_small_multiples_one_panel_per_comparison(tmp_path):
    """C1's figure used to draw 14 series of two tasks on one axis: now one panel per run or comparison, the base
    dashed, the trained model solid, the legend under the panel."""
    from evolm.document import Canvas
    from evolm.report.study import figures

    data = tmp_path / "data"
    for name in ("g0", "g1", "g2"):
        write_run(data, name, [4] * 64, [12] * 64, method="grpo")
    (data / "k").mkdir()
    for name, cs in {"base": [4] * 64, "grpo": [12] * 64}.items():
        (data / "k" / f"{name}.json").write_text(json.dumps(run_eval("after", problems(cs))))
    body = (change("g0", "pass@1", "up").replace('run = "g0"', 'run = "g0"\nseeds = ["g1", "g2"]')
            + change("g0", "pass@16", "up").split("\n\n", 1)[1].replace('run = "g0"', 'run = "g0"\nseeds = ["g1", "g2"]')
            + '[[claim.test]]\nkind = "compare"\na = "k/base.json"\nb = "k/grpo.json"\nmetric = "pass@16"\nexpect = "b_greater"\n')
    (o,) = outcome(tmp_path, body)
    panels = [p for t, r in zip(o.claim.test, o.tests) for p in figures.panels_of(t, r, data)]
    assert [p.title for p in panels][:3] == ["g0", "g1", "g2"] and len(panels) == 7  # pass@1 and pass@16 share files
    assert [(label, dashed) for _, _, dashed, label in panels[-1].series] == [("base", True), ("grpo", False)]
    drawn = {}
    canvas = Canvas(tmp_path / "out")
    canvas.save = lambda fig, stem, title, caption="": drawn.setdefault("fig", fig)  # noqa: E731
    figures.claim_figure(o, data, lambda p: json.loads(Path(p).read_text()), canvas)
    axes = [ax for ax in drawn["fig"].axes if ax.get_visible()]
    assert len(axes) == 4  # three runs and the comparison, each once
    for ax in axes:
        lines = ax.get_lines()
        assert 2 <= len(lines) <= 4 and lines[0].get_linestyle() == "--" and lines[1].get_linestyle() == "-"
        assert ax.get_legend() is not None and ax.get_legend().get_bbox_to_anchor().y0 < ax.bbox.y0  # under the data


# -- issue 16, item 5: commutative twins in arithmetic ------------------------------------------------------------


def test_arithmetic_split_version_2_keeps_commutative_twins_in_one_split():
    from evolm.tasks import make_task
    from evolm.tasks.arithmetic import canonical_key

    assert canonical_key("85+47") == canonical_key("47+85") == "47+85"
    assert canonical_key("2+3*4") == canonical_key("4*3+2") and canonical_key("9-2-7") == canonical_key("9-7-2")
    assert canonical_key("5-3") != canonical_key("3-5")
    old = make_task("arithmetic", digits=1)
    assert [e.id for e in old.examples("test", 30)] == [e.id for e in make_task("arithmetic", digits=1, split_version=1)
                                                        .examples("test", 30)]  # the default is the committed draw
    leaks = lambda task: {canonical_key(e.id.split(":")[1]) for e in task.examples("test", 40)} & {  # noqa: E731
        canonical_key(e.id.split(":")[1]) for s in range(5) for e in task.examples("train", 80, seed=s)}
    assert leaks(old)  # version 1: a held-out 1-digit sum's twin is a training problem
    new = make_task("arithmetic", digits=1, split_version=2)
    assert not leaks(new) and new.knobs()["split_version"] == 2 and "split_version" not in old.knobs()
    with pytest.raises(ConfigError, match="split_version must be an integer in"):
        make_task("arithmetic", split_version=3)


def test_the_twin_check_rebuilds_the_training_problems_a_run_drew(tmp_path):
    """experiments/study/twins.py against the ES engine's own training_batch: the held-out problems whose twin the
    run trained on."""
    import importlib.util

    from evolm.es.engine import training_batch
    from evolm.tasks import make_task
    from evolm.tasks.arithmetic import canonical_key

    spec = importlib.util.spec_from_file_location("study_twins", ROOT / "experiments" / "study" / "twins.py")
    twins = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(twins)
    task = make_task("arithmetic", digits=1)
    d = tmp_path / "es-run"
    d.mkdir()
    (d / "config.toml").write_text('[run]\nseed = 3\n\n[task]\nname = "arithmetic"\n\n[task.params]\ndigits = 1\n\n'
                                   '[es]\nprompts_per_iteration = 4\n')
    (d / "run.json").write_text(json.dumps({"kind": "es"}))
    (d / "metrics.jsonl").write_text("".join(json.dumps({"kind": "train", "step": s}) + "\n" for s in (1, 2, 3)))
    heldout = [e.id for e in task.examples("test", 12, seed=5)]
    (d / "eval_after.json").write_text(json.dumps({"problems": [{"id": i, "n": 1, "c": 0} for i in heldout]}))
    trained = {canonical_key(e.id.split(":")[1]) for i in range(3) for e in training_batch(task, None, 3, i, 4)[0]}
    record = twins.twins_of(d)
    assert record["train_draws"] == 12 and record["heldout"] == list(dict.fromkeys(heldout))
    assert record["twins_drawn"] == [i for i in dict.fromkeys(heldout) if canonical_key(i.split(":")[1]) in trained]
    assert record["twins_drawn"] and set(record["twins_drawn"]) <= set(record["twins_in_train_split"])
