"""Evaluation metrics over sampled completions: pass@k, maj@k, token entropy, distinct correct answers.

All functions are pure (numbers and lists in, numbers out) and free of torch, so the evaluator, the
ES engine, GRPO and the analyses share one definition of each metric.

Definitions (for one problem with ``n`` samples of which ``c`` are correct):

- ``pass@k`` is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained
  on Code"): the probability that a uniformly random k-subset of the n samples holds at least one
  correct sample, ``1 - C(n-c, k) / C(n, k)``, computed in the numerically stable product form
  ``1 - prod_{i=n-c+1}^{n} (1 - k / i)`` (exactly 1 when ``n - c < k``). It needs ``k <= n``.
  Averaged over problems with equal weight.
- ``pass@1`` is the same estimator at k=1, which equals the mean correctness ``c / n``.
- ``maj@k`` is the *expected* majority-vote accuracy over all k-subsets of the n samples (not the
  vote of "the first k"). Within a subset, samples with no extracted answer do not vote; the answer
  with the most votes wins. **Tie rule:** when t answers tie for the most votes, each wins with
  probability 1/t (a uniformly random tie-break), so the subset scores the fraction of tied answers
  that are correct. A subset in which nobody voted scores 0. The expectation is computed exactly by a
  dynamic programme over answer groups (no enumeration), and equals pass@1 at k=1.
- Token entropy is measured by the generation backend (mean over each completion's generated tokens
  of the full next-token distribution's entropy at the sampling temperature); here it is aggregated
  token-weighted: ``sum_i H_i * T_i / sum_i T_i`` over completions with ``T_i`` tokens.
- Distinct correct answers: the number of different final answers among a problem's correct
  samples, a direct count of how many ways the model finds to be right.
- "Same answer" (a maj@k vote group, one distinct answer) means equal keys. Callers pass canonical
  keys, not raw text: ``evolm.evaluate`` passes ``task.canonical_answer(answer)``, so "3+5" and
  "3 + 5" vote together (``evolm.tasks.canonical``). Here keys are only whitespace-stripped.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Hashable, Iterable, Sequence

import numpy as np

# -- pass@k ----------------------------------------------------------------------------------------


def _check_counts(n: int, c: int, k: int) -> None:
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1 (got k={k})")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n (got n={n}, c={c})")
    if k > n:
        raise ValueError(f"pass@{k} needs at least k={k} samples per problem, but a problem has n={n}; "
                         f"sample more (n >= {k}) or drop k={k}")


def pass_at_k_problem(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``n`` samples, ``c`` correct (product form, exact for k <= n)."""
    _check_counts(n, c, k)
    if n - c < k:
        return 1.0
    # 1 - C(n-c, k)/C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k/i)
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def pass_at_k(n: int | Sequence[int], c: int | Sequence[int], k: int) -> float:
    """pass@k averaged over problems. ``n`` and ``c`` are per-problem counts (or one int each)."""
    cs = [c] if isinstance(c, (int, np.integer)) else list(c)
    ns = [n] * len(cs) if isinstance(n, (int, np.integer)) else list(n)
    if len(ns) != len(cs):
        raise ValueError(f"pass@k needs one n per c (got {len(ns)} n and {len(cs)} c)")
    if not cs:
        return float("nan")
    return float(np.mean([pass_at_k_problem(int(a), int(b), k) for a, b in zip(ns, cs)]))


def mean_correct(correct: Sequence[bool]) -> float:
    """pass@1 of one problem: the mean correctness of its samples."""
    return float(np.mean(correct)) if len(correct) else float("nan")


# -- maj@k -----------------------------------------------------------------------------------------


def _group(answers: Sequence[Hashable | None], correct: Sequence[bool]) -> tuple[list[int], list[float], int]:
    """Vote groups: sizes, probability that the group's answer is correct, and abstentions."""
    if len(answers) != len(correct):
        raise ValueError(f"maj@k needs one correctness flag per answer (got {len(answers)} and {len(correct)})")
    sizes: Counter = Counter()
    right: Counter = Counter()
    abstain = 0
    for a, ok in zip(answers, correct):
        if a is None:
            abstain += 1
            continue
        sizes[a] += 1
        right[a] += bool(ok)
    keys = list(sizes)
    # Samples with the same extracted answer are judged alike in practice; if a checker disagrees
    # with itself, the group counts as correct in proportion.
    return [sizes[a] for a in keys], [right[a] / sizes[a] for a in keys], abstain


def maj_at_k_problem(answers: Sequence[Hashable | None], correct: Sequence[bool], k: int) -> float:
    """Expected majority-vote accuracy of one problem over all k-subsets of its samples (tie rule above).

    ``answers[i]`` is sample i's extracted final answer (None: no answer, no vote) and ``correct[i]``
    whether sample i is right.
    """
    n = len(answers)
    if k < 1:
        raise ValueError(f"maj@k needs k >= 1 (got k={k})")
    if k > n:
        raise ValueError(f"maj@{k} needs at least k={k} samples per problem, but a problem has n={n}; "
                         f"sample more (n >= {k}) or drop k={k}")
    sizes, p_right, abstain = _group(answers, correct)
    total = math.comb(n, k)
    expected = 0.0
    G = len(sizes)
    for g in range(G):
        if p_right[g] == 0:
            continue
        others = [sizes[h] for h in range(G) if h != g]
        for v in range(1, min(k, sizes[g]) + 1):
            # ways[s, t]: choose s samples from the groups seen so far such that each has < v votes,
            # except t of them that have exactly v (they tie with g).
            ways = np.zeros((k - v + 1, G + 1), dtype=np.float64)
            ways[0, 0] = 1.0
            for m in others:
                new = np.zeros_like(ways)
                for j in range(0, min(m, v) + 1):
                    if j > k - v:
                        break
                    w = math.comb(m, j)
                    if j < v:
                        new[j:, :] += w * ways[:ways.shape[0] - j, :]
                    else:
                        new[j:, 1:] += w * ways[:ways.shape[0] - j, :-1]
                ways = new
            rest = k - v  # samples still to choose; abstentions fill them freely
            share = 0.0
            for s in range(rest + 1):
                fill = math.comb(abstain, rest - s)
                if fill == 0:
                    continue
                share += fill * float(np.sum(ways[s, :] / np.arange(1, G + 2)))
            expected += p_right[g] * math.comb(sizes[g], v) * share
    return expected / total


def maj_at_k(answers: Sequence[Sequence[Hashable | None]], correct: Sequence[Sequence[bool]], k: int) -> float:
    """maj@k averaged over problems (per-problem lists of answers and correctness flags)."""
    if len(answers) != len(correct):
        raise ValueError("maj@k needs one list of correctness flags per problem")
    if not answers:
        return float("nan")
    return float(np.mean([maj_at_k_problem(a, c, k) for a, c in zip(answers, correct)]))


# -- entropy and coverage --------------------------------------------------------------------------


def entropy(probs: Sequence[float]) -> float:
    """Shannon entropy (nats) of one probability distribution (zeros contribute nothing)."""
    p = np.asarray(probs, dtype=np.float64)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def token_weighted_entropy(entropies: Iterable[float | None], num_tokens: Iterable[int]) -> float:
    """Mean per-token entropy over many completions: ``sum H_i T_i / sum T_i`` (completions without an entropy are skipped)."""
    num = den = 0.0
    for h, t in zip(entropies, num_tokens):
        if h is None or not t:
            continue
        num += float(h) * t
        den += t
    return num / den if den else float("nan")


def distinct_correct(answers: Sequence[str | None], correct: Sequence[bool]) -> int:
    """How many different final answers appear among the correct samples of one problem."""
    return len({str(a).strip() for a, ok in zip(answers, correct) if ok and a is not None})


def pass_at_k_curve(ns: Sequence[int], cs: Sequence[int], k_max: int | None = None) -> list[float]:
    """pass@k for k = 1 .. k_max (default: the smallest n), averaged over problems: the coverage curve."""
    if not ns:
        return []
    k_max = min(ns) if k_max is None else k_max
    return [pass_at_k(ns, cs, k) for k in range(1, k_max + 1)]
