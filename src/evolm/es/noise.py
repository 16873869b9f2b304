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
  table of i.i.d. N(0, 1) float32 values, generated once from the root seed. A member (iteration,
  direction) gets one key-derived offset ``o`` into the table, and its noise over the flattened vector
  of selected parameters is the stretch ``table[o : o + P]`` (P = number of selected parameters):
  tensor k reads ``table[o + start_k : o + start_k + numel_k]``, a view that costs nothing to
  "generate", so perturb/restore/update are memory-bound. The guarantee: **within one member no table
  value is used twice**, so a member's noise is exactly P i.i.d. standard normals and no tensor's
  noise is a copy of another's; this holds whenever the table has at least P entries, which the
  default size ``P + 2^25`` ensures (2^25 distinct member offsets; 168M entries, 672 MB, for
  SmolLM2-135M's 134.5M parameters). Across members, two stretches overlap at shifted positions
  (coordinate-wise correlations stay zero; two members share a value at the same coordinate only
  when their offsets coincide, probability 2^-25). ``es.noise_table_size`` smaller than P trades
  memory for that guarantee: the stretch wraps around and values repeat within a member.
  (Runs made before this scheme used an offset per (iteration, direction, tensor) into a table
  smaller than the model, so tensors could be verbatim copies of stretches of others' noise; their
  seed logs say so and replay with that scheme, ``scheme="tensor"``.)

- Determinism: given the same NumPy version, both sources yield the same values on every machine and
  process (NumPy's ``Generator`` distributions are stable within a version; the version is recorded
  in each run's ``run.json``). Noise is generated on the CPU and moved to the model's device.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch

from evolm.seeding import derive_seed


class NoiseSource(ABC):
    """Base class: ``direction(iteration, direction, param_index, numel)`` -> 1-D float32 noise."""

    kind = "base"

    @abstractmethod
    def direction(self, iteration: int, direction: int, param_index: int, numel: int) -> torch.Tensor:
        """The noise of one (iteration, direction, parameter): ``numel`` standard-normal float32 values."""

    def describe(self) -> dict:
        return {"kind": self.kind}

    def to(self, device) -> "NoiseSource":
        return self

    def max_abs(self) -> float:
        """An upper bound of ``|eps|`` over every value this source can return (bounds an update's size)."""
        return STREAM_BOUND


STREAM_BOUND = 64.0
"""A bound of |eps| for generated streams: a float32 normal made from 32 or 64 random bits cannot
exceed ~10 (NumPy's ziggurat tail from 24-bit uniforms stops near 8.3), so 64 is safe by far."""


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
    """Windows into one seeded table of i.i.d. N(0, 1) values.

    ``scheme="member"`` (every new run): ``layout`` maps each perturbed tensor's parameter index to its
    start in the flattened vector of selected parameters; member (iteration, direction) gets one offset
    ``o`` and tensor k the window ``table[o + start_k : o + start_k + numel_k]``, so one member's noise
    is one contiguous stretch of the table and never reuses a value when the table is at least as long
    as the selected parameters (``default_size``). A smaller table (``es.noise_table_size``, to save
    memory) wraps around: then values repeat within a member.
    ``scheme="tensor"`` (runs made before the member scheme; replay only): an offset per
    (iteration, direction, tensor), each window within the table.
    """

    kind = "table"
    SLACK = 1 << 25
    """Extra entries beyond the selected parameters: the number of distinct member offsets."""

    def __init__(self, seed: int, size: int, device: str | torch.device = "cpu", layout: dict[int, int] | None = None,
                 total: int | None = None, scheme: str | None = None):
        self.seed = int(seed)
        self.size = int(size)
        self.scheme = scheme or ("member" if layout is not None else "tensor")
        if self.scheme not in ("member", "tensor"):
            raise ValueError(f"unknown noise table scheme '{self.scheme}'")
        if self.scheme == "member" and (layout is None or total is None):
            raise ValueError("the member scheme needs the parameter layout and total")
        self.layout = dict(layout or {})
        self.total = int(total or 0)
        rng = np.random.Generator(np.random.PCG64DXSM(derive_seed(self.seed, "noise-table")))
        self.table = torch.from_numpy(rng.standard_normal(self.size, dtype=np.float32))
        if torch.device(device).type != "cpu":
            self.table = self.table.to(device)

    @staticmethod
    def default_size(total_numel: int) -> int:
        """Entries of the default table: every selected parameter plus ``SLACK`` distinct member offsets."""
        return int(total_numel) + TableNoise.SLACK

    @property
    def reuses_within_member(self) -> bool:
        """True when the table is shorter than one member's noise (values repeat inside a member)."""
        return self.scheme == "member" and self.size < self.total

    def member_offset(self, iteration: int, direction: int) -> int:
        """Where member (iteration, direction)'s stretch of the table begins."""
        span = self.size - self.total + 1 if self.size >= self.total else self.size
        return derive_seed(self.seed, "noise-member", iteration, direction) % span

    def offset(self, iteration: int, direction: int, param_index: int, numel: int) -> int:
        """Start of the window of one tensor (may exceed the table size when it wraps)."""
        if self.scheme == "member":
            if param_index not in self.layout:
                raise ValueError(f"parameter {param_index} is not in the noise table's layout")
            return self.member_offset(iteration, direction) + self.layout[param_index]
        if numel > self.size:
            raise ValueError(f"noise table ({self.size} values) is smaller than a perturbed tensor ({numel}); raise es.noise_table_size")
        return derive_seed(self.seed, "noise-offset", iteration, direction, param_index) % (self.size - numel + 1)

    def direction(self, iteration: int, direction: int, param_index: int, numel: int) -> torch.Tensor:
        o = self.offset(iteration, direction, param_index, numel) % self.size
        if o + numel <= self.size:
            return self.table[o:o + numel]  # a view: no copy
        pieces, left = [], numel  # a table smaller than the member's noise: wrap around
        while left > 0:
            take = min(left, self.size - o)
            pieces.append(self.table[o:o + take])
            left, o = left - take, 0
        return torch.cat(pieces)

    def max_abs(self) -> float:
        """The largest ``|value|`` in the table (computed once)."""
        if getattr(self, "_max_abs", None) is None:
            lo, hi = torch.aminmax(self.table)
            self._max_abs = max(-float(lo), float(hi))
        return self._max_abs

    def describe(self) -> dict:
        out = {"kind": self.kind, "seed": self.seed, "size": self.size, "scheme": self.scheme}
        if self.scheme == "member":
            out["total"] = self.total
        return out

    def to(self, device) -> "TableNoise":
        self.table = self.table.to(device)
        return self


def make_noise(kind: str, seed: int, layout: list[tuple[int, int]], table_size: int = 0, device="cpu") -> NoiseSource:
    """The noise source named in ``es.noise`` for tensors ``layout = [(param_index, numel), ...]`` (in
    the order of the flattened parameter vector)."""
    if kind == "stream":
        return StreamNoise(seed, device)
    if kind == "table":
        starts, total = {}, 0
        for index, numel in layout:
            starts[int(index)] = total
            total += int(numel)
        return TableNoise(seed, table_size or TableNoise.default_size(total), device, layout=starts, total=total)
    raise ValueError(f"unknown noise kind '{kind}'")


def noise_from_header(described: dict, layout: list[tuple[int, int]], device="cpu") -> NoiseSource:
    """The noise source a run's seed-log header describes (``NoiseSource.describe()``), for replay and
    resume; a header without ``scheme`` predates the member scheme and gets the per-tensor table."""
    kind = described.get("kind")
    if kind == "stream":
        return StreamNoise(int(described["seed"]), device)
    if kind == "table":
        if described.get("scheme", "tensor") == "tensor":
            return TableNoise(int(described["seed"]), int(described["size"]), device, scheme="tensor")
        starts, total = {}, 0
        for index, numel in layout:
            starts[int(index)] = total
            total += int(numel)
        return TableNoise(int(described["seed"]), int(described["size"]), device, layout=starts, total=total)
    raise ValueError(f"unknown noise kind '{kind}' in the seed-log header")
