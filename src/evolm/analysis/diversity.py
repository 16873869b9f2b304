"""Population diversity (Lemma 2 of "Understanding Evolution Strategies for LLM Reasoning", 2026,
arXiv 2608.27351): one sample per ES member versus N from the centre.

Lemma 2 states that, under the paper's smoothness and common-support conditions (a local result, small
σ), drawing one answer from each of the M members of an ES population finds a correct answer at least
as often as drawing M answers from a single policy, with equality iff the members coincide, and that
the local gap grows with a verifier-projected Jensen–Shannon divergence among the members. The paper
does not isolate this empirically; whether a given population shows it is measured here, as pure
functions of correctness probabilities:

- ``p_members[i, j]``: probability that member i answers prompt j correctly; ``q_center[j]``: the same
  for the centre (unperturbed) policy.
- Population coverage (one sample per member): ``mean_j [1 − Π_i (1 − p_ij)]``.
- Centre coverage (N samples, N = M by default, the matched budget): ``mean_j [1 − (1 − q_j)^N]``.
- Verifier-projected JS divergence: per prompt, the generalised Jensen–Shannon divergence of the
  members' Bernoulli(p_ij) correctness distributions, ``H(mean_i p_ij) − mean_i H(p_ij)`` (binary
  entropy in nats, so it lies in [0, ln 2]), averaged over prompts. Zero iff all members agree on
  every prompt's success probability.

Design decisions:

- Estimating from samples: with member probabilities estimated by independent per-member sample
  means, the product ``Π_i (1 − p̂_ij)`` is an unbiased estimate of ``Π_i (1 − p_ij)``, so population
  coverage is unbiased. The plug-in ``(1 − q̂)^N`` is *not* (by convexity it overestimates the miss
  probability, which would favour the population), so ``diversity_from_samples`` uses the unbiased
  pass@N estimator ``1 − C(n − c, N) / C(n, N)`` for the centre whenever it has n ≥ N samples per
  prompt, and says which estimator it used. The JS divergence from sample means is biased upward for
  few samples (sampling noise looks like diversity); the number of samples is recorded with it, and
  when the centre has at least M × m samples per prompt (M members, m samples each) the same
  statistic is computed on M disjoint groups of m centre samples (``js_divergence_null``): M copies
  of *one* policy, i.e. what sampling noise alone produces at this sample size. Diversity shows as
  ``js_divergence`` above that baseline. Both are also kept per prompt (``js_divergence_per_prompt``,
  ``js_divergence_null_per_prompt``), as are both coverages, so a reader can put a paired bootstrap
  interval over prompts on the gap and on the excess over the baseline (``evolm report --study`` does).
- Sampling each member (perturb, generate, restore) needs the ES engine and lives there
  (``evolm.es.measure.population_correctness``, run by ``evolm analyze diversity --model``); this
  module only turns measured correctness into numbers, a JSON file and a plot.
- The report section (``report_section``) lives here, next to the computation: coverage, gap, JS
  divergence and its baseline, and the measurement's setup, beside ``plots.plot_diversity``.

Input file for ``evolm analyze diversity --from FILE`` (JSON)::

    {"member_correct": [[[1, 0, ...], ...], ...],   # [member][prompt][sample] 0/1
     "center_correct": [[0, 1, ...], ...],          # [prompt][sample] 0/1
     "center_samples": 8,                           # optional N (default: number of members)
     ...any other fields (sigma, step, run) are copied into the output}

or probabilities directly: ``{"p_members": [[...], ...], "q_center": [...]}``.
"""

from __future__ import annotations

import math

import numpy as np

from evolm.analysis import plots
from evolm.errors import UserError
from evolm.metrics import pass_at_k_problem
from evolm.document import Canvas, Section, Table


def binary_entropy(p):
    """``−p ln p − (1 − p) ln(1 − p)`` elementwise (nats), 0 at p ∈ {0, 1}."""
    p = np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -(np.where(p > 0, p * np.log(p), 0.0) + np.where(p < 1, (1 - p) * np.log1p(-p), 0.0))
    return h


def _as_matrix(p_members):
    p = np.asarray(p_members, dtype=np.float64)
    if p.ndim != 2 or p.shape[0] < 1 or p.shape[1] < 1:
        raise UserError(f"member probabilities must be a [members][prompts] matrix (got shape {p.shape})")
    if np.any(p < 0) or np.any(p > 1) or np.any(np.isnan(p)):
        raise UserError("member probabilities must lie in [0, 1]")
    return p


def population_coverage(p_members, q_center, n_center: int | None = None) -> dict:
    """One sample per member versus ``n_center`` (default: number of members) samples from the centre.

    Returns ``population``, ``center``, ``gap`` (population − center), ``num_members``, ``num_prompts``,
    ``center_samples``, and the per-prompt values ``population_per_prompt`` / ``center_per_prompt``.
    """
    p = _as_matrix(p_members)
    q = np.asarray(q_center, dtype=np.float64)
    if q.shape != (p.shape[1],):
        raise UserError(f"centre probabilities need one value per prompt ({p.shape[1]}), got shape {q.shape}")
    if np.any(q < 0) or np.any(q > 1) or np.any(np.isnan(q)):
        raise UserError("centre probabilities must lie in [0, 1]")
    n = p.shape[0] if n_center is None else int(n_center)
    pop = 1.0 - np.prod(1.0 - p, axis=0)
    center = 1.0 - (1.0 - q) ** n
    return {"population": float(pop.mean()), "center": float(center.mean()), "gap": float(pop.mean() - center.mean()),
            "num_members": int(p.shape[0]), "num_prompts": int(p.shape[1]), "center_samples": n,
            "population_per_prompt": pop.tolist(), "center_per_prompt": center.tolist()}


def verifier_js_divergence(p_members, per_prompt: bool = False):
    """Mean over prompts of ``H(mean_i p_ij) − mean_i H(p_ij)`` (nats, in [0, ln 2]); per prompt on request."""
    p = _as_matrix(p_members)
    js = binary_entropy(p.mean(axis=0)) - binary_entropy(p).mean(axis=0)
    js = js.clip(min=0.0)  # exact math is >= 0; clip float round-off
    return js.tolist() if per_prompt else float(js.mean())


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: ``1 − C(n − c, k) / C(n, k)`` (needs n ≥ k);
    ``evolm.metrics.pass_at_k_problem``."""
    return pass_at_k_problem(n, c, k)


def null_js_divergence(center_correct, members: int, samples_per_member: int, per_prompt: bool = False):
    """The JS divergence of ``members`` pseudo-members that are all the centre: per prompt, the first
    ``members × samples_per_member`` centre samples are split into ``members`` disjoint groups of
    ``samples_per_member`` and their sample means go through ``verifier_js_divergence``. It is the
    value sampling noise alone gives at this sample size (None when the centre has too few samples); per prompt
    on request, so that the members' JSD can be paired with it prompt by prompt."""
    need = members * samples_per_member
    if members < 1 or samples_per_member < 1 or any(len(s) < need for s in center_correct):
        return None
    groups = np.array([np.asarray(s[:need], dtype=np.float64).reshape(members, samples_per_member).mean(axis=1)
                       for s in center_correct])  # [prompt][member]
    return verifier_js_divergence(groups.T, per_prompt=per_prompt)


def diversity_from_samples(member_correct, center_correct, n_center: int | None = None) -> dict:
    """Coverage and JS divergence from 0/1 samples: ``member_correct[i][j][s]``, ``center_correct[j][s]``.

    Member probabilities are sample means; the centre's coverage uses unbiased pass@N when it has at
    least N samples per prompt (``center_estimator`` says "unbiased" or "plug-in").
    """
    members = [[np.asarray(s, dtype=np.float64) for s in m] for m in member_correct]
    if not members or any(len(m) != len(members[0]) for m in members):
        raise UserError("member_correct must be [member][prompt][sample] with the same prompts for every member")
    p = np.array([[s.mean() if s.size else math.nan for s in m] for m in members])
    if np.isnan(p).any():
        raise UserError("every member needs at least one sample per prompt")
    if len(center_correct) != p.shape[1]:
        raise UserError(f"center_correct has {len(center_correct)} prompts but members have {p.shape[1]}")
    center = [np.asarray(s, dtype=np.float64) for s in center_correct]
    if any(s.size == 0 for s in center):
        raise UserError("the centre needs at least one sample per prompt")
    q = np.array([s.mean() for s in center])
    n = p.shape[0] if n_center is None else int(n_center)
    out = population_coverage(p, q, n)
    if all(s.size >= n for s in center):
        per_prompt = [pass_at_k(int(s.size), int(s.sum()), n) for s in center]
        out["center_per_prompt"] = per_prompt
        out["center"] = float(np.mean(per_prompt))
        out["gap"] = out["population"] - out["center"]
        out["center_estimator"] = "unbiased"
    else:
        out["center_estimator"] = "plug-in"
    out["js_divergence"] = verifier_js_divergence(p)
    out["js_divergence_per_prompt"] = verifier_js_divergence(p, per_prompt=True)
    out["member_samples_per_prompt"] = int(min(s.size for m in members for s in m))
    out["js_divergence_null"] = null_js_divergence(center_correct, p.shape[0], out["member_samples_per_prompt"])
    out["js_divergence_null_per_prompt"] = null_js_divergence(center_correct, p.shape[0],
                                                              out["member_samples_per_prompt"], per_prompt=True)
    out["center_samples_per_prompt"] = int(min(s.size for s in center))
    out["member_accuracy"] = p.mean(axis=1).tolist()
    out["center_accuracy"] = float(q.mean())
    return out


def diversity_report(data: dict) -> dict:
    """The analysis of one measured-correctness record (the ``--from`` file format in the module docstring)."""
    n = data.get("center_samples")
    if "member_correct" in data and "center_correct" in data:
        out = diversity_from_samples(data["member_correct"], data["center_correct"], n)
    elif "p_members" in data and "q_center" in data:
        out = population_coverage(data["p_members"], data["q_center"], n)
        out["center_estimator"] = "given probabilities"
        out["js_divergence"] = verifier_js_divergence(data["p_members"])
        out["js_divergence_per_prompt"] = verifier_js_divergence(data["p_members"], per_prompt=True)
    else:
        raise UserError("the diversity file needs 'member_correct' and 'center_correct' (0/1 samples) "
                        "or 'p_members' and 'q_center' (probabilities)")
    skip = {"member_correct", "center_correct", "p_members", "q_center", "center_samples"}
    out["input"] = {k: v for k, v in data.items() if k not in skip}
    return out


# -- report --------------------------------------------------------------------------------------------

REPORT_TEXT = ("Lemma 2 of \"Understanding Evolution Strategies for LLM Reasoning\" (arXiv 2608.27351), measured: one "
               "sample per ES population member versus N samples from the centre, and the verifier-projected "
               "Jensen-Shannon divergence among the members (`evolm analyze diversity`).")


def report_table(result: dict) -> Table:
    """Quantity / value rows: coverages, gap, JS divergence and its baseline, sample counts, accuracies, setup."""
    setup = result.get("setup", {})
    rows = [["population coverage (1 sample per member)", result["population"]],
            ["centre coverage (N samples)", result["center"]], ["gap", result["gap"]],
            ["verifier-projected JSD (nats)", result["js_divergence"]],
            ["JSD sampling-noise baseline", result.get("js_divergence_null")],
            ["members N", result["num_members"]], ["prompts", result["num_prompts"]],
            ["samples per member and prompt", result.get("member_samples_per_prompt")],
            ["centre samples per prompt", result.get("center_samples_per_prompt")],
            ["centre estimator", result.get("center_estimator")],
            ["centre accuracy", result.get("center_accuracy")],
            ["mean member accuracy", sum(result["member_accuracy"]) / len(result["member_accuracy"])
             if result.get("member_accuracy") else None]]
    rows += [[k, setup[k]] for k in ("model", "task", "sigma", "estimator", "temperature") if k in setup]
    return Table(["quantity", "value"], rows)


def report_section(entries, canvas: Canvas) -> Section:
    """The report section of ``diversity.json`` inputs: ``entries`` are ``(label, directory, result)``."""
    return plots.report_section("diversity", REPORT_TEXT, entries, canvas, plots.plot_diversity, report_table)
