"""Gaussian perturbation noise, addressed by key: (iteration, direction, parameter index).

Design decisions:

- Every random choice in a run is derived from one root seed by key derivation
  (``evolm.seeding.derive_seed(root, "noise", iteration, direction, param)``): never ``seed + small
  offset``, never one seed shared by every tensor.
- Two noise sources behind one call, ``noise.direction(iteration, direction, param_index, numel)``,
  returning a 1-D float32 tensor of ``numel`` standard-normal values:

  ``StreamNoise``: a fresh PCG64DXSM generator per key, so streams are independent across tensors,
  directions and iterations. Exact but slow on a CPU: ~1.2 s per 134M values per pass, and ES needs
  three passes per member (perturb, restore, update) — more than generation itself costs for short
  completions.

  ``TableNoise`` (Salimans et al. 2017, "Evolution Strategies as a Scalable Alternative to RL"): one
  table of i.i.d. N(0, 1) float32 values, generated once from the root seed; the noise for a key is
  the window ``table[o : o + numel]`` at an offset ``o`` derived from the key. A window costs nothing
  to "generate" (it is a view), so perturb/restore/update are memory-bound. Within a tensor the values
  are exactly i.i.d. Gaussian; two keys share a value at the *same* coordinate only if their offsets
  coincide (probability 1/table size), so same-shaped layers never get identical noise. Two windows
  may overlap at shifted positions (the vector is then a shifted copy in part), which leaves
  coordinate-wise correlations at zero; this is the accepted trade of the method. The table must be
  at least as long as the largest perturbed tensor; the default is max(2^25, 1.25 x largest tensor)
  entries (134 MB for SmolLM2-135M, whose largest tensor, the tied embedding, has 28.3M entries).

- Determinism: given the same NumPy version, both sources yield the same values on every machine and
  process (NumPy's ``Generator`` distributions are stable within a version; the version is recorded
  in each run's ``run.json``). Noise is generated on the CPU and moved to the model's device.
"""

from __future__ import annotations

import numpy as np
import torch

from evolm.seeding import derive_seed


class NoiseSource:
    """Base class: ``direction(iteration, direction, param_index, numel)`` -> 1-D float32 noise."""

    kind = "base"

    def direction(self, iteration: int, direction: int, param_index: int, numel: int) -> torch.Tensor:
        raise NotImplementedError

    def describe(self) -> dict:
        return {"kind": self.kind}

    def to(self, device) -> "NoiseSource":
        return self


class StreamNoise(NoiseSource):
    """An independent PCG64DXSM Gaussian stream per (iteration, direction, parameter)."""

    kind = "stream"

    def __init__(self, seed: int, device: str | torch.device = "cpu"):
        self.seed = int(seed)
        self.device = torch.device(device)

    def direction(self, iteration: int, direction: int, param_index: int, numel: int) -> torch.Tensor:
        rng = np.random.Generator(np.random.PCG64DXSM(derive_seed(self.seed, "noise", iteration, direction, param_index)))
        values = torch.from_numpy(rng.standard_normal(numel, dtype=np.float32))
        return values if self.device.type == "cpu" else values.to(self.device)

    def describe(self) -> dict:
        return {"kind": self.kind, "seed": self.seed}

    def to(self, device) -> "StreamNoise":
        self.device = torch.device(device)
        return self


class TableNoise(NoiseSource):
    """Windows into one seeded table of i.i.d. N(0, 1) values, at key-derived offsets."""

    kind = "table"

    def __init__(self, seed: int, size: int, device: str | torch.device = "cpu"):
        self.seed = int(seed)
        self.size = int(size)
        rng = np.random.Generator(np.random.PCG64DXSM(derive_seed(self.seed, "noise-table")))
        self.table = torch.from_numpy(rng.standard_normal(self.size, dtype=np.float32))
        if torch.device(device).type != "cpu":
            self.table = self.table.to(device)

    @staticmethod
    def default_size(largest_numel: int) -> int:
        return max(1 << 25, int(1.25 * largest_numel) + 1)

    def offset(self, iteration: int, direction: int, param_index: int, numel: int) -> int:
        if numel > self.size:
            raise ValueError(f"noise table ({self.size} values) is smaller than a perturbed tensor ({numel}); raise es.noise_table_size")
        return derive_seed(self.seed, "noise-offset", iteration, direction, param_index) % (self.size - numel + 1)

    def direction(self, iteration: int, direction: int, param_index: int, numel: int) -> torch.Tensor:
        o = self.offset(iteration, direction, param_index, numel)
        return self.table[o:o + numel]

    def describe(self) -> dict:
        return {"kind": self.kind, "seed": self.seed, "size": self.size}

    def to(self, device) -> "TableNoise":
        self.table = self.table.to(device)
        return self


def make_noise(kind: str, seed: int, largest_numel: int, table_size: int = 0, device="cpu") -> NoiseSource:
    """Build the noise source named in ``es.noise``."""
    if kind == "stream":
        return StreamNoise(seed, device)
    if kind == "table":
        return TableNoise(seed, table_size or TableNoise.default_size(largest_numel), device)
    raise ValueError(f"unknown noise kind '{kind}'")
