"""ES noise of tensor-parallel shards: a TP rank's elements perturbed with the counter noise of the full
HF-named tensor at their global indices (``evolm.shards`` says which indices a rank holds).

Design decisions:

- Separate from ``evolm.shards`` (pure geometry, which the vLLM backend's driver uses to slice its own
  tensors for checksums) because the noise belongs to the ES engine (``evolm.es.noise.CounterNoise``):
  the backends layer must not import ES.
- ``ShardNoise`` subclasses ``CounterNoise``: ``values(keys, start, count)`` of a shard are the full tensor's
  noise at the global indices of its elements; it sets ``kernels = False`` so ``ParamSet`` uses its plain
  torch ops (the fused/Triton kernels address elements 0..n-1 only), whose arithmetic the kernels share.
"""

from __future__ import annotations

import torch

from evolm.es.noise import CounterNoise


def counter_noise_at(noise, keys: tuple[int, int], indices: torch.Tensor) -> torch.Tensor:
    """Counter noise (``evolm.es.noise.CounterNoise``) of the full tensor with ``keys`` at flat ``indices``:
    the same values ``noise.values(keys, 0, numel)[indices]`` gives, computed for these elements only."""
    out = torch.empty(indices.numel(), dtype=torch.float32)
    if indices.numel() == 0:
        return out
    first, last = int(indices[0]), int(indices[-1])
    if last - first + 1 == indices.numel() and bool((indices[1:] - indices[:-1] == 1).all()):  # one run
        return noise.values(keys, first, indices.numel(), out=out)
    for a, b in _runs(indices):  # a row-parallel shard: one run per row
        noise.values(keys, int(indices[a]), b - a, out=out[a:b])
    return out


def _runs(indices: torch.Tensor) -> list[tuple[int, int]]:
    """Maximal stretches ``[a, b)`` of consecutive values in ``indices``."""
    breaks = (torch.nonzero(indices[1:] - indices[:-1] != 1).view(-1) + 1).tolist()
    edges = [0] + breaks + [indices.numel()]
    return list(zip(edges[:-1], edges[1:]))


@torch.no_grad()
def perturb_shard(shard: torch.Tensor, noise, keys: tuple[int, int], indices: torch.Tensor, factor: float) -> None:
    """``shard += round(factor * eps)`` with ``eps`` the full tensor's counter noise at ``indices`` (float32,
    in place; the arithmetic of ``ParamSet.perturb`` on float32 weights: product rounded, then added)."""
    flat = shard.view(-1)
    d = torch.mul(counter_noise_at(noise, keys, indices), float(factor))
    flat.add_(d)


class ShardKeys(tuple):
    """A (member, tensor)'s counter keys ``(k0, k1)`` with the full-tensor ``indices`` of a shard's elements."""

    indices: torch.Tensor


class ShardNoise(CounterNoise):
    """Counter noise of TP shards: ``values(keys, start, count)`` of a shard are the full tensor's noise at
    the global indices of shard elements ``start .. start + count - 1`` (``index_maps``: HF tensor index ->
    ``local_indices``). ``ParamSet.from_tensors`` over the shard views then perturbs, restores and updates
    with the torch ops (``kernels = False``), whose arithmetic the kernels share."""

    kernels = False

    def __init__(self, seed: int, index_maps: dict[int, torch.Tensor], device="cpu"):
        super().__init__(seed, device)
        self.index_maps = index_maps

    def keys(self, iteration: int, direction: int, param_index: int) -> ShardKeys:
        keys = ShardKeys(super().keys(iteration, direction, param_index))
        keys.indices = self.index_maps[param_index]
        return keys

    def values(self, keys, start: int, count: int, out: torch.Tensor | None = None, kernel: bool = True) -> torch.Tensor:
        indices = getattr(keys, "indices", None)
        if indices is None:
            return super().values(keys, start, count, out, kernel)
        noise = counter_noise_at(_Full(self), tuple(keys), indices[start:start + count])
        if out is None:
            return noise
        out[:count].copy_(noise)
        return out[:count]


class _Full:
    """The full tensor's counter values of a ``ShardNoise`` (its base class's ``values``)."""

    def __init__(self, noise: ShardNoise):
        self.noise = noise

    def values(self, keys, start, count, out=None):
        return CounterNoise.values(self.noise, keys, start, count, out)
