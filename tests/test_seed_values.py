"""Value tests with the seed as the unit (``kind = "value"``, ``unit = "seed"``): a list with one number per seed,
e.g. a null walk's drift ratio at seeds 0, 1, 2 (issue 41's Q4), judged by Student's t interval over the seeds.

Calibrated like every test kind: a planted effect (ratios 1.30 +- 0.02 over 3 seeds, threshold 1) is detected, a
null (ratios spread around 1) is not, an effect in the other direction is contradicted, and draws from the null at
the declared level reproduce at about 2.5% (one-sided), not more. Fast: no model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from evolm.errors import ConfigError
from evolm.report import study
from evolm.report.study import CONTRADICTED, INCONCLUSIVE, NOT_RUN, REPRODUCED, load_claims

from test_study import outcome, write_claims


def seeds_test(cid, path, expect=">", threshold=1.0, extra=""):
    return (f'[[claim]]\nid = "{cid}"\nclaim = "c"\n\n[[claim.test]]\nkind = "value"\nfile = "aw/summary.json"\n'
            f'path = "{path}"\nunit = "seed"\nexpect = "{expect}"\nthreshold = {threshold}\n{extra}\n')


def write_summary(tmp_path, **lists):
    d = tmp_path / "data" / "aw"
    d.mkdir(parents=True, exist_ok=True)
    (d / "summary.json").write_text(json.dumps({"contrasts": {"m": lists}}))


def test_planted_effect_detected_null_not_and_direction_read(tmp_path):
    write_summary(tmp_path, planted=[1.31, 1.28, 1.30], null=[0.97, 1.04, 1.01], reverse=[0.71, 0.69, 0.70],
                  one=[1.5], empty=[])
    res = outcome(tmp_path, seeds_test("A", "contrasts.m.planted") + seeds_test("B", "contrasts.m.null")
                  + seeds_test("C", "contrasts.m.reverse") + seeds_test("D", "contrasts.m.one")
                  + seeds_test("E", "contrasts.m.empty"))
    planted, null, reverse, one, empty = (r.tests[0] for r in res)
    assert planted.verdict == REPRODUCED and planted.interval[0] > 1 and planted.method == "t over 3 seeds"
    assert planted.estimate == pytest.approx(1.2966667, abs=1e-6)
    # t(2) at 97.5% is 4.303: half-width 4.303 x sd / sqrt(3)
    sd = float(np.std([1.31, 1.28, 1.30], ddof=1))
    assert planted.interval[1] - planted.interval[0] == pytest.approx(2 * 4.302653 * sd / 3 ** 0.5, abs=1e-5)
    assert null.verdict == INCONCLUSIVE and null.interval[0] < 1 < null.interval[1]
    assert reverse.verdict == CONTRADICTED
    assert one.verdict == INCONCLUSIVE and "1 seed(s) so far" in one.detail and one.interval is None
    assert empty.verdict == NOT_RUN and "no seed has finished" in empty.detail
    text = study.describe(planted)
    assert "95% t over 3 seeds" in text and "1.31, 1.28, 1.3" in text


def test_null_draws_reproduce_at_the_one_sided_rate(tmp_path):
    """Under the null (three seeds' values ~ N(1, 0.05)) the t interval excludes 1 from above in ~2.5% of draws."""
    rng = np.random.default_rng(0)
    lists = {f"d{i}": [float(x) for x in rng.normal(1.0, 0.05, 3)] for i in range(400)}
    write_summary(tmp_path, **lists)
    res = outcome(tmp_path, "".join(seeds_test(f"Q{i}", f"contrasts.m.d{i}") for i in range(400)))
    rate = sum(r.tests[0].verdict == REPRODUCED for r in res) / 400
    assert 0.005 <= rate <= 0.06  # binomial(400, 0.025): 95% within [0.011, 0.043]


def test_a_seed_value_with_over_or_minus_is_refused(tmp_path):
    body = seeds_test("A", "contrasts.m.x", extra='over = { file = "aw/summary.json", path = "contrasts.m.y" }')
    with pytest.raises(ConfigError, match="one list with a number per seed"):
        load_claims(write_claims(tmp_path / "claims.toml", tmp_path / "data", body))
