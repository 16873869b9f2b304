"""Measurements that use the ES machinery without training: what a population around a centre
answers (Lemma 2 diversity) and how much the ES update estimate varies (estimator ablation).

Both move the model exactly as an ES iteration does: the engine's ``ParamSet`` with key-derived noise
(``build_paramset``), ``perturb(key, direction, sign, sigma)`` -> generate -> ``restore()``, which is
bit-exact. The weights are fingerprinted before and after and a mismatch raises, so a measurement can
never leave a model changed.

Design decisions:

- ``population_correctness``: member i is the perturbation ``(direction, sign)`` of the estimator's
  member layout at noise key ``iteration`` (default 0), i.e. the population ES would score at that
  key. Every member and the centre answer the *same* prompts. Each member draws
  ``samples_per_member`` completions per prompt (the sample mean estimates p_ij), the centre
  ``center_samples``. By default every member and the centre get their own sampling seed, so their
  estimates are independent and the product estimator of population coverage is unbiased
  (``analysis/diversity.py``); ``common_random_numbers=True`` gives them one shared seed, as the
  engine does while training (identical members then give identical samples).
- ``update_samples``: R repeats at fixed weights, fixed prompts and a fixed sampling seed; repeat r
  uses noise key ``first_key + r`` (fresh directions), scores the population with the engine's
  ``LocalPopulation`` and turns fitness into coefficients with ``compute_update``. The update
  ``scale * sum_d c_d eps_d`` is then evaluated only on K coordinates drawn uniformly over all
  selected parameters (``coordinate_subset``), so memory is O(R K) whatever the model size. The
  spread statistics are pure functions in ``analysis/update_variance.py`` (``update_spread``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from evolm.backends.base import SamplingParams
from evolm.seeding import derive_seed, seed31
from evolm.es.params import ParamSet
from evolm.es.population import LocalPopulation
from evolm.es.update import compute_update, member_layout
from evolm.models import fingerprint


def _flat(examples, completions) -> tuple[list, list[str]]:
    rows = [(ex, c.text) for ex, outs in zip(examples, completions) for c in outs]
    return [r[0] for r in rows], [r[1] for r in rows]


def _correct(task, examples, completions) -> list[list[int]]:
    verdicts = iter(task.judge(*_flat(examples, completions)))
    return [[int(bool(next(verdicts).correct)) for _ in outs] for outs in completions]


def _rewards(task, examples, completions) -> float:
    values = task.score(*_flat(examples, completions))
    return float(np.mean(values)) if values else float("nan")


def population_correctness(params: ParamSet, generator, task, tokenizer, examples, *, sigma: float,
                           estimator: str = "one_point", population: int = 8, iteration: int = 0,
                           samples_per_member: int = 1, center_samples: int | None = None, temperature: float = 1.0,
                           top_p: float = 1.0, max_new_tokens: int = 32, seed: int = 0,
                           common_random_numbers: bool = False, on_member=None) -> dict:
    """0/1 correctness of every member and of the centre on ``examples``.

    Returns ``member_correct[i][j][s]``, ``center_correct[j][s]``, ``center_samples`` (= N for the
    matched comparison: the number of members), per-member mean reward and accuracy, the layout,
    seconds, generated tokens, and ``weights_unchanged`` (always True: a mismatch raises).
    """
    layout = member_layout(estimator, population)
    center_n = int(center_samples or population * samples_per_member)
    prompts = [task.render_prompt(ex, tokenizer) for ex in examples]
    model = getattr(generator, "model", None)
    before = fingerprint(model) if model is not None else None
    shared = seed31(seed, "diversity-sampling")

    def sampling(n: int, key) -> SamplingParams:
        s = shared if common_random_numbers else seed31(seed, "diversity-sampling", *key)
        return SamplingParams(n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=s)

    t0 = time.perf_counter()
    member_correct, member_reward, tokens = [], [], 0
    for m, (direction, sign) in enumerate(layout):
        params.perturb(iteration, direction, sign, sigma)
        generator.sync_weights()
        try:
            outs = generator.generate(prompts, sampling(samples_per_member, ("member", m)))
        finally:
            params.restore()
            generator.sync_weights()
        member_correct.append(_correct(task, examples, outs))
        member_reward.append(_rewards(task, examples, outs))
        tokens += sum(c.num_tokens for o in outs for c in o)
        if on_member:
            on_member()
    outs = generator.generate(prompts, sampling(center_n, ("center",)))
    center_correct = _correct(task, examples, outs)
    tokens += sum(c.num_tokens for o in outs for c in o)
    if model is not None and fingerprint(model) != before:
        raise RuntimeError("weights changed during the population measurement (perturb/restore is not exact)")
    return {
        "member_correct": member_correct, "center_correct": center_correct, "center_samples": population,
        "member_reward": member_reward, "center_reward": _rewards(task, examples, outs),
        "layout": layout, "samples_per_member": samples_per_member, "center_samples_drawn": center_n,
        "common_random_numbers": common_random_numbers, "seconds": time.perf_counter() - t0, "gen_tokens": tokens,
        "weights_unchanged": model is not None,
    }


# -- the spread of the update estimate ---------------------------------------------------------------

@dataclass
class CoordinateSubset:
    """K coordinates of the selected parameters: ``per_tensor[k]`` holds the flat indices in tensor k,
    and the concatenation over k (in tensor order) is the order of an update sample."""

    per_tensor: list[torch.Tensor]
    total: int

    @property
    def size(self) -> int:
        return sum(int(t.numel()) for t in self.per_tensor)


def coordinate_subset(params: ParamSet, count: int, seed: int = 0) -> CoordinateSubset:
    """``count`` distinct coordinates drawn uniformly over all of ``params``' elements (all of them when
    ``count`` >= their number)."""
    sizes = [t.numel() for t in params.tensors]
    total = sum(sizes)
    rng = np.random.Generator(np.random.PCG64DXSM(derive_seed(seed, "update-variance-coords")))
    chosen = np.arange(total) if count >= total else np.sort(rng.choice(total, size=count, replace=False))
    bounds = np.cumsum([0] + sizes)
    per_tensor = []
    for k in range(len(sizes)):
        lo, hi = np.searchsorted(chosen, [bounds[k], bounds[k + 1]])
        per_tensor.append(torch.from_numpy(chosen[lo:hi] - bounds[k]).long())
    return CoordinateSubset(per_tensor, total)


@torch.no_grad()
def subset_update(params: ParamSet, iteration: int, coefficients, scale: float, subset: CoordinateSubset) -> np.ndarray:
    """``scale * sum_d c_d eps_d`` (what ``ParamSet.apply_update`` adds) on the subset's coordinates only."""
    parts = []
    for k, idx in enumerate(subset.per_tensor):
        acc = torch.zeros(idx.numel(), dtype=torch.float32)
        if idx.numel():
            numel = params.tensors[k].numel()
            for d, c in enumerate(coefficients):
                if c != 0.0:
                    eps = params.noise.direction(iteration, d, params.indices[k], numel)
                    acc.add_(eps[idx.to(eps.device)].float().cpu(), alpha=float(c))
        parts.append(acc * float(scale))
    return torch.cat(parts).numpy().astype(np.float64) if parts else np.zeros(0)


def update_samples(params: ParamSet, generator, task, tokenizer, examples, *, estimator: str, population: int,
                   sigma: float, lr: float, shaping: str = "zscore", divide_by_sigma: bool = False, repeats: int = 4,
                   coords: int = 100_000, sampling: SamplingParams | None = None, first_key: int = 0, seed: int = 0,
                   subset: CoordinateSubset | None = None, on_member=None) -> dict:
    """R independent ES update estimates at the current weights, evaluated on a coordinate subset.

    Returns ``vectors`` (R x K array), per-repeat ``fitness``, ``status``, ``coefficients`` and
    ``scale``, the subset size, seconds, and ``weights_unchanged``.
    """
    sampling = sampling or SamplingParams(n=1, temperature=0.0, max_new_tokens=32, seed=seed31(seed, "update-variance-sampling"))
    prompts = [task.render_prompt(ex, tokenizer) for ex in examples]
    layout = member_layout(estimator, population)
    subset = subset or coordinate_subset(params, coords, seed)
    model = getattr(generator, "model", None)
    before = fingerprint(model) if model is not None else None
    pop = LocalPopulation(params, generator, task)
    t0 = time.perf_counter()
    vectors, fitness, status, coefficients, scales, tokens = [], [], [], [], [], 0
    for r in range(repeats):
        key = first_key + r
        scores = pop.score(key, layout, sigma, examples, prompts, sampling, on_member=on_member)
        upd = compute_update(scores.fitness, estimator=estimator, shaping=shaping, lr=lr, sigma=sigma,
                             divide_by_sigma=divide_by_sigma, errors=scores.errors)
        vectors.append(subset_update(params, key, upd.coefficients, upd.scale, subset) if upd.applies
                       else np.zeros(subset.size))
        fitness.append(scores.fitness)
        status.append(upd.status)
        coefficients.append(upd.coefficients)
        scales.append(upd.scale)
        tokens += scores.gen_tokens
    if model is not None and fingerprint(model) != before:
        raise RuntimeError("weights changed during the update-variance measurement (perturb/restore is not exact)")
    return {"vectors": np.stack(vectors) if vectors else np.zeros((0, subset.size)), "fitness": fitness, "status": status,
            "coefficients": coefficients, "scale": scales, "coordinates": subset.size, "of_coordinates": subset.total,
            "keys": [first_key + r for r in range(repeats)], "seconds": time.perf_counter() - t0, "gen_tokens": tokens,
            "weights_unchanged": model is not None}
