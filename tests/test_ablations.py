"""Ablation analyses on synthetic sweep records, and the update-spread statistics on planted vectors."""

from __future__ import annotations

import numpy as np
import pytest

from evolm.analysis import ablations as ab
from evolm.analysis.update_variance import update_spread


def point(assignments, rewards, **extra):
    return {"name": ",".join(f"{k}={v}" for k, v in assignments.items()), "assignments": assignments,
            "status": "finished", "curve": [[i + 1, r] for i, r in enumerate(rewards)], **extra}


def test_smooth_is_a_trailing_mean():
    assert ab.smooth([1, 2, 3, 4], 1) == [1, 2, 3, 4]
    assert ab.smooth([1, 2, 3, 4], 2) == [1, 1.5, 2.5, 3.5]
    assert ab.smooth([3, 0, 0, 3], 3) == [3, 1.5, 1, 1]
    with pytest.raises(ValueError):
        ab.smooth([1], 0)


def test_first_within_band_relative_and_absolute():
    steps = [1, 2, 3, 4, 5]
    ref = [1.0, 1.0, 1.0, 1.0, 1.0]
    values = [0.5, 0.999, 0.9, 0.996, 1.004]  # inside at 2, out at 3, inside from 4 on
    r = ab.first_within_band(steps, values, steps, ref, band=0.005)
    assert r["within_band_from"] == 4 and r["compared"] == 5
    assert r["final_gap"] == pytest.approx(0.004) and r["max_abs_gap_after"] == pytest.approx(0.004)
    # absolute band of 0.2 admits everything from update 2 on
    assert ab.first_within_band(steps, values, steps, ref, band=0.2, mode="absolute")["within_band_from"] == 2
    # outside at the last update: None
    assert ab.first_within_band(steps, [1, 1, 1, 1, 0.9], steps, ref, band=0.005)["within_band_from"] is None
    # relative band scales with |reference|
    assert ab.first_within_band([1], [2.009], [1], [2.0], band=0.005)["within_band_from"] == 1
    assert ab.first_within_band([1], [2.011], [1], [2.0], band=0.005)["within_band_from"] is None
    # only common updates are compared
    assert ab.first_within_band([1, 2, 3], [0, 1, 1], [2, 3, 4], [1, 1, 1])["compared"] == 2
    with pytest.raises(ValueError):
        ab.first_within_band(steps, values, steps, ref, mode="percent")


def test_population_scaling_reference_is_the_largest_n_per_group():
    ref = [0.2, 0.4, 0.6, 0.8, 0.80]
    points = [point({"es.population": 30, "model.spec": "a"}, ref),
              point({"es.population": 10, "model.spec": "a"}, [0.1, 0.2, 0.3, 0.5, 0.6]),     # never within
              point({"es.population": 20, "model.spec": "a"}, [0.1, 0.3, 0.6, 0.801, 0.799]),  # within from 3
              point({"es.population": 10, "model.spec": "b"}, [0.5, 0.5, 0.5]),
              point({"es.population": 20, "model.spec": "b"}, [0.4, 0.5, 0.5]),
              point({"es.sigma": 0.1}, [0.1])]  # no population key: ignored
    out = ab.population_scaling(points)
    assert set(out["groups"]) == {"model.spec=a", "model.spec=b"}
    a = out["groups"]["model.spec=a"]
    assert a["reference"] == 30
    rows = {r["value"]: r for r in a["rows"]}
    assert [r["value"] for r in a["rows"]] == [10, 20, 30]
    assert rows[30]["within_band_from"] == 1 and rows[20]["within_band_from"] == 3
    assert rows[10]["within_band_from"] is None and rows[10]["final_gap"] == pytest.approx(-0.2)
    assert a["curves"]["20"][-1] == [5, 0.799]
    b = out["groups"]["model.spec=b"]
    assert b["reference"] == 20 and {r["value"]: r["within_band_from"] for r in b["rows"]} == {10: 2, 20: 1}
    # an explicit reference that is missing is reported, not guessed
    missing = ab.population_scaling(points, reference=30)["groups"]["model.spec=b"]
    assert missing["rows"] == [] and "no finished point" in missing["note"]
    # smoothing is applied before the comparison
    smoothed = ab.population_scaling(points[:3], window=2)["groups"]["model.spec=a"]
    assert smoothed["curves"]["30"][-1] == [5, pytest.approx(0.8)]


def test_sigma_sweep_flags_failure_on_both_sides():
    points = [
        point({"es.sigma": 1e-6}, [0.3, 0.3, 0.3, 0.3], update_status={"zero": 4}),              # too small: no signal
        point({"es.sigma": 1e-3}, [0.3, 0.35, 0.4, 0.5], update_status={"applied": 4},
              eval_before={"greedy": 0.2}, eval_after={"greedy": 0.3}),                           # works
        point({"es.sigma": 1e-1}, [0.3, 0.1, 0.0, 0.0], update_status={"applied": 4},
              eval_before={"greedy": 0.2}, eval_after={"greedy": 0.0}),                           # too large: collapse
    ]
    out = ab.sigma_sweep(points)
    rows = {r["value"]: r for r in out["groups"]["all"]["rows"]}
    assert rows[1e-6]["flags"] == ["no_signal"] and rows[1e-6]["zero_update_fraction"] == 1.0
    assert rows[1e-3]["flags"] == [] and rows[1e-3]["change"] == pytest.approx(0.2)
    assert rows[1e-1]["flags"] == ["below_start", "collapsed", "heldout_below_base"]
    assert out["groups"]["all"]["best"] == 1e-3


def test_estimator_and_shaping_comparisons():
    points = [point({"es.estimator": "one_point"}, [0.1, 0.3, 0.5], evaluations=24),
              point({"es.estimator": "antithetic"}, [0.1, 0.2, 0.3], evaluations=24)]
    out = ab.estimator_comparison(points)["groups"]["all"]
    assert out["equal_budget"] is True
    assert [r["value"] for r in out["rows"]] == ["antithetic", "one_point"]
    assert out["rows"][1]["final_reward"] == 0.5 and out["rows"][1]["mean_reward"] == pytest.approx(0.3)
    points[1]["evaluations"] = 12
    assert ab.estimator_comparison(points)["groups"]["all"]["equal_budget"] is False

    shaping = ab.shaping_comparison([point({"es.shaping": s}, [0.1, f]) for s, f in
                                     (("zscore", 0.5), ("none", 0.2), ("centered_rank", 0.4))])["groups"]["all"]
    assert {r["value"]: r["final_reward"] for r in shaping["rows"]} == {"centered_rank": 0.4, "none": 0.2, "zscore": 0.5}
    assert set(shaping["curves"]) == {"zscore", "none", "centered_rank"}


def test_ablations_for_matches_grid_keys_by_last_component():
    points = [point({"stages.es.sigma": 0.001, "es.shaping": "zscore"}, [0.1, 0.2])]
    out = ab.ablations_for(points, ["stages.es.sigma", "es.shaping", "es.lr"])
    assert set(out) == {"sigma", "shaping"}
    assert out["sigma"]["groups"]["es.shaping=zscore"]["rows"][0]["value"] == 0.001


def test_update_spread_known_answers():
    rng = np.random.default_rng(0)
    u = rng.standard_normal(5000)
    same = update_spread(np.stack([u, u, u]))
    assert same["mean_pairwise_cosine"] == pytest.approx(1.0) and same["relative_variance"] == pytest.approx(0.0)
    assert same["norm_of_mean_update"] == pytest.approx(np.linalg.norm(u))
    noise = update_spread(rng.standard_normal((6, 20000)))
    assert abs(noise["mean_pairwise_cosine"]) < 0.03 and noise["relative_variance"] == pytest.approx(1.0, abs=0.05)
    opposite = update_spread(np.stack([u, -u]))
    assert opposite["mean_pairwise_cosine"] == pytest.approx(-1.0)
    # a zero update (no signal) is left out of the cosines but counted in the variance
    with_zero = update_spread(np.stack([u, u, np.zeros_like(u)]))
    assert with_zero["nonzero_repeats"] == 2 and with_zero["mean_pairwise_cosine"] == pytest.approx(1.0)
    assert with_zero["cosine_matrix"][2][2] is None
    with pytest.raises(ValueError):
        update_spread(u[None, :])


def test_population_rows_carry_zero_updates_and_members_against_the_centre():
    versus = {"above": 1, "tied": 17, "below": 2, "members": 20, "updates": 2}
    points = [point({"es.population": 10}, [0.1, 0.2], update_status={"applied": 1, "zero": 1}, members_vs_centre=versus),
              point({"es.population": 30}, [0.1, 0.3], update_status={"applied": 2})]
    rows = {r["value"]: r for r in ab.population_scaling(points)["groups"]["all"]["rows"]}
    assert rows[10]["zero_updates"] == 1 and rows[10]["members_vs_centre"] == versus
    assert rows[30]["zero_updates"] == 0 and rows[30]["members_vs_centre"] is None
