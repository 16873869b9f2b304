"""The artifact's ES arithmetic (``es.arithmetic = "artifact"``): float32 noise cast into the model's dtype
in place, K engines that each revert and update on their own, synchronised now and then.

The paper "Understanding Evolution Strategies for LLM Reasoning" (2026) published its Easy-setting run as
github.com/yunpengba7/understanding-es (read at commit 240d878). Its loop differs from Qiu et al.'s
(``evolm/es/reference.py``) in two ways that matter for where and how far the weights move:

- **Per tensor, per member** (``src/es_reproduction/worker.py``, ``_apply_seeded_noise``): noise
  ``torch.randn(shape, dtype=float32)``, ``delta.mul_(sigma)`` in float32, then
  ``param.add_(delta.to(param.dtype))``: the product is rounded to float32, cast (rounded) to the
  model's dtype and added in place (rounded). The revert is the same call with ``-sigma``
  (``revert_perturbation``): it subtracts exactly the cast delta (rounding to nearest is symmetric in
  sign), but the add it undoes had rounded, so perturb + revert does not restore the weights.
- **The update** (``_apply_population_update``): ``total = zeros(float32)``; for every member in
  order ``total.add_(noise, alpha=lr / N * weight)``; then ``param.add_(total.to(param.dtype))``:
  accumulated in float32, one rounding into the model's dtype (Qiu et al. accumulate, divide and scale
  in bf16). ``weight`` is the z-scored reward (``train.py`` ``normalize_population_rewards``: float64,
  ``std`` with ddof 0, ``+ 1e-8``).
- **Engines** (``train.py``): 8 vLLM engines, one per GPU. A step's 32 members are split into
  contiguous blocks of ``ceil(N / K)`` (``shard_seeds``), engine i scoring members
  ``i*4 .. i*4+3`` one after another (perturb, generate, revert). Every engine then applies the same
  update to its own weights. Engine 0's weights are broadcast to the others after the update of every
  step divisible by ``engine_sync_every`` (117) and before every checkpoint (``synchronization_due``;
  checkpoints at 117 and 234), and checkpoints are exported from engine 0. So between syncs each
  engine's weights carry its own members' revert errors; what is saved is engine 0's.

This module does that in one process: ``es.engines = K`` replicas of the selected tensors, replica 0
being the model's own tensors (what is generated from when its members are scored, probed,
checkpointed, saved and evaluated), replicas 1..K-1 copies. Scoring member m swaps its replica's
values into the model (``activate``: a chunked swap, nothing allocated per member), so the population,
the generator and the engine need not know there are replicas; after an update replica 0 is back in the
model. Fitness of each member therefore comes from its own replica's weights, as on the artifact's
engines.

Design decisions:

- **Noise: evolm's keyed sources, not the artifact's RNG.** The artifact seeds a ``torch.Generator``
  on the parameter's device (CUDA) with ``seed XOR blake2b(name)`` and draws ``torch.randn``; CUDA's
  Philox-based normal stream is not the CPU generator's (mt19937), so those bits cannot be drawn on a
  CPU, and the names it hashes are vLLM's fused ones (``qkv_proj``, ``gate_up_proj``: one stream per
  fused tensor), not the Hugging Face names this process holds. evolm's noise (``es.noise``: table,
  stream or counter; an independent stream per (iteration, member, tensor)) is drawn in float32 and
  enters the same arithmetic. The point is the arithmetic, as for ``reference``: an exact run of the
  same seed sees the same members.
- **The per-member step is ``scale * c_d``** (``scale = lr / N``, evolm's one-point step with
  ``divide_by_sigma = false``: the artifact's ``learning_rate / len(seeds) * weight``), passed as
  ``add_``'s ``alpha`` as the artifact does; zero coefficients are skipped (adding ``0 * eps`` to a
  float32 sum changes no bit).
- **The update is computed once and added to every replica.** The artifact's engines each compute the
  same float32 sum with the same code; the result is the same bits, so computing it once is the same
  arithmetic. What differs between replicas is only what their members' reverts left behind.
- **Syncs are in the seed log.** The engine asks ``end_step(step)`` after every update; the replicas
  are synced from replica 0 when ``step`` is a multiple of ``es.engine_sync_every``, a checkpoint step,
  or the last update (so that ``final/``, like a checkpoint, holds weights all replicas share), and the
  seed-log record says so (``engine_sync``). Replay (``evolm.es.engine.replay_into``) perturbs and
  reverts every logged member on its replica, applies the update to all, and syncs where the log says:
  the run's weights, bit for bit (deterministic on one software stack; tested on the CPU). A resume
  from a checkpoint sets every replica to the checkpoint's weights, which is exact because checkpoints
  follow a sync; one from weights saved after an unsynced update (a run stopped by ``run.match``
  before ``es.iterations``) is refused in one line (resume by replay instead).
- **Replica 0 never receives the others' history.** A sync copies replica 0 into the others, so the
  saved model went through its own block's perturb/revert cycles only (4 of 32 per update in the
  artifact): given the coefficients it is the single-engine loop over members ``0 .. N/K - 1``, whatever
  the sync schedule (tested). The other replicas act on it only through their members' fitness; in a
  null walk (fitness not computed from the weights) K and the syncs change nothing in replica 0.
- **Replica divergence is measured before each sync** (``divergence``: each replica's relative distance from
  replica 0 and the share of its coordinates whose bits differ), logged as ``replica_divergence`` in that
  update's metrics record: how far the artifact's engines score members on weights that are not the saved
  model's, the number its 117-update sync period leaves open.
- **Memory:** K - 1 copies of the selected tensors in the model's dtype (``(K - 1) * P * 2`` bytes in
  bf16: 1.9 GB for SmolLM2-135M at K = 8, 21.6 GB for Qwen2.5-1.5B), plus a few chunks of 2^20 values
  for the swap and for perturb, revert and the update, which run chunk by chunk as in ``reference`` (the same bits
  as whole tensors, without their temporaries). The restore-error shadow of ``reference`` (``es.reference_error_sample``, metrics
  ``ref_*``) is kept the same way here, on replica 0.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from evolm.es.params import CHUNK
from evolm.es.reference import ReferenceParamSet

ARTIFACT_ARITHMETIC = "artifact-float32-noise-cast-in-place"
"""Seed-log name of this arithmetic (``run_header``'s ``perturb.arithmetic``), checked on resume and replay."""


def member_engines(population: int, engines: int) -> list[int]:
    """The engine (replica) of each member: contiguous blocks of ``ceil(N / K)`` members, as the artifact
    splits its seeds (``train.py`` ``shard_seeds``; with N = 32, K = 8: members 4i .. 4i+3 on engine i).
    With N not a multiple of K the last engines may get fewer members, or none."""
    if engines < 1 or population < 1:
        raise ValueError("population and engines must be positive")
    size = math.ceil(population / engines)
    return [m // size for m in range(population)]


class ArtifactParamSet(ReferenceParamSet):
    """Perturb / revert / update as the artifact's workers do, on ``engines`` replicas of the selected tensors."""

    def __init__(self, model, noise, categories=("all",), regex: str = "", *, lr: float, population: int,
                 engines: int = 1, sync_every: int = 0, sync_also: Callable[[int], bool] | None = None,
                 error_sample: int = 0, sample_seed: int = 0):
        """``sync_every``: sync the replicas after every update whose step is a multiple of it (0: never
        on a period); ``sync_also(step)``: further steps to sync after (checkpoints, the last update)."""
        super().__init__(model, noise, categories, regex, lr=lr, error_sample=error_sample, sample_seed=sample_seed)
        self.population = int(population)
        self.engines = int(engines)
        self.engine_of = member_engines(self.population, self.engines)
        self.sync_every = int(sync_every)
        self.sync_also = sync_also
        self.stored = {r: [t.detach().clone() for t in self.tensors] for r in range(1, self.engines)}
        """Replicas not in the model now, by engine (replica ``active`` is in the model's tensors)."""
        self.active = 0
        self.last_sync_divergence: dict | None = None
        """``divergence()`` measured just before the latest ``end_step``'s sync (None when it did not sync)."""

    @property
    def perturb_path(self) -> str:
        return "artifact"

    # -- replicas ------------------------------------------------------------------------------------
    def replica(self, r: int) -> list[torch.Tensor]:
        """The tensors holding replica ``r`` now (the model's when it is the active one)."""
        return self.tensors if r == self.active else self.stored[r]

    @torch.no_grad()
    def activate(self, r: int) -> None:
        """Put replica ``r``'s values into the model (swapping them with the active replica's)."""
        if r == self.active:
            return
        slot = self.stored.pop(r)
        for live, other in zip(self.tensors, slot):
            a, b = live.view(-1), other.view(-1)
            (buf,) = self._scratch(live, 1)  # free here: perturb, revert and the update use it only inside their loops
            for s in range(0, a.numel(), CHUNK):
                m = min(CHUNK, a.numel() - s)
                buf[:m].copy_(a[s:s + m])
                a[s:s + m].copy_(b[s:s + m])
                b[s:s + m].copy_(buf[:m])
        self.stored[self.active] = slot
        self.active = r

    @torch.no_grad()
    def sync_replicas(self) -> None:
        """Every replica := replica 0 (the artifact's broadcast from engine 0); replica 0 ends in the model."""
        if self._perturbed is not None:
            raise RuntimeError("sync_replicas() while perturbed; restore() first")
        self.activate(0)
        for slot in self.stored.values():
            for live, other in zip(self.tensors, slot):
                other.copy_(live)

    def sync_due(self, step: int) -> bool:
        """Whether the replicas are synced after update ``step`` (1-based)."""
        return (self.sync_every > 0 and step % self.sync_every == 0) or bool(self.sync_also and self.sync_also(step))

    def end_step(self, step: int) -> bool:
        """Called by the engine after update ``step`` (applied or not): sync if due; returns whether it did
        (the engine writes it into the seed log, which replay follows). Just before a sync the replicas'
        divergence from replica 0 is measured into ``last_sync_divergence`` (None after an update with no sync),
        which the engine logs in that update's metrics record."""
        self.activate(0)
        self.last_sync_divergence = None
        if self.engines > 1 and self.sync_due(step):
            self.last_sync_divergence = self.divergence()
            self.sync_replicas()
            return True
        return False

    @torch.no_grad()
    def divergence(self) -> dict:
        """How far replicas 1..K-1 have drifted from replica 0 since the last sync, each measured against it:
        ``relative_distance`` = ||theta_r - theta_0|| / ||theta_0|| (sums in float64 over chunks, the difference
        taken in float32, exact for bf16/fp16 values) and ``differing`` = the share of coordinates whose bits
        differ; per replica (lists, replica 1 first) and their maximum. Cost: one pass over K - 1 replicas."""
        zero = self.replica(0)
        norm0 = math.sqrt(sum(float(t.double().square().sum()) for t in zero))
        total = sum(t.numel() for t in zero)
        dist, share = [], []
        for r in range(1, self.engines):
            sq, diff = 0.0, 0
            for a, b in zip(zero, self.replica(r)):
                fa, fb = a.view(-1), b.view(-1)
                for s in range(0, fa.numel(), CHUNK):
                    x, y = fa[s:s + CHUNK], fb[s:s + CHUNK]
                    sq += float((y.float() - x.float()).double().square().sum())
                    diff += int((_bits(x) != _bits(y)).sum())
            dist.append(math.sqrt(sq) / norm0 if norm0 else 0.0)
            share.append(diff / total)
        return {"relative_distance": dist, "differing": share, "relative_distance_max": max(dist),
                "differing_max": max(share)}

    def catch_up(self) -> int:
        """Before the model is read (probe, checkpoint, the end): replica 0 in the model."""
        self.activate(0)
        return super().catch_up()

    def replicas_equal(self) -> bool:
        """Whether every replica holds replica 0's values bit for bit."""
        zero = self.replica(0)
        return all(torch.equal(_bits(a), _bits(b)) for r in range(1, self.engines) for a, b in zip(zero, self.replica(r)))

    # -- perturb / revert ----------------------------------------------------------------------------
    @torch.no_grad()
    def _add_noise(self, iteration: int, direction: int, factor: float) -> None:
        """worker.py ``_apply_seeded_noise``: ``delta = eps * factor`` in float32 (rounded), cast to the
        tensor's dtype (rounded), ``param.add_(delta)`` (rounded), CHUNK values at a time (the same
        operations on the same values as on whole tensors, without temporaries the size of a tensor)."""
        for k, live in enumerate(self.tensors):
            flat, read = live.view(-1), self._reader(k, iteration, direction)
            delta = self._buffers(live.device)[2]
            (low,) = self._scratch(live, 1)
            for a in range(0, flat.numel(), CHUNK):
                m = min(CHUNK, flat.numel() - a)
                torch.mul(read(a, m), factor, out=delta[:m])
                low[:m].copy_(delta[:m])  # delta.to(dtype=parameter.dtype)
                flat[a:a + m].add_(low[:m])

    @torch.no_grad()
    def perturb(self, iteration: int, direction: int, sign: int, sigma: float) -> None:
        """Member ``direction`` on its engine's replica: ``param.add_(cast(sigma * eps))``."""
        if self._perturbed is not None:
            raise RuntimeError("perturb() called twice without restore()")
        self.activate(self.engine_of[direction])
        self._add_noise(iteration, direction, float(sign) * float(sigma))
        self._perturbed = (iteration, direction, sign, sigma)

    @torch.no_grad()
    def restore(self) -> None:
        """The artifact's revert: ``param.add_(cast(-sigma * eps))`` on the same replica (not exact)."""
        if self._perturbed is None:
            raise RuntimeError("restore() without perturb()")
        iteration, direction, sign, sigma = self._perturbed
        self._add_noise(iteration, direction, -float(sign) * float(sigma))
        self._perturbed = None

    # -- update --------------------------------------------------------------------------------------
    def _cast_totals(self, k: int, iteration: int, coefficients: list[float], scale: float):
        """``(start, count, step)`` for tensor k, CHUNK values at a time: ``total = sum_d (scale * c_d) eps_d``
        accumulated in float32 in member order (``total.add_(noise, alpha=...)``, zero coefficients skipped),
        then cast to the model's dtype (worker.py ``_apply_population_update``). The step is a buffer that the
        next chunk overwrites."""
        live = self.tensors[k]
        members = [(self._reader(k, iteration, d), scale * c) for d, c in enumerate(coefficients) if c != 0.0]
        total = self._buffers(live.device)[0]
        (low,) = self._scratch(live, 1)
        for a in range(0, live.numel(), CHUNK):
            m = min(CHUNK, live.numel() - a)
            t = total[:m]
            t.zero_()
            for read, alpha in members:
                t.add_(read(a, m), alpha=alpha)
            low[:m].copy_(t)
            yield a, m, low[:m]

    @torch.no_grad()
    def apply_update(self, iteration: int, coefficients, scale: float) -> bool:
        """worker.py ``_apply_population_update`` on every replica: the float32 sum cast to the model's
        dtype and added in place. Returns False (nothing written) when a weight of any replica would
        become non-finite."""
        if self._perturbed is not None:
            raise RuntimeError("apply_update() while perturbed; restore() first")
        coefficients = [float(c) for c in coefficients]
        scale = float(scale)
        if not (math.isfinite(scale) and all(math.isfinite(c) for c in coefficients)):
            return False
        self.activate(0)
        replicas = [self.replica(r) for r in range(self.engines)]
        if not self._replicas_provably_finite(replicas, coefficients, scale):
            for k in range(len(self.tensors)):  # the rare second pass: every new value, nothing written
                for a, m, step in self._cast_totals(k, iteration, coefficients, scale):
                    if not all(bool(torch.isfinite(rep[k].view(-1)[a:a + m] + step).all()) for rep in replicas):
                        return False
        shadow_steps = [] if self.subset is not None else None
        for k in range(len(self.tensors)):
            for a, m, step in self._cast_totals(k, iteration, coefficients, scale):
                for rep in replicas:
                    rep[k].view(-1)[a:a + m].add_(step)
            if shadow_steps is not None:
                shadow_steps.append(self._gather(k, iteration, coefficients))
        if shadow_steps is not None:
            self._add_shadow(shadow_steps, scale)
        return True

    def _replicas_provably_finite(self, replicas, coefficients: list[float], scale: float) -> bool:
        step = abs(scale) * sum(abs(c) for c in coefficients) * self.noise.max_abs()
        peaks = []
        for rep in replicas:
            for t in rep:
                lo, hi = torch.aminmax(t.detach())
                peaks.append(torch.maximum(-lo, hi).float())
        limit = 0.5 * min(torch.finfo(torch.float32).max, min(torch.finfo(t.dtype).max for t in self.tensors))
        return all(p + step <= limit for p in torch.stack(peaks).tolist())


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bits as integers (so -0.0 != 0.0 and NaNs compare)."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.detach().contiguous().view(ints)
