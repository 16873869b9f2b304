"""Metrics against brute force: pass@k and maj@k over every k-subset, entropy against hand-computed values."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import pytest

from evolm import metrics


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    flags = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(flags[i] for i in s) for s in subsets) / len(subsets)


def brute_maj_at_k(answers, correct, k) -> float:
    """Enumerate every k-subset; ties split the credit equally among the tied answers (the stated rule)."""
    right = {a: ok for a, ok in zip(answers, correct) if a is not None}
    total = 0.0
    subsets = list(itertools.combinations(range(len(answers)), k))
    for s in subsets:
        votes = Counter(answers[i] for i in s if answers[i] is not None)
        if not votes:
            continue
        top = max(votes.values())
        tied = [a for a, v in votes.items() if v == top]
        total += sum(right[a] for a in tied) / len(tied)
    return total / len(subsets)


def test_pass_at_k_matches_brute_force_on_random_cases():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 9)
        c = rng.randint(0, n)
        k = rng.randint(1, n)
        assert metrics.pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12)
        assert metrics.pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_averages_over_problems_and_pass_at_1_is_mean_correctness():
    ns, cs = [4, 8, 8], [1, 0, 8]
    assert metrics.pass_at_k(ns, cs, 2) == pytest.approx(sum(brute_pass_at_k(n, c, 2) for n, c in zip(ns, cs)) / 3)
    assert metrics.pass_at_k(ns, cs, 1) == pytest.approx((1 / 4 + 0 + 1) / 3)
    assert metrics.pass_at_k(8, [0, 4], 1) == pytest.approx(0.25)  # one n for all problems
    assert metrics.mean_correct([True, False, False, False]) == 0.25


def test_pass_at_k_is_stable_for_large_n():
    # C(1000, 500) overflows floats; the product form does not
    value = metrics.pass_at_k(1000, 3, 500)
    assert value == pytest.approx(1 - (500 * 499 * 498) / (1000 * 999 * 998), rel=1e-12)


def test_pass_at_k_refuses_k_above_n():
    with pytest.raises(ValueError, match=r"pass@16 needs at least k=16 samples.*n=8"):
        metrics.pass_at_k([8, 8], [1, 2], 16)
    with pytest.raises(ValueError):
        metrics.pass_at_k(4, 5, 1)


def test_maj_at_k_matches_brute_force_on_random_cases():
    rng = random.Random(1)
    for _ in range(300):
        n = rng.randint(1, 8)
        k = rng.randint(1, n)
        alphabet = ["a", "b", "c", "d"][: rng.randint(1, 4)]
        gold = rng.choice(alphabet)
        answers = [rng.choice(alphabet + [None]) for _ in range(n)]
        correct = [a == gold for a in answers]
        assert metrics.maj_at_k_problem(answers, correct, k) == pytest.approx(brute_maj_at_k(answers, correct, k), abs=1e-12), \
            (answers, gold, k)


def test_maj_at_k_special_cases_and_tie_rule():
    answers = ["7", "7", "3", None, "5", "3"]
    correct = [a == "3" for a in answers]
    # k = 1 is the mean correctness
    assert metrics.maj_at_k_problem(answers, correct, 1) == pytest.approx(2 / 6)
    # k = n: the full vote ties 7 and 3 (two each), so half credit
    assert metrics.maj_at_k_problem(answers, correct, 6) == pytest.approx(0.5)
    # a two-way tie of a right and a wrong answer scores one half
    assert metrics.maj_at_k_problem(["x", "y"], [True, False], 2) == pytest.approx(0.5)
    # nobody answered: 0
    assert metrics.maj_at_k_problem([None, None], [False, False], 2) == 0.0
    assert metrics.maj_at_k([["a"], ["b"]], [[True], [False]], 1) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="maj@3"):
        metrics.maj_at_k_problem(["a", "b"], [True, False], 3)


def test_maj_at_k_is_fast_enough_for_32_samples():
    rng = random.Random(2)
    answers = [rng.choice([str(i) for i in range(12)] + [None]) for _ in range(32)]
    correct = [a == "3" for a in answers]
    for k in (1, 8, 16, 32):
        value = metrics.maj_at_k_problem(answers, correct, k)
        assert 0.0 <= value <= 1.0


def test_entropy_of_hand_computed_distributions():
    assert metrics.entropy([0.25] * 4) == pytest.approx(math.log(4))
    assert metrics.entropy([0.5, 0.25, 0.25, 0.0]) == pytest.approx(1.5 * math.log(2))
    assert metrics.entropy([1.0]) == 0.0


def test_entropy_recorder_uses_the_full_distribution_at_the_sampling_temperature():
    import torch

    from evolm.backends.hf import _EntropyRecorder

    probs = torch.tensor([0.5, 0.25, 0.125, 0.125])
    logits = torch.log(probs)[None, :] + 3.0  # a constant shift changes nothing
    rec = _EntropyRecorder(temperature=1.0)
    rec(None, logits)
    assert float(rec.steps[0][0]) == pytest.approx(1.75 * math.log(2), abs=1e-6)
    # at temperature 2 the distribution is proportional to sqrt(p)
    q = [math.sqrt(p) for p in probs.tolist()]
    q = [x / sum(q) for x in q]
    rec2 = _EntropyRecorder(temperature=2.0)
    rec2(None, logits)
    assert float(rec2.steps[0][0]) == pytest.approx(-sum(x * math.log(x) for x in q), abs=1e-6)


def test_token_weighted_entropy_and_distinct_correct():
    # (1.0 * 3 + 2.0 * 1) / 4, the completion without entropy skipped
    assert metrics.token_weighted_entropy([1.0, 2.0, None], [3, 1, 5]) == pytest.approx(1.25)
    assert math.isnan(metrics.token_weighted_entropy([], []))
    assert metrics.distinct_correct(["1/2", "0.5", "1/2", "3", None], [True, True, True, False, False]) == 2
    assert metrics.distinct_correct(["3"], [False]) == 0


def test_pass_at_k_curve_is_monotone():
    curve = metrics.pass_at_k_curve([8, 8, 8], [0, 1, 5])
    assert len(curve) == 8
    assert all(a <= b + 1e-12 for a, b in zip(curve, curve[1:]))
    assert curve[-1] == pytest.approx(2 / 3)
