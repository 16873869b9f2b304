"""Reference ES arithmetic (``es.arithmetic = "reference"``): Qiu et al.'s in-place loop in the model's dtype.

evolm's default ES is exact (``evolm.es.params``): float32 masters, restore bit for bit, the update
accumulated in float32. The paper's runs (Qiu et al. 2025, github.com/VsonicV/es-fine-tuning-paper,
``--precision bf16`` by default) do none of that: they perturb, restore by subtracting regenerated
noise, and update in place in the model's own dtype, so in bfloat16 every operation rounds to the
weight's own ulp and perturb + restore alone moves weights. This module reproduces that arithmetic so
that findings about *where* and *how far* ES moves weights can be told apart from bf16 rounding.

What the reference code does (``countdown/es_fine-tuning_countdown.py`` at commit 523afc8; the
``_iid`` and ``es_fine-tuning_conciseness.py`` scripts are identical in these lines), per parameter
tensor ``param`` of ``model.named_parameters()``:

- noise: ``torch.randn(param.shape, generator=gen, dtype=param.dtype)`` (lines 141-146): drawn
  directly in the model's dtype;
- perturb: ``param.data.add_(SIGMA * noise)`` (line 147): the product ``SIGMA * noise`` is a tensor of
  the model's dtype (rounded), then added in place (rounded);
- restore: ``param.data.add_(-SIGMA * noise)`` after regenerating the same noise (lines 161-172);
- update (lines 336-354): ``update = torch.zeros_like(param)`` (model dtype); for each member n in
  order: ``noise.mul_(float(r_norm))`` then ``update.add_(noise)`` (each rounded in the model dtype:
  the sum accumulates in bf16, not float32); then ``update.div_(POPULATION_SIZE)`` and
  ``param.data.add_(ALPHA * update)``. ``r_norm`` is the z-scored reward (np.float32, ``std + 1e-8``).

``ReferenceParamSet`` performs exactly these torch operations, in this order, on the selected tensors
(tested bit for bit against a transcription of those lines, ``tests/test_reference_arithmetic.py``).
The accelerated variant (``es_fine-tuning_countdown_accl.py`` with ``utils/worker_extn.py``, fp16 in
vLLM) applies the update member by member as ``p.add_(coeff * noise)`` without an accumulator; it is
not what this module transcribes.

Design decisions:

- Noise source: evolm's own (``es.noise``: table, stream or counter; an independent stream per
  (member, tensor)), drawn in float32 and rounded to the model's dtype (``.to(dtype)``, round to
  nearest even), where the reference draws ``torch.randn`` in that dtype from one seed shared by every
  tensor. The point of this mode is the arithmetic, not Qiu et al.'s random numbers (whose shared seed
  gives same-shaped tensors identical noise); the noise is the same as an exact run's, up to that
  rounding, so exact and reference runs of one seed see the same members.
- Coefficients come from evolm's shaping (``es.shaping``; zscore is Qiu et al.'s up to their
  ``+ 1e-8``) and enter ``mul_`` as Python floats. ``scale`` must be ``lr / N``: the update divides by
  N and multiplies by ``lr`` as two rounded operations, as the reference does, so the estimator is
  one-point and ``divide_by_sigma`` is off (refused at config validation otherwise). Every member's
  noise enters the sum, zero coefficients included, as in the reference.
- The model's dtype is the arithmetic's: bfloat16 and float16 are the interesting cases; float32 is
  allowed (the reference's ``--precision fp32``: restore then errs by ~1 float32 ulp on a fraction of
  the weights) and tested like the others. No float32 masters are kept, so checkpoints hold the
  model's weights in its dtype and ``final/`` holds them cast to float32 (exact).
- Replay: the weights depend on every perturb/restore cycle, not only on the updates, so
  ``evolm.es.engine.replay`` re-runs each logged iteration's members (perturb then restore, in layout
  order, no generation) before its update. The rounding is deterministic given the order of
  operations, so replay and resume reproduce a reference run bit for bit on one software stack
  (tested).
- Chunked, not whole tensors: perturb, restore and the update run CHUNK (2^20) values at a time into
  buffers allocated once (``_add_noise``, ``_steps``). Every operation is elementwise and chunks are a
  multiple of the vector width, so each value goes through the same operations as on whole tensors: the
  same bits (tested against the transcription at 4096-value chunks). What it saves is a fresh temporary the
  size of each tensor per operation: for Gemma-3-270M's 168M-value embedding, 670 MB of new pages each time
  (``benchmarks/inplace_arithmetic.py``: one N = 32 update 1.6-3.8x faster, docs/benchmarks.md).
- Restore error, measured cheaply: ``reference_error_sample`` coordinates (``coordinate_subset``,
  drawn once from the run seed) carry an exact float32 shadow: their base values receive every
  applied update in the exact mode's float32 arithmetic (``ParamSet.apply_update``'s order; the noise
  of those coordinates is gathered from the same noise the reference update draws, so the shadow adds
  no noise generation) and no perturbation at all. After every update the distance of the weights
  from the shadow is logged (``error_metrics``: metrics ``ref_*``). Memory: 2 float32 values and one
  int64 index per sampled coordinate (1.3 MB for the default 65536); the sample can be all
  coordinates. On resume the shadow is rebuilt from the base model and the seed log's updates
  (``replay_shadow``), so no checkpoint file is needed.
"""

from __future__ import annotations

import math

import torch

from evolm.errors import ConfigError
from evolm.es.noise import CounterNoise, NoiseSource
from evolm.es.params import CHUNK, ParamSet, select_parameters

REFERENCE_ARITHMETIC = "reference-in-place-model-dtype"
"""Seed-log name of this arithmetic (``run_header``'s ``perturb.arithmetic``), checked on resume and replay."""


class ReferenceParamSet(ParamSet):
    """Perturb / restore / apply-update in place in the model's dtype, as Qiu et al.'s scripts do."""

    def __init__(self, model, noise: NoiseSource | None, categories=("all",), regex: str = "", *,
                 lr: float, error_sample: int = 0, sample_seed: int = 0):
        selected = select_parameters(model, categories, regex)
        if not selected:
            raise ConfigError(f"es.params={list(categories)} with es.param_regex='{regex}' selects no parameters of this model")
        self._setup(noise, [i for i, _, _ in selected], [n for _, n, _ in selected], [p.data for _, _, p in selected])
        self.lr = float(lr)
        self.error_sample = int(error_sample)
        self.sample_seed = int(sample_seed)
        self.subset = None
        if self.error_sample > 0:
            from evolm.es.measure import coordinate_subset

            self.subset = coordinate_subset(self, self.error_sample, self.sample_seed)
            self.base = [t.view(-1)[idx].to(torch.float32) for t, idx in zip(self.tensors, self.subset.per_tensor)]
            self.shadow = [b.clone() for b in self.base]

    def _setup(self, noise, indices, names, tensors) -> None:
        super()._setup(noise, indices, names, [t for t in tensors])
        self.in_place = True
        self.masters = None  # no float32 copies: the arithmetic is the model dtype's

    @property
    def perturb_path(self) -> str:
        return "reference"

    # -- chunks --------------------------------------------------------------------------------------
    def _reader(self, k: int, iteration: int, direction: int):
        """``read(start, count)``: tensor k's float32 noise, elements ``start .. start + count - 1``, on the
        tensor's device (a view of the table's or the stream's draw; counter noise computed into a buffer that
        the next read overwrites: every caller consumes a read before the next)."""
        live = self.tensors[k]
        if isinstance(self.noise, CounterNoise):
            keys = self.noise.keys(iteration, direction, self.indices[k])
            out = getattr(self, "_counter_buffer", None)
            if out is None or out.device != self.noise.device:
                out = self._counter_buffer = torch.empty(CHUNK, dtype=torch.float32, device=self.noise.device)
            return lambda a, m: self.noise.values(keys, a, m, out=out).to(live.device)
        eps = self._eps(k, iteration, direction)
        return lambda a, m: eps[a:a + m].to(live.device)

    def _scratch(self, like: torch.Tensor, count: int = 2) -> list[torch.Tensor]:
        """``count`` buffers of CHUNK values in ``like``'s dtype and device, allocated once and reused."""
        store = self.__dict__.setdefault("_scratch_buffers", {})
        key = (like.dtype, like.device)
        if len(store.get(key, ())) < count:
            store[key] = [torch.empty(CHUNK, dtype=like.dtype, device=like.device) for _ in range(count)]
        return store[key][:count]

    @torch.no_grad()
    def _add_noise(self, iteration: int, direction: int, factor: float) -> None:
        """``param.add_(factor * noise)`` with ``noise`` rounded to the model's dtype and the product rounded
        there too (reference lines 147 and 172), CHUNK values at a time: the same operations on the same
        values as on whole tensors (elementwise, chunks a multiple of the vector width), without allocating
        tensors the size of the model's largest (a 168M-value embedding's temporaries cost page faults)."""
        for k, live in enumerate(self.tensors):
            flat, read = live.view(-1), self._reader(k, iteration, direction)
            low, product = self._scratch(live)
            for a in range(0, flat.numel(), CHUNK):
                m = min(CHUNK, flat.numel() - a)
                low[:m].copy_(read(a, m))  # eps.to(dtype): rounded to nearest
                torch.mul(low[:m], factor, out=product[:m])
                flat[a:a + m].add_(product[:m])

    @torch.no_grad()
    def perturb(self, iteration: int, direction: int, sign: int, sigma: float) -> None:
        """``param.add_(sigma * noise)`` in the model's dtype (reference line 147)."""
        if self._perturbed is not None:
            raise RuntimeError("perturb() called twice without restore()")
        self._add_noise(iteration, direction, float(sign) * float(sigma))
        self._perturbed = (iteration, direction, sign, sigma)

    @torch.no_grad()
    def restore(self) -> None:
        """``param.add_(-sigma * noise)`` with the noise regenerated (reference line 172): not exact
        in a low-precision dtype; the rounding it leaves behind is the point of this mode."""
        if self._perturbed is None:
            raise RuntimeError("restore() without perturb()")
        iteration, direction, sign, sigma = self._perturbed
        self._add_noise(iteration, direction, -(float(sign) * float(sigma)))
        self._perturbed = None

    @property
    def correction_count(self) -> int:
        return 0

    # -- update --------------------------------------------------------------------------------------
    @torch.no_grad()
    def apply_update(self, iteration: int, coefficients, scale: float) -> bool:
        """Reference lines 336-354: ``update = sum_n (noise_n * r_n)`` accumulated in the model dtype,
        ``update /= N``, ``param += lr * update``; ``scale`` must be ``lr / N`` (checked). The shadow
        coordinates get the exact float32 update. Returns False (nothing written) when a weight would
        become non-finite."""
        if self._perturbed is not None:
            raise RuntimeError("apply_update() while perturbed; restore() first")
        coefficients = [float(c) for c in coefficients]
        n = len(coefficients)
        if float(scale) != self.lr / n:
            raise ValueError(f"reference arithmetic updates by lr / N = {self.lr / n!r}; got step scale {scale!r}")
        if not all(math.isfinite(c) for c in coefficients):
            return False
        if not self._provably_finite(coefficients, float(scale)):
            for k in range(len(self.tensors)):  # the rare second pass: every new value, nothing written
                flat = self.tensors[k].view(-1)
                for a, m, step in self._steps(k, iteration, coefficients):
                    if not bool(torch.isfinite(flat[a:a + m] + step).all()):
                        return False
        shadow_steps = [] if self.subset is not None else None
        for k, live in enumerate(self.tensors):
            flat = live.view(-1)
            for a, m, step in self._steps(k, iteration, coefficients):
                flat[a:a + m].add_(step)
            if shadow_steps is not None:
                shadow_steps.append(self._gather(k, iteration, coefficients))
        if shadow_steps is not None:
            self._add_shadow(shadow_steps, float(scale))
        return True

    def _steps(self, k: int, iteration: int, coefficients: list[float]):
        """``(start, count, lr * update)`` for tensor k, CHUNK values at a time: ``update = sum_n (noise_n *
        r_n) / N`` with every operation rounded in the model's dtype (noise rounded, ``mul_``, ``add_`` in
        member order, ``div_``, then the product with lr), as reference lines 336-354 do on whole tensors.
        The step is a buffer that the next chunk overwrites."""
        live = self.tensors[k]
        readers = [self._reader(k, iteration, d) for d in range(len(coefficients))]
        update, noise = self._scratch(live)
        for a in range(0, live.numel(), CHUNK):
            m = min(CHUNK, live.numel() - a)
            u, e = update[:m], noise[:m]
            u.zero_()
            for read, c in zip(readers, coefficients):  # every member, zero coefficients included, as the reference
                e.copy_(read(a, m))
                e.mul_(c)
                u.add_(e)
            u.div_(len(coefficients))
            yield a, m, torch.mul(u, self.lr, out=e)

    def _gather(self, k: int, iteration: int, coefficients: list[float]) -> list[tuple[float, torch.Tensor]]:
        """The sampled coordinates' float32 noise of every member with a nonzero coefficient (for the shadow)."""
        idx = self.subset.per_tensor[k]
        out = []
        for d, c in enumerate(coefficients):
            if c != 0.0:
                eps = self._eps(k, iteration, d)
                out.append((c, eps[idx.to(eps.device)].to(torch.float32).cpu()))
        return out

    # -- the exact float32 shadow --------------------------------------------------------------------
    def _add_shadow(self, steps: list[list[tuple[float, torch.Tensor]]], scale: float) -> None:
        """``shadow += scale * sum_d c_d eps_d`` in the exact mode's float32 arithmetic
        (``ParamSet._add_update``: table/stream ``add(alpha=)``; counter: each product rounded)."""
        counter = isinstance(self.noise, CounterNoise)
        for k, gathered in enumerate(steps):
            acc = torch.zeros_like(self.shadow[k])
            for c, eps in gathered:
                if counter:
                    acc.add_(torch.mul(eps, c))
                else:
                    acc.add_(eps, alpha=c)
            if counter:
                self.shadow[k].add_(torch.mul(acc, scale))
            else:
                self.shadow[k].add_(acc, alpha=scale)

    @torch.no_grad()
    def replay_shadow(self, records: list[dict]) -> None:
        """Rebuild the shadow from the base values and a seed log's applied updates (resume)."""
        if self.subset is None:
            return
        for record in records:
            if record.get("status") != "applied":
                continue
            iteration = int(record["iteration"])
            steps = []
            for k, idx in enumerate(self.subset.per_tensor):
                numel = self.tensors[k].numel()
                steps.append([(float(c), self.noise.direction(iteration, d, self.indices[k], numel)[idx.to(self.tensors[k].device)]
                               .to(torch.float32).cpu()) for d, c in enumerate(record["coefficients"]) if float(c) != 0.0])
            self._add_shadow(steps, float(record["scale"]))

    def error_metrics(self) -> dict[str, float | None]:
        """Distance of the weights from the exact float32 shadow on the sampled coordinates (empty when off).

        ``ref_error_rel`` ||theta - theta*|| / ||theta*||; ``ref_error_frac``: share of coordinates whose
        weight differs from theta* rounded to the model dtype; ``ref_moved_rel`` / ``ref_moved_exact_rel``:
        ||theta - theta0|| / ||theta0|| of the weights and of the shadow; ``ref_moved_ratio``: their
        quotient (how much further the reference arithmetic moved the weights than exact updates);
        ``ref_changed_frac`` / ``ref_exact_changed_frac``: share of coordinates that moved at all in the
        model dtype (theta != theta0), for the weights and for the shadow rounded to that dtype."""
        if self.subset is None:
            return {}
        now = torch.cat([t.view(-1)[idx.to(t.device)].to(torch.float32).cpu() for t, idx in zip(self.tensors, self.subset.per_tensor)])
        exact = torch.cat(self.shadow)
        base = torch.cat(self.base)
        exact_cast = torch.cat([s.to(t.dtype).to(torch.float32) for s, t in zip(self.shadow, self.tensors)])
        norm = lambda x: float(torch.linalg.vector_norm(x.double()))  # noqa: E731
        moved, moved_exact = norm(now - base), norm(exact - base)
        return {"ref_error_rel": norm(now - exact) / max(norm(exact), 1e-30),
                "ref_error_frac": float((now != exact_cast).double().mean()),
                "ref_moved_rel": moved / max(norm(base), 1e-30),
                "ref_moved_exact_rel": moved_exact / max(norm(base), 1e-30),
                "ref_moved_ratio": moved / moved_exact if moved_exact > 0 else None,
                "ref_changed_frac": float((now != base).double().mean()),
                "ref_exact_changed_frac": float((exact_cast != base).double().mean()),
                "ref_sample": int(now.numel())}
