"""The parameters ES moves: selection by category or regex, in-place perturbation with exact restore,
and the float32 update.

Design decisions:

- Selection: ``categories`` from ``evolm.categories.param_category`` (norm, attention, mlp,
  embedding, lm_head) or ``all``, optionally intersected with a name regex. Tied tensors (SmolLM2's
  embedding and LM head) are one tensor and are perturbed once, under their first name.
- Each selected tensor has a fixed index (its position in the model's ``named_parameters`` order) that
  keys its noise, so restricting ES to a subset does not change the noise a tensor receives.
- One arithmetic on every path: the perturbation is ``d = a * eps`` rounded to float32 (``a = sign *
  sigma``), then ``theta' = theta + d``; restore computes ``theta' - d``. Never a fused multiply-add
  (``torch.add(..., alpha=a)`` fuses on CPUs with FMA): the compiled kernel (built with
  ``-ffp-contract=off``) and the torch ops round the same two operations, so a member's weights are
  bit-identical whichever path (or process, or backend using ``ParamSet``) computes them
  (``PERTURB_ARITHMETIC``, recorded in every run's seed-log header and checked on resume).
- float32 models (the default): perturbation happens in place. Restore returns the original value
  for all but ~0.6% of elements (floating-point addition is not invertible). Perturb runs that very restore computation on each chunk, compares,
  and records the original values of the elements that would not come back; restore writes them
  back. Restore is therefore bit-exact (tested over many cycles) at the cost of the sparse corrections
  (~10 MB for 134M parameters at sigma 1e-3), not of a second copy of the model. Arithmetic runs in
  chunks of 2^20 elements so temporaries stay small. On CPU, ``evolm.es.fused`` does the same in one
  compiled loop when a C++ compiler is available (``EVOLM_FUSED=0`` turns it off); a perturb and its
  restore always take the same path.
- Other dtypes (bfloat16/float16 generation, or any model whose weights are not float32): float32
  master copies of the selected tensors are kept; perturbation writes ``cast(master + d)`` into the
  model and restore writes ``cast(master)``; updates go to the masters. Exact by construction.
- The update ``theta += scale * sum_d c_d eps_d`` accumulates the weighted noise in float32 before it
  is added, in a fixed order (tensor by tensor, chunk by chunk, direction by direction), so replaying
  a run's seed log from the base model reproduces its weights bit for bit on the same software stack.
- Counter noise (``evolm.es.noise.CounterNoise``) is never materialised: perturb, restore and update
  compute it chunk by chunk where the weights are (``noise.values``), and on CPU the kernel computes
  it inside its loops (``counter_perturb``, ``counter_restore``, ``counter_update``); on CUDA, when Triton
  imports, ``evolm.es.noise_triton``'s kernels do the same arithmetic in one launch per tensor (per
  2^22-element chunk for the perturb), the torch ops otherwise (``EVOLM_TRITON=0``). Its update rounds
  every operation on its own, ``acc += round(c_d * eps_d)`` from 0 in direction order, then
  ``theta + round(scale * acc)`` (the table and stream paths keep their ``add(alpha=)`` arithmetic, so
  their old seed logs replay unchanged), so a counter run's members and updates are bit-identical
  on the kernel, the torch ops, the Triton kernels (tested under Triton's interpreter), any thread count,
  any chunk size and (by construction) CUDA.
- No update writes a non-finite value into the weights. A bound proves most updates safe before any
  write (``max |theta| + |scale| * sum_d |c_d| * max |eps|`` at most half the largest finite value of
  the weights' dtype and of float32); when it cannot, a first pass computes every new value without
  writing, and the update is refused (``apply_update`` returns False, the weights untouched) if any
  would be inf or NaN. The bound costs one read of the weights; the second pass happens only near
  overflow.
"""

from __future__ import annotations

import math
import re

import torch

from evolm.categories import param_category
from evolm.errors import ConfigError
from evolm.es import fused
from evolm.es.noise import CounterNoise, NoiseSource, counter_triton

CHUNK = 1 << 20
PERTURB_ARITHMETIC = "product-rounded-then-add"
"""How a perturbation is computed (``d = a * eps`` rounded, then ``theta + d``); recorded in seed-log headers."""


def select_parameters(model, categories=("all",), regex: str = "") -> list[tuple[int, str, torch.nn.Parameter]]:
    """``(noise index, name, tensor)`` of every parameter ES should move (tied tensors once)."""
    pattern = re.compile(regex) if regex else None
    seen: set[int] = set()
    chosen = []
    for index, (name, p) in enumerate(model.named_parameters(remove_duplicate=False)):
        if id(p) in seen:
            continue
        seen.add(id(p))
        if "all" not in categories and param_category(name) not in categories:
            continue
        if pattern and not pattern.search(name):
            continue
        chosen.append((index, name, p))
    return chosen


def _bitwise_mismatches(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Indices where float32 tensors ``a`` and ``b`` differ bit for bit (so -0.0 != 0.0).

    Mismatches are rare (~0.5%), so the scan first finds 8-element groups holding any mismatch (one
    int64 word of the boolean mask each) and looks inside those only: ~2x faster than ``nonzero``
    over the whole mask."""
    lost = a.view(torch.int32) != b.view(torch.int32)
    m = lost.numel()
    whole = m - m % 8
    groups = (lost[:whole].view(torch.int64) != 0).nonzero().view(-1)
    inside = lost[:whole].view(-1, 8)[groups].nonzero()
    where = groups[inside[:, 0]] * 8 + inside[:, 1]
    if whole < m:
        where = torch.cat([where, lost[whole:].nonzero().view(-1) + whole])
    return where


def within_bounds(peaks: list[float], step: float, limits: list[float]) -> bool:
    """Whether an update that moves no weight by more than ``step`` provably keeps every weight finite: each
    tensor's ``max |theta|`` (``peaks``, or an upper bound of it) plus ``step`` at most its limit
    (``ParamSet.finite_limits``). False for a NaN or inf anywhere."""
    return all(p + step <= limit for p, limit in zip(peaks, limits))


class ParamSet:
    """Perturb / restore / apply-update on a model's selected parameters (the engine's only model calls)."""

    def __init__(self, model, noise: NoiseSource, categories=("all",), regex: str = "", *, masters_elsewhere: bool = False):
        """``masters_elsewhere``: a lower-precision model whose float32 masters live in the replica that
        does the arithmetic (a vLLM engine's workers, ``backends.vllm.EngineParamSet``): this ParamSet then
        keeps no masters of its own (4 B per parameter less) and refuses to perturb or update; it holds
        the selection, the noise and the queue of deferred updates."""
        selected = select_parameters(model, categories, regex)
        if not selected:
            raise ConfigError(f"es.params={list(categories)} with es.param_regex='{regex}' selects no parameters of this model")
        self._setup(noise, [i for i, _, _ in selected], [n for _, n, _ in selected], [p.data for _, _, p in selected],
                    masters_elsewhere=masters_elsewhere)

    @classmethod
    def from_tensors(cls, noise: NoiseSource, indices: list[int], names: list[str], tensors: list[torch.Tensor]) -> "ParamSet":
        """A ParamSet over tensors chosen by the caller, e.g. views into an inference engine's fused
        parameters (``evolm.es.vllm_worker``): with the same indices and noise, a member's weights
        come out bit-identical to those of the ParamSet over the Hugging Face model."""
        self = cls.__new__(cls)
        self._setup(noise, list(indices), list(names), list(tensors))
        return self

    def _setup(self, noise: NoiseSource, indices: list[int], names: list[str], tensors: list[torch.Tensor],
               masters_elsewhere: bool = False) -> None:
        self.noise = noise
        self.indices = indices
        self.names = names
        self.tensors = tensors
        self.in_place = all(t.dtype == torch.float32 for t in self.tensors)
        self.masters_elsewhere = masters_elsewhere and not self.in_place
        keep = not self.in_place and not self.masters_elsewhere
        self.masters = [t.detach().to(torch.float32, copy=True) for t in self.tensors] if keep else None
        self._perturbed: tuple[int, int, int, float] | None = None
        self._corrections: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        self._deferred: list[tuple[int, list[float], float]] = []

    @property
    def numel(self) -> int:
        return sum(t.numel() for t in self.tensors)

    @property
    def largest_numel(self) -> int:
        return max(t.numel() for t in self.tensors)

    @property
    def keeps_masters(self) -> bool:
        """Whether the run has float32 masters (here, or in the replica when ``masters_elsewhere``)."""
        return self.masters is not None or self.masters_elsewhere

    def _arithmetic_here(self) -> None:
        if self.masters_elsewhere:
            raise RuntimeError("this ParamSet's float32 masters live in its replica (masters_elsewhere): "
                               "perturb and update there")

    @property
    def noise_numel(self) -> int:
        """Noise values one member draws (the selected parameters; fewer for low-rank factors)."""
        return self.numel

    @property
    def layout(self) -> list[tuple[int, int]]:
        """``(noise index, numel)`` of every selected tensor, in order: the flattened parameter vector."""
        return [(i, t.numel()) for i, t in zip(self.indices, self.tensors)]

    @property
    def perturb_path(self) -> str:
        """Which code perturbs: ``masters`` (lower-precision model), ``kernel`` (evolm.es.fused), ``triton``
        (counter noise on CUDA, evolm.es.noise_triton) or ``torch``. Asking builds the kernel if it is not
        built yet (a one-off cost kept out of timed loops)."""
        if self.keeps_masters:
            return "masters"
        t = self.tensors[0]
        if isinstance(self.noise, CounterNoise) and not self.noise.kernels:
            return "torch"
        if isinstance(self.noise, CounterNoise) and counter_triton(t, self.noise.table) is not None:
            return "triton"
        return "kernel" if fused.usable(t, t) and fused.kernel() is not None else "torch"

    def _eps(self, k: int, iteration: int, direction: int) -> torch.Tensor:
        return self.noise.direction(iteration, direction, self.indices[k], self.tensors[k].numel())

    # -- perturb / restore ---------------------------------------------------------------------------
    @torch.no_grad()
    def perturb(self, iteration: int, direction: int, sign: int, sigma: float) -> None:
        """Set the selected weights to ``theta + sign * sigma * eps(iteration, direction)``."""
        if self._perturbed is not None:
            raise RuntimeError("perturb() called twice without restore()")
        self._arithmetic_here()
        factor = float(sign) * float(sigma)
        self._corrections = []
        paths = []
        for k, live in enumerate(self.tensors):
            flat = live.view(-1)
            triton_kernels = None
            if isinstance(self.noise, CounterNoise):  # noise computed here, chunk by chunk (never materialised)
                keys = self.noise.keys(iteration, direction, self.indices[k])
                eps = None
                if self.masters is not None:
                    triton_kernels = counter_triton(live, self.masters[k], self.noise.table) if self.noise.kernels else None
                    if triton_kernels is not None:  # cast(master + d) in one launch
                        triton_kernels.counter_perturb_masters_triton(flat, self.masters[k].view(-1), self.noise.table,
                                                                      keys[0], keys[1], factor)
                        continue
                    kern = None
                else:
                    triton_kernels = counter_triton(live, self.noise.table) if self.noise.kernels else None
                    kern = (fused.kernel() if triton_kernels is None and self.noise.kernels
                            and fused.usable_counter(live, self.noise.table) else None)
            else:
                eps = self._eps(k, iteration, direction)
                if self.masters is not None:  # cast(master + d), product rounded then added, chunk by chunk
                    _, _, d, _ = self._buffers(live.device)
                    master = self.masters[k].view(-1)
                    for a in range(0, flat.numel(), CHUNK):
                        m = min(CHUNK, flat.numel() - a)
                        torch.mul(eps[a:a + m], factor, out=d[:m])
                        flat[a:a + m].copy_(master[a:a + m] + d[:m])
                    continue
                kern = fused.kernel() if fused.usable(live, eps) else None
            if self.masters is not None:  # counter noise into a lower-precision model: cast(master + d)
                _, _, d, e = self._buffers(live.device)
                master = self.masters[k].view(-1)
                for a in range(0, flat.numel(), CHUNK):
                    m = min(CHUNK, flat.numel() - a)
                    torch.mul(self.noise.values(keys, a, m, out=e), factor, out=d[:m])
                    flat[a:a + m].copy_(master[a:a + m] + d[:m])
                continue
            paths.append("kernel" if kern is not None else "triton" if triton_kernels is not None else "torch")
            if triton_kernels is not None:  # one launch per chunk: add, predict restore, record, write
                where, values = triton_kernels.counter_perturb_triton(flat, self.noise.table, keys[0], keys[1], factor)
                if where.numel():
                    self._corrections.append((k, where, values))
                continue
            if kern is not None:  # one pass: add, predict restore, record, write (evolm.es.fused)
                if eps is None:
                    where, values = kern.counter_perturb(flat, self.noise.table, keys[0], keys[1], factor)
                else:
                    where, values = kern.perturb(flat, eps, factor)
                if where.numel():
                    self._corrections.append((k, where, values))
                continue
            new, back, d, e = self._buffers(live.device)
            for a in range(0, flat.numel(), CHUNK):
                theta = flat[a:a + CHUNK]
                m = theta.numel()
                noise = eps[a:a + CHUNK] if eps is not None else self.noise.values(keys, a, m, out=e)
                torch.mul(noise, factor, out=d[:m])  # rounded: no fused multiply-add
                torch.add(theta, d[:m], out=new[:m])
                torch.sub(new[:m], d[:m], out=back[:m])  # what restore() will compute
                where = _bitwise_mismatches(back[:m], theta)
                if where.numel():
                    self._corrections.append((k, where + a, theta[where].clone()))
                theta.copy_(new[:m])
        self._perturbed = (iteration, direction, sign, sigma)
        self._paths = paths

    @torch.no_grad()
    def restore(self) -> None:
        """Undo the last ``perturb`` exactly (bit for bit)."""
        if self._perturbed is None:
            raise RuntimeError("restore() without perturb()")
        iteration, direction, sign, sigma = self._perturbed
        factor = float(sign) * float(sigma)
        counter = isinstance(self.noise, CounterNoise)
        for k, live in enumerate(self.tensors):
            if self.masters is not None:
                live.copy_(self.masters[k].view_as(live))
                continue
            flat = live.view(-1)
            keys = self.noise.keys(iteration, direction, self.indices[k]) if counter else None
            eps = None if counter else self._eps(k, iteration, direction)
            if self._paths[k] == "triton":  # the same arithmetic the perturb predicted
                from evolm.es import noise_triton

                noise_triton.counter_restore_triton(flat, self.noise.table, keys[0], keys[1], factor)
                continue
            if self._paths[k] == "kernel":  # the same arithmetic the perturb predicted
                if counter:
                    fused.kernel().counter_restore(flat, self.noise.table, keys[0], keys[1], factor)
                else:
                    fused.kernel().restore(flat, eps, factor)
                continue
            _, _, d, e = self._buffers(live.device)
            for a in range(0, flat.numel(), CHUNK):
                m = min(CHUNK, flat.numel() - a)
                noise = self.noise.values(keys, a, m, out=e) if counter else eps[a:a + CHUNK]
                torch.mul(noise, factor, out=d[:m])
                flat[a:a + CHUNK].sub_(d[:m])
        for k, where, values in self._corrections:
            self.tensors[k].view(-1)[where] = values
        self._corrections = []
        self._perturbed = None

    def _buffers(self, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        if getattr(self, "_buf", None) is None or self._buf[0].device != torch.device(device):
            self._buf = tuple(torch.empty(CHUNK, device=device) for _ in range(4))
        return self._buf

    @property
    def correction_count(self) -> int:
        return sum(w.numel() for _, w, _ in self._corrections)

    # -- update --------------------------------------------------------------------------------------
    @torch.no_grad()
    def apply_update(self, iteration: int, coefficients, scale: float) -> bool:
        """``theta += scale * sum_d coefficients[d] * eps(iteration, d)``, accumulated in float32.

        Returns False, and changes nothing, when the update would make any weight non-finite."""
        if self._perturbed is not None:
            raise RuntimeError("apply_update() while perturbed; restore() first")
        if self._deferred:
            raise RuntimeError("apply_update() with deferred updates queued; catch_up() first")
        self._arithmetic_here()
        coefficients = [float(c) for c in coefficients]
        scale = float(scale)
        if not (math.isfinite(scale) and all(math.isfinite(c) for c in coefficients)):
            return False
        if not self._provably_finite(coefficients, scale) and not self._add_update(iteration, coefficients, scale, write=False):
            return False
        self._add_update(iteration, coefficients, scale, write=True)
        return True

    # -- a mirror of replicas that live elsewhere -----------------------------------------------------
    def defer_update(self, iteration: int, coefficients, scale: float) -> None:
        """Queue an update the replicas (Ray actors, a vLLM engine) applied, for ``catch_up``: the driver's
        copy then costs nothing per update, only when its weights are read (checkpoint, probe, the end)."""
        self._deferred.append((int(iteration), [float(c) for c in coefficients], float(scale)))

    @property
    def deferred(self) -> int:
        """Updates queued by ``defer_update`` and not yet applied here."""
        return len(self._deferred)

    def take_deferred(self) -> list[tuple[int, list[float], float]]:
        """The queued updates, removed from the queue (a replica that holds the masters applied them)."""
        pending, self._deferred = self._deferred, []
        return pending

    def catch_up(self) -> int:
        """Apply the queued updates in order (the same arithmetic as applying each when it came, so the
        weights are bit-identical); returns how many. An update the replicas applied but these weights
        refuse (non-finite) means the copies differ: RuntimeError."""
        pending, self._deferred = self._deferred, []
        for done, (iteration, coefficients, scale) in enumerate(pending):
            if not self.apply_update(iteration, coefficients, scale):
                self._deferred = pending[done:]
                raise RuntimeError(f"update {iteration + 1}, applied by the replicas, would make the driver's "
                                   "weights non-finite: the driver's copy differs from theirs")
        return len(pending)

    def _provably_finite(self, coefficients: list[float], scale: float) -> bool:
        """Whether ``max |theta| + |scale| * sum |c| * max |eps|`` stays below half of every finite range involved."""
        return within_bounds(self.peaks(), self.update_bound(coefficients, scale), self.finite_limits())

    def update_bound(self, coefficients, scale: float) -> float:
        """The most an update can move any selected weight: ``|scale| * sum_d |c_d| * max |eps|`` (NaN or inf
        for a non-finite update)."""
        return abs(float(scale)) * sum(abs(float(c)) for c in coefficients) * self.noise.max_abs()

    @torch.no_grad()
    def peaks(self) -> list[float]:
        """``max |theta|`` per selected tensor (of its float32 master when kept): one read of the weights."""
        peaks = []
        for k, live in enumerate(self.tensors):
            lo, hi = torch.aminmax((self.masters[k] if self.masters is not None else live).detach())
            peaks.append(torch.maximum(-lo, hi).float())
        return torch.stack(peaks).tolist()  # one device transfer for all tensors

    def finite_limits(self) -> list[float]:
        """Per selected tensor, half the largest finite value of float32 and of its own dtype (``within_bounds``)."""
        return [0.5 * min(torch.finfo(torch.float32).max, torch.finfo(t.dtype).max) for t in self.tensors]

    def _add_update(self, iteration: int, coefficients: list[float], scale: float, write: bool) -> bool:
        """Add the update (``write``), or only check that every new value would be finite (returns False if not)."""
        if isinstance(self.noise, CounterNoise):
            return self._add_counter_update(iteration, coefficients, scale, write)
        for k, live in enumerate(self.tensors):
            target = (self.masters[k] if self.masters is not None else live).view(-1)
            noises = [(c, self._eps(k, iteration, d)) for d, c in enumerate(coefficients) if c != 0.0]
            for a in range(0, target.numel(), CHUNK):
                acc = torch.zeros(min(CHUNK, target.numel() - a), dtype=torch.float32, device=target.device)
                for c, eps in noises:
                    acc.add_(eps[a:a + CHUNK], alpha=c)
                if write:
                    target[a:a + CHUNK].add_(acc, alpha=scale)
                    continue
                new = torch.add(target[a:a + CHUNK], acc, alpha=scale)
                if not bool(torch.isfinite(new).all()) or not bool(torch.isfinite(new.to(live.dtype)).all()):
                    return False
            if write and self.masters is not None:
                live.copy_(self.masters[k].view_as(live))
        return True

    def _add_counter_update(self, iteration: int, coefficients: list[float], scale: float, write: bool) -> bool:
        """The update with counter noise, computed chunk by chunk where the weights are: per element
        ``acc = sum_d round(c_d * eps_d)`` (from 0, directions in order, zero coefficients skipped), then
        ``theta + round(scale * acc)``: the same rounded operations in the kernel and in torch ops."""
        active = [(d, c) for d, c in enumerate(coefficients) if c != 0.0]
        noise = self.noise
        for k, live in enumerate(self.tensors):
            target = (self.masters[k] if self.masters is not None else live).view(-1)
            keys = [noise.keys(iteration, d, self.indices[k]) for d, _ in active]
            exact_check = write or self.masters is None  # the kernel checks float32 finiteness only
            triton_kernels = counter_triton(target, noise.table, *([] if self.masters is None else [live])) if noise.kernels else None
            kern = None
            if triton_kernels is None and noise.kernels and exact_check and fused.usable_counter(target, noise.table):
                kern = fused.kernel()
            if triton_kernels is not None:  # one launch per tensor (float32 and the model's dtype checked)
                if not triton_kernels.counter_update_triton(target, noise.table, keys, [c for _, c in active], scale,
                                                            write, live=None if self.masters is None else live):
                    return False
            elif kern is not None:
                ok = kern.counter_update(target, noise.table, torch.tensor(keys, dtype=torch.int64).view(-1, 2),
                                         torch.tensor([c for _, c in active], dtype=torch.float64), scale, write)
                if not ok:
                    return False
            else:
                new, _, step, e = self._buffers(target.device)
                for a in range(0, target.numel(), CHUNK):
                    m = min(CHUNK, target.numel() - a)
                    acc = torch.zeros(m, dtype=torch.float32, device=target.device)
                    for key, (_, c) in zip(keys, active):
                        acc.add_(torch.mul(noise.values(key, a, m, out=e), c, out=step[:m]))
                    torch.mul(acc, scale, out=step[:m])
                    if write:
                        target[a:a + m].add_(step[:m])
                        continue
                    torch.add(target[a:a + m], step[:m], out=new[:m])
                    if not bool(torch.isfinite(new[:m]).all()) or not bool(torch.isfinite(new[:m].to(live.dtype)).all()):
                        return False
            if write and self.masters is not None:
                live.copy_(self.masters[k].view_as(live))
        return True

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The float32 values of the selected parameters (masters when kept), by name."""
        src = self.masters if self.masters is not None else self.tensors
        return {n: t.detach().to(torch.float32).clone() for n, t in zip(self.names, src)}
